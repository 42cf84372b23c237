"""The forms of a grade: terminal table, Gradescope ``results.json``, Markdown, JUnit XML, CSV.

Pure functions of the grade, which is deterministic (no timings or paths in any per-test text);
only the top-level ``execution_time`` of ``results.json`` varies between runs. Every text is
sanitised and capped (``textsafe``); a report's total size is bounded by shrinking the per-test
outputs to fit ``REPORT_CAP``. Student-facing forms conceal the output of concealed tests.
"""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET

from spec_tests.harness.judging.results import Status

from .grade import SHOWN_STATUS, Grade, TestResult
from .textsafe import MESSAGE_CAP, clean, csv_cell, md_fence, md_inline, one_line

REPORT_CAP = 1_000_000  # characters of per-test output in one report, all tests together
FALLBACK_HEADLINE = "graded WITHOUT the sandbox"


def _pts(cents: int) -> str:
    return f"{cents / 100:.2f}"


def per_test_cap(grade: Grade) -> int:
    """The cap of one test's output such that all of them fit in ``REPORT_CAP``."""
    return max(300, min(MESSAGE_CAP, REPORT_CAP // max(1, len(grade.results))))


def output_of(grade: Grade, r: TestResult, *, staff: bool = False) -> str:
    if grade.concealed(r) and not staff:
        return clean(grade.rubric.hidden_message, 1000)
    return clean(r.text, per_test_cap(grade))


def rerun_line(r: TestResult) -> str:
    return f"Rerun it locally: {r.test.rerun}" if r.test.rerun else ""


def rubric_line(grade: Grade) -> str:
    named = f"{grade.rubric.assignment}: " if grade.rubric.assignment else ""
    return f"{named}graded with the rubric {grade.rubric.identity}"


def sandbox_lines(grade: Grade) -> list[str]:
    """What the reports say when the submission ran without the sandbox (nothing otherwise)."""
    if grade.sandboxed:
        return []
    return [f"{FALLBACK_HEADLINE}: {grade.sandbox_note or 'no sandbox was available'}"]


# -- terminal --------------------------------------------------------------------------------


def table(grade: Grade, *, visible_only: bool = False) -> str:
    rows = [("component", "tests earned", "points")]
    for c in grade.components(visible_only=visible_only):
        rows.append((c.name, f"{c.passed}/{c.tests}", f"{_pts(c.score_cents)} / {_pts(c.max_cents)}"))
    results = [r for r in grade.results if not (visible_only and grade.concealed(r))]
    earned = sum(r.earns for r in results)
    rows.append(
        (
            "total",
            f"{earned}/{len(results)}",
            f"{_pts(sum(r.score_cents for r in results))} / {_pts(sum(r.max_cents for r in results))}",
        )
    )
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
    out = [f"Grade for {one_line(grade.submission, 200)}{style}: {grade.score:.2f} / {grade.max_score:.2f}"]
    out += [rubric_line(grade), "", table(grade)]
    out += [f"WARNING: {line}" for line in sandbox_lines(grade)]
    if grade.could_not_run:
        out += ["", "COULD NOT RUN:", _indented(grade.could_not_run)]
    if grade.stopped:
        out += ["", "STOPPED:", _indented(grade.stopped)]
    counts = grade.status_counts()
    out += ["", "outcomes: " + ", ".join(f"{SHOWN_STATUS.get(k, k)} {v}" for k, v in sorted(counts.items()))]
    out += [f"consequences: {line}" for line in grade.consequence_lines()]
    out += [f"FLAG (staff): {one_line(flag, 500)}" for flag in grade.staff_flags]
    if failures:
        for note in grade.staff_notes:
            out.append("(staff)\n" + _indented(note))
        for r in grade.results:
            if not r.passed:
                out += ["", f"{SHOWN_STATUS.get(r.status, r.status).upper()} {r.test.id} [{r.test.visibility}]"]
                out.append(_indented(output_of(grade, r, staff=True)))
    return "\n".join(out)


def _indented(text: str) -> str:
    """Text from the submission on the terminal: every line indented, so none can pose as a line of
    the grader's own (a heading, a score)."""
    return "\n".join("  | " + line for line in clean(text).splitlines() or [""])


# -- Gradescope ------------------------------------------------------------------------------


def public_summary(grade: Grade) -> str:
    lines = [f"Transformer spec suite: {grade.score:.2f} / {grade.max_score:.2f} points", rubric_line(grade), ""]
    if grade.could_not_run:
        lines += [f"Could not run your implementation: {grade.could_not_run}", ""]
    if grade.stopped:
        lines += [f"Grading stopped early: {grade.stopped}", ""]
    concealed = [r for r in grade.results if grade.concealed(r)]
    lines.append(table(grade, visible_only=bool(concealed)))
    consequences = grade.consequence_lines(visible_only=True)
    if consequences:
        lines += ["", "Not charged twice (these tests earned their points; the root cause's own tests did not):"]
        lines += [f"  {line}" for line in consequences]
    if concealed:
        worth = sum(r.max_cents for r in concealed)
        lines += [
            "",
            f"{len(concealed)} hidden tests worth {_pts(worth)} points count towards your score; "
            "their results are not shown.",
        ]
    notes = sandbox_lines(grade)
    if notes:
        lines += ["", *(f"Note: {line}" for line in notes)]
    return clean("\n".join(lines), 20_000)


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
                "output": clean(grade.could_not_run),
                "tags": ["could-not-run"],
                "visibility": "visible",
                "number": "0.1",
            }
        )
    for r in grade.results:
        entry = {
            "name": clean(r.test.name, 300),
            "score": r.score,
            "max_score": r.test.max_score,
            "status": "passed" if r.earns else "failed",
            "tags": list(dict.fromkeys(r.test.tags)),
            "visibility": r.test.visibility,
            "number": r.test.number,
        }
        output = output_of(grade, r)
        if output and not grade.concealed(r) and r.status not in (Status.NOT_RUN, Status.SKIPPED, Status.CONSEQUENCE):
            output += "\n" + rerun_line(r)  # nothing to rerun one by one when nothing ran
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
        "extra_data": {"rubric": grade.rubric.metadata()},
    }


