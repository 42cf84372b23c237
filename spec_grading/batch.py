"""Grading submissions one at a time or as a batch, each contained, each written when judged.

Every per-submission step (staging, static flags, starting and watching the judge, building the
grade, writing the reports) runs under its own ``try``: whatever one upload does (a dangling link,
a file that makes ``ast.parse`` recurse, a judge that cannot start), that submission gets a report
saying what was refused or failed, and the others of the batch are graded exactly as alone. Only
``Interrupted`` (SIGTERM, SIGINT, SIGHUP) and a change of the code that judges stop the batch.

A submission's reports are written as soon as its grade is built: its files (``--gradescope``,
``--markdown``, ``--junit``; with ``--out-dir`` alone, all three into ``DIR/<submission>/``), the
gradebook (``--csv``, rewritten with every submission graded so far, in submission order), and
its terminal report (printed in submission order as soon as those before it are printed). On
SIGTERM or SIGINT the grader keeps what is judged: a judge that already wrote its verdicts is
graded, every grade built is written, with the gradebook of those, and the grader exits non-zero.

What staging did not copy (links, special files, files over the limit, refused uploads) is in
every form: ``staging: ...`` staff flags (terminal, CSV, staff Markdown), a visible "Upload:
entries not staged" entry and summary lines in ``results.json``, and a section of ``report.md``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import report
from .collector import FINAL_NAME
from .grade import Grade, build_grade
from .judge import JudgeResult, JudgeRun, Verdict
from .manifest import code_digest, default_cache_dir
from .progress import Progress
from .submission import Staged, Submission, stage, static_flags
from .textsafe import clean, write_atomic
from .workspace import Interrupted

FORMS = {"gradescope": "results.json", "markdown": "report.md", "junit": "report.xml"}
NOT_STAGED_TITLE = "Upload: entries not staged"
NOT_STAGED_HEAD = (
    "Not staged from your upload (an upload is data: links are not followed or copied, only regular "
    "files and folders are, within the grader's limits):"
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {clean(exc, 300)}"


def report_targets(args, label: str) -> dict[str, Path]:
    """Where each report form of one submission goes: the forms named, and with ``--out-dir`` alone
    every form, into ``DIR/<label>/`` (issue 21: ``--out-dir`` alone used to write nothing)."""
    named = {kind: getattr(args, kind) for kind in FORMS if getattr(args, kind, None)}
    if args.out_dir:
        return {kind: Path(args.out_dir) / label / Path(name).name for kind, name in (named or FORMS).items()}
    return {kind: Path(name) for kind, name in named.items()}


def with_staging_json(data: dict, lines: list[str]) -> dict:
    """``results.json`` data with what staging did not copy: a visible 0-point entry and the lines
    in the summary."""
    if not lines:
        return data
    text = clean(NOT_STAGED_HEAD + "\n" + "\n".join(f"  {line}" for line in lines), 4000)
    data = dict(data)
    data["output"] = clean(f"{data.get('output', '')}\n\n{text}", 24_500)
    entry = {
        "name": NOT_STAGED_TITLE,
        "score": 0.0,
        "max_score": 0.0,
        "status": "failed",
        "output": text,
        "tags": ["not-staged"],
        "visibility": "visible",
        "number": "0.2",
    }
    tests = list(data.get("tests", []))
    at = 1 if tests and tests[0].get("number") == "0.1" else 0
    data["tests"] = tests[:at] + [entry] + tests[at:]
    return data


def with_staging_markdown(text: str, lines: list[str]) -> str:
    """``report.md`` with a last section listing what staging did not copy (fenced: names are the
    upload's, already quoted as ASCII)."""
    if not lines:
        return text
    body = "\n".join(lines).replace("```", "'''")
    return f"{text.rstrip()}\n\n## {NOT_STAGED_TITLE}\n\n{NOT_STAGED_HEAD}\n\n```\n{body}\n```\n"


@dataclass
class Graded:
    label: str
    grade: Grade
    staging: list[str] = field(default_factory=list)


class Writer:
    """Writes each grade's reports when it is added, the gradebook after each, the terminal reports
    in submission order."""

    def __init__(self, args, leaderboard, submissions: list[Submission]):
        self.args, self.leaderboard = args, leaderboard
        self.total = len(submissions)
        self.done: dict[int, Graded] = {}
        self.written: set[int] = set()
        self.next_print = 0
        self.shown: set[int] = set()
        self.failures: list[str] = []

    def add(self, i: int, graded: Graded) -> None:
        self.done[i] = graded
        self._write(i)
        self._write_csv()
        self._print_ready()

    def finish(self) -> None:
        """Everything not yet written (a write cut short by a signal), then every terminal report
        not yet printed, in submission order."""
        for i in sorted(self.done):
            if i not in self.written:
                self._write(i)
        self._write_csv()
        self._print_ready(all_done=True)

    def grades(self) -> list[Grade]:
        return [self.done[i].grade for i in sorted(self.done)]

    def _write(self, i: int) -> None:
        g = self.done[i]
        for kind, path in report_targets(self.args, g.label).items():
            try:
                write_atomic(path, self._render(kind, g))
            except Exception as exc:  # noqa: BLE001 - one report must not cost the others theirs
                why = f"{g.label}: the {kind} report could not be written ({_why(exc)})"
                self.failures.append(why)
                log(f"spec-grade: ERROR: {why}")
                try:
                    write_atomic(path, self._fallback(kind, g, why))
                except Exception:  # noqa: BLE001 - e.g. the folder itself cannot be written
                    pass
        self.written.add(i)

    def _render(self, kind: str, g: Graded) -> str:
        if kind == "gradescope":
            data = with_staging_json(report.gradescope(g.grade, leaderboard=self.leaderboard), g.staging)
            return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        if kind == "markdown":
            return with_staging_markdown(report.markdown(g.grade, staff=self.args.staff), g.staging)
        return report.junit(g.grade, staff=self.args.staff)

    @staticmethod
    def _fallback(kind: str, g: Graded, why: str) -> str:
        if kind == "gradescope":
            return report.unusable_submission_json(why)
        if kind == "markdown":
            return f"# Grade: {clean(g.label, 200)}\n\n```\n{why.replace('```', chr(39) * 3)}\n```\n"
        return '<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="transformer-spec" tests="0" errors="1"/>\n'

    def _write_csv(self) -> None:
        if not self.args.csv:
            return
        grades = self.grades()
        try:
            text = report.gradebook_csv(grades)
        except Exception as exc:  # noqa: BLE001 - leave out the row that cannot be written, say so
            keep = []
            for g in grades:
                try:
                    report.gradebook_csv([g])
                    keep.append(g)
                except Exception:  # noqa: BLE001
                    log(f"spec-grade: ERROR: {g.submission}: its gradebook row could not be written ({_why(exc)})")
            text = report.gradebook_csv(keep)
        try:
            write_atomic(Path(self.args.csv), text)
        except Exception as exc:  # noqa: BLE001 - the per-submission reports still matter
            log(f"spec-grade: ERROR: the gradebook {self.args.csv} could not be written ({_why(exc)})")

    def _print_ready(self, all_done: bool = False) -> None:
        while self.next_print in self.done:
            self._print(self.next_print)
            self.next_print += 1
        if all_done:
            for i in sorted(set(self.done) - self.shown):
                self._print(i)

    def _print(self, i: int) -> None:
        self.shown.add(i)
        try:
            text = report.terminal_report(self.done[i].grade, failures=self.args.failures)
        except Exception as exc:  # noqa: BLE001
            text = f"Grade for {clean(self.done[i].label, 200)}: the terminal report failed ({_why(exc)})"
        print(text)
        print(flush=True)


def not_judged(
    label, graded_tests, rubric, sandbox, *, could_not_run=None, stopped=None, flags=(), elapsed=0.0
) -> Grade:
    """The grade of a submission whose judge never gave verdicts: every test not run, with the reason."""
    if could_not_run:
        text = "not run: your upload could not be graded (see 'Could not run your implementation')"
    else:
        text = f"not run: {stopped}"
    verdicts = {t.id: Verdict("not_run", clean(text)) for t in graded_tests}
    result = JudgeResult(verdicts, could_not_run=could_not_run, stopped=stopped, elapsed_s=elapsed)
    return build_grade(label, graded_tests, result, rubric, sandbox=sandbox, staff_flags=list(flags))


@dataclass
class Running:
    sub: Submission
    run: JudgeRun
    flags: list[str]
    staging: list[str]


def ignore_signals() -> None:
    """While the grader writes what it has after a first signal, further ones wait (SIGKILL does not)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


class BatchGrader:
    """Judges every submission (``jobs`` at once), hands each grade to the ``Writer`` when built."""

    def __init__(self, args, submissions, graded, rubric, limits, work, sandbox_mode, sandbox, writer: Writer):
        self.args, self.submissions, self.graded, self.rubric = args, submissions, graded, rubric
        self.limits, self.work, self.sandbox_mode, self.sandbox, self.writer = (
            limits,
            work,
            sandbox_mode,
            sandbox,
            writer,
        )
        self.ids = [t.id for t in graded]
        self.jobs = max(1, args.jobs or os.cpu_count() or 1)
        self.batch = len(submissions) > 1
        self.bar = (
            Progress(len(submissions), "grading")
            if self.batch
            else Progress(len(graded), f"grading {submissions[0].label}", tty_only=True)
        )
        self.running: dict[int, Running] = {}
        self.trusted = code_digest()
        self.tainted: str | None = None

    def _add(self, i: int, sub: Submission, grade: Grade, staging: list[str]) -> None:
        self.writer.add(i, Graded(sub.label, grade, staging))
        if self.batch:
            self.bar.advance(sub.label)

    def run(self) -> bool:
        """Grade everything; False when the code that judges changed (the rest is not graded)."""
        started = time.monotonic()
        pending = list(enumerate(self.submissions))
        try:
            while (pending or self.running) and self.tainted is None:
                while pending and len(self.running) < self.jobs:
                    self._start(*pending.pop(0))
                for i in list(self.running):
                    self._watch(i)
                    if self.tainted is not None:
                        break
                time.sleep(0.05)
        except Interrupted:
            ignore_signals()
            self._salvage()
            raise
        finally:
            for entry in self.running.values():
                entry.run.kill("the grader was stopped")
        if self.tainted is not None:
            reason = (
                "not graded: the grader's own code (the suite, the reference or the grader) changed while "
                f"submissions were judged (noticed when {self.tainted!r} finished); grades judged with it "
                "cannot be trusted"
            )
            log(f"spec-grade: ERROR: {reason}")
            for i, sub in enumerate(self.submissions):
                if i not in self.writer.done:
                    self._add(i, sub, not_judged(sub.label, self.graded, self.rubric, self.sandbox, stopped=reason), [])
        if self.batch:
            log(f"graded {len(self.writer.done)} submissions in {time.monotonic() - started:.0f} s")
        return self.tainted is None

    def _start(self, i: int, sub: Submission) -> None:
        folder = self.work / f"sub-{i}"
        try:
            staged = stage(sub, folder / "code")
        except Exception as exc:  # noqa: BLE001 - an upload staging cannot take is refused, not fatal
            why = f"staging failed ({_why(exc)})"
            staged = Staged(None, [f"refused: {why}"], why)
        staging = staged.lines
        flags = [f"staging: {line}" for line in staging]
        if staged.path is None:
            reason = f"your upload was not staged: {staged.refused_all}"
            grade = not_judged(sub.label, self.graded, self.rubric, self.sandbox, could_not_run=reason, flags=flags)
            self._add(i, sub, grade, staging)
            return
        try:
            flags += static_flags(staged.path)
        except Exception as exc:  # noqa: BLE001 - flags are for staff; never worth a submission's grade
            flags.append(f"static flags not computed ({_why(exc)})")
        if sub.label == "reference":
            flags = [f for f in flags if "functions of the reference" not in f]
        try:
            run = JudgeRun(
                staged.path,
                folder,
                self.ids,
                capabilities=list(self.rubric.capabilities),
                limits=self.limits,
                device=self.args.device,
                sandbox=self.sandbox_mode,
                on_result=None if self.batch else (lambda *_: self.bar.advance()),
                protect=[Path(self.args.cache_dir) if self.args.cache_dir else default_cache_dir()],  # the fallback
                seed=self.args.seed,
            )
            run.start()
        except Exception as exc:  # noqa: BLE001
            why = f"the judge could not be started ({_why(exc)})"
            log(f"spec-grade: ERROR: {sub.label}: {why}")
            grade = not_judged(sub.label, self.graded, self.rubric, self.sandbox, stopped=why, flags=flags)
            self._add(i, sub, grade, staging)
            return
        self.running[i] = Running(sub, run, flags, staging)

    def _watch(self, i: int) -> None:
        entry = self.running[i]
        try:
            done = entry.run.poll()
        except Exception as exc:  # noqa: BLE001
            entry.run.kill(f"the grader could not watch the judge ({_why(exc)})")
            done = True
        if not done:
            return
        if code_digest() != self.trusted:  # e.g. a submission wrote into the suite (no sandbox)
            self.tainted = entry.sub.label
            return
        del self.running[i]
        self._finish(i, entry)

    def _finish(self, i: int, entry: Running) -> None:
        try:
            result = entry.run.result()
            grade = build_grade(
                entry.sub.label, self.graded, result, self.rubric, sandbox=self.sandbox, staff_flags=entry.flags
            )
            grade.staff_notes.insert(0, f"graded inputs drawn from spec seed {self.args.seed}")
        except Exception as exc:  # noqa: BLE001
            why = f"the grader could not build this grade from the judge's verdicts ({_why(exc)})"
            log(f"spec-grade: ERROR: {entry.sub.label}: {why}")
            grade = not_judged(entry.sub.label, self.graded, self.rubric, self.sandbox, stopped=why, flags=entry.flags)
        self._add(i, entry.sub, grade, entry.staging)

    def _salvage(self) -> None:
        """After a signal: a judge that already wrote its final verdicts is graded (it is judged)."""
        for i, entry in list(self.running.items()):
            try:
                if not (entry.run.out / FINAL_NAME).exists():
                    continue
                entry.run.kill(None)  # it finished; nothing is lost
                if code_digest() != self.trusted:
                    continue
                del self.running[i]
                self._finish(i, entry)
            except Exception as exc:  # noqa: BLE001
                log(f"spec-grade: ERROR: {entry.sub.label}: not graded after the signal ({_why(exc)})")
