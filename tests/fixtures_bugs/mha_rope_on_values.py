"""Multi-head self-attention written from scratch (view/transpose, complex-number RoPE, explicit
mask) with one mistake: RoPE rotates the values too. Nothing here comes from ``reference``.

Load it as ``--impl=tests/fixtures_bugs/mha_rope_on_values.py``: every other protocol name is
absent, so only the multi-head attention tests run.
"""

import math

import torch

ROPE_STYLE = "interleaved"


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Interleaved RoPE as complex multiplication: pair (2i, 2i+1) is one complex number.

    x: [B, H, T, d]; positions: [T] or [B, T].
    """
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    pos = positions.to(torch.float64)
    if pos.dim() == 2:
        pos = pos[:, None, :]  # [B, 1, T]: the same positions for every head
    angle = pos[..., None] * inv_freq  # [..., T, d/2]
    z = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = z * torch.polar(torch.ones_like(angle), angle)
    return torch.view_as_real(rotated).reshape(x.shape).to(x.dtype)


def multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    """Causal self-attention of x [B, T, d_model] -> [B, T, d_model]."""
    batch, t, _ = x.shape
    n_kv = n_kv_heads or n_heads
    d_head = wq.shape[0] // n_heads
    q = (x @ wq.T).view(batch, t, n_heads, d_head).transpose(1, 2)
    k = (x @ wk.T).view(batch, t, n_kv, d_head).transpose(1, 2)
    v = (x @ wv.T).view(batch, t, n_kv, d_head).transpose(1, 2)
    if theta is not None:
        pos = torch.arange(t, device=x.device) if positions is None else positions
        q, k, v = _rotate(q, pos, theta), _rotate(k, pos, theta), _rotate(v, pos, theta)  # the mistake: v
    k = k.repeat_interleave(n_heads // n_kv, dim=1)
    v = v.repeat_interleave(n_heads // n_kv, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return (weights @ v).transpose(1, 2).reshape(batch, t, n_heads * d_head) @ wo.T
