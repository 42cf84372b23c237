"""Switching a module to eval mode for a while and putting every submodule's mode back."""

from __future__ import annotations

import contextlib

import torch.nn as nn


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Run the block with dropout off; afterwards each submodule has the mode it had before."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, was_training in modes:
            m.training = was_training
