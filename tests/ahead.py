"""Slow work of the project's tests done ahead, by runner processes, while the other tests run.

Most of the slow tier waits: a grading's judge and worker take turns (docs/grading.md, Speed), a suite
run in a subprocess is mostly interpreter start-up, so while pytest runs one test at a time a core sits
idle. Two kinds of work can be done ahead:

- ``@built_ahead`` on a module fixture builder (it takes ``tmp_path_factory`` and other ``@built_ahead``
  fixtures of its module, by name, and returns a picklable value);
- ``@run_ahead`` on a test that takes only ``tmp_path``, its parametrized arguments (picklable) and
  ``@built_ahead`` fixtures of its module (declared above it).

``tests/conftest.py`` moves the tests that use such work to the end of the run, and when the session's
first test starts, ``SPEC_TESTS_AHEAD`` runner processes (default 3; ``python tests/ahead.py``) claim
the jobs one by one, in the order the tests will need them, and do them while the other tests run. A
test that reaches a job nobody has claimed yet does it itself, in the test process. Each job is done
once, and its outcome reaches the tests that need it: a value, a skip (``pytest.skip``), or a failure
with the job's traceback (a test run ahead fails with its own). Assertions in a runner are plain
Python ones (no pytest rewriting): give them a message.

A runner starts with the session's environment and working folder, so what a test changes in its own
process (``monkeypatch.setenv``, ``monkeypatch.chdir``) never reaches work done beside it.
``SPEC_TESTS_AHEAD=0`` starts no runner: every job is done in the test process (for a debugger).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENV_RUNNERS = "SPEC_TESTS_AHEAD"
DEFAULT_RUNNERS = 3
POLL_S = 0.2

# module file -> name -> the fixture builder or test function, in the order the module declares them
BUILDERS: dict[Path, dict[str, Callable]] = {}
TESTS: dict[Path, dict[str, Callable]] = {}


@dataclasses.dataclass(frozen=True)
class Job:
    """One piece of work: a fixture (``params`` is None) or one test case (its parametrized arguments)."""

    module_file: Path
    name: str
    label: str  # the fixture's name, or the test's id inside its module
    params: dict | None = None

    @property
    def key(self) -> str:
        digest = hashlib.sha256(f"{self.module_file}::{self.label}".encode()).hexdigest()[:16]
        return f"{self.module_file.stem}.{self.name}.{digest}"


def built_ahead(builder: Callable) -> Callable:
    """Declare ``builder`` as a module fixture of the same name, built ahead by a runner process."""
    module_file = Path(inspect.getfile(builder)).resolve()
    name = builder.__name__
    BUILDERS.setdefault(module_file, {})[name] = builder

    @pytest.fixture(scope="module", name=name)
    def fixture(request, tmp_path_factory):
        plan = request.config.stash.get(PLAN, None)
        if plan is None:  # no runners this session: a plain module fixture
            deps = {p: request.getfixturevalue(p) for p in _dependencies(builder)}
            return builder(**deps, **_factory_arg(builder, tmp_path_factory))
        return plan.obtain(Job(module_file, name, name), tmp_path_factory, steal=True)

    fixture.__doc__ = builder.__doc__
    return fixture


def run_ahead(test: Callable) -> Callable:
    """Declare a test to be run ahead by a runner process: it takes ``tmp_path``, its parametrized
    arguments and ``@built_ahead`` fixtures of its module (declared above it), nothing else."""
    module_file = Path(inspect.getfile(test)).resolve()
    TESTS.setdefault(module_file, {})[test.__name__] = test
    signature = inspect.signature(test)
    takes_tmp = "tmp_path" in signature.parameters
    fixtures = [name for name in signature.parameters if name in BUILDERS.get(module_file, {})]
    kept = [p for name, p in signature.parameters.items() if name != "tmp_path" and name not in fixtures]
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    @functools.wraps(test)
    def wrapper(request, **params):
        plan = request.config.stash.get(PLAN, None)
        if plan is None:
            given = {name: request.getfixturevalue(name) for name in fixtures + (["tmp_path"] if takes_tmp else [])}
            return test(**params, **given)
        job = Job(module_file, test.__name__, request.node.name, params)
        plan.obtain(job, request.getfixturevalue("tmp_path_factory"), steal=True)
        return None

    del wrapper.__wrapped__  # pytest reads the signature below, not the test's
    wrapper.__signature__ = signature.replace(parameters=[request, *kept])
    wrapper.run_ahead = True
    return wrapper


def _dependencies(builder: Callable) -> list[str]:
    return [p for p in inspect.signature(builder).parameters if p != "tmp_path_factory"]


def _factory_arg(builder: Callable, factory) -> dict:
    return {"tmp_path_factory": factory} if "tmp_path_factory" in inspect.signature(builder).parameters else {}


def runs_last(item: pytest.Item) -> bool:
    """Whether an item waits on work done ahead: it is run ahead, or its module builds fixtures ahead."""
    function = getattr(item, "function", None)
    return bool(BUILDERS.get(Path(item.path).resolve())) or getattr(function, "run_ahead", False)


def wanted(items: list[pytest.Item]) -> list[Job]:
    """The jobs these tests need: the fixtures (whole batches, the longest work) first, then the tests,
    each kind in the order the tests first need them."""
    out: list[Job] = []
    for item in items:
        module_file = Path(item.path).resolve()
        for name in BUILDERS.get(module_file, {}):
            job = Job(module_file, name, name)
            if name in getattr(item, "fixturenames", ()) and job not in out:
                out.append(job)
        if getattr(getattr(item, "function", None), "run_ahead", False):
            params = dict(getattr(getattr(item, "callspec", None), "params", {}))
            out.append(Job(module_file, item.originalname, item.name, params))
    return sorted(out, key=lambda job: job.params is not None)


def runner_count() -> int:
    raw = os.environ.get(ENV_RUNNERS, str(DEFAULT_RUNNERS))
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if count < 0:
        raise pytest.UsageError(f"{ENV_RUNNERS}={raw!r}: expected a whole number of runner processes, 0 or more")
    return count


class _TmpFactory:
    """What builders use of pytest's ``tmp_path_factory``, in a runner: fresh folders under one base."""

    def __init__(self, base: Path):
        self.base = base

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{basename}-", dir=self.base))


