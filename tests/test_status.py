"""The status vocabulary (spec_tests/harness/judging/results.py): one word per way a test can end, the
same string on the wire, in results.json and in the reports."""

from __future__ import annotations

import json

from spec_tests.harness.judging import results
from spec_tests.harness.judging.results import Status, TestVerdict


def test_a_status_is_its_string_everywhere():
    for status in Status:
        assert status == status.value and f"{status}" == status.value and str(status) == status.value
        assert json.dumps({"status": status}) == json.dumps({"status": status.value})


def test_a_verdict_travels_with_a_plain_string():
    """pytest's junit writer prints user properties with repr(): a member must not reach it."""
    data = TestVerdict("t", "norms", ["rmsnorm"], Status.CONSEQUENCE, ["rope"]).to_json()
    assert type(data["status"]) is str and data["status"] == "consequence"
    assert list(data) == list(TestVerdict.__dataclass_fields__)
    assert TestVerdict.from_json(data).status == Status.CONSEQUENCE


def test_the_groups_are_made_of_statuses():
    groups = ("VERDICTS", "EARNING", "REAL_FAILURES", "FAILING", "CHARGED_TO_SUBJECTS", "CRASHES")
    groups += ("CRASHED_OR_MISSING", "KILLING", "CHECK_OUTCOMES")
    for name in groups:
        group = getattr(results, name)
        assert group and all(type(s) is Status for s in group), name
    assert set(results.EARNING) | set(results.FAILING) | {Status.SKIPPED, Status.XFAILED} == set(results.VERDICTS)
