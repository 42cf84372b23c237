"""One record for "the specified computation with one knob changed", and how a failing output is matched
against such records.

A ``Variant`` is offered by a test (``spec.check(variants=...)``, ``spec.close(variants=...)``), by the
knob families of the protocol functions (``knobs.py``), by the bookkeeping helpers (``bookkeeping.py``) and
by the knob search inside the model (``model_knobs.py``). If it reproduces a failing output, the failure
says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..judging.compare import mismatch
from ..judging.tolerances import Tolerance


@dataclass(frozen=True)
class Variant:
    """The specified computation with one knob changed.

    ``code``: a full cause code from ``codes.py`` ("knob:...", or a structural code such as "sign").
    ``compute`` takes what the check's compute takes (``spec.check``: a reference-like subject and the
    float64 inputs) or nothing (``spec.close``, and the knob families of ``knobs.py``, bound to a call's
    inputs). ``where``: where in the function the knob sits (``knobs.py``'s causes say so).
    ``knob``: for the model's knob search, the component and the index of its knob in its family, or
    ``("wiring", its name)``.
    """

    code: str
    summary: str
    fix: str
    compute: Callable
    where: str = ""
    knob: tuple | None = None


def fitting_variants(variants, actual, tol: Tolerance, *args) -> list:
    """The variants whose output matches ``actual``."""
    found = []
    for v in variants:
        try:
            out = v.compute(*args)
        except Exception:  # noqa: BLE001 - a variant that cannot run cannot be the one
            continue
        if mismatch(actual, out, tol) is None:
            found.append(v)
    return found


def variant_lines(found) -> tuple[list[str], list[str]]:
    """Diagnosis lines and codes for the fitting variants."""
    if len(found) > 1:
        names = "; or ".join(v.summary for v in found)
        return [f"likely cause (ambiguous, {len(found)} fit): {names}"], []
    return [
        f"likely cause: {v.summary}. Fix: {v.fix} (evidence: the output equals the specified one with this change)"
        for v in found
    ], [v.code for v in found]
