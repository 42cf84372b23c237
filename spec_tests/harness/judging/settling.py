"""Settling consequences: the one decision both pytest's summary (``plugin/terminal.py``) and the
grade (``spec_grading/grade.py``) read, so they agree by construction.

- **Dependency order** (``dependency_order``): upstream first (``protocol.MAY_CALL``'s topological
  order), then protocol order; never set or hash order.
- **Settling** (``settle``): a consequence holds only while each of its roots is charged with a real
  failure (failed or error; a root that is only not implemented or not provided pays for nothing), with
  roots that failed only as consequences replaced by their own roots.

Plain data only, no torch: the grader reads it without importing torch (``consequences.py``, which
composes the reference with an implementation, re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...protocol import MAY_CALL, PROTOCOL_NAMES
from .results import REAL_FAILURES, Status

# ------------------------------------------------------------------------------------------------
# dependency order
# ------------------------------------------------------------------------------------------------


def _depth() -> dict[str, int]:
    """Each protocol name's depth in MAY_CALL: 0 for names that call nothing, callers deeper."""
    depth: dict[str, int] = {}

    def visit(name: str, stack: tuple = ()) -> int:
        if name in depth:
            return depth[name]
        callees = [c for c in MAY_CALL.get(name, ()) if c not in stack]
        depth[name] = 1 + max((visit(c, (*stack, name)) for c in callees), default=-1)
        return depth[name]

    for name in PROTOCOL_NAMES:
        visit(name)
    return depth


DEPTH = _depth()
POSITION = {name: i for i, name in enumerate(PROTOCOL_NAMES)}


def dependency_key(name: str) -> tuple:
    """Sort key: upstream first (MAY_CALL depth), then protocol order, then the name."""
    return (DEPTH.get(name, len(PROTOCOL_NAMES)), POSITION.get(name, len(PROTOCOL_NAMES)), name)


def dependency_order(names) -> list[str]:
    return sorted(set(names), key=dependency_key)


# ------------------------------------------------------------------------------------------------
# settling: the one decision the summary and the grade read
# ------------------------------------------------------------------------------------------------


@dataclass
class Settled:
    status: str  # the verdict's status, or "failed" for a consequence nothing pays for
    roots: list[str]  # for a consequence: its root names, resolved, dependency order
    reason: str = ""  # why a consequence was charged


def settle(verdicts) -> dict[str, Settled]:
    """``{test: Settled}`` for records with ``test``, ``subjects``, ``status``, ``root_cause``.

    A consequence holds while every root is paid for: a subject of a test that really failed
    (failed or error: not only "not implemented", "not provided" or "setup"), or of a consequence
    that holds (a chain: its roots replace it). Otherwise it is charged.
    """
    verdicts = list(verdicts)
    own = {n for v in verdicts if v.status in REAL_FAILURES for n in v.subjects}
    inherited: dict[str, set[str]] = {}
    pending = [v for v in verdicts if v.status == Status.CONSEQUENCE]
    held: dict[str, list[str]] = {}
    progress = True
    while progress:
        progress = False
        for v in list(pending):
            roots = list(v.root_cause)
            if roots and all(r in own or r in inherited for r in roots):
                resolved: set[str] = set()
                for r in roots:
                    resolved |= {r} if r in own else inherited[r]
                held[v.test] = dependency_order(resolved)
                for s in v.subjects:
                    if s not in own:
                        inherited.setdefault(s, set()).update(resolved)
                pending.remove(v)
                progress = True
    out = {}
    for v in verdicts:
        if v.status != Status.CONSEQUENCE:
            out[v.test] = Settled(v.status, [])
        elif v.test in held:
            out[v.test] = Settled(Status.CONSEQUENCE, held[v.test])
        else:
            names = ", ".join(v.root_cause) or "an upstream function"
            out[v.test] = Settled(
                Status.FAILED,
                [],
                f"charged: this test failed and named {names} as the cause, but no graded test of {names} "
                "fails on its own, so nothing else pays for it (a root that is only not implemented or not "
                "provided pays for nothing)",
            )
    return out
