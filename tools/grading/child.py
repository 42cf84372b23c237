"""The pytest plugin of a grading child process (``-p tools.grading.child``).

The parent (``runner.py``) starts ``pytest spec_tests`` with this plugin, the submission as
``--impl`` and ``--replay-expectations``. Here, in order:

1. the event stream (``--grading-events``, JSON lines) is opened and the recordings are read;
2. memory (``RLIMIT_AS``) and core dumps are limited, torch gets one thread;
3. the guard (``guard.py``) is armed;
4. the submission is imported, under the per-test time limit: failing to import is one
   ``could_not_run`` event and the process ends;
5. each test runs under the per-test time limit (``SIGALRM`` raises ``GradingTimeout``, a
   ``BaseException`` that ``except Exception`` in graded code does not swallow); ``begin`` and
   ``result`` events bracket it, so that the parent knows which test a crash interrupted.

Messages are made deterministic: no timings, no memory addresses, paths relative to the submission.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
from pathlib import Path

import pytest


class GradingTimeout(BaseException):
    """The per-test time limit was reached."""


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


_STATE = None


def normalize_nodeid(nodeid: str) -> str:
    return nodeid.split("spec_tests/", 1)[-1]


class ChildState:
    def __init__(self, config):
        self.config = config
        self.events = open(config.getoption("grading_events"), "a", buffering=1, encoding="utf-8")
        self.timeout = float(config.getoption("grading_timeout"))
        self.memory_mb = int(config.getoption("grading_memory_mb"))
        sub = config.getoption("grading_submission")
        self.submission = os.path.realpath(sub) if sub else None
        run = config.getoption("grading_run")
        self.to_run = set(Path(run).read_text().split("\n")) - {""} if run else None
        self.reports: list = []

    def emit(self, **event) -> None:
        self.events.write(json.dumps(event, sort_keys=True) + "\n")
        self.events.flush()

    def clean(self, text: str) -> str:
        text = _ANSI.sub("", text)
        if self.submission:
            parent = os.path.dirname(self.submission) + os.sep
            text = text.replace(parent, "")
        return _ADDRESS.sub("0x…", text).strip()


def pytest_addoption(parser):
    group = parser.getgroup("grading", "grading child process (tools/grade.py)")
    group.addoption("--grading-events", default=None, help="JSON-lines event file")
    group.addoption("--grading-timeout", default="60", help="per-test limit in seconds")
    group.addoption("--grading-memory-mb", default="0", help="address-space limit in MiB (0: none)")
    group.addoption("--grading-submission", default=None, help="the submission's folder or file")
    group.addoption("--grading-protect", action="append", default=[], help="a folder graded code may not read")
    group.addoption("--grading-run", default=None, help="file listing the test ids to run")


class _Alarm:
    """``SIGALRM`` after ``seconds``, raising ``GradingTimeout``; cancelled on exit."""

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what = seconds, what

    def _fire(self, signum, frame):
        raise GradingTimeout(f"timed out: {self.what} did not finish within {self.seconds:g} s")

    def __enter__(self):
        if self.seconds > 0:
            signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        return False


def _limit_resources(memory_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def describe_exception(exc: BaseException, state: ChildState, tb_entries=()) -> str:
    """One short paragraph for an exception raised by graded code (no traceback)."""
    from .guard import GradingViolation

    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe_exception(exc.exceptions[0], state, tb_entries)
    if isinstance(exc, GradingTimeout):
        return str(exc)
    if isinstance(exc, GradingViolation):
        return str(exc)
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "allocate" in str(exc).lower()):
        limit = f" (graded code may use at most {state.memory_mb} MiB)" if state.memory_mb else ""
        return f"ran out of memory{limit}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(
            ": "
        )
    if isinstance(exc, SystemExit):
        return f"your code called sys.exit({exc.code!r}); graded code must return, not end the process"
    text = str(exc).strip()
    lines = text.splitlines()
    head = "\n".join(lines[:4]) + (" ..." if len(lines) > 4 else "")
    message = f"{type(exc).__name__}: {head}" if head else type(exc).__name__
    where = None
    if state.submission:
        for path, lineno, name in tb_entries:
            real = os.path.realpath(path)
            if real.startswith(state.submission + os.sep) or real == state.submission:
                where = (os.path.relpath(real, os.path.dirname(state.submission)), lineno, name)
    if where:
        message += f"\n  raised at {where[0]}:{where[1]} in {where[2]}"
    notes = [n for n in getattr(exc, "__notes__", ()) if "Falsifying" in n or "draw" in n]
    if notes:
        message += "".join(f"\n  {n}" for n in notes)
    return message


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if not config.getoption("grading_events"):
        return
    global _STATE
    state = _STATE = ChildState(config)
    config._grading = state
    state.emit(event="start")
    from spec_tests import expectations

    replay = config.getoption("replay_expectations")
    if replay:
        expectations.preload(replay)
    import torch

    torch.set_num_threads(1)
    _limit_resources(state.memory_mb)
    from .guard import Guard

    guard = Guard(
        config.getoption("grading_protect"),
        state.submission,
        on_block=lambda what, where: where and state.emit(event="blocked", what=what, where=where),
    )
    guard.install()
    from spec_tests import plugin

    reason = None
    try:
        with _Alarm(state.timeout, "importing your implementation"):
            plugin._implementation(config)
    except pytest.UsageError as exc:
        reason = state.clean(str(exc))
    except BaseException as exc:  # noqa: BLE001 - sys.exit, timeouts, anything at import time
        import traceback

        entries = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
        reason = "importing your implementation failed: " + state.clean(describe_exception(exc, state, entries))
    if reason is not None:
        state.emit(event="could_not_run", reason=reason)
        state.events.close()
        os._exit(3)


def pytest_collection_modifyitems(config, items):
    state = getattr(config, "_grading", None)
    if state is None or state.to_run is None:
        return
    keep = [i for i in items if normalize_nodeid(i.nodeid) in state.to_run]
    drop = [i for i in items if normalize_nodeid(i.nodeid) not in state.to_run]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    state = getattr(item.config, "_grading", None)
    if state is None:
        yield
        return
    with _Alarm(state.timeout, "the test"):
        yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    state = getattr(item.config, "_grading", None)
    if state is None:
        return
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        if isinstance(report.longrepr, str):  # the suite's own one-line failure (SpecFailure, not implemented)
            message = report.longrepr
        else:
            entries = [(str(e.path), e.lineno + 1, e.name) for e in call.excinfo.traceback]
            message = describe_exception(call.excinfo.value, state, entries)
        report.grading_message = state.clean(message)
    elif report.skipped and isinstance(report.longrepr, tuple):
        report.grading_message = state.clean(str(report.longrepr[2]).removeprefix("Skipped: "))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    state = getattr(item.config, "_grading", None)
    if state is None:
        yield
        return
    nodeid = normalize_nodeid(item.nodeid)
    state.reports = []
    state.emit(event="begin", nodeid=nodeid)
    yield
    outcome, message = "passed", ""
    for report in state.reports:
        msg = getattr(report, "grading_message", "")
        if hasattr(report, "wasxfail"):
            outcome, message = "xfailed", (msg or f"marked as an expected failure: {report.wasxfail}")
            break
        if report.failed:
            outcome, message = "failed", msg or f"failed during {report.when}"
            break
        if report.skipped:
            outcome, message = "skipped", msg
            break
    state.emit(event="result", nodeid=nodeid, outcome=outcome, message=message)


def pytest_runtest_logreport(report):
    if _STATE is not None:  # the reports of the test in progress (setup, call, teardown)
        _STATE.reports.append(report)


def pytest_sessionfinish(session, exitstatus):
    state = getattr(session.config, "_grading", None)
    if state is not None:
        peak = 0
        try:
            with open("/proc/self/status") as f:  # noqa: the guard allows /proc
                peak = next((int(line.split()[1]) // 1024 for line in f if line.startswith("VmPeak")), 0)
        except OSError:
            pass
        state.emit(event="finish", exitstatus=int(exitstatus), vm_peak_mb=peak)
