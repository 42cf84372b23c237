"""SwiGLU and the GPT-2 GELU MLP."""

from __future__ import annotations

import math

import torch

from .primitives import linear, silu


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    gate = silu(linear(x, w_gate))
    up = linear(x, w_up)
    return linear(gate * up, w_down)


def _gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u * u * u)))


def gelu_mlp(
    x: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor, w_proj: torch.Tensor, b_proj: torch.Tensor
) -> torch.Tensor:
    h = x @ w_fc.transpose(0, 1) + b_fc
    h = _gelu_tanh(h)
    return h @ w_proj.transpose(0, 1) + b_proj
