"""The upload is data (issue 19, item 1; issue 21, item 2): staging, containment, prompt reports.

The attacks of issue 19 against staging, each built here at run time in ``tmp_path`` (links are
never committed): links to the reference's modules, to the bug catalog, to another submission of
the batch, to ``.`` twice, to ``/dev/zero``, a dangling link, a FIFO, too many files, too deep, too
large, and a never-imported file whose nesting makes ``ast.parse`` raise RecursionError or
MemoryError. The unit tests run the copier with small, count-based limits (no wall-clock limit is
tight: the time limit is tested with a fake clock). One batch then grades the attacks beside a
correct submission: the batch completes (exit 0), the correct one is graded exactly as alone, and
each attack's reports say what was refused. Last, a grader stopped by SIGTERM or SIGINT keeps the
reports of what it had judged.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from ahead import built_ahead, run_ahead  # tests/ahead.py: built in a runner while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests

from spec_grading import batch as batch_mod
from spec_grading.submission import Submission, discover, stage, static_flags
from spec_tests.harness.remote import sandbox
from spec_tests.harness.remote.upload_copy import UploadLimits, copy_upload

SELECT = "test_norms"
RUBRIC = """
total = 100
[limits]
test_timeout_s = 60
memory_mb = 3072
"""
DEEP_RECURSION = "x = a" + ".b" * 20_000 + "\n"  # RecursionError in ast.parse (about 40 kB)
DEEP_MEMORY = "y = " + "-" * 40_000 + "1\n"  # MemoryError in ast.parse (the parser's stack)


def reference_dir() -> Path:
    import reference

    return Path(reference.__file__).resolve().parent


def bugs_dir() -> Path:
    import spec_tests

    return Path(spec_tests.__file__).resolve().parent / "bugs"


def copy_reference(dst: Path) -> Path:
    shutil.copytree(reference_dir(), dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- the copier, unit by unit ---------------------------------------------------------------------


def test_links_are_neither_followed_nor_copied_and_each_is_named(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    (up / "__init__.py").write_text("x = 1\n")
    (up / "model.py").symlink_to(reference_dir() / "model.py")  # the reference's modules
    (up / "catalog").symlink_to(bugs_dir())  # the bug catalog
    other = tmp_path / "other"
    other.mkdir()
    (other / "answer.py").write_text("SECRET = 1\n")
    (up / "other").symlink_to(Path("..") / "other")  # another submission of the batch
    (up / "a").symlink_to(".")
    (up / "b").symlink_to(".")
    (up / "zero").symlink_to("/dev/zero")
    (up / "gone").symlink_to(tmp_path / "no-such-file")  # dangling
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_entries=100))
    assert report.refused_all is None
    assert tree(tmp_path / "copy") == ["__init__.py"]
    lines = report.lines()
    for name, target in [
        ("model.py", reference_dir() / "model.py"),
        ("catalog", bugs_dir()),
        ("other", "../other"),
        ("a", "."),
        ("b", "."),
        ("zero", "/dev/zero"),
        ("gone", tmp_path / "no-such-file"),
    ]:
        assert f"refused: link {name} -> {target} (links are not followed or copied)" in lines, lines
    assert not any(p.is_symlink() for p in (tmp_path / "copy").rglob("*"))


def test_special_files_are_refused_by_name_without_blocking(tmp_path):
    up = tmp_path / "up"
    (up / "pkg").mkdir(parents=True)
    (up / "pkg" / "ok.py").write_text("x = 1\n")
    os.mkfifo(up / "pkg" / "pipe")  # reading it would block forever
    report = copy_upload(up, tmp_path / "copy")
    assert tree(tmp_path / "copy") == ["pkg", "pkg/ok.py"]
    assert report.lines() == ["refused: pkg/pipe is a FIFO (only regular files and folders are staged)"]


def test_too_many_entries_refuse_the_whole_upload(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    for i in range(30):
        (up / f"f{i}.py").write_text("")
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_entries=20))
    assert report.refused_all == "more than 20 entries (the entry-count limit)"
    assert report.lines()[0] == "refused: the whole upload: more than 20 entries (the entry-count limit)"
    assert not (tmp_path / "copy").exists()
    assert copy_upload(up, tmp_path / "copy2", UploadLimits(max_entries=30)).refused_all is None


def test_links_count_as_entries(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    for i in range(30):
        (up / f"l{i}").symlink_to(".")
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_entries=20))
    assert report.refused_all == "more than 20 entries (the entry-count limit)"


def test_folders_too_deep_are_dropped_and_named(tmp_path):
    up = tmp_path / "up"
    deep = up / "d1" / "d2" / "d3" / "d4"
    deep.mkdir(parents=True)
    (deep / "x.py").write_text("")
    (up / "top.py").write_text("")
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_depth=2))
    assert report.refused_all is None
    assert tree(tmp_path / "copy") == ["d1", "d1/d2", "top.py"]
    assert report.lines() == ["refused: folder d1/d2/d3/ is deeper than 2 folders (the depth limit)"]


def test_a_file_over_the_per_file_limit_is_dropped_and_named(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    (up / "big.py").write_bytes(b"#" * 201)
    (up / "ok.py").write_bytes(b"#" * 200)
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_file_bytes=200))
    assert tree(tmp_path / "copy") == ["ok.py"]
    assert report.lines() == ["refused: big.py is 201 bytes, over the per-file limit of 200"]


def test_too_many_bytes_refuse_the_whole_upload(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    for i in range(3):
        (up / f"f{i}.py").write_bytes(b"#" * 400)
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_total_bytes=1000))
    assert report.refused_all == "more than 1000 bytes in all (the total-size limit)"
    assert not (tmp_path / "copy").exists()


def test_staging_longer_than_its_time_limit_refuses_the_upload(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    for i in range(5):
        (up / f"f{i}.py").write_text("")
    ticks = iter(range(1000))  # a fake clock: one second per reading, whatever the machine's speed
    report = copy_upload(up, tmp_path / "copy", UploadLimits(max_seconds=3), clock=lambda: float(next(ticks)))
    assert report.refused_all == "staging took longer than 3 s (the time limit)"
    assert not (tmp_path / "copy").exists()


def test_names_cannot_forge_a_report_line(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    (up / "x\n# Grade: 100\n| a | b |").symlink_to("y\n**100 / 100 points**`")
    [line] = copy_upload(up, tmp_path / "copy").lines()
    assert "\n" not in line and "`" not in line
    assert (
        line
        == "refused: link x\\n# Grade: 100\\n| a | b | -> y\\n**100 / 100 points**' (links are not followed or copied)"
    )


def test_many_refusals_are_named_up_to_a_cap_then_counted(tmp_path):
    up = tmp_path / "up"
    up.mkdir()
    for i in range(50):
        (up / f"l{i:02d}").symlink_to("/dev/zero")
    lines = copy_upload(up, tmp_path / "copy").lines()
    assert len(lines) == 21 and lines[-1] == "... and 30 more entries not staged"


def test_the_limits_refuse_bad_values():
    with pytest.raises(ValueError, match="max_entries must be a number >= 0, got -1"):
        UploadLimits(max_entries=-1)


# -- stage(), discover() and the sandbox's readable copy ------------------------------------------


def test_stage_drops_links_and_names_them_and_tensor_files(tmp_path):
    pkg = tmp_path / "alice"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .stolen import *\n")
    (pkg / "stolen").symlink_to(reference_dir())
    (pkg / "table.pt").write_bytes(b"\0" * 10)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"")
    staged = stage(Submission("alice", pkg), tmp_path / "work")
    assert tree(staged.path) == ["__init__.py"]
    assert staged.lines == [
        f"refused: link stolen -> {reference_dir()} (links are not followed or copied)",
        "not staged: table.pt (tensor data files (.pt, .pth, .bin) are not staged)",
    ]
    assert oct(staged.path.stat().st_mode & 0o777) == "0o755"


def test_a_single_file_submission_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "sub.py")
    staged = stage(Submission("sub", tmp_path / "sub.py"), tmp_path / "work")
    assert staged.path is None and staged.refused_all == "it is a FIFO, not a file or a folder"


def test_the_sandboxs_readable_copy_follows_no_link(tmp_path, capsys):
    src = tmp_path / "submission"
    src.mkdir()
    (src / "__init__.py").write_text("x = 1\n")
    (src / "__init__.py").chmod(0o600)
    (src / "model.py").symlink_to(reference_dir() / "model.py")
    copy = sandbox._readable_copy(src, tmp_path / "work")
    assert tree(copy) == ["__init__.py"]
    assert oct((copy / "__init__.py").stat().st_mode & 0o777) == "0o644"
    assert "refused: link model.py ->" in capsys.readouterr().err


def test_discover_follows_no_link_inside_a_batch(tmp_path):
    subs = tmp_path / "subs"
    copy_reference(subs / "good")
    (subs / "linked").symlink_to(subs / "good")  # a batch entry that is a link
    (subs / "carol").mkdir()
    (subs / "carol" / "student").symlink_to(reference_dir())  # student/ as a link
    (subs / "dave").mkdir()  # not a package at all
    (subs / "erin.zip").write_bytes(b"PK")
    notes: list[str] = []
    found = {s.label: s for s in discover([str(subs)], notes)}
    assert sorted(found) == ["carol", "dave", "good", "linked"]
    assert found["good"].problem is None
    assert found["linked"].problem == f"linked is a link -> {subs / 'good'} (links in an upload are not followed)"
    assert "student is a link ->" in found["carol"].problem and "not followed" in found["carol"].problem
    assert found["dave"].problem.startswith("neither a package")
    assert notes == ["not graded: erin.zip is an archive (unpack it into a folder of its own)"]
    staged = stage(found["linked"], tmp_path / "work")
    assert staged.path is None and staged.lines == [f"refused: {found['linked'].problem}"]


def test_static_flags_survive_a_file_the_parser_cannot_take(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import ctypes\n")
    (pkg / "deep.py").write_text(DEEP_RECURSION)
    (pkg / "deeper.py").write_text(DEEP_MEMORY)
    flags = static_flags(pkg)
    assert "__init__.py:1 uses ctypes" in flags  # the other files are still scanned
    assert "deep.py not scanned (RecursionError while parsing: nested too deeply to scan)" in flags
    assert "deeper.py not scanned (MemoryError while parsing: nested too deeply to scan)" in flags


def test_out_dir_alone_names_every_report_form(tmp_path):
    args = SimpleNamespace(out_dir=str(tmp_path), gradescope=None, markdown=None, junit=None)
    assert batch_mod.report_targets(args, "alice") == {
        "gradescope": tmp_path / "alice" / "results.json",
        "markdown": tmp_path / "alice" / "report.md",
        "junit": tmp_path / "alice" / "report.xml",
    }
    args.markdown = "notes/r.md"
    assert batch_mod.report_targets(args, "alice") == {"markdown": tmp_path / "alice" / "r.md"}


# -- a batch of attacks, end to end ----------------------------------------------------------------


def spec_grade(*args, timeout=900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "spec_grading.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def make_attacks(subs: Path) -> dict[str, str]:
    """The batch: name -> what its report must say was refused."""
    copy_reference(subs / "good")
    expect = {}
    stolen = subs / "stolen_reference"  # its whole code is a link to the reference package
    stolen.mkdir()
    (stolen / "__init__.py").write_text("from .impl import *  # noqa: F403\n")
    (stolen / "impl").symlink_to(reference_dir())
    expect["stolen_reference"] = f"refused: link impl -> {reference_dir()}"
    borrower = subs / "borrower"  # imports another submission of the batch through a link
    borrower.mkdir()
    (borrower / "__init__.py").write_text("from .friend import *  # noqa: F403\n")
    (borrower / "friend").symlink_to(Path("..") / "good")
    expect["borrower"] = "refused: link friend -> ../good"
    links = copy_reference(subs / "links")  # correct code, plus every kind of link and a FIFO
    (links / "catalog").symlink_to(bugs_dir())
    (links / "a").symlink_to(".")
    (links / "b").symlink_to(".")
    (links / "zero").symlink_to("/dev/zero")
    (links / "gone").symlink_to(subs / "nothing-here")
    os.mkfifo(links / "pipe")
    expect["links"] = "refused: link zero -> /dev/zero"
    nested = copy_reference(subs / "nested")  # never imported; ast.parse cannot take it
    (nested / "unused.py").write_text(DEEP_RECURSION)
    (nested / "unused2.py").write_text(DEEP_MEMORY)
    expect["nested"] = ""
    many = copy_reference(subs / "many")
    (many / "data").mkdir()
    for i in range(UploadLimits().max_entries + 1):
        (many / "data" / f"{i}.txt").touch()
    expect["many"] = "the entry-count limit"
    deep = copy_reference(subs / "deep")
    (deep / "/".join(f"d{i}" for i in range(UploadLimits().max_depth + 3))).mkdir(parents=True)
    expect["deep"] = "(the depth limit)"
    large = copy_reference(subs / "large")
    limits = UploadLimits()
    for i in range(limits.max_total_bytes // limits.max_file_bytes + 1):
        with open(large / f"blob{i}.dat", "wb") as f:
            f.truncate(limits.max_file_bytes)  # sparse: no disk used in the upload itself
    expect["large"] = "the total-size limit"
    (subs / "linked").symlink_to(subs / "good")
    expect["linked"] = "linked is a link ->"
    return expect


@built_ahead
def grading_dir(tmp_path_factory) -> Path:
    """A rubric for this file's gradings (their manifests are the session's: tests/manifest_cache.py)."""
    tmp = tmp_path_factory.mktemp("staging")
    (tmp / "rubric.toml").write_text(RUBRIC)
    return tmp


@built_ahead
def attack_batch(grading_dir):
    tmp = grading_dir
    cache, rubric = shared_cache(), tmp / "rubric.toml"
    expect = make_attacks(tmp / "subs")
    common = ["--select", SELECT, "--cache-dir", str(cache), "--rubric", str(rubric), "--jobs", "2"]
    # issue 21: --out-dir alone writes every report form
    proc = spec_grade("--impl", str(tmp / "subs"), "--out-dir", str(tmp / "out"), "--csv", str(tmp / "g.csv"), *common)
    alone = spec_grade("--impl", str(tmp / "subs" / "good"), "--out-dir", str(tmp / "alone"), *common)
    return {"tmp": tmp, "expect": expect, "proc": proc, "alone": alone}


def results(out: Path, name: str) -> dict:
    return json.loads((out / name / "results.json").read_text(encoding="utf-8"))


def test_the_batch_completes_and_every_submission_gets_every_report(attack_batch):
    proc, tmp = attack_batch["proc"], attack_batch["tmp"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = ["good", *attack_batch["expect"]]
    for name in names:
        folder = tmp / "out" / name
        assert sorted(p.name for p in folder.iterdir()) == ["report.md", "report.xml", "results.json"], name
        json.loads((folder / "results.json").read_text(encoding="utf-8"))
        assert (folder / "report.md").read_text(encoding="utf-8").startswith("# Grade")
        ET.parse(folder / "report.xml")
    rows = list(csv.DictReader((tmp / "g.csv").open(encoding="utf-8")))
    assert sorted(r["submission"] for r in rows) == sorted(names)


def test_the_others_are_graded_exactly_as_alone(attack_batch):
    assert attack_batch["alone"].returncode == 0, attack_batch["alone"].stderr[-3000:]
    in_batch = results(attack_batch["tmp"] / "out", "good")
    alone = results(attack_batch["tmp"] / "alone", "good")
    in_batch.pop("execution_time"), alone.pop("execution_time")
    assert in_batch == alone
    assert alone["score"] == 100.0


@pytest.mark.parametrize("name", ["stolen_reference", "borrower", "links", "nested", "many", "deep", "large", "linked"])
def test_each_attack_report_says_what_was_refused(attack_batch, name):
    out = attack_batch["tmp"] / "out"
    res = results(out, name)
    said = attack_batch["expect"][name]
    if said:
        [entry] = [t for t in res["tests"] if t["name"] == batch_mod.NOT_STAGED_TITLE]
        assert said in entry["output"] and said in res["output"]
        assert said in (out / name / "report.md").read_text(encoding="utf-8")
        assert "FLAG (staff): staging: " in attack_batch["proc"].stdout
    else:  # the nested file: a staff flag, and the submission graded normally
        assert "unused.py not scanned (RecursionError" in attack_batch["proc"].stdout
        assert "unused2.py not scanned (MemoryError" in attack_batch["proc"].stdout


@pytest.mark.parametrize(
    "name, score",
    [
        ("stolen_reference", 0.0),  # the link would have given full marks
        ("borrower", 0.0),  # so would the link to the other submission
        ("links", 100.0),  # correct code: the links cost nothing, and gained nothing
        ("nested", 100.0),
        ("deep", 100.0),
        ("many", 0.0),  # refused as a whole: the limit is named
        ("large", 0.0),
        ("linked", 0.0),
    ],
)
def test_each_attack_scores_what_it_deserves(attack_batch, name, score):
    res = results(attack_batch["tmp"] / "out", name)
    assert res["score"] == score, res["output"]
    if name in ("many", "large", "linked"):
        assert res["tests"][0]["name"] == "Could not run your implementation"
        assert "your upload was not staged" in res["tests"][0]["output"]


# -- a stopped grader keeps what it judged -----------------------------------------------------------

HANG = """

