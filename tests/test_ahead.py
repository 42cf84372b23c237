"""Work done ahead (tests/ahead.py): done once, by a runner or by the test process, with its outcome
(value, skip, failure) reaching the tests that need it; runners never see what a test changes in its
own process. And the slow tier holds every test file that starts further processes."""

from __future__ import annotations

import importlib.util
import os
import re
import time
import uuid
from pathlib import Path

import ahead
import pytest
from conftest import SLOW_FILES

PROBE = """
import os

import pytest
from ahead import built_ahead, run_ahead


@built_ahead
def value(tmp_path_factory):
    folder = tmp_path_factory.mktemp("value")
    return {"pid": os.getpid(), "probe": os.environ.get("AHEAD_PROBE"), "folder": folder}


@built_ahead
def skipped():
    pytest.skip("nothing to build here")


@built_ahead
def broken():
    raise RuntimeError("the builder broke")


@built_ahead
def downstream(broken):
    return broken


@run_ahead
@pytest.mark.parametrize("n", [1, 2])
def test_even(tmp_path, n):
    assert tmp_path.is_dir()
    assert n % 2 == 0, f"{n} is odd"


@run_ahead
def test_reads_a_fixture(value):
    assert value["folder"].is_dir(), value
    assert value["pid"] == os.getpid(), "the fixture was built by another process than its test"
"""


@pytest.fixture
def probe(tmp_path):
    """A module of ahead work, imported here (as pytest would) so that its jobs are registered."""
    path = tmp_path / f"ahead_probe_{uuid.uuid4().hex}.py"
    path.write_text(PROBE)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    yield path.resolve()
    ahead.BUILDERS.pop(path.resolve(), None)
    ahead.TESTS.pop(path.resolve(), None)


def jobs(module_file: Path) -> list[ahead.Job]:
    fixtures = [ahead.Job(module_file, name, name) for name in ("value", "skipped", "broken", "downstream")]
    tests = [ahead.Job(module_file, "test_even", f"test_even[{n}]", {"n": n}) for n in (1, 2)]
    return [*fixtures, *tests, ahead.Job(module_file, "test_reads_a_fixture", "test_reads_a_fixture", {})]


def test_a_runner_does_the_work_with_the_sessions_environment(probe, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.delenv("AHEAD_PROBE", raising=False)
    plan = ahead.Plan(tmp_path / "plan", jobs(probe))
    plan.start(1)
    try:
        monkeypatch.setenv("AHEAD_PROBE", "changed by a test after the runners started")
        job = ahead.Job(probe, "value", "value")
        while not plan.claimed(job):  # else this process would claim it (no time limit: machine speed)
            assert plan.runners[0].poll() is None, "the runner ended without claiming it"
            time.sleep(0.05)
        got = plan.obtain(ahead.Job(probe, "value", "value"), tmp_path_factory)
    finally:
        plan.stop()
    assert got["pid"] != os.getpid() and got["probe"] is None, got
    assert got["folder"].is_dir() and (tmp_path / "plan") in got["folder"].parents


def test_unclaimed_work_is_done_by_the_test_that_needs_it_once(probe, tmp_path, tmp_path_factory):
    plan = ahead.Plan(tmp_path / "plan", jobs(probe))  # no runner started
    first = plan.obtain(ahead.Job(probe, "value", "value"), tmp_path_factory)
    again = plan.obtain(ahead.Job(probe, "value", "value"), tmp_path_factory)
    assert first["pid"] == os.getpid() and first == again
    assert plan.obtain(jobs(probe)[6], tmp_path_factory) is None  # a test given its module's fixture


def test_skips_and_failures_reach_the_tests(probe, tmp_path, tmp_path_factory):
    plan = ahead.Plan(tmp_path / "plan", jobs(probe))
    plan.start(2)
    try:
        with pytest.raises(pytest.skip.Exception, match="nothing to build here"):
            plan.obtain(ahead.Job(probe, "skipped", "skipped"), tmp_path_factory)
        with pytest.raises(pytest.fail.Exception, match="(?s)'broken', built ahead.*RuntimeError: the builder broke"):
            plan.obtain(ahead.Job(probe, "broken", "broken"), tmp_path_factory)
        with pytest.raises(pytest.fail.Exception, match="(?s)'broken', built ahead.*the builder broke"):
            plan.obtain(ahead.Job(probe, "downstream", "downstream"), tmp_path_factory)
        with pytest.raises(pytest.fail.Exception, match="(?s)test, run ahead,.*AssertionError: 1 is odd"):
            plan.obtain(jobs(probe)[4], tmp_path_factory)
        assert plan.obtain(jobs(probe)[5], tmp_path_factory) is None  # test_even[2] passed
    finally:
        plan.stop()


def test_a_bad_runner_count_is_a_usage_error_naming_it(monkeypatch):
    monkeypatch.setenv(ahead.ENV_RUNNERS, "two")
    with pytest.raises(pytest.UsageError, match="SPEC_TESTS_AHEAD='two'"):
        ahead.runner_count()
    monkeypatch.setenv(ahead.ENV_RUNNERS, "0")
    assert ahead.runner_count() == 0


# a test run ahead is in the slow tier by itself (tests/conftest.py), wherever its file is
STARTS_PROCESSES = re.compile(r"\bsubprocess\b|Popen|pytester|spec_grade\(|Worker\(|run_suite|@built_ahead")


def test_the_slow_tier_holds_every_file_that_starts_processes():
    """`-m "not slow"` (the README's quick tier) runs no test that starts a further process."""
    here = Path(__file__).resolve().parent
    starting = {p.name for p in here.glob("test_*.py") if STARTS_PROCESSES.search(p.read_text())}
    assert starting <= SLOW_FILES, sorted(starting - SLOW_FILES)
    assert SLOW_FILES <= {p.name for p in here.glob("test_*.py")}, sorted(SLOW_FILES)  # no stale names


def test_nobody_waits_on_a_fixture_another_process_is_building(probe, tmp_path, tmp_path_factory):
    """A runner takes the next job instead; a waiting test only takes tests whose fixtures are built."""
    plan = ahead.Plan(tmp_path / "plan", jobs(probe))
    reads = jobs(probe)[6]
    assert plan.claim(ahead.Job(probe, "value", "value"))  # as if a runner were building it
    taken = [plan.next_job() for _ in range(6)]
    assert reads not in taken and taken[-1] is None and plan.next_job(tests_only=True) is None, taken
    plan.do(ahead.Job(probe, "value", "value"), tmp_path_factory)  # built: now its test can be taken
    assert plan.next_job(tests_only=True) == reads
    fresh = ahead.Plan(tmp_path / "fresh", [ahead.Job(probe, "value", "value"), reads])
    assert fresh.next_job(tests_only=True) is None  # nobody built its fixture: a waiting test leaves it
