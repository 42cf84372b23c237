"""The implementation under test as tests see it: a ``Subject``.

A test calls protocol functions on its subject (``subject.rmsnorm(x, w)``) and asks it for model
operations (``subject.build(config, weights)``, ``subject.training_flags(model)``). The same interface
is served in-process (``LocalSubject``: the ``--impl`` module, the reference, a catalogued bug) and
by a sandboxed worker process (``remote.RemoteSubject``, grading), so a test is written once.

A name the implementation does not define is "not provided": the test is skipped. A name that
raises ``NotImplementedError`` is "not implemented": a one-line failure. Any other exception raised
by the implementation under test becomes an ``ImplementationError`` that says where it was raised.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import traceback
import types

import pytest

from ...protocol import (
    ALL_CAPABILITIES,
    ALL_FAMILIES,
    DEFAULT_ROPE_STYLE,
    FIXABLE_CONFIG,
    KNOWN_CAPABILITIES,
    PROTOCOL_NAMES,
    ROPE_STYLES,
    STYLE_KEYWORD,
    effective_capabilities,
)
from ..diagnosis.crash_site import raised_as_not_implemented
from ..text import plain_text
from . import model_ops
from .loading import fresh_copy


class NotImplementedInImpl(BaseException):
    """A protocol function reported ``NotImplementedError``; carries its name.

    A ``BaseException`` on purpose: Hypothesis then stops at the first example instead of
    shrinking a failure that every input reproduces, and no ``except Exception`` in a test or in
    the implementation can swallow it.
    """

    def __init__(self, name: str, inner: str = ""):
        self.name, self.inner = name, inner
        super().__init__(name if inner in ("", name) else f"{inner} (reached through {name})")


class ImplementationError(Exception):
    """The implementation raised while the suite called ``name``.

    ``type_names`` are the names of the exception's classes (its MRO), so that checks for an
    exception type work the same for an exception object (local) and for its description (remote).
    """

    def __init__(
        self,
        name: str,
        type_names: tuple[str, ...],
        message: str,
        where: str = "",
        original=None,
        *,
        process=False,
        site: dict | None = None,
    ):
        self.name, self.type_names, self.message, self.where = name, tuple(type_names), message, where
        self.original = original
        self.site = site  # what the raising line held, as a worker reads it (``crash_site.read_site``)
        self.process = process  # the process running the code timed out, crashed or was given up on, not a raise
        text = f"{type_names[0]}: {message}" if message else type_names[0]
        super().__init__(text + (f"\n  raised at {where}" if where else "") + f" (reached through {name})")

    @property
    def type_name(self) -> str:
        return self.type_names[0]

    def is_a(self, exc_type: type[BaseException]) -> bool:
        return exc_type.__name__ in self.type_names


class Subject:
    """The interface tests use; see the module docstring. Subclasses serve calls and operations."""

    label: str
    rope_style: str
    families: tuple[str, ...]
    capabilities: frozenset[str]
    # protocol v2 (amendment 26): config keys every llama model of the implementation has (FIXED_CONFIG); none
    # in grading, where the rubric decides what is judged
    fixed_config: types.MappingProxyType = types.MappingProxyType({})

    def provides(self, name: str) -> bool:
        raise NotImplementedError

    def require(self, *names: str) -> None:
        """Skip the calling test unless every name is provided."""
        missing = [n for n in names if not self.provides(n)]
        if missing:
            pytest.skip(f"not provided by {self.label}: {', '.join(missing)}")

    def require_family(self, family: str) -> None:
        if family not in self.families:
            pytest.skip(f"not provided by {self.label}: family {family!r} (FAMILIES = {self.families})")

    def require_capability(self, *capabilities: str) -> None:
        missing = [c for c in capabilities if c not in self.capabilities]
        if missing:
            pytest.skip(f"not provided by {self.label}: capability {', '.join(missing)} (CAPABILITIES)")

    def op(self, name: str, *args):
        raise NotImplementedError

    # model operations (model_ops.py), by name
    def build(self, config, state_dict=None, *, dtype="float64", device="cpu", seed=None, training=False):
        dtype = str(dtype).removeprefix("torch.")
        return self.op("build", config, state_dict, dtype, str(device), seed, training)

    def set_training(self, model, training: bool | list[bool]) -> None:
        """The model's mode; a list sets each module's flag (``training_flags`` order)."""
        flags = [bool(flag) for flag in training] if isinstance(training, list | tuple) else bool(training)
        self.op("set_training", model, flags)

    def training_flags(self, model) -> list[bool]:
        return self.op("training_flags", model)

    def manual_seed(self, seed: int) -> None:
        self.op("manual_seed", int(seed))

    def make_optimizer(self, model, kind: str, lr: float, eps: float = 1e-8):
        return self.op("make_optimizer", model, kind, float(lr), float(eps))

    def parameter_facts(self, model) -> dict:
        return self.op("parameter_facts", model)

    def parameter_order(self, model) -> list:
        return self.op("parameter_order", model)

    def embedding_grad(self, model, ids):
        return self.op("embedding_grad", model, ids)

    def grads_present(self, model) -> int:
        return self.op("grads_present", model)

    def observe_modes(self, model, name: str, *args, **kwargs) -> dict:
        return self.op("observe_modes", model, name, list(args), dict(kwargs))

    def input_grads(self, name: str, args, kwargs=None, cotangent=None) -> list:
        """The gradients of ``sum(<name>(*args, **kwargs) * cotangent)`` with respect to each floating-point input."""
        return self.op("input_grads", name, list(args), dict(kwargs or {}), cotangent)

    def cross_entropy_grads(self, model, x, y) -> dict:
        return self.op("cross_entropy_grads", model, x, y)

    def parameter_count(self, model) -> int:
        return self.op("parameter_count", model)

    def shared_canonical_names(self, model) -> list[list[str]]:
        return self.op("shared_canonical_names", model)

    def keeps_given_tensors(self, config, state_dict, *, dtype="float64", device="cpu") -> dict:
        return self.op("keeps_given_tensors", config, state_dict, str(dtype).removeprefix("torch."), str(device))

    def correct_steps(
        self,
        model,
        kind,
        lr,
        eps,
        x,
        y,
        max_grad_norm=None,
        steps=2,
        weight_decay=None,
        betas=None,
        clip_each=False,
        zero_unused=False,
    ):
        clip = None if max_grad_norm is None else float(max_grad_norm)
        adamw = None if weight_decay is None else {"weight_decay": float(weight_decay), "betas": list(betas)}
        return self.op(
            "correct_steps",
            model,
            kind,
            float(lr),
            float(eps),
            x,
            y,
            clip,
            int(steps),
            adamw,
            clip_each if isinstance(clip_each, str) else bool(clip_each),
            bool(zero_unused),
        )

    # the reference composed with other functions (root causes, the knob search)
    def substituted(self, replacements: dict):
        """A context in which each named protocol function is replaced by ``replacements[name]``.
        Only an in-process subject has it (``LocalSubject``; the callers use the reference): a worker's
        subject (``RemoteSubject``) replaces nothing inside the submission."""
        raise NotImplementedError

    # per-test bookkeeping
    def begin_test(self) -> None:
        self.calls: set[str] = set()

    def diagnosing(self) -> contextlib.AbstractContextManager:
        """Calls made to explain a failure (a crash's probes, a diagnosis, a composed rerun) run inside this: a subject
        with a time limit per test gives them their own (``RemoteSubject``), so what they find never depends on how
        much of the test's limit the failing test left on this machine."""
        return contextlib.nullcontext()


def declared_attributes(obj, label: str) -> tuple[str, tuple[str, ...], frozenset[str]]:
    """``ROPE_STYLE``, ``FAMILIES`` and ``CAPABILITIES`` of an implementation, validated."""
    families = tuple(getattr(obj, "FAMILIES", ALL_FAMILIES))
    unknown = [f for f in families if f not in ALL_FAMILIES]
    if unknown:
        raise ValueError(f"{label}: FAMILIES lists unknown families {unknown}; known: {ALL_FAMILIES}")
    rope_style = getattr(obj, "ROPE_STYLE", DEFAULT_ROPE_STYLE)
    if rope_style not in ROPE_STYLES:
        raise ValueError(f"{label}: ROPE_STYLE must be one of {ROPE_STYLES}, got {rope_style!r}")
    capabilities = getattr(obj, "CAPABILITIES", ALL_CAPABILITIES)
    if isinstance(capabilities, str):
        raise ValueError(f"{label}: CAPABILITIES must be a collection of names, got the string {capabilities!r}")
    unknown = [c for c in capabilities if c not in KNOWN_CAPABILITIES]
    if unknown:
        raise ValueError(f"{label}: CAPABILITIES lists unknown capabilities {unknown}; known: {ALL_CAPABILITIES}")
    try:
        return rope_style, families, effective_capabilities(capabilities, protocol_version(obj))
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None


def declared_fixed_config(obj, label: str, capabilities: frozenset[str]) -> types.MappingProxyType:
    """``FIXED_CONFIG`` of an implementation (protocol v2, amendment 26), validated: config keys of
    ``FIXABLE_CONFIG`` set to True, each with its capability held."""
    fixed = getattr(obj, "FIXED_CONFIG", None) or {}
    if not isinstance(fixed, dict):
        raise ValueError(f"{label}: FIXED_CONFIG must be a dict of config keys, got {fixed!r}")
    for key, value in fixed.items():
        if key not in FIXABLE_CONFIG:
            raise ValueError(f"{label}: FIXED_CONFIG names {key!r}, not one of {sorted(FIXABLE_CONFIG)}")
        if value is not True:
            raise ValueError(f"{label}: FIXED_CONFIG[{key!r}] must be True, got {value!r}")
        if FIXABLE_CONFIG[key] not in capabilities:
            raise ValueError(f"{label}: FIXED_CONFIG names {key!r} without the capability {FIXABLE_CONFIG[key]!r}")
    return types.MappingProxyType(dict(fixed))


def protocol_version(obj) -> int:
    """The implementation's ``PROTOCOL_VERSION`` (default 1): how its ``CAPABILITIES`` list is read."""
    return getattr(obj, "PROTOCOL_VERSION", 1)


# STYLE_KEYWORD (imported): the reference's options that select the RoPE pairing (see docs/protocol.md,
# amendment 6), each protocol entry's ``style_keyword``.


class _Calls:
    """Attribute access to a subject's protocol functions, for model operations."""

    def __init__(self, subject: LocalSubject):
        self._subject = subject

    def __getattr__(self, name: str):
        return getattr(self._subject, name)


class LocalSubject(Subject):
    """An implementation in this process: a module or any object with the protocol's names.

    ``bind_style`` (the reference and catalogued bugs): calls get the reference-only RoPE style
    option of ``rope_style``. ``under_test``: exceptions become ``ImplementationError`` (the
    reference's own exceptions are the suite's bugs and keep their tracebacks).
    """

    def __init__(
        self,
        obj,
        label: str,
        *,
        rope_style: str | None = None,
        bind_style: bool = False,
        under_test: bool = True,
        capabilities=None,
        roots: tuple[str, ...] | None = None,
    ):
        self.obj, self.label, self.bind_style, self.under_test = obj, label, bind_style, under_test
        declared_style, self.families, declared = declared_attributes(obj, label)
        self.rope_style = rope_style or declared_style
        self.capabilities = effective_capabilities(capabilities) if capabilities is not None else declared
        if capabilities is None:  # a capability list given to the suite (grading's rubric) decides alone
            self.fixed_config = declared_fixed_config(obj, label, self.capabilities)
        self.roots = roots if roots is not None else source_roots(obj)
        self._replaced: dict[str, object] = {}
        self.calls = set()

    def __repr__(self) -> str:
        return f"LocalSubject({self.label})"

    def provides(self, name: str) -> bool:
        return getattr(self.obj, name, None) is not None

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in PROTOCOL_NAMES:
            raise AttributeError(f"{name!r} is not a protocol v1 name")
        self.require(name)
        self.calls.add(name)
        fn = self._replaced.get(name) or getattr(self.obj, name)
        if self.bind_style and name in STYLE_KEYWORD:
            fn = functools.partial(fn, **{STYLE_KEYWORD[name]: self.rope_style})
        return self._wrap(fn, name) if self.under_test else fn

    def _wrap(self, fn, name: str):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (NotImplementedInImpl, ImplementationError):
                raise
            except NotImplementedError as exc:
                if not raised_as_not_implemented(exc):  # torch refusing this input: a crash like any other
                    raise self.describe(exc, name) from exc
                raise NotImplementedInImpl(name, plain_text(exc, 2000)) from None
            except Exception as exc:  # whatever the implementation raised is reported, not re-raised raw
                raise self.describe(exc, name) from exc

        return call

    def describe(self, exc: BaseException, name: str) -> ImplementationError:
        names = tuple(c.__name__ for c in type(exc).__mro__ if c is not object)
        return ImplementationError(name, names, plain_text(exc, 2000), innermost_frame(exc, self.roots), original=exc)

    def op(self, name: str, *args):
        return model_ops.OPS[name](_Calls(self), *args)

    def fresh_function(self, name: str):
        """``name`` of a copy of the implementation loaded again (``loading.fresh_copy``: its module state starts
        over), called as this subject calls it; ``None`` where no copy can be loaded."""
        copy = fresh_copy(self.obj, _shared_roots())
        fn = getattr(copy, name, None) if copy is not None else None
        if fn is not None and self.bind_style and name in STYLE_KEYWORD:
            fn = functools.partial(fn, **{STYLE_KEYWORD[name]: self.rope_style})
        return fn

    def fresh_subject(self) -> LocalSubject | None:
        """This subject over a copy of the implementation loaded again (``loading.fresh_copy``); ``None`` where no
        copy can be loaded. Its models, caches and optimizers are its own: objects of this subject's are not its."""
        copy = fresh_copy(self.obj, _shared_roots())
        if copy is None:
            return None
        again = LocalSubject(copy, self.label, rope_style=self.rope_style, bind_style=self.bind_style,
                             capabilities=self.capabilities, roots=self.roots)  # fmt: skip
        again.fixed_config = self.fixed_config
        return again

    @contextlib.contextmanager
    def substituted(self, replacements: dict):
        """Rebind each named function in the implementation's own modules (and on the subject)."""
        originals = {name: getattr(self.obj, name) for name in replacements if self.provides(name)}
        patched = []
        for module in implementation_modules(self.obj, self.roots):
            for attr, value in list(vars(module).items()):
                for name, original in originals.items():
                    if value is original:
                        setattr(module, attr, replacements[name])
                        patched.append((module, attr, value))
        saved = dict(self._replaced)
        self._replaced.update(replacements)
        try:
            yield
        finally:
            self._replaced = saved
            for module, attr, value in patched:
                setattr(module, attr, value)


@functools.cache
def _shared_roots() -> tuple[str, ...]:
    """Folders whose modules a fresh copy of an implementation shares with this run: the suite's, torch's and
    Python's, and the installed packages'."""
    import sysconfig

    import torch

    suite = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # spec_tests/
    roots = [suite, os.path.dirname(os.path.realpath(torch.__file__))]
    paths = sysconfig.get_paths()
    roots += [os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]
    return tuple(dict.fromkeys(r + os.sep for r in roots))


def source_roots(obj) -> tuple[str, ...]:
    """Where an implementation's code lives: its package folder or file (or in-memory label)."""
    module = obj if inspect.ismodule(obj) else inspect.getmodule(type(obj)) or inspect.getmodule(obj)
    if module is None:
        return ()
    file = getattr(module, "__file__", None)
    if file:
        path = os.path.realpath(file)
        return (os.path.dirname(path) + os.sep,) if hasattr(module, "__path__") else (path,)
    origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    return (origin.rsplit("/", 1)[0] + "/",) if origin.startswith("<") else ()


@functools.cache
def _realpath(file: str) -> str:
    """``os.path.realpath``, once per file: ``implementation_modules`` walks every loaded module at each
    substitution (the diagnosis's model search substitutes dozens of times), and resolving thousands of paths
    again each time took a second per substitution on a busy machine."""
    return os.path.realpath(file)


_MODULES_FOUND: dict = {}  # (id(obj), roots, len(sys.modules)) -> (obj, modules): the walk, once per set of modules


def implementation_modules(obj, roots: tuple[str, ...]) -> list:
    """The loaded modules whose code lies under ``roots`` (and the implementation object itself). The walk over
    ``sys.modules`` is kept until a module is loaded or dropped: a failing run substitutes a thousand times."""
    key = (id(obj), roots, len(sys.modules))
    kept = _MODULES_FOUND.get(key)
    if kept is not None and kept[0] is obj:
        return list(kept[1])
    found = _walk_modules(obj, roots)
    _MODULES_FOUND[key] = (obj, found)
    return list(found)


def _walk_modules(obj, roots: tuple[str, ...]) -> list:
    found = [obj] if inspect.ismodule(obj) or hasattr(obj, "__dict__") else []
    package = getattr(obj, "__name__", "") if inspect.ismodule(obj) else ""
    for module in list(sys.modules.values()):
        if module is None or module is obj:
            continue
        file = getattr(module, "__file__", None)
        real = _realpath(file) if file else ""
        if real and any(real.startswith(r) or real == r for r in roots):
            found.append(module)
        elif package and module.__name__.startswith(package + "."):
            found.append(module)
    return found


def innermost_frame(exc: BaseException, roots: tuple[str, ...]) -> str:
    """``file:line in function`` of the innermost traceback frame inside the implementation."""
    if not roots:
        return ""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        real = os.path.realpath(frame.filename) if not frame.filename.startswith("<") else frame.filename
        for root in roots:
            if real.startswith(root) or real == root:
                base = os.path.dirname(root.rstrip(os.sep)) if not root.startswith("<") else ""
                shown = os.path.relpath(real, base) if base else real
                where = f"{shown}:{frame.lineno} in {frame.name}"
    return where


# --------------------------------------------------------------------------------------------
# The reference as a subject
# --------------------------------------------------------------------------------------------


@functools.cache
def reference_module():
    """The live reference package (absent from student handouts)."""
    import reference

    return reference


def reference_subject(rope_style: str, module=None, label: str = "reference") -> LocalSubject:
    """The reference (or a catalogued copy of it) with its RoPE style fixed to ``rope_style``."""
    return LocalSubject(module or reference_module(), label, rope_style=rope_style, bind_style=True, under_test=False)


class ReferenceImplementation:
    """The reference bound to one RoPE style, usable as ``--impl`` (recording passes check it).

    ``--impl=spec_tests.harness.subject.subject:reference_half`` or ``...:reference_interleaved``.
    """

    FAMILIES = ALL_FAMILIES

    def __init__(self, rope_style: str):
        self.ROPE_STYLE = rope_style

    def __getattr__(self, name: str):
        if name.startswith("_") or name.isupper():
            raise AttributeError(name)
        return getattr(reference_subject(self.ROPE_STYLE), name)


def __getattr__(name: str):
    style = name.removeprefix("reference_")
    if name.startswith("reference_") and style in ROPE_STYLES:
        return ReferenceImplementation(style)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
