"""spec-grade end to end: rubric, points, reports, batch, determinism, limits, fallback, manifest.

One batch is graded on a small selection (the norms, repeat_kv and GQA attention tests) to stay
fast: a correct submission (the reference under another name), the skeleton, one that fails to
import, one with a catalogued rmsnorm bug (diagnosis), one with a repeat_kv bug (whose attention
tests are consequences: not charged), one lacking layernorm (not provided), and a "chaos" one
whose rmsnorm loops forever, aborts, calls sys.exit or exhausts memory, each in a different test.
The attacks of issue 11 are in test_grading_attacks.py.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ahead import built_ahead, run_ahead  # tests/ahead.py: built in a runner while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests

from spec_grading import report
from spec_tests.harness.remote import sandbox

SELECT = "test_norms or test_repeat_kv or test_sdpa_gqa_mapping"
RUBRIC = """
total = 100
[components]
norms = 2
attention = 1
[limits]
test_timeout_s = 15
memory_mb = 2048
[[tests]]
match = "test_norms.py::test_norm_statistics_in_at_least_float32*"
visibility = "hidden"
[[tests]]
match = "test_norms.py::test_rmsnorm"
weight = 2
"""
HIDDEN = "This test is hidden: it counts towards your score, but its details are not shown."

CHAOS = """

import os as _os
import sys as _sys

_good_rmsnorm = rmsnorm


def rmsnorm(x, weight, eps=1e-5):
    small = bool(x.abs().max() < 0.1)
    if x.dim() == 2:  # the float16 statistics test (which also checks the math on float32 copies)
        hog = []
        while True:  # runaway memory
            hog.append(torch.ones(2**26))
    if x.dtype == torch.float64 and small:
        while True:  # an infinite loop
            pass
    if x.dtype == torch.float32 and not small:
        _os.abort()  # a crash
    if x.dtype == torch.float32 and small:
        _sys.exit(3)
    return _good_rmsnorm(x, weight, eps)
