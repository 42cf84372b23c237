"""Autoregressive generation with optional KV cache."""

from __future__ import annotations

import torch

from .kv_cache import new_cache
from .modes import eval_mode
from .sampling import sample


@torch.no_grad()
def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """Extend ``prompt [B, T]`` by ``max_new_tokens`` tokens -> ``[B, T + max_new_tokens]``.

    Runs without dropout whatever the module's mode and restores the mode. Each step conditions
    on the last ``context_length`` tokens. With the cache, one token is fed per step while the
    sequence fits; once it slides past the context every position shifts, so the window is
    re-encoded from scratch, exactly as without the cache.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"generate: prompt must be [B, T] with T >= 1, got shape {tuple(prompt.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    ctx = model.config.context_length
    ids, cache = prompt, None
    with eval_mode(model):
        for _ in range(max_new_tokens):
            if cache is not None and ids.shape[1] <= ctx:
                logits = model(ids[:, -1:], cache)
            else:
                cache = new_cache(model, ids.shape[0]) if use_cache else None
                logits = model(ids[:, -ctx:], cache)
            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)
            ids = torch.cat((ids, next_id[:, None].to(ids.dtype)), dim=1)
    return ids
