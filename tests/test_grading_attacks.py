"""Cheating submissions against spec-grade (issue 11): none may score more than it deserves.

Every cheater (tests/grading_cheaters/*.py, one attack each) is the same honest-but-wrong
submission (the reference's code with ``rmsnorm``, ``rope`` and ``count_parameters`` wrong) plus an
attack. The honest one is graded first, with the reference; then every cheater in one batch, with
the honest one beside them; then the honest one and the reference again. For each cheater: its score
is at most the honest score, its reports are valid (parseable, bounded, every graded test present),
and the honest submission's results beside the cheaters and in the later grading equal the first.
The grader's checkout and its cached manifest are unchanged. One manifest, copied from the session's
cache (tests/manifest_cache.py) into a cache of this file's own, is shared (``--cache-dir``); the tests
are restricted to three concepts (``--select``) to keep this file near two minutes on two cores.

The attacks run only where the bubblewrap sandbox is available (CI installs it): some of them
succeed against the no-sandbox fallback, which docs/grading.md says. The last test shows what the
fallback still does about one of them: a submission that disarms the fallback's guard and writes
into the suite (here a copy of the project) is noticed, and nothing judged with the changed code
is graded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ahead import built_ahead, run_ahead  # tests/ahead.py: built in a runner while other tests run
from manifest_cache import private_copy  # tests/manifest_cache.py: the session's manifests

from spec_tests.harness.remote import sandbox

HERE = Path(__file__).resolve().parent
CHEATERS = HERE / "grading_cheaters"
ATTACKS = sorted(p.stem for p in CHEATERS.glob("*.py") if not p.stem.startswith("_"))
SELECT = "test_norms or test_positions or (count_parameters and not gpt2_small)"
RUBRIC = """
total = 100
[limits]
test_timeout_s = 20
run_timeout_s = 900
memory_mb = 3072
"""
MAX_RESULTS_BYTES = 1_500_000

AVAILABLE, REASON = sandbox.sandbox_available()


def reference_dir() -> Path:
    import reference

    return Path(reference.__file__).resolve().parent


def grader_files() -> dict[str, Path]:
    """The grader's own modules an attacker would append to (in the checkout or installed copy)."""
    import spec_grading
    import spec_tests

    return {
        "compare": Path(spec_tests.__file__).parent / "harness" / "judging" / "compare.py",
        "grade": Path(spec_grading.__file__).parent / "grade.py",
    }


