"""Which weights one optimisation step moves wrongly: a reading of the implementation's own step.

A failing training check compares losses and weights after several steps, where one wrong gradient has reached
every weight by the second step. One SGD step from the same weights, on the implementation and on the reference,
shows more: where the first loss agrees and only some weights land elsewhere, the gradients (the backward pass
through those weights, written by hand or hooked) or the update of exactly those weights are wrong, and the
others are right. Said only where some, not all, differ: a loss or learning-rate mistake moves every weight.
"""

from __future__ import annotations

import math
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


def _unit(order: list[str], i: int) -> list[str]:
    """The run of keys around ``order[i]`` that share its module (``layers.1.attn`` for ``layers.1.attn.wk.weight``):
    the projections one sublayer applies side by side."""
    module = lambda k: k.rsplit(".", 2)[0]
    lo, hi = i, i
    while lo > 0 and module(order[lo - 1]) == module(order[i]):
        lo -= 1
    while hi + 1 < len(order) and module(order[hi + 1]) == module(order[i]):
        hi += 1
    return order[lo : hi + 1]


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
    order = list(theirs)  # the reference's canonical order: the forward's, embeddings first, the head last
    wrong = [k for k in order if mismatch(mine[k], theirs[k], tol) is not None]
    scaled = _scaled_step(mine, theirs, want.get("start"), wrong, tol)
    if scaled is not None:
        return scaled
    if not wrong or len(wrong) == len(order):
        return [], []
    last = order.index(wrong[-1])
    unit = _unit(order, last)
    frontier = [k for k in unit if k in wrong]
    before = order[: order.index(unit[0])]
    wrong_before = [k for k in before if k in wrong]
    after = order[last + 1 :]
    if before and after and len(wrong_before) * 2 >= len(before):  # a gradient wrong from some point on the way back
        shown = ", ".join(after[-4:][::-1]) + (f" and {len(after) - 4} more" if len(after) > 4 else "")
        summary = (
            f"{what}, the loss agrees and the step is right for the {len(after)} tensor{'s' * (len(after) != 1)} "
            f"nearest the output ({shown}); on the way back it first differs at {', '.join(frontier)}, and "
            f"{len(wrong_before)} of the {len(before)} tensors before them differ too"
        )
        where = (
            f"the backward pass between {after[0]} and {frontier[-1]}: the input gradient of what lies between them "
            f"(a norm, a residual add, attention's key/value path) or the gradients of {', '.join(frontier)}"
        )
    else:
        summary = (
            f"{what}, the loss agrees and {_grouped(wrong, order)} ({len(wrong)} of {len(order)} tensors) land "
            f"elsewhere than the specified step puts them; the other {len(order) - len(wrong)} are right"
        )
        where = (
            "the gradients of those weights (the backward pass through them, hand-written or hooked) or their update"
        )
    cause = Cause(
        "partial_update",
        summary,
        where=where,
        fix="each weight's step is -lr times the gradient of the loss with respect to it",
        evidence="one step from the same weights on the implementation and the specification",
        confidence=LOCAL,
    )
    return [cause.line()], [cause.code]


def _scaled_step(mine: dict, theirs: dict, start: dict | None, wrong: list[str], tol):
    """``(lines, codes)`` where every weight's step (from ``start``, the weights both steps began at) is the specified
    one times one factor c, fitted by least squares over the weights that differ: the gradients (or the rate) scaled
    alike. None where no factor gives every weight, or c is 1 or not positive."""
    if start is None or not wrong or any(k not in start for k in theirs):
        return None
    moved = [(mine[k].double() - start[k].double(), theirs[k].double() - start[k].double()) for k in wrong]
    norm = sum(float((t * t).sum()) for _, t in moved)
    if norm == 0:
        return None
    c = sum(float((m * t).sum()) for m, t in moved) / norm
    if c <= 0 or abs(c - 1) < 0.01:
        return None
    for k in theirs:
        if mismatch(mine[k], start[k].double() + c * (theirs[k].double() - start[k].double()), tol) is not None:
            return None
    cause = Cause(
        "knob:loss_reduction",
        f"every weight's step is {c:.4g} times the specified one (one factor for all {len(wrong)} tensors that "
        "move): the gradients are scaled alike, as by a loss divided by another count than the specified mean's (a "
        "batch size read from another axis, sequences for tokens, a sum over the batch) or a learning rate scaled",
        where="what the loss is divided by before the backward pass (and any factor on the gradients or the rate)",
        fix="the loss is the mean over the batch's target tokens; each weight's step is -lr times its gradient",
        evidence=f"one step from the same weights: the implementation's step equals the specified step times {c:.4g} "
        "in every weight",
        confidence=LOCAL,
    )
    return [cause.line()], [cause.code]


