"""RoPE (half / rotate_half style) and the sinusoidal table."""

from __future__ import annotations

import torch


def _rotate_half(x):
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat([-x2, x1], dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    if d % 2 != 0:
        raise ValueError(f"rope needs an even head dimension, got x.shape={tuple(x.shape)}")
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    i = torch.arange(0, d // 2, device=x.device, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / d)
    pos = positions.to(device=x.device, dtype=torch.float64)
    angles = pos.unsqueeze(-1) * inv_freq  # [..., T, d/2]
    angles = torch.cat([angles, angles], dim=-1)  # [..., T, d]
    cos = torch.cos(angles).to(compute)
    sin = torch.sin(angles).to(compute)
    xc = x.to(compute)
    out = xc * cos + _rotate_half(xc) * sin
    return out.to(x.dtype)


def sinusoidal_positions(n_positions: int, d_model: int, *, dtype=None) -> torch.Tensor:
    if dtype is None:
        dtype = torch.get_default_dtype()
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    div = 10000.0 ** (two_i / d_model)
    pe[:, 0::2] = torch.sin(pos / div)
    n_cos = d_model // 2
    pe[:, 1::2] = torch.cos(pos / div[:n_cos])
    return pe.to(dtype)
