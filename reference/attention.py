"""Causal self-attention: masks, grouped-query head sharing, attention itself, and multi-head attention.

- ``scaled_dot_product_attention``: explicit scores, mask and softmax over keys; with ``fused=True``
  PyTorch's ``F.scaled_dot_product_attention`` instead (the same result to rounding, the model's fast path);
- ``flash_attention``: tiled online softmax in pure torch (same result to rounding, any block size);
- ``multihead_self_attention``: projections, RoPE, the KV cache and one of the above; the model's
  attention layer is this function.

Per-head tensors are ``[B, H, T, d_head]``. Query head ``h`` reads key/value head
``h // n_rep`` with ``n_rep = n_heads // n_kv_heads`` (repeat_interleave semantics).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat

from .norms import rmsnorm
from .positions import rope
from .primitives import linear, softmax

ATTENTION_KERNELS = ("naive", "sdpa", "flash")


def causal_mask(
    t_q: int, t_k: int, device: torch.device | str | None = None, *, window: int | None = None
) -> torch.Tensor:
    """Bool ``[t_q, t_k]``, True = may attend; bottom-right aligned.

    Query ``i`` may attend key ``j`` iff ``j <= i + (t_k - t_q)``: the last query is the newest
    token and sees every key, as when new queries follow ``t_k - t_q`` cached keys.
    ``window`` (protocol v2, ``sliding_window``): also ``i + (t_k - t_q) - j < window``, the last ``window``
    keys up to the query, itself included.
    """
    if t_q < 0 or t_k < 0:
        raise ValueError(f"causal_mask: sizes must be non-negative, got t_q={t_q}, t_k={t_k}")
    if window is not None and window < 1:
        raise ValueError(f"causal_mask: window must be >= 1, got {window}")
    q_pos = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    k_pos = torch.arange(t_k, device=device)[None, :]
    if window is not None:  # distance from the query's own position: W keys, the query's included
        return (k_pos <= q_pos) & (q_pos - k_pos < window)
    return k_pos <= q_pos


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[..., Hkv, T, d] -> [..., Hkv*n_rep, T, d]``; output head ``h`` is kv head ``h // n_rep``."""
    if n_rep < 1:
        raise ValueError(f"repeat_kv: n_rep must be >= 1, got {n_rep}")
    return repeat(x, "... h_kv t d -> ... (h_kv rep) t d", rep=n_rep)


def _group_size(q: torch.Tensor, k: torch.Tensor) -> int:
    n_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"attention: {n_heads} query heads cannot share {n_kv_heads} key/value heads evenly")
    return n_heads // n_kv_heads


