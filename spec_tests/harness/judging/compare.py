"""Comparing an implementation's value with the expected one: tensors, numbers, sequences and
mappings, within a tolerance. A mismatch says what differs, by how much (relative to the
tolerance) and where."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .tolerances import Tolerance

# Grading (``--spec-conceal-exact``): an integer answer that differs says which way, not the number.
# Counts and byte sizes are functions of a config drawn from a few sizes: an exact expected value
# in one grading's feedback would answer that config in every later grading.
CONCEAL_EXACT = False


@dataclass(frozen=True)
class Mismatch:
    found: str  # one line: what differs
    ratio: float | None = None  # worst |error| / allowed; None for categorical (shape, dtype, wrong value)
    where: str = ""  # e.g. "[1, 0, 4, 4]" or "['loss']"


def _index(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def _value(x: float) -> str:
    return f"{x:.6g}"


def tensor_mismatch(actual, expected: torch.Tensor, tol: Tolerance) -> Mismatch | None:
    """None when ``actual`` matches ``expected`` within ``tol``."""
    if not isinstance(actual, torch.Tensor):
        return Mismatch(f"expected a tensor of shape {tuple(expected.shape)}, got {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        return Mismatch(f"shape: expected {tuple(expected.shape)}, got {tuple(actual.shape)}")
    if expected.dtype == torch.bool or not expected.is_floating_point():
        a, e = actual.detach().cpu(), expected.detach().cpu()
        if a.is_floating_point():
            return Mismatch(f"dtype: expected {expected.dtype}, got {actual.dtype}")
        wrong = a.to(e.dtype) != e
        if not wrong.any():
            return None
        where = tuple(torch.nonzero(wrong)[0].tolist())
        return Mismatch(
            f"{int(wrong.sum())} of {wrong.numel()} entries differ; first at {_index(where)}: "
            f"expected {e[where].item()}, got {a[where].item()}",
            where=_index(where),
        )
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    finite_a, finite_e = torch.isfinite(a), torch.isfinite(e)
    if not torch.equal(finite_a, finite_e):
        where = tuple(torch.nonzero(finite_a != finite_e)[0].tolist())
        return Mismatch(
            f"non-finite values differ: expected {_value(e[where].item())} at {_index(where)}, "
            f"got {_value(a[where].item())} ({int((~finite_a).sum())} non-finite in actual)",
            where=_index(where),
        )
    both = finite_a & finite_e
    a_nf, e_nf = a[~both], e[~both]
    if not ((a_nf == e_nf) | (a_nf.isnan() & e_nf.isnan())).all():
        return Mismatch("non-finite values differ in sign or kind")
    err = torch.where(both, (a - e).abs(), torch.zeros_like(a))
    allowed = tol.atol + tol.rtol * e.abs()
    bad = err > torch.where(both, allowed, torch.full_like(a, math.inf))
    if not bad.any():
        return None
    ratios = torch.where(bad, err / allowed, torch.zeros_like(err))
    worst = float(ratios.max())
    # the worst entry against the tolerance; among ties (every entry a zero tolerance rejects is "inf"
    # times it), the one with the largest error, so the error shown is the error at the place shown
    where = _argmax(torch.where(ratios == worst, err, torch.full_like(err, -1.0)))
    largest = _argmax(err)
    if largest != where and err[largest] > err[where]:  # the largest error is within a looser tolerance
        how = f"{worst:.3g}x" if math.isfinite(worst) else "no error allowed"
        found = f"max abs error {_error_at(a, e, err, largest)}; worst against its tolerance: {how} at "
        found += f"{_index(where)} (error {err[where].item():.3g}: expected {_value(e[where].item())}, "
        found += f"got {_value(a[where].item())})"
    elif math.isfinite(worst):
        found = f"max abs error {err.max().item():.3g}, {_times(worst)}, at {_index(where)}: "
        found += f"expected {_value(e[where].item())}, got {_value(a[where].item())}"
    else:
        found = f"max abs error {_error_at(a, e, err, where)} ({_times(worst)})"
    return Mismatch(
        f"{found}; {int(bad.sum())} of {bad.numel()} entries outside {tol.describe()}",
        ratio=worst,
        where=_index(where),
    )


def _argmax(values: torch.Tensor) -> tuple[int, ...]:
    flat = int(torch.argmax(values))
    # numpy's, not torch.unravel_index: torch's costs ~0.6 s of lazy imports on its first call in a process
    return tuple(int(i) for i in np.unravel_index(flat, tuple(values.shape))) if values.dim() else ()


def _error_at(a: torch.Tensor, e: torch.Tensor, err: torch.Tensor, where: tuple[int, ...]) -> str:
    """ "0.5 at [1, 2]: expected 1, got 1.5" """
    error, place = f"{err[where].item():.3g}", _index(where)
    return f"{error} at {place}: expected {_value(e[where].item())}, got {_value(a[where].item())}"


def _times(ratio: float) -> str:
    """How far over the tolerance: "12.5x the tolerance", or, where it allows no error, says so."""
    return f"{ratio:.3g}x the tolerance" if math.isfinite(ratio) else "no error allowed there"


def _number(actual, expected: float, tol: Tolerance, prefix: str, path: str) -> Mismatch | None:
    try:
        a = float(actual)
    except (TypeError, ValueError, RuntimeError):
        return Mismatch(f"{prefix}expected a number, got {type(actual).__name__}", where=path)
    if math.isnan(expected) and math.isnan(a):
        return None
    allowed = tol.atol + tol.rtol * abs(expected)
    error = abs(a - expected)
    if error <= allowed:
        return None
    ratio = error / allowed if allowed else math.inf
    return Mismatch(
        f"{prefix}expected {_value(expected)}, got {_value(a)} (error {error:.3g}, {_times(ratio)}; {tol.describe()})",
        ratio=ratio if math.isfinite(ratio) else None,
        where=path,
    )


def _concealed(actual, expected: int, integral: bool) -> str:
    """An integer answer that differs, under CONCEAL_EXACT: which way, never the expected number, whatever
    the answer's type (an int, a float, None, a string: "expected 64640, got 0.0" would show it too)."""
    hidden = "(the expected number is not shown)"
    if integral:
        way = "more" if int(actual) > expected else "fewer"
        return f"got {int(actual)}: {way} than expected {hidden}"
    if isinstance(actual, float) and math.isfinite(actual):
        way = "; more than expected" if actual > expected else "; less than expected" if actual < expected else ""
        return f"got {actual!r}: a float where an integer is expected{way} {hidden}"
    return f"got {reprlib.repr(actual)}: {type(actual).__name__} where an integer is expected {hidden}"


