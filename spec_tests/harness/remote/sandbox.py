"""Where the worker runs: a bubblewrap sandbox, or a plain process when none is possible.

With bubblewrap (``bwrap``) the worker runs

(a) as an unprivileged user: when the judge is root, bwrap keeps only ``CAP_SETUID``/``CAP_SETGID``
    and ``setpriv`` drops to a uid/gid of its own slot (``SPEC_SANDBOX_UID_BASE`` + slot, default
    1900000000 + 0..63; a lock file per slot, so concurrent judges use different uids) with no
    supplementary groups, no capabilities (bounding and inheritable sets cleared) and
    ``no_new_privs``; ``RLIMIT_NPROC`` then counts only this worker's processes and threads (root
    would ignore it). A judge that is not root gets a user namespace instead (``--unshare-user``,
    ``--disable-userns``), in which ``RLIMIT_NPROC`` counts only the sandbox's processes;
(b) with a read-only view of only what it needs: ``/usr`` and the merged-usr links (system
    libraries), ``/etc/ld.so.*``, the Python prefix and the virtual environment (bound at their own
    paths, which works even where the prefix lies under a mode-700 ``/root``: bwrap binds as root,
    the new root's parent folders are bwrap's own), the harness code (the ``spec_tests`` folder at
    ``/harness/spec_tests`` with ``bugs/`` and ``recorded/`` hidden under empty tmpfs and any
    ``expected-*.pt`` replaced by ``/dev/null``; copies of the project's packages in site-packages
    hidden likewise) and the staged submission at ``/submission/<name>``. Nothing else: not the
    repository (``reference/``, ``tools/``), recordings, caches, the judge's work folder, other
    submissions, or ``$HOME``;
(c) with a private, size-capped ``/tmp`` (tmpfs; also the worker's cwd and ``$HOME``);
(d) without network (``--unshare-net``: only a down loopback);
(e) in its own PID namespace (``--unshare-pid``; also IPC, UTS, cgroup namespaces): it sees and can
    signal only its own processes, and a different uid besides;
(f) under a process-count limit (``RLIMIT_NPROC``, set by the worker before any submission code);
(g) killed as a tree: ``--die-with-parent`` (bwrap's children get SIGKILL when it dies), the judge
    kills bwrap's process group, the PID namespace ends when its first process does (the kernel
    kills every process left in it, also a grandchild that double-forked into a new session), and
    as root the judge finally kills anything still running under the slot's uid.

``sandbox_available()`` finds out by trying (bwrap installed, namespaces allowed, the Python
prefix reachable), once per process. Without a sandbox (or with ``SPEC_SANDBOX=off``) the worker is
a plain subprocess in a new session, with the resource limits and the in-process guard
(``guard.py``); the reason string says what that does not stop.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pwd
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import spec_tests
from spec_tests.harness.remote import seccomp

from .upload_copy import UploadLimits, copy_upload

ENV_SWITCH = "SPEC_SANDBOX"  # off | auto (default) | require
ENV_UID_BASE = "SPEC_SANDBOX_UID_BASE"
DEFAULT_UID_BASE = 1_900_000_000
SLOTS = 64
HARNESS_PACKAGE = Path(spec_tests.__file__).resolve().parent
HARNESS_ROOT = HARNESS_PACKAGE.parent
HARNESS_MOUNT = "/harness"
SUBMISSION_MOUNT = "/submission"
OPS_MOUNT = "/harness-ops"
HIDDEN_HARNESS_PARTS = ("bugs", "recorded")
PROJECT_PACKAGES = ("reference", "spec_tests", "student", "tools", "benchmarks", "spec_grading", "spec_adapters")
WORKER_MODULE = "spec_tests.harness.remote.server"

FALLBACK_LIMITS = (
    "the worker runs as a plain process of the grader's user in its own session, with resource limits "
    "(memory, no core dumps) and the in-process guard (no importing the reference, no opening it or "
    "expected-*.pt recordings, no starting processes); this does not stop graded code from reading other "
    "files the grader can read, using the network, signalling the grader's processes, working around the "
    "guard from inside the interpreter (ctypes), or leaving behind a process that double-forks out of "
    "the session"
)


class SandboxError(RuntimeError):
    """The sandbox was required but is not available, or could not be set up."""


def _mode() -> str:
    value = os.environ.get(ENV_SWITCH, "auto").strip().lower()
    if value in ("0", "off", "no", "false", "fallback"):
        return "off"
    if value in ("1", "on", "yes", "true", "require", "required"):
        return "require"
    return "auto"


# ---------------------------------------------------------------------------------------------
# slots: one unprivileged uid per concurrent worker (judge running as root)


@dataclass
class Slot:
    index: int
    uid: int
    gid: int
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1


def _uid_base() -> int:
    try:
        return int(os.environ.get(ENV_UID_BASE, DEFAULT_UID_BASE))
    except ValueError:
        return DEFAULT_UID_BASE


def acquire_slot() -> Slot:
    folder = Path(tempfile.gettempdir()) / f"transformer-spec-sandbox-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxError(f"{folder} is not a private folder of this user; remove it")
    base = _uid_base()
    for index in range(SLOTS):
        uid = base + index
        try:
            pwd.getpwuid(uid)
            continue  # a real account: not ours to use
        except KeyError:
            pass
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(folder / f"slot-{index}.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        slot = Slot(index, uid, uid, fd)
        kill_uid(uid)  # leftovers of a judge that died without cleaning up
        return slot
    raise SandboxError(f"all {SLOTS} sandbox slots are in use")


def processes_of(uid: int) -> list[int]:
    """Host pids whose real or effective uid is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        ids = line.split()[1:3]
                        if str(uid) in ids:
                            found.append(int(entry))
                        break
        except OSError:
            continue
    return found


