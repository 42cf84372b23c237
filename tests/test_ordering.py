"""The order spec tests run in (``spec_tests/harness/plugin/ordering.py``): a consequence is decided as the
tests run, against the upstream failures seen so far, so every test must run after the tests of every name
its verdict may rest on; only names that rest on each other (a cycle) are exempt."""

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
