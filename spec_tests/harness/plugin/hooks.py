"""The pytest plugin behind ``pytest spec_tests --impl=NAME``.

Registered as a ``pytest11`` entry point (and by ``spec_tests/conftest.py`` where the suite is not
installed, as in a student handout). It is a good citizen of other projects' test runs: its options
all start with ``--spec-`` (the short ``--impl`` is added by ``spec_tests/conftest.py``, only when
the suite itself is collected), its fixtures live in that conftest, and it changes nothing (torch
threads, Hypothesis settings, test order) unless spec tests are collected.

For spec tests it: loads the implementation as a ``Subject``; checks that every name a test judges
or uses is provided before any setup runs ("not provided" -> skip); runs components upstream first;
turns failures into one-line reports; tells consequences from causes by the implementation's own
upstream behaviour (``consequences.py``, ``rootcause.py``); attaches every check's typed result
to the report; and applies the implementation's expected-failure list.

PYTEST_DONT_REWRITE: the plugin has no assertions to rewrite, and a handout's conftest imports it
before naming it in ``pytest_plugins`` (pytest would warn "Module already imported").
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path

import pytest

from ...protocol import COMPONENT_NAMES, COMPONENT_ORDER
from ..judging import rootcause
from ..judging.results import RESULTS_KEY, VERDICT_KEY, verdict_of
from ..subject.loading import ACCEPTED_FORMS, ImplImportError, ImplUsageError, load_implementation
from . import markers

SUITE_DIR = Path(__file__).resolve().parents[2]

# Registered (never loaded) on import: Hypothesis's own plugin may load the profile named by
# --hypothesis-profile before this plugin's hooks run. The names are prefixed "spec-", so another
# project's profiles are untouched.
_hypothesis_registered = False
try:
    from . import hypothesis_profiles

    hypothesis_profiles.register()
    _hypothesis_registered = True
except ImportError:  # pragma: no cover - hypothesis is a dependency of the suite
    pass


def pytest_addoption(parser):
    group = parser.getgroup("spec", "transformer spec suite (spec_tests)")
    group.addoption(
        "--spec-impl",
        dest="spec_impl",
        default=None,
        help=f"implementation to check: {ACCEPTED_FORMS} (also --impl; default: $SPEC_IMPL or reference)",
    )
    group.addoption("--spec-device", dest="spec_device", default="cpu", choices=("cpu", "cuda"), help="device (cpu)")
    group.addoption(
        "--spec-xfails",
        dest="spec_xfails",
        default=None,
        help="TOML file of expected failures, [xfail] 'test id' = 'reason' (default: the implementation's SPEC_XFAILS)",
    )
    group.addoption(
        "--spec-capabilities",
        dest="spec_capabilities",
        default=None,
        help="comma-separated capabilities to judge, overriding the implementation's CAPABILITIES (grading)",
    )
    group.addoption(
        "--spec-tb", dest="spec_tb", action="store_true", help="show full tracebacks of the implementation's errors"
    )
    group.addoption(
        "--spec-write-xfails",
        dest="spec_write_xfails",
        metavar="FILE",
        default=None,
        help="write every test that did not pass to FILE as an expected-failure file for --spec-xfails",
    )
    group.addoption(
        "--spec-hypothesis-profile",
        dest="spec_hypothesis_profile",
        default=None,
        choices=("spec-dev", "spec-ci", "spec-grading"),
        help="the suite's Hypothesis profile, for its own property tests only (default: $SPEC_HYPOTHESIS_PROFILE "
        "or spec-ci)",
    )
    group.addoption(
        "--spec-diagnosis-bugs",
        dest="spec_diagnosis_bugs",
        default=None,
        help="comma-separated catalogued bugs diagnosis may name (default: all; tools/bugcheck.py narrows it)",
    )
    group.addoption(
        "--spec-remote",
        dest="spec_remote",
        metavar="PATH",
        default=None,
        help="judge the implementation at PATH run in a separate, sandboxed worker process (grading)",
    )
    group.addoption(
        "--spec-test-timeout",
        dest="spec_test_timeout",
        type=float,
        default=60.0,
        help="with --spec-remote: seconds each test may spend in the implementation (60)",
    )
    group.addoption(
        "--spec-memory-mb",
        dest="spec_memory_mb",
        type=int,
        default=4096,
        help="with --spec-remote: address-space limit of the worker in MiB (0: none)",
    )
    group.addoption(
        "--spec-workdir",
        dest="spec_workdir",
        metavar="DIR",
        default=None,
        help="with --spec-remote: the worker's folder (its log; its cwd without the sandbox; default: a temp folder)",
    )
    group.addoption(
        "--spec-protect",
        dest="spec_protect",
        metavar="PATH",
        action="append",
        default=[],
        help="with --spec-remote and no sandbox: a further folder the in-process guard refuses to open (repeatable)",
    )
    group.addoption(
        "--spec-seed",
        dest="spec_seed",
        metavar="N",
        default=None,
        help="draw every input (and the model configs' sizes) from seed N, or from the integer in file @PATH "
        "(default 0: the suite's own inputs, those of the recordings)",
    )
    group.addoption(
        "--spec-conceal-exact",
        dest="spec_conceal_exact",
        action="store_true",
        help="integer answers (counts, bytes) that differ give the direction, not the expected number (grading)",
    )
    group.addoption(
        "--spec-record",
        dest="spec_record",
        metavar="DIR",
        default=None,
        help="also record every expected value (live reference) to DIR/expected-<ROPE_STYLE>.pt",
    )
    group.addoption(
        "--spec-replay",
        dest="spec_replay",
        metavar="DIR",
        default=None,
        help="take expected values from DIR/expected-<ROPE_STYLE>.pt (default where the suite ships recordings)",
    )


def add_short_impl_option(parser) -> None:
    """``--impl``, the short form of ``--spec-impl``, for conftests of this project's own folders.

    Called by ``spec_tests/conftest.py`` (and ``benchmarks/conftest.py``), so it exists only when
    those folders are collected. A host project may have its own ``--impl`` (then ``--spec-impl``
    names the implementation): where the plugin is installed the short option is registered after
    every initial conftest (``pytest_load_initial_conftests`` below), so the host's wins whatever
    the order of the command line; a second registration in the same run is skipped.
    """
    if getattr(parser, "_spec_defer_short_impl", False):
        parser._spec_wants_short_impl = True
        return
    try:
        parser.getgroup("spec").addoption(
            "--impl",
            dest="impl",
            default=None,
            help="implementation to check (same as --spec-impl; default: $SPEC_IMPL or reference)",
        )
        parser._spec_short_impl = True  # ours: impl_spec reads it
    except (ValueError, argparse.ArgumentError):  # already registered: by the other conftest (ours), or by a host's own
        pass


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    parser._spec_defer_short_impl = True
    try:
        return (yield)
    finally:
        parser._spec_defer_short_impl = False
        # also for `pytest --pyargs spec_tests --impl=X` from any folder, where the suite's conftest
        # loads only during collection, after the command line is parsed
        pyargs = "--pyargs" in args and any(a.split("::")[0].split(".")[0] == "spec_tests" for a in args)
        if pyargs or getattr(parser, "_spec_wants_short_impl", False):
            add_short_impl_option(parser)


def pytest_configure(config):
    for line in markers.MARKERS:
        config.addinivalue_line("markers", line)
    config._spec = None
    config._spec_scratch = None
    if config.inipath is None and _runs_the_suite(config):
        _keep_the_folder_clean(config)
    if config.getoption("spec_write_xfails"):
        from .xfails_file import XfailsWriter

        writer = XfailsWriter(Path(config.getoption("spec_write_xfails")).resolve(), impl_spec(config), id_of_node)
        config.pluginmanager.register(writer, "spec-xfails-writer")
    from ..diagnosis import catalog

    only = config.getoption("spec_diagnosis_bugs")
    catalog.ONLY = None if only is None else {n.strip() for n in only.split(",") if n.strip()}
    from ... import inputs
    from ..judging import compare

    inputs.set_seed(spec_seed_of(config))  # before any test module is collected (module-level configs)
    compare.CONCEAL_EXACT = bool(config.getoption("spec_conceal_exact", False))


def spec_seed_of(config) -> int:
    """``--spec-seed``: an integer, or ``@PATH`` of a file holding one (so that no process listing shows it)."""
    from ... import inputs

    raw = config.getoption("spec_seed", None)
    if raw is None:
        return inputs.DEFAULT_SEED
    text = str(raw).strip()
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise pytest.UsageError(f"--spec-seed {raw}: cannot read the seed file ({exc})") from None
    try:
        value = int(text)
        if not 0 <= value < 2**63:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"--spec-seed must be an integer in [0, 2**63) or @PATH, got {text!r}") from None
    return value


def _runs_the_suite(config) -> bool:
    """Whether the command line names the suite: ``--pyargs spec_tests...`` or a path inside it."""
    for arg in config.args:
        name = str(arg).split("::")[0]
        if config.option.pyargs and (name == "spec_tests" or name.startswith("spec_tests.")):
            return True
        if os.path.exists(name) and Path(name).resolve().is_relative_to(SUITE_DIR):
            return True
    return False


def _keep_the_folder_clean(config) -> None:
    """A spec run outside any project (no pytest configuration file: spec-check or ``pytest --pyargs
    spec_tests`` in an arbitrary folder) leaves nothing there: pytest's cache, Hypothesis's storage and
    pytest-benchmark's storage go to a temporary folder, removed when the run ends."""
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="spec-run-"))
    config._spec_scratch = scratch
    cache = getattr(config, "cache", None)
    if cache is not None:
        from _pytest.cacheprovider import Cache

        config.cache = Cache(scratch / "pytest_cache", config, _ispytest=True)
    if getattr(config.option, "benchmark_storage", None) == "file://./.benchmarks":  # the default, not chosen
        config.option.benchmark_storage = f"file://{scratch / 'benchmarks'}"
    try:
        from hypothesis import configuration
    except ImportError:  # pragma: no cover - hypothesis is a dependency of the suite
        return
    config._spec_hypothesis_home = getattr(configuration, "__hypothesis_home_directory", None)
    configuration.set_hypothesis_home_dir(scratch / "hypothesis")


