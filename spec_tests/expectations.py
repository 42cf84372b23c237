"""Where expected values come from: the live reference in float64.

Every expected value a test needs goes through ``Expectations.value(key, compute)``, keyed by the
test id and a per-test label, so that a recording of them can stand in for the reference where
its source is not available.
"""

from __future__ import annotations


class LiveExpectations:
    """Computes every expected value from the live (style-bound) reference."""

    def __init__(self, reference):
        self.reference = reference

    def value(self, key: str, compute):
        return compute(self.reference)