def with_causal(mask: torch.Tensor | None, t_q: int, t_k: int, device: torch.device) -> torch.Tensor:
    """``mask`` (broadcastable to ``[..., Tq, Tk]``) and ``causal_mask(t_q, t_k)`` both; the latter alone for None."""
    causal = causal_mask(t_q, t_k, device=device)
    return causal if mask is None else mask.to(torch.bool) & causal


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    fused: bool = False,
    softcap: float | None = None,
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d_head) masked, over keys) @ v``.

    q: ``[..., Hq, Tq, d]``; k, v: ``[..., Hkv, Tk, d]``; mask: bool, broadcastable to
    ``[..., Hq, Tq, Tk]`` (True = may attend). Returns ``[..., Hq, Tq, d]``.
    Rows with no allowed key are unspecified (NaN here).
    ``causal``: also mask the future, ``causal_mask(Tq, Tk)`` (bottom-right aligned).
    ``fused`` (the model's fast path): PyTorch's ``F.scaled_dot_product_attention``, equal to rounding.
    ``softcap`` (protocol v2, ``logit_softcap``): the scaled scores become ``softcap * tanh(scores / softcap)``
    before the mask (Gemma 2); PyTorch's kernel has no soft-cap, so ``fused`` then computes the math written out.
    """
    if softcap is not None and not softcap > 0:
        raise ValueError(f"scaled_dot_product_attention: softcap must be > 0 (or None), got {softcap!r}")
    n_rep = _group_size(q, k)
    t_q, t_k = q.shape[-2], k.shape[-2]
    if fused and softcap is None:
        if causal and mask is None and t_q == 1 and n_rep > 1:
            # one new query sees every key; each kv head's query heads become its rows, so a
            # decoding step never repeats the cached keys to n_heads
            grouped = rearrange(q, "... (h_kv rep) 1 d -> ... h_kv rep d", rep=n_rep)
            out = F.scaled_dot_product_attention(grouped, k, v)
            return rearrange(out, "... h_kv rep d -> ... (h_kv rep) 1 d")
        # PyTorch's is_causal is aligned top-left: right only when Tq == Tk (and one query sees every key)
        is_causal = causal and mask is None and t_q == t_k
        if causal and not is_causal and t_q > 1:
            mask = with_causal(mask, t_q, t_k, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=n_rep > 1)
    if causal:
        mask = with_causal(mask, t_q, t_k, q.device)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])
    if softcap is not None:  # protocol v2 (logit_softcap, amendment 25): after the scaling, before the mask
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))
    weights = softmax(scores, dim=-1)
    return einsum(weights, v, "... h tq tk, ... h tk d -> ... h tq d")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_size: int = 64
) -> torch.Tensor:
    """Tiled attention with an online softmax; equal to ``scaled_dot_product_attention`` to rounding.

    Shapes as there. Queries and keys are processed in blocks of ``block_size``; for each query
    block a running max ``m``, normaliser ``denom`` and unnormalised output ``acc`` are rescaled as each
    key block arrives, so no ``[Tq, Tk]`` matrix is ever formed. ``causal`` uses the bottom-right
    aligned mask; key blocks entirely in a query block's future are skipped.
    """
    if block_size < 1:
        raise ValueError(f"flash_attention: block_size must be >= 1, got {block_size}")
    n_rep = _group_size(q, k)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    t_q, t_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    offset = t_k - t_q
    out_blocks = []
    for q_start in range(0, t_q, block_size):
        q_blk = q[..., q_start : q_start + block_size, :]
        n_q = q_blk.shape[-2]
        m = q.new_full((*q_blk.shape[:-1], 1), float("-inf"))
        denom = q.new_zeros((*q_blk.shape[:-1], 1))
        acc = torch.zeros_like(q_blk)
        last_key = q_start + n_q - 1 + offset if causal else t_k - 1
        for k_start in range(0, min(t_k, last_key + 1), block_size):
            k_blk = k[..., k_start : k_start + block_size, :]
            v_blk = v[..., k_start : k_start + block_size, :]
            scores = einsum(q_blk, k_blk, "... h tq d, ... h tk d -> ... h tq tk") * scale
            if causal:
                allowed = (
                    torch.arange(k_start, k_start + k_blk.shape[-2], device=q.device)[None, :]
                    <= torch.arange(q_start, q_start + n_q, device=q.device)[:, None] + offset
                )
                scores = scores.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
            # a row with no allowed key so far keeps m = -inf; shift by 0 there to avoid inf - inf
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            p = (scores - m_safe).exp()
            correction = (m - m_safe).exp()
            denom = denom * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + einsum(p, v_blk, "... h tq tk, ... h tk d -> ... h tq d")
            m = m_new
        out_blocks.append(acc / denom)
    return torch.cat(out_blocks, dim=-2)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[B, T, H*d_head] -> [B, H, T, d_head]`` (projection rows are head-major)."""
    return rearrange(x, "b t (h d) -> b h t d", h=n_heads)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, d_head] -> [B, T, H*d_head]``, the inverse of ``split_heads``."""
    return rearrange(x, "b h t d -> b t (h d)")


def multihead_self_attention(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    wo: torch.Tensor,
    n_heads: int,
    n_kv_heads: int | None = None,
    theta: float | None = None,
    positions: torch.Tensor | None = None,
    *,
    bq: torch.Tensor | None = None,
    bk: torch.Tensor | None = None,
    bv: torch.Tensor | None = None,
    bo: torch.Tensor | None = None,
    cache=None,
    layer: int = 0,
    rope_style: str = "interleaved",
    rope_table_size: int | None = None,
    rope_scaling: dict | None = None,
    attention: str = "naive",
    mask: torch.Tensor | None = None,
    window: int | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-5,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal self-attention of ``x [B, T, d_model]`` -> ``[B, T, d_model]``.

    wq: ``[H*d_head, d_model]``; wk, wv: ``[Hkv*d_head, d_model]``; wo: ``[d_model, H*d_head]``.
    RoPE (on q and k only) when ``theta`` is given, at ``positions``: long ``[T]`` or ``[B, T]``
    (default ``arange(T)``, after the cached tokens when there is a cache).

    Keyword options (the model's attention layer is this function with them):
    ``bq [H*d_head]``, ``bk, bv [Hkv*d_head]``, ``bo [d_model]``: projection biases (gpt2).
    ``cache``, ``layer``: ``cache.update(layer, k, v)`` appends the new keys (after RoPE) and values
    ``[B, Hkv, T, d_head]`` to that layer and returns all of them (``kv_cache.KVCache``); the new
    queries attend to every cached key. ``rope_table_size``: passed to ``rope`` as ``table_size``.
    ``rope_scaling`` (protocol v2): passed to ``rope`` as ``scaling``, a Hugging Face ``rope_scaling`` dict.
    ``attention``: ``"naive"`` (the math written out), ``"sdpa"`` (``scaled_dot_product_attention``
    with ``fused=True``) or ``"flash"`` (``flash_attention``); the same result to rounding.
    ``mask`` (protocol v2, ``attention_mask``): bool, broadcastable to ``[B, H, T, T_k]``, the keys each query
    may attend besides the causal mask (padding masked); ``"flash"`` then computes the math written out.
    ``window`` (protocol v2, ``sliding_window``): each query attends only the last ``window`` keys up to itself
    (``causal_mask(..., window=)``, bottom-right aligned over the cached and new keys); ``"flash"`` written out.
    ``q_norm``, ``k_norm`` ``[d_head]`` (protocol v2, ``qk_norm``): per-head RMSNorm (``rmsnorm(., w, norm_eps)``
    over each head's ``d_head`` channels, one weight shared by every head) on the queries, the keys, after the
    head split and before RoPE; the cache holds the normalised, rotated keys. Values are never normalised.
    ``softcap`` (protocol v2, ``logit_softcap``): passed to ``scaled_dot_product_attention`` (scores soft-capped
    after the scaling, before the causal and padding masks); ``"sdpa"`` and ``"flash"`` then compute it written out.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if wq.shape[0] % n_heads:
        raise ValueError(f"multihead_self_attention: wq has {wq.shape[0]} rows, not divisible by n_heads={n_heads}")
    if n_heads % n_kv_heads:
        raise ValueError(f"multihead_self_attention: n_heads={n_heads} not divisible by n_kv_heads={n_kv_heads}")
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"multihead_self_attention: attention must be one of {ATTENTION_KERNELS}, got {attention!r}")
    q = split_heads(linear(x, wq, bq), n_heads)  # [B, H, T, d_head]
    k = split_heads(linear(x, wk, bk), n_kv_heads)  # [B, Hkv, T, d_head]
    v = split_heads(linear(x, wv, bv), n_kv_heads)
    if q_norm is not None:  # protocol v2 (qk_norm, amendment 24): per head, over d_head, before RoPE
        q = rmsnorm(q, q_norm, norm_eps)
    if k_norm is not None:
        k = rmsnorm(k, k_norm, norm_eps)
    if theta is not None:
        if positions is None:
            start = 0 if cache is None else cache.length
            positions = torch.arange(start, start + x.shape[1], device=x.device)
        if positions.dim() == 2:
            positions = rearrange(positions, "b t -> b 1 t")  # broadcast over heads
        q = rope(q, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]
    if window is not None:  # protocol v2 (sliding_window): the causal mask narrowed to the last `window` keys
        local = causal_mask(q.shape[-2], k.shape[-2], device=x.device, window=window)
        mask = local if mask is None else mask.to(torch.bool) & local
    if softcap is not None:  # protocol v2 (logit_softcap): the soft-cap written out, with the masks as below
        out = scaled_dot_product_attention(q, k, v, mask, causal=True, softcap=softcap)
    elif mask is not None:  # protocol v2 (attention_mask): padding masked with the causal mask; flash written out
        out = scaled_dot_product_attention(q, k, v, mask, causal=True, fused=attention == "sdpa")
    elif attention == "flash":
        out = flash_attention(q, k, v, causal=True)
    else:
        out = scaled_dot_product_attention(q, k, v, causal=True, fused=attention == "sdpa")
    return linear(merge_heads(out), wo, bo)