def pytest_unconfigure(config):
    from ... import inputs
    from ..judging import compare

    inputs.set_seed(inputs.DEFAULT_SEED)  # a later in-process session starts from the suite's own inputs
    compare.CONCEAL_EXACT = False
    scratch = getattr(config, "_spec_scratch", None)
    if scratch is None:
        return
    import shutil

    try:
        from hypothesis import configuration

        configuration.set_hypothesis_home_dir(getattr(config, "_spec_hypothesis_home", None))
    except ImportError:  # pragma: no cover
        pass
    shutil.rmtree(scratch, ignore_errors=True)


class Session:
    """The suite's state for one pytest session: the subject, expected values, failing names."""

    def __init__(self, config):
        self.config = config
        self.impl = make_subject(config)
        self.device = config.getoption("spec_device")
        self.registry = rootcause.FailureRegistry(crash_consequences=not config.getoption("spec_remote"))
        self._expectations = None
        self.torch_threads = None
        self.verdicts: dict[str, object] = {}

    @property
    def expectations(self):
        if self._expectations is None:
            from ..judging.expectations import expectations_for

            self._expectations = expectations_for(self.config, self.impl.rope_style, self.device)
        return self._expectations

    @property
    def reference(self):
        """The live reference subject, or None (replaying a recording, as a handout does)."""
        return getattr(self.expectations, "reference", None)