def unclipped_lines(run_unclipped: Callable, want_unclipped: Callable, tol, clip: float) -> tuple[list[str], list[str]]:
    """``run_unclipped()``: the implementation's losses run again with a ``max_grad_norm`` too large to clip;
    ``want_unclipped()``: the specified losses without clipping. Where they agree (and the run at ``clip`` did not),
    the clipping is what differs."""
    try:
        got, want = [float(v) for v in run_unclipped()], want_unclipped()
    except Exception:  # noqa: BLE001 - a reading that cannot run says nothing
        return [], []
    if mismatch(got, want, tol) is not None:
        return [], []
    cause = Cause(
        "knob:clipping",
        f"the losses are the specified ones where max_grad_norm is too large to clip (1e9) and differ at "
        f"max_grad_norm={clip}: the clipping is wrong (its scale, the norm it measures, what it scales: gradients, "
        "moments, the update; or where in the step it is applied)",
        where="the gradient clipping of the training step",
        fix="scale the gradients by min(1, max_grad_norm / their global norm) between backward and the optimizer's "
        "step, and nothing else",
        evidence=f"the same call with max_grad_norm=1e9 instead of {clip} gives the specified losses",
        confidence=LOCAL,
    )
    return [cause.line()], [cause.code]


def fitted_lr_lines(losses, correct: Callable, given: float, tol, others: Callable | None = None):
    """``correct(rate)``: the specified losses of the same steps at learning rate ``rate``. Where the implementation's
    ``losses`` agree in their first and a rate in [1e-7, 10] gives them all (found by bisection on the second loss,
    which falls as the rate grows), the learning rate the steps took is named. At least three losses: one rate fitted
    to the second gives any two, so only a third that it gives too is evidence. ``others(losses, tol)``: what else
    gives the same losses at the given rate (an update rule's slip scales the steps as a rate does); where anything
    does, the line is ambiguous and names them all. Returns ``(lines, codes)``."""
    try:
        got = [float(v) for v in losses]
        if len(got) < 3 or mismatch(got[:1], correct(given)[:1], tol) is not None:
            return [], []
        lo, hi = math.log(1e-7), math.log(10.0)
        second = lambda log_rate: float(correct(math.exp(log_rate))[1])
        if not second(hi) <= got[1] <= second(lo):
            return [], []
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if second(mid) > got[1] else (lo, mid)
        rate = math.exp((lo + hi) / 2)
        if mismatch(got, [float(v) for v in correct(rate)], tol) is not None or abs(rate / given - 1) < 0.01:
            return [], []
        alike = others(got, tol) if others is not None else []
    except Exception:  # noqa: BLE001 - a reading that cannot run says nothing
        return [], []
    cause = Cause(
        "knob:learning_rate",
        f"the steps are those of learning rate {rate:.3g}, not {given:g}, the lr train was called with (or defaults "
        "to): a default or a module-level constant used instead of the argument, or a schedule's value",
        where="the learning rate the optimizer inside train is made with, and what sets it at each step",
        fix="use the lr argument, unchanged, at every step",
        evidence=f"the specified steps at lr {rate:.3g} (fitted on the second loss) give every loss",
        confidence=LOCAL,
    )
    if alike:  # a slip in the update rule gives the same losses: the rate is a symptom of either
        return [f"likely cause (ambiguous, {1 + len(alike)} fit): {cause.summary}; or {'; or '.join(alike)}"], []
    return [cause.line()], [cause.code]
