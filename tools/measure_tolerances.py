"""Measure the reference's own float32 error on the suite's inputs and compare it with the table.

    python tools/measure_tolerances.py           # print measured error vs tolerance per kind
    python tools/measure_tolerances.py --check   # also exit 1 if a tolerance is < 4x its measurement

It runs ``pytest spec_tests --impl=reference`` with ``SPEC_MEASURE_TOLERANCES`` set, so every
float32 ``spec.check`` records ``max |ref_f32 - ref_f64| / (1 + |ref_f64|)`` for its kind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spec_tests.tolerances import FLOAT32  # noqa: E402

MIN_HEADROOM = 4.0


def measure(device: str = "cpu") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        env = dict(os.environ, SPEC_MEASURE_TOLERANCES=str(out))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "spec_tests",
            "-q",
            "--impl=reference",
            f"--device={device}",
            "-p",
            "no:cacheprovider",
        ]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"the suite failed on the reference:\n{run.stdout[-3000:]}")
        return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check", action="store_true", help=f"fail when a tolerance is under {MIN_HEADROOM:g}x its measurement"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    measured = measure(args.device)
    bad = []
    print(f"{'kind':<10} {'measured':>10} {'tolerance':>10} {'headroom':>9}  where")
    for kind, tol in FLOAT32.items():
        m = measured.get(kind, {}).get("measured")
        if m is None:
            print(f"{kind:<10} {'-':>10} {tol.atol:>10.1e} {'-':>9}  (no float32 comparison of this kind)")
            bad.append(f"{kind}: no float32 comparison measures it")
            continue
        headroom = tol.atol / m if m else float("inf")
        print(f"{kind:<10} {m:>10.2e} {tol.atol:>10.1e} {headroom:>8.1f}x  {measured[kind]['where']}")
        if headroom < MIN_HEADROOM:
            bad.append(f"{kind}: tolerance {tol.atol:.1e} is only {headroom:.1f}x the measured {m:.2e}")
    if args.check and bad:
        print("\n".join(["", "tolerance table out of date:", *bad]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
