"""Judges forked from a process that has already imported their libraries (a fork server).

A judge is ``python -m pytest <suite> ...`` (``judge.py``). Before it judges anything it spends about
2.5 s of CPU importing torch, numpy, hypothesis and pytest, and most gradings of a small rubric judge a
few concepts, so start-up is most of a judge's work. A grader that starts judges starts one server per
process (a trusted child in the judges' environment) that imports those libraries once, then forks a
judge per request. The suite, the reference and the grader's own modules are *not* imported by the
server: each judge imports them after the fork, as a fresh ``python -m pytest`` would, so it runs the
code on disk when it starts (the grader's check that its code did not change holds as before) and
pytest rewrites what it would rewrite.

A forked judge is what ``subprocess.Popen`` gave (``JudgeRun.start``):

- a new session, so the grader kills its whole process group;
- the judge's environment, working folder, log (stdout and stderr) and stdin from ``/dev/null``;
- in the judge's memory cgroup before it runs anything (it writes its own pid to ``cgroup.procs`` once
  its log is open), or under the ``rlimit`` the grader asks for, set by the child
  itself before it runs anything (``Popen`` left a moment before ``prlimit``);
- dying with its parent, the server (``PR_SET_PDEATHSIG``, set in the child before anything runs and
  again by the judge's collector), and the server dies with the grader (the same, and it ends when the
  grader's end of its pipe closes, killing the judges it still has);
- fresh random state: Python's and numpy's global generators are reseeded from the OS after the fork, as
  a new interpreter's are; torch's default generator is untouched in the server (no torch operation
  runs there), so it holds torch's start-up seed as in a new interpreter.

Nothing runs in the server but imports and the request loop: no torch operation and no thread of its
own, so a fork copies no lock another thread holds. Requests and replies are JSON lines on the
server's stdin and stdout: ``{"argv", "cwd", "env", "log", "cgroup_procs", "rlimit"}`` gets
``{"spawned": pid}`` (or ``{"error": text}``), and every judge that ends is reported as
``{"exited": pid, "status": returncode}`` (negative: the signal, as ``Popen.returncode``).

``SPEC_JUDGE_FORKSERVER=0`` in the grader's environment starts every judge with ``Popen`` instead.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

ENV_SWITCH = "SPEC_JUDGE_FORKSERVER"
PRELOAD = ("torch", "numpy", "einops", "hypothesis", "hypothesis.strategies", "pytest", "_pytest.python")
# The server imports hypothesis before pytest marks it for assertion rewriting (hypothesis is a pytest plugin):
# its own asserts are its internal checks, not the judge's, and each judge would warn that it cannot rewrite them.
QUIET = ("-W", "ignore::pytest.PytestAssertRewriteWarning")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def _die_with_parent(expected_parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != expected_parent:  # the parent died before the call
        os._exit(5)


class ForkedJudge:
    """The part of ``subprocess.Popen`` a ``JudgeRun`` uses, for a judge the server forked."""

    def __init__(self, server: Server, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"judge {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:  # not reaped: the pid is still this judge's
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Server:
    """One fork server, started with ``env`` (the judges' environment but for per-judge settings)."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self._buffer = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spec_grading.forkserver", str(os.getpid())],
            cwd="/",
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the grader's terminal signals reach the grader, which stops its judges
        )
        os.set_blocking(self.proc.stdout.fileno(), False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, request: dict, timeout_s: float = 120.0) -> ForkedJudge:
        with self.lock:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout_s
            while True:
                for reply in self._read():
                    if "spawned" in reply:
                        return ForkedJudge(self, int(reply["spawned"]))
                    if "error" in reply:
                        raise OSError(f"the judge fork server could not start a judge: {reply['error']}")
                if self.proc.poll() is not None:
                    raise OSError(f"the judge fork server ended (exit status {self.proc.returncode})")
                if time.monotonic() > deadline:
                    raise OSError(f"the judge fork server did not answer within {timeout_s:g} s")
                select.select([self.proc.stdout], [], [], 0.1)

    def exit_status(self, pid: int) -> int | None:
        with self.lock:
            for _ in self._read():
                pass
            if pid in self.exits:
                return self.exits.pop(pid)
            if self.proc.poll() is not None:  # the server is gone: its judges died with it
                return -signal.SIGKILL
            return None

    def _read(self) -> list[dict]:
        """Replies read so far (exits are kept in ``exits``); the caller holds the lock."""
        try:
            chunk = self.proc.stdout.read() or b""
        except BlockingIOError:
            chunk = b""
        lines = (self._buffer + chunk).split(b"\n")
        self._buffer = lines.pop()
        replies = []
        for line in lines:
            reply = json.loads(line)
            if "exited" in reply:
                self.exits[int(reply["exited"])] = int(reply["status"])
            else:
                replies.append(reply)
        return replies

    def stop(self) -> None:
        try:
            self.proc.stdin.close()  # the server kills the judges it still has, then exits
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_SERVER: Server | None = None
_SERVER_LOCK = threading.Lock()


def server_for(env: dict[str, str]) -> Server:
    """This process's server for judges of ``env`` (a new one when the environment changed)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is not None and (_SERVER.env != env or not _SERVER.alive()):
            _SERVER.stop()
            _SERVER = None
        if _SERVER is None:
            _SERVER = Server(env)
            atexit.register(shutdown)
        return _SERVER


def shutdown() -> None:
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is not None:
            _SERVER.stop()
            _SERVER = None


# the server's side


def _reply(message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(1, data) :]


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def _child(request: dict, server_pid: int, wakeup: tuple[int, int]) -> None:
    """In the forked child: become the judge ``request`` describes, run it, exit. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for fd in wakeup:
            os.close(fd)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)  # from here on, what goes wrong is in the judge's log
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        if request.get("cgroup_procs"):
            with open(request["cgroup_procs"], "w") as procs:
                procs.write(str(os.getpid()))
        os.setsid()
        _die_with_parent(server_pid)
        if request.get("rlimit"):
            import resource

            which, limit = request["rlimit"]
            resource.setrlimit(which, (limit, limit))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()  # as ``python -m`` puts the working folder first
        import random

        import numpy

        random.seed()
        numpy.random.seed()
        import pytest

        sys.argv = [sys.executable, *request["argv"]]
        code = pytest.main([*QUIET, *request["argv"]])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the judge's log says what went wrong; the exit status that it did
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what a normal interpreter exit runs (the worker client's finalizer)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(int(code) if isinstance(code, int) else 1)


def serve(grader_pid: int) -> None:
    _die_with_parent(grader_pid)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # the grader decides when its judges stop
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    buffer = b""
    server_pid = os.getpid()
    try:
        while True:
            ready, _, _ = select.select([0, wake_r], [], [], 1.0)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children.discard(pid)
                    _reply({"exited": pid, "status": _status(status)})
            if 0 not in ready:
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break  # the grader closed its end, or died
            lines = (buffer + chunk).split(b"\n")
            buffer = lines.pop()
            for line in lines:
                try:
                    request = json.loads(line)
                    pid = os.fork()
                except Exception as exc:  # noqa: BLE001 - the grader falls back to starting the judge itself
                    _reply({"error": f"{type(exc).__name__}: {exc}"})
                    continue
                if pid == 0:
                    _child(request, server_pid, (wake_r, wake_w))
                children.add(pid)
                _reply({"spawned": pid})
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


if __name__ == "__main__":
    serve(int(sys.argv[1]))
