"""Component functions, written functionally (einsum, complex RoPE, torch's fused attention kernel)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _at_least_f32(x):
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def linear(x, weight, bias=None):
    y = torch.einsum("...i,oi->...o", x, weight)
    return y if bias is None else y + bias


def embedding(ids, weight):
    return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[-1])


def softmax(x, dim):
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))


def silu(x):
    return x / (1 + torch.exp(-x))


def rmsnorm(x, weight, eps=1e-5):
    h = _at_least_f32(x)
    ms = torch.linalg.vector_norm(h, dim=-1, keepdim=True).square() / h.shape[-1]
    return (h / torch.sqrt(ms + eps)).to(x.dtype) * weight


def layernorm(x, weight, bias, eps=1e-5):
    h = _at_least_f32(x)
    var, mean = torch.var_mean(h, dim=-1, keepdim=True, correction=0)
    return ((h - mean) * torch.rsqrt(var + eps)).to(x.dtype) * weight + bias


def swiglu(x, w_gate, w_up, w_down):
    gate = linear(x, w_gate)
    return linear(silu(gate) * linear(x, w_up), w_down)


def gelu_mlp(x, w_fc, b_fc, w_proj, b_proj):
    return linear(F.gelu(linear(x, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)


def rope(x, positions, theta=10000.0):
    """Interleaved pairs (2i, 2i+1) as complex numbers, multiplied by exp(i * pos * theta**(-2i/d))."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE pairs channels, so d_head must be even; got {d}")
    real = _at_least_f32(x)
    freqs = torch.exp(-math.log(theta) * torch.arange(0, d, 2, device=x.device, dtype=real.dtype) / d)
    angles = positions.to(device=x.device, dtype=real.dtype)[..., None] * freqs
    rotation = torch.polar(torch.ones_like(angles), angles)
    z = torch.view_as_complex(real.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return (
        torch.view_as_real(z * rotation)
        .reshape(*torch.broadcast_shapes(x.shape[:-1], angles.shape[:-1]), d)
        .to(x.dtype)
    )


def sinusoidal_positions(n_positions, d_model, *, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    p = torch.arange(n_positions, dtype=dtype)[:, None]
    denom = 10000.0 ** (torch.arange(0, d_model, 2, dtype=dtype) / d_model)
    table = torch.empty(n_positions, d_model, dtype=dtype)
    table[:, 0::2] = torch.sin(p / denom)
    table[:, 1::2] = torch.cos(p / denom)[:, : d_model // 2]
    return table


def causal_mask(t_q, t_k, device=None):
    future = torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(t_k - t_q + 1)
    return ~future


def repeat_kv(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=-3)


def scaled_dot_product_attention(q, k, v, mask=None):
    gqa = q.shape[-3] != k.shape[-3]
    if gqa and q.shape[-3] % k.shape[-3]:
        raise ValueError(f"{q.shape[-3]} query heads cannot share {k.shape[-3]} key/value heads")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def flash_attention(q, k, v, causal=True, block_size=64):
    """One pass over key blocks for all queries, carrying each row's running log-sum-exp."""
    n_rep = q.shape[-3] // k.shape[-3]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    last_key = torch.arange(t_q, device=q.device) + (t_k - t_q)  # query i sees keys <= last_key[i]
    for lo in range(0, t_k, block_size):
        hi = min(lo + block_size, t_k)
        s = torch.einsum("...qd,...kd->...qk", q, k[..., lo:hi, :]) * scale
        if causal:
            s = s.masked_fill(torch.arange(lo, hi, device=q.device)[None, :] > last_key[:, None], float("-inf"))
        block_lse = torch.logsumexp(s, dim=-1)
        new_lse = torch.logaddexp(lse, block_lse)
        finite = torch.isfinite(new_lse)
        ref = torch.where(finite, new_lse, torch.zeros_like(new_lse))
        keep = torch.where(finite, torch.exp(lse - ref), torch.zeros_like(lse))
        p = torch.exp(s - ref[..., None])
        out = out * keep[..., None] + torch.einsum("...qk,...kd->...qd", p, v[..., lo:hi, :])
        lse = new_lse
    return out


def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    n_kv_heads = n_kv_heads or n_heads
    d_model = x.shape[-1]
    d_head = wq.shape[0] // n_heads
    q = torch.einsum("btd,hed->bhte", x, wq.reshape(n_heads, d_head, d_model))
    k = torch.einsum("btd,hed->bhte", x, wk.reshape(n_kv_heads, d_head, d_model))
    v = torch.einsum("btd,hed->bhte", x, wv.reshape(n_kv_heads, d_head, d_model))
    if theta is not None:
        pos = positions if positions is not None else torch.arange(x.shape[-2], device=x.device)
        pos = pos[:, None, :] if pos.dim() == 2 else pos
        q, k = rope(q, pos, theta), rope(k, pos, theta)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_kv_heads != n_heads)
    return torch.einsum("bhte,dhe->btd", o, wo.reshape(d_model, n_heads, d_head))


def cross_entropy(logits, targets, ignore_index=-100):
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    counted = targets != ignore_index
    picked = logp.gather(-1, targets.masked_fill(~counted, 0).unsqueeze(-1)).squeeze(-1)
    weights = counted.to(logits.dtype)
    return -(picked * weights).sum() / weights.sum()


def lm_loss(logits, ids):
    return cross_entropy(logits[:, :-1], ids[:, 1:])
