"""Limits that hold against a hostile worker (issue 19, item 4): an oversized frame or a header the
judge cannot hold is the worker's protocol error; restarts are charged and capped; oracle calls take
protocol arguments only; the sandbox's seccomp filter; memory through a cgroup where one can be made.

Each toy submission is written here, one function per attack."""

from __future__ import annotations

import math
import struct
import time

import pytest
import torch
from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run

from spec_tests.harness.remote import cgroup, sandbox, seccomp, wire
from spec_tests.harness.remote.client import Worker, WorkerCrashed, WorkerGaveUp, WorkerProtocolError, WorkerTimeout

AVAILABLE, REASON = sandbox.sandbox_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox here: {REASON}")


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


HUGE_HEADER = '''
import gc, socket, struct, torch

def softmax(x, dim=-1):
    return torch.softmax(x, dim)

def silu(x):
    """Writes a frame declaring a 48 MiB header straight onto the protocol socket, then the header."""
    sock = next(o for o in gc.get_objects() if isinstance(o, socket.socket))
    size = 48 << 20
    sock.sendall(struct.pack("!4sII", b"TSW1", size, 0))
    chunk = b"[" * (1 << 20)
    for _ in range(48):
        sock.sendall(chunk)
    return x
'''


def test_a_48_mib_header_is_the_workers_protocol_error_and_the_next_call_works(tmp_path):
    impl = tmp_path / "huge_header.py"
    impl.write_text(HUGE_HEADER)
    with Worker(impl, memory_mb=3072) as w:
        started = time.monotonic()
        with pytest.raises(WorkerProtocolError, match="exceeds the cap"):
            w.call("silu", (torch.zeros(2),), deadline=soon())
        assert time.monotonic() - started < 10
        assert w.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]
        assert w.generation == 2


def test_frames_over_the_caps_are_refused_before_anything_is_read():
    left, right = __import__("socket").socketpair()
    try:
        left.sendall(struct.pack("!4sII", b"TSW1", 48 << 20, 0))
        with pytest.raises(wire.WireError, match=f"header of {48 << 20} bytes exceeds the cap of {8 << 20}"):
            wire.recv(right, timeout=5)
        left.sendall(struct.pack("!4sII", b"TSW1", 2, 1) + struct.pack("!Q", 3 << 30) + b"{}")
        with pytest.raises(wire.WireError, match="exceeds the cap of 1073741824"):
            wire.recv(right, timeout=5)
    finally:
        left.close()
        right.close()


