"""A model's mode observed from its outputs, not reported by code next to the submission (issue 19).

``training_flags`` is computed by harness code in the grading worker, inside the submission's own
interpreter, which the submission can rewrite; what the judge receives is data, but the data can be
false. Where the protocol's behaviour shows the mode, the judge looks at the behaviour: with
dropout > 0 (capability ``dropout``), a model in training mode gives a forward pass that differs
from its eval-mode output, and a model in eval mode gives exactly that output.
"""

from __future__ import annotations

import torch

DROPOUT = 0.5  # certainly visible in every output of the suite's small models


def observable(spec) -> bool:
    """Whether the mode shows in outputs: the implementation applies dropout (capability ``dropout``)."""
    return "dropout" in spec.impl.capabilities


def eval_output(spec, model, ids) -> torch.Tensor | None:
    """The eval-mode forward pass of ``model`` on ``ids``, or None where training mode does not show in this
    model's outputs (it declares dropout but a training-mode pass equals the eval one): then the mode cannot be
    observed, and the flags alone judge it. The model is left in eval mode."""
    clean = defer_dropout_in_eval_mode(spec, model, ids, "the mode shows in outputs (dropout on in training mode only)")
    spec.impl.set_training(model, True)
    visible = shows_training(spec, model, ids, clean)
    spec.impl.set_training(model, False)
    return clean if visible else None


def defer_dropout_in_eval_mode(spec, model, ids, behaviour: str) -> torch.Tensor:
    """The eval-mode output of ``model`` on ``ids`` (the model left in eval mode); where a second eval-mode pass under
    another seed differs (dropout whatever the mode), the test is left to forward, whose eval-mode test reports it."""
    spec.impl.set_training(model, False)
    clean = spec.impl.forward(model, ids).detach()
    if eval_mode_varies(spec, model, ids, clean):
        raise spec.defer(
            ["forward"],
            behaviour,
            "consequence of failing forward: your model in eval mode still applies dropout (two eval-mode forward "
            "passes differ), so it cannot be switched off here; test_model.py's eval-mode test reports it",
        )
    return clean


def eval_mode_varies(spec, model, ids, clean: torch.Tensor) -> bool:
    """Whether ``model``, in eval mode, computes another output than ``clean`` under another global seed: dropout
    applied whatever the mode (``F.dropout`` without ``training=``), which is forward's mistake. The model stays in
    eval mode."""
    spec.impl.set_training(model, False)
    spec.impl.manual_seed(11)
    out = spec.impl.forward(model, ids).detach()
    return not (out.shape == clean.shape and torch.equal(out, clean))


def shows_training(spec, model, ids, clean: torch.Tensor) -> bool:
    """Whether ``model`` now runs as in training mode: its forward pass differs from ``clean``."""
    spec.impl.manual_seed(7)
    out = spec.impl.forward(model, ids).detach()
    return not (out.shape == clean.shape and torch.equal(out, clean))


def require_mode(spec, model, ids, clean: torch.Tensor, training: bool, *, after: str, causes=(), codes=()) -> None:
    """Fail unless ``model``'s outputs show it in training mode (``training``) or in eval mode."""
    seen = shows_training(spec, model, ids, clean)
    mode = "train" if training else "eval"
    if seen != training:
        partly = partly_restored(spec.impl.training_flags(model), training, after)
        causes, codes = (partly, codes) if partly else (causes, codes)
    spec.require(
        seen == training,
        behaviour=f"a model in {mode} mode is in {mode} mode after {after}, as its outputs show (with dropout "
        f"{DROPOUT}, a forward pass in training mode differs from the eval-mode output, in eval mode it equals it)",
        found=f"after {after}, a forward pass {'differs from' if seen else 'equals'} the eval-mode output: the "
        f"model runs in {'training' if seen else 'eval'} mode",
        causes=causes,
        codes=codes,
    )


SOME_MODULES = (
    "the mode was put back on some modules only (the top one, or its direct children, not every module). Fix: record "
    "each module's flag ([m.training for m in model.modules()]) and put each back in a finally block"
)


