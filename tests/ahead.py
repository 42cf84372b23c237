"""Module fixtures that grade end to end, built ahead in runner processes while other tests run.

A grading mostly waits: judge and worker take turns (docs/grading.md, Speed), so while pytest runs one
test at a time a core sits idle for most of the slow tier. A module fixture declared with
``@built_ahead`` is built by a runner process (``python tests/ahead.py``) instead: ``tests/conftest.py``
moves the tests that use such fixtures to the end of the run, and when the session's first test starts,
``SPEC_TESTS_AHEAD`` runners (default 2) start claiming those fixtures, in the order the tests will ask
for them, and build them while the other tests run. A test that reaches a fixture nobody has claimed yet
builds it itself, in the test process, as a plain module fixture would.

A runner starts with the session's environment and working folder, so what a test changes in its own
process (``monkeypatch.setenv``, ``monkeypatch.chdir``) never reaches a grading built beside it.

A builder takes ``tmp_path_factory`` and other ``@built_ahead`` fixtures of its module, by name, and
returns a picklable value. ``pytest.skip`` in a builder skips the tests that use it; any other error fails
them, with the builder's traceback. ``SPEC_TESTS_AHEAD=0`` starts no runner: every fixture is built in
the test process when first used (for a debugger).
"""

from __future__ import annotations

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
ENV_RUNNERS = "SPEC_TESTS_AHEAD"
DEFAULT_RUNNERS = 2
POLL_S = 0.2
ROOT = HERE.parent

# module file -> fixture name -> builder, in the order the module declares them
BUILDERS: dict[Path, dict[str, Callable]] = {}


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
        return plan.obtain(module_file, name, tmp_path_factory)

    fixture.__doc__ = builder.__doc__
    return fixture


def _dependencies(builder: Callable) -> list[str]:
    return [p for p in inspect.signature(builder).parameters if p != "tmp_path_factory"]


def _factory_arg(builder: Callable, factory) -> dict:
    return {"tmp_path_factory": factory} if "tmp_path_factory" in inspect.signature(builder).parameters else {}


def wanted(items: list[pytest.Item]) -> list[tuple[Path, str]]:
    """The ahead fixtures these tests use, in the order the tests first use them."""
    out: list[tuple[Path, str]] = []
    for item in items:
        names = BUILDERS.get(Path(item.path).resolve(), {})
        for name in names:
            if name in getattr(item, "fixturenames", ()) and (Path(item.path).resolve(), name) not in out:
                out.append((Path(item.path).resolve(), name))
    return out


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
    """The fixtures to build ahead in one session: claims and results are files in one folder.

    Whoever creates ``claims/<key>`` first (a runner, or the test process when a test gets there
    first) builds that fixture and writes ``results/<key>.pickle``; everyone else waits for that file.
    """

    def __init__(self, folder: Path, order: list[tuple[Path, str]]):
        self.folder, self.order = folder, order
        for sub in ("claims", "results", "tmp", "logs"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        self.runners: list[subprocess.Popen] = []

    @staticmethod
    def key(module_file: Path, name: str) -> str:
        return f"{module_file.stem}.{name}"

    def start(self, count: int) -> None:
        args = [str(self.folder), *(f"{m}::{n}" for m, n in self.order)]
        for i in range(count):
            log = open(self.folder / "logs" / f"runner{i}.log", "w")
            self.runners.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "ahead.py"), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # stop() ends the runner's gradings with it
                )
            )
            log.close()

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

    def obtain(self, module_file: Path, name: str, factory) -> object:
        """The fixture's value: built here if nobody claimed it, else waited for."""
        key = self.key(module_file, name)
        result = self.folder / "results" / f"{key}.pickle"
        if self._claim(key):
            self._build(module_file, name, factory)
        while not result.exists():
            if self.runners and all(p.poll() is not None for p in self.runners) and not result.exists():
                logs = "".join(p.read_text() for p in sorted((self.folder / "logs").glob("*.log")))
                pytest.fail(f"the runners building {key} ended without its value; their output:\n{logs[-4000:]}")
            time.sleep(POLL_S)
        outcome, payload = pickle.loads(result.read_bytes())
        if outcome == "skip":
            pytest.skip(payload)
        if outcome == "error":
            pytest.fail(f"the module fixture {name!r} failed while it was built ahead:\n{payload}", pytrace=False)
        return payload

    def _claim(self, key: str) -> bool:
        try:
            (self.folder / "claims" / key).mkdir()
        except FileExistsError:
            return False
        return True

    def _build(self, module_file: Path, name: str, factory) -> None:
        builder = BUILDERS[module_file][name]
        try:
            deps = {p: self.obtain(module_file, p, factory) for p in _dependencies(builder)}
            outcome = ("value", builder(**deps, **_factory_arg(builder, factory)))
        except pytest.skip.Exception as skipped:
            outcome = ("skip", str(skipped.msg))
        except BaseException as exc:  # every failure reaches the tests that use the fixture
            if isinstance(exc, pytest.fail.Exception) and exc.msg.startswith("the module fixture"):
                outcome = ("error", exc.msg)  # a dependency's failure, already formatted
            else:
                outcome = ("error", "".join(traceback.format_exception(exc)))
            if isinstance(exc, KeyboardInterrupt):
                self._write(module_file, name, outcome)
                raise
        try:
            data = pickle.dumps(outcome)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            data = pickle.dumps(("error", f"its value cannot be pickled: {exc!r}"))
        self._write_bytes(self.key(module_file, name), data)

    def _write(self, module_file: Path, name: str, outcome: tuple) -> None:
        self._write_bytes(self.key(module_file, name), pickle.dumps(outcome))

    def _write_bytes(self, key: str, data: bytes) -> None:
        partial = self.folder / "results" / f".{key}.{os.getpid()}"
        partial.write_bytes(data)
        os.replace(partial, self.folder / "results" / f"{key}.pickle")


def run(argv: list[str]) -> None:
    """A runner: claim and build, in order, every fixture named ``MODULE_FILE::NAME`` after the folder."""
    folder = Path(argv[0])
    order = []
    for arg in argv[1:]:
        module_file, _, name = arg.partition("::")
        order.append((Path(module_file), name))
    plan = Plan(folder, order)
    factory = _TmpFactory(folder / "tmp")
    for module_file, name in order:
        if module_file not in BUILDERS:
            spec = importlib.util.spec_from_file_location(module_file.stem, module_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_file.stem] = module
            spec.loader.exec_module(module)
        key = plan.key(module_file, name)
        if plan._claim(key):
            started = time.monotonic()
            plan._build(module_file, name, factory)
            print(f"built {key} in {time.monotonic() - started:.1f} s", flush=True)


PLAN = pytest.StashKey[Plan]()


if __name__ == "__main__":
    sys.path[:0] = [str(HERE), str(ROOT)]  # the test modules import their helpers (and this module) from tests/
    import ahead  # the registry the test modules fill, not this script's copy of it

    ahead.run(sys.argv[1:])