def impl_spec(config) -> str:
    """--spec-impl, else the short --impl when this suite registered it (a host project's own --impl
    means something else), else $SPEC_IMPL, else the reference."""
    short = getattr(config.option, "impl", None) if getattr(config._parser, "_spec_short_impl", False) else None
    return config.getoption("spec_impl", None) or short or os.environ.get("SPEC_IMPL", "reference")


def make_subject(config):
    from ..subject.subject import LocalSubject

    spec = impl_spec(config)
    caps = config.getoption("spec_capabilities")
    capabilities = None if caps is None else [c.strip() for c in caps.split(",") if c.strip()]
    remote = config.getoption("spec_remote")
    if remote:
        from ..remote.client import RemoteError, Worker
        from ..remote.remote_subject import RemoteSubject

        worker = Worker(
            remote,
            memory_mb=config.getoption("spec_memory_mb"),
            device=config.getoption("spec_device"),
            workdir=config.getoption("spec_workdir"),
            protect=config.getoption("spec_protect"),
        )
        try:
            return RemoteSubject(worker, capabilities=capabilities, test_timeout=config.getoption("spec_test_timeout"))
        except RemoteError as exc:
            worker.close()
            raise pytest.UsageError(f"implementation {remote} failed to import: {exc}") from None
    try:
        obj, label = load_implementation(spec)
        return LocalSubject(obj, label, capabilities=capabilities)
    except (ImplUsageError, ImplImportError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


def session_of(config) -> Session:
    if config._spec is None:
        config._spec = Session(config)
    return config._spec


def is_spec_item(item) -> bool:
    path = getattr(item, "path", None)
    return (
        path is not None and SUITE_DIR in Path(path).resolve().parents and "spec" in getattr(item, "fixturenames", ())
    )


def _xfails(config, impl) -> dict[str, str]:
    source = config.getoption("spec_xfails") or getattr(getattr(impl, "obj", None), "SPEC_XFAILS", None)
    if source is None:
        return {}
    if isinstance(source, dict):
        return dict(source)
    merged: dict[str, str] = {}
    for one in [source] if isinstance(source, str | Path) else source:  # several files: later ones override
        path = Path(one)
        if not path.is_absolute() and getattr(impl.obj, "__file__", None) and not path.exists():
            path = Path(impl.obj.__file__).parent / path
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise pytest.UsageError(f"expected-failure file {path}: {exc}") from None
        merged.update(table.get("xfail", {}))
    return merged


def test_id(item) -> str:
    return id_of_node(item.nodeid)


def id_of_node(nodeid: str) -> str:
    """A test's id relative to spec_tests/ (how expected-failure files name it, wherever the suite is)."""
    return nodeid.split("spec_tests/", 1)[-1]


def pytest_collection_modifyitems(config, items):
    spec_items = [item for item in items if is_spec_item(item)]
    if not spec_items:
        return
    state = session_of(config)
    bad = [(test_id(i), p) for i in spec_items for p in markers.problems(i)]
    if bad:
        raise pytest.UsageError("spec tests with bad markers:\n" + "\n".join(f"  {t}: {p}" for t, p in bad))
    import torch

    from . import hypothesis_profiles

    # The suite's tensors are tiny: one thread is fastest, and on a shared 2-core machine a spinning
    # thread pool makes a 50 us matmul take milliseconds. SPEC_TORCH_THREADS overrides.
    state.torch_threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPEC_TORCH_THREADS", "1")))
    if state.device == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError("--spec-device cuda: torch.cuda.is_available() is False on this machine")
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
        torch.backends.cudnn.allow_tf32 = False
    hypothesis_profiles.apply(spec_items, config)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        from .terminal import make_failures_red

        make_failures_red(reporter)

    # upstream components first, and within a component the tests that judge component functions alone (a model
    # option's attention tests in its model-level file) before the tests of the model; otherwise the files' order,
    # but every test after the tests whose failure can explain its own (ordering.py), so that a consequence can be
    # told from its cause
    from .ordering import run_order

    rank = {c: i for i, c in enumerate(COMPONENT_ORDER)}
    others = [item for item in items if not is_spec_item(item)]

    def key(position: int, item) -> tuple:
        subjects, _ = markers.subjects_of(item)
        functions_only = bool(subjects) and set(subjects) <= set(COMPONENT_NAMES)
        return (rank.get(markers.component_of(item), -1), 0 if functions_only else 1, position)

    keys = [key(i, item) for i, item in enumerate(spec_items)]
    items[:] = others + [spec_items[i] for i in run_order([markers.subjects_of(i) for i in spec_items], keys)]

    xfails = _xfails(config, state.impl)
    matched = set()
    for item in spec_items:
        key = test_id(item)
        key = key if key in xfails else item.nodeid if item.nodeid in xfails else None
        if key:
            matched.add(key)
            reason = f"expected failure for {state.impl.label}: {xfails[key]}"
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    stale = sorted(set(xfails) - matched)
    if stale:  # harmless when only part of the suite was collected; otherwise a stale entry
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(f"{len(stale)} expected-failure entries match no collected test: {stale[:5]}"), 2
        )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    state = session.config._spec
    if state is None:
        return
    from . import rejudging

    rejudging.rejudge(session, state)
    rejudging.promote_charged(session, state)
    from ..judging import tolerance_measurement

    tolerance_measurement.dump()
    recording = getattr(session.config, "_spec_recording", None)
    if recording is not None:
        recording.save()
    if state.torch_threads is not None:
        import torch

        torch.set_num_threads(state.torch_threads)
    worker = getattr(state.impl, "worker", None)
    if worker is not None:
        worker.close()


