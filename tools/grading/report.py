"""The grade of one submission and its forms: terminal table, Gradescope ``results.json``, Markdown,
JUnit XML and the CSV gradebook.

Everything here is a pure function of the grade, which is itself deterministic (no timings in any
per-test text); only the top-level ``execution_time`` of ``results.json`` varies between runs.
Student-facing forms conceal the output of tests whose visibility the rubric conceals.
"""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from .rubric import GradedTest, Rubric
from .runner import Outcome, RunResult

NOT_PASSED_PREFIX = {
    "skipped": "skipped, which counts as not passed: ",
    "xfailed": "failed: ",
    "not_run": "",
    "failed": "",
}


@dataclass
class TestResult:
    test: GradedTest
    outcome: str
    message: str

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def score_cents(self) -> int:
        return round(self.test.max_score * 100) if self.passed else 0

    @property
    def score(self) -> float:
        return self.score_cents / 100

    @property
    def text(self) -> str:
        """What went wrong, in full (empty for a pass)."""
        if self.passed:
            return ""
        return NOT_PASSED_PREFIX.get(self.outcome, "") + (self.message or self.outcome)


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
    blocked: list[dict] = field(default_factory=list)
    staff_flags: list[str] = field(default_factory=list)
    staff_notes: list[str] = field(default_factory=list)
    execution_time_s: float = 0.0
    rope_style: str = ""
    vm_peak_mb: int = 0

    @property
    def score_cents(self) -> int:
        return sum(r.score_cents for r in self.results)

    @property
    def max_cents(self) -> int:
        return sum(round(r.test.max_score * 100) for r in self.results)

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
            c.passed += r.passed
            c.score_cents += r.score_cents
            c.max_cents += round(r.test.max_score * 100)
        return list(out.values())

    def integrity_lines(self) -> list[str]:
        return [
            f"your code tried {b['what']} at {b['where']}: refused (not allowed while grading)" for b in self.blocked
        ]


def build_grade(submission: str, graded: list[GradedTest], run: RunResult, rubric: Rubric, **extra) -> Grade:
    results = []
    for test in graded:
        outcome = run.outcomes.get(test.id, Outcome("not_run", "not run"))
        results.append(TestResult(test, outcome.outcome, outcome.message))
    return Grade(
        submission,
        results,
        rubric,
        could_not_run=run.could_not_run,
        blocked=list(run.blocked),
        staff_notes=list(run.staff_notes),
        execution_time_s=run.elapsed_s,
        vm_peak_mb=run.vm_peak_mb,
        **extra,
    )


def _pts(cents: int) -> str:
    return f"{cents / 100:.2f}"


# -- terminal --------------------------------------------------------------------------------


