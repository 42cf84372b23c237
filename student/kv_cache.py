"""The KV cache: each layer's keys (after RoPE) and values (as projected) of the tokens seen so far.

Layout per layer: ``[B, n_kv_heads, T_cached, d_head]``, appended along the time axis (dim=-2)
at every ``forward(model, ids, cache)``. The cache object itself is opaque to the tests -- a
small class of your own (e.g. lists of per-layer k and v tensors, plus the current length) is
enough; tests read it only through ``cache_kv``.

Why it exists: without it every generated token recomputes keys and values of the whole prefix.
What it costs: ``kv_cache_bytes`` -- and why GQA (fewer kv heads) shrinks it by
``n_heads / n_kv_heads``.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def new_cache(model: nn.Module, batch_size: int):
    """An empty cache for ``batch_size`` sequences of ``model`` (every layer holds ``T_cached = 0``).

    Tensors should live on the model's device in the model's parameter dtype.
    ``batch_size < 1`` -> ``ValueError``.
    """
    raise NotImplementedError("new_cache")


def cache_kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(k, v)`` of ``layer``, each ``[B, n_kv_heads, T_cached, d_head]``.

    Keys are stored *after* RoPE (rotated at their own positions), values as projected.
    ``layer`` out of range -> ``ValueError``.

    Classic bugs to avoid:
    - storing keys before RoPE (then they would have to be re-rotated every step) or rotating
      the values;
    - storing ``n_heads`` repeated kv heads instead of ``n_kv_heads`` (that throws away GQA's saving).
    """
    raise NotImplementedError("cache_kv")


def kv_cache_bytes(config: dict, batch_size: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Memory a full KV cache needs -> ``int`` bytes.

    ``2 * n_layers * n_kv_heads * d_head * seq_len * batch_size * element_size``
    (2 for K and V; ``d_head = d_model // n_heads``; ``n_kv_heads`` defaults to ``n_heads``;
    ``element_size`` of ``dtype``: 4 for float32, 2 for bf16/fp16). Pure arithmetic on the
    config dict: build no model and allocate no tensor of that size.

    Classic bug to avoid: using ``n_heads`` instead of ``n_kv_heads`` -- GQA caches only the kv heads.
    """
    raise NotImplementedError("kv_cache_bytes")
