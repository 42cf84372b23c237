"""The implementation under test in another process: a ``Subject`` whose calls and model operations
are requests to a worker (``remote.Worker``), normally inside the sandbox.

This is how grading judges a submission: the test process (the judge) never imports submission
code, holds the expected values and decides; the worker only runs protocol calls and model
operations and sends back plain data. Root-cause reruns substitute failing functions inside the
worker by stubs that ask this process, which answers with the reference.
"""

from __future__ import annotations

import contextlib
import sys
import time

from ...protocol import REFERENCE_ONLY, effective_capabilities
from ..judging.treemap import tree_leaves
from ..subject.model_ops import OP_USES
from ..subject.subject import ImplementationError, NotImplementedInImpl, Subject, declared_attributes
from .client import RemoteError, StaleHandleError, Worker, WorkerCrashed, WorkerGaveUp, WorkerTimeout

# The most tensor elements one call to a replaced function may pass: the suite's own calls pass far
# fewer, and this process (with the judge's memory limit) computes whatever a call asks.
ORACLE_MAX_ELEMENTS = 1 << 22

# The reference's keyword-only options that the protocol does not have (docs/protocol.md, amendments 6 and 23:
# "Reference-only options"). A replaced function answers protocol calls only: these select the
# reference's fast paths, and some build and keep state in the judge (``rope(table_size=N)`` fills a
# table of N positions kept between calls), so a call passing one is refused by name.
# REFERENCE_ONLY (imported): each protocol entry's ``reference_only``.


def check_oracle_arguments(name: str, args, kwargs) -> None:
    """A replaced function's call, refused (``ValueError``) when it passes a reference-only keyword
    (``REFERENCE_ONLY``) or more than ``ORACLE_MAX_ELEMENTS`` tensor elements: the submission chose
    them, and the judge computes."""
    refused = sorted(set(kwargs) & REFERENCE_ONLY.get(name, frozenset()))
    if refused:
        raise TypeError(
            f"{name} was called with {', '.join(f'{k}=' for k in refused)}, an option of the reference that "
            f"the protocol does not have; while {name} is replaced by a correct version, it answers protocol "
            "calls only (call it with the protocol's arguments)"
        )
    size = sum(t.numel() for _, t in tree_leaves((args, kwargs)))
    if size > ORACLE_MAX_ELEMENTS:
        raise ValueError(
            f"{name}: {size} tensor elements in one call to a replaced function (at most {ORACLE_MAX_ELEMENTS})"
        )


def _caches_of(functions) -> list:
    """The ``functools`` caches (``cache_clear``) at module level in the modules of ``functions``
    (e.g. the reference's RoPE tables), so that a root-cause rerun leaves nothing behind in the judge."""
    found, seen = [], set()
    for fn in functions:
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        package = sys.modules.get((getattr(module, "__package__", None) or "").partition(".")[0]) if module else None
        for mod in {id(m): m for m in (module, package) if m is not None}.values():
            names = [n for n in sys.modules if n == mod.__name__ or n.startswith(mod.__name__ + ".")]
            for name in names:
                for value in list(vars(sys.modules[name]).values()):
                    if callable(getattr(value, "cache_clear", None)) and callable(getattr(value, "cache_info", None)):
                        if id(value) not in seen:
                            seen.add(id(value))
                            found.append(value)
    return found


class _Declared:
    """The attributes the worker reported, as an object ``declared_attributes`` can read."""

    def __init__(self, attributes: dict):
        for key, value in attributes.items():
            setattr(self, key, tuple(value) if isinstance(value, list) else value)


class RemoteSubject(Subject):
    """The submission behind a worker; every call carries the current test's deadline."""

    def __init__(self, worker: Worker, *, capabilities=None, test_timeout: float = 60.0):
        self.worker, self.test_timeout = worker, test_timeout
        worker.start()
        self.label = worker.label
        self.rope_style, self.families, declared = declared_attributes(_Declared(worker.attributes), self.label)
        self.capabilities = effective_capabilities(capabilities) if capabilities is not None else declared
        self.deadline = time.monotonic() + test_timeout
        self._replacements: dict = {}
        self.calls = set()

    def __repr__(self) -> str:
        return f"RemoteSubject({self.label})"

    def provides(self, name: str) -> bool:
        return self.worker.provides(name)

    def begin_test(self) -> None:
        super().begin_test()
        self.deadline = time.monotonic() + self.test_timeout
        try:
            self.worker.reset(deadline=self.deadline)
        except (WorkerTimeout, WorkerCrashed):
            pass  # the next call starts a fresh worker

    def __getattr__(self, name: str):
        from ...protocol import PROTOCOL_NAMES

        if name.startswith("_") or name not in PROTOCOL_NAMES:
            raise AttributeError(f"{name!r} is not a protocol v1 name")
        self.require(name)

        def call(*args, **kwargs):
            self.calls.add(name)
            if name in self._replacements:  # a direct call to a substituted name: the correct one
                return self._replacements[name](*args, **kwargs)
            return self._request(name, name, lambda: self.worker.call(name, args, kwargs, deadline=self.deadline))

        return call

    def op(self, name: str, *args):
        protocol_name = OP_USES.get(name, (name,))[0]
        return self._request(protocol_name, name, lambda: self.worker.op(name, args, deadline=self.deadline))

    def _request(self, name: str, what: str, send):
        try:
            return send()
        except RemoteError as exc:
            if exc.not_implemented:
                raise NotImplementedInImpl(name, exc.message) from None
            short = tuple(m.rsplit(".", 1)[-1] for m in exc.mro) or (exc.type,)
            raise ImplementationError(name, short, exc.message, exc.where or "") from None
        except WorkerTimeout:
            raise ImplementationError(
                name, ("Timeout",), f"{what} did not finish within the test's limit of {self.test_timeout:g} s"
            ) from None
        except WorkerGaveUp as exc:
            message = f"could not run: the process running your code {exc.reason}"
            raise ImplementationError(name, ("NotRun",), message) from None
        except WorkerCrashed as exc:
            raise ImplementationError(name, ("Crash",), f"the process running your code {exc}") from None
        except StaleHandleError as exc:
            raise ImplementationError(name, ("Crash",), f"{exc} (your code's process was restarted)") from None

    @contextlib.contextmanager
    def substituted(self, replacements: dict):
        """Inside the worker, the named functions ask this process, which answers with ``replacements``."""

        def oracle(name, args, kwargs):
            check_oracle_arguments(name, args, kwargs)
            return replacements[name](*args, **kwargs)

        caches = _caches_of(replacements.values())
        sizes = [c.cache_info().currsize for c in caches]
        self.worker.substitute(list(replacements), oracle=oracle, deadline=self.deadline)
        saved, self._replacements = self._replacements, {**self._replacements, **replacements}
        try:
            yield
        finally:
            self._replacements = saved
            for cache, size in zip(caches, sizes):  # what the rerun's calls built is not kept
                if cache.cache_info().currsize > size:
                    cache.cache_clear()
            try:
                self.worker.restore(deadline=time.monotonic() + 10)
            except (WorkerTimeout, WorkerCrashed):
                pass
