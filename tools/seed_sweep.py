"""Does any verdict depend on the spec seed? Run the suite under several ``--spec-seed`` values and
compare every verdict with the default seed's.

    python tools/seed_sweep.py                        # seeds 1..5, the CI bug subset, 2 workers
    python tools/seed_sweep.py --seeds 11,12 --bugs all --jobs 2
    python tools/seed_sweep.py --random 3             # 3 seeds drawn now (printed: rerun with --seeds)
    python tools/seed_sweep.py --json sweep.json

Grading draws its inputs (and the model configs' sizes) from a fresh secret seed, so a verdict
that changes with the seed would grade a submission by luck. For the default seed (0, the suite's
own inputs) and each swept seed, in worker processes (as ``tools/bugcheck.py`` runs the catalog):

- the reference passes every test it passes under the default seed, and fails none;
- each implementation of ``tests/independent/`` gets the same outcome on every test;
- each bug of the subset (default ``CI_BUGS``; ``--bugs all`` for the whole catalog), run on the
  test files related to its class only, keeps its bugcheck status (ok: killed in a related file
  with a margin of at least 10x; survived; near-miss) and whether a failure names it;
- the math tolerances keep 4x headroom over the float32-internal error measured under that seed
  (``tools/measure_tolerances.py``'s check, on the reference and ``half_f32_mha``).

Every difference is printed per seed (test id, outcome under the default seed and under that seed;
bug, status and margin). Exit status 1 on any difference or lost headroom.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "tools")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import bugcheck  # noqa: E402

from spec_grading.progress import Progress  # noqa: E402

INDEPENDENT = ("modular_interleaved", "half_f32_mha", "functional_mixed", "meta_complex", "student_mha_tied")
MEASURED = ("reference", "tests/independent/half_f32_mha")  # float32-internal: the tolerance measurement
# Bugs whose catch rests most on sizes and values the seed changes: head layouts and groups, counts
# and byte sizes of a config, scales tied to d_model or d_head, RoPE pairs, sampling boundaries,
# batch ranges, cropping and sliding. Twelve, to keep the CI step near five minutes on two cores
# (``--bugs all`` sweeps the catalog).
CI_BUGS = (
    "split_heads_without_transpose",
    "repeat_kv_tiled",
    "count_parameters_counts_tied_twice",
    "kv_cache_bytes_ignores_gqa",
    "kv_cache_wrong_axis",
    "rope_half_pairs_declared_interleaved",
    "attention_scale_sqrt_d_model",
    "top_p_drops_crossing_token",
    "top_k_off_by_one",
    "get_batch_last_start_unreachable",
    "generate_no_prompt_cropping",
    "generate_cache_past_context",
)


def run_one(task: tuple) -> dict:
    """One suite run in this worker: ``(kind, impl, seed, files, measure)``."""
    import pytest

    from spec_tests.harness.judging import tolerance_measurement

    kind, impl, seed, files, measure = task
    import torch

    torch.manual_seed(bugcheck._INITIAL_SEED)
    recorder = bugcheck.Recorder()
    args = [*bugcheck.suite_paths(tuple(files or ())), f"--spec-impl={impl}", f"--spec-seed={seed}"]
    args += ["-q", "-p", "no:cacheprovider"]
    args += [f"--hypothesis-profile={bugcheck.PROFILE}", "--rootdir", str(ROOT), "-W", "ignore"]
    if impl.startswith("bug:"):
        args.append(f"--spec-diagnosis-bugs={impl[4:]}")
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "measured.json"
        tolerance_measurement._worst.clear()
        if measure:
            os.environ[tolerance_measurement.ENV] = str(out_path)
        out = io.StringIO()
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = int(pytest.main(args, plugins=[recorder]))
        finally:
            os.environ.pop(tolerance_measurement.ENV, None)
        if measure and out_path.exists():
            measured = json.loads(out_path.read_text())
    tests = []
    for nodeid, outcome in recorder.tests.items():
        outcome.markers = recorder.markers.get(nodeid, [])
        tests.append(asdict(outcome))
    return {
        "kind": kind,
        "impl": impl,
        "seed": seed,
        "exit_code": code,
        "seconds": round(time.perf_counter() - start, 2),
        "tests": tests,
        "collect_errors": recorder.collect_errors,
        "output_tail": out.getvalue()[-3000:] if code not in (0, 1) else "",
        "measured": measured,
    }


def tasks_for(seed: int, bugs) -> list[tuple]:
    from spec_tests.bugs import related_files

    tasks = [("reference", "reference", seed, None, True)]
    for name in INDEPENDENT:
        impl = f"tests/independent/{name}"
        tasks.append(("independent", impl, seed, None, impl in MEASURED))
    for bug in bugs:
        tasks.append(("bug", f"bug:{bug.name}", seed, sorted(related_files(bug.bug_class)), False))
    return tasks


def outcomes(result: dict) -> dict[str, str]:
    return {t["nodeid"].split("spec_tests/", 1)[-1]: t["outcome"] for t in result["tests"]}


def compare_runs(base: dict, other: dict) -> list[str]:
    """Lines for every test whose outcome differs between two runs of one implementation."""
    a, b = outcomes(base), outcomes(other)
    lines = []
    for tid in sorted(a.keys() | b.keys()):
        if a.get(tid) != b.get(tid):
            lines.append(f"{tid}: {a.get(tid, 'not collected')} (seed {base['seed']}) -> {b.get(tid, 'not collected')}")
    return lines


def headroom(results: list[dict]) -> dict[str, tuple[float, str]]:
    from spec_tests.harness.judging.tolerances import MATH

    worst: dict[str, dict] = {}
    for r in results:
        for kind, entry in r["measured"].items():
            if entry["measured"] > worst.get(kind, {}).get("measured", -1.0):
                worst[kind] = dict(entry, impl=r["impl"])
    out = {}
    for kind, tol in MATH.items():
        if kind in worst:
            m = worst[kind]["measured"]
            out[kind] = (tol.atol / m if m else float("inf"), f"{worst[kind]['where']} ({worst[kind]['impl']})")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated spec seeds to sweep (default 1..5)")
    parser.add_argument("--random", type=int, default=0, metavar="K", help="sweep K seeds drawn now instead")
    parser.add_argument("--bugs", default="ci", help="'ci' (CI_BUGS, default), 'all', or comma-separated bug names")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (2)")
    parser.add_argument("--json", dest="json_path", help="write every run's outcomes here")
    args = parser.parse_args(argv)

    from spec_tests.bugs import CATALOG, get_bug

    try:
        seeds = [secrets.randbits(40) + 1 for _ in range(args.random)] or [
            int(s) for s in args.seeds.split(",") if s.strip()
        ]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or any(not 0 < s < 2**63 for s in seeds):
        parser.error(f"seeds must be in (0, 2**63): {seeds}")
    names = list(CATALOG) if args.bugs == "all" else list(CI_BUGS) if args.bugs == "ci" else args.bugs.split(",")
    try:
        bugs = [get_bug(n.strip()) for n in names if n.strip()]
    except KeyError as exc:
        parser.error(f"--bugs: unknown bug {exc}")
    print(f"seed sweep: default seed 0 against seeds {', '.join(map(str, seeds))}; {len(bugs)} bugs", flush=True)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import multiprocessing

    all_tasks = [t for seed in [0, *seeds] for t in tasks_for(seed, bugs)]
    start = time.perf_counter()
    results: dict[tuple[str, int], dict] = {}
    progress = Progress(len(all_tasks), every_step=True, elapsed=True)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=max(1, args.jobs), initializer=bugcheck._worker_init) as pool:
        for result in pool.imap_unordered(run_one, all_tasks):
            results[(result["impl"], result["seed"])] = result
            progress.advance(f"{result['impl']} @ {result['seed']}")
    elapsed = time.perf_counter() - start

    problems: list[str] = []
    per_seed_seconds = {s: sum(r["seconds"] for (_, rs), r in results.items() if rs == s) for s in [0, *seeds]}
    base_ref = results[("reference", 0)]
    failing = [tid for tid, o in outcomes(base_ref).items() if o not in ("passed", "skipped")]
    if failing or base_ref["exit_code"] not in (0,):
        problems.append(f"seed 0: the reference does not pass: {failing[:10]} {base_ref['output_tail'][-500:]}")
    bug_base = {b.name: bugcheck.judge(b, results[(f"bug:{b.name}", 0)]) for b in bugs}
    print()
    for seed in [0, *seeds]:
        lines: list[str] = []
        ref = results[("reference", seed)]
        n_pass = sum(o == "passed" for o in outcomes(ref).values())
        summary = [f"reference {n_pass}/{len(ref['tests'])} passed"]
        if seed:
            lines += [f"  reference: {line}" for line in compare_runs(base_ref, ref)]
            for name in INDEPENDENT:
                impl = f"tests/independent/{name}"
                diff = compare_runs(results[(impl, 0)], results[(impl, seed)])
                lines += [f"  {name}: {line}" for line in diff]
            for bug in bugs:
                v0, v = bug_base[bug.name], bugcheck.judge(bug, results[(f"bug:{bug.name}", seed)])
                if (v.status, v.diagnosed) != (v0.status, v0.diagnosed):
                    lines.append(
                        f"  bug {bug.name}: {v0.status} (margin {bugcheck.fmt_margin(v0.margin)}, named {v0.diagnosed})"
                        f" at seed 0 -> {v.status} (margin {bugcheck.fmt_margin(v.margin)}, named {v.diagnosed})"
                    )
                elif v.status != "ok":
                    lines.append(f"  bug {bug.name}: {v.status} at seed 0 and here ({v.detail})")
        room = headroom([results[(impl, seed)] for impl in MEASURED])
        low = {k: h for k, h in room.items() if h[0] < 4.0}
        lines += [f"  tolerance {k}: only {h:.1f}x the measured error, at {where}" for k, (h, where) in low.items()]
        tightest = min(room.items(), key=lambda kv: kv[1][0]) if room else None
        if tightest:
            summary.append(f"tightest tolerance {tightest[0]} {tightest[1][0]:.1f}x")
        killed = sum(bugcheck.judge(b, results[(f"bug:{b.name}", seed)]).status == "ok" for b in bugs)
        summary.append(f"{killed}/{len(bugs)} bugs ok")
        summary.append(f"{per_seed_seconds[seed]:.0f} s of runs")
        print(f"seed {seed}: " + "; ".join(summary) + ("" if lines else "; same verdicts as seed 0" if seed else ""))
        for line in lines:
            print(line)
        problems += [f"seed {seed}: {line.strip()}" for line in lines]
    print(f"\n{len(results)} suite runs in {elapsed:.0f} s wall ({args.jobs} workers)")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(list(results.values()), indent=1))
    if problems:
        print(f"\nseed sweep: {len(problems)} difference(s): a verdict depends on the seed")
        return 1
    print("seed sweep: every verdict is the same under every seed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
