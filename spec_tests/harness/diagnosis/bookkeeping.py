"""Bookkeeping mistakes: the optimiser's update rule, how data is cut into windows, what a count includes.

These are the mistakes the numbers of a training loop hide: every step runs, the loss falls, and yet the
update is not AdamW's, the targets are not the next tokens, or a count leaves out a group of weights. Each
helper here states one mechanism as a computation (a variant that reproduces the failing value) or reads
the evidence a test holds (the starts it saw, the windows it got) and says what it shows, naming a cause
only where one mechanism alone explains it and describing the difference otherwise.

- ``AdamWRule`` and ``ADAMW_RULES``: AdamW with one of the common slips in its update (no bias
  correction, weight decay coupled into the gradient, decay not scaled by the learning rate, eps inside
  the square root);
- ``target_shift(x, y)``: what a batch's targets are relative to its inputs, on data ``arange``;
- ``start_range(seen, want, context_length)``: which window starts a sampler draws, against the allowed ones;
- ``count_variants(sizes, want)``: parameter counts off by exactly one group of weights.
"""

from __future__ import annotations

import math

import torch

from .cause import EXACT_SHARED, Cause
from .variant import Variant

# ----------------------------------------------------------------------------------------- AdamW

ADAMW_RULES = {
    "no_bias_correction": (
        "AdamW without bias correction: the moments are used as they are, not divided by 1 - beta**t, so step t is "
        "(1 - beta1**t) / sqrt(1 - beta2**t) times its right size (3.2x at the first step with the default betas)",
        "m_hat = m / (1 - beta1**t), v_hat = v / (1 - beta2**t), then p -= lr * m_hat / (sqrt(v_hat) + eps)",
    ),
    "coupled_decay": (
        "the weight decay is added to the gradient (Adam with L2, g + wd * p) instead of decoupled from it, "
        "so Adam's normalisation rescales it",
        "decay the weights directly, p *= 1 - lr * wd, and give Adam the plain gradient (AdamW, Loshchilov & Hutter)",
    ),
    "unscaled_decay": (
        "the weight decay is not scaled by the learning rate (p *= 1 - wd instead of p *= 1 - lr * wd)",
        "p *= 1 - lr * weight_decay before the Adam update",
    ),
    "decay_after_lr_scale": (
        "the weight decay is added after the learning-rate scaling (optax's chain(scale_by_adam, scale(-lr), "
        "add_decayed_weights(wd))): the update is -lr * adam + wd * p, so every weight grows by wd * p each step "
        "instead of shrinking by lr * wd * p",
        "decay before the scaling, chain(scale_by_adam, add_decayed_weights(wd), scale(-lr)): "
        "p -= lr * (adam + wd * p)",
    ),
    "eps_inside_sqrt": (
        "AdamW's eps is inside the square root (sqrt(v_hat + eps)) instead of added to it (sqrt(v_hat) + eps)",
        "p -= lr * m_hat / (sqrt(v_hat) + eps)",
    ),
    "v_hat_beta1": (
        "AdamW's second moment is bias-corrected with beta1 (v / (1 - beta1**t)) instead of beta2, so the early "
        "steps are sqrt((1 - beta1**t) / (1 - beta2**t)) times too large (10x at the first)",
        "v_hat = v / (1 - beta2**t)",
    ),
    "v_weight_beta1": (
        "AdamW's second moment takes the new squared gradient with weight 1 - beta1 instead of 1 - beta2 (v = beta2 "
        "* v + (1 - beta1) * g**2), so v is 100 times too large with the default betas and every step about 10 times "
        "too small: the steps of a tenth of the learning rate",
        "v = beta2 * v + (1 - beta2) * g**2 (v.mul_(beta2).addcmul_(g, g, value=1 - beta2))",
    ),
    "moment_weights_swapped": (
        "AdamW's first moment weighs the new gradient by beta1 and the old moment by 1 - beta1 (m.lerp_(g, beta1) "
        "where lerp_(g, 1 - beta1) belongs): the first step is 9x too large with beta1 0.9 and the momentum keeps "
        "almost no memory",
        "m = beta1 * m + (1 - beta1) * g (m.lerp_(g, 1 - beta1))",
    ),
    "undamped_first_moment": (
        "AdamW's first moment is not damped: m = beta1 * m + g instead of beta1 * m + (1 - beta1) * g (classical "
        "momentum, or a running average without its dampening), so after the bias correction every step is about "
        "1 / (1 - beta1) = 10x too large",
        "m = beta1 * m + (1 - beta1) * g (m.lerp_(g, 1 - beta1))",
    ),
    "trust_ratio": (
        "every tensor's AdamW step is scaled by ||w|| / ||step|| (LAMB's trust ratio), not taken as it is",
        "p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), with no per-tensor trust ratio",
    ),
    "stepped_twice": (
        "the tied embedding/head matrix is stepped twice per step: it is listed twice in the optimizer (under both "
        "names, named_parameters(remove_duplicate=False)), so its moments and step count advance twice",
        "give the optimizer each parameter once: model.parameters(), or named_parameters() (which drops duplicates)",
    ),
    "step_count_stuck": (
        "AdamW's step count never advances (computed for the bias corrections and not stored): every step is "
        "corrected as the first, so from the second step on the first moment is scaled by 1 / (1 - beta1) = 10 "
        "instead of 1 / (1 - beta1**t)",
        "store the incremented step count in the optimizer's state: state['step'] += 1, then correct with it",
    ),
    "step_count_per_parameter": (
        "AdamW's step count (or its bias-correction powers beta**t) is one counter for the whole optimizer, advanced "
        "inside the loop over parameters instead of once per step: the i-th parameter of a step is corrected as step "
        "t = i + 1 of the first, so later parameters take ever smaller first steps",
        "advance the step count once per step, before the loop (or keep one per parameter in its state)",
    ),
    "step_count_by_parameter_count": (
        "AdamW's step count advances inside the loop over parameters while the bias corrections are computed once, "
        "before it: the first step is right, and step s is corrected as step 1 + P (s - 1) for P parameters, so "
        "from the second step on the moments are barely corrected",
        "advance the step count once per step, after (or before) the loop over parameters, not inside it",
    ),
    "shared_moments": (
        "AdamW's first and second moments are one tensor (v made as a shallow copy of m, v = m.copy() of a list, or "
        "one zeros tensor given to both): each step's two updates act on it, so v is no average of squared "
        "gradients, goes negative, and its square root is NaN",
        "give each parameter its own two zero tensors: m = [zeros_like(p) for p], v = [zeros_like(p) for p]",
    ),
    "second_moment_from_the_first": (
        "AdamW's second moment is updated from the first moment's previous value (v = beta2 * m + (1 - beta2) * g**2: "
        "the first moment's state, tree or buffer read where the second's belongs): v is no average of squared "
        "gradients, goes negative where m does, and its square root is NaN from the second step on",
        "v = beta2 * v + (1 - beta2) * g**2, from the second moment's own state",
    ),
    "first_moment_from_the_second": (
        "AdamW's first moment is updated from the second moment's previous value (m = beta1 * v + (1 - beta1) * g: "
        "the second moment's state, tree or buffer read where the first's belongs), so it never changes sign and "
        "loses its memory of the gradients' direction",
        "m = beta1 * m + (1 - beta1) * g, from the first moment's own state",
    ),
    "moments_not_stored": (
        "AdamW's moments are not written back to its state (a functional update that returns the old moments, or "
        "updates a copy), while its step count advances: every step's moments start from zero, so each update is the "
        "gradient's sign times a factor of the step count, with no memory of earlier gradients",
        "store the updated moments in the optimizer's state (m.mul_(beta1).add_(...) in place, or state['m'] = m)",
    ),
    "no_sqrt_in_step_size": (
        "AdamW's step size takes the second bias correction without its square root (lr * (1 - beta2**t) / (1 - "
        "beta1**t) instead of lr * sqrt(1 - beta2**t) / (1 - beta1**t)), so the early steps are far too small",
        "step_size = lr * sqrt(1 - beta2**t) / (1 - beta1**t); p -= step_size * m / (sqrt(v) + eps)",
    ),
}


