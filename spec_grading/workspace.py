"""The grader's temporary folders: one run folder per ``spec-grade`` process, always cleaned up.

A run folder is ``<tmp>/spec-grade-<uid>/run-<pid>-<random>/`` (mode 0700), holding one folder per
submission (the staged copy, the worker's folder, the judge's output and log). While the grader
lives it holds an exclusive ``flock`` on the folder's ``lock`` file. It removes the folder when it
ends, also on SIGTERM, SIGINT and SIGHUP (turned into ``Interrupted`` so that ``finally`` blocks
run and live judges are killed); a grader killed with SIGKILL cannot clean up, so each new grader
first removes every run folder whose lock nobody holds (the kernel drops a dead process's locks).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

LOCK_NAME = "lock"


class Interrupted(BaseException):
    """The grader received SIGTERM, SIGINT or SIGHUP."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def base_folder() -> Path:
    base = Path(tempfile.gettempdir()) / f"spec-grade-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{base} is not a private folder of this user; remove it")
    return base


def sweep_stale(base: Path) -> list[Path]:
    """Remove run folders left by graders that died (their lock is free); returns those removed."""
    removed = []
    for folder in base.glob("run-*"):
        lock = folder / LOCK_NAME
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = None  # a folder being created right now has its lock within microseconds; or a wreck
            try:
                if folder.stat().st_mtime > _now() - 60:
                    continue
            except OSError:
                continue
        except OSError:
            continue
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # a live grader's folder
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _now() -> float:
    import time

    return time.time()


class RunFolder:
    """``with RunFolder() as run: run.path`` -- a private folder, removed on exit."""

    def __init__(self):
        base = base_folder()
        sweep_stale(base)
        self.path = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=base))
        self._fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._fd)
            self._fd = -1


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def install_signal_handlers() -> dict:
    """SIGTERM, SIGINT, SIGHUP raise ``Interrupted`` in the main thread; returns the old handlers."""
    old = {}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        old[signum] = signal.signal(signum, _raise_interrupted)
    return old


def restore_signal_handlers(old: dict) -> None:
    for signum, handler in old.items():
        signal.signal(signum, handler)
