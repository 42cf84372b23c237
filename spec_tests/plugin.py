"""The pytest plugin behind ``pytest spec_tests --impl=NAME`` (registered as a ``pytest11`` entry
point, and by ``spec_tests/conftest.py`` when the suite is not installed).

It loads the implementation, provides the ``impl``, ``spec`` and ``device`` fixtures, turns
"not provided" into skips and "not implemented" into one-line failures, applies the
implementation's expected-failure list, and sets the Hypothesis profiles.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from .impl_loading import ACCEPTED_FORMS, ImplImportError, ImplUsageError, load_implementation

HYPOTHESIS_PROFILES = {
    # name: (max_examples, derandomize)
    "dev": (40, False),
    "ci": (10, True),
    "grading": (10, True),
}


def _register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    for name, (examples, derandomize) in HYPOTHESIS_PROFILES.items():
        settings.register_profile(
            name,
            max_examples=examples,
            derandomize=derandomize,
            deadline=None,
            database=None if derandomize else settings.default.database,
            print_blob=False,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.function_scoped_fixture,
            ],
        )


# Registered on import, not in pytest_configure: Hypothesis's own plugin may load the profile
# named by --hypothesis-profile before this plugin's pytest_configure runs.
_register_hypothesis_profiles()


def pytest_addoption(parser):
    group = parser.getgroup("spec", "transformer spec suite")
    group.addoption(
        "--impl",
        default=os.environ.get("SPEC_IMPL", "reference"),
        help=f"implementation to check: {ACCEPTED_FORMS} (default: $SPEC_IMPL or reference)",
    )
    group.addoption("--device", default="cpu", choices=("cpu", "cuda"), help="device to run on (default cpu)")
    group.addoption(
        "--xfails-file",
        default=None,
        help="TOML file of expected failures, [xfail] 'test id' = 'reason' (default: the implementation's SPEC_XFAILS)",
    )
    # recording / replaying expected values (issue 5; see expectations.py)
    group.addoption(
        "--record-expectations",
        metavar="DIR",
        default=None,
        help="also record every expected value (live reference) to DIR/expected-<ROPE_STYLE>.pt",
    )
    group.addoption(
        "--replay-expectations",
        metavar="DIR",
        default=None,
        help="take expected values from DIR/expected-<ROPE_STYLE>.pt instead of the live reference "
        "(default where the suite ships recordings, as a handout does: spec_tests/recorded/)",
    )


def pytest_configure(config):
    for marker in (
        "component(name): the protocol component a test checks",
        "bug_class(*names): the classic bug classes a test is designed to catch",
        "needs_live_reference: the test draws inputs at run time, so recorded expected values cannot serve it",
        # grading metadata (issue 5; tools/grade.py, rubric.toml can override both)
        "points(weight): the test's weight within its component when graded (default 1)",
        "visibility(name): Gradescope visibility when graded: visible | hidden | after_due_date | after_published",
    ):
        config.addinivalue_line("markers", marker)
    if config.getoption("hypothesis_profile", None) is None:
        from hypothesis import settings

        settings.load_profile(os.environ.get("SPEC_HYPOTHESIS_PROFILE", "ci"))
    import torch

    # The suite's tensors are tiny: one thread is fastest, and on a shared 2-core machine a
    # spinning thread pool makes a 50 us matmul take milliseconds. SPEC_TORCH_THREADS overrides.
    torch.set_num_threads(int(os.environ.get("SPEC_TORCH_THREADS", "1")))
    if config.getoption("device") == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError("--device cuda: torch.cuda.is_available() is False on this machine")
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
        torch.backends.cudnn.allow_tf32 = False
    config._spec_impl = None


def _implementation(config):
    """Load the implementation once per session (errors become a single usage error)."""
    if config._spec_impl is None:
        from .implementation import Implementation

        spec = config.getoption("impl")
        try:
            obj, label = load_implementation(spec)
            config._spec_impl = Implementation(obj, label)
        except (ImplUsageError, ImplImportError, ValueError) as exc:
            raise pytest.UsageError(str(exc)) from None
    return config._spec_impl


def _xfails(config, impl) -> dict[str, str]:
    source = config.getoption("xfails_file") or getattr(impl.obj, "SPEC_XFAILS", None)
    if source is None:
        return {}
    if isinstance(source, dict):
        return dict(source)
    path = Path(source)
    if not path.is_absolute() and getattr(impl.obj, "__file__", None) and not path.exists():
        path = Path(impl.obj.__file__).parent / path
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise pytest.UsageError(f"expected-failure file {path}: {exc}") from None
    return dict(table.get("xfail", {}))


def pytest_sessionfinish(session):
    from . import expectations, tolerance_measurement

    tolerance_measurement.dump()
    expectations.finish(session)  # writes the recording of --record-expectations (issue 5)


def _is_spec_item(item) -> bool:
    return "impl" in getattr(item, "fixturenames", ()) or "spec" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config, items):
    spec_items = [item for item in items if _is_spec_item(item)]
    if not spec_items:
        return
    impl = _implementation(config)
    from .expectations import live_tests_excluded

    if live_tests_excluded(config):  # replaying a recording made without them (issue 5: handouts)
        live = [item for item in items if item.get_closest_marker("needs_live_reference")]
        if live:
            config.hook.pytest_deselected(items=live)
            items[:] = [item for item in items if not item.get_closest_marker("needs_live_reference")]
            spec_items = [item for item in spec_items if not item.get_closest_marker("needs_live_reference")]
    xfails = _xfails(config, impl)
    matched = set()
    for item in spec_items:
        test_id = item.nodeid.split("spec_tests/", 1)[-1]
        key = test_id if test_id in xfails else item.nodeid if item.nodeid in xfails else None
        if key:
            matched.add(key)
            item.add_marker(pytest.mark.xfail(reason=f"expected failure for {impl.label}: {xfails[key]}", strict=True))
    stale = sorted(set(xfails) - matched)
    if stale:  # harmless when only part of the suite was collected; otherwise a stale entry
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(f"{len(stale)} expected-failure entries match no collected test: {stale[:5]}"), 2
        )


def pytest_report_header(config):
    impl = config._spec_impl
    try:
        impl = impl or _implementation(config)
    except pytest.UsageError:
        return None
    from hypothesis import settings

    return (
        f"spec suite: impl={impl.label} ROPE_STYLE={impl.rope_style} FAMILIES={','.join(impl.families)} "
        f"device={config.getoption('device')} hypothesis-profile={settings._current_profile}"
    )


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (``--impl``)."""
    return _implementation(request.config)


