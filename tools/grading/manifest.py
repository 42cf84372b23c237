"""The pytest plugin of the trusted recording pass (``-p tools.grading.manifest``): writes the list of
tests to grade, with what the rubric needs from each, and the reference's own outcome.

Manifest (JSON): ``{"tests": [{"id", "file", "function", "params", "doc", "component", "bug_classes",
"points", "visibility", "live", "reference_outcome"}, ...]}`` in collection order. ``id`` is the
node id after ``spec_tests/`` (``test_norms.py::test_rmsnorm[f64-unit]``).
"""

from __future__ import annotations

import inspect
import json

import pytest

_TESTS: dict[str, dict] = {}


def normalize_nodeid(nodeid: str) -> str:
    return nodeid.split("spec_tests/", 1)[-1]


def pytest_addoption(parser):
    parser.getgroup("grading").addoption("--grading-manifest", default=None, help="write the manifest here")


def _marker_args(item, name) -> list:
    return [arg for mark in item.iter_markers(name) for arg in mark.args]


def describe_item(item) -> dict:
    component = item.get_closest_marker("component")
    points = item.get_closest_marker("points")
    visibility = item.get_closest_marker("visibility")
    doc = inspect.getdoc(getattr(item, "obj", None)) or ""
    callspec = getattr(item, "callspec", None)
    return {
        "id": normalize_nodeid(item.nodeid),
        "file": normalize_nodeid(item.nodeid).split("::", 1)[0],
        "function": item.originalname if hasattr(item, "originalname") else item.name,
        "params": callspec.id if callspec is not None else "",
        "doc": doc,
        "component": component.args[0] if component and component.args else "other",
        "bug_classes": sorted(set(_marker_args(item, "bug_class"))),
        "points": float(points.args[0]) if points and points.args else None,
        "visibility": visibility.args[0] if visibility and visibility.args else None,
        "live": item.get_closest_marker("needs_live_reference") is not None,
        "reference_outcome": None,
    }


def pytest_collection_finish(session):
    if session.config.getoption("grading_manifest"):
        for item in session.items:
            entry = describe_item(item)
            _TESTS[entry["id"]] = entry


def pytest_runtest_logreport(report):
    entry = _TESTS.get(normalize_nodeid(report.nodeid))
    if entry is None:
        return
    if report.failed:
        entry["reference_outcome"] = "failed"
    elif report.skipped and entry["reference_outcome"] != "failed":
        entry["reference_outcome"] = "skipped"
    elif report.when == "call" and report.passed and entry["reference_outcome"] is None:
        entry["reference_outcome"] = "passed"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    path = session.config.getoption("grading_manifest")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"tests": list(_TESTS.values())}, f, indent=1)