def table(grade: Grade, *, visible_only: bool = False) -> str:
    rows = [("component", "tests passed", "points")]
    for c in grade.components(visible_only=visible_only):
        rows.append((c.name, f"{c.passed}/{c.tests}", f"{_pts(c.score_cents)} / {_pts(c.max_cents)}"))
    results = [r for r in grade.results if not (visible_only and grade.concealed(r))]
    passed = sum(r.passed for r in results)
    score = sum(r.score_cents for r in results)
    top = sum(round(r.test.max_score * 100) for r in results)
    rows.append(("total", f"{passed}/{len(results)}", f"{_pts(score)} / {_pts(top)}"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        if i == len(rows) - 1:
            lines.append("-" * (sum(widths) + 6))
        lines.append(f"{row[0]:<{widths[0]}}   {row[1]:>{widths[1]}}   {row[2]:>{widths[2]}}")
        if i == 0:
            lines.append("-" * (sum(widths) + 6))
    return "\n".join(lines)


def terminal_report(grade: Grade, *, failures: bool = False) -> str:
    style = f" (ROPE_STYLE={grade.rope_style})" if grade.rope_style else ""
    out = [f"Grade for {grade.submission}{style}: {grade.score:.2f} / {grade.max_score:.2f}", "", table(grade)]
    if grade.could_not_run:
        out += ["", f"COULD NOT RUN: {grade.could_not_run}"]
    for line in grade.integrity_lines():
        out.append(f"INTEGRITY: {line}")
    for flag in grade.staff_flags:
        out.append(f"FLAG (staff): {flag}")
    if failures:
        if grade.vm_peak_mb:
            out.append(f"(staff) largest address space of a grading process: {grade.vm_peak_mb} MiB")
        for note in grade.staff_notes:
            out.append("(staff) " + note.replace("\n", "\n  "))
        for r in grade.results:
            if not r.passed:
                out += ["", f"FAILED {r.test.id} [{r.test.visibility}]", "  " + r.text.replace("\n", "\n  ")]
    return "\n".join(out)


# -- Gradescope ------------------------------------------------------------------------------


def public_summary(grade: Grade) -> str:
    lines = [f"Transformer spec suite: {grade.score:.2f} / {grade.max_score:.2f} points", ""]
    if grade.could_not_run:
        lines += [f"Could not run your implementation: {grade.could_not_run}", ""]
    for line in grade.integrity_lines():
        lines.append(f"Integrity: {line}")
    if grade.blocked:
        lines.append("")
    concealed = [r for r in grade.results if grade.concealed(r)]
    lines.append(table(grade, visible_only=bool(concealed)))
    if concealed:
        worth = sum(round(r.test.max_score * 100) for r in concealed)
        lines += [
            "",
            f"{len(concealed)} hidden tests worth {_pts(worth)} points count towards your score; "
            "their results are not shown.",
        ]
    return "\n".join(lines)


def gradescope(grade: Grade, *, leaderboard: list | None = None) -> dict:
    """``results.json`` as the Gradescope autograder specification describes it."""
    tests = []
    if grade.could_not_run:
        tests.append(
            {
                "name": "Could not run your implementation",
                "score": 0.0,
                "max_score": 0.0,
                "status": "failed",
                "output": grade.could_not_run,
                "tags": ["could-not-run"],
                "visibility": "visible",
                "number": "0.1",
            }
        )
    if grade.blocked:
        tests.append(
            {
                "name": "Integrity: operations refused while grading",
                "score": 0.0,
                "max_score": 0.0,
                "status": "failed",
                "output": "\n".join(grade.integrity_lines()),
                "tags": ["integrity"],
                "visibility": "visible",
                "number": "0.2",
            }
        )
    for r in grade.results:
        entry = {
            "name": r.test.name,
            "score": r.score,
            "max_score": r.test.max_score,
            "status": "passed" if r.passed else "failed",
            "tags": list(r.test.tags),
            "visibility": r.test.visibility,
            "number": r.test.number,
        }
        output = grade.rubric.hidden_message if grade.concealed(r) else r.text
        if output:
            entry["output"] = output
        tests.append(entry)
    return {
        "score": grade.score,
        "execution_time": int(round(grade.execution_time_s)),
        "output": public_summary(grade),
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "leaderboard": list(leaderboard or []),
    }


def gradescope_json(grade: Grade, **kwargs) -> str:
    return json.dumps(gradescope(grade, **kwargs), indent=2, ensure_ascii=False) + "\n"


# -- Markdown ----------------------------------------------------------------------------------


def markdown(grade: Grade, *, staff: bool = False) -> str:
    def conceal(r):
        return not staff and grade.concealed(r)

    out = [f"# Grade: {grade.submission}", "", f"**{grade.score:.2f} / {grade.max_score:.2f} points**", ""]
    if grade.could_not_run:
        out += [f"> **Could not run your implementation:** {grade.could_not_run}", ""]
    for line in grade.integrity_lines():
        out += [f"> **Integrity:** {line}", ""]
    if staff:
        for flag in grade.staff_flags:
            out += [f"> **Flag (staff):** {flag}", ""]
    out += ["| component | tests passed | points |", "|---|---:|---:|"]
    for c in grade.components(visible_only=not staff and any(conceal(r) for r in grade.results)):
        out.append(f"| {c.name} | {c.passed}/{c.tests} | {_pts(c.score_cents)} / {_pts(c.max_cents)} |")
    hidden = [r for r in grade.results if conceal(r)]
    if hidden:
        worth = sum(round(r.test.max_score * 100) for r in hidden)
        out += ["", f"{len(hidden)} hidden tests worth {_pts(worth)} points count towards the score; not shown here."]
    failing = [r for r in grade.results if not r.passed and not conceal(r)]
    if failing:
        out += ["", "## Tests not passed", ""]
        for r in failing:
            out += [
                f"### {r.test.number} {r.test.name}",
                "",
                f"`{r.test.id}` ({_pts(round(r.test.max_score * 100))} points)",
                "",
                "```",
                r.text,
                "```",
                "",
            ]
    return "\n".join(out).rstrip() + "\n"


# -- JUnit XML ---------------------------------------------------------------------------------


def junit(grade: Grade, *, staff: bool = False) -> str:
    failures = sum(not r.passed for r in grade.results)
    suite = ET.Element(
        "testsuite",
        name="transformer-spec",
        tests=str(len(grade.results)),
        failures=str(failures),
        errors="1" if grade.could_not_run else "0",
        skipped="0",
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (
        ("submission", grade.submission),
        ("score", f"{grade.score:.2f}"),
        ("max_score", f"{grade.max_score:.2f}"),
    ):
        ET.SubElement(props, "property", name=k, value=v)
    if grade.could_not_run:
        case = ET.SubElement(suite, "testcase", classname="grading", name="could_not_run")
        ET.SubElement(case, "error", message=grade.could_not_run.splitlines()[0]).text = grade.could_not_run
    for r in grade.results:
        case = ET.SubElement(suite, "testcase", classname=f"spec_tests.{r.test.component}", name=r.test.id)
        cprops = ET.SubElement(case, "properties")
        ET.SubElement(cprops, "property", name="points", value=f"{r.score:.2f}/{r.test.max_score:.2f}")
        ET.SubElement(cprops, "property", name="visibility", value=r.test.visibility)
        if not r.passed:
            text = grade.rubric.hidden_message if (grade.concealed(r) and not staff) else r.text
            ET.SubElement(
                case, "failure", message=text.splitlines()[0] if text else r.outcome, type=r.outcome
            ).text = text
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


# -- CSV gradebook -------------------------------------------------------------------------------


def gradebook_csv(grades: list[Grade]) -> str:
    components: list[str] = []
    for g in grades:
        for c in g.components():
            if c.name not in components:
                components.append(c.name)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["submission", "score", "max_score", "tests_passed", "tests", "status", *components, "integrity", "flags"]
    )
    for g in grades:
        per = {c.name: _pts(c.score_cents) for c in g.components()}
        status = "could not run" if g.could_not_run else "graded"
        w.writerow(
            [
                g.submission,
                f"{g.score:.2f}",
                f"{g.max_score:.2f}",
                sum(r.passed for r in g.results),
                len(g.results),
                status,
                *[per.get(c, "") for c in components],
                "; ".join(g.integrity_lines()),
                "; ".join(g.staff_flags),
            ]
        )
    return buf.getvalue()
