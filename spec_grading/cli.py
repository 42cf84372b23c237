"""spec-grade: grade submissions with the spec suite.

    spec-grade --impl path/to/submission [--gradescope results.json] [--markdown report.md]
               [--junit report.xml] [--csv gradebook.csv]
    spec-grade --impl submissions/ --out-dir grades/ --csv gradebook.csv      # a batch
    spec-grade --prepare                                                       # the manifest only
    spec-grade --gradescope-zip autograder.zip                                 # the Gradescope autograder

Prints a per-component table (tests earned, points). Points, visibility, limits and the required
capabilities come from the rubric (``--rubric``; default: the project's rubric.toml beside the package,
else built-in defaults; never the working directory's).
Exit status: 0 whenever a grade was produced, whatever the score; 2 on usage errors (bad arguments,
missing submission, malformed rubric); 1 when no grade could be produced (the manifest could not be
prepared, ``--sandbox require`` without a sandbox, or the code that judges changed during grading);
128 + the signal's number on SIGTERM, SIGINT or SIGHUP, after writing the reports of every submission
already judged (and the gradebook of those). One upload never stops a batch (``batch.py``).

How it works: each submission is judged by its own trusted ``pytest`` process (``judge.py``) that
runs the submission only in a sandboxed worker and writes each test's verdict as data; this
process builds the grade from those verdicts and writes every report atomically once the judge is
gone, as soon as that submission is judged. The tests graded come from a trusted pass on the
reference (``manifest.py``, cached).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

from . import report
from .batch import BatchGrader, Writer, ignore_signals
from .judge import Limits
from .manifest import ManifestError, prepare
from .rubric import RubricError, assign, resolve_rubric, unknown_components
from .submission import SubmissionError, discover
from .textsafe import write_atomic
from .workspace import Interrupted, RunFolder, install_signal_handlers, restore_signal_handlers

PROG = "spec-grade"


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
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
        help="per-submission reports go to DIR/<submission>/: the forms named, or every form "
        "(results.json, report.md, report.xml) when none is",
    )
    p.add_argument(
        "--rubric", metavar="FILE", help="rubric file (default: the project's rubric.toml, else built-in; never ./)"
    )
    p.add_argument("--jobs", type=int, default=0, help="submissions judged at once (default: CPU count)")
    p.add_argument("--test-timeout", type=float, metavar="S", help="per-test limit (default: the rubric's)")
    p.add_argument("--run-timeout", type=float, metavar="S", help="whole-run limit per submission (the rubric's)")
    p.add_argument("--memory-mb", type=int, metavar="MB", help="memory limit of graded code (default: the rubric's)")
    p.add_argument("--select", metavar="EXPR", help="grade only the tests pytest -k EXPR selects (staff checks)")
    p.add_argument("--cache-dir", metavar="DIR", help="where manifests are cached (~/.cache/transformer-spec)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--sandbox",
        choices=("auto", "require", "off"),
        default="auto",
        help="auto: the bubblewrap sandbox where possible, else the fallback (reported); require: no grade "
        "without it; off: the fallback (staff laptops without bubblewrap)",
    )
    p.add_argument("--staff", action="store_true", help="Markdown/JUnit show hidden tests' output and staff flags")
    p.add_argument("--failures", action="store_true", help="also print every test not passed")
    p.add_argument("--leaderboard", metavar="FILE", help="JSON list of Gradescope leaderboard entries to include")
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="draw the graded inputs from spec seed N (default: a fresh secret seed per grading, in the staff "
        "output; give it to reproduce a grading exactly; 0 is the handout's own inputs)",
    )
    p.add_argument("--prepare", action="store_true", help="only prepare (and cache) the manifest")
    p.add_argument("--gradescope-zip", metavar="ZIP", help="write the Gradescope autograder zip here and exit")
    args = p.parse_args(argv)
    if not args.impl and not args.prepare and not args.gradescope_zip:
        p.error("--impl is required (or --prepare, or --gradescope-zip)")
    if args.jobs < 0:
        p.error(f"--jobs must be >= 0, got {args.jobs}")
    for name in ("test_timeout", "run_timeout"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value:g}")
    if args.memory_mb is not None and args.memory_mb < 0:
        p.error(f"--memory-mb must be >= 0, got {args.memory_mb}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        p.error(f"--seed must be in [0, 2**63), got {args.seed}")
    return args


def grading_seed(given: int | None) -> int:
    """The spec seed of this grading: ``given``, else drawn here, where no submission runs (never 0,
    the handout's own inputs, whose expected values the handout ships)."""
    if given is not None:
        return given
    seed = 0
    while seed == 0:
        seed = secrets.randbits(63)
    return seed


def usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_leaderboard(path) -> list:
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--leaderboard {path}: {exc}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e and "value" in e for e in entries):
        raise ValueError(f"--leaderboard {path}: expected a JSON list of {{'name': ..., 'value': ...}} entries")
    return entries


