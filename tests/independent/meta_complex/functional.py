"""Component functions, written from docs/protocol.md (v1 + amendments)."""

import math

import torch

_LOW = (torch.float16, torch.bfloat16)


def _stat_dtype(dtype):
    """At least float32; float64 stays float64."""
    return torch.float32 if dtype in _LOW else dtype


def linear(x, weight, bias=None):
    y = x @ weight.transpose(-1, -2)
    if bias is not None:
        y = y + bias
    return y


def embedding(ids, weight):
    return weight[ids]


def softmax(x, dim):
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=dim, keepdim=True)


def silu(x):
    return x * torch.sigmoid(x)


def rmsnorm(x, weight, eps=1e-5):
    xf = x.to(_stat_dtype(x.dtype))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def layernorm(x, weight, bias, eps=1e-5):
    xf = x.to(_stat_dtype(x.dtype))
    mu = xf.mean(-1, keepdim=True)
    var = (xf - mu).pow(2).mean(-1, keepdim=True)
    out = ((xf - mu) * torch.rsqrt(var + eps)).type_as(x) * weight
    if bias is not None:
        out = out + bias
    return out


def swiglu(x, w_gate, w_up, w_down):
    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gelu_mlp(x, w_fc, b_fc, w_proj, b_proj):
    return linear(_gelu_tanh(linear(x, w_fc, b_fc)), w_proj, b_proj)


# ----------------------------------------------------------------- RoPE (Meta style)
def precompute_freqs_cis(d_head, positions, theta=10000.0, dtype=torch.float32):
    """Complex rotations e^{i * pos * theta^(-2i/d)}; angles computed in float64."""
    if d_head % 2 != 0:
        raise ValueError(f"RoPE needs an even head dimension, got d_head={d_head}")
    freqs = 1.0 / (float(theta) ** (torch.arange(0, d_head, 2, dtype=torch.float64, device=positions.device) / d_head))
    angles = positions.to(torch.float64)[..., None] * freqs
    fc = torch.polar(torch.ones_like(angles), angles)  # complex128
    return fc.to(torch.complex128 if dtype == torch.float64 else torch.complex64)


def apply_rotary(x, freqs_cis):
    """x [..., T, d_head] with interleaved pairs (2i, 2i+1); freqs_cis broadcastable to [..., T, d_head/2]."""
    cdt = _stat_dtype(x.dtype)
    xc = torch.view_as_complex(x.to(cdt).reshape(*x.shape[:-1], x.shape[-1] // 2, 2).contiguous())
    out = torch.view_as_real(xc * freqs_cis).flatten(-2)
    return out.type_as(x)


def rope(x, positions, theta=10000.0):
    d_head = x.shape[-1]
    if d_head % 2 != 0:
        raise ValueError(f"RoPE needs an even head dimension, got d_head={d_head}")
    positions = torch.as_tensor(positions, device=x.device)
    fc = precompute_freqs_cis(d_head, positions, theta, dtype=_stat_dtype(x.dtype))
    return apply_rotary(x, fc)


def sinusoidal_positions(n_positions, d_model, *, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    ang = pos / (10000.0 ** (two_i / d_model))
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(ang)
    pe[:, 1::2] = torch.cos(ang)[:, : d_model // 2]
    return pe.to(dtype)


# ----------------------------------------------------------------- attention
def causal_mask(t_q, t_k, device=None):
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def repeat_kv(x, n_rep):
    if n_rep == 1:
        return x
    *lead, h, t, d = x.shape
    return x.unsqueeze(-3).expand(*lead, h, n_rep, t, d).reshape(*lead, h * n_rep, t, d)


def _expand_kv(q, k, v):
    hq, hk = q.shape[-3], k.shape[-3]
    if hq != hk:
        if hq % hk != 0:
            raise ValueError(f"query heads {hq} not a multiple of kv heads {hk}")
        k, v = repeat_kv(k, hq // hk), repeat_kv(v, hq // hk)
    return k, v


def scaled_dot_product_attention(q, k, v, mask=None):
    k, v = _expand_kv(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = softmax(scores.to(_stat_dtype(scores.dtype)), dim=-1).type_as(q)
    return probs @ v


def flash_attention(q, k, v, causal=True, block_size=64):
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    k, v = _expand_kv(q, k, v)
    cdt = _stat_dtype(q.dtype)
    qf, kf, vf = q.to(cdt), k.to(cdt), v.to(cdt)
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    offset = t_k - t_q
    outs = []
    for qs in range(0, t_q, block_size):
        qb = qf[..., qs : qs + block_size, :] * scale
        nq = qb.shape[-2]
        m = torch.full(qb.shape[:-1], float("-inf"), dtype=cdt, device=q.device)
        denom = torch.zeros(qb.shape[:-1], dtype=cdt, device=q.device)
        acc = torch.zeros(*qb.shape[:-1], vf.shape[-1], dtype=cdt, device=q.device)
        for ks in range(0, t_k, block_size):
            if causal and ks > qs + nq - 1 + offset:
                break
            kb = kf[..., ks : ks + block_size, :]
            vb = vf[..., ks : ks + block_size, :]
            s = qb @ kb.transpose(-1, -2)
            if causal:
                qi = torch.arange(qs, qs + nq, device=q.device)[:, None]
                kj = torch.arange(ks, ks + kb.shape[-2], device=q.device)[None, :]
                s = s.masked_fill(~(kj <= qi + offset), float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m - m_safe)
            denom = alpha * denom + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vb
            m = m_new
        outs.append(acc / denom[..., None])
    return torch.cat(outs, dim=-2).to(q.dtype)


def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads={n_heads} not divisible by n_kv_heads={n_kv_heads}")
    b, t, _ = x.shape
    d_head = wq.shape[0] // n_heads
    q = linear(x, wq).view(b, t, n_heads, d_head).transpose(1, 2)
    k = linear(x, wk).view(b, t, n_kv_heads, d_head).transpose(1, 2)
    v = linear(x, wv).view(b, t, n_kv_heads, d_head).transpose(1, 2)
    if theta is not None:
        if positions is None:
            positions = torch.arange(t, device=x.device)
        q = rope(q, positions, theta)
        k = rope(k, positions, theta)
    out = scaled_dot_product_attention(q, k, v, causal_mask(t, t, device=x.device))
    return linear(out.transpose(1, 2).reshape(b, t, n_heads * d_head), wo)


# ----------------------------------------------------------------- losses
def cross_entropy(logits, targets, ignore_index=-100):
    cdt = _stat_dtype(logits.dtype)
    lf = logits.to(cdt)
    lse = torch.logsumexp(lf, dim=-1)
    valid = targets != ignore_index
    safe_t = torch.where(valid, targets, torch.zeros_like(targets))
    picked = lf.gather(-1, safe_t.unsqueeze(-1)).squeeze(-1)
    nll = (lse - picked) * valid
    return nll.sum() / valid.sum()


def lm_loss(logits, ids):
    return cross_entropy(logits[:, :-1], ids[:, 1:])
