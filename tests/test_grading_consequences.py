"""Issue 19, item 6: an unimplemented root earns its consequences nothing. Graded on the model and
KV-cache tests (where the skeleton's cache tests used to count as consequences of the unimplemented
``build_model``): the untouched skeleton scores exactly 0, the reference 100."""

from __future__ import annotations

import json

from ahead import run_ahead  # tests/ahead.py: run by a runner process while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests
from test_grading import copy_package, reference_dir, spec_grade, student_dir

RUBRIC = """
total = 100
[components]
model = 1
kv_cache = 1
[limits]
test_timeout_s = 30
memory_mb = 2048
"""


@run_ahead
def test_the_skeleton_scores_zero_and_the_reference_full_marks(tmp_path):
    subs = tmp_path / "subs"
    copy_package(reference_dir(), subs / "good")
    copy_package(student_dir(), subs / "skeleton")
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(RUBRIC)
    out = tmp_path / "out"
    proc = spec_grade(
        "--impl", str(subs), "--select", "test_model or test_kv_cache", "--cache-dir", str(shared_cache()),
        "--rubric", str(rubric), "--jobs", "2", "--out-dir", str(out), "--gradescope", "results.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    good = json.loads((out / "good" / "results.json").read_text())
    skeleton = json.loads((out / "skeleton" / "results.json").read_text())
    assert good["score"] == 100.0, [t for t in good["tests"] if t["status"] != "passed"][:3]
    earning = [t["name"] for t in skeleton["tests"] if t["score"] > 0]
    assert skeleton["score"] == 0.0 and not earning, earning
    assert any("cache" in t["name"] for t in skeleton["tests"])