def kill_uid(uid: int, wait_s: float = 2.0) -> list[int]:
    """SIGKILL every process of ``uid`` (a slot's own uid: root only) and wait until none is left."""
    if os.geteuid() != 0:
        return []
    killed: list[int] = []
    stop = time.monotonic() + wait_s
    while True:
        pids = processes_of(uid)
        if not pids or time.monotonic() > stop:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------
# the bwrap command


def _system_mounts() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        args += ["--ro-bind-try", path, path]
    args += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]  # CPU topology for torch
    return args


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _python_mounts() -> list[str]:
    """The interpreter's prefix and the virtual environment, at the paths the interpreter uses."""
    wanted: list[str] = []
    for path in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable)):
        wanted.append(os.path.abspath(path))
    real_exe = os.path.realpath(sys.executable)
    wanted.append(os.path.dirname(os.path.dirname(real_exe)))
    args: list[str] = []
    bound: list[str] = ["/usr"]
    for path in sorted(set(wanted), key=len):
        if _under(path, bound):
            continue
        args += ["--ro-bind", os.path.realpath(path), path]
        bound.append(path)
    for folder in site.getsitepackages():
        if not _under(os.path.abspath(folder), bound):
            continue
        for package in PROJECT_PACKAGES:
            candidate = os.path.join(folder, package)
            if os.path.isdir(candidate) and not os.path.islink(candidate):
                args += ["--tmpfs", candidate]  # an installed (non-editable) copy of the project
    return args


def _harness_mounts() -> list[str]:
    dest = f"{HARNESS_MOUNT}/spec_tests"
    args = ["--ro-bind", str(HARNESS_PACKAGE), dest]
    for part in HIDDEN_HARNESS_PARTS:
        if (HARNESS_PACKAGE / part).is_dir():
            args += ["--tmpfs", f"{dest}/{part}"]
    for recording in sorted(HARNESS_PACKAGE.rglob("expected-*.pt")):
        rel = recording.relative_to(HARNESS_PACKAGE)
        if rel.parts[0] not in HIDDEN_HARNESS_PARTS:
            args += ["--ro-bind", "/dev/null", f"{dest}/{rel.as_posix()}"]
    return args


_ARITY = {"--ro-bind": 2, "--ro-bind-try": 2, "--dev-bind": 2, "--symlink": 2, "--tmpfs": 1, "--proc": 1, "--dev": 1}


def _with_parents(mounts: list[str]) -> list[str]:
    """``mounts`` with a ``--perms 0755 --dir`` for each folder above a mount point that bwrap would
    otherwise create itself, mode 0700 (which the unprivileged worker could not enter)."""
    out: list[str] = []
    made = {"/"}
    i = 0
    while i < len(mounts):
        flag = mounts[i]
        if flag == "--perms" or flag == "--size":
            out += mounts[i : i + 2]
            i += 2
            continue
        arity = _ARITY[flag]
        dest = mounts[i + arity]
        for parent in reversed(Path(dest).parents):
            text = str(parent)
            if text not in made:
                made.add(text)
                if not _is_mounted_under(text, out):
                    out += ["--perms", "0755", "--dir", text]
        made.add(dest)
        out += mounts[i : i + arity + 1]
        i += arity + 1
    return out


