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


def run_suite(*args: str, cwd: Path | None = None, pytester=None, forked: bool = False) -> subprocess.CompletedProcess:
    """``pytest spec_tests -q *args`` (no cache, no warnings summary) in ``cwd`` (default: the project's root):
    in a fresh interpreter, with ``pytester`` in this one (``run_inline``; default: in pytester's folder), or
    ``forked`` from this one (``run_forked``)."""
    if pytester is not None:
        return run_inline(pytester, *SUITE_ARGS, *args, cwd=cwd)
    if forked:
        return run_forked(*SUITE_ARGS, *args, cwd=cwd)
    cmd = [sys.executable, "-m", "pytest", *SUITE_ARGS, *args]
    return subprocess.run(cmd, cwd=cwd or ROOT, capture_output=True, text=True, timeout=900)


TORCH_START_SEED = 67280421310721  # torch's default generator's seed in a new interpreter
FORKED_LIMIT_S = 900.0


def run_forked(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``pytest *args`` in a fork of this interpreter, in ``cwd`` (default: the project's root): no interpreter or
    torch start-up, and nothing the run changes comes back (it ends with the child). For the runners of
    tests/ahead.py, whose tests cannot use ``pytester``. The child starts as a fresh interpreter would in what the
    suite reads: torch's default dtype and seed, the working folder first on ``sys.path``, 80 columns unless
    ``$COLUMNS`` says otherwise, its own ``--basetemp``; the modules this process imported are reused, as
    ``run_inline`` reuses them."""
    import tempfile
    import time

    folder = Path(cwd or ROOT)
    with tempfile.TemporaryDirectory(prefix="forked-suite-") as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        argv = [*args, f"--basetemp={Path(tmp) / 'basetemp'}"]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out_path, os.O_WRONLY | os.O_CREAT)):
                    opened = os.open(path, flags, 0o600)
                    os.dup2(opened, fd)
                    os.close(opened)
                opened = os.open(err_path, os.O_WRONLY | os.O_CREAT, 0o600)
                os.dup2(opened, 2)
                os.close(opened)
                sys.stdout = open(1, "w", closefd=False)  # the child's streams, until os._exit
                sys.stderr = open(2, "w", closefd=False)
                os.chdir(folder)
                sys.path.insert(0, str(folder))
                os.environ["COLUMNS"] = os.environ.get("COLUMNS", "80")
                torch.set_default_dtype(torch.float32)
                torch.manual_seed(TORCH_START_SEED)
                code = int(pytest.main(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - written to the run's stderr, and the run fails
                import traceback

                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        deadline = time.monotonic() + FORKED_LIMIT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(["pytest", *argv], FORKED_LIMIT_S)
            time.sleep(0.05)
        out, err = (path.read_text(encoding="utf-8", errors="replace") for path in (out_path, err_path))
        return subprocess.CompletedProcess(list(args), os.waitstatus_to_exitcode(status), out, err)


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


def implementation(
    tmp_path: Path, *bugs: str, edit=None, patch: tuple[str, str, str] | None = None, patches=()
) -> Path:
    """A copy of the reference with the named catalog patches applied, then ``patch`` and ``patches`` (each ``(file,
    old, new)``: ``old`` replaced once in that file, in turn) and ``edit(folder)``."""
    folder = tmp_path / "impl"
    shutil.copytree(REFERENCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    patches = [(CATALOG[name].file, CATALOG[name].old, CATALOG[name].new, f"bug {name}") for name in bugs] + [
        (*p, "the test's patch") for p in ([patch] if patch is not None else []) + list(patches)
    ]
    for file, old, new, what in patches:
        path = folder / file
        path.write_text(replace_once(path.read_text(), old, new, f"{what} in {file}"))
    if edit is not None:
        edit(folder)
    return folder


def statuses(folder: Path, tmp_path: Path, select: str, pytester=None) -> dict[str, str]:
    """Each selected test's status, from a run with ``pytester`` (in this interpreter) or forked from it."""
    proc = run_suite(
        f"--impl={folder}", "-k", select, "-vv", cwd=tmp_path, pytester=pytester, forked=pytester is None
    )  # -q -vv: a line per test
    found = dict(re.findall(r"spec_tests/(\S+::\S+) +(PASSED|FAILED|CONSEQUENCE|SKIPPED|XFAIL)", proc.stdout))
    assert found, proc.stdout[-3000:]
    return found