def pytest_report_header(config):
    if config._spec is None and not any(Path(a).resolve() == SUITE_DIR for a in config.args if os.path.exists(a)):
        return None
    try:
        impl = session_of(config).impl
    except pytest.UsageError:
        return None
    spec = impl_spec(config)
    hint = (
        "  (the reference: the ground truth itself. To check your code: --impl=student or --impl=path/to/code)"
        if spec == "reference"
        else ""
    )
    caps = ",".join(sorted(impl.capabilities))
    return (
        f"spec suite: checking {impl.label}{hint}\n"
        f"  ROPE_STYLE={impl.rope_style} FAMILIES={','.join(impl.families)} CAPABILITIES={caps} "
        f"device={config.getoption('spec_device')}"
    )


# ------------------------------------------------------------------------------------------------
# running one test
# ------------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not is_spec_item(item):
        return
    state = session_of(item.config)
    subjects, uses = markers.subjects_of(item)
    item._spec_run = rootcause.ItemRun(
        test_id(item),
        markers.component_of(item),
        subjects,
        uses,
        tuple(markers.bug_classes_of(item)),
        started=state.registry.tick(),
    )
    if not item.config.getoption("spec_tb"):
        _short_failures(item)
    state.impl.begin_test()
    state.impl.require(*subjects, *markers.needed_of(item))  # subject first: skip before any setup runs


