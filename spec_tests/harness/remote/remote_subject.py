"""The implementation under test in another process: a ``Subject`` whose calls and model operations
are requests to a worker (``remote.Worker``), normally inside the sandbox.

This is how grading judges a submission: the test process (the judge) never imports submission
code, holds the expected values and decides; the worker only runs protocol calls and model
operations and sends back plain data. Root-cause analysis composes the reference (a local subject)
with this subject's functions (``judging/consequences.py``); nothing is replaced inside the worker,
and this subject has no ``substituted``.
"""

from __future__ import annotations

import contextlib
import time

from ...protocol import effective_capabilities
from ..subject.model_ops import OP_USES
from ..subject.subject import ImplementationError, NotImplementedInImpl, Subject, declared_attributes
from .client import RemoteError, StaleHandleError, Worker, WorkerCrashed, WorkerGaveUp, WorkerTimeout


class _Declared:
    """The attributes the worker reported, as an object ``declared_attributes`` can read."""

    def __init__(self, attributes: dict):
        for key, value in attributes.items():
            setattr(self, key, tuple(value) if isinstance(value, list) else value)


class RemoteSubject(Subject):
    """The submission behind a worker; every call carries the current test's deadline: ``test_timeout`` from the
    test's start, moved on by the time the worker took to (re)start since (a restart after the previous test's crash
    is not the test's time, and a slower machine must not leave a test's later calls, or its probes, less of it)."""

    def __init__(self, worker: Worker, *, capabilities=None, test_timeout: float = 60.0):
        self.worker, self.test_timeout = worker, test_timeout
        worker.start()
        self.label = worker.label
        self.rope_style, self.families, declared = declared_attributes(_Declared(worker.attributes), self.label)
        self.capabilities = effective_capabilities(capabilities) if capabilities is not None else declared
        self._began, self._starting_s = time.monotonic(), worker.starting_s
        self.calls = set()

    def __repr__(self) -> str:
        return f"RemoteSubject({self.label})"

    def provides(self, name: str) -> bool:
        return self.worker.provides(name)

    @property
    def deadline(self) -> float:
        return self._began + self.test_timeout + (self.worker.starting_s - self._starting_s)

    @contextlib.contextmanager
    def diagnosing(self):
        """The whole ``test_timeout`` afresh while explaining a failure; the test's own limit then goes on where it
        was (a probe that times out ends probing: ``diagnosis/crashes.py``)."""
        began, starting, now, started = self._began, self._starting_s, time.monotonic(), self.worker.starting_s
        self._began, self._starting_s = now, started
        try:
            yield
        finally:
            self._began = began + (time.monotonic() - now)
            self._starting_s = starting + (self.worker.starting_s - started)

    def begin_test(self) -> None:
        super().begin_test()
        self._began, self._starting_s = time.monotonic(), self.worker.starting_s
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
            raise ImplementationError(name, short, exc.message, exc.where or "", site=exc.site) from None
        except WorkerTimeout:
            raise ImplementationError(
                name,
                ("Timeout",),
                f"{what} did not finish within the test's limit of {self.test_timeout:g} s",
                process=True,
            ) from None
        except WorkerGaveUp as exc:
            message = f"could not run: the process running your code {exc.reason}"
            raise ImplementationError(name, ("NotRun",), message, process=True) from None
        except WorkerCrashed as exc:
            raise ImplementationError(name, ("Crash",), f"the process running your code {exc}", process=True) from None
        except StaleHandleError as exc:
            raise ImplementationError(
                name, ("Crash",), f"{exc} (your code's process was restarted)", process=True
            ) from None