def test_memory_errors_while_decoding_are_wire_errors(monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(wire.json, "loads", no_memory)
    with pytest.raises(wire.WireError, match="could not be parsed within the memory available"):
        wire.parse_header(b'{"type": "reply"}')
    monkeypatch.undo()
    decoder = wire.Decoder([])
    monkeypatch.setattr(decoder, "_decode", lambda obj, depth: no_memory())
    with pytest.raises(wire.WireError, match="within the memory available"):
        decoder([1, 2])


CRASHER = """
import os, time, torch
time.sleep(IMPORT_S)

def softmax(x, dim=-1):
    return torch.softmax(x, dim)

def repeat_kv(x, n_rep):
    os._exit(1)
"""


def test_restarts_are_capped_and_then_every_request_fails_at_once(tmp_path):
    impl = tmp_path / "crasher.py"
    impl.write_text(CRASHER.replace("IMPORT_S", "0"))
    with Worker(impl, max_restarts=2) as w:
        for _ in range(3):  # the first worker and two restarts
            with pytest.raises(WorkerCrashed) as info:
                w.call("repeat_kv", (torch.zeros(2), 1), deadline=soon())
            assert not isinstance(info.value, WorkerGaveUp)
        started = time.monotonic()
        with pytest.raises(WorkerGaveUp, match="restarted 2 times .*the limit is 2.*could not run"):
            w.call("softmax", (torch.zeros(2),), deadline=soon())
        with pytest.raises(WorkerGaveUp):
            w.call("softmax", (torch.zeros(2),), deadline=soon())
        assert time.monotonic() - started < 1.0 and w.restarts == 2
        assert "softmax" in w.names  # what it declared stays known


@run_ahead
def test_restarts_slow_imports_are_charged_to_a_budget_and_then_it_gives_up(tmp_path):
    """The restart budget charges each restart's import (the submission's own wall-clock time); once it is spent
    the worker gives up. The budget is set from this machine's first import (6 s of sleep plus whatever a loaded
    machine adds), so one restart's import fits it and a second does not however slow the machine is: the
    starts may differ from each other by up to 3 s."""
    impl = tmp_path / "slow_import.py"
    impl.write_text(CRASHER.replace("IMPORT_S", "6.0"))
    with Worker(impl, restart_budget_s=60.0) as w:
        w.start()  # the first start is the harness's time (the whole-run limit bounds it)
        # the client times the import from reading "started", which the worker sends just before it imports: a 6 s
        # sleep may read a few ms short
        assert w.import_s >= 5.95 and w.restart_import_s == 0, (w.import_s, w.restart_import_s)
        w.restart_budget_s = float(math.ceil(w.import_s + 3.0))  # a whole number: the message shows it so
        with pytest.raises(WorkerCrashed):
            w.call("repeat_kv", (torch.zeros(2), 1), deadline=soon())
        # a restart's import is not the test's time: the call still gets its own 2 s
        assert w.call("softmax", (torch.zeros(2),), deadline=time.monotonic() + 2.0).tolist() == [0.5, 0.5]
        assert 5.95 <= w.restart_import_s < w.restart_budget_s, (w.restart_import_s, w.restart_budget_s)
        with pytest.raises(WorkerCrashed):
            w.call("repeat_kv", (torch.zeros(2), 1), deadline=soon())
        left = w.restart_budget_s - w.restart_import_s  # under 6 s: the next import cannot finish in it
        started = time.monotonic()
        with pytest.raises(WorkerTimeout, match="importing the implementation"):
            w.call("softmax", (torch.zeros(2),), deadline=soon())
        elapsed = time.monotonic() - started
        assert elapsed < left + w.harness_start_s + 2.0, (elapsed, left, w.harness_start_s)
        budget = f"{w.restart_budget_s:g}"
        with pytest.raises(
            WorkerGaveUp, match=rf"importing your code again in 2 restarts .*budget is {budget} s.*could not run"
        ):
            w.call("softmax", (torch.zeros(2),), deadline=soon())


def test_the_seccomp_program_checks_the_arch_first_and_ends_in_allow():
    prog = seccomp.instructions("x86_64")
    assert prog[0] == (0x20, 0, 0, 4) and prog[1][3] == seccomp.AUDIT_ARCH["x86_64"]
    assert prog[-1] == (0x06, 0, 0, seccomp.RET_ALLOW)
    assert len(seccomp.program("x86_64")) == 8 * len(prog)
    assert seccomp.instructions("aarch64")[1][3] == seccomp.AUDIT_ARCH["aarch64"]
    assert seccomp.instructions("sparc") is None
    for arch in seccomp.SYSCALLS:
        assert set(seccomp.REFUSED) | {"clone", "clone3"} == set(seccomp.SYSCALLS[arch]), arch


NAMESPACES = """
import ctypes, errno, os, subprocess, time, torch

def softmax(x, dim=-1):
    return torch.softmax(x, dim)

def _probe_syscalls():
    libc = ctypes.CDLL(None, use_errno=True)

    def call(fn, *args):
        result = fn(*args)
        return "ok" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")

    out = {}
    out["unshare_user"] = call(libc.unshare, 0x10000000)
    out["unshare_mount"] = call(libc.unshare, 0x00020000)
    out["unshare_net"] = call(libc.unshare, 0x40000000)
    done = subprocess.run(["unshare", "-U", "true"], capture_output=True)
    out["unshare_command"] = done.returncode
    out["clone_newuser"] = call(libc.syscall, 56, 0x10000000 | 17, 0, 0, 0, 0)
    out["mount"] = call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None)
    child = os.fork()
    if child == 0:
        time.sleep(10)
        os._exit(0)
    out["ptrace_attach"] = call(libc.ptrace, 16, child, None, None)
    os.kill(child, 9)
    os.waitpid(child, 0)
    out["keyctl"] = call(libc.syscall, 250, 0, 0, 0, 0, 0)  # KEYCTL_GET_KEYRING_ID
    out["subprocess"] = subprocess.run(["true"]).returncode
    out["torch"] = float(torch.ones(3).sum())
    return out
"""

PROBE_OPS = """
def private(impl, name, *args):
    return getattr(impl, f"_probe_{name}")(*args)

OPS = {"private": private}
"""


@needs_sandbox
@pytest.mark.skipif(not seccomp.supported(), reason=f"no seccomp table for {seccomp.machine()}")
def test_namespaces_mounts_ptrace_and_keyrings_are_refused_inside_the_sandbox(tmp_path):
    impl, ops = tmp_path / "namespaces.py", tmp_path / "ops.py"
    impl.write_text(NAMESPACES)
    ops.write_text(PROBE_OPS)
    with Worker(impl, ops=ops, sandbox=True, memory_mb=3072) as w:
        w.start()
        assert "seccomp filter" in w.sandbox_reason, w.sandbox_reason
        out = w.op("private", ("syscalls",), deadline=soon(60))
    assert out.pop("unshare_command") != 0
    assert out.pop("subprocess") == 0 and out.pop("torch") == 3.0  # processes, threads and torch still work
    assert out == dict.fromkeys(out, "EPERM") and len(out) == 7, out


MEMFD_BOMB = '''
import os, torch

def softmax(x, dim=-1):
    return torch.softmax(x, dim)

def silu(x):
    """3 GiB written into a memfd with write(): not counted by RLIMIT_AS."""
    fd = os.memfd_create("bomb")
    chunk = b"x" * (64 << 20)
    for _ in range(48):
        os.write(fd, chunk)
    return x
'''


@pytest.mark.skipif(not cgroup.available()[0], reason=f"no cgroup v2 memory group here: {cgroup.available()[1]}")
def test_a_memfd_bomb_is_stopped_by_the_cgroup(tmp_path):
    impl = tmp_path / "memfd_bomb.py"
    impl.write_text(MEMFD_BOMB)
    with Worker(impl, memory_mb=1024) as w:
        w.start()
        assert "cgroup v2 memory.max" in w.sandbox_reason
        with pytest.raises(WorkerCrashed, match="more than its memory limit"):
            w.call("silu", (torch.zeros(2),), deadline=soon(60))
        assert w.call("softmax", (torch.zeros(2),), deadline=soon()).tolist() == [0.5, 0.5]


def test_without_a_cgroup_the_reason_names_the_memfd_gap(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "_STATE", (None, "cgroup v1 only (for the test)"))
    impl = tmp_path / "plain.py"
    impl.write_text("import torch\n\ndef softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n")
    with Worker(impl, memory_mb=2048) as w:
        w.start()
        assert "RLIMIT_AS" in w.sandbox_reason and "memfd" in w.sandbox_reason
        assert "cgroup v1 only (for the test)" in w.sandbox_reason


def test_groups_are_made_beside_this_process_and_the_wrapper_moves_the_process_in(tmp_path, monkeypatch):
    """cgroup.py on a fake cgroup2 tree (this machine may have none): the nearest folder above this
    process's group that has the memory controller for its children holds the new group; the
    wrapped command writes its own pid into the group before it execs."""
    import subprocess

    mount = tmp_path / "cgroup"
    own = mount / "system.slice" / "grader.scope"
    own.mkdir(parents=True)
    (mount / "cgroup.controllers").write_text("cpu memory pids\n")
    (mount / "cgroup.subtree_control").write_text("memory\n")
    (mount / "system.slice" / "cgroup.subtree_control").write_text("cpu memory\n")
    (own / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(cgroup, "_cgroup2_mounts", lambda: [mount])
    monkeypatch.setattr(cgroup, "_own_path", lambda: "/system.slice/grader.scope")
    monkeypatch.setattr(cgroup, "_STATE", None)
    # the process's own group cannot hand the memory controller to children (cgroup v2 refuses it
    # for a group holding processes; here the write of "+memory" does not enable it either)
    assert cgroup.available() == (True, f"cgroup v2 memory.max under {mount / 'system.slice'}")
    group = cgroup.create("spec-worker-test", 1 << 30)
    assert group is not None and group.path == mount / "system.slice" / "spec-worker-test"
    assert (group.path / "memory.max").read_text() == str(1 << 30)
    done = subprocess.run(group.wrap(["sh", "-c", "echo $$"]), capture_output=True, text=True, check=True)
    assert group.procs.read_text().split() == [done.stdout.strip()]  # moved itself in, then exec'd
    monkeypatch.setattr(cgroup, "_STATE", (None, "none here"))
    assert cgroup.create("another", 1 << 30) is None
