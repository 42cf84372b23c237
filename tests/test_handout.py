"""spec-handout (spec_grading.handout): the student handout runs offline against recordings made
with ``--spec-record`` (verified by their SHA-256 sidecars), fails every test of the skeleton as not
implemented, passes a correct implementation in either RoPE style, and holds no solution code.

The handout built here is partial (``--tests``: two test files) to stay fast; the static check at
the end covers the whole suite's reliance on the live reference.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import pickletools
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
import torch
from ahead import built_ahead, run_ahead  # tests/ahead.py: built in a runner while other tests run

ROOT = Path(__file__).resolve().parents[1]
HANDOUT = [sys.executable, "-m", "spec_grading.handout"]
TEST_FILES = ["test_norms.py", "test_positions.py"]

HALF_STUDENT = '''"""A correct implementation in the half RoPE style (the reference bound to it)."""
import functools

from .impl import *  # noqa: F403
from . import impl as _impl

ROPE_STYLE = "half"
rope = functools.partial(_impl.rope, style="half")
multihead_self_attention = functools.partial(_impl.multihead_self_attention, rope_style="half")
build_model = functools.partial(_impl.build_model, rope_style="half")
'''


def reference_dir() -> Path:
    import reference

    return Path(reference.__file__).resolve().parent


@built_ahead
def handout(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("handout") / "handout"
    proc = subprocess.run(
        [*HANDOUT, str(out), "--tests", ",".join(TEST_FILES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def run_pytest(folder: Path, junit: Path, *extra: str) -> subprocess.Popen:
    """``pytest spec_tests --impl=student *extra`` inside a handout, the way a student runs it.

    A booby-trapped ``reference`` package is importable: the handout must never import one.
    """
    trap = folder.parent / f"{folder.name}-trap" / "reference"
    trap.mkdir(parents=True, exist_ok=True)
    (trap / "__init__.py").write_text("raise ImportError('the handout imported a reference package')\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(trap.parent)}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "spec_tests", "--impl=student", "-q", f"--junitxml={junit}", *extra],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def junit_cases(path: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, message) of every test case in a JUnit XML file."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        outcome = "failed" if failure is not None else "skipped" if skipped is not None else "passed"
        message = (
            failure.get("message") if failure is not None else skipped.get("message") if skipped is not None else ""
        )
        cases.append((f"{case.get('classname')}::{case.get('name')}", outcome, message or ""))
    return cases


@built_ahead
def handout_runs(handout, tmp_path_factory):
    """The skeleton, the reference's code as a student, and a half-style student, run in parallel."""
    work = tmp_path_factory.mktemp("runs")
    folders = {"skeleton": handout}
    for name in ("interleaved", "half"):
        copy = work / name
        shutil.copytree(handout, copy)
        shutil.rmtree(copy / "student")
        if name == "interleaved":
            shutil.copytree(reference_dir(), copy / "student", ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copytree(reference_dir(), copy / "student" / "impl", ignore=shutil.ignore_patterns("__pycache__"))
            (copy / "student" / "__init__.py").write_text(HALF_STUDENT)
        folders[name] = copy
    procs = {name: (run_pytest(folder, work / f"{name}.xml"), work / f"{name}.xml") for name, folder in folders.items()}
    results = {}
    for name, (proc, junit) in procs.items():
        output, _ = proc.communicate(timeout=600)
        results[name] = (proc.returncode, output, junit_cases(junit) if junit.exists() else [])
    return results


def test_handout_layout(handout):
    assert (handout / "student" / "__init__.py").is_file()
    assert sorted(p.name for p in (handout / "spec_tests").glob("test_*.py")) == sorted(TEST_FILES)
    for style in ("interleaved", "half"):
        recording = handout / "spec_tests" / "recorded" / f"expected-{style}.pt"
        digest = hashlib.sha256(recording.read_bytes()).hexdigest()
        assert (recording.parent / f"{recording.name}.sha256").read_text().strip() == digest
    readme = (handout / "README.md").read_text()
    assert "pytest spec_tests --impl=student" in readme and "torch" in (handout / "requirements.txt").read_text()


def test_handout_holds_no_solution_code(handout):
    from spec_grading.solution_scan import find_reference_code, reference_bodies

    assert not (handout / "reference").exists() and not (handout / "spec_tests" / "bugs").exists()
    py_files = sorted(handout.rglob("*.py"))
    assert len(reference_bodies()) > 20  # the scan has something to look for
    assert find_reference_code(py_files) == []
    text = "\n".join(p.read_text() for p in py_files)
    try:
        from spec_tests.bugs import CATALOG
    except ImportError:
        CATALOG = {}
    reference_text = "\n".join(p.read_text() for p in sorted(reference_dir().glob("*.py")))
    # a short line (``with torch.no_grad():``) or ordinary reference code reveals no bug
    patches = [b.new for b in CATALOG.values() if len(b.new.strip()) >= 30 and b.new.strip() not in reference_text]
    assert len(patches) > 30  # the check has something to look for
    leaked = [p for p in patches if p in text]
    assert not leaked, f"bug patches in the handout: {leaked[:3]}"
    for path in (handout / "spec_tests" / "recorded").glob("*.pt"):
        data = torch.load(path, weights_only=True)  # plain data only: no code can run on loading
        assert set(data) >= {"entries", "catalog", "rope_style"} and data["entries"]
        with zipfile.ZipFile(path) as z:
            pickle = next(n for n in z.namelist() if n.endswith("data.pkl"))
            ops = pickletools.genops(io.BytesIO(z.read(pickle)))
            strings = [str(arg) for op, arg, _ in ops if op.name in ("GLOBAL", "SHORT_BINUNICODE", "BINUNICODE")]
        assert not [s for s in strings if re.match(r"(reference|_spec_bug_)", s)]


def test_skeleton_fails_every_test_as_not_implemented(handout_runs):
    code, output, cases = handout_runs["skeleton"]
    assert code == 1, output
    assert "PytestAssertRewriteWarning" not in output and "already imported" not in output, output[-3000:]
    assert cases and all(outcome == "failed" for _, outcome, _ in cases), output
    assert all(msg.startswith("not implemented: ") for _, _, msg in cases), [
        c for c in cases if "not implemented" not in c[2]
    ][:3]


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_correct_implementation_passes_offline(handout_runs, style):
    code, output, cases = handout_runs[style]
    assert code == 0, output[-3000:]
    assert cases and all(outcome == "passed" for _, outcome, _ in cases)
    assert len(cases) == len(handout_runs["skeleton"][2])


def test_suite_reaches_the_reference_only_through_expectations():
    """Every expected value goes through ``spec``; so a recording can replace the reference in any test file."""
    offenders = []
    for path in sorted((ROOT / "spec_tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Name) and node.id == "reference_module":
                names = ["reference_module"]
            if any(
                n == "reference"
                or n.startswith("reference.")
                or n in ("reference_view", "reference_module", "bugs")
                or n.endswith(".bugs")
                for n in names
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"test files that use the reference directly (expected values go through spec): {offenders}"


def test_replay_refuses_inputs_it_did_not_record():
    from spec_tests.harness.judging.expectations.fingerprints import fingerprint
    from spec_tests.harness.judging.expectations.replay import ReplayExpectations
    from spec_tests.harness.judging.spec import SpecFailure

    x = torch.arange(6.0)
    data = {
        "format": 2,
        "torch": "x",
        "catalog": {},
        "unrecordable": {"test_a.py::test_b::other#0": "a Module cannot be recorded"},
        "entries": {"test_a.py::test_b::value#0": {"fingerprint": fingerprint((x,)), "value": x * 2, "bugs": {}}},
    }
    replay = ReplayExpectations(data, "cpu", source="expected-interleaved.pt")
    assert torch.equal(replay.value("spec_tests/test_a.py::test_b::value#0", None, (x,)), x * 2)
    with pytest.raises(SpecFailure, match="holds no expected value for these inputs"):
        replay.value("spec_tests/test_a.py::test_b::value#0", None, (x + 1,))
    with pytest.raises(SpecFailure, match="could not be recorded"):
        replay.value("spec_tests/test_a.py::test_b::other#0", None, (x,))


@run_ahead
def test_a_modified_recording_is_refused(handout, tmp_path):
    """The replay provider checks each recording's SHA-256 against its sidecar before using it."""
    copy = tmp_path / "handout"
    shutil.copytree(handout, copy)
    recording = copy / "spec_tests" / "recorded" / "expected-interleaved.pt"
    data = bytearray(recording.read_bytes())
    data[len(data) // 2] ^= 0xFF
    recording.write_bytes(bytes(data))
    proc = run_pytest(copy, tmp_path / "junit.xml", "-k", "test_rmsnorm")  # tests that read the recording
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "does not match" in output, output[-2000:]


def test_make_handout_refuses_to_overwrite(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    proc = subprocess.run([*HANDOUT, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    import spec_tests

    suite = Path(spec_tests.__file__).resolve().parent
    for target in (suite.parent, suite / "handout"):  # no --force: a broken check cannot delete anything
        proc = subprocess.run([*HANDOUT, str(target)], capture_output=True, text=True)
        assert proc.returncode == 2 and "refusing" in proc.stderr, target
    proc = subprocess.run([*HANDOUT, str(tmp_path / "new"), "--styles", "diagonal"], capture_output=True, text=True)
    assert proc.returncode == 2 and "'diagonal'" in proc.stderr


def test_the_committed_skeleton_holds_no_solution_code():
    import student
    from spec_grading.handout import implementations_in

    assert implementations_in(Path(student.__file__).resolve().parent) == []
    # the check sees solution code where there is some: every reference module holds it
    found = implementations_in(reference_dir())
    assert {line.split(":")[0] for line in found} >= {f"reference/{p.name}" for p in reference_dir().glob("[a-z]*.py")}


def test_make_handout_refuses_a_student_folder_with_solution_code(tmp_path):
    """Staff who wrote their solution in student/ get a refusal naming what is implemented, not a
    handout that gives it away."""
    import student

    shadow = tmp_path / "shadow"
    shutil.copytree(
        Path(student.__file__).resolve().parent, shadow / "student", ignore=shutil.ignore_patterns("__pycache__")
    )
    norms = shadow / "student" / "norms.py"
    source = norms.read_text()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "rmsnorm")
    lines = source.splitlines()
    raise_line = fn.body[-1].lineno - 1
    indent = lines[raise_line][: len(lines[raise_line]) - len(lines[raise_line].lstrip())]
    lines[raise_line] = f"{indent}return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight"
    norms.write_text("\n".join(lines) + "\nsoftmax_alias = torch.softmax\n")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    cmd = [*HANDOUT, str(tmp_path / "out"), "--tests", TEST_FILES[0]]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=shadow, timeout=120)
    assert proc.returncode == 2 and "refusing" in proc.stderr, proc.stderr
    assert "student/norms.py" in proc.stderr and "rmsnorm() is implemented" in proc.stderr, proc.stderr
    assert "softmax_alias" in proc.stderr and not (tmp_path / "out").exists()
    proc = subprocess.run(
        [*cmd, "--allow-implemented", "rmsnorm"], capture_output=True, text=True, env=env, cwd=shadow, timeout=120
    )
    assert proc.returncode == 2 and "rmsnorm()" not in proc.stderr and "softmax_alias" in proc.stderr, proc.stderr
