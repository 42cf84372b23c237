"""Reports a student reads, and reports nobody can forge (issue 21 items 3, 6, 7; issue 19 item 5).

Unit tests on hand-made grades (no judge runs): report.md shows the components, then failures
grouped under the function charged, each message once; an import error is one section; test names
are short and whole; every test not passed says how to rerun it; every output names the rubric;
text from the upload (a file name with newlines, ``#``, ``*``, ``|``; a formula) cannot add a
heading, a points line or a table row, nor run in a spreadsheet; setup.sh finds a Python >= 3.11
or says what to pick, and installs only into its own venv; the handout, the grader and the
Gradescope zip built from one rubric agree.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests

from spec_grading import autograder, handout, report
from spec_grading.grade import Grade, TestResult, message_of
from spec_grading.judge import Verdict
from spec_grading.manifest import Manifest
from spec_grading.rubric import Rubric, RubricError, assign, load_rubric, resolve_rubric, short_name
from spec_grading.textsafe import csv_cell, md_fence

ROOT = Path(__file__).resolve().parents[1]
FORGED_NAME = "evil\n\n# Grade: someone else\n\n**100.00 / 100.00 points**\n| total | 99/99 | 100.00 / 100.00 |\n*x*"


def manifest_tests(n_functions=30, cases=9) -> list[dict]:
    """A skeleton-sized manifest: ``n_functions`` functions of ``cases`` cases each."""
    tests = []
    for f in range(n_functions):
        for c in range(cases):
            tests.append(
                {
                    "id": f"test_c{f % 5}.py::test_fn{f}[case{c}]",
                    "file": f"test_c{f % 5}.py",
                    "function": f"test_fn{f}",
                    "params": f"case{c}",
                    "doc": f"fn{f} does its thing (protocol: fn{f}).",
                    "component": f"comp{f % 5}",
                    "subjects": [f"fn{f}"],
                    "uses": [],
                    "bug_classes": [],
                    "points": None,
                    "visibility": None,
                }
            )
    return tests


def grade_of(status: str, message: str, *, submission="sub", could_not_run=None, rubric=None) -> Grade:
    rubric = rubric or Rubric()
    graded = assign(manifest_tests(), rubric)
    return Grade(submission, [TestResult(t, status, message) for t in graded], rubric, could_not_run=could_not_run)


def outside_fences(md: str) -> str:
    """The Markdown text outside fenced code blocks (fences of any length)."""
    out, fence = [], None
    for line in md.splitlines():
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence = stripped[: len(stripped) - len(stripped.lstrip("`"))]
        elif fence is not None and stripped.startswith(fence) and set(stripped) == {"`"}:
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


# -- item 6: what a student reads ---------------------------------------------------------------


def test_the_skeleton_report_is_short_and_grouped():
    """Old layout (one section per test) against the new one, on a 270-test skeleton grade."""
    g = grade_of("not_implemented", "NotImplementedError")
    md = report.markdown(g)
    assert md.count("### ") == 0 and md.count("## Not implemented yet") == 1
    assert all(f"| fn{f} | 9 |" in md for f in range(30))  # one row per function charged
    assert len(md) < 4000, len(md)  # was about 71 kB for the real skeleton (270 sections)
    # a test stopped by a function it needs (a setup failure) is counted under that function
    g.results[0].status, g.results[0].message = "setup", "not implemented: build_model"
    md = report.markdown(g)
    assert "| build_model | 1 |" in md.replace("\\_", "_") and "### " not in md


def test_an_import_error_is_one_section():
    g = grade_of("not_run", "not run: the implementation could not be imported", could_not_run="ImportError: x")
    md = report.markdown(g)
    assert md.count("ImportError: x") == 1 and "270 tests" in md and "could not be imported" in md
    assert len(md) < 3000, len(md)  # was 86 kB of "not run"


def test_failures_are_grouped_under_the_function_charged_each_message_once():
    g = grade_of("failed", "max abs error 1.0 at [0]: expected 1, got 2")
    md = report.markdown(g)
    assert md.count("### ") == 30  # one heading per function, not per test
    assert md.count("max abs error 1.0") == 30  # each distinct message once per function
    assert md.count("(the same message as") == 30 * 8
    assert 'python -m pytest "spec_tests/test_c0.py::test_fn0[case0]"' in md


def test_a_crash_reads_with_what_probing_its_inputs_found():
    """A test that raised shows the exception and, below it, the causes the judge's crash probe found (an input
    property, what the raising line held), as a pytest run prints them; each once."""
    check = {
        "subject": "train",
        "behaviour": "the call runs on inputs the protocol allows",
        "found": "train raised ZeroDivisionError: division by zero (at sub/train.py:37)",
        "causes": ["likely cause: train divides by `warmup_steps`, which is 0 for this call", "note: probed"],
    }
    verdict = Verdict("error", "ZeroDivisionError: division by zero", failed_checks=[check, dict(check)])
    assert message_of(verdict).split("\n") == [
        "ZeroDivisionError: division by zero",
        "  likely cause: train divides by `warmup_steps`, which is 0 for this call",
        "  note: probed",
    ]
    assert message_of(Verdict("error", "ZeroDivisionError: division by zero")) == "ZeroDivisionError: division by zero"


def test_gradescope_tests_carry_a_rerun_command():
    res = report.gradescope(grade_of("failed", "wrong"))
    first = res["tests"][0]
    assert first["output"].startswith("wrong")
    assert first["output"].endswith('Rerun it locally: python -m pytest "spec_tests/test_c0.py::test_fn0[case0]"')


@pytest.mark.parametrize(
    "doc, function, want",
    [
        (
            "rmsnorm = x / sqrt(mean(x**2) + eps) * weight, eps inside the root (course notes: RMSNorm).",
            "test_rmsnorm",
            "rmsnorm = x / sqrt(mean(x**2) + eps) * weight, eps inside the root",
        ),
        (
            "A mask broadcast over batch and heads masks keys of each query row; a [B, 1, Tq, Tk] padding mask differs "
            "per sequence (course notes: mask broadcast shape wrong).",
            "test_sdpa_mask_broadcast",
            "sdpa mask broadcast",
        ),
        ("", "test_cache_overflow_raises", "cache overflow raises"),
        ("Attention is softmax of (q k^T", "test_x", "x"),  # unbalanced: the function's name instead
    ],
)
def test_display_names_are_short_and_whole(doc, function, want):
    assert short_name({"doc": doc, "function": function}) == want


def test_every_display_name_of_the_suite_is_short_and_balanced():
    import importlib
    import inspect

    for path in sorted((ROOT / "spec_tests").glob("test_*.py")):
        module = importlib.import_module(f"spec_tests.{path.stem}")
        for name, obj in vars(module).items():
            if name.startswith("test_") and callable(obj):
                shown = short_name({"doc": inspect.getdoc(obj), "function": name})
                assert len(shown) <= 90 and shown.count("(") == shown.count(")"), (name, shown)


# -- issue 19 item 5: reports that cannot be forged ------------------------------------------------


def test_a_forged_file_name_adds_no_heading_points_or_row():
    g = grade_of("failed", "x", submission=FORGED_NAME, could_not_run=f"ImportError in {FORGED_NAME}")
    g.staff_flags = [f"large file {FORGED_NAME}"]
    for staff in (False, True):
        text = outside_fences(report.markdown(g, staff=staff))
        lines = text.splitlines()
        assert [line for line in lines if line.lstrip().startswith("# ")] == [lines[0]]  # one title
        assert len([line for line in lines if line.lstrip().startswith("**")]) == 1  # one points line
        assert not [line for line in lines if line.startswith("| total")]
        assert "*x*" not in text and "\\*x\\*" in text  # emphasis escaped
    term = report.terminal_report(g, failures=True)
    assert [line for line in term.splitlines() if line.startswith("Grade for")] == [term.splitlines()[0]]
    assert not [line for line in term.splitlines() if line.startswith(("# Grade", "**100", "| total"))]


def test_a_message_cannot_close_its_fence():
    text = "a\n````\n# Grade: forged\n```\n"
    block = md_fence(text)
    assert block[0].startswith("`````") and block[-1] == block[0][: len(block[-1])]
    md = report.markdown(grade_of("failed", text))
    assert "# Grade: forged" not in outside_fences(md)


def test_junit_properties_and_messages_stay_on_one_line_and_parse():
    g = grade_of("failed", "first\nsecond", submission=FORGED_NAME + "\ufffe")
    root = ET.fromstring(report.junit(g).split("?>", 1)[1])
    props = {p.get("name"): p.get("value") for p in root.find("properties")}
    assert "\n" not in props["submission"] and "\ufffe" not in props["submission"]
    assert all("\n" not in f.get("message") for f in root.iter("failure"))


@pytest.mark.parametrize("cell", ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1", " =1"])
def test_csv_formulas_are_defused(cell):
    assert csv_cell(cell).startswith("'")
    g = grade_of("passed", "", submission=cell)
    g.staff_flags = [cell]
    rows = list(csv.reader(io.StringIO(report.gradebook_csv([g]))))
    assert rows[1][0].startswith("'") and rows[1][-3].startswith("'")


# -- item 3: the rubric, named and resolved explicitly -----------------------------------------------


def test_the_rubric_is_never_taken_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "rubric.toml").write_text("total = 7\n")
    monkeypatch.chdir(tmp_path)
    r = resolve_rubric()
    assert r.total == 100 and Path(r.source) == ROOT / "rubric.toml"
    assert r.sha256 == hashlib.sha256((ROOT / "rubric.toml").read_bytes()).hexdigest()
    assert resolve_rubric(str(tmp_path / "rubric.toml")).total == 7


def test_assignment_rubrics_validate(tmp_path):
    bad = tmp_path / "r.toml"
    for text, message in [
        ('[assignment]\nfamilies = ["mamba"]\n', "unknown families"),
        ('[assignment]\nnot_graded = ["telepathy"]\n', "unknown protocol names"),
        ('[[tests]]\nname = "rmsnorm"\ngraded = "no"\n', "graded must be true or false"),
    ]:
        bad.write_text(text)
        with pytest.raises(RubricError, match=message):
            load_rubric(bad)


def test_the_example_course_rubric_selects_its_assignment():
    r = load_rubric(ROOT / "docs" / "rubrics" / "llama-only-course.toml")
    tests = [
        {
            "id": "test_norms.py::test_layernorm[a]",
            "file": "test_norms.py",
            "function": "test_layernorm",
            "subjects": ["layernorm"],
            "uses": [],
            "component": "norms",
            "bug_classes": [],
        },
        {
            "id": "test_precision.py::test_float64_computed_in_float64[rmsnorm]",
            "file": "test_precision.py",
            "function": "test_float64_computed_in_float64",
            "subjects": ["rmsnorm"],
            "uses": [],
            "component": "norms",
            "bug_classes": [],
        },
        {
            "id": "test_norms.py::test_rmsnorm[a]",
            "file": "test_norms.py",
            "function": "test_rmsnorm",
            "subjects": ["rmsnorm"],
            "uses": [],
            "component": "norms",
            "bug_classes": [],
        },
    ]
    kept, dropped = r.select(tests)
    assert [t["function"] for t in kept] == ["test_rmsnorm"] and len(dropped) == 2
    assert r.families == ("llama",) and "gqa" not in r.capabilities


def test_handout_grader_and_zip_built_from_one_rubric_agree(tmp_path):
    rubric = load_rubric(ROOT / "docs" / "rubrics" / "llama-only-course.toml")
    readme = handout.readme(rubric, ["half"], "2.13.0")
    assert rubric.sha256 in readme and "llama" in readme and "sampling_probs" in readme
    res = report.gradescope(grade_of("passed", "", rubric=rubric))
    assert res["extra_data"]["rubric"]["sha256"] == rubric.sha256 and rubric.sha256 in res["output"]
    manifest_file = tmp_path / "cache" / "k" / "manifest.json"
    manifest_file.parent.mkdir(parents=True)
    manifest_file.write_text("{}\n")
    manifest_file.with_name("manifest.json.sha256").write_text("x\n")
    zpath = autograder.write_autograder_zip(tmp_path / "ag.zip", Manifest("k", [], [], manifest_file), rubric)
    with zipfile.ZipFile(zpath) as z:
        shipped = z.read("rubric.toml")
        assert hashlib.sha256(shipped).hexdigest() == rubric.sha256
        assert rubric.sha256 in z.read("rubric.toml.sha256").decode()
        assert rubric.sha256 in z.read("setup.sh").decode() and rubric.sha256 in z.read("run_autograder").decode()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in handout.requirements("2.13.0")


# -- item 7: setup.sh ----------------------------------------------------------------------------------


def fake_python(folder: Path, name: str, version: str, log: Path) -> Path:
    """A stand-in interpreter: answers the version probe, logs every other call, and makes venvs."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$0 $*" >> {log}\n'
        f'if [ "$1" = "-c" ]; then echo "{version}"; exit 0; fi\n'
        'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then /bin/mkdir -p "$3/bin"; /bin/cp "$0" "$3/bin/python"; fi\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return script


