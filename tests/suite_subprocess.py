"""Running the spec suite in a subprocess, as its users do, for the tests that check what pytest prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
