"""Position-wise feed-forward blocks: SwiGLU (llama) and the GELU MLP (gpt2)."""

from __future__ import annotations

import math

import torch

from .primitives import linear, silu


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (GPT-2): ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def swiglu(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, fused: bool = False
) -> torch.Tensor:
    """``(silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T``; the gate goes through SiLU, up does not.

    x: ``[..., d_model]``; w_gate, w_up: ``[d_ff, d_model]``; w_down: ``[d_model, d_ff]``.
    Returns ``[..., d_model]``. ``fused`` (the model's fast path): ``silu(..., fused=True)``.
    """
    return linear(silu(linear(x, w_gate), fused=fused) * linear(x, w_up), w_down)


def geglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Protocol v2 (``geglu``, amendment 26; Gemma): ``(gelu_tanh(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T``.

    SwiGLU with the tanh-approximate GELU (Hugging Face's ``gelu_pytorch_tanh``) in place of SiLU, on the gate
    only. Shapes as ``swiglu``. Not a protocol name: the model's MLP under ``geglu``.
    """
    return linear(gelu_tanh(linear(x, w_gate)) * linear(x, w_up), w_down)


def gelu_mlp(
    x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor, w_proj: torch.Tensor, b_proj: torch.Tensor
) -> torch.Tensor:
    """GPT-2 MLP: ``gelu_tanh(x @ w_fc.T + b_fc) @ w_proj.T + b_proj``.

    x: ``[..., d_model]``; w_fc: ``[d_ff, d_model]``, b_fc: ``[d_ff]``; w_proj: ``[d_model, d_ff]``,
    b_proj: ``[d_model]``. Returns ``[..., d_model]``.
    """
    return linear(gelu_tanh(linear(x, w_fc, b_fc)), w_proj, b_proj)
