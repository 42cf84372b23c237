"""Comparisons whose failures teach: the behaviour, expected vs actual, the largest error and
where it is, shapes, and (when the output matches a catalogued bug) which bug and its fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .tolerances import Tolerance


class SpecFailure(AssertionError):
    """A behaviour the implementation does not meet; the message is the whole report."""


def _fmt_index(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def _fmt_value(x: float) -> str:
    return f"{x:.6g}"


def tensor_mismatch(actual, expected: torch.Tensor, tol: Tolerance) -> str | None:
    """None when ``actual`` matches ``expected`` within ``tol``; else a description of the mismatch."""
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor of shape {tuple(expected.shape)}, got {type(actual).__name__}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape: expected {tuple(expected.shape)}, got {tuple(actual.shape)}"
    if expected.dtype == torch.bool or not expected.is_floating_point():
        a, e = actual.detach().cpu(), expected.detach().cpu()
        if a.is_floating_point() and not e.is_floating_point():
            return f"dtype: expected {expected.dtype}, got {actual.dtype}"
        wrong = a.to(e.dtype) != e
        if not wrong.any():
            return None
        where = tuple(torch.nonzero(wrong)[0].tolist())
        return (
            f"{int(wrong.sum())} of {wrong.numel()} entries differ; first at {_fmt_index(where)}: "
            f"expected {e[where].item()}, got {a[where].item()}"
        )
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    finite_a, finite_e = torch.isfinite(a), torch.isfinite(e)
    if not torch.equal(finite_a, finite_e):
        where = tuple(torch.nonzero(finite_a != finite_e)[0].tolist())
        return (
            f"non-finite values differ: expected {_fmt_value(e[where].item())} at {_fmt_index(where)}, "
            f"got {_fmt_value(a[where].item())} ({int((~finite_a).sum())} non-finite in actual)"
        )
    both = finite_a & finite_e
    a_nf, e_nf = a[~both], e[~both]
    if not (
        (a_nf == e_nf) | (a_nf.isnan() & e_nf.isnan())
    ).all():  # same inf/nan pattern, different kinds (NaN matches NaN)
        return "non-finite values differ in sign or kind"
    err = torch.where(both, (a - e).abs(), torch.zeros_like(a))
    allowed = tol.atol + tol.rtol * e.abs()
    bad = err > torch.where(both, allowed, torch.full_like(a, float("inf")))
    if not bad.any():
        return None
    flat = int(torch.argmax(torch.where(bad, err / allowed, torch.zeros_like(err))))
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else ()
    worst = float((err / allowed).max())
    return (
        f"max abs error {err.max().item():.3g}, {worst:.3g}x the tolerance, at {_fmt_index(where)}: "
        f"expected {_fmt_value(e[where].item())}, got {_fmt_value(a[where].item())}; "
        f"{int(bad.sum())} of {bad.numel()} entries outside {tol.describe()}"
    )


def mismatch(actual, expected, tol: Tolerance, path: str = "") -> str | None:
    """Structural comparison of tensors, numbers, sequences and mappings."""
    prefix = f"{path}: " if path else ""
    if isinstance(expected, torch.Tensor):
        found = tensor_mismatch(actual, expected, tol)
        return prefix + found if found else None
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{prefix}expected a mapping, got {type(actual).__name__}"
        missing = [k for k in expected if k not in actual]
        if missing:
            return f"{prefix}missing keys {missing}"
        for key in expected:
            found = mismatch(actual[key], expected[key], tol, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, Sequence) and not isinstance(expected, str):
        if not isinstance(actual, Sequence) or len(actual) != len(expected):
            n = len(actual) if isinstance(actual, Sequence) else type(actual).__name__
            return f"{prefix}expected a sequence of length {len(expected)}, got {n}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            found = mismatch(a, e, tol, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(expected, bool | int) and not isinstance(expected, float):
        return None if actual == expected else f"{prefix}expected {expected!r}, got {actual!r}"
    if isinstance(expected, float):
        try:
            a = float(actual)
        except (TypeError, ValueError):
            return f"{prefix}expected a number, got {type(actual).__name__}"
        allowed = tol.atol + tol.rtol * abs(expected)
        if abs(a - expected) <= allowed:
            return None
        ratio = abs(a - expected) / allowed if allowed else float("inf")
        return (
            f"{prefix}expected {_fmt_value(expected)}, got {_fmt_value(a)} "
            f"(error {abs(a - expected):.3g}, {ratio:.3g}x the tolerance; {tol.describe()})"
        )
    return None if actual == expected else f"{prefix}expected {expected!r}, got {actual!r}"


def shape_note(actual, expected) -> str:
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        return f"shapes: actual {tuple(actual.shape)} {actual.dtype}, expected {tuple(expected.shape)}"
    return ""


def failure_message(
    behaviour: str, found: str, *, component: str = "", note: str = "", diagnosis: str | None = None
) -> str:
    head = f"[{component}] {behaviour}" if component else behaviour
    lines = [head, f"  {found}"]
    if note:
        lines.append(f"  {note}")
    if diagnosis:
        lines.append(f"  {diagnosis}")
    return "\n".join(lines)


def assert_close(actual, expected, *, behaviour: str, tol: Tolerance, component: str = "", diagnosis=None) -> None:
    """Fail with a teaching message unless ``actual`` matches ``expected`` within ``tol``.

    ``diagnosis``: optional callable returning a "matches known bug ..." line, evaluated on failure.
    """
    found = mismatch(actual, expected, tol)
    if found:
        diag = diagnosis() if diagnosis else None
        raise SpecFailure(
            failure_message(behaviour, found, component=component, note=shape_note(actual, expected), diagnosis=diag)
        )


def require(condition: bool, *, behaviour: str, found: str, component: str = "") -> None:
    """Fail with a teaching message unless ``condition`` holds."""
    if not condition:
        raise SpecFailure(failure_message(behaviour, found, component=component))


def require_value_error(call, *, behaviour: str, component: str = "", must_mention: tuple[str, ...] = ()) -> None:
    """Fail unless ``call()`` raises ``ValueError`` whose message mentions every ``must_mention``."""
    try:
        call()
    except ValueError as exc:
        missing = [s for s in must_mention if s not in str(exc)]
        require(
            not missing,
            component=component,
            behaviour=behaviour + ", naming the values",
            found=f"ValueError({str(exc)!r}) does not mention {missing}",
        )
        return
    except Exception as exc:  # noqa: BLE001 - any other error type is the failure being reported
        require(False, component=component, behaviour=behaviour, found=f"raised {type(exc).__name__}: {exc}")
    require(False, component=component, behaviour=behaviour, found="no error was raised")
