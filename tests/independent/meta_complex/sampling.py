"""Sampling: temperature -> top-k -> top-p (sort based), then renormalise."""

import torch

from .functional import softmax


def _check(temperature, top_k, top_p):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    out_dtype = logits.dtype
    cdt = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    logits = logits.to(cdt)
    vocab = logits.shape[-1]
    if temperature == 0:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter(-1, idx, 1.0).to(out_dtype)
    scaled = logits / temperature
    if top_k is not None and top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = softmax(scaled, dim=-1)
    if top_p is not None and top_p < 1.0:
        probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(probs_sort, dim=-1) - probs_sort
        drop = mass_before >= top_p
        drop[..., 0] = False
        probs_sort = probs_sort.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, probs_idx, probs_sort)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs.to(out_dtype)


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    lead, vocab = probs.shape[:-1], probs.shape[-1]
    flat = probs.reshape(-1, vocab)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    dev = generator.device if generator is not None else flat.device
    probs_sort, probs_idx = torch.sort(flat.to(dev), dim=-1, descending=True)
    pick = torch.multinomial(probs_sort, num_samples=1, generator=generator)
    token = torch.gather(probs_idx, -1, pick)
    return token.reshape(lead).to(logits.device)
