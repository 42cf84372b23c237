"""Component functions written the way Meta's and Hugging Face's Llama code computes them: statistics,
softmax and RoPE tables in float32 whatever the input dtype, results cast back to the input dtype."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# The dtype of statistics, softmax and RoPE tables (float32 in Meta's and Hugging Face's Llama).
STATS = torch.float32


def linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


def embedding(ids, weight):
    return F.embedding(ids, weight)


def softmax(x, dim):
    return F.softmax(x, dim=dim, dtype=STATS).to(x.dtype)


def silu(x):
    return F.silu(x)


def rmsnorm(x, weight, eps=1e-5):
    input_dtype = x.dtype
    hidden = x.to(STATS)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def layernorm(x, weight, bias, eps=1e-5):
    out = F.layer_norm(x.to(STATS), (x.shape[-1],), weight.to(STATS), bias.to(STATS), eps)
    return out.to(x.dtype)


def swiglu(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def gelu_mlp(x, w_fc, b_fc, w_proj, b_proj):
    return F.linear(F.gelu(F.linear(x, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)


def inv_frequencies(dim: int, theta: float, device=None) -> torch.Tensor:
    """theta ** (-2i / dim) for i < dim / 2, in float32 (as Llama's rotary embedding computes it)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(STATS) / dim))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(positions, dim, theta, device=None):
    """cos and sin tables [..., T, dim] in float32, each frequency repeated for both halves."""
    freqs = positions.to(device=device, dtype=STATS).unsqueeze(-1) * inv_frequencies(dim, theta, device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return (x * cos) + (rotate_half(x) * sin)


def rope(x, positions, theta=10000.0):
    d = x.shape[-1]
    if d % 2 != 0:
        raise ValueError(f"rotary embeddings need an even head dimension (got {d})")
    cos, sin = rope_cos_sin(positions, d, theta, device=x.device)
    return apply_rotary(x, cos, sin)


def sinusoidal_positions(n_positions, d_model, *, dtype=None):
    position = torch.arange(n_positions, dtype=STATS).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=STATS) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(n_positions, d_model, dtype=STATS)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe.to(dtype or torch.get_default_dtype())


def causal_mask(t_q, t_k, device=None):
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def _require_mha(q, k):
    if q.shape[-3] != k.shape[-3]:
        raise ValueError(
            f"this implementation supports multi-head attention only: {q.shape[-3]} query heads, "
            f"{k.shape[-3]} key/value heads"
        )


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    _require_mha(q, k)
    scaling = q.shape[-1] ** -0.5
    attn_weights = torch.matmul(q, k.transpose(-2, -1)) * scaling
    attn_weights = attn_weights.to(STATS)
    if mask is not None:
        if mask.dtype == torch.bool:
            attn_weights = attn_weights.masked_fill(~mask, float("-inf"))
        else:
            attn_weights = attn_weights + mask.to(STATS)
    attn_weights = F.softmax(attn_weights, dim=-1).to(q.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout_p, training=training)
    return torch.matmul(attn_weights, v)


def flash_attention(q, k, v, causal=True, block_size=64):
    """Online-softmax attention over key/value blocks; running max and sum kept in float32."""
    _require_mha(q, k)
    t_q, t_k = q.shape[-2], k.shape[-2]
    scaling = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1], float("-inf"), dtype=STATS, device=q.device)
    l = torch.zeros(q.shape[:-1], dtype=STATS, device=q.device)  # noqa: E741
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=STATS, device=q.device)
    q_idx = torch.arange(t_q, device=q.device)[:, None] + (t_k - t_q)
    for start in range(0, t_k, block_size):
        end = min(start + block_size, t_k)
        s = (torch.matmul(q, k[..., start:end, :].transpose(-2, -1)) * scaling).to(STATS)
        if causal:
            visible = torch.arange(start, end, device=q.device)[None, :] <= q_idx
            s = s.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_ref = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_ref[..., None])
        alpha = torch.exp(m - m_ref)
        l = l * alpha + p.sum(-1)  # noqa: E741
        acc = acc * alpha[..., None] + torch.matmul(p, v[..., start:end, :].to(STATS))
        m = m_new
    return (acc / l[..., None]).to(q.dtype)


def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    bsz, q_len, _ = x.shape
    num_kv = n_kv_heads or n_heads
    head_dim = wq.shape[0] // n_heads
    q = F.linear(x, wq).view(bsz, q_len, n_heads, head_dim).transpose(1, 2)
    k = F.linear(x, wk).view(bsz, q_len, num_kv, head_dim).transpose(1, 2)
    v = F.linear(x, wv).view(bsz, q_len, num_kv, head_dim).transpose(1, 2)
    if theta is not None:
        if positions is None:
            positions = torch.arange(q_len, device=x.device)
        if positions.dim() == 2:
            positions = positions[:, None, :]
        cos, sin = rope_cos_sin(positions, head_dim, theta, device=x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    out = scaled_dot_product_attention(q, k, v, causal_mask(q_len, q_len, device=x.device))
    out = out.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
    return F.linear(out, wo)


def cross_entropy(logits, targets, ignore_index=-100):
    loss = F.cross_entropy(
        logits.to(STATS).reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index
    )
    return loss.to(logits.dtype)


def lm_loss(logits, ids):
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = ids[..., 1:].contiguous()
    return cross_entropy(shift_logits, shift_labels)
