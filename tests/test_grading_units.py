"""spec_grading's parts on their own: safe text, atomic writes, run folders, the judge's watchdog,
reading a judge's verdicts (final file, partial progress, garbage), and the reference-copy scan."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run

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


def test_static_flags_neither_parse_nor_search_a_large_file(tmp_path, monkeypatch):
    """The static flags run in the grader, outside the sandbox: a file over 100 kB (a list literal, which
    ``ast.parse`` takes seconds and gigabytes for) is named "not scanned" and never read by the parser or
    the regular expressions; the other files are still scanned, and a copied reference function found."""
    from spec_grading import submission
    from spec_grading.manifest import reference_dir

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import ctypes\n")
    (pkg / "big.py").write_text("import ctypes\nx = [" + "1, " * 50_000 + "]\n")  # 150 kB
    shutil.copy(reference_dir() / "attention.py", pkg / "copied.py")
    parsed = []
    real_parse = submission._parse
    monkeypatch.setattr(submission, "_parse", lambda path, *a: parsed.append(path.name) or real_parse(path, *a))
    flags = submission.static_flags(pkg)
    assert "big.py not scanned (over 100 kB: not parsed or searched)" in flags, flags
    assert "large data (big.py is 150 kB): copied expected values?" in flags
    assert not any(f.startswith("big.py:") for f in flags), flags  # not searched: its ctypes is not seen
    assert sorted(parsed) == ["__init__.py", "copied.py"]
    assert "__init__.py:1 uses ctypes" in flags
    assert any(re.match(r"contains \d+ functions of the reference: pkg/copied\.py:", f) for f in flags), flags


def test_static_flags_stop_at_their_byte_and_time_budget(tmp_path):
    """All files together are read up to a byte budget and a wall-time budget (a fake clock here); what is
    left out is named, the first 20 files, and the rest counted."""
    from spec_grading.submission import UNSCANNED_NAMED, ScanBudget, static_flags

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for i in range(4):
        (pkg / f"m{i}.py").write_text("import ctypes\n" + "# padding\n" * 100)  # 1,014 bytes each
    flags = static_flags(pkg, ScanBudget(total_bytes=2_500))
    assert [f for f in flags if "ctypes" in f] == ["m0.py:1 uses ctypes", "m1.py:1 uses ctypes"]
    assert "m2.py not scanned (the static scan's 2 kB for all files were spent)" in flags
    assert "m3.py not scanned (the static scan's 2 kB for all files were spent)" in flags
    ticks = iter(range(0, 1000, 4))  # each read of the clock 4 s later
    flags = static_flags(pkg, ScanBudget(seconds=10, clock=lambda: next(ticks)))
    assert [f for f in flags if "ctypes" in f] == ["m0.py:1 uses ctypes", "m1.py:1 uses ctypes"]
    assert "m2.py not scanned (the static scan's 10 s were spent)" in flags and "m3.py not scanned" in str(flags)
    for i in range(4, UNSCANNED_NAMED + 7):
        (pkg / f"m{i:02d}.py").write_text("x = 1\n")
    flags = static_flags(pkg, ScanBudget(total_bytes=0))
    assert sum("not scanned (the static scan's 0 kB" in f for f in flags) == UNSCANNED_NAMED
    assert flags[-1] == "7 more files not scanned", flags[-3:]
    for bad in (-1, "5", True, float("nan")):
        with pytest.raises(
            ValueError, match=f"ScanBudget.total_bytes must be a number >= 0, got {re.escape(repr(bad))}"
        ):
            ScanBudget(total_bytes=bad)


def test_suspicious_patterns_stay_on_one_line():
    """The flags' regular expressions search every scanned file in the grader. Under ``re.M`` a pattern
    starting ``^\\s*`` can run from each line start over every following newline: quadratic (a file of
    40,000 newlines took 20 s). Their whitespace is ``[ \\t]``, and indented imports are still found."""
    from spec_grading.submission import SUSPICIOUS

    for pattern, what in SUSPICIOUS:
        assert "\\s" not in pattern.pattern, (what, pattern.pattern)
    text = "\n" * 5 + "    from reference import model\n  import spec_tests.inputs\n"
    found = {what: text.count("\n", 0, m.start()) + 1 for p, what in SUSPICIOUS if (m := p.search(text))}
    assert found == {"mentions the reference package": 6, "imports the test suite": 7}, found


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


def test_a_consequence_of_a_root_only_not_implemented_earns_nothing():
    """A root that is only not implemented (or not provided, or a setup failure) pays for nothing: its
    consequences are charged, in the grade as in pytest's summary (both read ``settle``); a root that
    really fails (failed or error) still pays for its own."""
    from types import SimpleNamespace

    from spec_grading import grade as grade_module
    from spec_grading.grade import build_grade
    from spec_grading.judge import JudgeResult, Verdict
    from spec_grading.rubric import Rubric
    from spec_tests.harness.judging import settling

    graded = [
        _graded("build_missing", ("build_model",)),
        _graded("cache_via_build", ("new_cache",)),
        _graded("sample_not_provided", ("sample",)),
        _graded("generate_via_sample", ("generate",)),
        _graded("softmax_setup", ("softmax",)),
        _graded("attention_via_softmax", ("scaled_dot_product_attention",)),
        _graded("rope_crashes", ("rope",)),
        _graded("forward_via_rope", ("forward",)),
    ]
    verdicts = {
        "build_missing": Verdict("not_implemented", "not implemented: build_model"),
        "cache_via_build": Verdict("consequence", "c", ["build_model"]),
        "sample_not_provided": Verdict("skipped", "not provided: sample"),
        "generate_via_sample": Verdict("consequence", "c", ["sample"]),
        "softmax_setup": Verdict("setup", "needs linear"),
        "attention_via_softmax": Verdict("consequence", "c", ["softmax"]),
        "rope_crashes": Verdict("error", "ValueError"),
        "forward_via_rope": Verdict("consequence", "c", ["rope"]),
    }
    grade = build_grade("s", graded, JudgeResult(verdicts), Rubric())
    status = {r.test.id: r.status for r in grade.results}
    assert status["cache_via_build"] == status["generate_via_sample"] == status["attention_via_softmax"] == "failed"
    assert status["forward_via_rope"] == "consequence"
    assert [r.test.id for r in grade.results if r.earns] == ["forward_via_rope"]
    charged = next(r for r in grade.results if r.test.id == "cache_via_build")
    assert "only not implemented" in charged.message and charged.score == 0 and charged.root_cause == []
    # the same decision as pytest's summary, by construction
    assert grade_module.settle is settling.settle
    records = [SimpleNamespace(test=t.id, subjects=t.subjects, status=verdicts[t.id].status,
                               root_cause=verdicts[t.id].root_cause) for t in graded]  # fmt: skip
    assert status == {test: s.status for test, s in settling.settle(records).items()}


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


@run_ahead
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
