"""What a failure looks like on the terminal: one short paragraph, never a wall of tracebacks
(``--spec-tb`` shows them), and the end-of-run summary by component with root causes first."""

from __future__ import annotations

from .checks import SpecFailure
from .subject import ImplementationError, NotImplementedInImpl


def _hypothesis_notes(exc: BaseException) -> str:
    notes = [n for n in getattr(exc, "__notes__", ()) if "Falsifying" in n or "draw" in n]
    return "".join(f"\n  {n}" for n in notes)


def short_report(exc: BaseException) -> str | None:
    """The short report for failures the suite explains itself; None for anything else."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            line = short_report(inner)
            if line:
                return line
        return None
    if isinstance(exc, NotImplementedInImpl):
        return f"not implemented: {exc}"
    if isinstance(exc, SpecFailure | ImplementationError):
        return str(exc) + _hypothesis_notes(exc)
    return None
