"""Ranking causes and writing them as ``likely cause:`` lines.

``rank`` orders causes by confidence, then specificity (a knob setting that reproduces the output
names the mistake more precisely than a structural description of it). ``describe`` writes the
lines a failure report shows. It never states a name with confidence when the evidence does not
single one out: when the top causes are close and conflict, the first line says the evidence is
ambiguous and lists them; when only weak evidence exists, it says so.
"""

from __future__ import annotations

from .cause import LOCAL, WEAK, Cause

# Structural codes that describe the same kind of observation: two of them fitting at once are two
# views of one mistake (a roll is a permutation and a shift; a tail error in attention rows is a
# boundary and a mask problem), not competing explanations.
FAMILIES = {
    "layout": "geometry",
    "shift": "geometry",
    "shape": "geometry",
    "scale": "factor",
    "sign": "factor",
    "mask": "where",
    "boundary": "where",
    "nan_rows": "where",
    "rope_pairing": "where",
    "overflow": "where",
    "causality": "where",
    "batch_mixing": "where",
    "precision": "precision",
    "dtype": "precision",
    "noop": "noop",
}
CLOSE = 0.1  # confidences closer than this are "close"
SHOWN = 5  # at most this many lines


def specificity(cause: Cause) -> int:
    if cause.source == "knob" or cause.code.startswith("knob:"):
        return 2
    if cause.source == "probe":
        return 1
    return 0


def rank(causes) -> list[Cause]:
    """Causes ordered by confidence, then specificity (knob > probe > structural); duplicates dropped."""
    seen, unique = set(), []
    for c in causes:
        key = (c.code, c.summary)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    order = {id(c): i for i, c in enumerate(unique)}
    return sorted(unique, key=lambda c: (-round(c.confidence, 6), -specificity(c), order[id(c)]))


def conflicting(a: Cause, b: Cause) -> bool:
    """Do two causes name different mistakes (rather than describe one mistake two ways)?"""
    if a.code == b.code:
        return False
    ka, kb = specificity(a) == 2, specificity(b) == 2
    if ka and kb:
        return True  # two different knob settings both reproduce the output
    if ka or kb:
        return False  # a knob setting and a structural description of its output
    return FAMILIES.get(a.code, a.code) != FAMILIES.get(b.code, b.code)


def is_ambiguous(cause: Cause) -> bool:
    """A cause its detector marked ambiguous (several knob settings of different codes fit)."""
    return cause.summary.startswith("ambiguous")


def describe(causes) -> list[str]:
    """The ``likely cause`` lines for a failure, best first; empty when nothing fits."""
    ranked = [c for c in rank(causes) if c.confidence >= WEAK]
    if not ranked:
        return []
    top = ranked[0]
    knobs = [c for c in ranked if specificity(c) == 2]
    fitting: list[Cause] = []
    if knobs and all(is_ambiguous(c) for c in knobs):
        fitting = knobs  # the most specific evidence does not single out one knob
    else:
        rivals = [c for c in ranked[1:] if top.confidence - c.confidence < CLOSE and conflicting(top, c)]
        if rivals:
            fitting = [top, *rivals]
    if fitting:
        names = "; or ".join(_short(c) for c in fitting)
        lines = [f"likely cause (ambiguous, {len(fitting)} fit): {names}"]
        lines += [f"likely cause (one of {len(fitting)}, unconfirmed): {c.body()}" for c in fitting]
        rest = [c for c in ranked if c not in fitting]
    else:
        if top.confidence < LOCAL:
            lines = [f"likely cause (weak evidence, {top.confidence:.2f}): {top.body()}"]
        else:
            lines = [top.line()]
        rest = ranked[1:]
    for c in rest:
        if len(lines) >= SHOWN:
            break
        lines.append(f"likely cause (also fits, {c.confidence:.2f}): {c.body()}")
    return lines


def _short(c: Cause) -> str:
    text = c.summary
    if text.startswith("ambiguous"):
        text = text.split(": ", 1)[1] if ": " in text else text
        text = text.split("; equally: ")[0]
    return f"{text} [{c.code}]"
