"""Running the spec suite as its users do, on the reference or on a patched copy of it: in a subprocess
(a fresh interpreter), or in this one through pytest's ``pytester`` (no interpreter and torch start-up:
seconds less per run, for tests that need no fresh interpreter)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import reference
from spec_tests.bugs import CATALOG
from spec_tests.bugs.bug import replace_once

ROOT = Path(__file__).resolve().parent.parent


SUITE_ARGS = (str(ROOT / "spec_tests"), "-q", "-p", "no:cacheprovider", "-p", "no:warnings")


def run_suite(*args: str, cwd: Path = ROOT, pytester=None) -> subprocess.CompletedProcess:
    """``pytest spec_tests -q *args`` (no cache, no warnings summary): in a fresh interpreter, or with
    ``pytester`` in this one (in its folder, which is then importable as ``cwd`` would be)."""
    if pytester is not None:
        pytester.syspathinsert()
        result = pytester.runpytest_inprocess(*SUITE_ARGS, *args)
        out, err = "\n".join(result.outlines) + "\n", "\n".join(result.errlines) + "\n"
        return subprocess.CompletedProcess(list(args), int(result.ret), out, err)
    cmd = [sys.executable, "-m", "pytest", *SUITE_ARGS, *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


REFERENCE = Path(reference.__file__).resolve().parent


def implementation(tmp_path: Path, *bugs: str, edit=None) -> Path:
    """A copy of the reference with the named catalog patches applied (and ``edit(folder)``)."""
    folder = tmp_path / "impl"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in bugs:
        bug = CATALOG[name]
        path = folder / bug.file
        path.write_text(replace_once(path.read_text(), bug.old, bug.new, f"bug {name} in {bug.file}"))
    if edit is not None:
        edit(folder)
    return folder


def statuses(folder: Path, tmp_path: Path, select: str, pytester=None) -> dict[str, str]:
    proc = run_suite(
        f"--impl={folder}", "-k", select, "-vv", cwd=tmp_path, pytester=pytester
    )  # -q -vv: a line per test
    found = dict(re.findall(r"spec_tests/(\S+::\S+) +(PASSED|FAILED|CONSEQUENCE|SKIPPED|XFAIL)", proc.stdout))
    assert found, proc.stdout[-3000:]
    return found
