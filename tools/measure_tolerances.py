"""Measure the error of float32-internal computation on the suite's inputs and compare it with the
math tolerance table (``spec_tests/harness/judging/tolerances.py``).

    python tools/measure_tolerances.py           # print measured error vs tolerance per kind
    python tools/measure_tolerances.py --check   # also exit 1 if a tolerance is < 4x its measurement

It runs the suite with ``SPEC_MEASURE_TOLERANCES`` set, so every check with a math tolerance records
``max |actual - expected| / (1 + |expected|)`` for its kind, on implementations that compute in
float32 inside:

- the reference itself, whose float32 test cases compute in float32;
- ``tests/independent/half_f32_mha``, an independent implementation that computes in float32
  whatever the input dtype (``x.float()`` norms, float32 RoPE angles, a float32 softmax and loss),
  as Meta's and Hugging Face's Llama do.

The largest error per kind over both runs is what each tolerance must admit (with 4x headroom).
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

from spec_tests.harness.judging.tolerances import BFLOAT16, MATH  # noqa: E402

MIN_HEADROOM = 4.0
FLOAT32_INTERNAL = ("reference", "tests/independent/half_f32_mha")


def measure(impl: str, device: str = "cpu", seed: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        env = dict(os.environ, SPEC_MEASURE_TOLERANCES=str(out))
        # the precision tests hold float64 to 1e-10 and fail float32-internal code by design
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "spec_tests",
            "-q",
            f"--spec-impl={impl}",
            f"--spec-device={device}",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:warnings",
            "--ignore=spec_tests/test_precision.py",
            f"--spec-seed={seed}",
        ]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"the suite failed on {impl}:\n{run.stdout[-3000:]}")
        return {k: dict(v, impl=impl) for k, v in json.loads(out.read_text()).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help=f"fail when a tolerance is under {MIN_HEADROOM:g}x")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--seed", type=int, default=0, help="the spec seed the inputs are drawn from (default 0)")
    parser.add_argument("--impl", action="append", help=f"implementations to measure (default: {FLOAT32_INTERNAL})")
    args = parser.parse_args()
    measured: dict[str, dict] = {}
    for impl in args.impl or FLOAT32_INTERNAL:
        for kind, entry in measure(impl, args.device, args.seed).items():
            if entry["measured"] > measured.get(kind, {}).get("measured", -1.0):
                measured[kind] = entry
    bad = []
    print(f"{'kind':<10} {'measured':>10} {'tolerance':>10} {'headroom':>9}  where")
    for kind, tol in [*MATH.items(), *((f"{k}@bfloat16", t) for k, t in BFLOAT16.items())]:
        m = measured.get(kind, {}).get("measured")
        if m is None:
            print(f"{kind:<10} {'-':>10} {tol.atol:>10.1e} {'-':>9}  (no check of this kind)")
            bad.append(f"{kind}: no check measures it")
            continue
        headroom = tol.atol / m if m else float("inf")
        where = f"{measured[kind]['where']} ({measured[kind]['impl']})"
        print(f"{kind:<10} {m:>10.2e} {tol.atol:>10.1e} {headroom:>8.1f}x  {where}")
        if headroom < MIN_HEADROOM:
            bad.append(f"{kind}: tolerance {tol.atol:.1e} is only {headroom:.1f}x the measured {m:.2e}")
    if args.check and bad:
        print("\n".join(["", "tolerance table out of date:", *bad]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
