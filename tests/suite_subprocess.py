"""Running the spec suite as its users do, on the reference or on a patched copy of it: in a subprocess
(a fresh interpreter), or in this one through pytest's ``pytester`` (no interpreter and torch start-up:
seconds less per run, for tests that need no fresh interpreter).

A run in this interpreter is one the suite is made for (its plugin resets the spec seed and the conceal mode
when a session ends), kept apart from this process as far as a fresh interpreter would be: pytester takes back
the modules it imported (an implementation copied to ``impl`` in one run is imported afresh in the next) and
``sys.path``; the global torch RNG and default dtype it changes are put back, and so are the Hypothesis settings
and seeds the plugin gives the property tests of suite modules already imported here (a session that also runs
the suite has imported them, and the run reuses them: a ``--spec-seed`` run would leave its seeds to that
session); the terminal is 80 columns wide (a pipe's) unless ``$COLUMNS`` says otherwise. It keeps this process's
torch threads (one, tests/conftest.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import reference
from spec_tests.bugs import CATALOG
from spec_tests.bugs.bug import replace_once

ROOT = Path(__file__).resolve().parent.parent


SUITE_ARGS = (str(ROOT / "spec_tests"), "-q", "-p", "no:cacheprovider", "-p", "no:warnings")


def run_suite(*args: str, cwd: Path | None = None, pytester=None) -> subprocess.CompletedProcess:
    """``pytest spec_tests -q *args`` (no cache, no warnings summary) in ``cwd`` (default: the project's root):
    in a fresh interpreter, or with ``pytester`` in this one (``run_inline``; default: in pytester's folder)."""
    if pytester is not None:
        return run_inline(pytester, *SUITE_ARGS, *args, cwd=cwd)
    cmd = [sys.executable, "-m", "pytest", *SUITE_ARGS, *args]
    return subprocess.run(cmd, cwd=cwd or ROOT, capture_output=True, text=True, timeout=900)


def run_inline(pytester, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``pytest *args`` in this interpreter through ``pytester``, in ``cwd`` (default: pytester's folder), which
    is importable as a fresh interpreter's working folder is; the outcome as ``subprocess.run`` gives it."""
    folder = Path(cwd or pytester.path)
    dtype, property_tests = torch.get_default_dtype(), _property_tests()
    with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng(devices=[]):
        mp.chdir(folder)
        mp.syspath_prepend(str(folder))
        mp.setenv("COLUMNS", os.environ.get("COLUMNS", "80"))
        try:
            result = pytester.runpytest_inprocess(*args)
        finally:
            torch.set_default_dtype(dtype)
            for test, given in property_tests.items():
                for name in HYPOTHESIS_ATTRIBUTES:
                    if name in given:
                        setattr(test, name, given[name])
                    else:
                        test.__dict__.pop(name, None)
    out, err = "\n".join(result.outlines) + "\n", "\n".join(result.errlines) + "\n"
    return subprocess.CompletedProcess(list(args), int(result.ret), out, err)


# what spec_tests/harness/plugin/hypothesis_profiles.py sets on each property test it runs
HYPOTHESIS_ATTRIBUTES = ("_hypothesis_internal_use_settings", "_hypothesis_internal_use_seed")


def _property_tests() -> dict:
    """The property tests of the suite's modules imported here, each with what it holds of those attributes."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("spec_tests."):
            continue
        for test in list(vars(module).values()):
            if isinstance(test, types.FunctionType) and getattr(test, "hypothesis", None) is not None:
                found[test] = {a: test.__dict__[a] for a in HYPOTHESIS_ATTRIBUTES if a in test.__dict__}
    return found


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