def run_setup(tmp_path: Path, pythons: dict[str, str], **env) -> tuple[subprocess.CompletedProcess, str]:
    ag = tmp_path / "ag"
    (ag / "source").mkdir(parents=True)
    (ag / "source" / "setup.sh").write_text(autograder.setup_script(Rubric()))
    log = tmp_path / "calls.log"
    log.write_text("")
    for name, version in pythons.items():
        fake_python(tmp_path / "bin", name, version, log)
    (tmp_path / "bin").mkdir(exist_ok=True)
    full = {"PATH": str(tmp_path / "bin"), "SPEC_AUTOGRADER_ROOT": str(ag), "SPEC_AUTOGRADER_SKIP_APT": "1", **env}
    proc = subprocess.run(["/bin/bash", str(ag / "source" / "setup.sh")], capture_output=True, text=True, env=full)
    return proc, log.read_text()


def test_setup_refuses_an_old_python_and_says_what_to_pick(tmp_path):
    proc, _ = run_setup(tmp_path, {"python3": "3.10.12"})
    assert proc.returncode == 1
    assert "needs Python 3.11 or newer" in proc.stderr and "python3=3.10.12" in proc.stderr
    assert "Gradescope's autograder settings" in proc.stderr and "Ubuntu 24.04" in proc.stderr