def partly_restored(flags: list[bool], training: bool, after: str) -> tuple[str, ...]:
    """The cause where some modules (``flags``, ``model.modules()`` order) are back in the mode the whole model was
    given and others are not: the mode was put back on some modules only. ``()`` otherwise."""
    back = sum(flag == training for flag in flags)
    if not back or back == len(flags):
        return ()
    mode, other = ("training", "eval") if training else ("eval", "training")
    top = "the top module among them" if flags[0] == training else "the top module not among them"
    return (
        f"likely cause: after {after} {back} of the model's {len(flags)} modules {'is' if back == 1 else 'are'} back "
        f"in {mode} mode ({top}) and "
        f"the others stay in {other} mode: {SOME_MODULES}",
    )


def set_mode(spec, model, mode: str) -> list[bool]:
    """Put ``model`` in ``mode`` ("train", "eval", or "mixed": every other module in training mode, the top one
    included, as a model with some frozen parts is) and give back each module's flag (``training_flags`` order)."""
    if mode in ("train", "eval"):
        spec.impl.set_training(model, mode == "train")
        return spec.impl.training_flags(model)
    flags = [i % 2 == 0 for i in range(len(spec.impl.training_flags(model)))]
    spec.impl.set_training(model, flags)
    return flags


def require_flags(spec, model, given: list[bool], *, after: str, again=None, causes=(), codes=()) -> None:
    """Fail unless every module's training flag is the one ``model`` was given before ``after`` ran.

    A cause is said only where the evidence pins it. For one mode given: ``causes`` and ``codes``, where the whole
    model was left in the other mode. For a mixed one: a single ``model.train(mode)`` with the top module's flag,
    where every module is left in the top module's mode, and ``again()`` (the same call on the model given the
    opposite flags) leaves every module in that other top mode too; one mode set whatever was found is not that.
    """
    flags = spec.impl.training_flags(model)
    mixed = len(set(given)) > 1
    if not mixed:
        mode = "train" if given[0] else "eval"
        partly = partly_restored(flags, given[0], after)
        spec.require(
            set(flags) == set(given),
            behaviour=f"a model in {mode} mode is in {mode} mode after {after}",
            found=f"after {after}, module training flags are {sorted(set(flags))}",
            causes=causes if set(flags) == {not given[0]} else partly,
            codes=codes if set(flags) == {not given[0]} or partly else (),
        )
        return
    differ = sum(a != b for a, b in zip(flags, given, strict=False)) + abs(len(flags) - len(given))
    top_restored = len(flags) == len(given) and set(flags) == {given[0]} and again is not None
    if top_restored:
        flipped = [not flag for flag in given]
        spec.impl.set_training(model, flipped)
        again()
        top_restored = set(spec.impl.training_flags(model)) == {flipped[0]}
    # some modules given training mode have it back and others stay in eval, none left in training mode wrongly: the
    # eval mode set for the call was undone on some modules only
    pairs = list(zip(given, flags, strict=False)) if len(flags) == len(given) else []
    partly = (
        (
            f"likely cause: after {after} {sum(g and f for g, f in pairs)} of the modules given training mode have it "
            f"back and {sum(g and not f for g, f in pairs)} stay in eval mode: {SOME_MODULES}",
        )
        if any(g and f for g, f in pairs)
        and any(g and not f for g, f in pairs)
        and not any(f and not g for g, f in pairs)
        else ()
    )
    spec.require(
        flags == given,
        behaviour=f"a model whose modules are in both modes has each module's own mode back after {after}",
        found=f"after {after}, {differ} of {len(given)} modules' training flags differ from those it was given "
        f"(modules in training mode: {given.count(True)} before, {flags.count(True)} after)",
        causes=(
            f"likely cause: {after} restores the mode with one call on the whole model (model.train(mode) with the "
            f"top module's flag), which sets every submodule alike: each module's own mode is lost. Fix: record "
            f"each module's flag ([m.training for m in model.modules()]) and put each back in a finally block",
        )
        if top_restored
        else partly,
        codes=("knob:mode",) if top_restored or partly else (),
    )
