"""Expected values from the live reference (in float64, in the RoPE style the implementation declares)."""

from __future__ import annotations


class LiveExpectations:
    """Computes every expected value from the live reference subject."""

    live = True

    def __init__(self, reference):
        self.reference = reference

    def value(self, key: str, compute, inputs=()):
        return compute(self.reference)

    def observe_check(self, key: str, subject: str, compute_on) -> None:
        """Called after every check; ``compute_on(subject_like)`` recomputes its quantity."""

    def known_bugs(self, key: str, subject: str, compute_on, actual, tol) -> list:
        """Catalogued bugs whose output, on this check's inputs, matches ``actual``."""
        from ...diagnosis.catalog import matching_bugs

        return matching_bugs(subject, compute_on, actual, tol, self.reference.rope_style)