def _is_mounted_under(path: str, args: list[str]) -> bool:
    """Whether ``path`` lies inside something already bound (then it exists or cannot be made).
    Inside a tmpfs a folder can be made, and must be: a virtual environment under ``/tmp`` is bound
    over the private ``/tmp``, and its parents there would otherwise be made mode 0700."""
    for i, flag in enumerate(args):
        if flag in _ARITY and flag not in ("--perms", "--size", "--tmpfs"):
            dest = args[i + _ARITY[flag]]
            if dest != "/" and (path == dest or path.startswith(dest.rstrip("/") + "/")):
                return True
    return False


def _gpu_mounts() -> list[str]:
    args = ["--ro-bind", "/sys", "/sys"]
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia"):
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    return args


def sandbox_env() -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "PYTHONPATH": HARNESS_MOUNT,
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def bwrap_prefix(
    slot: Slot | None, *, tmp_mb: int = 256, gpu: bool = False, binds=(), seccomp_fd: int | None = None
) -> list[str]:
    """``bwrap ... --`` (and ``setpriv ... --`` as root): everything before the worker's own argv.
    ``seccomp_fd``: a file descriptor holding ``seccomp.program()``, loaded by bwrap (``--seccomp``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap (bwrap) is not installed")
    args = [bwrap, "--die-with-parent", "--new-session"]
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--hostname", "sandbox"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if slot is None:
        args += ["--unshare-user"]
        if _bwrap_supports("--disable-userns"):  # bubblewrap >= 0.8; needs --unshare-user
            args += ["--disable-userns"]
    else:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    mounts = _system_mounts()
    mounts += ["--proc", "/proc", "--dev", "/dev"]
    if _bwrap_supports("--size"):  # bubblewrap >= 0.7
        mounts += ["--size", str(max(1, tmp_mb) << 20)]
    mounts += ["--perms", "1777", "--tmpfs", "/tmp"]
    mounts += _python_mounts()
    mounts += _harness_mounts()
    if gpu:
        mounts += _gpu_mounts()
    for src, dest in binds:
        mounts += ["--ro-bind", str(src), str(dest)]
    args += _with_parents(mounts)
    args += ["--chdir", "/tmp", "--"]
    if slot is not None:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxError("setpriv (util-linux) is not installed; it is needed to drop root in the sandbox")
        args += [
            setpriv,
            f"--reuid={slot.uid}",
            f"--regid={slot.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return args


_BWRAP_HELP: str | None = None


def _bwrap_supports(option: str) -> bool:
    global _BWRAP_HELP
    if _BWRAP_HELP is None:
        try:
            command = [shutil.which("bwrap") or "bwrap", "--help"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=10)
            _BWRAP_HELP = done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_HELP = ""
    return option in _BWRAP_HELP


# ---------------------------------------------------------------------------------------------
# availability


_PROBE: tuple[bool, str] | None = None


def _probe() -> tuple[bool, str]:
    if shutil.which("bwrap") is None:
        return False, "bubblewrap (bwrap) is not installed"
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        return False, "setpriv (util-linux) is not installed"
    slot = acquire_slot() if root else None
    try:
        ok, why = _try_bwrap(slot, True)
        if ok or seccomp.program() is None:
            return ok, why
        failed_with = why
        ok, why = _try_bwrap(slot, False)
        if ok:
            _SECCOMP[:] = [False, f"no seccomp filter: bubblewrap refused it ({failed_with})"]
        return ok, why
    finally:
        if slot is not None:
            kill_uid(slot.uid)
            slot.release()


_SECCOMP: list = [None, ""]  # [whether the filter is used, why not]


def seccomp_state() -> tuple[bool, str]:
    """``(True, what)`` when sandboxed workers get the seccomp filter, else ``(False, why not)``."""
    if _SECCOMP[0] is None:
        if seccomp.program() is None:
            _SECCOMP[:] = [False, f"no seccomp filter: no system-call table for {seccomp.machine()}"]
        else:
            _SECCOMP[:] = [True, "seccomp filter (no new namespaces, mounts, ptrace, keyrings, bpf, ...)"]
    return bool(_SECCOMP[0]), _SECCOMP[1]


def _try_bwrap(slot: Slot | None, with_seccomp: bool) -> tuple[bool, str]:
    fd = seccomp.program_fd() if with_seccomp and seccomp_state()[0] else None
    try:
        command = bwrap_prefix(slot, tmp_mb=1, seccomp_fd=fd) + [
            sys.executable,
            "-s",
            "-B",
            "-c",
            "import os, spec_tests; print(os.getuid(), os.path.exists('/tmp'))",
        ]
        try:
            done = subprocess.run(
                command,
                env=sandbox_env(),
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                pass_fds=(fd,) if fd is not None else (),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"bubblewrap could not run: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        return False, f"bubblewrap failed ({detail[-1] if detail else f'exit status {done.returncode}'})"
    uid = done.stdout.split()[0] if done.stdout.split() else "?"
    if slot is not None and uid != str(slot.uid):
        return False, f"the sandbox ran as uid {uid}, not the slot's uid {slot.uid}"
    kind = "unprivileged uid per slot" if slot is not None else "user namespace"
    return True, f"bubblewrap sandbox ({kind}; {seccomp_state()[1] if with_seccomp else 'no seccomp filter'})"


def sandbox_available(refresh: bool = False) -> tuple[bool, str]:
    """``(True, what)`` when workers can run sandboxed here, else ``(False, why and what that leaves open)``.
    Tried once per process (``refresh`` tries again); ``SPEC_SANDBOX=off`` forces the fallback."""
    global _PROBE
    if _mode() == "off":
        return False, f"sandbox off ({ENV_SWITCH}=off): {FALLBACK_LIMITS}"
    if _PROBE is None or refresh:
        ok, why = _probe()
        _PROBE = (ok, why if ok else f"sandbox off ({why}): {FALLBACK_LIMITS}")
    return _PROBE


# ---------------------------------------------------------------------------------------------
# the command for one worker


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...]
    sandboxed: bool
    reason: str
    impl: str  # what the worker's --impl names (a path inside the sandbox when sandboxed)
    slot: Slot | None = None
    uid: int | None = None
    binds: list = field(default_factory=list)
    spawn_fds: list = field(default_factory=list)  # only for the spawn (the seccomp program): closed after it

    def spawned(self) -> None:
        """After the worker's process was started (or failed to start): close what only it needed."""
        for fd in self.spawn_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.spawn_fds = []

    def release(self) -> None:
        """After the worker is gone: kill what is left under the slot's uid, free the slot."""
        self.spawned()
        if self.slot is not None:
            kill_uid(self.slot.uid)
            self.slot.release()
            self.slot = None


