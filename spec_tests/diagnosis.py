"""Naming the bug behind a failure by comparing outputs, not names.

When a comparison fails, the catalogued bugs of that component (``spec_tests.bugs``) are run on
the same inputs; if one of them produces the implementation's output, the failure says so. An
implementation written independently with the same mistake therefore gets the same diagnosis.
The catalog is optional (student handouts ship without it): without it there is no diagnosis.
"""

from __future__ import annotations

from .assertions import mismatch
from .reference_view import StyledReference
from .tolerances import Tolerance


def diagnose(component: str, compute, actual, tol: Tolerance, rope_style: str) -> str | None:
    """``compute(impl_like)`` recomputes the failing quantity; returns a diagnosis line or None."""
    try:
        from .bugs import candidates_for
    except ImportError:
        return None
    matches = []
    for bug, module in candidates_for(component):
        try:
            out = compute(StyledReference(module, rope_style, label=f"bug:{bug.name}"))
        except Exception:  # noqa: BLE001 - a bug that cannot run on these inputs cannot be the one
            continue
        if mismatch(actual, out, tol) is None:
            matches.append(bug)
    return describe_matches(matches)


def describe_matches(bugs) -> str | None:
    """The diagnosis lines for bugs (objects with ``name``, ``explanation``, ``fix``), or None."""
    if not bugs:
        return None
    return "\n  ".join(f"matches known bug {b.name}: {b.explanation}. Fix: {b.fix}" for b in bugs)
