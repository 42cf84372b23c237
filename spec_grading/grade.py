"""The grade of one submission, built from the judge's verdicts only.

Points: a test earns its points when its verdict is ``passed`` or ``consequence`` (its failure
disappears when the failing upstream functions named as its root cause are replaced by correct
ones; those functions' own tests fail and are charged instead, so one bug costs once). Every other
outcome earns nothing: ``failed``, ``not_implemented``, ``setup``, ``error`` (also a timeout or a
crash of the submission's process), ``skipped`` (not provided: the submission lacks a name the
test needs, or a family), and ``not_run`` (the submission could not be loaded, or the judge was
stopped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from spec_tests.harness.judging.results import EARNING, Status
from spec_tests.harness.judging.settling import settle

from .judge import JudgeResult, Verdict
from .rubric import GradedTest, Rubric
from .textsafe import MESSAGE_CAP, clean

# How a status reads in the reports.
SHOWN_STATUS = {
    Status.PASSED: "passed",
    Status.CONSEQUENCE: "not charged (a consequence)",
    Status.FAILED: "failed",
    Status.NOT_IMPLEMENTED: "not implemented",
    Status.SETUP: "failed (setup)",
    Status.ERROR: "failed (error)",
    Status.SKIPPED: "not provided",
    Status.XFAILED: "failed",
    Status.NOT_RUN: "not run",
}


@dataclass
class TestResult:
    __test__ = False  # a record, not a test class pytest should collect

    test: GradedTest
    status: str
    message: str = ""
    root_cause: list[str] = field(default_factory=list)

    @property
    def earns(self) -> bool:
        return self.status in EARNING

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED

    @property
    def max_cents(self) -> int:
        return round(self.test.max_score * 100)

    @property
    def score_cents(self) -> int:
        return self.max_cents if self.earns else 0

    @property
    def score(self) -> float:
        return self.score_cents / 100

    @property
    def text(self) -> str:
        """What a reader needs: empty for a pass, the reason otherwise."""
        if self.status == Status.PASSED:
            return ""
        if self.status == Status.CONSEQUENCE:
            names = ", ".join(self.root_cause) or "an upstream function"
            cause = [line.strip() for line in self.message.splitlines() if line.strip().startswith("(it failed with")]
            return clean(
                f"Not charged: this test failed only because {names} fails (with a correct {names} inside your "
                f"code it passes), and {names}'s own tests are charged for it. Fix {names} first."
                + "".join(f"\n{line}" for line in cause[:1])
            )
        if self.status == Status.SKIPPED:
            return clean(f"counts as not passed: {self.message or 'not provided'}")
        return clean(self.message or SHOWN_STATUS.get(self.status, self.status))


@dataclass
class ComponentSummary:
    name: str
    passed: int = 0
    tests: int = 0
    score_cents: int = 0
    max_cents: int = 0


@dataclass
class Grade:
    submission: str
    results: list[TestResult]
    rubric: Rubric
    could_not_run: str | None = None
    stopped: str | None = None
    sandboxed: bool = True
    sandbox_note: str = ""
    staff_flags: list[str] = field(default_factory=list)
    staff_notes: list[str] = field(default_factory=list)
    execution_time_s: float = 0.0
    rope_style: str = ""

    @property
    def score_cents(self) -> int:
        return sum(r.score_cents for r in self.results)

    @property
    def max_cents(self) -> int:
        return sum(r.max_cents for r in self.results)

    @property
    def score(self) -> float:
        return self.score_cents / 100

    @property
    def max_score(self) -> float:
        return self.max_cents / 100

    def concealed(self, result: TestResult) -> bool:
        return result.test.visibility in self.rubric.conceal

    def components(self, *, visible_only: bool = False) -> list[ComponentSummary]:
        out: dict[str, ComponentSummary] = {}
        for r in self.results:
            if visible_only and self.concealed(r):
                continue
            c = out.setdefault(r.test.component, ComponentSummary(r.test.component))
            c.tests += 1
            c.passed += r.earns
            c.score_cents += r.score_cents
            c.max_cents += r.max_cents
        return list(out.values())

    def consequences(self, *, visible_only: bool = False) -> dict[str, list[TestResult]]:
        """Root cause (names joined) -> the tests not charged because of it."""
        groups: dict[str, list[TestResult]] = {}
        for r in self.results:
            if r.status == Status.CONSEQUENCE and not (visible_only and self.concealed(r)):
                groups.setdefault(", ".join(r.root_cause) or "an upstream function", []).append(r)
        return groups

    def consequence_lines(self, *, visible_only: bool = False) -> list[str]:
        lines = []
        for root, tests in self.consequences(visible_only=visible_only).items():
            n = len(tests)
            lines.append(
                f"{n} test{'s' if n != 1 else ''} trace{'s' if n == 1 else ''} back to {root}: "
                f"{'it fails' if n == 1 else 'they fail'} only because {root} does; not charged here "
                f"({root}'s own tests are)"
            )
        return lines

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        return counts


def check_text(check: dict, *, details_only: bool = False) -> str:
    """One failed check as text, from its data (``CheckResult`` fields), defensively; ``details_only``: its note,
    causes and advice alone (a crash's, whose exception the verdict's message already says)."""

    def s(key) -> str:
        value = check.get(key)
        return clean(value, 1500) if isinstance(value, str) else ""

    def many(key) -> list[str]:
        value = check.get(key)
        return [clean(v, 1500) for v in value if isinstance(v, str)][:10] if isinstance(value, list) else []

    details = [f"  {x}" for x in (s("note"), *many("causes"), *many("advice")) if x]
    if details_only:
        return "\n".join(details)
    head = f"[{s('subject')}] {s('behaviour')}" if s("subject") else s("behaviour")
    lines = [head] + ([f"  {s('found')}"] if s("found") else []) + details
    return "\n".join(line for line in lines if line.strip())


def message_of(verdict: Verdict) -> str:
    if verdict.status == Status.FAILED and verdict.failed_checks:
        return clean("\n".join(check_text(c) for c in verdict.failed_checks), MESSAGE_CAP)
    if verdict.status == Status.ERROR and verdict.failed_checks:  # a crash: what probing its inputs found
        details = [line for c in verdict.failed_checks for line in check_text(c, details_only=True).split("\n") if line]
        return clean("\n".join([verdict.message, *dict.fromkeys(details)]), MESSAGE_CAP)
    return clean(verdict.message, MESSAGE_CAP)


def build_grade(
    submission: str,
    graded: list[GradedTest],
    run: JudgeResult,
    rubric: Rubric,
    *,
    sandbox: tuple[bool, str] = (True, ""),
    staff_flags=(),
    rope_style: str = "",
) -> Grade:
    results = []
    for test in graded:
        verdict = run.verdicts.get(test.id) or Verdict(
            Status.NOT_RUN, "not run: the judge reported nothing for this test"
        )
        root = verdict.root_cause if verdict.status == Status.CONSEQUENCE else []
        results.append(TestResult(test, verdict.status, message_of(verdict), root))
    charge_unsupported_consequences(results)
    sandboxed, note = sandbox  # the grader's own probe; the judge's report wins where there is one
    if isinstance(run.subject.get("sandboxed"), bool):
        sandboxed, note = run.subject["sandboxed"], run.subject.get("sandbox_reason") or note
    return Grade(
        submission,
        results,
        rubric,
        could_not_run=run.could_not_run,
        stopped=run.stopped,
        sandboxed=bool(sandboxed),
        sandbox_note=clean(note, 2000),
        staff_flags=[clean(f, 500) for f in staff_flags],
        staff_notes=list(run.staff_notes),
        execution_time_s=run.elapsed_s,
        rope_style=clean(run.subject.get("rope_style") or rope_style, 40),
    )


def charge_unsupported_consequences(results: list[TestResult]) -> None:
    """A consequence earns only while its roots are charged, as ``settle`` decides (the function pytest's
    summary reads too, so the two agree by construction): every root name is a subject of a graded test that
    really failed (failed or error: a root that is only not implemented or not provided pays for nothing), or
    of a consequence that holds (a chain: its roots replace it). Otherwise nothing pays for it (a root whose
    own tests all pass, one outside the selection, one not written), and it is charged as failed."""
    records = [SimpleNamespace(test=r.test.id, subjects=r.test.subjects, status=r.status, root_cause=r.root_cause)
               for r in results]  # fmt: skip
    settled = settle(records)
    for r in results:
        if r.status != Status.CONSEQUENCE:
            continue
        decision = settled[r.test.id]
        if decision.status == Status.CONSEQUENCE:
            r.root_cause = list(decision.roots)
        else:
            r.message = clean(f"{decision.reason}.\n{r.message}", MESSAGE_CAP)
            r.status, r.root_cause = Status.FAILED, []
