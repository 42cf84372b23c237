"""The manifest: which tests are graded, and what the rubric needs of each.

It comes from a trusted pass: the judge run on a staged copy of the reference with the rubric's
capabilities (``collector.py --grading-describe``), exactly as a submission is judged. Tests that
the reference does not pass there (skipped for a capability the rubric does not require, or
failing) are not graded.

The manifest is cached in ``<cache>/<key>/manifest.json`` with its SHA-256 in
``manifest.json.sha256``. ``key`` is a digest of the code that judges (the suite with its harness,
the reference, the grader: ``code_digest``), the rubric's capabilities, the test selection, the
torch and Python versions; the manifest also holds its key. Before use both are checked: a manifest that was
modified, or made for other sources, is prepared again (and the grader says so).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from spec_tests.protocol import ALL_FAMILIES

from .judge import HYPOTHESIS_PROFILE, JudgeRun, Limits, spec_tests_dir
from .packages import package_dir
from .textsafe import write_atomic

FORMAT = 2
NAME = "manifest.json"


class ManifestError(RuntimeError):
    """The trusted pass could not produce a manifest."""


@dataclass
class Manifest:
    key: str
    capabilities: list[str]
    tests: list[dict]  # every test of the pass, with "reference_status"
    path: Path | None = None

    @property
    def graded(self) -> list[dict]:
        return [t for t in self.tests if t["reference_status"] == "passed"]

    @property
    def not_graded(self) -> list[dict]:
        return [t for t in self.tests if t["reference_status"] != "passed"]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "transformer-spec" / "grading"


def torch_version() -> str:
    """The installed torch's version, read without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def reference_dir() -> Path:
    """The reference package's folder (found by the import system)."""
    return package_dir("reference")


def _tree_files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pt"):
            yield path


def code_digest() -> str:
    """A digest of the code that judges: the suite (with its harness), the reference, the grader."""
    h = hashlib.sha256()
    grader = Path(__file__).resolve().parent
    for name, folder in (("spec_tests", spec_tests_dir()), ("reference", reference_dir()), ("spec_grading", grader)):
        for path in _tree_files(folder):
            if "recorded" in path.relative_to(folder).parts or path.suffix not in (".py", ".toml"):
                continue
            h.update(f"{name}/{path.relative_to(folder).as_posix()}".encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def manifest_key(capabilities, select: str | None, families=None) -> str:
    h = hashlib.sha256(code_digest().encode())
    facts = {
        **({"families": sorted(families)} if families and set(families) != set(ALL_FAMILIES) else {}),
        "format": FORMAT,
        "capabilities": sorted(capabilities),
        "select": select or "",
        "torch": torch_version(),
        "python": list(sys.version_info[:2]),
        "profile": HYPOTHESIS_PROFILE,
    }
    h.update(json.dumps(facts, sort_keys=True).encode())
    return h.hexdigest()[:24]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_verified(path: Path, key: str) -> tuple[Manifest | None, str]:
    """The manifest at ``path`` if its digest and key check out; else ``(None, why)``."""
    sidecar = path.with_name(path.name + ".sha256")
    if not path.exists() or not sidecar.exists():
        return None, "not prepared yet"
    try:
        want = sidecar.read_text().strip()
        if _sha256(path) != want:
            return None, f"{path} does not match its SHA-256 (modified?)"
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"{path} could not be read ({exc})"
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return None, f"{path} was made for other sources (key {str(data.get('key'))[:12]}..., want {key[:12]}...)"
    tests = data.get("tests")
    if not isinstance(tests, list) or not all(isinstance(t, dict) and "id" in t for t in tests):
        return None, f"{path} has no valid test list"
    return Manifest(key, list(data.get("capabilities", [])), tests, path), ""


def save(manifest: Manifest, path: Path) -> None:
    data = {"format": FORMAT, "key": manifest.key, "capabilities": manifest.capabilities, "tests": manifest.tests}
    write_atomic(path, json.dumps(data, indent=1, ensure_ascii=True) + "\n")
    write_atomic(path.with_name(path.name + ".sha256"), _sha256(path) + "\n")
    manifest.path = path


def stage_reference(into: Path, families=None) -> Path:
    """A copy of the reference to judge; with ``families`` (the rubric's assignment) it declares only
    those, so tests of another family are skipped there and not graded."""
    target = into / "submission"
    shutil.copytree(reference_dir(), target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if families and set(families) != set(ALL_FAMILIES):
        with open(target / "__init__.py", "a", encoding="utf-8") as f:
            f.write(f"\nFAMILIES = {tuple(families)!r}  # the rubric's assignment\n")
    for entry in [target, *target.rglob("*")]:
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    return target


def run_pass(
    capabilities,
    select: str | None,
    folder: Path,
    *,
    sandbox: str = "auto",
    timeout_s: float = 1800.0,
    families=None,
) -> Manifest:
    """The trusted pass: the judge on the reference; returns the manifest (not saved)."""
    folder.mkdir(parents=True, exist_ok=True)
    staged = stage_reference(folder / "code", families)
    run = JudgeRun(
        staged,
        folder,
        None,
        capabilities=list(capabilities),
        limits=Limits(test_timeout_s=300, run_timeout_s=timeout_s, memory_mb=0),
        sandbox=sandbox,
        select=select,
        describe=True,
    )
    run.start()
    while not run.poll():
        time.sleep(0.1)
    result = run.result()
    if result.could_not_run or not result.described:
        why = result.could_not_run or result.stopped or "no tests were collected"
        raise ManifestError(f"the trusted pass on the reference failed: {why}\n{run.log_tail()}")
    tests = []
    for tid, entry in result.described.items():
        verdict = result.verdicts.get(tid)
        tests.append({**entry, "reference_status": verdict.status if verdict else "not_run"})
    return Manifest(manifest_key(capabilities, select, families), sorted(capabilities), tests)


def prepare(
    capabilities,
    *,
    select: str | None,
    cache_dir: Path | None,
    work: Path,
    sandbox: str = "auto",
    log=print,
    families=None,
) -> Manifest:
    """The manifest for these capabilities, families and selection: from the cache when valid, else made."""
    key = manifest_key(capabilities, select, families)
    path = Path(cache_dir or default_cache_dir()) / key / NAME
    manifest, why = load_verified(path, key)
    if manifest is not None:
        return manifest
    if why != "not prepared yet":
        log(f"note: preparing the manifest again: {why}")
    log(f"preparing the manifest: the suite on the reference (capabilities: {', '.join(capabilities) or 'none'})")
    manifest = run_pass(capabilities, select, work / "manifest-pass", sandbox=sandbox, families=families)
    save(manifest, path)
    return manifest