@pytest.fixture(scope="session")
def device(request) -> str:
    return request.config.getoption("device")


@pytest.fixture(scope="session")
def expectations(request, impl, device):
    """Live reference, or recording / replaying (``--record-expectations``, ``--replay-expectations``)."""
    from .expectations import expectations_for

    return expectations_for(request.config, impl, device)


@pytest.fixture
def spec(request, impl, expectations, device):
    """Per-test access to the implementation, expected values and comparisons."""
    from .checking import Spec

    return Spec(impl, expectations, device, request.node.nodeid)


@pytest.fixture(params=("llama", "gpt2"))
def family(request, impl):
    """Both model families; a family missing from the implementation's FAMILIES is skipped."""
    impl.require_family(request.param)
    return request.param


def _one_line(exc: BaseException) -> str | None:
    """The short report for failures the suite explains itself."""
    from .assertions import SpecFailure
    from .implementation import NotImplementedInImpl

    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            line = _one_line(inner)
            if line:
                return line
        return None
    notes = "".join(f"\n  {n}" for n in getattr(exc, "__notes__", ()) if "Falsifying" in n or "draw" in n)
    if isinstance(exc, NotImplementedInImpl):
        return f"not implemented: {exc}"
    if isinstance(exc, NotImplementedError):
        return f"not implemented: {exc or 'NotImplementedError'}"
    if isinstance(exc, SpecFailure):
        return str(exc) + notes
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and _is_spec_item(item):
        line = _one_line(call.excinfo.value)
        if line:
            report.longrepr = line
