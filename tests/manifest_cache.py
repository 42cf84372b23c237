"""One grading manifest cache for the whole test session.

Each grading prepares a manifest (spec_grading/manifest.py: a trusted judge run of the reference, seconds
each) in its ``--cache-dir``, keyed by the code, the rubric's capabilities and families, the selection and
the torch and Python versions. Test files that grade with the same key share this session's cache, so the
key is prepared once: ``tests/conftest.py`` creates the folder when the session is configured and exports
it in ``SPEC_TESTS_MANIFEST_CACHE``, so that the runner processes of ``tests/ahead.py`` (started with the
session's environment) and the graders use it too, and removes it when the session ends. A session started
with the variable set (a nested one, or one given a folder to keep) uses that folder and leaves it.

Two processes may prepare one key at once: each writes the manifest and then its SHA-256 through a
temporary file and a rename (``textsafe.write_atomic``), and a key's manifest is the same bytes whoever
prepares it, so that is only work done twice; a reader never sees a partial file, and one that comes
between the two renames prepares the key itself.

Tests about the cache itself keep a cache of their own: one that tampers with a manifest, counts the
manifests of its cache, watches its cache for changes, tests ``--prepare``, or grades with an installed
copy of the grader (``private_copy`` gives such a test the shared manifest to start from).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENV = "SPEC_TESTS_MANIFEST_CACHE"


def shared_cache() -> Path:
    """The session's manifest cache, for ``--cache-dir``."""
    folder = os.environ.get(ENV)
    if not folder:
        raise RuntimeError(f"${ENV} is not set: tests/conftest.py sets it when a pytest session starts")
    return Path(folder)


def start() -> str | None:
    """Create the session's cache and export it (returns it), unless ``$SPEC_TESTS_MANIFEST_CACHE`` is set."""
    if os.environ.get(ENV):
        return None
    folder = tempfile.mkdtemp(prefix="spec-tests-manifests-")
    os.environ[ENV] = folder
    return folder


def finish(created: str | None) -> None:
    """Remove the cache ``start`` created (nothing if it created none)."""
    if created is None:
        return
    shutil.rmtree(created, ignore_errors=True)
    if os.environ.get(ENV) == created:
        del os.environ[ENV]


def private_copy(cache: Path, *grader_args: str) -> Path:
    """``cache`` (a new folder) holding a copy of the shared manifest for these grader arguments (``--select``,
    ``--rubric``: what the key depends on), prepared in the shared cache first if it is not there yet."""
    cmd = [sys.executable, "-m", "spec_grading.cli", "--prepare", *grader_args, "--cache-dir", str(shared_cache())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    ready = re.search(r"^manifest ready: (.+) \(\d+ graded tests\)$", proc.stdout, re.M)
    assert proc.returncode == 0 and ready, f"spec-grade --prepare failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    manifest = Path(ready[1])
    (cache / manifest.parent.name).mkdir(parents=True)
    for name in (manifest.name, manifest.name + ".sha256"):
        shutil.copyfile(manifest.with_name(name), cache / manifest.parent.name / name)
    return cache