def rmsnorm(x, weight, eps=1e-5):
    while True:
        pass
"""


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
@run_ahead
def test_a_stopped_grader_writes_the_reports_of_what_it_judged(grading_dir, tmp_path, how):
    subs = tmp_path / "subs"
    copy_reference(subs / "a_good")
    hang = copy_reference(subs / "b_hang")
    (hang / "norms.py").write_text((hang / "norms.py").read_text() + HANG)
    tmp = grading_dir
    out, gradebook = tmp_path / "out", tmp_path / "g.csv"
    cmd = [sys.executable, "-m", "spec_grading.cli", "--impl", str(subs), "--select", SELECT, "--jobs", "1"]
    cmd += ["--cache-dir", str(shared_cache()), "--rubric", str(tmp / "rubric.toml")]
    cmd += ["--out-dir", str(out), "--csv", str(gradebook)]
    grader = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600  # generous: it only bounds a broken grader
        while not (out / "a_good" / "results.json").exists() and time.monotonic() < deadline:
            assert grader.poll() is None, grader.communicate()
            time.sleep(0.2)
        assert (out / "a_good" / "results.json").exists(), "a_good was never written"
        grader.send_signal(how)
        stdout, stderr = grader.communicate(timeout=120)
    finally:
        if grader.poll() is None:
            grader.kill()
    assert grader.returncode == 128 + how, stderr[-3000:]
    assert results(out, "a_good")["score"] == 100.0, results(out, "a_good")
    written = sorted(p.name for p in (out / "a_good").iterdir())
    assert written == ["report.md", "report.xml", "results.json"], written
    assert not (out / "b_hang").exists(), "the submission being judged when the grader stopped has reports"
    rows = list(csv.DictReader(gradebook.open(encoding="utf-8")))
    assert [r["submission"] for r in rows] == ["a_good"], rows
    assert "Grade for a_good" in stdout and "submissions judged were written" in stderr, (stdout, stderr[-3000:])
