"""Expected values from the live reference (in float64, in the RoPE style the implementation declares)."""

from __future__ import annotations


class LiveExpectations:
    """Computes every expected value from the live reference subject."""

    live = True

    def __init__(self, reference):
        self.reference = reference
        # a check (test function, label, subject) -> the catalogued bugs its first matching case matched
        self._matched: dict[str, set[str]] = {}

    def value(self, key: str, compute, inputs=()):
        return compute(self.reference)

    def observe_check(self, key: str, subject: str, compute_on) -> None:
        """Called after every check; ``compute_on(subject_like)`` recomputes its quantity."""

    def known_bugs(self, key: str, subject: str, compute_on, actual, tol) -> list:
        """Catalogued bugs whose output, on this check's inputs, matches ``actual``.

        Once a case of a check (one test function's check label, whatever its parameters) has matched catalogued
        bugs, its further cases try only those: one mistake fails every case alike, and a failing run must not pay
        for the whole catalog at each of them. A case that matched none leaves the next to try the whole catalog
        again (a bug may not run on one case's inputs, a non-square weight, and match on the next)."""
        from ...diagnosis.catalog import matching_bugs

        test, _, label = key.rpartition("::")
        check = f"{test.split('[')[0]}::{label.split('#')[0]}::{subject}"
        found = matching_bugs(subject, compute_on, actual, tol, self.reference.rope_style, self._matched.get(check))
        if found and check not in self._matched:
            self._matched[check] = {bug.name for bug in found}
        return found
