"""The per-test ``spec`` object: run a computation on the implementation and on the reference
(in float64, on the same inputs) and compare, with tolerance, message and diagnosis."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from . import tolerance_measurement
from .assertions import assert_close, require
from .tolerances import Tolerance, tolerance


def to_float64(value):
    """Floating tensors (also inside dicts, lists and tuples) as float64; everything else as is."""
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64) if value.is_floating_point() else value
    if isinstance(value, Mapping):
        return {k: to_float64(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_float64(v) for v in value)
    return value


def floating_dtype(value) -> torch.dtype | None:
    """The dtype of the first floating tensor found in ``value`` (depth first)."""
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, list | tuple) else ()
    for v in items:
        found = floating_dtype(v)
        if found is not None:
            return found
    return None


def clone_tensors(value):
    """A copy of ``value`` with every tensor (also inside dicts, lists, tuples) cloned."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: clone_tensors(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(clone_tensors(v) for v in value)
    return value


def modified_inputs(pristine, args, path: str = "args") -> list[str]:
    """Where ``args`` no longer equals its earlier copy ``pristine``."""
    if isinstance(pristine, torch.Tensor):
        return [] if torch.equal(pristine, args) else [path]
    if isinstance(pristine, Mapping):
        return [p for k in pristine for p in modified_inputs(pristine[k], args[k], f"{path}[{k!r}]")]
    if isinstance(pristine, list | tuple):
        return [p for i, (a, b) in enumerate(zip(pristine, args)) for p in modified_inputs(a, b, f"{path}[{i}]")]
    return []


class Spec:
    """What a test needs: the implementation, expected values, and the device."""

    def __init__(self, impl, expectations, device: str, nodeid: str):
        self.impl, self.expectations, self.device, self.nodeid = impl, expectations, device, nodeid
        self._labels: dict[str, int] = {}

    def _key(self, label: str | None) -> str:
        label = label or "value"
        n = self._labels.get(label, 0)
        self._labels[label] = n + 1
        return f"{self.nodeid}::{label}#{n}"

    def expected(self, compute: Callable, *args, label: str | None = None):
        """``compute(reference, *args)`` with floating inputs promoted to float64."""
        args64 = to_float64(args)
        return self.expectations.value(self._key(label), lambda ref: compute(ref, *args64), args64)

    def check(
        self,
        compute: Callable,
        *args,
        behaviour: str,
        component: str,
        kind: str = "pointwise",
        label: str | None = None,
        tol: Tolerance | None = None,
    ):
        """Assert ``compute(impl, *args)`` equals ``compute(reference, *float64 args)``.

        The tolerance is the table's entry for ``kind`` at the inputs' dtype, unless ``tol`` is
        given. Returns the actual value.
        """
        pristine = clone_tensors(args)
        actual = compute(self.impl, *args)
        changed = modified_inputs(pristine, args)
        require(
            not changed,
            behaviour="Inputs are never modified in place (protocol v1, Conventions)",
            found=f"the implementation changed input(s) {changed} during the call",
            component=component,
        )
        key = self._key(label)
        args64 = to_float64(pristine)
        expected = self.expectations.value(key, lambda ref: compute(ref, *args64), args64)
        on_bug = lambda bug: compute(bug, *pristine)  # noqa: E731 - a catalogued bug, same inputs
        self.expectations.observe_check(key, component, on_bug)
        dtype = floating_dtype(args) or torch.float64
        tol = tol or tolerance(kind, dtype, self.device)
        if dtype == torch.float32 and tolerance_measurement.enabled():
            tolerance_measurement.record(kind, self.nodeid, actual, expected)
        assert_close(
            actual,
            expected,
            behaviour=behaviour,
            tol=tol,
            component=component,
            diagnosis=lambda: self.expectations.diagnose(key, component, on_bug, actual, tol, self.impl.rope_style),
        )
        return actual
