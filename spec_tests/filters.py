"""The sampling filters as an implementation declares them (protocol v2 capabilities ``top_k``, ``top_p``).

A test about a filter needs its capability (``require``: skipped as not provided without it); a test about
something else (shapes, reproducibility, inputs left unchanged) drops the filters the implementation lacks
(``supported``) and judges the rest. A v1 implementation has both (``spec_tests/protocol.py``).
"""

from __future__ import annotations

FILTERS = ("top_k", "top_p")


def provided(impl, kw: dict) -> bool:
    """Whether every filter ``kw`` sets is declared."""
    return all(kw.get(f) is None or f in impl.capabilities for f in FILTERS)


def supported(impl, kw: dict) -> dict:
    """``kw`` without the filters the implementation does not declare."""
    return {k: v for k, v in kw.items() if k not in FILTERS or k in impl.capabilities}


def require(impl, kw: dict) -> None:
    """Skip the calling test unless every filter ``kw`` sets is declared."""
    impl.require_capability(*(f for f in FILTERS if kw.get(f) is not None))
