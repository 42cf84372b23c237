"""What a detector reports (``Cause``) and the numeric helpers the detectors share.

Detectors work on float64 numpy copies: the tensors are small (a few thousand entries), and numpy's
per-call overhead is a fraction of torch's, which keeps a full structural search within its budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import codes

# Diagnosis must never break the failure report it annotates: a detector that raises is skipped.
# Tests set STRICT so that a detector's own error fails them instead.
STRICT = False

# A detector that reproduces ``actual`` exactly (a transform of the expected output, or the reference
# with one knob changed) may report EXACT; one that only localises the error (where it is wrong, not
# what the wrong values are) stays at or below LOCAL.
EXACT = 0.95
EXACT_SHARED = 0.9  # exact, but several descriptions of the same code fit
LOCAL = 0.8
AMBIGUOUS = 0.6
WEAK = 0.5


@dataclass(frozen=True)
class Cause:
    code: str
    summary: str
    where: str
    fix: str
    evidence: str
    confidence: float
    source: str = "structural"  # "structural", "knob" or "probe": knob causes are the more specific

    def __post_init__(self):
        if not codes.is_valid(self.code):
            raise ValueError(f"unknown cause code {self.code!r}")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} outside [0, 1]")

    def line(self) -> str:
        return f"likely cause: {self.body()}"

    def body(self) -> str:
        """The line without its ``likely cause:`` prefix."""
        return f"{self.summary}. Look at {self.where}; fix: {self.fix} (evidence: {self.evidence})"


# ---------------------------------------------------------------------------------------------
# conversions and comparisons


def as_array(x) -> np.ndarray | None:
    """A numpy copy of a tensor, array or number: bool stays bool, integers int64, floats float64."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the project
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.dtype == torch.bool:
            return t.numpy().copy()
        if t.is_complex():
            return None
        if t.is_floating_point():
            return t.to(torch.float64).numpy().copy()
        return t.to(torch.int64).numpy().copy()
    if isinstance(x, np.ndarray):
        if x.dtype == np.bool_:
            return x.copy()
        if np.issubdtype(x.dtype, np.floating):
            return x.astype(np.float64)
        if np.issubdtype(x.dtype, np.integer):
            return x.astype(np.int64)
        return None
    if isinstance(x, bool):
        return np.array(x)
    if isinstance(x, int | float):
        return np.array(float(x))
    return None


def as_float(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype != np.float64 else x


def close(candidate: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Elementwise ``|actual - candidate| <= atol + rtol * |candidate|``; equal non-finite values match."""
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.abs(actual - candidate) <= atol + rtol * np.abs(candidate)
    fin_c, fin_a = np.isfinite(candidate), np.isfinite(actual)
    same_nonfinite = ~fin_c & ~fin_a & ((candidate == actual) | (np.isnan(candidate) & np.isnan(actual)))
    return np.where(fin_c & fin_a, ok, same_nonfinite)


def fits(candidate: np.ndarray, actual: np.ndarray, atol: float, rtol: float, care: np.ndarray | None = None) -> bool:
    """True when ``candidate`` reproduces ``actual`` within tolerance wherever ``care`` is True."""
    if candidate.shape != actual.shape:
        return False
    ok = close(candidate, actual, atol, rtol)
    if care is not None:
        ok = ok | ~care
    return bool(ok.all())


def nice_number(c: float) -> str:
    """A short name for a factor: ``2``, ``1/2``, ``sqrt(10)``, ``1/sqrt(80)``, or the number."""
    if not math.isfinite(c) or c == 0:
        return f"{c:g}"
    sign = "-" if c < 0 else ""
    m = abs(c)
    for value, inverse in ((m, False), (1 / m, True)):
        for k in range(2, 4097):
            root = math.sqrt(k)
            if abs(value - k) <= 1e-6 * k:
                return f"{sign}{'1/' if inverse else ''}{k}"
            if root != int(root) and abs(value - root) <= 1e-6 * root:
                return f"{sign}{'1/' if inverse else ''}sqrt({k})"
            if k > value * value + 2:
                break
    return f"{c:.6g}"


def fmt_indices(idx, limit: int = 8) -> str:
    idx = [int(i) for i in idx]
    if not idx:
        return "[]"
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"{idx[0]}..{idx[-1]}"
    text = ", ".join(str(i) for i in idx[:limit])
    return f"[{text}{', ...' if len(idx) > limit else ''}]"
