"""tools/grade.py end to end: rubric, reports, batch, determinism, isolation and integrity.

One batch of submissions is graded twice on the norms tests only (to stay fast): a correct one
(the reference under another name), the skeleton, one that imports ``reference`` at import time,
one with a catalogued bug (diagnosis), and a "chaos" one whose functions loop forever, abort the
process, call ``sys.exit``, exhaust memory, read the recorded expected values, import the
reference and start a process, each in a different test.
"""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRADE = [sys.executable, str(ROOT / "tools" / "grade.py")]
sys.path.insert(0, str(ROOT))

SELECT = "test_norms"
RUBRIC = """
total = 100
[components]
norms = 1
[limits]
test_timeout_s = 2
memory_mb = 2048
[[tests]]
match = "test_norms.py::test_norm_statistics_in_at_least_float32*"
visibility = "hidden"
[[tests]]
match = "test_norms.py::test_rmsnorm"
weight = 2
"""

CHAOS = """

import glob as _glob
import os as _os
import subprocess as _subprocess
import sys as _sys

_good_rmsnorm, _good_layernorm = rmsnorm, layernorm


def rmsnorm(x, weight, eps=1e-5):
    small = bool(x.abs().max() < 0.1)
    if x.dtype == torch.float64 and small:
        while True:  # an infinite loop
            pass
    if x.dtype == torch.float32 and not small:
        _os.abort()  # a crash
    if x.dtype == torch.float32 and small:
        _sys.exit(3)
    if x.dtype == torch.float16:
        hog = []
        while True:  # runaway memory
            hog.append(torch.empty(2**28, dtype=torch.uint8))
    return _good_rmsnorm(x, weight, eps)


def layernorm(x, weight, bias, eps=1e-5):
    small = bool(x.abs().max() < 0.1)
    if x.dtype == torch.float64 and not small:
        for path in _glob.glob(CACHE + "/*/expected-interleaved.pt"):
            with open(path, "rb") as f:  # read the recorded expected values
                f.read()
    if x.dtype == torch.float64 and small:
        import reference  # noqa: F401
    if x.dtype == torch.float32 and not small:
        _subprocess.run(["cat", "/etc/hostname"], check=True)
    return _good_layernorm(x, weight, bias, eps)
"""


