"""linear, embedding, softmax, silu."""

from __future__ import annotations

import torch


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # this implementation has no biases (see CAPABILITIES in __init__.py)
    if bias is not None:
        raise NotImplementedError("linear: bias is not supported by this implementation")
    return x @ weight.transpose(0, 1)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight[ids]


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    m = x.max(dim=dim, keepdim=True).values
    # a row that is all -inf: avoid -inf - -inf
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)
