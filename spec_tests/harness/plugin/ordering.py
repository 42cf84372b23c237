"""The order spec tests run in: every test after the tests that can explain its failure.

A failing test is a consequence only of upstream names already seen failing (``judging/rootcause.py``
decides as the tests run), so a test must run after every test of a name its verdict may rest on. The
tests' own ``@judges(subjects, uses=...)`` markers say which names those are: a test of ``s`` rests on
``uses`` and on everything ``s`` and ``uses`` may call (``protocol.MAY_CALL``). That gives a graph over
protocol names; each name's **level** is one more than the deepest level it rests on, with names that
rest on each other (a cycle: the model, its cache and its state dict) sharing one level. A test runs once
the tests of every name below its level that it rests on have run, and otherwise in the files' order
(``run_order``).

Inside a cycle, order cannot settle it: the checks there defer to each other explicitly
(``models.plain_given``, a cache's prefill compared with its own forward).
"""

from __future__ import annotations

import heapq

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


def run_order(declarations, keys) -> list[int]:
    """Indices of ``declarations`` (``(subjects, uses)`` per test) in run order.

    A test is ready once every test of each name it rests on below its own level has run; of the ready tests the
    one with the smallest ``keys`` entry runs next (the suite's key: upstream components first, component functions
    alone first, then the files' order). So the order is the files' wherever that already puts causes first, and a
    test moves only as far as it must. Should tests wait on each other all the same (a test of two names), the
    smallest key runs."""
    declarations = list(declarations)
    level = levels(declarations)
    remaining: dict[str, int] = {}
    for subjects, _ in declarations:
        for name in subjects:
            remaining[name] = remaining.get(name, 0) + 1
    waits = []
    for subjects, uses in declarations:
        mine = max((level.get(s, 0) for s in subjects), default=0)
        waits.append({n for n in rests_on(subjects, uses) if n in remaining and level.get(n, 0) < mine})
    ready = [(keys[i], i) for i, w in enumerate(waits) if not w]
    heapq.heapify(ready)
    pending = {i for i, w in enumerate(waits) if w}
    out: list[int] = []
    while ready or pending:
        if not ready:  # tests waiting on each other: the smallest key goes first
            first = min(pending, key=lambda i: keys[i])
            pending.discard(first)
            heapq.heappush(ready, (keys[first], first))
        _, i = heapq.heappop(ready)
        out.append(i)
        done = set()
        for name in declarations[i][0]:
            remaining[name] -= 1
            if remaining[name] == 0:
                done.add(name)
        for j in [j for j in pending if waits[j] & done]:
            waits[j] -= done
            if not waits[j]:
                pending.discard(j)
                heapq.heappush(ready, (keys[j], j))
    return out
