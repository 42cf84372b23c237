"""Facts the judge can observe, it observes (issue 19, item 3): a mode-restore bug hidden by
training flags forged inside the worker (tests/grading_cheaters/forged_mode_flags.py) still fails the
mode-restore tests, because with dropout declared they judge the model's outputs.

The submission is the reference's code plus the attack, judged the way spec-grade judges it (the
suite in this process's interpreter, the submission in a worker, ``--spec-remote``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ahead import run_ahead  # tests/ahead.py: run by a runner process while other tests run

HERE = Path(__file__).resolve().parent
CHEATERS = HERE / "grading_cheaters"
SELECT = "test_generate_restores_the_mode or test_evaluate_restores_mode"


def reference_dir() -> Path:
    import reference

    return Path(reference.__file__).resolve().parent


def build(folder: Path, attack: str | None) -> Path:
    pkg = folder / (attack or "honest")
    shutil.copytree(reference_dir(), pkg / "_ref", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(CHEATERS / "_honest.py", pkg / "_honest.py")
    (pkg / "_attack.py").write_text((CHEATERS / f"{attack}.py").read_text() if attack else "")
    (pkg / "__init__.py").write_text("from ._honest import *  # noqa: F403\nfrom ._attack import *  # noqa: F403\n")
    return pkg


def judge(pkg: Path, tmp_path: Path) -> dict[str, str]:
    """``{test id: outcome}`` of the mode-restore tests on ``pkg``, judged remotely."""
    report = tmp_path / f"{pkg.name}.json"
    cmd = [sys.executable, "-m", "pytest", "spec_tests", "-q", "-p", "no:cacheprovider", "-p", "no:warnings"]
    cmd += [f"--spec-remote={pkg}", "-k", SELECT, f"--junitxml={report}.xml", "-rA"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=HERE.parent)
    outcomes = {}
    for line in done.stdout.splitlines():
        for word in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
            if line.startswith(word + " "):
                outcomes[line.split()[1]] = word
    assert outcomes, done.stdout[-3000:] + done.stderr[-3000:]
    report.write_text(json.dumps(outcomes))
    return outcomes


@run_ahead
@pytest.mark.parametrize("family", ["llama"])
def test_forged_flags_do_not_hide_a_mode_restore_bug(tmp_path, family):
    honest = judge(build(tmp_path, None), tmp_path)
    forged = judge(build(tmp_path, "forged_mode_flags"), tmp_path)
    train_cases = [t for t in forged if "train" in t.rsplit("[", 1)[-1] and family in t]
    assert train_cases and all(honest[t] == "PASSED" for t in train_cases), honest
    # the bug leaves a model in training mode in eval mode: the outputs show it, forged flags or not
    assert all(forged[t] == "FAILED" for t in train_cases), forged
