"""The order spec tests run in (``spec_tests/harness/plugin/ordering.py``): a consequence is decided as the
tests run, against the upstream failures seen so far, so every test must run after the tests of every name
its verdict may rest on; only names that rest on each other (a cycle) are exempt."""

import itertools
import os
import subprocess
import sys
import textwrap

from suite_subprocess import ROOT

from spec_tests.harness.plugin.ordering import levels, rests_on

PROBE = """
import json, os
import pytest
from spec_tests.harness.plugin import markers

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rows = [[it.nodeid, *map(list, markers.subjects_of(it))] for it in items]
    with open(os.environ["ORDER_OUT"], "w") as f:
        json.dump(rows, f)
"""


def collected_order(tmp_path) -> list[tuple[str, tuple, tuple]]:
    (tmp_path / "order_probe.py").write_text(textwrap.dedent(PROBE))
    out = tmp_path / "order.json"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "ORDER_OUT": str(out)}
    args = [sys.executable, "-m", "pytest", str(ROOT / "spec_tests"), "--collect-only", "-q", "-p", "order_probe"]
    proc = subprocess.run([*args, "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    return [(nodeid, tuple(s), tuple(u)) for nodeid, s, u in json.loads(out.read_text())]


def too_early(order) -> list[tuple[str, list[str]]]:
    """Tests that run before a test of a name they rest on, outside their own cycle."""
    level = levels((s, u) for _, s, u in order)
    last = {name: i for i, (_, subjects, _) in enumerate(order) for name in subjects}
    found = []
    for i, (nodeid, subjects, uses) in enumerate(order):
        mine = max(level[s] for s in subjects)
        late = sorted(n for n in rests_on(subjects, uses) if last.get(n, -1) > i and level[n] < mine)
        if late:
            found.append((nodeid, late))
    return found


def test_every_test_runs_after_the_tests_its_verdict_may_rest_on(tmp_path):
    """No spec test runs before a test of a name it uses or may call (as ``@judges`` and MAY_CALL say); the
    control, the same tests in reverse, has such tests."""
    order = collected_order(tmp_path)
    assert len(order) > 400
    assert too_early(order) == []
    assert len(too_early(order[::-1])) > 100


def test_levels_put_a_cycle_on_one_level_above_what_it_rests_on():
    """Names that rest on each other share a level; a name resting on the cycle is above it."""
    declared = [
        (("rmsnorm",), ()),
        (("forward",), ("build_model",)),
        (("build_model",), ("forward",)),
        (("generate",), ("build_model",)),
    ]
    level = levels(declared)
    assert level["rmsnorm"] == 0
    assert level["forward"] == level["build_model"] > level["rmsnorm"]
    assert level["generate"] > level["forward"]


REVERSE_CYCLE = """
import os
import pytest
from spec_tests.harness.plugin import markers

CYCLE = {"build_model", "forward", "new_cache", "cache_kv", "canonical_state_dict"}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    at = [i for i, it in enumerate(items) if set(markers.subjects_of(it)[0]) & CYCLE]
    for i, item in zip(at, [items[i] for i in at][::-1]):
        items[i] = item
    if os.environ.get("NO_REJUDGING"):  # the control: verdicts as the tests ran
        from spec_tests.harness.plugin import rejudging

        rejudging.rejudge = lambda session, state: []
"""

CYCLE_FILES = ("test_model.py", "test_kv_cache.py", "test_batched_generation.py", "test_sliding_window.py")


def verdicts(tmp_path, bug: str, *plugins: str, **env) -> tuple[dict[str, str], list[str]]:
    """Each test's outcome (pytest's -rA word) and the root-cause lines of a run on ``bug``."""
    (tmp_path / "reverse_cycle.py").write_text(textwrap.dedent(REVERSE_CYCLE))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", **env}
    files = [str(ROOT / "spec_tests" / f) for f in CYCLE_FILES]
    args = [sys.executable, "-m", "pytest", *files, f"--impl=bug:{bug}", "-q", "-rA", "-p", "no:cacheprovider"]
    for plugin in plugins:
        args += ["-p", plugin]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    words = ("PASSED", "FAILED", "ERROR", "CONSEQUENCE", "NOT IMPLEMENTED", "SKIPPED", "XFAIL")
    outcome = {}
    for line in lines:
        word = next((w for w in words if line.startswith(w + " ")), None)
        if word:
            outcome[line[len(word) + 1 :].split(" - ")[0].strip()] = word
    start = next((i for i, line in enumerate(lines) if line.startswith("root causes")), len(lines))
    # the root-cause lines only: pytest prints the short summary's messages whole, indented, where CI is set
    roots = list(itertools.takewhile(lambda line: line.startswith("  "), lines[start + 1 :]))
    assert outcome and roots, proc.stdout[-3000:] + proc.stderr[-3000:]
    return outcome, roots


def test_the_order_of_the_model_cycle_decides_no_verdict(tmp_path):
    """The model, its cache and its state dict rest on each other, so no order puts every cause first; a charged
    failure that ran before a name it rests on failed is judged again once the run has ended (plugin/rejudging.py).
    With the cycle's tests reversed, a model bug (post-LN: forward's tests last) and a loading crash (build_model's
    tests last) get the same verdicts and roots as in the suite's order; the control, the reversed run's verdicts as
    the tests ran, differs for both."""
    for bug in ("post_ln", "tied_weights_copied"):
        usual = verdicts(tmp_path, bug)
        assert verdicts(tmp_path, bug, "reverse_cycle") == usual, bug
        assert verdicts(tmp_path, bug, "reverse_cycle", NO_REJUDGING="1") != usual, bug


def test_a_second_run_stands_only_as_a_consequence_failing_what_the_first_failed():
    """A test judged again after the run replaces its first verdict only where it is now a consequence and fails every
    check the first run failed: code that answers otherwise when asked again (passes, or fails elsewhere) gains
    nothing; a charged second run changes nothing either."""
    from spec_tests.harness.judging.results import CheckResult, Status
    from spec_tests.harness.judging.rootcause import ItemRun
    from spec_tests.harness.plugin.rejudging import replaces

    def run(status, failed=(), passed=()):
        r = ItemRun("t", "kv_cache", ("new_cache",), ("forward",))
        r.results = [CheckResult("t", "new_cache", "kv_cache", b, outcome="failed") for b in failed]
        r.results += [CheckResult("t", "new_cache", "kv_cache", b) for b in passed]
        r.set_verdict(status)
        return r

    first = run(Status.FAILED, failed=["cache contents"])
    assert replaces(first, run(Status.CONSEQUENCE, failed=["cache contents", "deferred to forward"]))
    assert not replaces(first, run(Status.CONSEQUENCE, failed=["deferred to forward"], passed=["cache contents"]))
    assert not replaces(first, run(Status.FAILED, failed=["cache contents"]))
    assert not replaces(first, run(Status.PASSED, passed=["cache contents"]))


def test_a_second_run_that_would_make_two_failures_consequences_of_each_other_is_not_taken():
    """Settling charges a cycle of consequences (nothing pays for it): a second run that would close one keeps the
    first verdict; one that settles to a charged root is taken."""
    from spec_tests.harness.judging.results import Status, TestVerdict
    from spec_tests.harness.plugin.rejudging import settles

    cache_test = TestVerdict("cache", "kv_cache", ["new_cache"], Status.CONSEQUENCE, ["forward"])
    forward_test = TestVerdict("padded", "model", ["forward"], Status.FAILED)
    verdicts = {"cache": cache_test, "padded": forward_test}
    assert not settles(verdicts, TestVerdict("padded", "model", ["forward"], Status.CONSEQUENCE, ["new_cache"]))
    rooted = {**verdicts, "rope": TestVerdict("rope", "positions", ["rope"], Status.FAILED)}
    assert settles(rooted, TestVerdict("padded", "model", ["forward"], Status.CONSEQUENCE, ["rope"]))
