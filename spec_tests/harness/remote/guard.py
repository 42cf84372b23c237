"""What graded code may not do: import the reference, open its files or the recorded expected values,
or start processes.

Installed in the worker (``spec_tests/harness/remote/server.py --guard``: the fallback when no sandbox is
available, see ``sandbox.py``) after torch is imported and before the submission is. Two mechanisms,
each with a message saying why:

- a meta-path finder refuses ``reference`` and ``spec_tests.bugs`` (built from the reference's
  source) with ``BlockedImport`` (an ``ImportError``);
- an audit hook (``sys.addaudithook``, which cannot be removed) refuses to open any file inside the
  protected folders (the reference, the bug catalog, the recordings) or any recording
  (``expected-*.pt``) wherever it is, to hard-link them, and to start
  processes (``subprocess``, ``os.system``, ``exec``, ``fork``, ``posix_spawn``), with
  ``BlockedAccess`` (a ``PermissionError``).

Every refusal is reported through ``on_block(what, where)``, where ``where`` is the innermost frame of
the submission on the stack (``None`` when the suite itself was refused, which is not the student's
doing and is not reported as such).

This is a guard against the obvious routes, not a sandbox: code running in the same process can
still inspect the interpreter's memory. ``submission.static_flags`` points staff at submissions
that try.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading

BLOCKED_MODULES = ("reference", "spec_tests.bugs")
SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn"}
)


class GradingViolation:
    """Something graded code may not do; the message says what and why (mixin of the two below)."""


class BlockedImport(GradingViolation, ImportError):
    """An import graded code may not make."""


class BlockedAccess(GradingViolation, PermissionError):
    """A file graded code may not open, or a process it may not start."""


def _is_blocked_module(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in BLOCKED_MODULES)


class Guard:
    def __init__(self, protected_dirs, submission_dir, on_block):
        self.protected = tuple(os.path.realpath(str(d)) + os.sep for d in protected_dirs if d)
        self.submission = os.path.realpath(str(submission_dir)) + os.sep if submission_dir else None
        self.on_block = on_block
        self._busy = threading.local()
        self.armed = False

    # attribution ---------------------------------------------------------------------------
    def where(self) -> str | None:
        """``file:line`` of the innermost submission frame on the stack, relative to the submission."""
        if self.submission is None:
            return None
        frame = sys._getframe(1)
        sub_parent = os.path.dirname(self.submission.rstrip(os.sep)) + os.sep
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(self.submission) or filename == self.submission.rstrip(os.sep):
                return f"{filename[len(sub_parent) :]}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def refuse(self, what: str, why: str, kind=None):
        where = self.where()
        self.on_block(what, where)
        at = f" (at {where})" if where else ""
        return (kind or BlockedAccess)(f"grading: {what} is not allowed while grading{at}: {why}")

    # import blocking -------------------------------------------------------------------------
    class _Finder(importlib.abc.MetaPathFinder):
        def __init__(self, guard):
            self.guard = guard

        def find_spec(self, fullname, path=None, target=None):
            if self.guard.armed and _is_blocked_module(fullname):
                raise self.guard.refuse(
                    f"importing {fullname!r}",
                    "the reference implementation is not available to graded code; write the function yourself",
                    BlockedImport,
                )
            return None

    # audit hook ------------------------------------------------------------------------------
    def _protected(self, path) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        for d in self.protected:
            if real.startswith(d) or real == d.rstrip(os.sep):
                return real
        name = os.path.basename(real)
        if name.startswith("expected-") and name.endswith(".pt"):  # a recording, wherever it was copied
            return real
        return None

    def _audit(self, event: str, args) -> None:
        if not self.armed or getattr(self._busy, "on", False):
            return
        if event not in ("open", "os.link") and event not in SPAWN_EVENTS:
            return
        self._busy.on = True
        try:
            if event == "open" or event == "os.link":
                if self._protected(args[0]):
                    raise self.refuse(
                        f"reading {os.path.basename(os.fsdecode(args[0]))!r}",
                        "the reference's source and the recorded expected values are off limits to graded code",
                    )
            elif event in SPAWN_EVENTS:
                raise self.refuse("starting a process", "graded code runs in one process and may not start others")
        finally:
            self._busy.on = False

    def install(self) -> None:
        """Arm the guard: blocked modules leave ``sys.modules`` and can no longer be imported."""
        for name in list(sys.modules):
            if _is_blocked_module(name):
                del sys.modules[name]
        sys.meta_path.insert(0, self._Finder(self))
        sys.addaudithook(self._audit)
        self.armed = True
