"""One record for "the specified computation with one knob changed", and how a failing output is matched
against such records.

A ``Variant`` is offered by a test (``spec.check(variants=...)``, ``spec.close(variants=...)``), by the
knob families of the protocol functions (``knobs.py``), by the bookkeeping helpers (``bookkeeping.py``) and
by the knob search inside the model (``model_knobs.py``). If it reproduces a failing output, the failure
says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

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
    weak: bool = False  # it fits, but moves the value by few tolerances: weak evidence (``fitting_variants``)
    # a second observation the mistake must explain too, where several fit the first: True where it does, False where
    # it does not (the variant is dropped), None where it cannot tell (``confirmed``)
    confirm: Callable | None = None


# A variant that moves the value by less than this many tolerances from the specified one is weak evidence where it
# fits: a small difference of another cause falls within its reach (held out: parameters left frozen fitted AdamW's
# eps inside the square root, which also leaves parameters with tiny gradients nearly still).
SEPARATION = 4.0


def _nan_only(actual, expected, tol: Tolerance) -> bool:
    """Whether ``actual`` holds NaN or inf and equals ``expected`` wherever it is finite: a variant that fits it then
    fits by its non-finite entries alone, which many mistakes share (any step that turns the weights NaN)."""
    try:
        a = torch.as_tensor(actual, dtype=torch.float64).flatten()
        e = torch.as_tensor(expected, dtype=torch.float64).flatten().to(a.device)
    except (TypeError, ValueError, RuntimeError):
        return False
    finite = torch.isfinite(a)
    if a.shape != e.shape or bool(finite.all()) or not bool(finite.any()):
        return False
    return mismatch(a[finite], e[finite], tol) is None


def _nothing_finite(actual, expected) -> bool:
    """Whether ``actual`` holds no finite entry where ``expected`` holds some: a variant that fits it fits by NaN or
    inf alone, as every mistake that divides by zero or empties a mean does (held out: an evaluation of one short
    window that drops it gives NaN, as scoring only each window's second half does)."""

    def numbers(value):
        if isinstance(value, dict):
            return torch.cat([numbers(v) for v in value.values()]) if value else torch.zeros(0, dtype=torch.float64)
        return torch.as_tensor(value, dtype=torch.float64).detach().cpu().flatten()

    try:
        a, e = numbers(actual), numbers(expected)
    except (TypeError, ValueError, RuntimeError):
        return False
    return a.numel() > 0 and not bool(torch.isfinite(a).any()) and bool(torch.isfinite(e).any())


def fitting_variants(variants, actual, tol: Tolerance, *args, expected=None) -> list:
    """The variants whose output matches ``actual``. With ``expected``, a variant whose own output lies within
    ``SEPARATION`` tolerances of it is marked weak (``Variant.weak``), and so is every fit where ``actual`` differs
    from ``expected`` only by its NaN or inf entries (``_nan_only``)."""
    found = []
    nan_only = expected is not None and (_nan_only(actual, expected, tol) or _nothing_finite(actual, expected))
    for v in variants:
        try:
            out = v.compute(*args)
        except Exception:  # noqa: BLE001 - a variant that cannot run cannot be the one
            continue
        if mismatch(actual, out, tol) is None:
            apart = None if expected is None else mismatch(out, expected, tol)
            close = apart is not None and apart.ratio is not None and apart.ratio < SEPARATION
            found.append(replace(v, weak=True) if close or nan_only else v)
    return confirmed(found)


def confirmed(found: list) -> list:
    """Where several distinct mistakes fit (codes and fixes apart), those a second observation does not rule out
    (``Variant.confirm``; held out: AdamW's second moment corrected with beta1 and an undamped first moment give the
    same losses on a few steps and part on a longer run). All of them where it rules out every one."""
    if len({(v.code, v.fix) for v in found}) < 2 or not any(v.confirm for v in found):
        return found
    kept = []
    for v in found:
        try:
            verdict = v.confirm() if v.confirm is not None else None
        except Exception:  # noqa: BLE001 - a second observation that cannot be made rules nothing out
            verdict = None
        if verdict is not False:
            kept.append(v)
    return kept or found


def variant_lines(found) -> tuple[list[str], list[str]]:
    """Diagnosis lines and codes for the fitting variants; those with the same code and fix are one mistake (fitting
    at each of the settings the protocol leaves open, such as AdamW's weight decay), said once."""
    one = {}
    for v in found:
        one.setdefault((v.code, v.fix), v)
    found = list(one.values())
    if len(found) > 1:
        names = "; or ".join(dict.fromkeys(v.summary for v in found))
        weak = ", weak evidence" if any(v.weak for v in found) else ""
        return [f"likely cause (ambiguous, {len(found)} fit{weak}): {names}"], []
    return [
        f"likely cause{' (weak evidence)' if v.weak else ''}: {v.summary}. Fix: {v.fix} (evidence: the output equals "
        f"the specified one with this change{', which moves it by few tolerances' if v.weak else ''})"
        for v in found
    ], [("~" if v.weak else "") + v.code for v in found]
