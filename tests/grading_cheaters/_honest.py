"""An honest but wrong submission: the reference's code with three bugs."""

import torch

from ._ref import *  # noqa: F403 - everything else is right
from ._ref import FAMILIES, ROPE_STYLE  # noqa: F401
from ._ref import __all__ as _names
from ._ref.positions import rope as _good_rope

__all__ = list(_names)


def rmsnorm(x, weight, eps=1e-5):
    """Bug: eps outside the square root."""
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))
    return (x32 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight).to(x.dtype)


def rope(x, positions, theta=10000.0):
    """Bug: every position shifted by one."""
    return _good_rope(x, positions + 1, theta)


def count_parameters(model):
    """Bug: a tied matrix counted twice."""
    return sum(v.numel() for v in model.state_dict().values())
