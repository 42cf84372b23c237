"""An assignment's rubric grades the assignment (issue 21, item 4): with
``docs/rubrics/llama-only-course.toml`` (llama family only, no GQA, no untied head, no linear
biases, no sampling, float32 RMSNorm allowed), a correct llama-only MHA solution written as a student
would (``tests/independent/student_mha_tied``) scores 100, and so does the same solution with its
RMSNorm computed in float32 as the course asks; a bug still costs points. Every output names the
rubric (path and SHA-256)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

from ahead import built_ahead  # tests/ahead.py: built in a runner while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests

ROOT = Path(__file__).resolve().parents[1]
RUBRIC = ROOT / "docs" / "rubrics" / "llama-only-course.toml"
STUDENT = ROOT / "tests" / "independent" / "student_mha_tied"


@built_ahead
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("assignment")
    subs = tmp / "subs"
    shutil.copytree(STUDENT, subs / "correct", ignore=shutil.ignore_patterns("__pycache__"))
    f32 = shutil.copytree(STUDENT, subs / "float32_norm", ignore=shutil.ignore_patterns("__pycache__"))
    norms = (f32 / "norms.py").read_text()
    assert "dt = _compute_dtype(x)\n    xf = x.to(dt)\n    ms" in norms
    (f32 / "norms.py").write_text(
        norms.replace(
            "dt = _compute_dtype(x)\n    xf = x.to(dt)\n    ms", "dt = torch.float32\n    xf = x.to(dt)\n    ms", 1
        )
    )
    buggy = shutil.copytree(STUDENT, subs / "buggy", ignore=shutil.ignore_patterns("__pycache__"))
    text = (buggy / "norms.py").read_text()
    (buggy / "norms.py").write_text(text.replace("torch.sqrt(ms + eps)", "(torch.sqrt(ms) + eps)", 1))
    out = tmp / "out"
    cmd = [sys.executable, "-m", "spec_grading.cli", "--impl", str(subs), "--rubric", str(RUBRIC)]
    cmd += ["--cache-dir", str(shared_cache()), "--jobs", "2", "--out-dir", str(out), "--gradescope", "results.json"]
    cmd += ["--markdown", "report.md", "--csv", str(tmp / "gradebook.csv")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"out": out, "proc": proc, "tmp": tmp}


def results(graded, name) -> dict:
    return json.loads((graded["out"] / name / "results.json").read_text())


def test_a_correct_llama_only_solution_scores_100(graded):
    """An honest independent solution scores 100 and raises no staff flag (issue 19)."""
    rows = {r["submission"]: r for r in csv.DictReader((graded["tmp"] / "gradebook.csv").open())}
    for name in ("correct", "float32_norm"):
        res = results(graded, name)
        failing = [t["name"] for t in res["tests"] if t["status"] != "passed"]
        assert res["score"] == 100.0, (name, failing[:10])
        assert rows[name]["flags"] == "", rows[name]


def test_what_the_assignment_lacks_is_not_graded(graded):
    tests = results(graded, "correct")["tests"]
    names = [t["name"] for t in tests]
    assert not [n for n in names if "gpt2" in n or "layernorm" in n or "[gpt2" in n], names
    assert not [t for t in tests if "sampling" in t["tags"] or "sampling filters" in t["name"]]
    assert not [n for n in names if "flash" in n.lower() or "repeat_kv" in n]
    assert "not graded by the rubric's assignment" in graded["proc"].stderr


def test_a_bug_still_costs_points(graded):
    res = results(graded, "buggy")
    assert 0 < res["score"] < 100
    assert any("rmsnorm" in t.get("output", "") for t in res["tests"] if t["status"] == "failed")


def test_every_output_names_the_rubric(graded):
    import hashlib

    digest = hashlib.sha256(RUBRIC.read_bytes()).hexdigest()
    res = results(graded, "correct")
    assert res["extra_data"]["rubric"]["sha256"] == digest
    assert res["extra_data"]["rubric"]["path"] == str(RUBRIC)
    assert digest in res["output"]
    assert digest in (graded["out"] / "correct" / "report.md").read_text()
    assert digest in (graded["tmp"] / "gradebook.csv").read_text()
    assert digest in graded["proc"].stderr and digest in graded["proc"].stdout
