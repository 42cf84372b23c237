"""The suite's pytest markers, in one place, and their validation.

- ``component(name)`` (module level): the component a test file judges (``protocol.COMPONENT_ORDER``);
- ``judges(*subjects, uses=(...), explained_by=(...))``: the protocol names a test judges, the other names it needs
  (every one must be provided before any setup runs, or the test is skipped as not provided), and names whose own
  failures its checks may defer to without needing them (a rebase onto the loading round trip): they order the run
  and its judging again as ``uses`` do, and a test runs without them;
- ``bug_class(*names)``: the classes of mistakes a test is designed to catch (``bug_classes.py``);
- ``points(weight)`` and ``visibility(name)``: grading metadata (the rubric can override both).
"""

from __future__ import annotations

import pytest

from ...bug_classes import BUG_CLASSES
from ...protocol import COMPONENT_ORDER, PROTOCOL_NAMES

MARKERS = (
    "component(name): the component a test file judges (spec_tests/protocol.py COMPONENT_ORDER)",
    "judges(*subjects, uses=(), explained_by=()): the protocol names a test judges, the other names it needs, and "
    "names its failures may be consequences of without needing them",
    "bug_class(*names): the classes of mistakes a test is designed to catch (spec_tests/bug_classes.py)",
    "points(weight): the test's weight within its component when graded (default 1)",
    "visibility(name): Gradescope visibility when graded: visible | hidden | after_due_date | after_published",
)


def judges(*subjects: str, uses: tuple[str, ...] = (), explained_by: tuple[str, ...] = ()):
    """``@judges("generate", uses=("build_model",))``: what a test judges and what else it needs; ``explained_by``:
    names its failures may be consequences of, which it does not need (an implementation without them runs it)."""
    return pytest.mark.judges(*subjects, uses=tuple(uses), explained_by=tuple(explained_by))


def component_of(item) -> str:
    mark = item.get_closest_marker("component")
    return mark.args[0] if mark and mark.args else "other"


def subjects_of(item) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(subjects, uses)`` declared by the item's ``judges`` marker, ``uses`` with its ``explained_by`` names (what
    the test rests on, for the run's order and its judging again)."""
    mark = item.get_closest_marker("judges")
    if mark is None:
        return (), ()
    return tuple(mark.args), tuple(mark.kwargs.get("uses", ())) + tuple(mark.kwargs.get("explained_by", ()))


def needed_of(item) -> tuple[str, ...]:
    """The names the item's ``judges`` marker says it needs besides its subjects (``uses``, not ``explained_by``)."""
    mark = item.get_closest_marker("judges")
    return () if mark is None else tuple(mark.kwargs.get("uses", ()))


def bug_classes_of(item) -> list[str]:
    return sorted({arg for mark in item.iter_markers("bug_class") for arg in mark.args})


def problems(item) -> list[str]:
    """What is wrong with a spec test's markers (unknown names, missing declarations)."""
    found = []
    subjects, uses = subjects_of(item)
    if not subjects:
        found.append("no @judges(...) marker: say which protocol names the test judges")
    unknown = [n for n in (*subjects, *uses) if n not in PROTOCOL_NAMES]
    if unknown:
        found.append(f"judges/uses name non-protocol names {unknown}")
    component = component_of(item)
    if component not in COMPONENT_ORDER:
        found.append(f"component {component!r} is not one of {COMPONENT_ORDER}")
    unknown = [c for c in bug_classes_of(item) if c not in BUG_CLASSES]
    if unknown:
        found.append(f"bug_class names {unknown} are not in spec_tests/bug_classes.py")
    return found
