"""Causal self-attention (multi-head only; no grouped-query attention in this implementation)."""

from __future__ import annotations

import math

import torch

from .positions import rope
from .primitives import linear, softmax


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    # disallowed: j > i + (t_k - t_q)
    future = torch.triu(ones, diagonal=t_k - t_q + 1)
    return ~future


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep < 1:
        raise ValueError(f"n_rep must be >= 1, got {n_rep}")
    if n_rep == 1:
        return x.clone()
    return torch.repeat_interleave(x, n_rep, dim=-3)


def _check_heads(hq, hkv):
    if hq % hkv != 0:
        raise ValueError(f"number of query heads {hq} is not a multiple of key/value heads {hkv}")
    if hq != hkv:
        raise ValueError(f"grouped-query attention is not supported: query heads {hq} != key/value heads {hkv}")


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    _check_heads(q.shape[-3], k.shape[-3])
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = softmax(scores, dim=-1)
    return probs @ v


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_size: int = 64
) -> torch.Tensor:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_heads(q.shape[-3], k.shape[-3])
    t_q = q.shape[-2]
    t_k = k.shape[-2]
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    offset = t_k - t_q
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    for qs in range(0, t_q, block_size):
        qe = min(qs + block_size, t_q)
        q_blk = q[..., qs:qe, :]
        m = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
        denom = torch.zeros(q_blk.shape[:-1] + (1,), dtype=q.dtype, device=q.device)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
        for ks in range(0, t_k, block_size):
            ke = min(ks + block_size, t_k)
            if causal and ks > (qe - 1) + offset:
                break  # every key in this block is in the future of every query
            k_blk = k[..., ks:ke, :]
            v_blk = v[..., ks:ke, :]
            s = q_blk @ k_blk.transpose(-2, -1) * scale
            if causal:
                qi = torch.arange(qs, qe, device=q.device).unsqueeze(1)
                kj = torch.arange(ks, ke, device=q.device).unsqueeze(0)
                allowed = kj <= qi + offset
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.max(dim=-1, keepdim=True).values)
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_safe)
            c = torch.exp(m - m_safe)
            denom = denom * c + p.sum(dim=-1, keepdim=True)
            acc = acc * c + p @ v_blk
            m = m_new
        out[..., qs:qe, :] = acc / denom
    return out


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
) -> torch.Tensor:
    if n_kv_heads is None:
        n_kv_heads = n_heads
    if wq.shape[0] % n_heads != 0:
        raise ValueError(f"n_heads={n_heads} does not divide wq rows {wq.shape[0]}")
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")
    if n_kv_heads != n_heads:
        raise ValueError(f"grouped-query attention is not supported: n_heads={n_heads}, n_kv_heads={n_kv_heads}")
    B, T, _ = x.shape
    d_head = wq.shape[0] // n_heads
    q = linear(x, wq).view(B, T, n_heads, d_head).transpose(1, 2)
    k = linear(x, wk).view(B, T, n_kv_heads, d_head).transpose(1, 2)
    v = linear(x, wv).view(B, T, n_kv_heads, d_head).transpose(1, 2)
    if theta is not None:
        if positions is None:
            positions = torch.arange(T, device=x.device)
        elif positions.dim() == 2:
            positions = positions.unsqueeze(1)  # [B, 1, T]
        q = rope(q, positions, theta)
        k = rope(k, positions, theta)
    mask = causal_mask(T, T, device=x.device)
    out = scaled_dot_product_attention(q, k, v, mask)
    out = out.transpose(1, 2).contiguous().view(B, T, n_heads * d_head)
    return linear(out, wo)
