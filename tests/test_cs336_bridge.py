"""The CS336 bridge (``--impl=cs336:<checkout>``, ``spec_adapters/cs336.py``) on checkouts written
here in the course's style: ``tests/fixtures_cs336/good`` (nn.Module classes loaded with
``load_state_dict`` in ``tests/adapters.py``, as the course's handout suggests) passes every test it
is given, and a copy with two bugs fails them, naming the catalogued bug and the student's own file
and line (never the bridge's).

The suite runs in a fork of a runner's interpreter (tests/ahead.py) or in this one (``pytester``), but on the
buggy copy in a fresh one: both checkouts are the
package ``cs336_basics``, which the bridge imports by name from the checkout it puts on ``sys.path``,
so in an interpreter that has imported the good one (test_the_bridge_maps_names_only does) the good
code would answer for the buggy copy. That one runs in a fresh interpreter."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ahead import run_ahead  # tests/ahead.py: run by a runner process while other tests run
from suite_subprocess import run_forked, run_inline

GOOD = Path(__file__).resolve().parent / "fixtures_cs336" / "good"

pytest_plugins = ["pytester"]


def suite(impl: str, *args: str, pytester=None, forked: bool = False) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "spec_tests",
        f"--impl={impl}",
        "-q",
        "-p",
        "no:warnings",
        "-p",
        "no:cacheprovider",
    ]
    root = Path(__file__).resolve().parents[1]
    if pytester is not None:  # in this interpreter
        return run_inline(pytester, *cmd[3:], *args, cwd=root)
    if forked:  # in a fork of this interpreter (a runner's)
        return run_forked(*cmd[3:], *args, cwd=root)
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=900, cwd=root)


def counts(output: str) -> dict[str, int]:
    tail = output.strip().splitlines()[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|not implemented|error)", tail)}


@run_ahead
def test_a_correct_checkout_passes_what_the_assignment_has():
    proc = suite(f"cs336:{GOOD}", "-rf", forked=True)
    found = counts(proc.stdout)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert found.get("failed", 0) == 0, proc.stdout[-4000:]
    assert found.get("passed", 0) >= 60, found
    # build_model without weights: the table has no initialisation; said as "not implemented", once each
    assert "the course's table has no initialisation" in proc.stdout


@run_ahead
def test_a_buggy_checkout_fails_at_the_students_own_line(tmp_path):
    bad = shutil.copytree(GOOD, tmp_path / "student_checkout", ignore=shutil.ignore_patterns("__pycache__"))
    model = (bad / "cs336_basics" / "model.py").read_text()
    eps = "rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)"
    dim = "shifted = x - x.amax(dim=dim, keepdim=True)"
    assert eps in model and dim in model
    model = model.replace(eps, "rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps")
    (bad / "cs336_basics" / "model.py").write_text(
        model.replace(dim, "shifted = x - x.amax(dim=dim + 7, keepdim=True)")
    )
    proc = suite(f"cs336:{bad}", "-k", "test_rmsnorm or test_softmax_over_given_dim")
    out = proc.stdout
    assert proc.returncode == 1 and counts(out).get("failed", 0) >= 5, out[-3000:]
    assert "matches known bug rmsnorm_eps_outside_root" in out
    assert re.search(r"raised at student_checkout/cs336_basics/model\.py:\d+ in softmax", out), out[-3000:]
    assert "cs336.py" not in out  # the bridge's frames are never shown as the place


def test_a_folder_without_the_table_is_a_clear_usage_error(tmp_path, pytester):
    proc = suite(f"cs336:{tmp_path}", pytester=pytester)
    assert proc.returncode != 0
    assert "tests/adapters.py" in proc.stdout + proc.stderr and str(tmp_path) in proc.stdout + proc.stderr


def test_the_bridge_maps_names_only():
    """Each mapped function calls the table's function it is named after (no computation of its own),
    and what the assignment lacks is not defined (so the suite says "not provided")."""
    from spec_adapters import cs336

    impl = cs336.load(GOOD)
    assert impl.FAMILIES == ("llama",) and "gqa" not in impl.CAPABILITIES and "linear_bias" not in impl.CAPABILITIES
    for missing in ("layernorm", "gelu_mlp", "flash_attention", "repeat_kv", "sample", "generate", "train_step"):
        assert not hasattr(impl, missing), missing
    import torch

    calls = []
    table = impl.CS336_TABLE
    original = table.run_softmax
    table.run_softmax = lambda x, dim: calls.append(dim) or original(x, dim)
    try:
        x = torch.randn(2, 3, dtype=torch.float64)
        assert torch.allclose(impl.softmax(x, 0), torch.softmax(x, 0))
    finally:
        table.run_softmax = original
    assert calls == [0]
    with pytest.raises(NotImplementedError, match="bias"):
        impl.linear(torch.zeros(1, 2), torch.zeros(3, 2), torch.zeros(3))
