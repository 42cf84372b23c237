"""Writing the expected-failure file from a run (``--spec-write-xfails FILE``, ``spec-check --write-xfails``).

A maintainer pointing the suite at their code for the first time runs it once with this option and
starts green and strict: every test that did not pass (failed, not implemented, errored, or failed
as a consequence, which an expected failure upstream no longer excuses) is listed under its id
relative to ``spec_tests/``, exactly as ``--spec-xfails`` matches it, with the first line of its
failure as a reason to be replaced by what the code does instead. Tests already expected to fail
keep their reason; an expected failure that now passes is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..judging.results import FAILING, Status, verdict_of


def toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, for the characters json.dumps escapes)."""
    return json.dumps(text, ensure_ascii=False)


def reason_of(verdict) -> str:
    """A first reason, from what the run said: to be replaced by what the code does instead."""
    first = (verdict.message or "").strip().splitlines()[0][:200] if (verdict.message or "").strip() else ""
    if verdict.status == Status.NOT_IMPLEMENTED:
        return first or "not implemented"
    if verdict.status == Status.CONSEQUENCE and verdict.root_cause:
        return f"fails as a consequence of {', '.join(verdict.root_cause)}"
    return f"fails: {first}" if first else f"fails ({verdict.status})"


class XfailsWriter:
    """A pytest plugin recording each spec test's outcome and writing the file when the run ends."""

    def __init__(self, path: Path, label: str, test_id):
        self.path, self.label, self.test_id = path, label, test_id
        self.entries: dict[str, str] = {}
        self.passing: set[str] = set()

    def pytest_runtest_logreport(self, report):
        verdict = verdict_of(report)
        if verdict is None or (report.when != "call" and not (report.failed or report.skipped)):
            return
        key = self.test_id(report.nodeid)
        if hasattr(report, "wasxfail"):
            if report.skipped:  # an expected failure that still fails: keep its reason
                self.entries[key] = report.wasxfail.split(": ", 1)[-1] if report.wasxfail else "expected failure"
            else:  # XPASS(strict): it passes now
                self.entries.pop(key, None)
                self.passing.add(key)
            return
        if verdict.status in FAILING and key not in self.passing:
            self.entries[key] = reason_of(verdict)

    def pytest_sessionfinish(self, session):
        lines = [
            f"# Expected failures of {self.label}, written by --spec-write-xfails from a run of the suite.",
            "# Replace each reason with what the code does instead and why (docs: README, 'Expected failures').",
            "[xfail]",
        ]
        lines += [f"{toml_string(key)} = {toml_string(reason)}" for key, reason in sorted(self.entries.items())]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(f"wrote {len(self.entries)} expected failure(s) to {self.path}")
