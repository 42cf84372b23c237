"""spec_grading's parts on their own: safe text, atomic writes, run folders, the judge's watchdog,
reading a judge's verdicts (final file, partial progress, garbage), and the reference-copy scan."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from spec_grading import judge, textsafe, workspace
from spec_grading.collector import FINAL_NAME, PROGRESS_NAME


def test_clean_removes_surrogates_controls_and_ansi_and_caps():
    text = textsafe.clean("a\udc80b\x1b[31mred\x1b[0m\x00\x07 at 0x7f12ab34cd56\r\nnext\u2028", 1000)
    assert text == "a\ufffdbred at 0x…\nnext"
    text.encode("utf-8")  # encodable
    long = textsafe.clean("x" * 5000, 100)
    assert long.startswith("x" * 100) and long.endswith("[4900 more characters cut]")


def test_clean_never_calls_a_failing_str():
    class Evil:
        def __str__(self):
            raise RuntimeError("no")

    assert textsafe.clean(Evil()) == "<unprintable Evil>"
    assert textsafe.clean_data({"k\ud800": ["v\x00", 1, None, Evil()]}) == {
        "k\ufffd": ["v", 1, None, "<unprintable Evil>"]
    }


def test_write_atomic_replaces_whole_files_only(tmp_path):
    target = tmp_path / "sub" / "results.json"
    textsafe.write_atomic(target, '{"a": "\udc80"}')
    assert json.loads(target.read_text(encoding="utf-8")) == {"a": "\ufffd"}
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]  # no temporary file left


def test_run_folders_are_removed_and_stale_ones_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace.tempfile, "gettempdir", lambda: str(tmp_path))
    with workspace.RunFolder() as run:
        assert run.path.is_dir() and (run.path / workspace.LOCK_NAME).exists()
        live = run.path
    assert not live.exists()
    base = workspace.base_folder()
    stale = base / "run-999999-dead"
    stale.mkdir()
    (stale / workspace.LOCK_NAME).write_text("")
    held = base / "run-1-alive"
    held.mkdir()
    fd = os.open(held / workspace.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its grader is alive
    try:
        assert workspace.sweep_stale(base) == [stale]
        assert held.exists() and not stale.exists()
    finally:
        os.close(fd)


def test_run_folder_base_must_be_private(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace.tempfile, "gettempdir", lambda: str(tmp_path))
    base = tmp_path / f"spec-grade-{os.getuid()}"
    base.mkdir(mode=0o777)
    base.chmod(0o777)
    with pytest.raises(RuntimeError, match="not a private folder"):
        workspace.base_folder()


def fake_judge(tmp_path: Path, script: str, ids=("t1", "t2")) -> judge.JudgeRun:
    run = judge.JudgeRun(
        tmp_path / "code", tmp_path / "sub", list(ids), capabilities=[], limits=judge.Limits(run_timeout_s=20)
    )
    run.command = [sys.executable, "-c", script.replace("OUT", repr(str(run.out)))]
    return run


def wait(run: judge.JudgeRun, limit: float = 30) -> float:
    started = time.monotonic()
    run.start()
    while not run.poll():
        assert time.monotonic() - started < limit
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_judge_that_lingers_after_its_verdicts_is_killed_and_nothing_is_lost(tmp_path):
    final = {"format": 1, "finished": True, "could_not_run": None, "subject": {}, "tests": {}}
    final["tests"] = {t: {"id": t, "status": "passed", "root_cause": [], "message": ""} for t in ("t1", "t2")}
    script = (
        "import json, os, time\n"
        f"open(os.path.join(OUT, {FINAL_NAME!r}), 'w').write({json.dumps(json.dumps(final))})\n"
        "time.sleep(120)\n"
    )
    run = fake_judge(tmp_path, script)
    run.exit_grace_s = 1.0
    assert wait(run) < 15
    result = run.result()
    assert {t: v.status for t, v in result.verdicts.items()} == {"t1": "passed", "t2": "passed"}
    assert result.stopped is None


def test_a_judge_killed_half_way_keeps_what_it_finished(tmp_path):
    line = json.dumps({"id": "t1", "status": "failed", "root_cause": [], "message": "wrong \udc80"})
    torn = '{"id": "t2", "sta'  # a line cut off by the kill
    script = (
        "import os, signal\n"
        f"f = open(os.path.join(OUT, {PROGRESS_NAME!r}), 'w'); f.write({line + chr(10) + torn!r}); f.close()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = fake_judge(tmp_path, script)
    wait(run)
    result = run.result()
    assert result.verdicts["t1"].status == "failed" and "\ufffd" in result.verdicts["t1"].message
    assert result.verdicts["t2"].status == "not_run" and "SIGKILL" in result.verdicts["t2"].message


def test_a_judge_that_never_ends_is_stopped_at_the_whole_run_limit(tmp_path):
    run = fake_judge(tmp_path, "import time\ntime.sleep(120)\n")
    run.limits = judge.Limits(run_timeout_s=1.0)
    assert wait(run) < 10
    result = run.result()
    assert all(v.status == "not_run" and "whole-run limit of 1 s" in v.message for v in result.verdicts.values())


def test_forged_or_malformed_verdicts_are_not_taken(tmp_path):
    bad = {"format": 1, "finished": True, "tests": {"t1": {"status": "excellent"}, "t9": {"status": "passed"}}}
    script = f"import os\nopen(os.path.join(OUT, {FINAL_NAME!r}), 'w').write({json.dumps(json.dumps(bad))})\n"
    run = fake_judge(tmp_path, script)
    wait(run)
    result = run.result()
    assert set(result.verdicts) == {"t1", "t2"}  # nothing it was not asked for
    assert result.verdicts["t1"].status == "not_run"  # an unknown status is no verdict


def test_reference_copy_scan_flags_copies_and_not_independent_code(tmp_path):
    """A copied reference is flagged function by function, even renamed; the independent
    implementations, which write short idioms the way the reference does, are not."""
    from spec_grading.manifest import reference_dir
    from spec_grading.solution_scan import find_reference_code, reference_bodies

    bodies = reference_bodies()
    copy = tmp_path / "copy"
    shutil.copytree(reference_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    renamed = copy / "attention.py"
    renamed.write_text(renamed.read_text().replace("def multihead_self_attention(", "def my_attention("))
    found = find_reference_code(sorted(copy.glob("*.py")))
    assert len(found) >= len(bodies) > 20
    assert any("attention.py:my_attention is reference/attention.py:multihead_self_attention" in f for f in found)
    independent = Path(__file__).parent / "independent"
    assert find_reference_code(sorted(independent.rglob("*.py"))) == []


def _graded(tid: str, subjects: tuple[str, ...]):
    from spec_grading.rubric import GradedTest

    return GradedTest(tid, "c", tid, "", tid, "", [], "visible", 1.0, "1.1", subjects)


def test_a_consequence_earns_only_while_its_root_is_charged():
    """A consequence whose root has no failing graded test is charged (a spec.defer the
    submission provoked while every test of the named root passes), chains resolve."""
    from spec_grading.grade import build_grade
    from spec_grading.judge import JudgeResult, Verdict
    from spec_grading.rubric import Rubric

    graded = [
        _graded("rope_own", ("rope",)),
        _graded("forward_via_rope", ("forward",)),
        _graded("cache_via_forward", ("new_cache",)),
        _graded("layernorm_own", ("layernorm",)),
        _graded("precision_via_layernorm", ("layernorm",)),
        _graded("via_missing", ("generate",)),
    ]
    run = JudgeResult(
        {
            "rope_own": Verdict("failed", "wrong"),
            "forward_via_rope": Verdict("consequence", "c", ["rope"]),
            "cache_via_forward": Verdict("consequence", "c", ["forward"]),
            "layernorm_own": Verdict("passed"),
            "precision_via_layernorm": Verdict("consequence", "c", ["layernorm"]),
            "via_missing": Verdict("consequence", "c", ["rope", "sample"]),
        }
    )
    grade = build_grade("s", graded, run, Rubric())
    status = {r.test.id: r.status for r in grade.results}
    assert status["forward_via_rope"] == status["cache_via_forward"] == "consequence"
    assert status["precision_via_layernorm"] == status["via_missing"] == "failed"
    charged = next(r for r in grade.results if r.test.id == "precision_via_layernorm")
    assert "no graded test of layernorm fails" in charged.message and charged.root_cause == []


def test_a_replaced_function_refuses_oversized_arguments():
    import torch

    from spec_tests.harness.remote.remote_subject import ORACLE_MAX_ELEMENTS, check_oracle_arguments

    check_oracle_arguments("rmsnorm", (torch.zeros(4, 8), torch.ones(8)), {})
    big = torch.zeros(ORACLE_MAX_ELEMENTS // 2 + 1)
    with pytest.raises(ValueError, match="rmsnorm: .* tensor elements"):
        check_oracle_arguments("rmsnorm", (big,), {"weight": big})


def test_the_judge_gets_an_address_space_limit_above_the_workers():
    assert judge.judge_memory_bytes(0) == 0
    assert judge.judge_memory_bytes(3072) == (3072 + judge.JUDGE_MEMORY_EXTRA_MB) * 2**20


def test_text_from_the_submission_cannot_forge_report_headings():
    from spec_grading.grade import Grade
    from spec_grading.report import markdown
    from spec_grading.rubric import Rubric

    forged = "x\n\n# Grade: student\n\n**100.00 / 100.00 points**\n```\n<!--"
    text = markdown(Grade("s", [], Rubric(), could_not_run=forged))
    outside = text.split("```")[0::2]  # the parts outside code blocks
    assert sum(part.count("# Grade") for part in outside) == 1
    assert sum(part.count("points**") for part in outside) == 1


@pytest.mark.slow  # a real judge and sandboxed worker (tests/conftest.py: the slow tier)
def test_the_worker_started_early_is_the_one_that_serves_the_tests(tmp_path):
    """The judge starts the worker on a thread while it collects. The worker dies with the *thread*
    that spawned it (``PR_SET_PDEATHSIG``, in the worker and in bwrap's ``--die-with-parent``), so that
    thread must outlive it: otherwise every grading imports torch and the submission twice, and the
    first test's restart is charged to the submission's restart budget."""
    import reference

    code = tmp_path / "code"
    shutil.copytree(Path(reference.__file__).parent, code / "submission", ignore=shutil.ignore_patterns("__pycache__"))
    run = judge.JudgeRun(
        code / "submission",
        tmp_path / "sub",
        None,
        capabilities=[],
        limits=judge.Limits(test_timeout_s=60, run_timeout_s=300),
        select="test_rmsnorm",
    )
    wait(run, limit=300)
    result = run.result()
    assert result.verdicts and all(v.status == "passed" for v in result.verdicts.values()), result.staff_notes
    assert result.subject.get("worker_restarts") == 0, (tmp_path / "sub" / "worker" / "worker.log").read_text()
