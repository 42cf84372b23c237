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
    spec.require(
        seen == training,
        behaviour=f"a model in {mode} mode is in {mode} mode after {after}, as its outputs show (with dropout "
        f"{DROPOUT}, a forward pass in training mode differs from the eval-mode output, in eval mode it equals it)",
        found=f"after {after}, a forward pass {'differs from' if seen else 'equals'} the eval-mode output: the "
        f"model runs in {'training' if seen else 'eval'} mode",
        causes=causes,
        codes=codes,
    )