class Plan:
    """The jobs of one session: claims and outcomes are files in one folder.

    Whoever creates ``claims/<key>`` first (a runner, or the test process when a test gets there
    first) does that job and writes ``results/<key>.pickle``; everyone else waits for that file.
    """

    def __init__(self, folder: Path, jobs: list[Job]):
        self.folder, self.jobs = folder, jobs
        for sub in ("claims", "results", "tmp", "logs"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        self.runners: list[subprocess.Popen] = []

    def start(self, count: int) -> None:
        jobs_file = self.folder / "jobs.pickle"
        jobs_file.write_bytes(pickle.dumps(self.jobs))
        for i in range(count):
            with open(self.folder / "logs" / f"runner{i}.log", "w") as log:
                self.runners.append(
                    subprocess.Popen(
                        [sys.executable, str(HERE / "ahead.py"), str(self.folder)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # stop() ends the runner's own processes with it
                    )
                )

    def stop(self) -> None:
        for proc in self.runners:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # spec-grade stops its judges on SIGTERM
        for proc in self.runners:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def obtain(self, job: Job, factory, steal: bool = False) -> object:
        """The job's outcome: done here if nobody claimed it, else waited for (with ``steal``, doing
        tests nobody claimed yet meanwhile)."""
        result = self.folder / "results" / f"{job.key}.pickle"
        if self.claim(job):
            self.do(job, factory)
        while not result.exists():
            if self.runners and all(p.poll() is not None for p in self.runners) and not result.exists():
                logs = "".join(p.read_text() for p in sorted((self.folder / "logs").glob("*.log")))
                pytest.fail(f"the runners doing {job.label} ended without its outcome; their output:\n{logs[-4000:]}")
            other = self.next_job(tests_only=True) if steal else None
            if other is not None:
                self.do(other, factory)
            else:
                time.sleep(POLL_S)
        outcome, payload = pickle.loads(result.read_bytes())
        if outcome == "skip":
            pytest.skip(payload)
        if outcome == "error":
            what = "test, run ahead," if job.params is not None else f"module fixture {job.name!r}, built ahead,"
            pytest.fail(f"the {what} failed:\n{payload}", pytrace=False)
        return payload

    def dependencies(self, job: Job) -> list[Job]:
        """The fixtures of its module that the job needs (its module is imported)."""
        if job.params is None:
            names = _dependencies(BUILDERS[job.module_file][job.name])
        else:
            names = list(inspect.signature(TESTS[job.module_file][job.name]).parameters)
        return [Job(job.module_file, n, n) for n in names if n in BUILDERS.get(job.module_file, {})]

    def next_job(self, tests_only: bool = False) -> Job | None:
        """Claim the first job nobody claimed whose dependencies nobody else is still building
        (``tests_only``: the first test whose fixtures are all built, for a test waiting meanwhile)."""
        for job in self.jobs:
            if (tests_only and job.params is None) or self.claimed(job):
                continue
            blocked = [d for d in self.dependencies(job) if not self.done(d) and (tests_only or self.claimed(d))]
            if not blocked and self.claim(job):
                return job
        return None

    def claimed(self, job: Job) -> bool:
        return (self.folder / "claims" / job.key).exists()

    def done(self, job: Job) -> bool:
        return (self.folder / "results" / f"{job.key}.pickle").exists()

    def claim(self, job: Job) -> bool:
        try:
            (self.folder / "claims" / job.key).mkdir()
        except FileExistsError:
            return False
        return True

    def do(self, job: Job, factory) -> None:
        try:
            given = {dep.name: self.obtain(dep, factory) for dep in self.dependencies(job)}
            if job.params is None:
                builder = BUILDERS[job.module_file][job.name]
                outcome = ("value", builder(**given, **_factory_arg(builder, factory)))
            else:
                test = TESTS[job.module_file][job.name]
                if "tmp_path" in inspect.signature(test).parameters:
                    given["tmp_path"] = factory.mktemp(job.name[:30])
                outcome = ("value", test(**job.params, **given))
        except pytest.skip.Exception as skipped:
            outcome = ("skip", str(skipped.msg))
        except BaseException as exc:  # every failure reaches the tests that need the job
            if isinstance(exc, pytest.fail.Exception) and exc.msg.startswith("the module fixture"):
                outcome = ("error", exc.msg)  # a dependency's failure, already told
            else:
                outcome = ("error", "".join(traceback.format_exception(exc)))
            if isinstance(exc, KeyboardInterrupt):
                self._write(job, pickle.dumps(outcome))
                raise
        try:
            data = pickle.dumps(outcome)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            data = pickle.dumps(("error", f"its value cannot be pickled: {exc!r}"))
        self._write(job, data)

    def _write(self, job: Job, data: bytes) -> None:
        partial = self.folder / "results" / f".{job.key}.{os.getpid()}"
        partial.write_bytes(data)
        os.replace(partial, self.folder / "results" / f"{job.key}.pickle")


def run(folder: Path) -> None:
    """A runner: claim and do, in order, every job of the plan in ``folder`` that nobody claimed yet."""
    jobs = pickle.loads((folder / "jobs.pickle").read_bytes())
    plan = Plan(folder, jobs)
    factory = _TmpFactory(folder / "tmp")
    try:
        import torch

        torch.set_num_threads(1)  # as tests/conftest.py does in the test process
    except ImportError:
        pass
    for job in jobs:
        if job.module_file not in BUILDERS and job.module_file not in TESTS:
            spec = importlib.util.spec_from_file_location(job.module_file.stem, job.module_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[job.module_file.stem] = module
            spec.loader.exec_module(module)
    while not all(plan.claimed(job) for job in jobs):
        job = plan.next_job()
        if job is None:  # what is left waits on fixtures others are building
            time.sleep(POLL_S)
            continue
        started, cpu = time.monotonic(), _children_cpu()
        plan.do(job, factory)
        cpu = _children_cpu() - cpu  # this runner's and that of the processes it waited for
        print(f"{job.label}: {time.monotonic() - started:.1f} s, {cpu:.1f} s CPU", flush=True)


def _children_cpu() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


PLAN = pytest.StashKey[Plan]()


if __name__ == "__main__":
    sys.path[:0] = [str(HERE), str(ROOT)]  # the test modules import their helpers (and this module) from tests/
    import ahead  # the registries the test modules fill, not this script's copy of them

    ahead.run(Path(sys.argv[1]))
