"""Memory limits through cgroup v2, where the grader can make a group: ``memory.max`` counts every
page a process tree charges (anonymous memory, page cache, tmpfs and memfd pages, however they were
written), ``memory.swap.max = 0`` keeps it from swapping instead, and ``memory.oom.group = 1`` ends
the whole tree when it is over.

    group = cgroup.create("spec-worker-123-1", 1 << 30)      # None where no group can be made
    argv = group.wrap(argv)                                  # the process moves itself in, then execs
    ...
    group.remove()                                           # kills what is left, removes the folder

A group can be made where ``/sys/fs/cgroup`` (or another mount) is cgroup2, its memory controller is
available, and this process may write there (root, or a delegated subtree): the group is made
beside this process's own group, in the nearest folder above it that has (or can be given) the
memory controller for its children. Where none can be made, ``available()`` says why, and the
callers fall back to ``RLIMIT_AS`` (which does not count pages written into a memfd with
``write()``: docs/grading.md).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_STATE: tuple[Path | None, str] | None = None


def _cgroup2_mounts() -> list[Path]:
    found = []
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    found.append(Path(parts[1].replace("\\040", " ")))
    except OSError:
        return []
    return sorted(found, key=lambda p: (str(p) != "/sys/fs/cgroup", str(p)))


def _own_path() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


def _controllers(folder: Path, name: str) -> set[str]:
    try:
        return set((folder / name).read_text().split())
    except OSError:
        return set()


def _find_base() -> tuple[Path | None, str]:
    mounts = _cgroup2_mounts()
    if not mounts:
        return None, "no cgroup2 file system is mounted (/sys/fs/cgroup is cgroup v1 or absent)"
    own = _own_path()
    reasons = []
    for mount in mounts:
        if "memory" not in _controllers(mount, "cgroup.controllers"):
            reasons.append(f"{mount}: the memory controller is not available in cgroup v2 there")
            continue
        folder = (mount / own.lstrip("/")) if own else mount
        chain = [folder, *folder.parents]
        for candidate in [c for c in chain if c == mount or mount in c.parents]:
            if not os.access(candidate, os.W_OK):
                continue
            if "memory" not in _controllers(candidate, "cgroup.subtree_control"):
                try:
                    (candidate / "cgroup.subtree_control").write_text("+memory")
                except OSError:
                    continue  # e.g. it holds processes itself (cgroup v2's no-internal-process rule)
            if "memory" in _controllers(candidate, "cgroup.subtree_control"):
                return candidate, f"cgroup v2 memory.max under {candidate}"
        reasons.append(f"{mount}: no writable folder above this process's group can hold memory-limited groups")
    return None, "; ".join(reasons) or "no usable cgroup v2 mount"


def available(refresh: bool = False) -> tuple[bool, str]:
    """``(True, where)`` when groups can be made here, else ``(False, why not)``; found once per process."""
    global _STATE
    if _STATE is None or refresh:
        if os.environ.get("SPEC_CGROUP", "").strip().lower() in ("0", "off", "no"):
            _STATE = (None, "cgroups turned off (SPEC_CGROUP=off)")
        else:
            _STATE = _find_base()
    return _STATE[0] is not None, _STATE[1]


class Group:
    def __init__(self, path: Path):
        self.path = path

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the group (so every process it starts
        is in the group from its first instruction), then execs ``argv``."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs), *argv]

    def oom_kills(self) -> int:
        try:
            for line in (self.path / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill every process of the group, then remove it."""
        stop = time.monotonic() + wait_s
        while True:
            pids = self.pids()
            if pids:
                try:
                    (self.path / "cgroup.kill").write_text("1")
                except OSError:
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > stop:
                    return
                time.sleep(0.02)


def create(name: str, memory_bytes: int) -> Group | None:
    """A fresh group ``name`` with ``memory.max = memory_bytes`` and no swap, or None where groups
    cannot be made (``available()`` says why) or this one could not be."""
    ok, _ = available()
    if not ok or memory_bytes <= 0:
        return None
    base = _STATE[0]
    path = base / name
    try:
        if path.exists():
            Group(path).remove()
        path.mkdir()
    except OSError:
        return None
    group = Group(path)
    try:
        (path / "memory.max").write_text(str(int(memory_bytes)))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
        if (path / "memory.oom.group").exists():
            (path / "memory.oom.group").write_text("1")
    except OSError:
        group.remove()
        return None
    return group
