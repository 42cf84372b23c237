"""Temperature, top-k, top-p (in that order) and drawing from the result."""

from __future__ import annotations

import torch

from .ops import softmax


def _validate(temperature, top_k, top_p):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    _validate(temperature, top_k, top_p)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    scaled = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).indices
        keep = torch.zeros_like(scaled, dtype=torch.bool).scatter(-1, kth, True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    probs = softmax(scaled, dim=-1)
    if top_p is not None and top_p < 1:
        ordered, order = probs.sort(dim=-1, descending=True)
        running = ordered.cumsum(dim=-1)
        # tokens before the one whose running mass reaches top_p, plus that crossing token
        n_keep = (running < top_p).sum(dim=-1, keepdim=True) + 1
        rank = torch.arange(probs.shape[-1], device=probs.device)
        keep_sorted = rank < n_keep
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    _validate(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator)
    return drawn.reshape(probs.shape[:-1])
