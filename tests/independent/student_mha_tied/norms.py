"""RMSNorm and LayerNorm."""

from __future__ import annotations

import torch


def _compute_dtype(x):
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return x.dtype


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    dt = _compute_dtype(x)
    xf = x.to(dt)
    ms = (xf * xf).mean(dim=-1, keepdim=True)
    out = xf / torch.sqrt(ms + eps)
    out = out * weight.to(dt)
    return out.to(x.dtype)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    dt = _compute_dtype(x)
    xf = x.to(dt)
    mean = xf.mean(dim=-1, keepdim=True)
    var = ((xf - mean) ** 2).mean(dim=-1, keepdim=True)
    out = (xf - mean) / torch.sqrt(var + eps)
    out = out * weight.to(dt) + bias.to(dt)
    return out.to(x.dtype)