def build(folder: Path, name: str, baked: dict) -> Path:
    pkg = folder / name
    shutil.copytree(reference_dir(), pkg / "_ref", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(CHEATERS / "_honest.py", pkg / "_honest.py")
    attack = (CHEATERS / f"{name}.py").read_text() if name != "honest" else ""
    (pkg / "_attack.py").write_text(attack)
    (pkg / "_baked.py").write_text(f"BAKED = {baked!r}\n")
    (pkg / "__init__.py").write_text("from ._honest import *  # noqa: F403\nfrom ._attack import *  # noqa: F403\n")
    return pkg


def spec_grade(*args, timeout=600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "spec_grading.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def grade_batch(impls: list[Path], out: Path, cache: Path, rubric: Path, *extra) -> subprocess.CompletedProcess:
    args = [a for impl in impls for a in ("--impl", str(impl))]
    args += ["--select", SELECT, "--cache-dir", str(cache), "--rubric", str(rubric), "--out-dir", str(out)]
    args += ["--gradescope", "results.json", "--markdown", "report.md", "--junit", "report.xml", "--jobs", "2"]
    args += ["--seed", "20261202"]  # one set of inputs for every grading here: the honest reports are compared
    return spec_grade(*args, *extra)


def tree_digest(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def load_results(out: Path, name: str) -> dict:
    return json.loads((out / name / "results.json").read_text(encoding="utf-8"))


@built_ahead
def attacks(tmp_path_factory):
    if not AVAILABLE:
        pytest.skip(f"the attacks need the sandbox: {REASON}")
    tmp = tmp_path_factory.mktemp("attacks")
    subs, rubric = tmp / "subs", tmp / "rubric.toml"
    rubric.write_text(RUBRIC)
    # a cache of its own (watched below, and baked into the cheaters), starting from the session's manifest
    cache = private_copy(tmp / "cache", "--select", SELECT, "--rubric", str(rubric))
    first = subs / "first"
    honest = build(first, "honest", {})
    reference_copy = first / "reference_copy"
    shutil.copytree(reference_dir(), reference_copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = grade_batch([honest, reference_copy], tmp / "out1", cache, rubric)
    assert before.returncode == 0, before.stderr
    [manifest_path] = cache.glob("*/manifest.json")
    test_ids = [t["id"] for t in json.loads(manifest_path.read_text())["tests"]]

    out2 = tmp / "out2"
    baked = {
        "results": [str(out2 / name / "results.json") for name in ATTACKS],
        "cache_dir": str(cache),
        "checkout_files": {kind: str(path) for kind, path in grader_files().items()},
        "test_ids": test_ids,
    }
    cheaters = [build(subs / "cheaters", name, baked) for name in ATTACKS]
    cheaters.append(build(subs / "cheaters", "honest", {}))  # beside them: graded exactly as alone (out1)?
    import spec_grading
    import spec_tests

    watched = [Path(spec_tests.__file__).parent, Path(spec_grading.__file__).parent, reference_dir(), cache]
    saved = {path: path.read_bytes() for path in grader_files().values()}
    digest_before = tree_digest(*watched)
    try:
        during = grade_batch(cheaters, out2, cache, rubric)
        written = {name: (out2 / name / "results.json").read_bytes() for name in ATTACKS}
        time.sleep(2.0)  # a detached process would rewrite the reports now
        written["honest"] = (out2 / "honest" / "results.json").read_bytes()
        rewritten = [name for name in written if (out2 / name / "results.json").read_bytes() != written[name]]
        digest_after = tree_digest(*watched)
        after = grade_batch([honest, reference_copy], tmp / "out3", cache, rubric)
    finally:
        for path, data in saved.items():  # never leave a successful attack in the checkout
            if path.read_bytes() != data:
                path.write_bytes(data)
    return {
        "tmp": tmp,
        "before": before,
        "during": during,
        "after": after,
        "rewritten": rewritten,
        "changed": sorted(
            k for k in digest_before.keys() | digest_after.keys() if digest_before.get(k) != digest_after.get(k)
        ),
        "test_ids": test_ids,
    }


def test_the_honest_submission_is_wrong_but_not_worthless(attacks):
    honest = load_results(attacks["tmp"] / "out1", "honest")
    reference = load_results(attacks["tmp"] / "out1", "reference_copy")
    assert reference["score"] == 100.0
    assert 0 < honest["score"] < 100  # rmsnorm, rope and count_parameters fail; the rest passes
    failed = {t["name"] for t in honest["tests"] if t["status"] == "failed"}
    assert any("rmsnorm" in n for n in failed) and any("count_parameters" in n for n in failed)


@pytest.mark.parametrize("attack", ATTACKS)
def test_cheater_scores_at_most_the_honest_score(attacks, attack):
    assert attacks["during"].returncode == 0, attacks["during"].stderr[-3000:]
    honest = load_results(attacks["tmp"] / "out1", "honest")["score"]
    cheater = load_results(attacks["tmp"] / "out2", attack)
    assert cheater["score"] <= honest, (attack, cheater["score"], honest)


@pytest.mark.parametrize("attack", ATTACKS)
def test_reports_stay_valid(attacks, attack):
    folder = attacks["tmp"] / "out2" / attack
    raw = (folder / "results.json").read_bytes()
    assert len(raw) < MAX_RESULTS_BYTES, len(raw)
    results = json.loads(raw.decode("utf-8"))  # strict UTF-8: no lone surrogates
    honest = load_results(attacks["tmp"] / "out1", "honest")
    graded = [t for t in results["tests"] if t["max_score"] > 0]
    assert [t["number"] for t in graded] == [t["number"] for t in honest["tests"]]  # every test, once, in order
    assert all(len(t.get("output", "")) <= 5000 for t in results["tests"])
    assert len(results["output"]) <= 25_000
    markdown = (folder / "report.md").read_text(encoding="utf-8")
    assert len(markdown) < MAX_RESULTS_BYTES and markdown.startswith("# Grade")
    outside = markdown.split("```")[0::2]  # what renders as markdown: no forged heading or score there
    assert sum(part.count("# Grade") for part in outside) == 1 and sum(p.count("points**") for p in outside) == 1
    ET.parse(folder / "report.xml")
    assert "\x1b" not in raw.decode() and "\x00" not in raw.decode()


def test_reports_are_not_rewritten_after_grading(attacks):
    assert attacks["rewritten"] == []


def test_checkout_and_cache_are_unchanged(attacks):
    assert attacks["changed"] == []


def test_the_honest_submission_beside_the_cheaters_is_graded_exactly_as_alone(attacks):
    """The honest submission, graded in the cheaters' batch with the same seed, gets exactly the results of
    its grading alone (with the reference, before them)."""
    alone, beside = (load_results(attacks["tmp"] / out, "honest") for out in ("out1", "out2"))
    alone.pop("execution_time"), beside.pop("execution_time")
    assert beside == alone


def test_a_later_honest_grading_is_unaffected(attacks):
    assert attacks["after"].returncode == 0, attacks["after"].stderr
    for name in ("honest", "reference_copy"):
        first, later = (load_results(attacks["tmp"] / out, name) for out in ("out1", "out3"))
        first.pop("execution_time"), later.pop("execution_time")
        assert first == later, name


def test_specific_outcomes(attacks):
    out = attacks["tmp"] / "out2"
    unprintable = load_results(out, "unprintable_exception")
    rms = [t for t in unprintable["tests"] if t["name"].startswith("rmsnorm")]
    assert rms and all(t["status"] == "failed" and "unprintable" in t["output"] for t in rms)
    huge = load_results(out, "huge_output")
    assert any("more characters cut" in t.get("output", "") for t in huge["tests"])
    forged = load_results(out, "forged_verdicts")
    assert forged["score"] <= load_results(attacks["tmp"] / "out1", "honest")["score"]
    slow = load_results(out, "alarm_thread")
    [hung] = [t for t in slow["tests"] if "rmsnorm" in t["name"] and t["name"].endswith("[f64-small]")]
    assert "did not finish within the test's limit of 20 s" in hung["output"]
    # the hang costs the cases that hang, nothing more; and the lingering thread does not keep the
    # judge alive until the whole-run limit (judged from the reports, not from this machine's speed)
    timed_out = [t["name"] for t in slow["tests"] if "did not finish within the test's limit" in t.get("output", "")]
    assert timed_out and all("rmsnorm" in name for name in timed_out), timed_out
    for attack in ATTACKS:
        assert "whole-run limit" not in (out / attack / "results.json").read_text(encoding="utf-8"), attack


# ----------------------------------------------------------------------------------------------
# the grader itself killed, stopped, or out of time


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _judge_of(grader: subprocess.Popen, timeout: float = 60) -> int:
    """The grader's judge: its child, or a child of its judge fork server (spec_grading/forkserver.py)."""
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        for pid in _children(grader.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spec_grading.collector" in cmdline:
                return pid
            if b"spec_grading.forkserver" in cmdline and (forked := _children(pid)):
                return forked[0]
        time.sleep(0.1)
    raise AssertionError("no judge process appeared")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def slow_submission(attacks) -> Path:
    return attacks["tmp"] / "subs" / "cheaters" / "alarm_thread"


def _start_grader(sub: Path, tmp: Path, out: Path, *extra) -> subprocess.Popen:
    cache = tmp / "cache"
    cmd = [sys.executable, "-m", "spec_grading.cli", "--impl", str(sub), "--select", SELECT, "--cache-dir", str(cache)]
    cmd += ["--rubric", str(tmp / "rubric.toml"), "--gradescope", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


@run_ahead
def test_a_killed_judge_still_gives_a_report_with_every_test(attacks, tmp_path):
    out = tmp_path / "results.json"
    grader = _start_grader(slow_submission(attacks), attacks["tmp"], out)
    judge = _judge_of(grader)
    stop = time.monotonic() + 300  # the judge starts its sandbox after collecting: poll, never a fixed wait
    while not (sandbox_processes := _descendants(judge)) and time.monotonic() < stop:  # bubblewrap, the worker
        time.sleep(0.2)
    assert sandbox_processes, "no sandbox process appeared under the judge"
    time.sleep(1.0)  # the worker's own children (if any) too
    sandbox_processes = _descendants(judge)
    os.kill(judge, signal.SIGKILL)
    stdout, stderr = grader.communicate(timeout=60)
    assert grader.returncode == 0, stderr
    stop = time.monotonic() + 10
    while any(_alive(p) for p in sandbox_processes) and time.monotonic() < stop:
        time.sleep(0.1)
    assert not [p for p in sandbox_processes if _alive(p)], "the worker outlived its judge"
    results = json.loads(out.read_text())
    assert len(results["tests"]) == len(attacks["test_ids"]), (len(results["tests"]), len(attacks["test_ids"]))
    not_run = [t for t in results["tests"] if t.get("output", "").startswith("not run:")]
    assert not_run and all("SIGKILL" in t["output"] for t in not_run), not_run
    assert "SIGKILL" in results["output"], results["output"]


@run_ahead
def test_the_whole_run_limit_stops_a_hanging_submission(attacks, tmp_path):
    out = tmp_path / "results.json"
    started = time.monotonic()
    grader = _start_grader(slow_submission(attacks), attacks["tmp"], out, "--run-timeout", "8", "--test-timeout", "60")
    stdout, stderr = grader.communicate(timeout=300)
    assert grader.returncode == 0, stderr
    # the 8 s limit, plus start-up and clean-up on a loaded machine; far under the 60 s x hanging tests
    assert time.monotonic() - started < 150, time.monotonic() - started
    results = json.loads(out.read_text())
    assert len(results["tests"]) == len(attacks["test_ids"]), (len(results["tests"]), len(attacks["test_ids"]))
    assert any("whole-run limit of 8 s" in t.get("output", "") for t in results["tests"])


@run_ahead
def test_a_stopped_grader_kills_its_judge_and_removes_its_folder(attacks, tmp_path):
    from spec_grading.workspace import base_folder

    for how in (signal.SIGTERM, signal.SIGKILL):
        grader = _start_grader(slow_submission(attacks), attacks["tmp"], tmp_path / "results.json")
        judge = _judge_of(grader)
        [folder] = base_folder().glob(f"run-{grader.pid}-*")
        grader.send_signal(how)
        grader.communicate(timeout=60)
        stop = time.monotonic() + 20
        while _alive(judge) and time.monotonic() < stop:
            time.sleep(0.1)
        assert not _alive(judge), f"the judge outlived a grader stopped by {how.name}"
        if how == signal.SIGKILL:
            # nothing in a grader killed by SIGKILL cleans up: the next grader to start does (a grader that another
            # test started meanwhile may already have; the folder must be gone after ours either way)
            args = ["--prepare", "--select", SELECT, "--cache-dir", str(attacks["tmp"] / "cache")]
            assert spec_grade(*args, "--rubric", str(attacks["tmp"] / "rubric.toml")).returncode == 0
        assert not folder.exists(), f"{folder} left behind after {how.name}"
        assert not (tmp_path / "results.json").exists(), f"a grader stopped by {how.name} wrote its results"


@run_ahead
def test_without_the_sandbox_a_changed_suite_is_noticed(tmp_path):
    """--sandbox off, in a copy of the project: a submission disarms the in-process guard and rewrites
    the copy's suite. The grader notices, and grades nothing judged with the changed code."""
    import importlib

    project = tmp_path / "project"
    for name in ("spec_tests", "reference", "spec_grading"):
        source = Path(importlib.import_module(name).__file__).resolve().parent
        shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__", "recorded"))
    targets = {
        "compare": project / "spec_tests" / "harness" / "judging" / "compare.py",
        "grade": project / "spec_grading" / "grade.py",
    }
    baked = {"results": [], "cache_dir": str(tmp_path / "cache"), "test_ids": []}
    baked["checkout_files"] = {kind: str(path) for kind, path in targets.items()}
    honest = build(tmp_path / "subs", "honest", baked)
    cheater = build(tmp_path / "subs", "disarm_and_append", baked)
    (tmp_path / "rubric.toml").write_text(RUBRIC)
    cmd = [sys.executable, "-m", "spec_grading.cli", "--impl", str(honest), "--impl", str(cheater), "--jobs", "1"]
    cmd += ["--sandbox", "off", "--select", "test_norms", "--cache-dir", str(tmp_path / "cache")]
    cmd += ["--rubric", str(tmp_path / "rubric.toml"), "--out-dir", str(tmp_path / "out"), "--gradescope", "r.json"]
    proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True, timeout=600)  # imports the copy
    assert "appended by a submission" in targets["compare"].read_text()  # the attack worked on the copy
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "changed while submissions were judged" in proc.stderr
    first = json.loads((tmp_path / "out" / "honest" / "r.json").read_text())
    cheated = json.loads((tmp_path / "out" / "disarm_and_append" / "r.json").read_text())
    assert 0 < first["score"] < 100 and cheated["score"] == 0
    assert all("not graded: the grader's own code" in t["output"] for t in cheated["tests"] if "output" in t)
