"""The KV cache."""

from __future__ import annotations

import torch
import torch.nn as nn


class KVCache:
    def __init__(self, n_layers, batch_size, n_kv_heads, d_head, device, dtype):
        self.batch_size = batch_size
        self.length = 0
        self.k = [torch.zeros(batch_size, n_kv_heads, 0, d_head, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(batch_size, n_kv_heads, 0, d_head, device=device, dtype=dtype) for _ in range(n_layers)]


def new_cache(model: nn.Module, batch_size: int):
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cfg = model.config
    p = next(model.parameters())
    d_head = cfg["d_model"] // cfg["n_heads"]
    return KVCache(cfg["n_layers"], batch_size, cfg["n_kv_heads"], d_head, p.device, p.dtype)


def cache_kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    if layer < 0 or layer >= len(cache.k):
        raise ValueError(f"layer {layer} out of range (cache has {len(cache.k)} layers)")
    return cache.k[layer], cache.v[layer]


def kv_cache_bytes(config: dict, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    n_heads = config["n_heads"]
    n_kv = config.get("n_kv_heads") or n_heads
    d_head = config["d_model"] // n_heads
    elem = torch.empty(0, dtype=dtype).element_size()
    return 2 * config["n_layers"] * n_kv * d_head * seq_len * batch_size * elem