def copy_package(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def make_submissions(folder: Path, cache: Path) -> list[str]:
    copy_package(ROOT / "reference", folder / "good")
    copy_package(ROOT / "student", folder / "skeleton")
    cheat = copy_package(ROOT / "reference", folder / "cheat_import")
    (cheat / "__init__.py").write_text("import reference  # borrow the answers\n" + (cheat / "__init__.py").read_text())
    chaos = copy_package(ROOT / "reference", folder / "chaos")
    norms = chaos / "norms.py"
    norms.write_text(norms.read_text() + CHAOS.replace("CACHE", repr(str(cache))))
    names = ["chaos", "cheat_import", "good", "skeleton"]
    try:
        from spec_tests.bugs import apply_patch, get_bug, reference_sources
    except ImportError:
        return names
    buggy = folder / "buggy"
    buggy.mkdir()
    for stem, text in apply_patch(get_bug("rmsnorm_eps_outside_root"), reference_sources()).items():
        (buggy / f"{stem}.py").write_text(text)
    return [*names, "buggy"]


def grade(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*GRADE, *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=600)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The batch graded into out1/, and its chaos submission again into out2/ (determinism)."""
    tmp = tmp_path_factory.mktemp("grading")
    cache = tmp / "cache"
    names = make_submissions(tmp / "subs", cache)
    rubric = tmp / "rubric.toml"
    rubric.write_text(RUBRIC)
    runs = []
    again = [str(tmp / "subs" / "chaos")]  # the richest: timeouts, a crash, limits, refusals
    for n, impls in ((1, [str(tmp / "subs")]), (2, again)):
        out = tmp / f"out{n}"
        started = time.monotonic()
        impl_args = [a for impl in impls for a in ("--impl", impl)]
        proc = grade(
            *impl_args,
            "--select",
            SELECT,
            "--cache-dir",
            str(cache),
            "--rubric",
            str(rubric),
            "--out-dir",
            str(out),
            "--gradescope",
            "results.json",
            "--markdown",
            "report.md",
            "--junit",
            "report.xml",
            "--csv",
            str(out / "gradebook.csv"),
            "--jobs",
            "3",
            "--failures",
        )
        runs.append((proc, out, time.monotonic() - started))
    return {"tmp": tmp, "names": names, "again": [Path(p).name for p in again], "runs": runs, "cache": cache}


def results(batch, name, run=0) -> dict:
    return json.loads((batch["runs"][run][1] / name / "results.json").read_text())


def outputs_containing(res: dict, text: str) -> list[dict]:
    return [t for t in res["tests"] if text in t.get("output", "")]


def test_batch_exits_zero_and_writes_every_report(batch):
    proc, out, _ = batch["runs"][0]
    assert proc.returncode == 0, proc.stderr
    assert "grading [" in proc.stderr  # the progress bar
    for name in batch["names"]:
        for f in ("results.json", "report.md", "report.xml"):
            assert (out / name / f).is_file(), f"{name}/{f} missing"
        ET.parse(out / name / "report.xml")
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    assert sorted(r["submission"] for r in rows) == sorted(batch["names"])
    assert {r["submission"]: r["status"] for r in rows}["cheat_import"] == "could not run"


def test_gradescope_results_follow_the_specification(batch):
    res = results(batch, "good")
    assert set(res) >= {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests", "leaderboard"}
    assert isinstance(res["execution_time"], int) and res["visibility"] == "visible"
    assert res["score"] == 100.0 and len(res["tests"]) == 10
    for t in res["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "tags", "visibility", "number"}
        assert t["status"] == "passed" and t["score"] == t["max_score"] > 0
        assert t["tags"][0] == "norms" and t["number"].startswith("1.")
    assert round(sum(t["max_score"] for t in res["tests"]), 2) == 100.0
    # weight 2 for test_rmsnorm (4 cases) against 1 each for layernorm (4) and the statistics test (2)
    rms = [t["max_score"] for t in res["tests"] if t["name"].startswith("rmsnorm =")]
    ln = [t["max_score"] for t in res["tests"] if t["name"].startswith("layernorm =")]
    assert len(rms) == 4 and len(ln) == 4 and abs(sum(rms) - 2 * sum(ln)) < 0.02


def test_skeleton_scores_zero_with_one_line_reasons(batch):
    res = results(batch, "skeleton")
    assert res["score"] == 0.0
    visible = [t for t in res["tests"] if t["visibility"] == "visible"]
    assert visible and all(t["status"] == "failed" and t["output"].startswith("not implemented: ") for t in visible)


def test_hidden_tests_show_a_fixed_message(batch):
    for name in ("skeleton", "chaos"):
        hidden = [t for t in results(batch, name)["tests"] if t["visibility"] == "hidden"]
        assert len(hidden) == 2
        assert {t["output"] for t in hidden} == {
            "This test is hidden: it counts towards your score, but its details are not shown."
        }
    md = (batch["runs"][0][1] / "chaos" / "report.md").read_text()
    assert "memory" not in md and "2 hidden tests" in md


def test_importing_the_reference_at_import_time_could_not_run(batch):
    res = results(batch, "cheat_import")
    assert res["score"] == 0.0
    first = res["tests"][0]
    assert first["name"] == "Could not run your implementation" and first["visibility"] == "visible"
    assert "importing 'reference' is not allowed" in first["output"] and "submission/__init__.py:1" in first["output"]
    assert any(t["name"].startswith("Integrity") for t in res["tests"])
    assert "Could not run" in res["output"]


def test_chaos_costs_only_the_affected_tests(batch):
    res = results(batch, "chaos")
    failed = {t["name"]: t.get("output", "") for t in res["tests"] if t["status"] == "failed"}
    passed = [t["name"] for t in res["tests"] if t["status"] == "passed"]
    expect = {
        "[small-f64]": "timed out: the test did not finish within 2 s",
        "[unit-f32]": "aborted (SIGABRT",
        "[small-f32]": "your code called sys.exit(3)",
    }
    for params, text in expect.items():
        [msg] = [m for n, m in failed.items() if n.startswith("rmsnorm =") and n.endswith(params)]
        assert text in msg, msg
    [read] = [m for n, m in failed.items() if n.startswith("layernorm =") and n.endswith("[unit-f64]")]
    assert "reading 'expected-interleaved.pt' is not allowed while grading" in read
    [imp] = [m for n, m in failed.items() if n.startswith("layernorm =") and n.endswith("[small-f64]")]
    assert "importing 'reference' is not allowed while grading" in imp
    [spawn] = [m for n, m in failed.items() if n.startswith("layernorm =") and n.endswith("[unit-f32]")]
    assert "starting a process is not allowed while grading" in spawn
    # the memory hog is a hidden test: its result counts, its message stays in the staff view
    assert sorted(n.split("[")[-1] for n in passed) == ["layernorm]", "small-f32]", "unit-f64]"]
    integrity = "\n".join(t["output"] for t in res["tests"] if t["name"].startswith("Integrity"))
    for what in ("reading 'expected-interleaved.pt'", "importing 'reference'", "starting a process"):
        assert what in integrity
    assert "Integrity:" in res["output"]


def test_staff_output_shows_hidden_failures_and_flags(batch):
    text = batch["runs"][0][0].stdout  # --failures: every test not passed, hidden ones included
    assert "ran out of memory (graded code may use at most 2048 MiB)" in text
    assert "FLAG (staff): norms.py" in text  # static flags point staff at the suspicious lines


def test_diagnosis_reaches_the_report(batch):
    if "buggy" not in batch["names"]:
        pytest.skip("bug catalog not available")
    res = results(batch, "buggy")
    assert 0 < res["score"] < 100
    assert outputs_containing(res, "matches known bug rmsnorm_eps_outside_root")


def test_grading_is_deterministic(batch):
    (p1, out1, t1), (p2, out2, t2) = batch["runs"]
    assert p2.returncode == 0, p2.stderr
    for name in batch["again"]:
        a, b = results(batch, name, 0), results(batch, name, 1)
        a.pop("execution_time"), b.pop("execution_time")
        assert a == b, name
        for f in ("report.md", "report.xml"):
            assert (out1 / name / f).read_text() == (out2 / name / f).read_text(), f"{name}/{f}"
    rows1 = [r for r in (out1 / "gradebook.csv").read_text().splitlines()[1:] if r.split(",")[0] in batch["again"]]
    assert sorted(rows1) == sorted((out2 / "gradebook.csv").read_text().splitlines()[1:])


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--impl is required"),
        (["--impl", "no/such/dir"], "no such file or folder"),
        (["--impl", "student", "--rubric", "no-such-rubric.toml"], "rubric"),
        (["--impl", "student", "--test-timeout", "-1"], "must be positive"),
    ],
)
def test_usage_errors_exit_2(args, message):
    proc = grade(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_malformed_rubric_is_a_usage_error(tmp_path):
    bad = tmp_path / "rubric.toml"
    bad.write_text('total = 100\n[[tests]]\nmatch = "x"\nvisibility = "secret"\n')
    proc = grade("--impl", "student", "--rubric", str(bad))
    assert proc.returncode == 2 and "visibility must be one of" in proc.stderr


def test_default_rubric_loads_and_sums_to_its_total():
    from tools.grading.rubric import assign, load_rubric

    rubric = load_rubric(ROOT / "rubric.toml")
    tests = [
        {
            "id": f"test_{c}.py::test_x[{i}]",
            "file": f"test_{c}.py",
            "function": "test_x",
            "params": str(i),
            "doc": "",
            "component": c,
            "bug_classes": [],
            "points": None,
            "visibility": None,
            "live": False,
        }
        for c in rubric.components
        for i in range(3)
    ]
    graded = assign(tests, rubric)
    assert round(sum(t.max_score for t in graded), 2) == rubric.total


def test_watchdog_kills_a_child_that_ignores_its_alarm(tmp_path):
    """The parent's own limit: a child that never reports back is killed and the test charged."""
    from tools.grading.runner import Limits, RunResult, _watch

    events = tmp_path / "events.jsonl"
    events.write_text("")
    code = (
        "import json, signal, time, sys\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        f"f = open({str(events)!r}, 'a'); f.write(json.dumps({{'event': 'begin', 'nodeid': 't1'}}) + '\\n'); f.flush()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    result = RunResult()
    started = time.monotonic()
    stop, current, seen = _watch(
        proc, events, Limits(test_timeout_s=0.2, kill_grace_s=0.5), started, result, ["t1", "t2"], None
    )
    assert (stop, current, seen) == ("test_timeout", "t1", 0)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - started < 10
    proc2 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    stop, current, _ = _watch(proc2, events, Limits(run_timeout_s=0.5), time.monotonic(), RunResult(), ["t2"], None)
    assert stop == "run_timeout" and proc2.returncode == -signal.SIGKILL


def test_guard_refuses_reference_and_recordings_in_process(tmp_path):
    """The guard's two mechanisms, checked in a fresh interpreter (audit hooks cannot be removed)."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from tools.grading.guard import Guard, BlockedImport, BlockedAccess
seen = []
Guard([{str(ROOT / "reference")!r}], None, on_block=lambda what, where: seen.append(what)).install()
try:
    import reference
except BlockedImport as exc:
    print("import:", exc)
try:
    open({str(ROOT / "reference" / "__init__.py")!r}).read()
except BlockedAccess as exc:
    print("open:", exc)
try:
    open({str(tmp_path / "expected-half.pt")!r}, "w")
except BlockedAccess as exc:
    print("recording:", exc)
print("allowed:", len(open({str(ROOT / "rubric.toml")!r}).read()) > 0, len(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "import: grading: importing 'reference' is not allowed while grading" in out
    assert "open: grading: reading '__init__.py' is not allowed" in out
    assert "recording: grading: reading 'expected-half.pt' is not allowed" in out
    assert "allowed: True 3" in out
