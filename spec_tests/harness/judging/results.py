"""The typed result of every check: one record that the terminal, recordings, the kill matrix,
grading and the tolerance measurement all read, instead of parsing message text.

Results travel on pytest's reports as JSON data: ``report.user_properties`` holds
``("spec_results", [CheckResult.to_json(), ...])`` and ``("spec_test", TestVerdict.to_json())``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum

RESULTS_KEY = "spec_results"
VERDICT_KEY = "spec_test"


class Status(StrEnum):
    """How a test ended (``TestVerdict.status``), the grade's and the kill matrix's words included.

    A ``StrEnum``: each member is its string, so the wire, results.json and the reports read the same.
    """

    PASSED = "passed"
    FAILED = "failed"  # a check failed: the implementation's own behaviour
    CONSEQUENCE = "consequence"  # failed only because failing upstream names do (consequences.py)
    NOT_IMPLEMENTED = "not_implemented"  # a judged name raised NotImplementedError
    SETUP = "setup"  # a name the test needed but does not judge failed
    ERROR = "error"  # the implementation raised (or, in grading, timed out or crashed)
    SKIPPED = "skipped"  # not provided: the implementation lacks a name or a family the test needs
    XFAILED = "xfailed"  # an expected failure (--spec-xfails) that failed
    XPASSED = "xpassed"  # the kill matrix's (tools/bugcheck.py): an expected failure that passed
    NOT_RUN = "not_run"  # grading only: the submission could not be loaded, or the judge was stopped


# The statuses a judged test's verdict may have (what the judge accepts from its pytest run).
VERDICTS = (
    Status.PASSED,
    Status.FAILED,
    Status.CONSEQUENCE,
    Status.NOT_IMPLEMENTED,
    Status.SETUP,
    Status.ERROR,
    Status.SKIPPED,
    Status.XFAILED,
)
# The statuses that earn a test's points: a consequence is charged to its roots, not to the test.
EARNING = (Status.PASSED, Status.CONSEQUENCE)
# The failures a root pays with (settling.settle): not only not implemented, not provided or setup.
REAL_FAILURES = (Status.FAILED, Status.ERROR)
# The statuses of a test that did not pass and was not skipped or expected to fail (--spec-write-xfails).
FAILING = (Status.FAILED, Status.CONSEQUENCE, Status.NOT_IMPLEMENTED, Status.SETUP, Status.ERROR)
# The failures charged to the test's own subjects as it ends (rootcause.judge_failure: FailureRegistry).
CHARGED_TO_SUBJECTS = (Status.FAILED, Status.NOT_IMPLEMENTED, Status.ERROR)
# A crash, in a judged name (error) or in one the test only uses (setup).
CRASHES = (Status.ERROR, Status.SETUP)
# Failures other than a wrong value or a consequence: the kill matrix counts them as failed.
CRASHED_OR_MISSING = (Status.ERROR, Status.SETUP, Status.NOT_IMPLEMENTED)
# The kill matrix's statuses (tools/bugcheck.py) of a test that kills a bug.
KILLING = (Status.FAILED, Status.CONSEQUENCE, Status.XPASSED)
# Outcomes of a check (``CheckResult.outcome``).
CHECK_OUTCOMES = (Status.PASSED, Status.FAILED, Status.ERROR, Status.SETUP, Status.NOT_IMPLEMENTED)


@dataclass
class CheckResult:
    test: str  # test id relative to spec_tests/
    subject: str  # the protocol name judged
    component: str  # the test's component (rubric group)
    behaviour: str  # what is checked, in words
    outcome: str = "passed"
    kind: str = "compare"  # compare | relation | require | raises | precision
    tolerance: str = ""  # the tolerance, described
    ratio: float | None = None  # worst |error| / allowed; None when categorical or passed
    where: str = ""  # index or path of the worst entry
    found: str = ""  # what differs, one line
    note: str = ""  # shapes and dtypes
    causes: list[str] = field(
        default_factory=list
    )  # diagnosis lines, ranked ("likely cause: ..." / "matches known bug ...")
    cause_codes: list[str] = field(default_factory=list)  # codes of the confident causes (diagnosis/codes.py)
    advice: list[str] = field(default_factory=list)  # shown, never failing (e.g. an error message not naming the value)

    @property
    def failed(self) -> bool:
        return self.outcome != "passed"

    def message(self) -> str:
        head = f"[{self.subject}] {self.behaviour}" if self.subject else self.behaviour
        lines = [head, f"  {self.found}"] if self.found else [head]
        lines += [f"  {x}" for x in (self.note, *self.causes, *self.advice) if x]
        return "\n".join(lines)

    def to_json(self) -> dict:
        data = asdict(self)
        if data["ratio"] is not None and not math.isfinite(data["ratio"]):
            data["ratio"] = None
        return data

    @classmethod
    def from_json(cls, data: dict) -> CheckResult:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class TestVerdict:
    """How a whole test ended, for grading and summaries.

    ``status``: one of ``VERDICTS`` (``Status``).
    ``consequence``: the test's failure is explained by the implementation's own failing upstream
    names ``root_cause`` (``consequences.py``): it is charged to them, not to this test.
    ``maybe_roots``: without a reference (a handout), the failing upstream names this charged failure
    may be a consequence of; nothing could verify it.
    """

    __test__ = False  # a record, not a test class pytest should collect

    test: str
    component: str
    subjects: list[str]
    status: str
    root_cause: list[str] = field(default_factory=list)
    message: str = ""
    maybe_roots: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**asdict(self), "status": str(self.status)}  # a plain string (pytest writes repr() of it)

    @classmethod
    def from_json(cls, data: dict) -> TestVerdict:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def results_of(report) -> list[CheckResult]:
    """The check results attached to a pytest report."""
    for key, value in getattr(report, "user_properties", ()):
        if key == RESULTS_KEY:
            return [CheckResult.from_json(v) for v in value]
    return []


def verdict_of(report) -> TestVerdict | None:
    for key, value in getattr(report, "user_properties", ()):
        if key == VERDICT_KEY:
            return TestVerdict.from_json(value)
    return None
