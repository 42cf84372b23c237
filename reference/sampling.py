"""Turning next-token logits into a distribution and drawing from it.

Order (protocol v1): divide by temperature -> keep the top-k logits -> keep the top-p nucleus of
the temperature-scaled distribution -> renormalise -> sample.
"""

from __future__ import annotations

import torch
from einops import rearrange

from .primitives import softmax


def _check_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the k-th largest of its row to -inf (ties with the k-th are kept)."""
    k = min(k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose probability mass reaches ``p``.

    A token is dropped when the mass of the tokens ranked above it already reaches ``p``, so the
    token that crosses ``p`` is kept and so is the top token. "Reaches" allows 16 ulps of the
    dtype for rounding: the mass of ``[0.5, 0.3, 0.1, 0.1]``'s top two reaches 0.8.
    """
    probs = softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= p - 16 * torch.finfo(probs.dtype).eps
    drop_sorted[..., 0] = False  # the top token always stays, however small p (even below the allowance)
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sampling_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The distribution actually sampled from: logits ``[..., V]`` -> probabilities ``[..., V]``.

    ``temperature == 0`` gives a one-hot at the argmax. Invalid arguments raise ``ValueError``.
    """
    _check_args(temperature, top_k, top_p)
    if temperature == 0:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    scaled = logits / temperature
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    return softmax(scaled, dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token ids ``[...]`` drawn from ``sampling_probs(logits [..., V], ...)``; reproducible per generator."""
    probs = sampling_probs(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(dim=-1)
    flat = rearrange(probs, "... v -> (...) v")
    ids = torch.multinomial(
        flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat, 1, generator=generator
    )
    return ids.reshape(probs.shape[:-1])
