"""Autoregressive generation with optional KV cache."""

from __future__ import annotations

import torch

from .kv_cache import new_cache
from .modes import eval_mode
from .padding import check_attention_mask
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
    *,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Extend ``prompt [B, T]`` by ``max_new_tokens`` tokens -> ``[B, T + max_new_tokens]``.

    Runs without dropout whatever the module's mode and restores the mode. Each step conditions
    on the last ``context_length`` tokens. With the cache, one token is fed per step while the
    sequence fits; once it slides past the context every position shifts, so the window is
    re-encoded from scratch, exactly as without the cache.

    ``attention_mask`` (protocol v2, amendment 23): ``[B, T]`` of 0/1, left padding: the prompt is returned as
    given (padding kept), each row's new tokens are those it would get alone, and the mask grows by a 1 per step.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"generate: prompt must be [B, T] with T >= 1, got shape {tuple(prompt.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    ctx = model.config.context_length
    ids, cache, mask = prompt, None, None
    if attention_mask is not None:
        mask = check_attention_mask(attention_mask.to(prompt.device), *prompt.shape, where="generate").long()
    with eval_mode(model):
        for _ in range(max_new_tokens):
            if cache is not None and ids.shape[1] <= ctx:
                logits = model(ids[:, -1:], cache, **padded(mask))
            else:
                cache = new_cache(model, ids.shape[0]) if use_cache else None
                logits = model(ids[:, -ctx:], cache, **padded(mask, ctx))
            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)
            ids = torch.cat((ids, next_id[:, None].to(ids.dtype)), dim=1)
            if mask is not None:
                mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)  # new tokens are real
    return ids


def padded(mask: torch.Tensor | None, window: int | None = None) -> dict:
    """The model's keywords for ``mask [B, T]`` (its last ``window`` columns); none without padding."""
    if mask is None:
        return {}
    return {"attention_mask": mask if window is None else mask[:, -window:]}
