"""sampling_probs and sample."""

from __future__ import annotations

import torch

from .primitives import softmax


def _check(temperature, top_k, top_p):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sampling_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    _check(temperature, top_k, top_p)
    if temperature == 0:
        idx = logits.argmax(dim=-1, keepdim=True)
        out = torch.zeros_like(logits)
        out.scatter_(-1, idx, 1.0)
        return out
    scaled = logits / temperature
    V = scaled.shape[-1]
    if top_k is not None and top_k < V:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p is not None:
        probs = softmax(scaled, dim=-1)
        sorted_probs, sorted_idx = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sorted_probs, dim=-1)
        mass_above = cum - sorted_probs
        tol = 16 * torch.finfo(probs.dtype).eps
        drop_sorted = mass_above >= top_p - tol
        drop_sorted[..., 0] = False  # always keep the top token
        drop = torch.zeros_like(drop_sorted)
        drop.scatter_(-1, sorted_idx, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return softmax(scaled, dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return ids.reshape(probs.shape[:-1])
