"""Structural diagnosis of failing checks: what is likely wrong, from the tensors and cheap reruns.

- ``structural_causes(expected, actual, axes=..., inputs=..., atol=..., rtol=...)``: detectors that
  relate the output to the expected one (layout, scale, shift, no-op, mask, boundary, precision, ...);
- ``causality_probe`` / ``batch_probe``: reruns on modified inputs;
- ``knob_causes(name, args, kwargs, actual, rope_style=..., atol=..., rtol=...)``: the specified
  function with one knob changed;
- ``rank`` / ``describe``: order the causes and write the ``likely cause:`` lines.
"""

from .cause import Cause
from .knobs import knob_causes
from .ranking import describe, rank
from .structural import batch_probe, causality_probe, structural_causes

__all__ = ["Cause", "batch_probe", "causality_probe", "describe", "knob_causes", "rank", "structural_causes"]
