"""The judge's side of remote execution: a worker process (``worker.py``), sandboxed where possible
(``sandbox.py``), that runs the submission's protocol calls and model operations and returns plain
data (``wire.py``). The judge never imports submission code.

    with Worker("/staged/submission.py", ops="spec_tests.harness.subject.model_ops") as worker:
        worker.names, worker.attributes              # from the worker's hello
        y = worker.call("rmsnorm", (x, w), {"eps": 1e-5}, deadline=time.monotonic() + 60)
        model = worker.op("build", (config, state_dict, torch.float64, "cpu"))   # a RemoteHandle

Failures are exceptions: ``RemoteError`` (the implementation raised: type, mro, message, where,
not_implemented; ``RemoteImportError`` when it could not be imported), ``WorkerTimeout`` (the
deadline passed: the whole sandbox was killed), ``WorkerCrashed`` (the worker died: the reason names
the signal or exit status, with the log's tail; ``WorkerProtocolError`` when it sent something that
is not a well-formed message). After a timeout or crash the next request starts a fresh worker (its
``generation`` goes up); handles of the old one raise ``StaleHandleError``, and so do handles from
before a ``reset()``.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

from spec_tests.harness.remote import cgroup as cgroup_mod
from spec_tests.harness.remote import sandbox as sandbox_mod
from spec_tests.harness.remote import wire
from spec_tests.harness.text import plain_text

# Each restart (after a timeout or crash) starts a fresh sandbox and imports the submission again.
# After this many, the worker is not started again: a submission that crashes or stalls in every
# test (or imports slowly each time) costs at most this many starts, not one per remaining test.
DEFAULT_MAX_RESTARTS = 25
# The submission's imports in restarts (not the first start's, not the harness's own part) together
# may take this long; then the worker is not started again. It is a budget of its own, not the
# test's time: under load an honest import can take seconds, and charging it to a test with a short
# limit would make every test after a timeout time out in turn.
DEFAULT_RESTART_BUDGET_S = 120.0


class WorkerError(Exception):
    """Base of what a request to the worker can raise besides ``WireError`` for unsendable values."""


class WorkerTimeout(WorkerError, TimeoutError):
    """The deadline passed before the worker answered; the worker (its whole sandbox) was killed."""


class WorkerCrashed(WorkerError):
    """The worker died. ``reason`` says how (signal name or exit status), ``log_tail`` what it printed last."""

    def __init__(self, reason: str, *, signal_name: str | None = None, exit_status: int | None = None, log_tail=""):
        self.reason, self.signal_name, self.exit_status, self.log_tail = reason, signal_name, exit_status, log_tail
        super().__init__(f"the worker {reason}")


class WorkerProtocolError(WorkerCrashed):
    """The worker sent something that is not a well-formed message (it was killed)."""


class WorkerGaveUp(WorkerCrashed):
    """The worker was restarted ``max_restarts`` times: it is not started again (every later request
    raises this at once, so the remaining tests end quickly with one line saying why)."""


class StaleHandleError(WorkerError, ValueError):
    """A handle from a worker that has since been restarted or reset."""


class RemoteError(WorkerError):
    """The implementation raised. The fields are data reported by the worker (sanitised)."""

    def __init__(
        self, type_name: str, mro: list[str], message: str, where: str | None, not_implemented: bool, site=None
    ):
        self.type, self.mro, self.message, self.where = type_name, list(mro), message, where
        self.not_implemented, self.site = not_implemented, site
        text = f"{type_name}: {message}" if message else type_name
        super().__init__(text + (f" (at {where})" if where else ""))

    def is_a(self, exc_type: type[BaseException]) -> bool:
        """Whether the remote exception was an instance of ``exc_type`` (by qualified class names)."""
        return f"{exc_type.__module__}.{exc_type.__qualname__}" in self.mro

    @classmethod
    def from_data(cls, data) -> RemoteError:
        fields = {"type", "mro", "message", "where", "not_implemented"}
        if type(data) is not dict or not fields <= set(data) <= {*fields, "site"}:
            raise wire.WireError("an error report needs exactly type, mro, message, where, not_implemented (and site)")
        type_name, mro, message, where, not_impl = (
            data[k] for k in ("type", "mro", "message", "where", "not_implemented")
        )
        if type(type_name) is not str or type(message) is not str or type(not_impl) is not bool:
            raise wire.WireError("an error report has fields of the wrong type")
        if type(mro) is not list or len(mro) > 64 or not all(type(m) is str for m in mro):
            raise wire.WireError("an error report's mro must be a list of at most 64 strings")
        if where is not None and type(where) is not str:
            raise wire.WireError("an error report's where must be a string or null")
        from ..diagnosis.crash_site import checked_site

        try:
            site = checked_site(data.get("site"))
        except ValueError as exc:
            raise wire.WireError(str(exc)) from None
        return cls(
            plain_text(type_name, 200),
            [plain_text(m, 300) for m in mro],
            plain_text(message, 4000),
            plain_text(where, 500) if where is not None else None,
            not_impl,
            site,
        )


class RemoteImportError(RemoteError):
    """The implementation failed to import in the worker."""


@dataclass(frozen=True, eq=False)
class RemoteHandle:
    """An object that stays in the worker (a model, a cache, an optimizer, ...)."""

    id: int
    kind: str
    type: str
    generation: int
    epoch: int
    owner: int  # id() of the Worker that made it

    def __repr__(self) -> str:
        return f"<remote {self.kind} {self.type} #{self.id}, worker generation {self.generation}>"


_SIGNAL_TEXT = {
    "SIGSEGV": "crashed with a segmentation fault (SIGSEGV)",
    "SIGABRT": "crashed: the process aborted (SIGABRT, e.g. os.abort() or a failed check in C code)",
    "SIGKILL": "was killed (SIGKILL), usually for using too much memory",
    "SIGBUS": "crashed with a bus error (SIGBUS)",
    "SIGFPE": "crashed with a floating-point exception (SIGFPE)",
    "SIGILL": "crashed with an illegal instruction (SIGILL)",
}


def describe_exit(returncode: int | None, sandboxed: bool) -> tuple[str, str | None, int | None]:
    """``(reason, signal name, exit status)`` for a worker process that ended with ``returncode``.
    bwrap reports a command killed by signal N as exit status 128 + N."""
    signum = None
    if returncode is None:
        return "stopped answering", None, None
    if returncode < 0:
        signum = -returncode
    elif sandboxed and 128 < returncode < 128 + 65:
        signum = returncode - 128
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return _SIGNAL_TEXT.get(name, f"was ended by {name}"), name, None
    return (
        f"ended with exit status {returncode} (graded code must return, not end the process: sys.exit, os._exit?)",
        None,
        returncode,
    )


class CappedLog:
    """The worker's stdout and stderr: the first ``cap/2`` bytes go to ``path``, the last ``cap/2``
    are kept in memory (and appended to the file when the worker ends)."""

    def __init__(self, path: str, cap: int):
        self.path, self.half = path, max(1024, cap // 2)
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.file = open(path, "wb")  # closed in close()

    def feed(self, data: bytes) -> None:
        with self.lock:
            room = self.half - len(self.head)
            if room > 0:
                part = data[:room]
                self.head += part
                self.file.write(part)
                self.file.flush()
                data = data[room:]
            if data:
                self.tail.append(data)
                self.tail_size += len(data)
                while self.tail_size - len(self.tail[0]) >= self.half:
                    dropped = self.tail.popleft()
                    self.tail_size -= len(dropped)
                    self.dropped += len(dropped)

    def text(self) -> str:
        with self.lock:
            middle = f"\n[... {self.dropped} bytes of output dropped ...]\n" if self.dropped else ""
            raw = bytes(self.head) + middle.encode() + b"".join(self.tail)
        return plain_text(raw.decode("utf-8", "replace"), 10 * self.half)

    def tail_text(self, chars: int = 2000) -> str:
        return self.text()[-chars:]

    def close(self) -> None:
        with self.lock:
            if self.file.closed:
                return
            if self.dropped:
                self.file.write(f"\n[... {self.dropped} bytes of output dropped ...]\n".encode())
            self.file.write(b"".join(self.tail))
            self.file.close()


def _pump(stream, log: CappedLog) -> None:
    fd = stream.fileno()
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            log.feed(chunk)
    except OSError:
        pass
    finally:
        stream.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


class Worker:
    """One submission's worker process, started on first use (or by ``start()``), restarted after a
    timeout or crash. Not thread-safe: one request at a time."""

    def __init__(
        self,
        impl: str | os.PathLike,
        *,
        ops: str | os.PathLike | None = None,
        sandbox: bool | None = None,
        memory_mb: int = 0,
        max_procs: int = 64,
        tmp_mb: int = 256,
        guard: bool | None = None,
        protect=(),
        gpu: bool | None = None,
        start_timeout: float = 120.0,
        call_timeout: float = 60.0,
        workdir: str | os.PathLike | None = None,
        log_cap: int = 1 << 20,
        device=None,
        limits: wire.Limits | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_budget_s: float = DEFAULT_RESTART_BUDGET_S,
    ):
        self.impl, self.ops, self.sandbox = os.fspath(impl), ops, sandbox
        self.memory_mb, self.max_procs, self.tmp_mb = memory_mb, max_procs, tmp_mb
        self.guard, self.protect = guard, tuple(protect)
        self.gpu = os.path.exists("/dev/nvidiactl") if gpu is None else gpu
        self.start_timeout, self.call_timeout = start_timeout, call_timeout
        self.device, self.limits = device, limits or wire.DEFAULT_LIMITS
        self._own_workdir = workdir is None
        self.workdir = os.fspath(workdir) if workdir else tempfile.mkdtemp(prefix="spec-worker-")
        os.makedirs(self.workdir, exist_ok=True)
        self.log = CappedLog(os.path.join(self.workdir, "worker.log"), log_cap)
        self.log_path = self.log.path
        self.generation = 0
        self.epoch = 0
        self.restarts = 0
        self.max_restarts, self.restart_budget_s = max_restarts, restart_budget_s
        self.restart_import_s = 0.0  # the submission's imports in restarts so far (charged to the budget)
        self.harness_start_s = 0.0  # the last start's own part: bwrap, Python, torch, the harness
        self.import_s = 0.0  # the last start's import of the submission
        self.starting_s = 0.0  # every (re)start's time so far: a test's limit does not count it (RemoteSubject)
        self._gave_up: WorkerGaveUp | None = None
        self._cgroup: cgroup_mod.Group | None = None
        self._last_info: dict | None = None
        self.info: dict | None = None
        self.sandboxed: bool | None = None
        self.sandbox_reason = ""
        self.pid: int | None = None  # the worker's pid as the worker sees it (inside its namespace)
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._launch: sandbox_mod.Launch | None = None
        self._pump: threading.Thread | None = None
        self._finalizer = None
        self._next_id = 0
        self._closed = False
        self._import_error: RemoteImportError | None = None

    # ----------------------------------------------------------------------------------------
    # what the hello said

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _hello(self) -> dict:
        if self.info is None and self._gave_up is not None and self._last_info is not None:
            return self._last_info  # what it declared stays known after it is no longer started
        if self.info is None:
            self.start()
        return self.info

    @property
    def label(self) -> str:
        return self._hello()["label"]

    @property
    def names(self) -> frozenset:
        return self._hello()["names"]

    @property
    def attributes(self) -> dict:
        return self._hello()["attributes"]

    def provides(self, name: str) -> bool:
        return name in self.names

    # ----------------------------------------------------------------------------------------
    # starting and stopping

    def start(self) -> dict:
        """Start the worker if it is not running; returns its hello (``RemoteImportError`` when the
        implementation cannot be imported, ``WorkerGaveUp`` after ``max_restarts`` restarts or once
        the restarts' imports used up ``restart_budget_s``).

        A restart's import of the submission (from the worker's ``started`` message, sent before any
        submission code runs, to its hello) is charged to ``restart_budget_s``, and must finish
        within what is left of it."""
        if self._closed:
            raise WorkerError("this worker was closed")
        if self._import_error is not None:  # it will not import any better the next time
            raise self._import_error
        if self._gave_up is not None:
            raise self._gave_up
        if self.alive and self.info is not None:
            return self.info
        began = time.monotonic()
        try:
            return self._start()
        finally:
            self.starting_s += time.monotonic() - began

    def _start(self) -> dict:
        self._stop()
        if self.generation >= 1 and self.restarts >= self.max_restarts:
            self._give_up(
                f"was restarted {self.restarts} times after timeouts or crashes (the limit is {self.max_restarts})"
            )
        if self.generation >= 1 and self.restart_import_s >= self.restart_budget_s:
            self._give_up(
                f"spent {self.restart_import_s:.0f} s importing your code again in {self.restarts} restarts after "
                f"timeouts or crashes (the budget is {self.restart_budget_s:g} s)"
            )
        self.generation += 1
        self.epoch = 0
        if self.generation > 1:
            self.restarts += 1
            self.log.feed(f"\n--- worker generation {self.generation} ---\n".encode())
        parent, child = socket.socketpair()
        launch = None
        try:
            launch = sandbox_mod.worker_command(
                self.impl,
                fd=child.fileno(),
                ops=self.ops,
                memory_mb=self.memory_mb,
                max_procs=self.max_procs,
                tmp_mb=self.tmp_mb,
                guard=self.guard,
                protect=self.protect,
                sandbox=self.sandbox,
                gpu=self.gpu,
                workdir=self.workdir,
            )
            argv = launch.argv
            if self.memory_mb > 0:
                name = f"spec-worker-{os.getpid()}-{id(self) % 1000003}-{self.generation}"
                self._cgroup = cgroup_mod.create(name, self.memory_mb << 20)
                if self._cgroup is not None:
                    argv = self._cgroup.wrap(argv)
            self.proc = subprocess.Popen(
                argv,
                env=launch.env,
                cwd=launch.cwd,
                pass_fds=launch.pass_fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            parent.close()
            if launch is not None:
                launch.release()
            if self._cgroup is not None:
                self._cgroup.remove()
                self._cgroup = None
            raise
        finally:
            child.close()
            if launch is not None:
                launch.spawned()
        self._launch, self.sock = launch, parent
        self.sandboxed, self.sandbox_reason = launch.sandboxed, f"{launch.reason}; {self.memory_limit_text()}"
        self._finalizer = weakref.finalize(self, _finalize, self.proc, launch)
        self._pump = threading.Thread(target=_pump, args=(self.proc.stdout, self.log), daemon=True)
        self._pump.start()
        began = time.monotonic()
        header, blobs = self._wait(None, began + self.start_timeout, "starting (the harness and torch)")
        self.harness_start_s = time.monotonic() - began
        if header.get("type") == "started":
            if set(header) != {"type"} or blobs:
                self._protocol_error("a started message has no fields")
            imported = time.monotonic()
            limit = imported + self.start_timeout
            if self.generation > 1:  # a restart: within what is left of the budget
                limit = min(limit, imported + max(0.0, self.restart_budget_s - self.restart_import_s))
            try:
                header, blobs = self._wait(None, limit, "importing the implementation")
            finally:
                self.import_s = time.monotonic() - imported
                if self.generation > 1:
                    self.restart_import_s += self.import_s
        if header.get("type") != "hello":
            self._protocol_error(f"expected a hello, got {plain_text(str(header.get('type')), 40)!r}")
        if "error" in header:
            try:
                error = RemoteError.from_data(header["error"])
            except wire.WireError as exc:
                self._protocol_error(exc)
            self._stop()
            self._import_error = RemoteImportError(
                error.type, error.mro, error.message, error.where, error.not_implemented
            )
            raise self._import_error
        self.info = self._read_hello(header, blobs)
        self._last_info = self.info
        self.pid = self.info["pid"]
        return self.info

    def _read_hello(self, header: dict, blobs) -> dict:
        expected = {"type", "label", "names", "attributes", "pid"}
        if set(header) != expected:
            self._protocol_error(f"a hello needs exactly {sorted(expected)}")
        try:
            decoder = wire.Decoder(blobs, self._make_handle, limits=self.limits)
            attributes = decoder(header["attributes"])
            decoder.finish()
            names, label = header["names"], header["label"]
            if type(names) is not list or not all(type(n) is str for n in names) or type(label) is not str:
                raise wire.WireError("hello: names must be a list of strings, label a string")
            if type(attributes) is not dict or type(header["pid"]) is not int:
                raise wire.WireError("hello: malformed attributes or pid")
        except wire.WireError as exc:
            self._protocol_error(exc)
        return {
            "label": plain_text(label, 500),
            "names": frozenset(plain_text(n, 100) for n in names),
            "attributes": attributes,
            "pid": header["pid"],
        }

    def memory_limit_text(self) -> str:
        """How the worker's memory is limited (for the reports)."""
        if self.memory_mb <= 0:
            return "no memory limit"
        if self._cgroup is not None:
            return f"memory: {self.memory_mb} MiB for the whole worker (cgroup v2 memory.max, no swap)"
        why = cgroup_mod.available()[1]
        return (
            f"memory: {self.memory_mb} MiB of address space per process (RLIMIT_AS; no cgroup: {why}); "
            "pages written into a memfd with write() are not counted by RLIMIT_AS"
        )

    def _stop(self) -> int | None:
        """Kill the worker's whole tree (if any) and forget it; its exit status."""
        returncode = None
        if self.proc is not None:
            _kill_group(self.proc)
            returncode = self.proc.returncode
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        if self._launch is not None:
            self._launch.release()
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._pump is not None:
            self._pump.join(timeout=2.0)
        if self.sock is not None:
            self.sock.close()
        self.proc, self.sock, self._launch, self._pump, self._finalizer = None, None, None, None, None
        self.info = None
        return returncode

    def close(self) -> None:
        """Ask the worker to exit, then kill whatever is left of its tree."""
        if self._closed:
            return
        if self.alive and self.sock is not None:
            try:
                wire.send(self.sock, {"type": "exit", "id": self._new_id()}, timeout=1.0)
                self.proc.wait(timeout=1.0)
            except (OSError, wire.WireError, subprocess.TimeoutExpired):
                pass
        self._stop()
        self._closed = True
        self.log.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log_text(self) -> str:
        """What the worker printed (capped: head and tail)."""
        return self.log.text()

    # ----------------------------------------------------------------------------------------
    # requests

    def call(self, name: str, args=(), kwargs=None, *, deadline: float | None = None):
        """The implementation's ``name(*args, **kwargs)``. ``deadline`` is a ``time.monotonic()``
        value (default: now + ``call_timeout``)."""
        return self._run("call", name, args, kwargs, deadline)

    def op(self, name: str, args=(), kwargs=None, *, deadline: float | None = None):
        """The model operation ``OPS[name](implementation, *args, **kwargs)``."""
        return self._run("op", name, args, kwargs, deadline)

    def reset(self, *, deadline: float | None = None) -> None:
        """Drop every handle the worker holds (handles from before raise ``StaleHandleError``)."""
        self._simple("reset", {}, deadline=deadline)
        self.epoch += 1

    def ping(self, *, deadline: float | None = None) -> dict:
        return self._simple("ping", {}, deadline=deadline)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _deadline(self, deadline: float | None) -> float:
        return deadline if deadline is not None else time.monotonic() + self.call_timeout

    def _started(self, deadline: float) -> float:
        """Start the worker if needed; the deadline, moved on by the time (re)starting took. The first
        start is bounded by the grader's whole-run limit, a restart's import by ``restart_budget_s``."""
        if self.alive and self.info is not None:
            return deadline
        began = time.monotonic()
        self.start()
        return deadline + (time.monotonic() - began)

    def _give_up(self, why: str):
        self._gave_up = WorkerGaveUp(
            f"{why}, so it is not started again: this and every later test could not run",
            log_tail=self.log.tail_text(),
        )
        raise self._gave_up

    def _simple(self, kind: str, fields: dict, *, deadline: float | None):
        deadline = self._started(self._deadline(deadline))
        rid = self._new_id()
        return self._exchange(rid, {"type": kind, "id": rid, **fields}, wire.Encoder(), deadline)

    def _run(self, kind: str, name: str, args, kwargs, deadline):
        deadline = self._started(self._deadline(deadline))
        if type(args) not in (list, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
            raise TypeError("args must be a list or tuple and kwargs a dict")
        encoder = wire.Encoder(self._encode_object, limits=self.limits)
        rid = self._new_id()
        header = {
            "type": kind,
            "id": rid,
            "name": str(name),
            "args": encoder(tuple(args)),
            "kwargs": encoder(dict(kwargs or {})),
        }
        return self._exchange(rid, header, encoder, deadline, f"{kind} {name}")

    def _exchange(self, rid: int, header: dict, encoder: wire.Encoder, deadline: float, what: str = ""):
        left = max(0.05, deadline - time.monotonic())
        try:
            wire.send(self.sock, header, encoder.blobs, timeout=left, limits=self.limits)
        except wire.WireTimeout:
            self._timed_out(deadline, f"reading the request for {what or header['type']}")
        except (OSError, wire.WireError) as exc:
            if isinstance(exc, wire.WireError) and not isinstance(exc, wire.WireClosed):
                raise  # our own message is too large: nothing was sent
            self._crashed()
        answer, blobs = self._wait(rid, deadline, what or header["type"])
        return self._result(answer, blobs, encoder)

    def _result(self, answer: dict, blobs, encoder: wire.Encoder):
        fields = set(answer) - {"type", "id"}
        if fields not in ({"ok", "generators"}, {"error", "generators"}):
            self._protocol_error(f"a reply needs ok or error, and generators; got {sorted(fields)}")
        try:
            decoder = wire.Decoder(blobs, self._make_handle, device=self.device, limits=self.limits)
            states = answer["generators"]
            nothing_ran = "error" in answer and states == []  # the worker could not even decode the request
            if type(states) is not list or (len(states) != len(encoder.generators) and not nothing_ran):
                raise wire.WireError(f"the reply carries {len(states)} generator states for {len(encoder.generators)}")
            states = [decoder(s) for s in states]
            value = decoder(answer["ok"]) if "ok" in answer else None
            decoder.finish()
            error = RemoteError.from_data(answer["error"]) if "error" in answer else None
            for generator, state in zip(encoder.generators, states):
                _set_state(generator, state)
        except wire.WireError as exc:
            self._protocol_error(exc)
        if error is not None:
            raise error
        return value

    def _wait(self, rid, deadline: float, what: str):
        """The worker's answer to request ``rid`` (``None``: the hello); a timeout kills the worker,
        a dead worker is a ``WorkerCrashed``."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out(deadline, what)
            if not wire.readable(self.sock, min(left, 0.2)):
                if self.proc.poll() is not None and not wire.readable(self.sock, 0):
                    self._crashed()
                continue
            try:
                header, blobs = wire.recv(self.sock, timeout=max(left, 0.05), limits=self.limits)
            except wire.WireTimeout:
                self._timed_out(deadline, what)
            except wire.WireClosed:
                self._crashed()
            except wire.WireError as exc:
                self._protocol_error(exc)
            except OSError:
                self._crashed()
            kind = header.get("type")
            if (rid is None and kind in ("hello", "started")) or (kind == "reply" and header.get("id") == rid):
                return header, blobs
            self._protocol_error(f"unexpected message {plain_text(str(kind), 40)!r} while waiting for {what}")

    # ----------------------------------------------------------------------------------------
    # handles

    def _make_handle(self, handle_id: int, kind: str, type_name: str) -> RemoteHandle:
        return RemoteHandle(handle_id, kind, type_name, self.generation, self.epoch, id(self))

    def _encode_object(self, value) -> dict:
        if isinstance(value, RemoteHandle):
            if value.owner != id(self):
                raise StaleHandleError(f"{value!r} belongs to another worker")
            if value.generation != self.generation:
                raise StaleHandleError(
                    f"{value!r} was made by worker generation {value.generation}; the worker has since been "
                    f"restarted (now generation {self.generation}) and that object is gone"
                )
            if value.epoch != self.epoch:
                raise StaleHandleError(f"{value!r} was dropped by a reset() of the worker")
            return {"$handle": value.id, "kind": value.kind, "type": value.type}
        raise wire.WireError(f"a value of type {wire.qualname(type(value))} cannot be sent to the worker")

    # ----------------------------------------------------------------------------------------
    # failures

    def _timed_out(self, deadline: float, what: str = "the request"):
        self._stop()
        raise WorkerTimeout(f"timed out: the worker did not finish {what} before the deadline (it was stopped)")

    def _crashed(self):
        proc = self.proc
        returncode = None
        if proc is not None:
            try:
                returncode = proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                returncode = None
        sandboxed = bool(self.sandboxed)
        oom = self._cgroup is not None and self._cgroup.oom_kills() > 0
        self._stop()
        reason, signal_name, status = describe_exit(returncode, sandboxed)
        if oom:
            reason = f"was killed for using more than its memory limit ({self.memory_mb} MiB, cgroup v2 memory.max)"
        raise WorkerCrashed(reason, signal_name=signal_name, exit_status=status, log_tail=self.log.tail_text())

    def _protocol_error(self, problem):
        self._stop()
        raise WorkerProtocolError(f"broke the protocol: {plain_text(str(problem), 500)}", log_tail=self.log.tail_text())


def _set_state(generator, state) -> None:
    import torch

    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
        raise wire.WireError("a generator state must be a 1-D uint8 tensor")
    try:
        generator.set_state(state)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise wire.WireError(f"invalid generator state: {plain_text(str(exc), 200)}") from None


def _finalize(proc: subprocess.Popen, launch) -> None:
    if proc.poll() is None:
        _kill_group(proc)
    launch.release()
