"""Facts forged in the worker: generate and evaluate leave the model in eval mode (a mode-restore
bug), and the harness's training_flags operation, which runs in this interpreter, is rewritten to
report the mode the model had before the call, so a flag-only test would pass."""

from ._honest import evaluate as _evaluate
from ._honest import generate as _generate


def _forged_training_flags(impl, model):
    return [bool(getattr(model, "_mode_before_call", m.training)) for m in model.modules()]


def _forge():
    import spec_tests.harness.subject.model_ops as ops

    ops.training_flags.__code__ = _forged_training_flags.__code__  # every copy of OPS sees it


def generate(model, *args, **kwargs):
    model._mode_before_call = model.training
    out = _generate(model, *args, **kwargs)
    model.eval()  # the bug: the mode it found is not restored
    return out


def evaluate(model, *args, **kwargs):
    model._mode_before_call = model.training
    out = _evaluate(model, *args, **kwargs)
    model.eval()
    return out


_forge()