"""


def reference_dir() -> Path:
    import reference

    return Path(reference.__file__).resolve().parent


def student_dir() -> Path:
    import student

    return Path(student.__file__).resolve().parent


def copy_package(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def with_bug(folder: Path, bug: str) -> Path:
    from spec_tests.bugs import apply_patch, get_bug, reference_sources

    folder.mkdir(parents=True)
    for stem, text in apply_patch(get_bug(bug), reference_sources()).items():
        (folder / f"{stem}.py").write_text(text)
    return folder


def make_submissions(folder: Path) -> list[str]:
    copy_package(reference_dir(), folder / "good")
    copy_package(student_dir(), folder / "skeleton")
    broken = copy_package(reference_dir(), folder / "broken")
    (broken / "__init__.py").write_text((broken / "__init__.py").read_text() + "\nraise RuntimeError('no \\udc80')\n")
    chaos = copy_package(reference_dir(), folder / "chaos")
    (chaos / "norms.py").write_text((chaos / "norms.py").read_text() + CHAOS)
    partial = copy_package(reference_dir(), folder / "partial")
    init = (
        (partial / "__init__.py")
        .read_text()
        .replace("from .norms import layernorm, rmsnorm", "from .norms import rmsnorm")
    )
    (partial / "__init__.py").write_text(init.replace('    "layernorm",\n', ""))
    with_bug(folder / "buggy", "rmsnorm_eps_outside_root")
    with_bug(folder / "kvbug", "repeat_kv_tiled")
    return ["broken", "buggy", "chaos", "good", "kvbug", "partial", "skeleton"]


GRADING_SEED = "20261202"  # without --seed each grading draws fresh inputs (tests/test_grading_fresh_inputs.py)


def spec_grade(*args, timeout=600, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "spec_grading.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def report_args(out: Path) -> list[str]:
    return ["--out-dir", str(out), "--gradescope", "results.json", "--markdown", "report.md", "--junit", "report.xml"]


@built_ahead
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grading")
    cache, rubric = tmp / "cache", tmp / "rubric.toml"
    rubric.write_text(RUBRIC)
    names = make_submissions(tmp / "subs")
    common = ["--select", SELECT, "--cache-dir", str(cache), "--rubric", str(rubric), "--jobs", "2", "--failures"]
    common += ["--seed", GRADING_SEED]  # the same inputs in every grading here, so that reports can be compared
    first = spec_grade("--impl", str(tmp / "subs"), *common, *report_args(tmp / "out1"), "--csv", str(tmp / "g.csv"))
    again = spec_grade("--impl", str(tmp / "subs" / "chaos"), *common, *report_args(tmp / "out2"))
    return {"tmp": tmp, "names": names, "first": first, "again": again, "common": common}


def results(batch, name, out="out1") -> dict:
    return json.loads((batch["tmp"] / out / name / "results.json").read_text(encoding="utf-8"))


def by_name(res: dict) -> dict[str, dict]:
    return {t["name"]: t for t in res["tests"]}


def test_batch_exits_zero_and_writes_every_report(batch):
    proc = batch["first"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "grading [" in proc.stderr  # the progress bar
    for name in batch["names"]:
        for f in ("results.json", "report.md", "report.xml"):
            assert (batch["tmp"] / "out1" / name / f).is_file(), f"{name}/{f} missing"
        ET.parse(batch["tmp"] / "out1" / name / "report.xml")
    rows = {r["submission"]: r for r in csv.DictReader((batch["tmp"] / "g.csv").open())}
    assert sorted(rows) == sorted(batch["names"])
    assert rows["broken"]["status"] == "could not run" and rows["good"]["status"] == "graded"
    assert rows["good"]["sandboxed"] == ("yes" if sandbox.sandbox_available()[0] else "no")


def test_gradescope_results_follow_the_specification(batch):
    res = results(batch, "good")
    assert set(res) >= {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests", "leaderboard"}
    assert isinstance(res["execution_time"], int) and res["visibility"] == "visible"
    assert res["score"] == 100.0 and len(res["tests"]) == 16
    for t in res["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "tags", "visibility", "number"}
        assert t["status"] == "passed" and t["score"] == t["max_score"] > 0
        assert len(t["tags"]) == len(set(t["tags"]))  # each tag once (repeat_kv's bug class is its name)
    assert round(sum(t["max_score"] for t in res["tests"]), 2) == 100.0
    norms = [t for t in res["tests"] if t["tags"][0] == "norms"]
    assert round(sum(t["max_score"] for t in norms), 2) == pytest.approx(66.67)  # weights 2 : 1
    rms = [t["max_score"] for t in norms if t["name"].startswith("rmsnorm =")]
    ln = [t["max_score"] for t in norms if t["name"].startswith("layernorm =")]
    assert len(rms) == 4 and len(ln) == 4 and abs(sum(rms) - 2 * sum(ln)) < 0.05  # cents


def test_skeleton_scores_zero_with_one_line_reasons(batch):
    res = results(batch, "skeleton")
    assert res["score"] == 0.0
    visible = [t for t in res["tests"] if t["visibility"] == "visible"]
    assert visible and all(t["status"] == "failed" and t["output"].startswith("not implemented: ") for t in visible)


def test_hidden_tests_show_a_fixed_message(batch):
    for name in ("skeleton", "chaos", "good"):
        hidden = [t for t in results(batch, name)["tests"] if t["visibility"] == "hidden"]
        assert len(hidden) == 2 and {t["output"] for t in hidden} == {HIDDEN}
    md = (batch["tmp"] / "out1" / "chaos" / "report.md").read_text()
    assert "2 hidden tests" in md
    # the hidden test that runs out of memory shows no detail of it; without the sandbox the report's warning
    # quotes the fallback's resource limits ("memory, no core dumps"), which is about grading, not the test
    warning = f"> **Warning:** {report.FALLBACK_HEADLINE}"
    assert sum(line.startswith(warning) for line in md.splitlines()) == (not sandbox.sandbox_available()[0])
    shown = "\n".join(line for line in md.splitlines() if not line.startswith(warning))
    assert "memory" not in shown.lower() and "SIGKILL" not in shown, shown


def test_a_submission_that_fails_to_import_could_not_run(batch):
    res = results(batch, "broken")
    assert res["score"] == 0.0
    first = res["tests"][0]
    assert first["name"] == "Could not run your implementation" and first["visibility"] == "visible"
    assert "RuntimeError: no \ufffd" in first["output"] and "submission/__init__.py" in first["output"]
    assert "spec-grade-" not in first["output"]  # no temporary paths
    visible = [t for t in res["tests"][1:] if t["visibility"] == "visible"]
    assert visible and all(t["output"].startswith("not run:") for t in visible)
    assert "Could not run" in res["output"]


def test_chaos_costs_only_the_affected_tests(batch):
    res = results(batch, "chaos")
    tests = by_name(res)
    expect = {
        "[f64-small]": "did not finish within the test's limit of 15 s",
        "[f32-unit]": "SIGABRT",
        "[f32-small]": "SystemExit: 3",  # caught in the worker: the process carries on
    }
    for params, text in expect.items():
        [name] = [n for n in tests if n.startswith("rmsnorm =") and n.endswith(params)]
        assert tests[name]["status"] == "failed" and text in tests[name]["output"], tests[name]["output"]
    [unit64] = [n for n in tests if n.startswith("rmsnorm =") and n.endswith("[f64-unit]")]
    assert tests[unit64]["status"] == "passed"  # a new worker ran the remaining tests
    failed = {n: t["output"] for n, t in tests.items() if n.startswith("layernorm =") and t["status"] != "passed"}
    assert not failed, failed
    staff = batch["first"].stdout  # --failures shows the hidden memory test's message to staff
    assert "memory" in staff.lower() or "SIGKILL" in staff
    # a restart for each timeout, abort and memory kill (and one for a crash probe's variant of the sys.exit test
    # that loops): crash probes must not restart the worker once per variant, or the restarts run out
    assert staff.count("--- worker generation") <= 6, staff


def test_diagnosis_reaches_the_report(batch):
    res = results(batch, "buggy")
    assert 0 < res["score"] < 100
    assert any("matches known bug rmsnorm_eps_outside_root" in t.get("output", "") for t in res["tests"])


def test_not_provided_earns_nothing(batch):
    res = results(batch, "partial")
    layer = [t for t in res["tests"] if t["name"].startswith("layernorm =")]
    assert layer and all(t["score"] == 0 and "not provided" in t["output"] for t in layer)
    assert 0 < res["score"] < 100


def test_consequences_earn_their_points_and_are_shown_under_their_root_cause(batch):
    res = results(batch, "kvbug")
    tests = res["tests"]
    own = [t for t in tests if t["name"].startswith("repeat_kv") and t["status"] == "failed"]
    consequences = [t for t in tests if t.get("output", "").startswith("Not charged")]
    assert own and all(t["score"] == 0 for t in own)
    assert consequences and all(t["score"] == t["max_score"] > 0 for t in consequences)
    assert all("repeat_kv" in t["output"] for t in consequences)
    n = len(consequences)
    assert f"{n} test{'s' if n > 1 else ''} trace{'' if n > 1 else 's'} back to repeat_kv" in res["output"]
    md = (batch["tmp"] / "out1" / "kvbug" / "report.md").read_text()
    assert "## Not charged" in md and "back to repeat_kv" in md
    expected = 100 - sum(t["max_score"] for t in own)
    assert res["score"] == pytest.approx(expected, abs=0.011)


def test_grading_is_deterministic(batch):
    assert batch["again"].returncode == 0, batch["again"].stderr
    a, b = results(batch, "chaos"), results(batch, "chaos", "out2")
    a.pop("execution_time"), b.pop("execution_time")
    assert a == b
    for f in ("report.md", "report.xml"):
        assert (batch["tmp"] / "out1" / "chaos" / f).read_text() == (batch["tmp"] / "out2" / "chaos" / f).read_text()


@run_ahead
def test_the_submissions_declarations_are_ignored(batch, tmp_path):
    """CAPABILITIES = () and SPEC_XFAILS do not change what is graded: the rubric decides."""
    sub = copy_package(reference_dir(), tmp_path / "declares_nothing")
    text = (sub / "__init__.py").read_text()
    xfails = '{"test_norms.py::test_rmsnorm[f64-unit]": "please"}'
    (sub / "__init__.py").write_text(text + f"\nCAPABILITIES = ()\nSPEC_XFAILS = {xfails}\n")
    out = tmp_path / "results.json"
    proc = spec_grade("--impl", str(sub), *batch["common"], "--gradescope", str(out))
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["score"] == 100.0 and len(res["tests"]) == 16  # the GQA tests were judged and passed


@run_ahead
def test_rubric_capabilities_decide_what_is_graded(batch, tmp_path):
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(RUBRIC + '\n[capabilities]\nrequired = ["tied_head", "untied_head"]\n')
    out = tmp_path / "results.json"
    args = ["--select", SELECT, "--cache-dir", str(shared_cache()), "--rubric", str(rubric)]
    proc = spec_grade("--impl", str(batch["tmp"] / "subs" / "good"), *args, "--gradescope", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "are not graded: they need a capability the rubric does not require" in proc.stderr
    res = json.loads(out.read_text())
    assert res["score"] == 100.0 and 0 < len(res["tests"]) < 16
    assert not [t for t in res["tests"] if "gqa" in t["name"]]


@run_ahead
def test_the_fallback_says_so_everywhere(batch, tmp_path):
    out = tmp_path / "out"
    args = ["--impl", str(batch["tmp"] / "subs" / "good"), "--sandbox", "off", *batch["common"], *report_args(out)]
    proc = spec_grade(*args)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "good" / "results.json").read_text())
    assert res["score"] == 100.0
    for text in (res["output"], (out / "good" / "report.md").read_text(), proc.stderr, proc.stdout):
        assert "graded WITHOUT the sandbox" in text and "does not stop" in text


@run_ahead
def test_a_required_sandbox_that_is_missing_gives_no_grade(batch, tmp_path):
    env = {**__import__("os").environ, "SPEC_SANDBOX": "off"}
    proc = spec_grade("--impl", str(batch["tmp"] / "subs" / "good"), "--sandbox", "require", *batch["common"], env=env)
    assert proc.returncode == 1 and "--sandbox require" in proc.stderr


@run_ahead
def test_a_modified_manifest_is_prepared_again(batch, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(batch["tmp"] / "cache", cache)
    [manifest] = cache.glob("*/manifest.json")
    data = json.loads(manifest.read_text())
    data["tests"] = [t for t in data["tests"] if "rmsnorm" not in t["id"]]  # drop the tests it fails
    manifest.write_text(json.dumps(data))
    out = tmp_path / "results.json"
    args = ["--select", SELECT, "--cache-dir", str(cache), "--rubric", str(batch["tmp"] / "rubric.toml")]
    args += ["--seed", GRADING_SEED]
    proc = spec_grade("--impl", str(batch["tmp"] / "subs" / "buggy"), *args, "--gradescope", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "preparing the manifest again" in proc.stderr and "does not match its SHA-256" in proc.stderr
    regraded, first = json.loads(out.read_text()), results(batch, "buggy")
    regraded.pop("execution_time"), first.pop("execution_time")
    assert regraded == first  # graded with the true manifest again


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--impl is required"),
        (["--impl", "no/such/dir"], "no such file or folder"),
        (["--impl", "student", "--rubric", "no-such-rubric.toml"], "no-such-rubric.toml"),
        (["--impl", "student", "--test-timeout", "-1"], "must be positive, got -1"),
        (["--impl", "student", "--jobs", "-2"], "--jobs must be >= 0, got -2"),
    ],
)
@run_ahead
def test_usage_errors_exit_2(args, message):
    proc = spec_grade(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[tests]]\nmatch = "x"\nvisibility = "secret"\n', "visibility must be one of"),
        ('[capabilities]\nrequired = ["gqa", "telepathy"]\n', "unknown capabilities ['telepathy']"),
        ('[capabilities]\nrequired = "gqa"\n', "must be a list of names, got 'gqa'"),
        ("[[tests]]\nlive = true\nweight = 2\n", "unknown keys ['live']"),
    ],
)
@run_ahead
def test_malformed_rubric_is_a_usage_error(tmp_path, text, message):
    bad = tmp_path / "rubric.toml"
    bad.write_text("total = 100\n" + text)
    proc = spec_grade("--impl", "student", "--rubric", str(bad))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@run_ahead
def test_an_unusable_upload_still_gets_a_gradescope_result(tmp_path):
    upload = tmp_path / "upload"
    upload.mkdir()
    (upload / "notes.txt").write_text("no code here")
    out = tmp_path / "results.json"
    proc = spec_grade("--impl", str(upload), "--gradescope", str(out))
    assert proc.returncode == 2, proc.stderr
    res = json.loads(out.read_text())
    assert res["score"] == 0 and "neither a package" in res["tests"][0]["output"], res


def test_default_rubric_loads_and_sums_to_its_total():
    from spec_grading.rubric import assign, load_rubric
    from spec_tests.protocol import ALL_CAPABILITIES

    rubric = load_rubric(Path(__file__).resolve().parents[1] / "rubric.toml")
    assert rubric.capabilities == ALL_CAPABILITIES
    tests = [
        {
            "id": f"test_{c}.py::test_x[{i}]",
            "file": f"test_{c}.py",
            "function": "test_x",
            "params": str(i),
            "doc": "",
            "component": c,
            "bug_classes": [c, c],
            "points": None,
            "visibility": None,
        }
        for c in rubric.components
        for i in range(3)
    ]
    graded = assign(tests, rubric)
    assert round(sum(t.max_score for t in graded), 2) == rubric.total
    assert all(t.tags == [t.component] for t in graded)
