"""Explaining a crash: which property of the input makes the implementation's call raise.

When a checked call raises (anything but ``NotImplementedError``), ``probe`` retries it on a few
variants of its input, each one property changed and each as cheap as the original call:

- rank: the leading dims merged (a 4-D input as 3-D) or one more leading dim added;
- an optional argument left ``None`` given instead (``mask=None`` as an all-True mask,
  ``positions=None`` as ``arange(T)``);
- a size at a boundary: a 1-D token stream one token longer, a length-1 time axis of two;
- the dtype: float64 inputs as float32 (and float32 as float64);
- a broadcastable shape: 1-D positions ``[T]`` given in full, ``x.shape[:-1]``.

A variant that runs names the property: "rmsnorm raises for 4-D input and works for 3-D". Only what
the probes showed is said; when every variant raises too, the line says which ones were tried.
``own_frame`` finds the innermost traceback frame in the implementation's own files (not the
adapter's, the suite's, torch's or Python's).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...protocol import ANY_LEADING

# ANY_LEADING (imported): functions whose protocol shapes are ``[..., d]``: any number of leading dims
MAX_TRIES = 6


@dataclass(frozen=True)
class Probe:
    """One input variant: ``failing`` names the property of the original input, ``working`` the variant's."""

    failing: str
    working: str
    args: tuple
    kwargs: dict
    note: str = ""


def _tensors(args, kwargs):
    yield from (a for a in args if isinstance(a, torch.Tensor))
    yield from (v for v in kwargs.values() if isinstance(v, torch.Tensor))


