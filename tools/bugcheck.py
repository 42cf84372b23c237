"""Run the spec suite against every catalogued bug and print the kill matrix.

    python tools/bugcheck.py                   # every bug, all cores
    python tools/bugcheck.py --jobs 2 --json bugcheck.json
    python tools/bugcheck.py --bugs kv_cache_prepended,post_ln
    python tools/bugcheck.py --list            # the catalog, one line per bug
    python tools/bugcheck.py --related-only    # each bug on its class's test files only (CI: the same verdicts)

For each bug of ``spec_tests.bugs`` (and first for the reference itself) the suite runs as
``pytest spec_tests --impl=bug:<name>``, several at a time: each worker process imports torch
once and runs the suite in-process for one implementation after another (a fresh pytest
session each, the global torch seed reset), Hypothesis derandomised as in CI but without
shrinking (a kill does not need the smallest example). A failing comparison tries only the bug
under test in its diagnosis (``--full-diagnosis``: every bug of the component, as pytest does),
which is enough to report whether the failure names the bug.

``--related-only`` runs each bug on the test files of its class alone (the reference still on the whole suite):
every status below is decided there, so the verdicts are the same in a fraction of the time, but the matrix then
shows no kills in unrelated files and "diagnosed" counts the related files' failures only. CI runs it so.

Exit status 1 when the reference fails, when a bug survives, when a bug is caught only by test
files unrelated to its class (``spec_tests/bugs/classes.py``), or when its best kill in a
related file has a margin under 10x: the failing comparison's error over its tolerance, parsed
from "N.NNx the tolerance" in the failure. Failures without a tolerance (a ValueError not
raised, a wrong token, an exception, a shape) are categorical: margin infinite.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spec_grading.progress import Progress  # noqa: E402  (the one progress bar)

MIN_MARGIN = 10.0
PROFILE = "spec-ci"
# Column order and short labels of the kill matrix (test-file stems).
FILES = {
    "test_primitives": "prim",
    "test_norms": "norm",
    "test_positions": "pos",
    "test_attention": "attn",
    "test_mlp": "mlp",
    "test_losses": "loss",
    "test_model": "model",
    "test_kv_cache": "cache",
    "test_sampling": "samp",
    "test_generation": "gen",
    "test_training": "train",
}


# ----------------------------------------------------------------------------- worker side


@dataclass
class TestOutcome:
    nodeid: str
    file: str
    outcome: str  # passed | failed | consequence | skipped | xfailed | xpassed
    message: str = ""
    ratio: float | None = None  # worst error / tolerance of the failing checks; None = categorical
    markers: list[str] = field(default_factory=list)
    named: list[str] = field(default_factory=list)  # catalogued bugs the failure's diagnosis names
    codes: list[str] = field(default_factory=list)  # cause codes of the failing checks' diagnoses, ranked
    causes: list[str] = field(default_factory=list)  # the diagnosis lines


class Recorder:
    """A pytest plugin object collecting each test's verdict, typed check results and markers."""

    def __init__(self):
        self.tests: dict[str, TestOutcome] = {}
        self.markers: dict[str, list[str]] = {}
        self.collect_errors: list[str] = []

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.markers[item.nodeid] = sorted({a for m in item.iter_markers("bug_class") for a in m.args})

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}: {(report.longreprtext or '')[:500]}")

    def pytest_runtest_logreport(self, report):
        from spec_tests.harness.judging.results import CRASHED_OR_MISSING, Status, results_of, verdict_of

        verdict = verdict_of(report)
        if verdict is None or (report.when != "call" and not report.skipped):
            return
        file = Path(report.nodeid.split("::")[0]).stem
        status = verdict.status
        if hasattr(report, "wasxfail"):
            status = Status.XPASSED if report.failed else Status.XFAILED
        elif status in CRASHED_OR_MISSING:
            status = Status.FAILED
        failing = [r for r in results_of(report) if r.failed]
        ratios = [r.ratio for r in failing]
        ratio = None if not ratios or any(r is None for r in ratios) else max(ratios)
        named = sorted(
            {c.removeprefix("known_bug:") for r in failing for c in r.cause_codes if c.startswith("known_bug:")}
        )
        message = "\n".join(r.message() for r in failing)[:3000] or verdict.message
        codes = [c for r in failing for c in r.cause_codes]
        causes = [line for r in failing for line in r.causes]
        self.tests[report.nodeid] = TestOutcome(report.nodeid, file, status, message, ratio, named=named, codes=codes,
                                                causes=causes)  # fmt: skip


_INITIAL_SEED = None


def _worker_init() -> None:
    global _INITIAL_SEED
    os.chdir(ROOT)
    import torch

    torch.set_num_threads(1)
    _INITIAL_SEED = torch.initial_seed()


def suite_paths(files: tuple[str, ...] = ()) -> list[str]:
    """The paths a run collects: the test files with these stems, or the whole suite where none is given."""
    if not files:
        return [str(ROOT / "spec_tests")]
    paths = [ROOT / "spec_tests" / f"{stem}.py" for stem in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"no such spec test file: {missing}")
    return [str(p) for p in paths]