def test_setup_installs_only_into_its_own_venv(tmp_path):
    proc, calls = run_setup(tmp_path, {"python3": "3.10.12", "python3.12": "3.12.3"})
    assert proc.returncode == 0, proc.stderr
    lines = calls.splitlines()
    assert any(line.endswith(f"-m venv {tmp_path}/ag/venv") and "python3.12" in line for line in lines)
    pip = [line for line in lines if " -m pip install" in line]
    assert pip and all(line.startswith(f"{tmp_path}/ag/venv/bin/python") for line in pip)  # never the system's
    assert any("--index-url https://download.pytorch.org/whl/cpu" in line for line in pip)
    assert any("-m spec_grading.cli --prepare" in line and "/ag/venv/bin/python" in line for line in lines)


def test_run_autograder_uses_the_venv():
    text = autograder.RUN_AUTOGRADER.format(select="", rubric="r")
    assert 'PY="$AG/venv/bin/python"' in text and 'exec "$PY" -m spec_grading.cli' in text
    assert "python3 -m pip" not in autograder.setup_script(Rubric())


def test_reports_name_the_rubric_everywhere():
    rubric = load_rubric(ROOT / "rubric.toml")
    g = grade_of("failed", "x", rubric=rubric)
    assert rubric.sha256 in report.markdown(g) and rubric.sha256 in report.terminal_report(g)
    assert rubric.sha256 in report.junit(g) and rubric.sha256 in report.gradebook_csv([g])
    assert json.loads(report.gradescope_json(g))["extra_data"]["rubric"]["sha256"] == rubric.sha256
    assert os.path.basename(rubric.source) == "rubric.toml"


