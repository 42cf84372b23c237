"""Autoregressive generation."""

from __future__ import annotations

import torch
import torch.nn as nn

from .kv_cache import new_cache
from .model import forward
from .sampling import sample


def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [B, T] with T >= 1, got shape {tuple(prompt.shape)}")
    ctx = model.config["context_length"]
    # remember every submodule's mode
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            ids = prompt.clone()
            cache = None
            for _ in range(max_new_tokens):
                if use_cache:
                    if cache is None or cache.length + 1 > ctx:
                        # (re-)encode the last context_length tokens
                        cache = new_cache(model, ids.shape[0])
                        logits = forward(model, ids[:, -ctx:], cache)
                    else:
                        logits = forward(model, ids[:, -1:], cache)
                else:
                    logits = forward(model, ids[:, -ctx:])
                next_id = sample(logits[:, -1, :], temperature, top_k, top_p, generator)
                ids = torch.cat([ids, next_id.unsqueeze(1).to(ids.dtype)], dim=1)
    finally:
        for m, mode in modes:
            m.training = mode
    return ids