def run_suite(task: str | tuple) -> dict:
    """Run the suite against ``impl`` in this process; the per-test outcomes and exit code.

    ``task``: ``impl`` or ``(impl, full_diagnosis[, files])``; ``files``: the test-file stems to run (default: the
    whole suite). Without full diagnosis, a failing check of
    ``bug:<name>`` tries that bug alone (whether the failure names the bug is all the matrix needs;
    trying every candidate of a model component on every failing check would dominate the run time).
    """
    import pytest
    import torch

    impl, full_diagnosis, files = (task, False, ()) if isinstance(task, str) else (*task, ())[:3]
    torch.manual_seed(_INITIAL_SEED)  # as a fresh interpreter would start
    recorder = Recorder()
    args = [*suite_paths(files), f"--spec-impl={impl}", "-q", "-p", "no:cacheprovider",
            f"--hypothesis-profile={PROFILE}", "--rootdir", str(ROOT), "-W", "ignore"]  # fmt: skip
    if impl.startswith("bug:") and not full_diagnosis:
        args.append(f"--spec-diagnosis-bugs={impl[4:]}")
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = int(pytest.main(args, plugins=[recorder]))
    tests = []
    for nodeid, outcome in recorder.tests.items():
        outcome.markers = recorder.markers.get(nodeid, [])
        tests.append(asdict(outcome))
    return {
        "impl": impl,
        "exit_code": code,
        "seconds": round(time.perf_counter() - start, 2),
        "tests": tests,
        "collect_errors": recorder.collect_errors,
        "output_tail": out.getvalue()[-4000:] if code not in (0, 1) else "",
    }


# ----------------------------------------------------------------------------- parent side


@dataclass
class Verdict:
    name: str
    bug_class: str
    corner: bool
    killed_by: dict[str, int]  # file stem -> failing tests
    related: tuple[str, ...]
    margin: float | None  # best ratio among failing tests in related files (inf = categorical)
    status: str  # ok | survived | unrelated | near-miss | error
    marked: bool  # a killing test carries a bug_class marker equal to the bug's class
    diagnosed: bool  # a failure message says "matches known bug <this bug>"
    seconds: float
    detail: str = ""


def judge(bug, result: dict) -> Verdict:
    from spec_tests.bugs import related_files
    from spec_tests.harness.judging.results import KILLING

    failed = [t for t in result["tests"] if t["outcome"] in KILLING]
    killed_by: dict[str, int] = {}
    for t in failed:
        killed_by[t["file"]] = killed_by.get(t["file"], 0) + 1
    related = related_files(bug.bug_class)
    in_related = [t for t in failed if t["file"] in related]
    ratios = [math.inf if t["ratio"] is None else t["ratio"] for t in in_related]
    margin = max(ratios) if ratios else None
    marked = any(bug.bug_class in t["markers"] for t in failed)
    diagnosed = any(bug.name in t["named"] for t in failed)
    detail = ""
    if result["exit_code"] not in (0, 1) or result["collect_errors"]:
        status = "error"
        detail = "; ".join(result["collect_errors"]) or result["output_tail"][-600:]
    elif not failed:
        status = "survived"
    elif not in_related:
        status = "unrelated"
        detail = f"caught only by {sorted(killed_by)}; related: {list(related)}"
    elif margin < MIN_MARGIN:
        status = "near-miss"
        best = max(in_related, key=lambda t: math.inf if t["ratio"] is None else t["ratio"])
        detail = f"best kill {best['nodeid']} at {margin:.3g}x"
    else:
        status = "ok"
    return Verdict(
        bug.name,
        bug.bug_class,
        bug.corner,
        killed_by,
        related,
        margin,
        status,
        marked,
        diagnosed,
        result["seconds"],
        detail,
    )


def fmt_margin(m: float | None) -> str:
    if m is None:
        return "-"
    return "categorical" if math.isinf(m) else f"{m:.3g}x"


