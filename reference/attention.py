"""Causal self-attention: masks, grouped-query head sharing, and three exact attention paths.

- ``scaled_dot_product_attention``: the readable one (explicit scores, mask, softmax over keys);
- ``flash_attention``: tiled online softmax in pure torch (same result to rounding, any block size);
- ``fused_attention``: ``F.scaled_dot_product_attention``, the fast path the model uses by default.

Per-head tensors are ``[B, H, T, d_head]``. Query head ``h`` reads key/value head
``h // n_rep`` with ``n_rep = n_heads // n_kv_heads`` (repeat_interleave semantics).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat

from .positions import rope
from .primitives import linear, softmax


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool ``[t_q, t_k]``, True = may attend; bottom-right aligned.

    Query ``i`` may attend key ``j`` iff ``j <= i + (t_k - t_q)``: the last query is the newest
    token and sees every key, as when new queries follow ``t_k - t_q`` cached keys.
    """
    if t_q < 0 or t_k < 0:
        raise ValueError(f"causal_mask: sizes must be non-negative, got t_q={t_q}, t_k={t_k}")
    q_pos = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    k_pos = torch.arange(t_k, device=device)[None, :]
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


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d_head) masked, over keys) @ v``.

    q: ``[..., Hq, Tq, d]``; k, v: ``[..., Hkv, Tk, d]``; mask: bool, broadcastable to
    ``[..., Hq, Tq, Tk]`` (True = may attend). Returns ``[..., Hq, Tq, d]``.
    Rows with no allowed key are unspecified (NaN here).
    """
    n_rep = _group_size(q, k)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))
    weights = softmax(scores, dim=-1)
    return einsum(weights, v, "... h tq tk, ... h tk d -> ... h tq d")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_size: int = 64
) -> torch.Tensor:
    """Tiled attention with an online softmax; equal to ``scaled_dot_product_attention`` to rounding.

    Shapes as there. Queries and keys are processed in blocks of ``block_size``; for each query
    block a running max ``m``, normaliser ``l`` and unnormalised output ``acc`` are rescaled as each
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
        l = q.new_zeros((*q_blk.shape[:-1], 1))
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
            l = l * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + einsum(p, v_blk, "... h tq tk, ... h tk d -> ... h tq d")
            m = m_new
        out_blocks.append(acc / l)
    return torch.cat(out_blocks, dim=-2)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with GQA and a bottom-right causal mask. Shapes as above.

    ``is_causal`` in PyTorch is top-left aligned, which is only right when ``Tq == Tk``;
    a single new query sees every key; other shapes get an explicit bottom-right mask.
    A single query with GQA (a decoding step) attends as ``[B, Hkv, n_rep, d]`` queries against
    the unrepeated keys, so the cache is never expanded to ``n_heads``.
    """
    n_rep = _group_size(q, k)
    t_q, t_k = q.shape[-2], k.shape[-2]
    if t_q == 1 and n_rep > 1:  # one new query sees every key; fold each kv head's query heads into its rows
        grouped = rearrange(q, "... (h_kv rep) 1 d -> ... h_kv rep d", rep=n_rep)
        out = F.scaled_dot_product_attention(grouped, k, v)
        return rearrange(out, "... h_kv rep d -> ... (h_kv rep) 1 d")
    mask, is_causal = None, False
    if causal and t_q == t_k:
        is_causal = True
    elif causal and t_q > 1:
        mask = causal_mask(t_q, t_k, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=n_rep > 1)


ATTENTION_PATHS = {
    "sdpa": fused_attention,
    "flash": flash_attention,
    "naive": lambda q, k, v, causal=True: scaled_dot_product_attention(
        q, k, v, causal_mask(q.shape[-2], k.shape[-2], device=q.device) if causal else None
    ),
}


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
    rope_style: str = "interleaved",
) -> torch.Tensor:
    """Causal self-attention of ``x [B, T, d_model]`` -> ``[B, T, d_model]``.

    wq: ``[H*d_head, d_model]``; wk, wv: ``[Hkv*d_head, d_model]``; wo: ``[d_model, H*d_head]``.
    RoPE (on q and k only) when ``theta`` is given, at ``positions``: long ``[T]`` or ``[B, T]``
    (default ``arange(T)``).
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if wq.shape[0] % n_heads:
        raise ValueError(f"multihead_self_attention: wq has {wq.shape[0]} rows, not divisible by n_heads={n_heads}")
    if n_heads % n_kv_heads:
        raise ValueError(f"multihead_self_attention: n_heads={n_heads} not divisible by n_kv_heads={n_kv_heads}")
    q = split_heads(linear(x, wq), n_heads)
    k = split_heads(linear(x, wk), n_kv_heads)
    v = split_heads(linear(x, wv), n_kv_heads)
    if theta is not None:
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        if positions.dim() == 2:
            positions = rearrange(positions, "b t -> b 1 t")  # broadcast over heads
        q = rope(q, positions, theta, style=rope_style)
        k = rope(k, positions, theta, style=rope_style)
    out = scaled_dot_product_attention(q, k, v, causal_mask(q.shape[-2], k.shape[-2], device=x.device))
    return linear(merge_heads(out), wo)