def mismatch(actual, expected, tol: Tolerance, path: str = "") -> Mismatch | None:
    """Structural comparison of tensors, numbers, sequences and mappings; None when they match."""
    prefix = f"{path}: " if path else ""
    if isinstance(expected, torch.Tensor):
        found = tensor_mismatch(actual, expected, tol)
        if found is None:
            return None
        return Mismatch(prefix + found.found, found.ratio, path + found.where)
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return Mismatch(f"{prefix}expected a mapping, got {type(actual).__name__}", where=path)
        missing = [k for k in expected if k not in actual]
        if missing:
            return Mismatch(f"{prefix}missing keys {missing}", where=path)
        for key in expected:
            found = mismatch(actual[key], expected[key], tol, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, Sequence) and not isinstance(expected, str):
        if not isinstance(actual, Sequence) or isinstance(actual, str) or len(actual) != len(expected):
            n = len(actual) if isinstance(actual, Sequence) else type(actual).__name__
            return Mismatch(f"{prefix}expected a sequence of length {len(expected)}, got {n}", where=path)
        for i, (a, e) in enumerate(zip(actual, expected)):
            found = mismatch(a, e, tol, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(expected, bool) or isinstance(expected, int):
        ok = type(actual) in (bool, int) or (isinstance(actual, torch.Tensor) and actual.numel() == 1)
        if ok and int(actual) == int(expected):
            return None
        if CONCEAL_EXACT and not isinstance(expected, bool):
            return Mismatch(prefix + _concealed(actual, int(expected), ok), where=path)
        return Mismatch(f"{prefix}expected {expected!r}, got {actual!r}", where=path)
    if isinstance(expected, float):
        return _number(actual, expected, tol, prefix, path)
    return None if actual == expected else Mismatch(f"{prefix}expected {expected!r}, got {actual!r}", where=path)


def shape_note(actual, expected) -> str:
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        return f"shapes: actual {tuple(actual.shape)} {actual.dtype}, expected {tuple(expected.shape)}"
    return ""