def _world_readable(source: Path) -> bool:
    """Whether the slot's uid can read every file of the submission (its modes allow others)."""
    entries = [source] if source.is_file() else [source, *source.rglob("*")]
    for entry in entries:
        mode = entry.lstat().st_mode
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            return False
    return True


def _readable_copy(source: Path, workdir) -> Path:
    """A copy of the submission that others may read (a staged copy can keep a zip's 0600 modes).
    Copied as data (``upload_copy``): no link followed or copied, only regular files and folders,
    within ``UploadLimits``; what was dropped is said on stderr, a refused upload is an error."""
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="spec-stage-"))
    target = base / "readable" / source.name
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.parent.chmod(0o755)
    report = copy_upload(source, target, UploadLimits())
    if report.refused_all:
        raise SandboxError(f"the submission {source} was not staged: {report.refused_all}")
    for line in report.lines():
        print(f"spec sandbox: staging {source.name}: {line}", file=sys.stderr)
    return target


def protected_paths(extra=()) -> list[str]:
    """What the in-process guard refuses to open (fallback mode)."""
    paths = [HARNESS_ROOT / "reference", HARNESS_ROOT / "tools", HARNESS_ROOT / "spec_grading"]
    paths += [HARNESS_PACKAGE / part for part in HIDDEN_HARNESS_PARTS]
    try:
        found = importlib.util.find_spec("reference")
        if found is not None and found.origin:
            paths.append(Path(found.origin).resolve().parent)
    except (ImportError, ValueError):
        pass
    for name, module in list(sys.modules.items()):  # setuptools' editable install maps packages elsewhere
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            paths += [
                Path(mapping[p]) for p in ("reference", "tools", "spec_grading") if isinstance(mapping.get(p), str)
            ]
            if isinstance(mapping.get("spec_tests"), str):
                paths += [Path(mapping["spec_tests"]) / part for part in HIDDEN_HARNESS_PARTS]
    paths += [Path(p) for p in extra]
    out: list[str] = []
    for path in paths:
        text = str(Path(path).resolve())
        if text not in out:
            out.append(text)
    return out


