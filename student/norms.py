"""Normalisation layers: RMSNorm (llama family) and LayerNorm (gpt2 family).

Both normalise over the last axis (the feature axis ``d_model``) of each token independently.
Statistics are computed in at least float32 (upcast bf16/fp16 inputs), and the result is
returned in the input's dtype.
"""

from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Root-mean-square normalisation: ``x / sqrt(mean(x**2, dim=-1) + eps) * weight``.

    Shapes::

        x:      [..., d]
        weight: [d]                learned per-feature scale (initialised to ones)
        return: [..., d]           same dtype as x

    No mean is subtracted and there is no bias (that is what makes it RMSNorm, not LayerNorm).

    Classic bugs to avoid:
    - eps inside the square root: ``sqrt(mean(x**2) + eps)``, not ``sqrt(mean(x**2)) + eps``;
    - mean over the last axis only (keepdim=True so it broadcasts), not over the whole tensor;
    - compute in at least float32: upcast half-precision inputs, cast the result back.
    """
    raise NotImplementedError("rmsnorm")


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Layer normalisation, as ``F.layer_norm``: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Shapes::

        x:            [..., d]
        weight, bias: [d]
        return:       [..., d]     same dtype as x

    mean and var are over the last axis.

    Classic bugs to avoid:
    - use the *biased* variance (divide by d, ``unbiased=False``); ``torch.var``'s default is
      the unbiased one and does not match ``F.layer_norm``;
    - eps inside the square root;
    - compute in at least float32.
    """
    raise NotImplementedError("layernorm")
