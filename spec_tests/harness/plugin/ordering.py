"""The order spec tests run in: every test after the tests that can explain its failure.

A failing test is a consequence only of upstream names already seen failing (``judging/rootcause.py``
decides as the tests run), so a test must run after every test of a name its verdict may rest on. The
tests' own ``@judges(subjects, uses=...)`` markers say which names those are: a test of ``s`` rests on
``uses`` and on everything ``s`` and ``uses`` may call (``protocol.MAY_CALL``). That gives a graph over
protocol names; each name's **level** is one more than the deepest level it rests on, with names that
rest on each other (a cycle: the model, its cache and its state dict) sharing one level. Tests run by
the deepest level of their subjects (``sort_key``).

Inside a cycle, order cannot settle it: the checks there defer to each other explicitly
(``models.plain_given``, a cache's prefill compared with its own forward).
"""

from __future__ import annotations

from ..judging.consequences import upstream_closure


def rests_on(subjects, uses) -> set[str]:
    """The names a test of ``subjects`` that also calls ``uses`` may fail because of (not its subjects)."""
    return (upstream_closure(set(subjects) | set(uses)) | set(uses)) - set(subjects)


def levels(declarations) -> dict[str, int]:
    """``{name: level}`` for ``declarations``, an iterable of ``(subjects, uses)``: 0 for a name that rests
    on nothing, otherwise one more than the deepest name it rests on outside its own cycle."""
    edges: dict[str, set[str]] = {}
    for subjects, uses in declarations:
        below = rests_on(subjects, uses)
        for name in subjects:
            edges.setdefault(name, set()).update(below)
    names = set(edges) | {m for below in edges.values() for m in below}
    reach = {}
    for name in names:
        seen, todo = set(), list(edges.get(name, ()))
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(edges.get(m, ()))
        reach[name] = seen
    cycle = {n: frozenset({n} | {m for m in reach[n] if n in reach[m]}) for n in names}
    level: dict[frozenset, int] = {}

    def visit(group: frozenset) -> int:
        if group not in level:
            below = {cycle[m] for n in group for m in edges.get(n, ())} - {group}
            level[group] = 1 + max((visit(g) for g in below), default=-1)
        return level[group]

    return {n: visit(cycle[n]) for n in names}


def sort_key(subjects, level: dict[str, int], component_rank: int, functions_only: bool, position: int) -> tuple:
    """By the deepest subject's level; at one level, a test that also judges a shallower name (``forward`` and
    ``generate``) before the tests resting on that name, then by component, component functions alone first,
    then the files' order."""
    own = [level.get(s, 0) for s in subjects] or [0]
    return (max(own), min(own), component_rank, 0 if functions_only else 1, position)
