"""The KV cache: per layer, keys after RoPE and values as projected, ``[B, Hkv, T_cached, d_head]``."""

from __future__ import annotations

import torch

from .config import ModelConfig, parse_config


class KVCache:
    """Keys and values of every layer for the tokens seen so far, ``[B, Hkv, T_cached, d_head]``.

    Each layer's keys and values live in a buffer with room for more positions along the time
    axis (-2): appending writes the new positions into it, and a buffer too small for them is
    replaced by one with room for twice the positions now needed (at most ``context_length``).
    A decoding step thus copies one token, not the whole cache, and rarely allocates; the
    buffers hold at most twice ``kv_cache_bytes``. Positions of new tokens continue from ``length``.
    Opaque to callers; read it with ``cache_kv`` (views of the filled part). Made for inference: as
    appends write in place, backpropagating through two calls that share a buffer is refused by
    autograd's in-place check.
    """

    def __init__(self, config: ModelConfig, batch_size: int, device: torch.device, dtype: torch.dtype):
        if batch_size < 1:
            raise ValueError(f"new_cache: batch_size must be >= 1, got {batch_size}")
        self.config, self.batch_size = config, batch_size
        empty = torch.zeros(batch_size, config.kv_heads, 0, config.d_head, device=device, dtype=dtype)
        self.key_buffers = [empty] * config.n_layers
        self.value_buffers = [empty] * config.n_layers
        self.lengths = [0] * config.n_layers

    @property
    def length(self) -> int:
        """Number of cached positions (the same in every layer between forward calls)."""
        return self.lengths[0]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v [B, Hkv, T_new, d_head]`` to ``layer``; return all its keys and values."""
        start, end = self.lengths[layer], self.lengths[layer] + k.shape[-2]
        if end > self.key_buffers[layer].shape[-2] or self.key_buffers[layer].dtype != k.dtype:
            capacity = max(end, min(2 * end, self.config.context_length))  # room for as many again
            self.key_buffers[layer] = regrown(self.key_buffers[layer], start, capacity, k)
            self.value_buffers[layer] = regrown(self.value_buffers[layer], start, capacity, v)
        self.key_buffers[layer][..., start:end, :] = k
        self.value_buffers[layer][..., start:end, :] = v
        self.lengths[layer] = end
        return self.kv(layer)

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the filled part of ``layer``'s buffers."""
        end = self.lengths[layer]
        return self.key_buffers[layer][..., :end, :], self.value_buffers[layer][..., :end, :]


def regrown(buffer: torch.Tensor, filled: int, capacity: int, like: torch.Tensor) -> torch.Tensor:
    """A new buffer of ``capacity`` positions in ``like``'s dtype/device holding ``buffer``'s first ``filled``."""
    grown = like.new_zeros(*buffer.shape[:-2], capacity, buffer.shape[-1])
    grown[..., :filled, :] = buffer[..., :filled, :]
    return grown


def new_cache(model, batch_size: int) -> KVCache:
    """An empty cache for ``model`` and ``batch_size`` sequences."""
    p = next(model.parameters())
    return KVCache(model.config, batch_size, p.device, p.dtype)


def cache_kv(cache: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(k, v)`` of ``layer``, each ``[B, n_kv_heads, T_cached, d_head]``."""
    if not 0 <= layer < len(cache.lengths):
        raise ValueError(f"cache_kv: layer {layer} out of range for {len(cache.lengths)} layers")
    return cache.kv(layer)


def kv_cache_bytes(config: dict, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """``2 * n_layers * n_kv_heads * d_head * seq_len * batch_size * element_size`` (K and V)."""
    cfg = parse_config(config)
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_layers * cfg.kv_heads * cfg.d_head * seq_len * batch_size * element_size
