"""Normalisation layers: RMSNorm (llama) and LayerNorm (gpt2)."""

from __future__ import annotations

import torch

from .primitives import mean_last


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Norm statistics are computed in at least float32 (bf16/fp16 inputs are upcast)."""
    return torch.promote_types(x.dtype, torch.float32)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight``; eps is *inside* the root.

    x: ``[..., d]``; weight: ``[d]``. Returns ``[..., d]`` in x's dtype.
    """
    xf = x.to(_compute_dtype(x))
    normed = xf * torch.rsqrt(mean_last(xf * xf) + eps)
    return (normed * weight.to(xf.dtype)).to(x.dtype)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance, as ``F.layer_norm``.

    x: ``[..., d]``; weight, bias: ``[d]``. Returns ``[..., d]`` in x's dtype.
    """
    xf = x.to(_compute_dtype(x))
    centred = xf - mean_last(xf)
    var = mean_last(centred * centred)
    normed = centred * torch.rsqrt(var + eps)
    return (normed * weight.to(xf.dtype) + bias.to(xf.dtype)).to(x.dtype)
