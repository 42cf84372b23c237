"""The KV cache: per layer, keys after RoPE and values as projected, ``[B, Hkv, T_cached, d_head]``."""

from __future__ import annotations

import torch

from .config import ModelConfig, parse_config


class KVCache:
    """Keys and values of every layer for the tokens seen so far, appended along the time axis (-2).

    Positions of new tokens continue from ``length``. Opaque to callers; read it with ``cache_kv``.
    """

    def __init__(self, config: ModelConfig, batch_size: int, device: torch.device, dtype: torch.dtype):
        if batch_size < 1:
            raise ValueError(f"new_cache: batch_size must be >= 1, got {batch_size}")
        self.config, self.batch_size = config, batch_size
        empty = torch.zeros(batch_size, config.kv_heads, 0, config.d_head, device=device, dtype=dtype)
        self.keys = [empty] * config.n_layers
        self.values = [empty] * config.n_layers

    @property
    def length(self) -> int:
        """Number of cached positions (the same in every layer between forward calls)."""
        return self.keys[0].shape[-2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v [B, Hkv, T_new, d_head]`` to ``layer``; return all its keys and values."""
        self.keys[layer] = torch.cat((self.keys[layer].to(k.dtype), k), dim=-2)
        self.values[layer] = torch.cat((self.values[layer].to(v.dtype), v), dim=-2)
        return self.keys[layer], self.values[layer]


def new_cache(model, batch_size: int) -> KVCache:
    """An empty cache for ``model`` and ``batch_size`` sequences."""
    p = next(model.parameters())
    return KVCache(model.config, batch_size, p.device, p.dtype)


def cache_kv(cache: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(k, v)`` of ``layer``, each ``[B, n_kv_heads, T_cached, d_head]``."""
    if not 0 <= layer < len(cache.keys):
        raise ValueError(f"cache_kv: layer {layer} out of range for {len(cache.keys)} layers")
    return cache.keys[layer], cache.values[layer]


def kv_cache_bytes(config: dict, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """``2 * n_layers * n_kv_heads * d_head * seq_len * batch_size * element_size`` (K and V)."""
    cfg = parse_config(config)
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_layers * cfg.kv_heads * cfg.d_head * seq_len * batch_size * element_size