# -- issue 19 item 5, end to end: the attack as described --------------------------------------------


@run_ahead
def test_a_hostile_upload_cannot_forge_the_staff_report_or_the_gradebook(tmp_path):
    """An upload named like a formula, holding a large file whose name has newlines, ``#``, ``*`` and
    ``|`` (so it appears in the staff flags), graded with every report form and ``--staff``."""
    import shutil
    import sys

    upload = tmp_path / '=HYPERLINK("x","grade")'
    shutil.copytree(ROOT / "reference", upload, ignore=shutil.ignore_patterns("__pycache__"))
    evil = "a\n\n# Grade: forged\n\n**100.00 points**\n| total | 9 | 9 |\n*.txt"  # a name cannot hold "/"
    (upload / evil).write_text("0" * 150_000)
    rubric = tmp_path / "rubric.toml"
    rubric.write_text("total = 10\n")
    out = {k: tmp_path / f"r.{k}" for k in ("md", "xml", "csv", "json")}
    cmd = [sys.executable, "-m", "spec_grading.cli", "--impl", str(upload), "--select", "test_rmsnorm"]
    cmd += ["--rubric", str(rubric), "--cache-dir", str(shared_cache()), "--staff", "--failures"]
    cmd += ["--markdown", str(out["md"]), "--junit", str(out["xml"]), "--csv", str(out["csv"])]
    cmd += ["--gradescope", str(out["json"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = out["md"].read_text()
    assert "large data" in md  # the flag with the file's name is there, made harmless
    lines = outside_fences(md).splitlines()
    assert [line for line in lines if line.lstrip().startswith("#")] == [lines[0]]
    assert len([line for line in lines if line.lstrip().startswith("**")]) == 1
    assert not [line for line in lines if line.startswith("| total")]
    rows = list(csv.reader(io.StringIO(out["csv"].read_text())))
    assert all(not cell.startswith(("=", "+", "-", "@")) for row in rows[1:] for cell in row)
    assert rows[1][0].startswith("'=HYPERLINK")
    ET.parse(out["xml"])
    assert json.loads(out["json"].read_text())["score"] == 10.0
    assert not [line for line in proc.stdout.splitlines() if line.startswith(("# Grade", "**100"))]
