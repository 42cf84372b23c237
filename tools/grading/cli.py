"""Grade submissions with the spec suite.

    python tools/grade.py --impl path/to/submission [--gradescope results.json] [--markdown report.md]
                          [--junit report.xml] [--csv gradebook.csv]
    python tools/grade.py --impl submissions/ --out-dir grades/ --csv gradebook.csv    # a batch
    python tools/grade.py --prepare                                                      # fill the cache

Prints a per-component table (tests passed, points). Points, visibility and limits come from the
rubric (``rubric.toml``). Exit status: 0 whenever a grade was produced, whatever the score; 2 on
usage errors (bad arguments, missing submission, malformed rubric); 1 when no grade could be
produced (the reference could not be recorded).

How it works: a trusted pass runs the suite on the reference and records every expected value
(cached); each submission then runs in child processes that replay the recording, where the
reference cannot be imported and the recordings cannot be opened (``tools/grading/guard.py``), under
a per-test and a whole-run time limit and a memory limit. See ``tools/grading/__init__.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from . import report  # noqa: E402
from .progress import Progress  # noqa: E402
from .recording import RecordingError, prepare  # noqa: E402
from .rubric import RubricError, assign, load_rubric, unknown_components  # noqa: E402
from .runner import Limits, run_submission  # noqa: E402
from .submission import SubmissionError, discover, rope_style, stage, static_flags  # noqa: E402

DEFAULT_RUBRIC = ROOT / "rubric.toml"
STYLES = ("interleaved", "half")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="tools/grade.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="PATH",
        help="a submission (package folder, folder with student/, .py file, 'student', 'reference') "
        "or a folder of submissions; repeat for several",
    )
    p.add_argument("--gradescope", metavar="FILE", help="write Gradescope results.json here")
    p.add_argument("--markdown", metavar="FILE", help="write a Markdown report here")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report here")
    p.add_argument("--csv", metavar="FILE", help="write a gradebook (one row per submission) here")
    p.add_argument(
        "--out-dir",
        metavar="DIR",
        help="per-submission reports go to DIR/<submission>/ (file names "
        "from --gradescope/--markdown/--junit); required for a batch",
    )
    p.add_argument("--rubric", metavar="FILE", default=str(DEFAULT_RUBRIC), help="rubric file (default: rubric.toml)")
    p.add_argument("--jobs", type=int, default=0, help="submissions graded at once (default: CPU count)")
    p.add_argument("--test-timeout", type=float, metavar="S", help="per-test limit (default: the rubric's)")
    p.add_argument(
        "--run-timeout", type=float, metavar="S", help="whole-run limit per submission (default: the rubric's)"
    )
    p.add_argument("--memory-mb", type=int, metavar="MB", help="memory limit of graded code (default: the rubric's)")
    p.add_argument("--select", metavar="EXPR", help="grade only the tests pytest -k EXPR selects (staff checks)")
    p.add_argument("--cache-dir", metavar="DIR", help="where recordings are cached (default ~/.cache/transformer-spec)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--staff", action="store_true", help="Markdown/JUnit show hidden tests' output and staff flags")
    p.add_argument("--failures", action="store_true", help="also print every test not passed")
    p.add_argument("--leaderboard", metavar="FILE", help="JSON list of Gradescope leaderboard entries to include")
    p.add_argument(
        "--prepare", action="store_true", help="only record expected values (both RoPE styles) into the cache"
    )
    args = p.parse_args(argv)
    if not args.impl and not args.prepare:
        p.error("--impl is required (or --prepare)")
    if args.jobs < 0:
        p.error(f"--jobs must be >= 0, got {args.jobs}")
    for name in ("test_timeout", "run_timeout"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value:g}")
    if args.memory_mb is not None and args.memory_mb < 0:
        p.error(f"--memory-mb must be >= 0, got {args.memory_mb}")
    return p, args


def usage_error(message: str) -> int:
    print(f"tools/grade.py: error: {message}", file=sys.stderr)
    return 2


def load_leaderboard(path) -> list:
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--leaderboard {path}: {exc}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e and "value" in e for e in entries):
        raise ValueError(f"--leaderboard {path}: expected a JSON list of {{'name': ..., 'value': ...}} entries")
    return entries


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def grade_one(sub, graded, prepared, rubric, limits, args, on_result=None):
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        staged = stage(sub, Path(tmp) / "code")
        flags = static_flags(staged)
        if sub.label == "reference":
            flags = [f for f in flags if "functions of the reference" not in f]
        run = run_submission(
            staged,
            [t.id for t in graded],
            prepared.directory,
            limits,
            on_result=on_result,
            device=args.device,
            workdir=Path(tmp) / "run",
        )
    return report.build_grade(
        sub.label, graded, run, rubric, staff_flags=flags, rope_style=rope_style(sub.source) or ""
    )


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    try:
        rubric = load_rubric(args.rubric)
        leaderboard = load_leaderboard(args.leaderboard) if args.leaderboard else []
        submissions = discover(args.impl) if args.impl else []
    except (RubricError, SubmissionError, ValueError) as exc:
        return usage_error(str(exc))
    batch = len(submissions) > 1
    if batch and any((args.gradescope, args.markdown, args.junit)) and not args.out_dir:
        return usage_error("several submissions: give --out-dir DIR for per-submission reports")
    limits = Limits(
        test_timeout_s=args.test_timeout or rubric.test_timeout_s,
        run_timeout_s=args.run_timeout or rubric.run_timeout_s,
        memory_mb=rubric.memory_mb if args.memory_mb is None else args.memory_mb,
    )
    styles = set(STYLES) if args.prepare else set()
    for sub in submissions:
        style = rope_style(sub.source)
        styles |= {style} if style in STYLES else set(STYLES)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    try:
        prepared = prepare(styles, cache_dir=args.cache_dir, select=args.select, log=log)
    except RecordingError as exc:
        print(f"tools/grade.py: no grade produced: {exc}", file=sys.stderr)
        return 1
    if args.prepare:
        print(f"recordings and manifest ready in {prepared.directory}")
        if not submissions:
            return 0
    tests = [t for t in prepared.tests if t["reference_outcome"] == "passed"]
    skipped = [t["id"] for t in prepared.tests if t["reference_outcome"] != "passed"]
    if skipped:
        log(
            f"note: {len(skipped)} tests do not pass on the reference and are not graded: {', '.join(skipped[:5])}"
            + (" ..." if len(skipped) > 5 else "")
        )
    if not tests:
        return usage_error(f"no tests selected{f' by --select {args.select!r}' if args.select else ''}")
    for name in [] if args.select else unknown_components(tests, rubric):
        log(f"note: rubric {rubric.source} weighs component {name!r}, which no graded test has")
    graded = assign(tests, rubric)

    started = time.monotonic()
    grades = {}
    if batch:
        bar = Progress(len(submissions), "grading")
        jobs = args.jobs or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=min(jobs, len(submissions))) as pool:
            futures = {pool.submit(grade_one, sub, graded, prepared, rubric, limits, args): sub for sub in submissions}
            for future in as_completed(futures):
                sub = futures[future]
                grades[sub.label] = future.result()
                bar.advance(sub.label)
    else:
        sub = submissions[0]
        bar = Progress(len(graded), f"grading {sub.label}", tty_only=True)
        grades[sub.label] = grade_one(sub, graded, prepared, rubric, limits, args, on_result=lambda *_: bar.advance())
    ordered = [grades[s.label] for s in submissions]

    for g in ordered:
        out_dir = Path(args.out_dir) / g.submission if args.out_dir else None

        def target(name):
            return out_dir / Path(name).name if out_dir else Path(name)

        if args.gradescope:
            write(target(args.gradescope), report.gradescope_json(g, leaderboard=leaderboard))
        if args.markdown:
            write(target(args.markdown), report.markdown(g, staff=args.staff))
        if args.junit:
            write(target(args.junit), report.junit(g, staff=args.staff))
        print(report.terminal_report(g, failures=args.failures))
        print()
    if args.csv:
        write(Path(args.csv), report.gradebook_csv(ordered))
    if batch:
        print(f"graded {len(ordered)} submissions in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