def _short_failures(item) -> None:
    """A failure the suite explains itself is represented by its short report from the start.

    pytest (and Hypothesis, for each distinct failing example) builds a failure's long traceback
    before ``pytest_runtest_makereport`` replaces it with the short report: it parses every source file
    of every frame again, which cost about half of a failing run's time. The long form is still there
    for anything else, and with ``--spec-tb``."""
    if "repr_failure" in vars(item):
        return
    original = item.repr_failure

    def repr_failure(excinfo, *args, **kwargs):
        from .terminal import short_report

        return short_report(excinfo.value) or original(excinfo, *args, **kwargs)

    item.repr_failure = repr_failure


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    run = getattr(item, "_spec_run", None)
    if run is None:
        return (yield)
    try:
        result = yield
    except BaseException as exc:
        state = session_of(item.config)
        spec = item.funcargs.get("spec")

        def rerun(names):
            """The test on the reference composed with the implementation's ``names`` (consequences.py)."""
            from ..judging.consequences import composed

            if spec is None:
                raise RuntimeError("no spec fixture")
            with composed(state.reference, state.impl, names) as comp:
                saved_impl = spec.impl
                spec.results, spec._labels, spec.impl, spec.composing = [], {}, state.reference, True
                try:
                    item.runtest()
                except BaseException as again:
                    again.composition = comp
                    raise
                finally:
                    spec.impl, spec.composing = saved_impl, False
            return comp

        saved = list(run.results)
        expected = item.get_closest_marker("xfail") is not None
        with state.impl.diagnosing():
            raised = rootcause.judge_failure(
                run, exc, state.impl, state.reference, state.registry, rerun, expected=expected
            )
        run.results[:] = saved if raised is exc else [*saved, *(raised.result and [raised.result] or [])]
        run.failure = raised
        if raised is exc:
            raise
        raise raised from None
    run.set_verdict("passed")
    session_of(item.config).registry.mark_passed(run.subjects)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    run = getattr(item, "_spec_run", None)
    if run is None:
        return report
    if report.when == "call" or (report.when == "setup" and report.skipped):
        if report.skipped and run.verdict is None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            run.set_verdict("xfailed" if hasattr(report, "wasxfail") else "skipped", message=str(reason))
        elif hasattr(report, "wasxfail") and run.verdict is not None:
            run.verdict.status = "xfailed" if report.skipped else run.verdict.status
        report.user_properties.append((RESULTS_KEY, [r.to_json() for r in run.results]))
        if run.verdict is not None:
            report.user_properties.append((VERDICT_KEY, run.verdict.to_json()))
            report._spec_state = session_of(item.config)
    if report.failed and call.excinfo is not None and not item.config.getoption("spec_tb"):
        from .terminal import short_report

        line = short_report(call.excinfo.value)
        if line:
            report.longrepr = line
    return report


# ------------------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------------------


def pytest_report_teststatus(report, config):
    if report.when != "call" or not report.failed or hasattr(report, "wasxfail") or getattr(report, "_spec_charged", 0):
        return None
    from .terminal import OWN_CATEGORIES, category

    name = category(verdict_of(report))
    return (name, *OWN_CATEGORIES[name]) if name else None


def pytest_runtest_logreport(report):
    verdict = verdict_of(report)
    state = getattr(report, "_spec_state", None)
    if verdict is not None and state is not None:
        state.verdicts[verdict.test] = verdict


def pytest_terminal_summary(terminalreporter, config):
    state = config._spec
    if state is None or not state.verdicts:
        return
    from .terminal import summary_lines

    terminalreporter.write_sep("=", f"spec summary: {state.impl.label}")
    for line in summary_lines(state.impl.label, list(state.verdicts.values()), state.registry.failing):
        terminalreporter.write_line(line)
