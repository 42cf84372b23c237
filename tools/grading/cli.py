"""spec-grade: grade submissions with the spec suite.

    spec-grade --impl path/to/submission [--gradescope results.json] [--markdown report.md]
               [--junit report.xml] [--csv gradebook.csv]
    spec-grade --impl submissions/ --out-dir grades/ --csv gradebook.csv      # a batch
    spec-grade --prepare                                                       # the manifest only
    spec-grade --gradescope-zip autograder.zip                                 # the Gradescope autograder

Prints a per-component table (tests earned, points). Points, visibility, limits and the required
capabilities come from the rubric (``--rubric``, default ./rubric.toml, else built-in defaults).
Exit status: 0 whenever a grade was produced, whatever the score; 2 on usage errors (bad arguments,
missing submission, malformed rubric); 1 when no grade could be produced (the manifest could not be
prepared, ``--sandbox require`` without a sandbox, or the code that judges changed during grading).

How it works: each submission is judged by its own trusted ``pytest`` process (``judge.py``) that
runs the submission only in a sandboxed worker and writes each test's verdict as data; this
process builds the grade from those verdicts and writes every report atomically once the judge is
gone. The tests graded come from a trusted pass on the reference (``manifest.py``, cached).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import report
from .grade import build_grade
from .judge import JudgeResult, JudgeRun, Limits, Verdict
from .manifest import ManifestError, code_digest, default_cache_dir, prepare
from .progress import Progress
from .rubric import RubricError, assign, resolve_rubric, unknown_components
from .submission import SubmissionError, discover, stage, static_flags
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
    p.add_argument("--out-dir", metavar="DIR", help="per-submission reports go to DIR/<submission>/ (batch)")
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
    return args


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
    from spec_tests.harness.sandbox import FALLBACK_LIMITS, sandbox_available

    if mode == "off":
        return False, f"sandbox off (--sandbox off): {FALLBACK_LIMITS}"
    return sandbox_available()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        rubric = resolve_rubric(args.rubric)
        leaderboard = load_leaderboard(args.leaderboard) if args.leaderboard else []
        submissions = discover(args.impl) if args.impl else []
    except (RubricError, SubmissionError, ValueError) as exc:
        if args.gradescope and len(args.impl) == 1 and not args.out_dir:  # Gradescope still gets a result
            write_atomic(Path(args.gradescope), report.unusable_submission_json(str(exc)))
        return usage_error(str(exc))
    log(f"rubric: {rubric.identity}")
    batch = len(submissions) > 1
    if batch and any((args.gradescope, args.markdown, args.junit)) and not args.out_dir:
        return usage_error("several submissions: give --out-dir DIR for per-submission reports")
    limits = Limits(
        test_timeout_s=args.test_timeout or rubric.test_timeout_s,
        run_timeout_s=args.run_timeout or rubric.run_timeout_s,
        memory_mb=rubric.memory_mb if args.memory_mb is None else args.memory_mb,
    )
    old_handlers = install_signal_handlers()
    try:
        with RunFolder() as run_folder:
            return _grade(args, rubric, leaderboard, submissions, limits, run_folder.path)
    except Interrupted as exc:
        log(f"{PROG}: {exc}; stopped (judges killed, temporary files removed)")
        return 128 + exc.signum
    finally:
        restore_signal_handlers(old_handlers)


def _grade(args, rubric, leaderboard, submissions, limits, work: Path) -> int:
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
    grades, trustworthy = judge_all(
        args, submissions, graded, rubric, limits, work, sandbox_mode, (sandboxed, sandbox_what)
    )
    write_reports(args, grades, leaderboard)
    return 0 if trustworthy else 1


def judge_all(args, submissions, graded, rubric, limits, work, sandbox_mode, sandbox) -> tuple[list, bool]:
    """Judge every submission (``--jobs`` at once) and build their grades, in submission order; and
    whether the code that judges stayed unchanged throughout (else the rest is not graded)."""
    ids = [t.id for t in graded]
    jobs = max(1, args.jobs or os.cpu_count() or 1)
    batch = len(submissions) > 1
    bar = (
        Progress(len(submissions), "grading")
        if batch
        else Progress(len(graded), f"grading {submissions[0].label}", tty_only=True)
    )
    pending = list(enumerate(submissions))
    running: dict[int, tuple] = {}
    grades: dict[int, object] = {}
    started = time.monotonic()
    trusted = code_digest()
    tainted: str | None = None
    try:
        while (pending or running) and tainted is None:
            while pending and len(running) < jobs:
                i, sub = pending.pop(0)
                folder = work / f"sub-{i}"
                staged = stage(sub, folder / "code")
                flags = static_flags(staged)
                if sub.label == "reference":
                    flags = [f for f in flags if "functions of the reference" not in f]
                run = JudgeRun(
                    staged,
                    folder,
                    ids,
                    capabilities=list(rubric.capabilities),
                    limits=limits,
                    device=args.device,
                    sandbox=sandbox_mode,
                    on_result=None if batch else (lambda *_: bar.advance()),
                    protect=[Path(args.cache_dir) if args.cache_dir else default_cache_dir()],  # for the fallback
                )
                run.start()
                running[i] = (sub, run, flags)
            for i in list(running):
                sub, run, flags = running[i]
                if run.poll():
                    if code_digest() != trusted:  # e.g. a submission wrote into the suite (no sandbox)
                        tainted = sub.label
                        break
                    del running[i]
                    result = run.result()
                    grades[i] = build_grade(sub.label, graded, result, rubric, sandbox=sandbox, staff_flags=flags)
                    if batch:
                        bar.advance(sub.label)
            time.sleep(0.05)
    finally:
        for _sub, run, _flags in running.values():
            run.kill("the grader was stopped")
    if tainted is not None:
        reason = (
            "not graded: the grader's own code (the suite, the reference or the grader) changed while submissions "
            f"were judged (noticed when {tainted!r} finished); grades judged with it cannot be trusted"
        )
        log(f"{PROG}: ERROR: {reason}")
        for i, sub in enumerate(submissions):
            if i not in grades:
                nothing = JudgeResult({t.id: Verdict("not_run", reason) for t in graded}, stopped=reason)
                grades[i] = build_grade(sub.label, graded, nothing, rubric, sandbox=sandbox, staff_flags=[])
    if batch:
        log(f"graded {len(grades)} submissions in {time.monotonic() - started:.0f} s")
    return [grades[i] for i in range(len(submissions))], tainted is None


def write_reports(args, grades, leaderboard) -> None:
    for g in grades:
        out_dir = Path(args.out_dir) / g.submission if args.out_dir else None

        def target(name, out_dir=out_dir):
            return out_dir / Path(name).name if out_dir else Path(name)

        if args.gradescope:
            write_atomic(target(args.gradescope), report.gradescope_json(g, leaderboard=leaderboard))
        if args.markdown:
            write_atomic(target(args.markdown), report.markdown(g, staff=args.staff))
        if args.junit:
            write_atomic(target(args.junit), report.junit(g, staff=args.staff))
        print(report.terminal_report(g, failures=args.failures))
        print()
    if args.csv:
        write_atomic(Path(args.csv), report.gradebook_csv(grades))


if __name__ == "__main__":
    sys.exit(main())