def worker_command(
    impl: str | os.PathLike,
    *,
    fd: int,
    ops: str | os.PathLike | None = None,
    memory_mb: int = 0,
    max_procs: int = 64,
    tmp_mb: int = 256,
    guard: bool | None = None,
    protect=(),
    sandbox: bool | None = None,
    gpu: bool = False,
    workdir: str | os.PathLike | None = None,
) -> Launch:
    """How to start a worker for ``impl`` (a path to the staged submission; a dotted module name only
    without the sandbox). ``sandbox``: None = when available (and not forced off by ``SPEC_SANDBOX``),
    True = required (``SandboxError`` otherwise), False = the fallback."""
    mode = _mode()
    if sandbox is None:
        sandbox = None if mode == "auto" else (mode == "require")
    available, reason = sandbox_available()
    if sandbox and not available:
        raise SandboxError(f"the sandbox is required but not available: {reason}")
    use_sandbox = available if sandbox is None else bool(sandbox)
    impl_text = os.fspath(impl)
    if os.path.exists(impl_text):
        impl_text = os.path.abspath(impl_text)
    ops_text = os.fspath(ops) if ops is not None else None
    if ops_text and ops_text.endswith(".py"):
        ops_text = os.path.abspath(ops_text)
    if not use_sandbox:
        argv = [sys.executable, "-s", "-B", "-m", WORKER_MODULE, "--impl", impl_text, "--fd", str(fd)]
        if ops_text:
            argv += ["--ops", ops_text]
        argv += ["--memory-mb", str(memory_mb)]
        if guard is None or guard:
            argv += ["--guard"]
            for path in protected_paths(protect):
                argv += ["--protect", path]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEC_", "PYTEST_", "HYPOTHESIS_"))}
        env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        env["PYTHONPATH"] = str(HARNESS_ROOT)
        cwd = os.fspath(workdir) if workdir else tempfile.gettempdir()
        why = reason if not available else f"sandbox off (not requested): {FALLBACK_LIMITS}"
        return Launch(argv, env, cwd, (fd,), False, why, impl_text)

    source = Path(impl_text)
    if not source.exists():
        raise SandboxError(f"the sandbox needs the submission as a file or folder, got {impl_text!r}")
    if os.geteuid() == 0 and not _world_readable(source):
        source = _readable_copy(source, workdir)
    inside = f"{SUBMISSION_MOUNT}/{source.name}"
    binds = [(source.resolve(), inside)]
    ops_inside = ops_text
    if ops_text and ops_text.endswith(".py"):
        ops_inside = f"{OPS_MOUNT}/{Path(ops_text).name}"
        binds.append((Path(ops_text).resolve(), ops_inside))
    slot = acquire_slot() if os.geteuid() == 0 else None
    seccomp_fd = None
    try:
        seccomp_fd = seccomp.program_fd() if seccomp_state()[0] else None
        argv = bwrap_prefix(slot, tmp_mb=tmp_mb, gpu=gpu, binds=binds, seccomp_fd=seccomp_fd)
    except BaseException:
        if slot is not None:
            slot.release()
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        raise
    argv += [sys.executable, "-s", "-B", "-m", WORKER_MODULE, "--impl", inside, "--fd", str(fd)]
    if ops_inside:
        argv += ["--ops", ops_inside]
    argv += ["--memory-mb", str(memory_mb), "--max-procs", str(max_procs)]
    if guard:
        argv += ["--guard"]
    return Launch(
        argv,
        sandbox_env(),
        "/",
        (fd,) if seccomp_fd is None else (fd, seccomp_fd),
        True,
        reason,
        inside,
        slot=slot,
        uid=slot.uid if slot else os.getuid(),
        binds=binds,
        spawn_fds=[seccomp_fd] if seccomp_fd is not None else [],
    )
