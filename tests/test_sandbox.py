"""spec_tests/harness/remote/sandbox.py: what submission code in a sandboxed worker cannot do, and the
fallback when the sandbox is forced off. The probes are the toy submission's own ``_probe_*``
functions (tests/remote_toy_impl.py), reached through the ``private`` operation."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from spec_tests.harness.remote import sandbox
from spec_tests.harness.remote.client import RemoteError, Worker, WorkerCrashed

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TOY = HERE / "remote_toy_impl.py"
OPS = HERE / "remote_ops_fixture.py"

AVAILABLE, REASON = sandbox.sandbox_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox here: {REASON}")


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def probe(worker: Worker, name: str, *args):
    return worker.op("private", (name, *args), deadline=soon())


@pytest.fixture(scope="module")
def sandboxed():
    if not AVAILABLE:
        pytest.skip(f"no sandbox here: {REASON}")
    w = Worker(TOY, ops=OPS, sandbox=True, memory_mb=3072, max_procs=32)
    w.start()
    assert w.sandboxed
    yield w
    w.close()


@needs_sandbox
def test_runs_unprivileged_in_its_own_pid_namespace(sandboxed):
    ids = probe(sandboxed, "ids")
    assert ids["uid"] != 0 and ids["euid"] != 0 and ids["gid"] != 0 and ids["groups"] == []
    assert set(ids["caps"].values()) == {"0000000000000000"}  # no capabilities, not even in the bounding set
    inner = sandboxed.op("worker_pid", (), deadline=soon())
    assert inner == sandboxed.pid and inner < 10  # pids of its own namespace
    processes = [p for p in probe(sandboxed, "listdir", "/proc") if p.isdigit()]
    assert len(processes) <= 4 and str(sandboxed.pid) in processes  # bwrap's init, the worker


@needs_sandbox
def test_cannot_read_the_reference_the_grader_or_recordings(sandboxed, tmp_path):
    recording = tmp_path / "expected-interleaved.pt"
    recording.write_bytes(b"recorded expected values")
    for path in (
        ROOT / "reference" / "__init__.py",
        ROOT / "spec_grading" / "judge.py",
        ROOT / "spec_tests" / "bugs" / "__init__.py",
        recording,
        Path.home() / ".bash_history",
        "/harness/spec_tests/bugs/__init__.py",
    ):
        assert probe(sandboxed, "read", str(path)) in ("FileNotFoundError", "PermissionError"), path
    assert probe(sandboxed, "listdir", "/harness/spec_tests/bugs") == []
    assert probe(sandboxed, "read", "/harness/spec_tests/protocol/names.py").startswith("read ")  # the harness is there
    assert probe(sandboxed, "import", "reference") == "ModuleNotFoundError"
    assert probe(sandboxed, "import", "spec_tests.bugs.bug") == "ModuleNotFoundError"
    assert probe(sandboxed, "import", "spec_grading") == "ModuleNotFoundError"
    visible = probe(sandboxed, "listdir", str(ROOT))
    assert visible == "FileNotFoundError" or set(visible) <= {".venv", "venv"}, visible
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "sys", "proc", "dev", "tmp"}
    allowed |= {"harness", "harness-ops", "submission"} | {Path(p).parts[1] for p in (sys.prefix, sys.base_prefix)}
    assert set(probe(sandboxed, "listdir", "/")) <= allowed


@needs_sandbox
def test_cannot_write_outside_tmp(sandboxed):
    for path in ("/harness/spec_tests/x.py", "/submission/x.py", "/usr/x", f"{sys.prefix}/x", "/x", "/etc/x"):
        assert probe(sandboxed, "write", path) in ("OSError", "PermissionError", "FileNotFoundError"), path
    assert probe(sandboxed, "write", "/tmp/allowed.txt") == "ok"


@needs_sandbox
def test_tmp_is_private(sandboxed):
    marker = Path("/tmp") / f"host-marker-{uuid.uuid4().hex}"
    marker.write_text("host")
    try:
        assert probe(sandboxed, "exists", str(marker)) is False
    finally:
        marker.unlink()
    name = f"/tmp/worker-marker-{uuid.uuid4().hex}"
    assert probe(sandboxed, "write", name) == "ok" and probe(sandboxed, "exists", name) is True
    assert not os.path.exists(name)


@needs_sandbox
def test_no_network(sandboxed):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        port = server.getsockname()[1]
        assert probe(sandboxed, "connect", "127.0.0.1", port) in ("ConnectionRefusedError", "OSError")
        assert probe(sandboxed, "connect", "1.1.1.1", 53) in ("OSError", "TimeoutError")
    finally:
        server.close()


@needs_sandbox
def test_cannot_signal_the_judge_or_the_host(sandboxed):
    host_sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert probe(sandboxed, "kill", os.getpid(), 0) in ("ProcessLookupError", "PermissionError")
        assert probe(sandboxed, "kill", host_sleeper.pid, 0) in ("ProcessLookupError", "PermissionError")
        assert probe(sandboxed, "kill", 1, signal.SIGKILL) in ("PermissionError", "ok")  # bwrap's init, not ours
        ids = probe(sandboxed, "ids")
        if ids["uid"] != 0 and sandboxed.pid < 10:  # only ever inside the sandbox: kill(-1) = everything it may
            probe(sandboxed, "kill", -1, signal.SIGKILL)
        time.sleep(0.2)
        assert host_sleeper.poll() is None
        assert sandboxed.ping(deadline=soon())["pid"] == sandboxed.pid
    finally:
        host_sleeper.kill()
        host_sleeper.wait()


@needs_sandbox
def test_a_fork_bomb_meets_the_process_limit_and_dies_with_the_worker():
    with Worker(TOY, ops=OPS, sandbox=True, memory_mb=3072, max_procs=24) as w:
        w.start()
        uid = w._launch.uid
        result = probe(w, "fork_bomb", 1.5)
        assert result["refused"] > 0 and result["forked"] < 24, result
        if os.geteuid() == 0:
            assert 0 < len(sandbox.processes_of(uid)) <= 24
        assert subprocess.run(["true"]).returncode == 0  # the host can still start processes
        assert w.ping(deadline=soon())["pid"] == w.pid
    if os.geteuid() == 0:
        assert sandbox.processes_of(uid) == []


@needs_sandbox
def test_a_double_forked_grandchild_in_a_new_session_dies_with_close():
    w = Worker(TOY, ops=OPS, sandbox=True, memory_mb=3072)
    w.start()
    uid = w._launch.uid
    inner_pid = probe(w, "double_fork")
    assert inner_pid > w.pid
    if os.geteuid() == 0:
        assert len(sandbox.processes_of(uid)) >= 2  # the worker and the detached grandchild
    w.close()
    if os.geteuid() == 0:
        assert sandbox.processes_of(uid) == []


@needs_sandbox
def test_a_submission_with_private_file_modes_still_loads(tmp_path):
    staged = tmp_path / "submission.py"
    staged.write_text("def softmax(x, dim=-1):\n    import torch\n    return torch.softmax(x, dim)\n")
    staged.chmod(0o600)
    with Worker(staged, sandbox=True, workdir=tmp_path / "work") as w:
        assert w.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]


def test_the_fallback_when_the_sandbox_is_forced_off(monkeypatch, tmp_path):
    monkeypatch.setenv(sandbox.ENV_SWITCH, "off")
    available, reason = sandbox.sandbox_available()
    assert not available
    assert "SPEC_SANDBOX=off" in reason and "does not stop" in reason and "network" in reason
    recording = tmp_path / "expected-half.pt"
    recording.write_bytes(b"recorded")
    with Worker(TOY, ops=OPS, memory_mb=3072, protect=[tmp_path]) as w:
        w.start()
        assert w.sandboxed is False and "does not stop" in w.sandbox_reason
        assert w.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]
        # the in-process guard
        assert probe(w, "import", "reference") == "BlockedImport"
        assert probe(w, "read", str(recording)) == "BlockedAccess"
        assert probe(w, "read", str(ROOT / "reference" / "model.py")) == "BlockedAccess"
        for path in sandbox.protected_paths():  # wherever the reference is installed from, too
            if path.endswith("/reference"):
                assert probe(w, "read", f"{path}/model.py") == "BlockedAccess", path
        assert probe(w, "subprocess") == "BlockedAccess"
        assert probe(w, "fork_bomb", 0.1)["forked"] == 0
        # and the same failure handling
        with pytest.raises(WorkerCrashed, match="SIGSEGV"):
            w.call("rmsnorm", (1, 2), deadline=soon())
        with pytest.raises(RemoteError) as info:
            w.call("layernorm", (1, 2, 3), deadline=soon())
        assert info.value.not_implemented and w.generation == 2


def test_requiring_the_sandbox_where_there_is_none_is_an_error(monkeypatch):
    monkeypatch.setenv(sandbox.ENV_SWITCH, "off")
    with pytest.raises(sandbox.SandboxError, match="required but not available"):
        sandbox.worker_command(TOY, fd=0, sandbox=True)


def test_a_virtual_environment_under_tmp_stays_reachable():
    """A checkout (and its .venv) under /tmp is bound over the private /tmp: the folders above it are
    made there with mode 0755, or the unprivileged worker could not reach its own interpreter."""
    from spec_tests.harness.remote.sandbox import _with_parents

    args = _with_parents(["--perms", "1777", "--tmpfs", "/tmp", "--ro-bind", "/src/.venv", "/tmp/ci/.venv"])
    for folder in ("/tmp/ci",):
        i = args.index(folder)
        assert args[i - 3 : i] == ["--perms", "0755", "--dir"], args
    assert args.index("/tmp/ci") < args.index("/tmp/ci/.venv")
    # inside a read-only bind nothing can be made: no --dir there
    args = _with_parents(["--ro-bind", "/usr", "/usr", "--ro-bind", "/x", "/usr/lib/extra/x"])
    assert "--dir" not in args
