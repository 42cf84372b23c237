"""The implementation under test, as the tests see it.

A protocol name the implementation does not define is "not provided": the test is skipped.
A name that raises ``NotImplementedError`` is "not implemented": the test fails with one line.
"""

from __future__ import annotations

import functools

import pytest

from .protocol import ALL_FAMILIES, DEFAULT_ROPE_STYLE, PROTOCOL_NAMES, ROPE_STYLES


class NotImplementedInImpl(BaseException):
    """Raised when a protocol function reports ``NotImplementedError``; carries its name.

    A ``BaseException`` on purpose: Hypothesis then stops at the first example instead of
    shrinking a failure that every input reproduces, and no ``except Exception`` in a test or in
    the implementation can swallow it.
    """

    def __init__(self, name: str, inner: str):
        self.name, self.inner = name, inner
        super().__init__(name if inner in ("", name) else f"{inner} (reached through {name})")


def _wrap(fn, name: str):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotImplementedInImpl:
            raise
        except NotImplementedError as exc:
            raise NotImplementedInImpl(name, str(exc)) from None

    return call


class Implementation:
    """Attribute access to the protocol names of ``obj``, with skip/fail semantics."""

    def __init__(self, obj, label: str):
        self.obj, self.label = obj, label
        families = getattr(obj, "FAMILIES", ALL_FAMILIES)
        unknown = [f for f in families if f not in ALL_FAMILIES]
        if unknown:
            raise ValueError(f"{label}: FAMILIES lists unknown families {unknown}; known: {ALL_FAMILIES}")
        self.families = tuple(families)
        self.rope_style = getattr(obj, "ROPE_STYLE", DEFAULT_ROPE_STYLE)
        if self.rope_style not in ROPE_STYLES:
            raise ValueError(f"{label}: ROPE_STYLE must be one of {ROPE_STYLES}, got {self.rope_style!r}")

    def provides(self, name: str) -> bool:
        return getattr(self.obj, name, None) is not None

    def require(self, *names: str) -> None:
        """Skip the calling test unless every name is provided."""
        missing = [n for n in names if not self.provides(n)]
        if missing:
            pytest.skip(f"not provided by {self.label}: {', '.join(missing)}")

    def require_family(self, family: str) -> None:
        if family not in self.families:
            pytest.skip(f"not provided by {self.label}: family {family!r} (FAMILIES = {self.families})")

    def __getattr__(self, name: str):
        if name not in PROTOCOL_NAMES:
            raise AttributeError(f"{name!r} is not a protocol v1 name")
        self.require(name)
        return _wrap(getattr(self.obj, name), name)

    def __repr__(self) -> str:
        return f"Implementation({self.label})"