def unusable_submission_json(reason: str) -> str:
    """``results.json`` for an upload that is not a gradeable submission at all (or a broken rubric)."""
    text = clean(f"Your submission could not be graded: {reason}")
    data = {
        "score": 0.0,
        "execution_time": 0,
        "output": text,
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": [
            {
                "name": "Could not run your implementation",
                "score": 0.0,
                "max_score": 0.0,
                "status": "failed",
                "output": text,
                "tags": ["could-not-run"],
                "visibility": "visible",
                "number": "0.1",
            }
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def gradescope_json(grade: Grade, **kwargs) -> str:
    return json.dumps(gradescope(grade, **kwargs), indent=2, ensure_ascii=False) + "\n"


# -- Markdown ----------------------------------------------------------------------------------


def _fenced(text: str) -> list[str]:
    """``text`` as a code block that nothing inside it can close."""
    return md_fence(text)


GROUP_MESSAGES = 4  # distinct messages shown in full per root cause; the rest by their first line


def _cause_of(r: TestResult) -> str:
    """The function a failing test is charged to: the names it judges."""
    return ", ".join(r.test.subjects) or r.test.function


def failure_groups(results: list[TestResult]) -> dict[str, list[TestResult]]:
    """Failing tests by the function they judge (their own root cause), in suite order."""
    groups: dict[str, list[TestResult]] = {}
    for r in results:
        groups.setdefault(_cause_of(r), []).append(r)
    return groups


def _points(results) -> str:
    return _pts(sum(r.max_cents for r in results))


def _count(n: int, what: str = "test") -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def markdown(grade: Grade, *, staff: bool = False) -> str:
    """The report a student reads: the score, the components, then what failed grouped under the
    function each failure is charged to (each message once), then the consequences not charged.
    Text from the submission is fenced (messages) or escaped (its name, staff flags)."""

    def conceal(r):
        return not staff and grade.concealed(r)

    out = [f"# Grade: {md_inline(grade.submission, 200)}", ""]
    out += [f"**{grade.score:.2f} / {grade.max_score:.2f} points**", ""]
    out += [f"{md_inline(rubric_line(grade), 1000)}", ""]
    out += [f"> **Warning:** {one_line(line, 2000)}\n" for line in sandbox_lines(grade)]
    if grade.could_not_run:
        out += ["> **Could not run your implementation:**", "", *_fenced(grade.could_not_run), ""]
    if grade.stopped:
        out += ["> **Grading stopped early:**", "", *_fenced(grade.stopped), ""]
    if staff:
        out += [f"> **Flag (staff):** {md_inline(flag, 500)}\n" for flag in grade.staff_flags]
    out += ["| component | tests earned | points |", "|---|---:|---:|"]
    for c in grade.components(visible_only=not staff and any(conceal(r) for r in grade.results)):
        out.append(f"| {md_inline(c.name, 80)} | {c.passed}/{c.tests} | {_pts(c.score_cents)} / {_pts(c.max_cents)} |")
    hidden = [r for r in grade.results if conceal(r)]
    if hidden:
        worth = sum(r.max_cents for r in hidden)
        out += ["", f"{len(hidden)} hidden tests worth {_pts(worth)} points count towards the score; not shown here."]
    shown = [r for r in grade.results if not r.earns and not conceal(r)]
    out += _not_run_section([r for r in shown if r.status == Status.NOT_RUN], grade)
    missing = [r for r in shown if _missing_name(r) is not None]
    out += _not_implemented_section(missing)
    out += _not_provided_section([r for r in shown if r.status == Status.SKIPPED])
    failed = [r for r in shown if r.status not in (Status.NOT_RUN, Status.SKIPPED) and r not in missing]
    out += _failed_section(failed, grade, staff)
    groups = {root: [r for r in rs if not conceal(r)] for root, rs in grade.consequences().items()}
    groups = {root: rs for root, rs in groups.items() if rs}
    if groups:
        out += ["", "## Not charged: consequences of another function's failure", ""]
        out += [f"- {one_line(line, 1000)}" for line in grade.consequence_lines(visible_only=not staff)]
        for root, rs in groups.items():
            out += [f"  - {one_line(root, 300)}: " + ", ".join(f"`{r.test.id}`" for r in rs)]
    return "\n".join(out).rstrip() + "\n"


def _not_run_section(rs: list[TestResult], grade: Grade) -> list[str]:
    if not rs:
        return []
    if grade.could_not_run or grade.stopped:
        why = "your implementation could not be imported" if grade.could_not_run else "grading stopped early"
        return ["", "## Not run", "", f"{_count(len(rs))} ({_points(rs)} points) did not run: {why} (above)."]
    out = ["", "## Not run", ""]
    for message, group in _by_message(rs).items():
        out += [f"{_count(len(group))} ({_points(group)} points):", "", *_fenced(message), ""]
    return out


_NOT_IMPLEMENTED = re.compile(r"not implemented: ([A-Za-z_][A-Za-z0-9_]*)")


def _missing_name(r: TestResult) -> str | None:
    """The function still raising ``NotImplementedError`` that stopped this test (its own, or one it
    needs: a ``setup`` failure), or ``None``."""
    if r.status not in (Status.NOT_IMPLEMENTED, Status.SETUP):
        return None
    found = _NOT_IMPLEMENTED.match(r.message or "")
    if found:
        return found.group(1)
    return _cause_of(r) if r.status == Status.NOT_IMPLEMENTED else None


def _not_implemented_section(rs: list[TestResult]) -> list[str]:
    """One row per function still to write, with every test it stops (its own and those needing it)."""
    if not rs:
        return []
    groups: dict[str, list[TestResult]] = {}
    for r in rs:
        groups.setdefault(_missing_name(r) or _cause_of(r), []).append(r)
    out = ["", "## Not implemented yet", "", "| function | tests it stops | points |", "|---|---:|---:|"]
    for name, group in groups.items():
        out.append(f"| {md_inline(name, 200)} | {len(group)} | {_points(group)} |")
    return out


def _not_provided_section(rs: list[TestResult]) -> list[str]:
    if not rs:
        return []
    out = ["", "## Not provided", ""]
    for message, group in _by_message(rs).items():
        out += [f"{_count(len(group))} ({_points(group)} points):", "", *_fenced(message), ""]
    return out


def _by_message(rs: list[TestResult]) -> dict[str, list[TestResult]]:
    groups: dict[str, list[TestResult]] = {}
    for r in rs:
        groups.setdefault(r.message or SHOWN_STATUS.get(r.status, r.status), []).append(r)
    return groups


def _failed_section(rs: list[TestResult], grade: Grade, staff: bool) -> list[str]:
    if not rs:
        return []
    out = ["", "## Failed, by the function charged", ""]
    for cause, group in failure_groups(rs).items():
        out += [f"### {md_inline(cause, 200)}: {_count(len(group))} not passed ({_points(group)} points)", ""]
        shown: dict[str, int] = {}
        for r in group:
            text = output_of(grade, r, staff=staff)
            status = SHOWN_STATUS.get(r.status, r.status)
            name = md_inline(r.test.name, 300)
            line = f"- {r.test.number} {name} ({_pts(r.max_cents)} points, {status}): `{r.test.rerun}`"
            if text in shown:
                out += [line + f" (the same message as {shown[text]})"]
            elif len(shown) < GROUP_MESSAGES:
                shown[text] = r.test.number
                out += [line, "", *_fenced(text), ""]
            else:
                first = text.splitlines()[0] if text else status
                out += [line, "", *_fenced(first), ""]
        out.append("")
    return out


# -- JUnit XML ---------------------------------------------------------------------------------


def junit(grade: Grade, *, staff: bool = False) -> str:
    failures = sum(not r.earns for r in grade.results)
    suite = ET.Element(
        "testsuite",
        name="transformer-spec",
        tests=str(len(grade.results)),
        failures=str(failures),
        errors="1" if grade.could_not_run else "0",
        skipped="0",
    )
    props = ET.SubElement(suite, "properties")
    facts = [("submission", grade.submission), ("score", f"{grade.score:.2f}"), ("max_score", f"{grade.max_score:.2f}")]
    facts += [("rubric", grade.rubric.source), ("rubric_sha256", grade.rubric.sha256)]
    facts.append(("sandboxed", "yes" if grade.sandboxed else f"no: {grade.sandbox_note}"))
    for k, v in facts:
        ET.SubElement(props, "property", name=k, value=one_line(v, 2000))
    if grade.could_not_run:
        case = ET.SubElement(suite, "testcase", classname="grading", name="could_not_run")
        first = one_line(grade.could_not_run.splitlines()[0] if grade.could_not_run.strip() else "could not run", 500)
        ET.SubElement(case, "error", message=first).text = clean(grade.could_not_run)
    for r in grade.results:
        case = ET.SubElement(suite, "testcase", classname=f"spec_tests.{r.test.component}", name=r.test.id)
        cprops = ET.SubElement(case, "properties")
        ET.SubElement(cprops, "property", name="points", value=f"{r.score:.2f}/{r.test.max_score:.2f}")
        ET.SubElement(cprops, "property", name="visibility", value=r.test.visibility)
        ET.SubElement(cprops, "property", name="outcome", value=r.status)
        if not r.earns:
            text = output_of(grade, r, staff=staff)
            first = one_line(text.splitlines()[0], 500) if text.strip() else r.status
            ET.SubElement(case, "failure", message=first, type=r.status).text = text
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
    header = ["submission", "score", "max_score", "tests_earned", "tests", "status", "sandboxed", *components, "flags"]
    w.writerow([*header, "rubric", "rubric_sha256"])
    for g in grades:
        per = {c.name: _pts(c.score_cents) for c in g.components()}
        status = "could not run" if g.could_not_run else "stopped" if g.stopped else "graded"
        w.writerow(
            [
                csv_cell(g.submission, 200),
                f"{g.score:.2f}",
                f"{g.max_score:.2f}",
                sum(r.earns for r in g.results),
                len(g.results),
                status,
                "yes" if g.sandboxed else "no",
                *[per.get(c, "") for c in components],
                csv_cell("; ".join(g.staff_flags), 2000),
                csv_cell(g.rubric.source, 1000),
                g.rubric.sha256,
            ]
        )
    return buf.getvalue()
