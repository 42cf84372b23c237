"""The trusted pass: the suite run on the reference (no student code), recording expected values
(``--record-expectations``) and the manifest of tests to grade.

One pass per RoPE style needed; results are cached under a key made of the suite's and the
reference's sources, the torch version, the Hypothesis profile and the test selection, so a batch
(or a Gradescope image built with ``tools/grade.py --prepare``) records once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "grading"


class RecordingError(RuntimeError):
    """The trusted pass could not produce a recording."""


@dataclass
class Prepared:
    directory: Path  # holds expected-<style>.pt and manifest.json
    manifest: dict

    @property
    def tests(self) -> list[dict]:
        return self.manifest["tests"]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "transformer-spec" / "grading"


def torch_version() -> str:
    """The installed torch's version, without importing torch (seconds saved in every parent)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def sources_digest(select: str | None, extra: str = "") -> str:
    h = hashlib.sha256()
    for folder in ("spec_tests", "reference"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for path in (ROOT / "tools" / "grading" / "manifest.py",):
        h.update(path.read_bytes())
    h.update(f"{torch_version()}|{sys.version_info[:2]}|{PROFILE}|{select or ''}|{extra}".encode())
    return h.hexdigest()[:20]


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEC_", "PYTEST_", "HYPOTHESIS_"))}
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _record_command(
    style: str, out: Path, select: str | None, manifest: Path | None, live: bool, files: list[str] | None = None
) -> list[str]:
    targets = [f"spec_tests/{f}" for f in files] if files else ["spec_tests"]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-q",
        "-p",
        "no:cacheprovider",
        "--no-header",
        f"--impl=spec_tests.expectations:reference_{style}",
        f"--record-expectations={out}",
        f"--hypothesis-profile={PROFILE}",
        "-o",
        "addopts=",
        "--tb=short",
    ]
    if manifest is not None:
        cmd += ["-p", "tools.grading.manifest", f"--grading-manifest={manifest}"]
    marks = [] if live else ["not needs_live_reference"]
    if marks:
        cmd += [f"-m={' and '.join(marks)}"]
    if select:
        cmd += [f"-k={select}"]
    return cmd


def record(
    styles,
    out: Path,
    *,
    select: str | None = None,
    manifest: bool = True,
    live: bool = True,
    files: list[str] | None = None,
    env: dict | None = None,
    timeout: float = 1800,
) -> dict | None:
    """Run the trusted pass(es) into ``out``; returns the manifest (when asked for)."""
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, style in enumerate(sorted(set(styles))):
        man = out / "manifest.json" if manifest and i == 0 else None
        log = open(out / f"record-{style}.log", "w")
        cmd = _record_command(style, out, select, man, live, files)
        procs.append(
            (
                style,
                subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env={**child_env(), **(env or {})},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                ),
                log,
            )
        )
    for style, proc, log in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RecordingError(f"recording ({style}) did not finish within {timeout:g} s") from None
        finally:
            log.close()
        if proc.returncode not in (0, 1) or not (out / f"expected-{style}.pt").exists():
            tail = (out / f"record-{style}.log").read_text()[-3000:]
            raise RecordingError(f"recording the reference ({style}) failed (exit {proc.returncode}):\n{tail}")
    if manifest:
        return json.loads((out / "manifest.json").read_text())
    return None


def prepare(styles, *, cache_dir: Path | None = None, select: str | None = None, log=None) -> Prepared:
    """Recordings for ``styles`` and the manifest, from the cache or freshly recorded."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    digest = sources_digest(select)
    final = cache_dir / digest
    missing = [s for s in sorted(set(styles)) if not (final / f"expected-{s}.pt").exists()]
    if not missing and (final / "manifest.json").exists():
        return Prepared(final, json.loads((final / "manifest.json").read_text()))
    if log:
        log(f"recording expected values from the reference ({', '.join(missing)}); cached in {final}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="record-", dir=cache_dir))
    try:
        manifest = record(missing, work, select=select, manifest=True)
        final.mkdir(parents=True, exist_ok=True)
        for style in missing:
            os.replace(work / f"expected-{style}.pt", final / f"expected-{style}.pt")
        os.replace(work / "manifest.json", final / "manifest.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Prepared(final, manifest)
