"""Running the spec suite in a subprocess, as its users do, on the reference or on a patched copy of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import reference
from spec_tests.bugs import CATALOG

ROOT = Path(__file__).resolve().parent.parent


def run_suite(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``pytest spec_tests -q *args`` in a fresh interpreter (no cache, no warnings summary)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "spec_tests"),
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:warnings",
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


REFERENCE = Path(reference.__file__).resolve().parent


def implementation(tmp_path: Path, *bugs: str, edit=None) -> Path:
    """A copy of the reference with the named catalog patches applied (and ``edit(folder)``)."""
    folder = tmp_path / "impl"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in bugs:
        bug = CATALOG[name]
        path = folder / bug.file
        source = path.read_text()
        assert source.count(bug.old) == 1, name
        path.write_text(source.replace(bug.old, bug.new))
    if edit is not None:
        edit(folder)
    return folder


def statuses(folder: Path, tmp_path: Path, select: str) -> dict[str, str]:
    proc = run_suite(f"--impl={folder}", "-k", select, "-vv", cwd=tmp_path)  # -q -vv: one line per test
    found = dict(re.findall(r"spec_tests/(\S+::\S+) +(PASSED|FAILED|CONSEQUENCE|SKIPPED|XFAIL)", proc.stdout))
    assert found, proc.stdout[-3000:]
    return found
