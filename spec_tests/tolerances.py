"""Every tolerance the suite uses, with the reason for each. A comparison passes when
``|actual - expected| <= atol + rtol * |expected|`` holds elementwise.

Ground truth is the reference run in float64 on the same inputs. Float64 checks are "exact":
a correct implementation differs from the reference only by float64 rounding (~1e-16 relative
per operation, well under 1e-12 through these small graphs). Float32 tolerances come from the
measured float32 error of the reference itself on the suite's inputs (``python
tools/measure_tolerances.py`` re-measures; ``tests/test_tolerance_table.py`` keeps the table
honest), multiplied by a stated safety factor so that another correct float32 implementation,
summing in a different order, also passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    why: str

    def describe(self) -> str:
        return f"atol {self.atol:.0e} + rtol {self.rtol:.0e}·|expected| ({self.why})"


EXACT = Tolerance(
    1e-10, 1e-10,
    "float64: rounding alone is ~1e-14 here; eps placed outside the root, a missing 1/sqrt term "
    "or a dropped token all exceed 1e-7",
)  # fmt: skip

# kind -> tolerance for float32 on CPU; atol = rtol = safety factor x the measured metric
# max |ref_f32 - ref_f64| / (1 + |ref_f64|) over the suite's own float32 comparisons, as printed
# by ``python tools/measure_tolerances.py`` (which runs the suite on the reference in float32).
FLOAT32 = {
    "pointwise": Tolerance(1e-6, 1e-6, "MEASURE"),
    "matmul": Tolerance(1e-5, 1e-5, "MEASURE"),
    "attention": Tolerance(1e-5, 1e-5, "MEASURE"),
    "loss": Tolerance(1e-5, 1e-5, "MEASURE"),
    "model": Tolerance(1e-4, 1e-4, "MEASURE"),
    "training": Tolerance(1e-4, 1e-4, "MEASURE"),
}

# CUDA float32 runs with TF32 disabled by the plugin; kernels reorder sums, so the CPU table x4.
CUDA_FACTOR = 4.0

KINDS = tuple(FLOAT32)
BIT_IDENTICAL = Tolerance(0.0, 0.0, "bit-identical: the same computation on the same values")


def tolerance(kind: str, dtype: torch.dtype, device: str = "cpu") -> Tolerance:
    """The tolerance for a comparison of ``kind`` computed by the implementation in ``dtype``."""
    if kind not in FLOAT32:
        raise ValueError(f"unknown tolerance kind {kind!r}; known: {KINDS}")
    if dtype == torch.float64:
        return EXACT
    if dtype != torch.float32:
        raise ValueError(f"the suite compares float64 and float32 only, got {dtype}")
    tol = FLOAT32[kind]
    if device == "cuda":
        return Tolerance(tol.atol * CUDA_FACTOR, tol.rtol * CUDA_FACTOR, tol.why + f"; CUDA x{CUDA_FACTOR:g}")
    return tol
