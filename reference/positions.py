"""Positional information: rotary embeddings (RoPE) and the sinusoidal table.

RoPE rotates pairs of channels of queries and keys by ``position * theta**(-2i/d_head)``.
Two pairings are in use and are the same model up to a permutation of q/k rows:

- ``"interleaved"``: pair ``i`` is channels ``(2i, 2i+1)`` (RoFormer paper, the default);
- ``"half"``: pair ``i`` is channels ``(i, i + d_head/2)`` (GPT-NeoX, Hugging Face).
"""

from __future__ import annotations

import functools

import torch
from einops import rearrange

from .rope_scaling import check_rope_scaling, freeze, scaled_frequencies

ROPE_STYLES = ("interleaved", "half")

# einops patterns that view the last axis as [pairs, 2] for each style.
_PAIR_PATTERN = {
    "interleaved": "... (pairs two) -> ... pairs two",
    "half": "... (two pairs) -> ... pairs two",
}
_UNPAIR_PATTERN = {
    "interleaved": "... pairs two -> ... (pairs two)",
    "half": "... pairs two -> ... (two pairs)",
}


def check_rope_style(style: str) -> str:
    if style not in ROPE_STYLES:
        raise ValueError(f"rope style must be one of {ROPE_STYLES}, got {style!r}")
    return style


def rope_frequencies(d_head: int, theta: float = 10000.0) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-2i / d_head)`` for ``i < d_head/2``, float64 ``[d_head/2]``."""
    if d_head % 2:
        raise ValueError(f"RoPE needs an even head dimension, got d_head={d_head}")
    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head
    return theta ** (-exponents)


def rope_angles(positions: torch.Tensor, d_head: int, theta: float = 10000.0) -> torch.Tensor:
    """Rotation angles ``positions[..., None] * freqs``: ``[...] -> [..., d_head/2]``, float64."""
    freqs = rope_frequencies(d_head, theta).to(positions.device)
    return positions.to(torch.float64)[..., None] * freqs


def apply_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "interleaved") -> torch.Tensor:
    """Rotate channel pairs of ``x [..., T, d_head]`` by angles given as ``cos, sin [..., T, d_head/2]``.

    cos/sin broadcast against x's leading axes. Returns a new tensor shaped like x.
    """
    pairs = rearrange(x, _PAIR_PATTERN[check_rope_style(style)], two=2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rearrange(rotated, _UNPAIR_PATTERN[style])


@functools.lru_cache(maxsize=16)
def rope_table(
    n_positions: int, d_head: int, theta: float, device: torch.device, dtype: torch.dtype, scaling: tuple | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of the angles of positions ``[0, n_positions)``, each ``[n_positions, d_head/2]``.

    Computed in float64 and cast to ``dtype`` once per argument tuple, then kept (a few tables).
    ``scaling``: a checked position-independent rope scaling, frozen (``rope_scaling.freeze``).
    """
    if scaling is None:
        angles = rope_angles(torch.arange(n_positions, device=device), d_head, theta)
        return angles.cos().to(dtype), angles.sin().to(dtype)
    return scaled_cos_sin(torch.arange(n_positions, device=device), d_head, theta, dict(scaling), dtype)


def scaled_cos_sin(
    positions: torch.Tensor, d_head: int, theta: float, scaling: dict, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` ``[..., d_head/2]`` of a checked rope ``scaling`` at ``positions [...]``, times its
    attention factor; float64 angles, cast to ``dtype``. ``"dynamic"`` reads its length from the positions."""
    seq_len = int(positions.max()) + 1 if positions.numel() else 0
    freqs, attention = scaled_frequencies(d_head, theta, scaling, seq_len)
    angles = positions.to(torch.float64)[..., None] * freqs.to(positions.device)
    return (angles.cos() * attention).to(dtype), (angles.sin() * attention).to(dtype)


def rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    theta: float = 10000.0,
    *,
    style: str = "interleaved",
    table_size: int | None = None,
    scaling: dict | None = None,
) -> torch.Tensor:
    """Rotary position embedding of queries or keys (never values).

    x: ``[..., T, d_head]`` with even ``d_head``; positions: long ``[T]`` or broadcastable to
    ``x.shape[:-1]``. Angles are computed in float64 and the rotation in x's dtype (at least float32).
    ``table_size`` (the model's fast path): look the angles up in ``rope_table(table_size, ...)``,
    kept between calls, instead of computing them; the same values, for positions below it.
    ``scaling`` (protocol v2, ``rope_scaling``): a Hugging Face ``rope_scaling`` dict (``rope_scaling.py``);
    ``"dynamic"`` scales by ``max(positions) + 1`` and is never looked up in a table.
    """
    d_head = x.shape[-1]
    if d_head % 2:
        raise ValueError(f"rope: d_head must be even, got x.shape={tuple(x.shape)} (d_head={d_head})")
    if positions.is_floating_point():
        raise ValueError(f"rope: positions must be integers, got dtype {positions.dtype}")
    compute = torch.promote_types(x.dtype, torch.float32)
    positions = positions.to(x.device)
    scaling = check_rope_scaling(scaling)
    if scaling is not None and (table_size is None or scaling["rope_type"] == "dynamic"):
        cos, sin = scaled_cos_sin(positions, d_head, theta, scaling, compute)
    elif scaling is not None:
        cos_table, sin_table = rope_table(table_size, d_head, theta, x.device, compute, freeze(scaling))
        cos, sin = cos_table[positions], sin_table[positions]
    elif table_size is None:
        angles = rope_angles(positions, d_head, theta)
        cos, sin = angles.cos().to(compute), angles.sin().to(compute)
    else:
        cos_table, sin_table = rope_table(table_size, d_head, theta, x.device, compute)
        cos, sin = cos_table[positions], sin_table[positions]
    return apply_rotation(x.to(compute), cos, sin, style).to(x.dtype)


def sinusoidal_positions(n_positions: int, d_model: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The fixed sinusoidal table of "Attention Is All You Need", ``[n_positions, d_model]``.

    ``pe[p, 2i] = sin(p / 10000**(2i/d_model))``, ``pe[p, 2i+1] = cos(p / 10000**(2i/d_model))``.
    An odd ``d_model`` ends with a sine column. Computed in float64, returned in ``dtype``
    (default: torch's default dtype).
    """
    if n_positions < 0 or d_model < 1:
        raise ValueError(f"sinusoidal_positions: need n_positions >= 0 and d_model >= 1, got {n_positions}, {d_model}")
    positions = torch.arange(n_positions, dtype=torch.float64)
    freqs = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = positions[:, None] * freqs  # [P, ceil(d/2)]
    table = rearrange(torch.stack((angles.sin(), angles.cos()), dim=-1), "p i two -> p (i two)")
    return table[:, :d_model].to(dtype or torch.get_default_dtype())