def print_matrix(verdicts: list[Verdict], out=sys.stdout) -> None:
    name_w = max(len(v.name) for v in verdicts)
    head = f"{'bug':<{name_w}}  " + " ".join(f"{s:>5}" for s in FILES.values()) + "   margin       diag  status"
    print(head, file=out)
    print("-" * len(head), file=out)
    for v in verdicts:
        cells = []
        for stem in FILES:
            n = v.killed_by.get(stem, 0)
            mark = "*" if stem in v.related else " "
            cells.append(f"{(str(n) if n else '.') + mark:>5}")
        status = v.status.upper() if v.status != "ok" else "ok"
        corner = " (corner)" if v.corner else ""
        diag = "yes" if v.diagnosed else "-"
        print(
            f"{v.name:<{name_w}}  " + " ".join(cells) + f"   {fmt_margin(v.margin):<12} {diag:<5} {status}{corner}",
            file=out,
        )
    print(
        "(cell: failing tests in that file; * = a file meant to catch the bug's class; diag: a failure says "
        "'matches known bug <name>')",
        file=out,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    parser.add_argument("--bugs", default="", help="comma-separated bug names (default: the whole catalog)")
    parser.add_argument("--json", dest="json_path", default=None, help="write every verdict and failure here")
    parser.add_argument(
        "--full-diagnosis",
        action="store_true",
        help="diagnose with every catalogued bug of the component, as pytest does (slower)",
    )
    parser.add_argument(
        "--related-only",
        action="store_true",
        help="run each bug on the test files of its class only (the same verdicts, faster; CI runs so)",
    )
    parser.add_argument("--list", action="store_true", help="print the catalog (name, class, explanation) and exit")
    parser.add_argument(
        "--stall-timeout", type=float, default=300.0, help="abort when no run finishes for this long (s)"
    )
    args = parser.parse_args(argv)

    from spec_tests.bugs import CATALOG, apply_patch, get_bug, reference_sources, related_files
    from spec_tests.harness.judging.results import Status

    names = [n.strip() for n in args.bugs.split(",") if n.strip()] or list(CATALOG)
    if args.list:
        for bug in (get_bug(n) for n in names):
            corner = ", corner" if bug.corner else ""
            print(f"{bug.name} ({bug.bug_class}{corner}; reference/{bug.file}): {bug.explanation}. Fix: {bug.fix}")
        return 0
    bugs = [get_bug(n) for n in names]
    sources = reference_sources()
    for bug in bugs:  # a patch that no longer applies is an error before anything runs
        apply_patch(bug, sources)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    impls = ["reference"] + [f"bug:{b.name}" for b in bugs]
    progress = Progress(len(impls), every_step=True, elapsed=True)
    results: dict[str, dict] = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=max(1, min(args.jobs, len(impls))), initializer=_worker_init) as pool:
        tasks = [("reference", args.full_diagnosis, ())] + [
            (f"bug:{b.name}", args.full_diagnosis, related_files(b.bug_class) if args.related_only else ())
            for b in bugs
        ]
        pending = pool.imap_unordered(run_suite, tasks)
        for _ in impls:
            try:
                result = pending.next(timeout=args.stall_timeout)
            except multiprocessing.TimeoutError:
                missing = sorted(set(impls) - set(results))
                print(
                    f"\nbugcheck: no run finished in {args.stall_timeout:.0f}s; unfinished: {missing}", file=sys.stderr
                )
                pool.terminate()
                return 2
            results[result["impl"]] = result
            progress.advance(result["impl"])
    elapsed = time.perf_counter() - start

    ref = results["reference"]
    ref_failures = [t for t in ref["tests"] if t["outcome"] in (Status.FAILED, Status.XPASSED)]
    verdicts = [judge(b, results[f"bug:{b.name}"]) for b in bugs]
    print()
    print_matrix(verdicts)
    if args.related_only:
        print("(--related-only: each bug ran on its class's test files alone, so other files show no kills)")
    print()

    problems = []
    if ref["exit_code"] != 0 or ref_failures or ref["collect_errors"]:
        problems.append(
            f"the reference fails: exit code {ref['exit_code']}, failing {[t['nodeid'] for t in ref_failures]}"
            f" {ref['collect_errors']}"
        )
    for v in verdicts:
        if v.status != "ok":
            problems.append(f"{v.name}: {v.status}" + (f" ({v.detail})" if v.detail else ""))

    finite = [v.margin for v in verdicts if v.margin is not None and not math.isinf(v.margin)]
    n_cat = sum(1 for v in verdicts if v.margin is not None and math.isinf(v.margin))
    killed = sum(1 for v in verdicts if v.killed_by)
    print(
        f"bugs: {len(verdicts)}, killed: {killed}, survived: {len(verdicts) - killed}, "
        f"ok: {sum(v.status == 'ok' for v in verdicts)}"
    )
    if finite:
        worst = min((v for v in verdicts if v.margin in finite), key=lambda v: v.margin)
        print(f"margins: smallest numeric {worst.margin:.3g}x ({worst.name}); {n_cat} bugs killed categorically")
    print(
        f"diagnosed by name in a failure: {sum(v.diagnosed for v in verdicts)}/{killed} killed bugs "
        "(the others fail only in checks that do not compare with the reference's output)"
    )
    print(f"reference: {len(ref['tests'])} tests, {len(ref_failures)} failing, {ref['seconds']:.1f}s")
    scope = " (each bug on its class's test files only)" if args.related_only else ""
    print(f"bugcheck: {len(impls)} suite runs on {args.jobs} workers in {elapsed:.0f}s{scope}")
    if args.json_path:
        payload = {
            "elapsed_seconds": round(elapsed, 1),
            "jobs": args.jobs,
            "min_margin": MIN_MARGIN,
            "verdicts": [
                {
                    **asdict(v),
                    "margin": None if v.margin is None else (str(v.margin) if math.isinf(v.margin) else v.margin),
                }
                for v in verdicts
            ],
            "runs": results,
        }
        Path(args.json_path).write_text(json.dumps(payload, indent=1))
    if problems:
        print("\nFAILED:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print("every catalogued bug is killed by a related test file with margin >= 10x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