def sandbox_status(mode: str) -> tuple[bool, str]:
    """``(available, what)`` as the judges will find it (the harness's own probe)."""
    from spec_tests.harness.remote.sandbox import FALLBACK_LIMITS, sandbox_available

    if mode == "off":
        return False, f"sandbox off (--sandbox off): {FALLBACK_LIMITS}"
    return sandbox_available()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        rubric = resolve_rubric(args.rubric)
        leaderboard = load_leaderboard(args.leaderboard) if args.leaderboard else []
        notes: list[str] = []
        submissions = discover(args.impl, notes) if args.impl else []
    except (RubricError, SubmissionError, ValueError) as exc:
        if args.gradescope and len(args.impl) == 1 and not args.out_dir:  # Gradescope still gets a result
            write_atomic(Path(args.gradescope), report.unusable_submission_json(str(exc)))
        return usage_error(str(exc))
    for note in notes:
        log(f"note: {note}")
    log(f"rubric: {rubric.identity}")
    batch = len(submissions) > 1
    if batch and any((args.gradescope, args.markdown, args.junit)) and not args.out_dir:
        return usage_error("several submissions: give --out-dir DIR for per-submission reports")
    limits = Limits(
        test_timeout_s=args.test_timeout or rubric.test_timeout_s,
        run_timeout_s=args.run_timeout or rubric.run_timeout_s,
        memory_mb=rubric.memory_mb if args.memory_mb is None else args.memory_mb,
    )
    writer = Writer(args, leaderboard, submissions)
    old_handlers = install_signal_handlers()
    try:
        with RunFolder() as run_folder:
            return _grade(args, rubric, submissions, limits, run_folder.path, writer)
    except Interrupted as exc:
        ignore_signals()  # what is judged is written before the grader goes
        writer.finish()
        kept = f"; the reports of the {len(writer.done)} submissions judged were written" if writer.done else ""
        log(f"{PROG}: {exc}; stopped (judges killed, temporary files removed){kept}")
        return 128 + exc.signum
    finally:
        restore_signal_handlers(old_handlers)


def _grade(args, rubric, submissions, limits, work: Path, writer: Writer) -> int:
    sandboxed, sandbox_what = sandbox_status(args.sandbox)
    if args.sandbox == "require" and not sandboxed:
        log(f"{PROG}: no grade produced: --sandbox require, but {sandbox_what}")
        return 1
    sandbox_mode = args.sandbox  # the judges' SPEC_SANDBOX
    if not sandboxed:
        log(f"WARNING: {report.FALLBACK_HEADLINE}: {sandbox_what}")
    capabilities = list(rubric.capabilities)
    try:
        manifest = prepare(
            capabilities,
            select=args.select,
            cache_dir=args.cache_dir,
            work=work,
            sandbox=sandbox_mode,
            log=log,
            families=rubric.families,
        )
    except ManifestError as exc:
        log(f"{PROG}: no grade produced: {exc}")
        return 1
    if args.gradescope_zip:
        from .autograder import write_autograder_zip

        path = write_autograder_zip(Path(args.gradescope_zip), manifest, rubric, select=args.select)
        print(f"Gradescope autograder written to {path}")
        return 0
    if args.prepare:
        print(f"manifest ready: {manifest.path} ({len(manifest.graded)} graded tests)")
        if not submissions:
            return 0
    tests, ungraded = rubric.select(manifest.graded)
    if ungraded:
        reasons = sorted({why for _t, why in ungraded})
        log(f"note: {len(ungraded)} tests are not graded by the rubric's assignment: {'; '.join(reasons)}")
    skipped = [t for t in manifest.not_graded if t["reference_status"] == "skipped"]
    failing = [t for t in manifest.not_graded if t["reference_status"] != "skipped"]
    for left_out, why in (
        (skipped, "need a capability the rubric does not require, or a family it does not grade (skipped there)"),
        (failing, "do not pass on the reference"),
    ):
        if left_out:
            names = ", ".join(t["id"] for t in left_out[:5])
            more = " ..." if len(left_out) > 5 else ""
            log(f"note: {len(left_out)} tests are not graded: they {why}: {names}{more}")
    if not tests:
        return usage_error(f"no tests selected{f' by --select {args.select!r}' if args.select else ''}")
    for name in [] if args.select else unknown_components(tests, rubric):
        log(f"note: rubric {rubric.source} weighs component {name!r}, which no graded test has")
    graded = assign(tests, rubric)
    args.seed = grading_seed(args.seed)
    log(f"(staff) graded inputs drawn from spec seed {args.seed} (--seed {args.seed} grades them again)")
    grader = BatchGrader(
        args, submissions, graded, rubric, limits, work, sandbox_mode, (sandboxed, sandbox_what), writer
    )
    trustworthy = grader.run()
    writer.finish()
    return 0 if trustworthy else 1


if __name__ == "__main__":
    sys.exit(main())