class AdamWRule(torch.optim.Optimizer):
    """AdamW (PyTorch's formulation) with ``rule`` one of ``ADAMW_RULES``, or ``"adamw"`` for the correct one;
    ``eps_hat``: the other correct formulation, Kingma and Ba's (Keras', TensorFlow's), eps added to the square root
    of the uncorrected second moment and the bias corrections folded into the step size."""

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.01,
        *,
        rule="adamw",
        eps_hat=False,
        twice=(),
        together=(),
    ):
        if rule != "adamw" and rule not in ADAMW_RULES:
            raise ValueError(f"unknown AdamW rule {rule!r}; known: adamw, {', '.join(ADAMW_RULES)}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.rule, self.eps_hat = rule, eps_hat
        # ``stepped_twice``: these parameters (every one where none is given) are stepped twice per step
        self.twice = tuple(twice)
        self.shared_t = 0  # ``step_count_per_parameter``: the one counter, advanced per parameter
        # ... but not for these, which are parts of the parameter before them (a fused qkv's canonical weights)
        self.together = tuple(together)

    @torch.no_grad()
    def step(self, closure=None):
        step_t = self.shared_t + 1  # ``step_count_by_parameter_count``: the corrections' count, read before the loop
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            params = list(group["params"])
            twice = params if self.rule == "stepped_twice" and not self.twice else self.twice
            for p in params + [p for p in params if any(p is q for q in twice)]:
                if p.grad is None:
                    continue
                g = p.grad + wd * p if self.rule == "coupled_decay" else p.grad
                state = self.state[p]
                if not state:
                    m0 = torch.zeros_like(p)
                    state.update(t=0, m=m0, v=m0 if self.rule == "shared_moments" else torch.zeros_like(p))
                state["t"] += 0 if self.rule == "step_count_stuck" and state["t"] else 1
                t, m, v = state["t"], state["m"], state["v"]
                if self.rule in ("step_count_per_parameter", "step_count_by_parameter_count"):
                    self.shared_t += 0 if any(p is q for q in self.together) else 1
                    t = self.shared_t if self.rule == "step_count_per_parameter" else step_t
                if self.rule == "moments_not_stored":  # each step's moments start from zero again
                    m.zero_()
                    v.zero_()
                m_old = m.clone() if self.rule == "second_moment_from_the_first" else m
                if self.rule == "first_moment_from_the_second":  # from v's state, before v's own update
                    m.copy_(b1 * v + (1 - b1) * g)
                elif self.rule == "moment_weights_swapped":
                    m.mul_(1 - b1).add_(g, alpha=b1)
                elif self.rule == "undamped_first_moment":
                    m.mul_(b1).add_(g)
                else:
                    m.mul_(b1).add_(g, alpha=1 - b1)
                if self.rule == "second_moment_from_the_first":
                    v.copy_(b2 * m_old + (1 - b2) * g * g)
                else:
                    v.mul_(b2).addcmul_(g, g, value=1 - (b1 if self.rule == "v_weight_beta1" else b2))
                m_hat, v_hat = (m, v) if self.rule == "no_bias_correction" else (m / (1 - b1**t), v / (1 - b2**t))
                v_hat = v / (1 - b1**t) if self.rule == "v_hat_beta1" else v_hat
                if self.rule == "unscaled_decay":
                    p.mul_(1 - wd)
                elif self.rule == "decay_after_lr_scale":
                    p.mul_(1 + wd)
                elif self.rule not in ("coupled_decay", "trust_ratio"):
                    p.mul_(1 - lr * wd)
                if self.rule == "no_sqrt_in_step_size":  # the fused form: lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps)
                    p.sub_(lr * (1 - b2**t) / (1 - b1**t) * m / (v.sqrt() + eps))
                    continue
                if self.eps_hat:  # Kingma and Ba's efficient form (Keras, TensorFlow): eps on the uncorrected moment
                    p.sub_(lr * math.sqrt(1 - b2**t) / (1 - b1**t) * m / (v.sqrt() + eps))
                    continue
                denom = (v_hat + eps).sqrt() if self.rule == "eps_inside_sqrt" else v_hat.sqrt() + eps
                if self.rule == "trust_ratio":  # LAMB: the decay inside the step, the step scaled per tensor
                    step = m_hat / denom + wd * p
                    w_norm, s_norm = float(p.norm()), float(step.norm())
                    p.sub_(lr * (w_norm / s_norm if w_norm > 0 and s_norm > 0 else 1.0) * step)
                    continue
                p.sub_(lr * m_hat / denom)


# The protocol leaves AdamW's weight decay unspecified (0 to 0.1), and which parameters it decays: a slip in the
# update is tried at the common settings, all parameters at 0.01 (torch's default), the matrices alone at 0.1
# (nanoGPT's groups) and at 0.01 (biases and norm gains excluded, as Keras' exclude_from_weight_decay does), so a
# slip that shows only through the decay is found whichever the code uses.
DECAY_SETTINGS = (
    (0.01, False, ""),
    (0.1, True, " (weight decay 0.1 on the matrices only)"),
    (0.01, True, " (weight decay 0.01 on the matrices only)"),
)


def adamw_variants(losses_with, confirm=None, lr: float | None = None) -> list[Variant]:
    """``Variant``s for a check of AdamW's losses: ``losses_with(rule, weight_decay=, matrices_only=)`` computes them
    with ``AdamWRule`` at each of ``DECAY_SETTINGS``. ``confirm(rule, **kw)``: whether the rule explains a longer run
    too (``Variant.confirm``). With ``lr`` (the rate train was called with), the correct AdamW at 10 times and a tenth
    of it too (``losses_with(None, lr=...)``): on one repeated token an undamped first moment takes the steps of 10
    times the rate, a second moment weighted by 1 - beta1 those of a tenth, so where one fits the rate does as well
    and the line says both."""
    rules = [
        Variant(
            "knob:adamw_rule",
            summary + said,
            fix,
            lambda rule=rule, wd=wd, mats=mats: losses_with(rule, weight_decay=wd, matrices_only=mats),
            confirm=None
            if confirm is None
            else lambda rule=rule, wd=wd, mats=mats: confirm(rule, weight_decay=wd, matrices_only=mats),
        )
        for rule, (summary, fix) in ADAMW_RULES.items()
        for wd, mats, said in DECAY_SETTINGS
    ]
    rates = [
        Variant(
            "knob:learning_rate",
            f"the steps are those of learning rate {lr * factor:g}, not {lr:g}, the lr train was called with (or "
            "defaults to): a default or a module-level constant used instead of the argument, or a schedule's value",
            "use the lr argument, unchanged, at every step",
            lambda factor=factor: losses_with(None, lr=lr * factor),
            confirm=None if confirm is None else lambda factor=factor: confirm(None, lr=lr * factor),
        )
        for factor in ((10.0, 0.1) if lr is not None else ())
    ]
    return rules + rates


def in_bits(losses) -> Variant:
    """The losses ``losses()`` (a list of floats, or a dict whose ``"loss"`` is one) reported in bits: divided by
    ln 2 (a log base 2, or a metric reducer's base 2), a perplexity left as it is."""

    def bits():
        value = losses()
        if isinstance(value, dict):
            return {**value, "loss": value["loss"] / math.log(2)}
        return [v / math.log(2) for v in value]

    return Variant(
        "knob:loss_units",
        "the loss is reported in bits (the NLL divided by ln 2: a log base 2) instead of nats",
        "report the mean NLL in nats (natural log); perplexity = exp(loss)",
        bits,
    )


def running_means(losses) -> Variant:
    """The per-step losses ``losses()`` (a list of floats) returned as running means, the i-th the mean of the first
    i + 1: a metric tracker that is never reset between steps (Keras' ``reset_metrics=False``, an epoch average)."""

    def means():
        value = [float(v) for v in losses()]
        return [sum(value[: i + 1]) / (i + 1) for i in range(len(value))]

    return Variant(
        "knob:loss_reduction",
        "the losses returned are running means (the i-th is the mean of the first i + 1 step losses): a loss tracker "
        "never reset between steps",
        "return each step's own loss (reset the tracker, or record loss.item() of that step)",
        means,
    )


def summed_over(losses, tokens: int) -> Variant:
    """The per-step losses ``losses()`` of a loss summed over each batch's ``tokens`` target tokens instead of
    averaged (its gradients ``tokens`` times larger too): ``reduction="sum"``, or a mean left out."""
    return Variant(
        "knob:loss_reduction",
        f"the loss is summed over the batch's {tokens} target tokens instead of averaged: {tokens} times the mean, "
        "its gradients too",
        "average the NLL over the target tokens: cross_entropy's default reduction='mean'",
        losses,
    )


# ----------------------------------------------------------------------------------------- windows


def target_shift(x: torch.Tensor, y: torch.Tensor) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """What ``y`` is relative to ``x`` for batches of the data ``arange`` (each token its own position plus a
    constant): ``(description, cause lines, cause codes)``. A cause is named only where the targets are the
    inputs shifted by one constant other than one (or not shifted): the mistake is then in the shift alone."""
    if x.shape != y.shape or x.numel() == 0:
        return f"x {tuple(x.shape)}, y {tuple(y.shape)}", (), ()
    shifts = torch.unique(y.long() - x.long())
    if shifts.numel() != 1:
        return f"y - x takes the values {shifts.tolist()[:6]}: the targets are not one shifted copy of x", (), ()
    k = int(shifts)
    if k == 1:
        return "y is x shifted one token ahead", (), ()
    said = "the targets are the inputs themselves (not shifted)" if k == 0 else f"the targets are x shifted by {k}"
    fix = (
        "y = data[start + 1 : start + 1 + context_length], one token ahead of x = data[start : start + context_length]"
    )
    return said, (f"likely cause: {said}. Fix: {fix}",), ("knob:label_shift",)


def start_range(seen: set[int], want: set[int], context_length: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Which window starts a sampler drew (``seen``) against the allowed ones (``want``, ``0..last``):
    ``(description, cause lines, cause codes)``. Named: only the last start missing (an exclusive upper bound
    taken one lower), exactly one start past the last (an inclusive bound one too high), starts on a grid of
    ``context_length`` (the data cut into non-overlapping chunks); anything else is described."""
    missing, extra = sorted(want - seen), sorted(seen - want)
    said = f"never drawn {missing}, out of range {extra}"
    last = max(want) if want else -1
    if missing == [last] and not extra:
        return (
            said,
            (
                "likely cause: the last start, len(data) - context_length - 1, is never drawn (randint's upper bound "
                "is exclusive, and it was taken one lower). Fix: torch.randint(0, len(data) - context_length, ...)",
            ),
            ("boundary",),
        )
    if extra == [last + 1] and not missing:
        return (
            said,
            (
                "likely cause: a start one past the last is drawn, so the last window has no target for its last "
                "token (the upper bound is one too high). Fix: torch.randint(0, len(data) - context_length, ...)",
            ),
            ("boundary",),
        )
    if not extra and len(seen) > 1 and context_length > 1 and all(s % context_length == 0 for s in seen):
        return (
            said,
            (
                f"likely cause: only multiples of context_length ({context_length}) are drawn: the data is cut into "
                "non-overlapping chunks, where every start is a window. Fix: draw each start uniformly from "
                "0..len(data) - context_length - 1",
            ),
            ("knob:data_windows",),
        )
    return said, (), ()


# ----------------------------------------------------------------------------------------- counts


def count_variants(sizes: dict[str, int], want: int) -> list[Variant]:
    """Parameter counts off by exactly one group of weights (``sizes``: canonical name -> elements): the
    difference names the group. Groups of one size (the token embedding and an untied head, both ``V x d``) are
    one line naming each: a count cannot tell them apart."""
    fix = "count every parameter of model.parameters(), which yields a shared parameter once"

    def group(test) -> int:
        return sum(n for name, n in sizes.items() if test(name))

    groups = [
        ("the token embedding left out", group(lambda k: k == "tok_embeddings.weight")),
        (
            "the untied output head left out (the trunk's parameters counted alone)",
            group(lambda k: k == "lm_head.weight"),
        ),
        ("the position embeddings left out (a non-embedding count)", group(lambda k: k == "pos_embeddings.weight")),
        ("the norm weights (and norm biases) left out", group(lambda k: "norm." in k)),
        ("the biases left out (only weights counted)", group(lambda k: k.endswith(".bias"))),
        ("the vectors left out (only matrices counted: no norm gains, no biases)", None),
    ]
    by_size: dict[int, list[str]] = {}
    for label, n in groups:
        if n is None:  # the vectors: every name that is not a matrix
            n = group(lambda k: k.endswith(".bias") or "norm." in k)
            if n in (group(lambda k: "norm." in k), group(lambda k: k.endswith(".bias"))):
                continue  # the same count as one of the groups above: that group's line says it
        if n:
            by_size.setdefault(n, []).append(label)
    variants = [
        Variant("knob:parameter_groups", " or ".join(labels), fix, lambda n=n: want - n)
        for n, labels in by_size.items()
    ]
    variants += _block_count_variants(sizes, want, fix)
    if "lm_head.weight" not in sizes and "tok_embeddings.weight" in sizes:  # tied: the matrix must count once
        twice = "the tied embedding/head matrix is counted twice (state_dict() lists it under both names)"
        variants.append(Variant("knob:parameter_groups", twice, fix, lambda n=sizes["tok_embeddings.weight"]: want + n))
    return variants


_BLOCK_PARTS = (
    ("attention", lambda rest: rest.startswith("attn.")),
    ("MLP", lambda rest: rest.startswith("mlp.")),
    ("norms", lambda rest: "norm." in rest),
    ("", lambda rest: True),  # the whole block
)


def _block_count_variants(sizes: dict[str, int], want: int, fix: str) -> list[Variant]:
    """Counts off by one block's part (its attention, its MLP, its norms, the whole block), left out or counted
    twice: a block built without its attention (a layer the code skips), one block too few or too many. Every block
    of a config has the same sizes, so the count says which part, not which block."""
    layers = sorted({int(k.split(".")[1]) for k in sizes if k.startswith("layers.") and k.split(".")[1].isdigit()})
    if len(layers) < 2:
        return []
    first = {k.split(".", 2)[2]: n for k, n in sizes.items() if k.startswith(f"layers.{layers[0]}.")}
    variants = []
    for part, test in _BLOCK_PARTS:
        n = sum(size for rest, size in first.items() if test(rest))
        if not n:
            continue
        names = ", ".join(sorted({rest.rsplit(".", 1)[0] for rest in first if test(rest)}))
        what = f"one block's {part} ({names}: {n:,})" if part else f"one block ({n:,})"
        variants.append(
            Variant("knob:parameter_groups", f"the count is {what} short: a block built without it (a layer the code "
                    "skips or leaves out), or its parameters not counted", fix, lambda n=n: want - n)
        )  # fmt: skip
        variants.append(
            Variant("knob:parameter_groups", f"the count is {what} over: a block or part built or counted twice", fix,
                    lambda n=n: want + n)
        )  # fmt: skip
    return variants


# ------------------------------------------------------------------------------- a scalar's divisor


def argument_ratio_causes(kwargs: dict, expected, actual, atol: float, rtol: float) -> list:
    """A scalar result (a loss, a count, a metric) off by exactly a factor that is one of the call's integer
    arguments (``top_k=2``): the definition's divisor or factor is that argument, applied where it should not be
    or missing where it should. Nothing where no argument matches, or more than one does (no single reading)."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return []
    if expected.numel() != 1 or actual.numel() != 1:
        return []
    e, a = float(expected.double().reshape(())), float(actual.double().reshape(()))
    if not (e and a) or abs(a - e) <= atol + rtol * abs(e):
        return []
    found = []
    for key, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            continue
        for ratio, op, fix in (
            (1 / value, "divided by", f"remove the division by {key} (or multiply where it is missing)"),
            (value, "times", f"remove the factor {key} (or divide by it where it is missing)"),
        ):
            if abs(a - ratio * e) <= atol + rtol * abs(ratio * e):
                found.append((f"{op} {key}", value, fix))
    if len(found) != 1:
        return []
    ((how, value, fix),) = found
    return [
        Cause(
            "scale",
            f"the result is the expected one {how}={value}",
            "what the definition divides or multiplies by (a normalisation, an average's count)",
            fix,
            f"actual {a:.6g} == expected {e:.6g} {how} exactly",
            EXACT_SHARED,
        )
    ]
