"""Component functions of protocol v1, computed in the input dtype (norm statistics in at least float32)."""

from __future__ import annotations

import math

import torch


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype norm statistics and RoPE tables are computed in: the input's, at least float32."""
    return torch.promote_types(dtype, torch.float32)


def linear(x, weight, bias=None):
    y = torch.matmul(x, weight.transpose(0, 1))
    if bias is not None:
        y = y + bias
    return y


def embedding(ids, weight):
    return weight[ids]


def softmax(x, dim):
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def silu(x):
    return x * torch.sigmoid(x)


def rmsnorm(x, weight, eps=1e-5):
    xs = x.to(_stat_dtype(x.dtype))
    inv_rms = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xs * inv_rms).to(x.dtype) * weight


def layernorm(x, weight, bias, eps=1e-5):
    xs = x.to(_stat_dtype(x.dtype))
    centred = xs - xs.mean(dim=-1, keepdim=True)
    var = centred.pow(2).mean(dim=-1, keepdim=True)
    return (centred / torch.sqrt(var + eps)).to(x.dtype) * weight + bias


def swiglu(x, w_gate, w_up, w_down):
    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gelu_mlp(x, w_fc, b_fc, w_proj, b_proj):
    return linear(gelu_tanh(linear(x, w_fc, b_fc)), w_proj, b_proj)


def rope(x, positions, theta=10000.0):
    """Rotate interleaved pairs (2i, 2i+1) of the last axis by position * theta**(-2i/d)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope needs an even head dimension, got d_head={d}")
    table_dtype = _stat_dtype(x.dtype)
    exponent = torch.arange(0, d, 2, device=x.device, dtype=table_dtype) / d
    inv_freq = torch.pow(torch.tensor(float(theta), dtype=table_dtype, device=x.device), -exponent)
    angle = positions.to(device=x.device, dtype=table_dtype).unsqueeze(-1) * inv_freq  # [..., T, d/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


def sinusoidal_positions(n_positions, d_model, *, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / d_model)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype)


def causal_mask(t_q, t_k, device=None):
    rows = torch.arange(t_q, device=device).unsqueeze(1)
    cols = torch.arange(t_k, device=device).unsqueeze(0)
    return cols <= rows + (t_k - t_q)


def repeat_kv(x, n_rep):
    if n_rep == 1:
        return x
    *lead, h, t, d = x.shape
    return x.unsqueeze(-3).expand(*lead, h, n_rep, t, d).reshape(*lead, h * n_rep, t, d)


def _share_kv(q, k, v):
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of key/value heads {hkv}")
    return repeat_kv(k, hq // hkv), repeat_kv(v, hq // hkv)


def scaled_dot_product_attention(q, k, v, mask=None):
    k, v = _share_kv(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return torch.matmul(softmax(scores, dim=-1), v)


def flash_attention(q, k, v, causal=True, block_size=64):
    """Tiled attention: query blocks against key blocks with a running (max, sum) per row."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    k, v = _share_kv(q, k, v)
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    offset = t_k - t_q
    scale = 1.0 / math.sqrt(d)
    blocks = []
    for qs in range(0, t_q, block_size):
        qb = q[..., qs : qs + block_size, :]
        nq = qb.shape[-2]
        row_max = torch.full((*qb.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        k_stop = min(t_k, qs + nq + offset) if causal else t_k
        for ks in range(0, max(k_stop, 0), block_size):
            kb, vb = k[..., ks : ks + block_size, :], v[..., ks : ks + block_size, :]
            s = torch.matmul(qb, kb.transpose(-2, -1)) * scale
            if causal:
                # absolute indices: key j allowed iff j <= i + offset (bottom-right)
                rows = torch.arange(qs, qs + nq, device=q.device).unsqueeze(1)
                cols = torch.arange(ks, ks + kb.shape[-2], device=q.device).unsqueeze(0)
                allowed = cols <= rows + offset
                s = s.masked_fill(~allowed, float("-inf"))
            new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
            safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            p = torch.exp(s - safe_max)
            correction = torch.exp(row_max - safe_max)
            row_sum = row_sum * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + torch.matmul(p, vb)
            row_max = new_max
        blocks.append(acc / row_sum)
    return torch.cat(blocks, dim=-2)


def split_heads(x, n_heads):
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


def merge_heads(x):
    b, h, t, dh = x.shape
    return x.transpose(1, 2).contiguous().view(b, t, h * dh)


def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    n_kv_heads = n_kv_heads or n_heads
    t = x.shape[-2]
    q = split_heads(linear(x, wq), n_heads)
    k = split_heads(linear(x, wk), n_kv_heads)
    v = split_heads(linear(x, wv), n_kv_heads)
    if theta is not None:
        pos = torch.arange(t, device=x.device) if positions is None else positions.to(x.device)
        if pos.dim() == 2:  # [B, T]: one row of positions per sequence
            pos = pos.unsqueeze(1)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
    out = scaled_dot_product_attention(q, k, v, causal_mask(t, t, device=x.device))
    return linear(merge_heads(out), wo)


def cross_entropy(logits, targets, ignore_index=-100):
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)
    tgt = targets.reshape(-1)
    keep = tgt != ignore_index
    safe = torch.where(keep, tgt, torch.zeros_like(tgt))
    row_max = flat.amax(dim=-1, keepdim=True)
    log_z = (flat - row_max).exp().sum(dim=-1).log() + row_max.squeeze(-1)
    picked = flat.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    nll = (log_z - picked) * keep
    return nll.sum() / keep.sum()


def lm_loss(logits, ids):
    return cross_entropy(logits[:, :-1], ids[:, 1:])
