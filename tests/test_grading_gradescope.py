"""The Gradescope autograder zip, end to end (``spec-grade --gradescope-zip``).

The zip is unpacked into a temporary ``autograder/source`` and used as Gradescope would: first
``setup.sh`` (its installs skipped: this environment already has them), then ``run_autograder``
on a sample submission uploaded to ``autograder/submission``. ``SPEC_AUTOGRADER_ROOT`` moves every
``/autograder`` path. The project in the zip must also build as a wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from ahead import built_ahead, run_ahead  # tests/ahead.py: built in a runner while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests

SELECT = "test_norms"


@built_ahead
def autograder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradescope")
    rubric = tmp / "rubric.toml"
    rubric.write_text('total = 50\n[gradescope]\nhidden_message = "hidden"\n')
    archive = tmp / "autograder.zip"
    cmd = [sys.executable, "-m", "spec_grading.cli", "--gradescope-zip", str(archive), "--select", SELECT]
    cmd += ["--cache-dir", str(shared_cache()), "--rubric", str(rubric)]  # the zip ships its key's manifest only
    made = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    root = tmp / "autograder"
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            z.extract(info, root / "source")
            mode = info.external_attr >> 16
            if mode:
                (root / "source" / info.filename).chmod(mode)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp),
        "SPEC_AUTOGRADER_ROOT": str(root),
        "SPEC_AUTOGRADER_SKIP_INSTALL": "1",
    }
    setup = subprocess.run(
        ["bash", str(root / "source" / "setup.sh")], capture_output=True, text=True, env=env, timeout=600
    )
    # Gradescope copies run_autograder next to source/ and runs it for each upload
    shutil.copyfile(root / "source" / "run_autograder", root / "run_autograder")
    (root / "run_autograder").chmod(0o755)
    upload = root / "submission"  # a student uploads the files of their package: here with an rmsnorm bug
    upload.mkdir()
    from spec_tests.bugs import apply_patch, get_bug, reference_sources

    for stem, text in apply_patch(get_bug("rmsnorm_eps_outside_root"), reference_sources()).items():
        (upload / f"{stem}.py").write_text(text)
    run = subprocess.run([str(root / "run_autograder")], capture_output=True, text=True, env=env, timeout=600)
    return {"tmp": tmp, "root": root, "archive": archive, "setup": setup, "run": run}


def test_the_zip_holds_scripts_project_rubric_and_manifest(autograder):
    source = autograder["root"] / "source"
    for name in ("setup.sh", "run_autograder", "pyproject.toml", "rubric.toml"):
        assert (source / name).is_file(), name
    for package in ("reference", "spec_tests", "spec_tests/harness", "spec_tests/bugs", "student", "spec_grading"):
        assert (source / package / "__init__.py").is_file(), package
    assert os.access(source / "setup.sh", os.X_OK) and os.access(source / "run_autograder", os.X_OK)
    [manifest] = (source / "grading-cache").glob("*/manifest.json")
    assert manifest.with_name("manifest.json.sha256").is_file()
    setup = (source / "setup.sh").read_text()
    assert "apt-get install -y bubblewrap" in setup
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in setup
    assert "pip install ." in setup
    assert "total = 50" in (source / "rubric.toml").read_text()
    names = zipfile.ZipFile(autograder["archive"]).namelist()
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pt"))]


def test_setup_uses_the_shipped_manifest(autograder):
    setup = autograder["setup"]
    assert setup.returncode == 0, setup.stderr
    assert "preparing the manifest" not in setup.stderr  # it matched the installed versions
    assert "manifest ready" in setup.stdout


def test_run_autograder_writes_results_as_gradescope_expects(autograder):
    run = autograder["run"]
    assert run.returncode == 0, run.stderr
    results = json.loads((autograder["root"] / "results" / "results.json").read_text(encoding="utf-8"))
    assert 0 < results["score"] < 50  # the rubric in the zip: total 50; rmsnorm is wrong
    assert len(results["tests"]) == 10 and round(sum(t["max_score"] for t in results["tests"]), 2) == 50
    failed = [t for t in results["tests"] if t["status"] == "failed"]
    assert failed and all(t["name"].startswith("rmsnorm") or "[rmsnorm]" in t["name"] for t in failed)
    assert all(len(t["tags"]) == len(set(t["tags"])) for t in results["tests"])
    assert results["stdout_visibility"] == "hidden" and isinstance(results["execution_time"], int)


@built_ahead
def wheel(autograder):
    """The zip's project built as a wheel (what setup.sh installs on Gradescope)."""
    out = autograder["tmp"] / "wheel"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
        + [str(autograder["root"] / "source")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [found] = out.glob("*.whl")
    return found


def test_the_zips_project_builds_as_a_wheel(autograder, wheel):
    source = autograder["root"] / "source"
    meta = tomllib.loads((source / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["spec-grade"] == "spec_grading.cli:main"
    names = zipfile.ZipFile(wheel).namelist()
    for path in (
        "spec_grading/cli.py",
        "spec_tests/harness/plugin/hooks.py",
        "spec_tests/bugs/__init__.py",
        "reference/model.py",
    ):
        assert path in names, path


@run_ahead
def test_an_installed_copy_grades_from_any_folder(wheel, tmp_path):
    """The zip's project installed (not editable) into a folder of its own, run from an empty folder:
    the grader finds the suite, the reference and itself by importing them."""
    target, elsewhere = tmp_path / "installed", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    names = ("spec_grading", "spec_tests", "reference")
    where = f"import {', '.join(names)}; print({', '.join(f'{n}.__file__' for n in names)})"
    found = subprocess.run([sys.executable, "-c", where], capture_output=True, text=True, env=env, cwd=elsewhere)
    assert found.stdout.split() and all(path.startswith(str(target)) for path in found.stdout.split()), found
    out = tmp_path / "installed.json"
    cmd = [
        sys.executable,
        "-m",
        "spec_grading.cli",
        "--impl",
        "reference",
        "--select",
        SELECT,
        "--gradescope",
        str(out),
    ]
    cmd += ["--cache-dir", str(tmp_path / "cache-installed")]
    graded = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=elsewhere, timeout=600)
    assert graded.returncode == 0, graded.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["score"] == 100.0 and len(results["tests"]) == 10, results
