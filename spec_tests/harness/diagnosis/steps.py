"""Which weights one optimisation step moves wrongly: a reading of the implementation's own step.

A failing training check compares losses and weights after several steps, where one wrong gradient has reached
every weight by the second step. One SGD step from the same weights, on the implementation and on the reference,
shows more: where the first loss agrees and only some weights land elsewhere, the gradients (the backward pass
through those weights, written by hand or hooked) or the update of exactly those weights are wrong, and the
others are right. Said only where some, not all, differ: a loss or learning-rate mistake moves every weight.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..judging.compare import mismatch
from .cause import LOCAL, Cause


def _grouped(keys: list[str], every: list[str]) -> str:
    """``keys`` with a layer index that covers every layer written ``layers.*.wk``."""
    star = lambda k: re.sub(r"\.\d+\.", ".*.", k)
    out = []
    for pattern in dict.fromkeys(star(k) for k in keys):
        members = [k for k in keys if star(k) == pattern]
        if pattern != members[0] and len(members) == sum(star(k) == pattern for k in every):
            out.append(f"{pattern} (every layer)")
        else:
            out += members
    return ", ".join(out[:8]) + (f" and {len(out) - 8} more" if len(out) > 8 else "")


def step_lines(what: str, run_impl: Callable, run_ref: Callable, tol) -> tuple[list[str], list[str]]:
    """``run_*()``: ``{"loss": float, "weights": {canonical name: tensor}}`` after one step from the same weights.
    A line naming the weights the implementation's step moves elsewhere, where the loss agrees and some weights'
    steps agree; else nothing."""
    try:
        got, want = run_impl(), run_ref()
    except Exception:  # noqa: BLE001 - a reading that cannot run says nothing
        return [], []
    if mismatch(got.get("loss"), want["loss"], tol) is not None:
        return [], []  # the forward or the loss differs already: every gradient may
    mine, theirs = got.get("weights") or {}, want["weights"]
    if set(mine) != set(theirs):
        return [], []
    wrong = [k for k in theirs if mismatch(mine[k], theirs[k], tol) is not None]
    if not wrong or len(wrong) == len(theirs):
        return [], []
    right = len(theirs) - len(wrong)
    cause = Cause(
        "partial_update",
        f"{what}, the loss agrees and {_grouped(wrong, list(theirs))} ({len(wrong)} of {len(theirs)} tensors) land "
        f"elsewhere than the specified step puts them; the other {right} are right",
        where="the gradients of those weights (the backward pass through them, hand-written or hooked) or their update",
        fix="each weight's step is -lr times the gradient of the loss with respect to it",
        evidence="one step from the same weights on the implementation and the specification",
        confidence=LOCAL,
    )
    return [cause.line()], [cause.code]
