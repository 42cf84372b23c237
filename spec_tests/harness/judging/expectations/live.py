"""Expected values from the live reference (in float64, in the RoPE style the implementation declares)."""

from __future__ import annotations


class LiveExpectations:
    """Computes every expected value from the live reference subject."""

    live = True

    def __init__(self, reference):
        self.reference = reference
        # a check (test function, label, subject) -> the catalogued bugs its first matching case matched
        self._matched: dict[str, set[str]] = {}
        # a subject -> the catalogued bugs that ran on one of its failing checks and did not match it
        self._ruled_out: dict[str, set[str]] = {}

    def value(self, key: str, compute, inputs=()):
        return compute(self.reference)

    def observe_check(self, key: str, subject: str, compute_on) -> None:
        """Called after every check; ``compute_on(subject_like)`` recomputes its quantity."""

    def known_bugs(self, key: str, subject: str, compute_on, actual, tol) -> list:
        """Catalogued bugs whose output, on this check's inputs, matches ``actual``.

        One mistake fails every case of a check (one test function's check label, whatever its parameters) alike,
        and a failing run must not pay for the whole catalog at each case. Once a case has matched catalogued bugs,
        the further cases of that check try only those. A bug that ran on a failing check of a subject and did not
        match it is not tried again on the subject's further checks: an implementation with that bug alone computes
        the bug's output on every check, so a check that failed otherwise rules it out (beside a second mistake the
        bug goes unnamed, as it would on that check). A bug that could not run on a case's inputs (a non-square
        weight, say) is tried again on the next."""
        from ...diagnosis.catalog import matching_bugs

        test, _, label = key.rpartition("::")
        check = f"{test.split('[')[0]}::{label.split('#')[0]}::{subject}"
        ruled_out = self._ruled_out.setdefault(subject, set())
        found = matching_bugs(
            subject, compute_on, actual, tol, self.reference.rope_style, self._matched.get(check), ruled_out
        )
        if found and check not in self._matched:
            self._matched[check] = {bug.name for bug in found}
        return found