def _map(args, kwargs, fn):
    """``(args, kwargs)`` with ``fn`` applied to every tensor (``fn`` returns the tensor or a new one)."""
    return (
        tuple(fn(a) if isinstance(a, torch.Tensor) else a for a in args),
        {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
    )


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _rank_probes(name, args, kwargs) -> list[Probe]:
    floats = [t for t in _tensors(args, kwargs) if t.is_floating_point()]
    if not floats:
        return []
    n = max(t.ndim for t in floats)
    lead = next(t for t in floats if t.ndim == n).shape[:2]
    note = "; the protocol allows any leading dims" if name in ANY_LEADING else ""
    probes = []
    if n >= 3:

        def merge(t):
            return t.reshape(-1, *t.shape[2:]) if t.ndim == n and t.shape[:2] == lead else t

        probes.append(Probe(f"{n}-D input", f"{n - 1}-D (leading dims merged)", *_map(args, kwargs, merge), note))
    if n >= 2:

        def add(t):
            return t.unsqueeze(0) if t.ndim == n and t.is_floating_point() else t

        probes.append(Probe(f"{n}-D input", f"{n + 1}-D (a leading dim added)", *_map(args, kwargs, add), note))
    return probes


def _none_probes(args, kwargs) -> list[Probe]:
    floats = [t for t in _tensors(args, kwargs) if t.is_floating_point()]
    if not floats:
        return []
    probes = []
    q = floats[0]
    k = floats[1] if len(floats) > 1 else q
    for key, value in kwargs.items():
        if value is not None:
            continue
        if key == "mask" and q.ndim >= 2:
            given = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
            probes.append(
                Probe("mask=None", "an all-True mask", args, {**kwargs, key: given}, "; mask=None means none")
            )
        elif key == "positions" and q.ndim >= 2:
            given = torch.arange(q.shape[-2], device=q.device)
            probes.append(Probe("positions=None", "positions=arange(T)", args, {**kwargs, key: given}))
    return probes


def _boundary_probes(args, kwargs) -> list[Probe]:
    probes = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.ndim == 1 and a.numel() > 0:
            longer = torch.cat([a, a[:1]])
            new = (*args[:i], longer, *args[i + 1 :])
            probes.append(Probe(f"a 1-D input of exactly {a.numel()} entries", f"{a.numel() + 1} entries", new, kwargs))
            break
        if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.ndim == 2 and a.shape[1] == 1:
            new = (*args[:i], a.repeat(1, 2), *args[i + 1 :])
            probes.append(Probe("a sequence of length 1 (T=1)", "T=2", new, kwargs))
            break
    return probes


def _dtype_probes(args, kwargs) -> list[Probe]:
    dtypes = {t.dtype for t in _tensors(args, kwargs) if t.is_floating_point()}
    if len(dtypes) != 1:
        return []
    (dtype,) = dtypes
    other = {torch.float64: torch.float32, torch.float32: torch.float64}.get(dtype)
    if other is None:
        return []
    name = {torch.float64: "float64", torch.float32: "float32"}

    def cast(t):
        return t.to(other) if t.is_floating_point() else t

    return [Probe(f"{name[dtype]} input", name[other], *_map(args, kwargs, cast))]


def _broadcast_probes(args, kwargs) -> list[Probe]:
    floats = [t for t in _tensors(args, kwargs) if t.is_floating_point()]
    if not floats or floats[0].ndim < 3:
        return []
    x = floats[0]
    for key, value in [*enumerate(args), *kwargs.items()]:
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.ndim == 1:
            if value.shape[0] != x.shape[-2]:
                continue
            full = value.expand(*x.shape[:-1]).contiguous()
            if isinstance(key, int):
                new_args, new_kwargs = (*args[:key], full, *args[key + 1 :]), kwargs
            else:
                new_args, new_kwargs = args, {**kwargs, key: full}
            return [
                Probe(
                    f"1-D positions {_shape(value)} with a {_shape(x)} input",
                    f"positions of the full shape {_shape(full)}",
                    new_args,
                    new_kwargs,
                    "; the protocol's positions broadcast against the leading dims",
                )
            ]
    return []


def probes_for(name: str, args: tuple, kwargs: dict) -> list[Probe]:
    """The input variants worth trying for a call of ``name`` that raised (at most ``MAX_TRIES``)."""
    found = (
        _none_probes(args, kwargs)
        + _broadcast_probes(args, kwargs)
        + _rank_probes(name, args, kwargs)
        + _boundary_probes(args, kwargs)
        + _dtype_probes(args, kwargs)
    )
    return found[:MAX_TRIES]


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def probe(name: str, run: Callable, args: tuple, kwargs: dict) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: which input property the crash of ``run(*args, **kwargs)`` depends on.

    ``run`` calls the implementation; it is retried once per variant (``probes_for``), on copies.
    """
    tried, working = [], []
    for p in probes_for(name, args, kwargs):
        try:
            run(*_clone(p.args), **_clone(p.kwargs))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - the variant raises too: the property is not the trigger
            tried.append(p)
            continue
        working.append(p)
    if working:
        lines = [
            f"likely cause: {name} raises for {p.failing} and works for {p.working}{p.note}. Look at the shape, "
            f"size and dtype assumptions in {name}; fix: accept every input the protocol allows (evidence: the "
            f"same call with only this changed runs)"
            for p in working
        ]
        return lines, ["crash"]
    if tried:
        names = "; ".join(f"{p.working} instead of {p.failing}" for p in tried)
        return [f"note: the crash does not depend on what was probed: {name} raises as well with {names}"], []
    return [], []


# ---------------------------------------------------------------------------------------------
# where the implementation's own code raised


def _foreign_roots() -> tuple[str, ...]:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # spec_tests/
    siblings = [
        os.path.join(os.path.dirname(here), name) + os.sep for name in ("tools", "spec_adapters", "spec_grading")
    ]
    roots = [here + os.sep, *siblings, os.path.dirname(os.path.realpath(torch.__file__)) + os.sep]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(os.path.realpath(path) + os.sep)
    roots.append(os.path.realpath(sys.prefix) + os.sep)
    return tuple(roots)


def own_frame(exc: BaseException | None) -> str:
    """``file:line in function`` of the innermost frame outside the suite, the adapters, torch and Python."""
    if exc is None or exc.__traceback__ is None:
        return ""
    foreign = _foreign_roots()
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith("<"):
            continue
        real = os.path.realpath(frame.filename)
        if any(real.startswith(r) for r in foreign):
            continue
        shown = os.path.relpath(real)
        where = f"{real if shown.startswith('..') else shown}:{frame.lineno} in {frame.name}"
    return where


# ---------------------------------------------------------------------------------------------
# the subject as tests call it: every protocol call that raises is probed


class Probing:
    """A subject whose protocol functions report a crash to ``on_crash(name, run, args, kwargs, exc)``
    before it propagates; everything else is the subject's own (``spec.impl`` in tests)."""

    def __init__(self, subject, on_crash: Callable):
        self._subject, self._on_crash = subject, on_crash

    def __getattr__(self, name: str):
        value = getattr(self._subject, name)
        if name.startswith("_") or not callable(value) or name not in _protocol_names():
            return value
        from ..subject.subject import ImplementationError

        def call(*args, **kwargs):
            try:
                return value(*args, **kwargs)
            except ImplementationError as exc:
                self._on_crash(name, value, args, kwargs, exc)
                raise

        return call

    def __repr__(self) -> str:
        return repr(self._subject)


def _protocol_names() -> tuple[str, ...]:
    from ...protocol import PROTOCOL_NAMES

    return PROTOCOL_NAMES
