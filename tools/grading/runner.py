"""Running one submission's tests in isolated child processes.

A child is ``pytest spec_tests -p tools.grading.child --impl=<staged submission>
--replay-expectations <recordings>``; it reports ``begin``/``result`` events per test. The parent
watches it: a test that outlives its limit (signal ignored, stuck in C code) gets the process
killed; a child that dies (crash, ``os._exit``, killed for memory) costs the test it was running,
and a new child runs the remaining tests. A whole-run limit bounds everything; whatever happens,
every test ends with an outcome and a message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .recording import ROOT, child_env


@dataclass(frozen=True)
class Limits:
    test_timeout_s: float = 60.0
    run_timeout_s: float = 1200.0
    memory_mb: int = 4096
    max_restarts: int = 20
    startup_s: float = 180.0  # import torch + collection, before the first test
    kill_grace_s: float = 5.0  # a test is killed at test_timeout_s * 1.25 + this (its own alarm failed)


@dataclass
class Outcome:
    outcome: str  # passed | failed | skipped | xfailed | not_run
    message: str = ""


@dataclass
class RunResult:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    could_not_run: str | None = None
    blocked: list[dict] = field(default_factory=list)
    staff_notes: list[str] = field(default_factory=list)
    restarts: int = 0
    elapsed_s: float = 0.0
    vm_peak_mb: int = 0  # largest address space a child reached (to size the memory limit)


def _signal_text(rc: int) -> str:
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    known = {
        "SIGSEGV": "crashed with a segmentation fault (SIGSEGV)",
        "SIGABRT": "crashed: the process aborted (SIGABRT, e.g. os.abort() or a failed check in C code)",
        "SIGKILL": "was killed (SIGKILL), usually for using too much memory",
        "SIGBUS": "crashed with a bus error (SIGBUS)",
        "SIGFPE": "crashed with a floating-point exception (SIGFPE)",
        "SIGILL": "crashed with an illegal instruction (SIGILL)",
    }
    return known.get(name, f"was ended by {name}")


def child_command(
    submission: Path,
    recordings: Path,
    events: Path,
    run_list: Path,
    limits: Limits,
    protect: list[Path],
    device: str = "cpu",
    files: list[str] | None = None,
) -> list[str]:
    targets = [f"spec_tests/{f}" for f in files] if files else ["spec_tests"]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-q",
        "--no-header",
        "--tb=no",
        "-rN",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-p",
        "tools.grading.child",
        f"--impl={submission}",
        f"--replay-expectations={recordings}",
        f"--device={device}",
        "--hypothesis-profile=grading",
        f"--grading-events={events}",
        f"--grading-run={run_list}",
        f"--grading-timeout={limits.test_timeout_s:g}",
        f"--grading-memory-mb={limits.memory_mb}",
        f"--grading-submission={submission}",
        f"--xfails-file={events.parent / 'no-xfails.toml'}",
    ]
    for folder in protect:
        cmd += [f"--grading-protect={folder}"]
    return cmd


def protected_folders(recordings: Path) -> list[Path]:
    return [ROOT / "reference", ROOT / "spec_tests" / "bugs", Path(recordings)]


def run_submission(
    submission: Path,
    test_ids: list[str],
    recordings: Path,
    limits: Limits,
    *,
    on_result=None,
    device: str = "cpu",
    workdir: Path | None = None,
) -> RunResult:
    """Every test of ``test_ids`` run against ``submission`` (a staged copy), isolated."""
    result = RunResult()
    remaining = list(test_ids)
    started = time.monotonic()
    work = Path(workdir or tempfile.mkdtemp(prefix="grade-run-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "no-xfails.toml").write_text("# grading ignores a submission's SPEC_XFAILS\n")
    attempt = 0
    while remaining:
        attempt += 1
        events, run_list, log = (
            work / f"events-{attempt}.jsonl",
            work / f"run-{attempt}.txt",
            work / f"child-{attempt}.log",
        )
        run_list.write_text("\n".join(remaining) + "\n")
        events.write_text("")
        files = sorted({test_id.split("::", 1)[0] for test_id in remaining})
        cmd = child_command(
            submission, recordings, events, run_list, limits, protected_folders(recordings), device, files
        )
        with open(log, "w") as log_file:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=child_env(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            stop, current, progress = _watch(proc, events, limits, started, result, remaining, on_result)
        done_now = progress
        if result.could_not_run is not None:
            for test_id in remaining:
                result.outcomes[test_id] = Outcome("not_run", "not run: your implementation could not be loaded")
            remaining = []
            break
        if current is not None:
            if stop == "test_timeout":
                text = (
                    f"timed out: the test did not finish within {limits.test_timeout_s:g} s "
                    "(the grading process had to be stopped)"
                )
            elif stop == "run_timeout":
                text = f"not finished: grading reached its whole-run limit of {limits.run_timeout_s:g} s"
            elif proc.returncode is not None and proc.returncode < 0:
                text = f"the test process {_signal_text(proc.returncode)} during this test"
            else:
                text = (
                    f"the test process ended (exit status {proc.returncode}) during this test: graded code "
                    "must return, not end the process (os._exit?)"
                )
            result.outcomes[current] = Outcome("failed", text)
            remaining.remove(current)
            if on_result:
                on_result(current, result.outcomes[current])
            done_now += 1
        if stop == "run_timeout":
            for test_id in remaining:
                result.outcomes[test_id] = Outcome(
                    "not_run", f"not run: grading reached its whole-run limit of {limits.run_timeout_s:g} s"
                )
            remaining = []
            break
        if not remaining:
            break
        tail = log.read_text(errors="replace")[-2000:]
        if done_now == 0:  # the child ended without running anything: give up rather than loop
            how = (
                _signal_text(proc.returncode)
                if proc.returncode is not None and proc.returncode < 0
                else f"ended (exit status {proc.returncode})"
            )
            when = (
                "before running any test (while importing your implementation?)"
                if not result.outcomes
                else "before running the remaining tests"
            )
            reason = f"the test process {how} {when}"
            result.staff_notes.append(f"{reason}; log tail:\n{tail}")
            if not result.outcomes:
                result.could_not_run = reason
            for test_id in remaining:
                result.outcomes[test_id] = Outcome("not_run", f"not run: {reason}")
            remaining = []
            break
        if result.restarts >= limits.max_restarts:
            for test_id in remaining:
                result.outcomes[test_id] = Outcome(
                    "not_run", f"not run: the test process crashed {result.restarts + 1} times; grading stopped"
                )
            remaining = []
            break
        result.restarts += 1
    result.elapsed_s = time.monotonic() - started
    return result


def _watch(proc, events: Path, limits: Limits, started: float, result: RunResult, remaining: list, on_result):
    """Follow the child's events until it ends or a limit is hit; returns (stop, current test, results seen)."""
    offset, partial = 0, ""
    current, current_since = None, None
    last_event = time.monotonic()
    seen = 0
    stop = None

    def read_events():
        nonlocal offset, partial, current, current_since, last_event, seen
        with open(events, encoding="utf-8") as f:
            f.seek(offset)
            chunk = f.read()
            offset = f.tell()
        lines = (partial + chunk).split("\n")
        partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            last_event = time.monotonic()
            kind = event.get("event")
            if kind == "begin" and event.get("nodeid") in remaining:
                current, current_since = event["nodeid"], time.monotonic()
            elif kind == "result" and event.get("nodeid") in remaining:
                test_id = event["nodeid"]
                result.outcomes[test_id] = Outcome(str(event.get("outcome")), str(event.get("message", "")))
                remaining.remove(test_id)
                seen += 1
                if current == test_id:
                    current = None
                if on_result:
                    on_result(test_id, result.outcomes[test_id])
            elif kind == "blocked":
                entry = {"what": str(event.get("what")), "where": str(event.get("where"))}
                if entry not in result.blocked:
                    result.blocked.append(entry)
            elif kind == "could_not_run":
                result.could_not_run = str(event.get("reason"))
            elif kind == "finish":
                result.vm_peak_mb = max(result.vm_peak_mb, int(event.get("vm_peak_mb") or 0))

    while True:
        read_events()
        if proc.poll() is not None:
            read_events()
            break
        now = time.monotonic()
        if now - started > limits.run_timeout_s:
            stop = "run_timeout"
        elif current is not None and now - current_since > limits.test_timeout_s * 1.25 + limits.kill_grace_s:
            stop = "test_timeout"
        elif current is None and now - last_event > limits.startup_s + limits.test_timeout_s:
            stop = "test_timeout" if seen else "startup_timeout"
        if stop:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            read_events()
            break
        time.sleep(0.05)
    if stop == "startup_timeout" and result.could_not_run is None and not result.outcomes:
        result.could_not_run = "the test process did not start running tests in time"
    return stop, current, seen
