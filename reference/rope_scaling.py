"""RoPE scaling for long context (protocol v2, capability ``rope_scaling``), in Hugging Face's conventions.

A scaling is a dict like Hugging Face's ``config.rope_scaling``: ``{"rope_type": <type>, ...}`` (``"type"`` is
accepted for ``"rope_type"``, as in older configs). It changes the inverse frequencies of the pairs (and, for
YaRN, multiplies cos and sin by an attention factor):

- ``"linear"`` (``factor``): every frequency divided by ``factor`` (positions interpolated, ``p / factor``);
- ``"dynamic"`` (``factor``, ``original_max_position_embeddings``): NTK-aware, by sequence length ``L``:
  ``theta' = theta * (factor * L / L0 - (factor - 1)) ** (d / (d - 2))`` with ``L = max(seq_len, L0)``,
  ``L0 = original_max_position_embeddings``, ``seq_len = max(positions) + 1`` (unchanged up to ``L0``);
- ``"llama3"`` (``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``):
  the wavelength rule of Llama 3.1: wavelengths ``2 pi / f`` shorter than ``L0 / high_freq_factor`` keep
  ``f``, longer than ``L0 / low_freq_factor`` become ``f / factor``, and those between are interpolated with
  ``s = (L0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
  ``(1 - s) f / factor + s f``;
- ``"yarn"`` (``factor``, ``original_max_position_embeddings``, ``beta_fast`` 32, ``beta_slow`` 1, optional
  ``attention_factor``, ``mscale``, ``mscale_all_dim``, ``truncate`` True): frequencies blended between ``f``
  and ``f / factor`` by a linear ramp over the pairs between the correction dimensions of ``beta_fast`` and
  ``beta_slow`` rotations; cos and sin multiplied by ``attention_factor`` (default ``0.1 ln(factor) + 1``,
  the "mscale").

Everything is computed in float64 from the formulas of ``transformers.modeling_rope_utils``.
"""

from __future__ import annotations

import math

import torch

ROPE_SCALING_TYPES = ("linear", "dynamic", "llama3", "yarn")
_KEYS = {
    "linear": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
}
_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}


def check_rope_scaling(scaling: dict | None, context_length: int | None = None) -> dict | None:
    """A validated copy of ``scaling`` with ``"rope_type"`` set, or None for no scaling (None or ``"default"``).

    ``context_length`` (a model config): the default of ``original_max_position_embeddings``, as Hugging Face
    falls back to ``max_position_embeddings``. Bad dicts raise ``ValueError`` naming the key or value.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {scaling!r}")
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None)
    scaling.pop("type", None)
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"rope_scaling rope_type must be one of {ROPE_SCALING_TYPES}, got {kind!r}")
    unknown = sorted(set(scaling) - _KEYS[kind])
    if unknown:
        raise ValueError(f"rope_scaling of type {kind!r} does not take {unknown}; it takes {sorted(_KEYS[kind])}")
    if context_length is not None and kind != "linear":
        scaling.setdefault("original_max_position_embeddings", context_length)
    missing = [k for k in _REQUIRED[kind] if scaling.get(k) is None]
    if missing:
        raise ValueError(f"rope_scaling of type {kind!r} needs {missing}, got {scaling}")
    factor = scaling["factor"]
    if not isinstance(factor, (int, float)) or factor < 1:
        raise ValueError(f"rope_scaling factor must be a number >= 1, got {factor!r}")
    original = scaling.get("original_max_position_embeddings")
    if original is not None and (not isinstance(original, int) or original < 1):
        raise ValueError(f"rope_scaling original_max_position_embeddings must be an int >= 1, got {original!r}")
    if kind == "llama3" and scaling["low_freq_factor"] == scaling["high_freq_factor"]:
        raise ValueError(f"rope_scaling llama3 needs low_freq_factor != high_freq_factor, got {scaling}")
    return {"rope_type": kind, **scaling}


def freeze(scaling: dict | None) -> tuple | None:
    """A hashable form of a checked scaling (for cached tables)."""
    return None if scaling is None else tuple(sorted(scaling.items()))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(rotations: float, d_head: int, theta: float, original: int) -> float:
    """The pair index (as a dimension) that turns ``rotations`` times over ``original`` positions."""
    return d_head * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def scaled_frequencies(
    d_head: int, theta: float, scaling: dict | None, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies float64 ``[d_head/2]`` and the factor on cos and sin, for a checked ``scaling``.

    ``seq_len``: the sequence length ``max(positions) + 1`` (used by ``"dynamic"`` only).
    """
    if d_head % 2:
        raise ValueError(f"RoPE needs an even head dimension, got d_head={d_head}")
    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head
    if scaling is None:
        return theta ** (-exponents), 1.0
    kind, factor = scaling["rope_type"], float(scaling["factor"])
    base = theta ** (-exponents)
    if kind == "linear":
        return base / factor, 1.0
    original = scaling["original_max_position_embeddings"]
    if kind == "dynamic":
        if d_head <= 2:
            raise ValueError(f"dynamic rope_scaling needs d_head > 2 (its exponent is d/(d-2)), got d_head={d_head}")
        length = max(original if seq_len is None else seq_len, original)
        new_theta = theta * (factor * length / original - (factor - 1)) ** (d_head / (d_head - 2))
        return new_theta ** (-exponents), 1.0
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        low_freq_wavelen, high_freq_wavelen = original / low, original / high
        wavelen = 2 * math.pi / base
        smooth = (original / wavelen - low) / (high - low)
        interpolated = (1 - smooth) * base / factor + smooth * base
        freqs = torch.where(wavelen > low_freq_wavelen, base / factor, base)
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(medium, interpolated, freqs), 1.0
    # yarn
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    low = _yarn_correction_dim(beta_fast, d_head, theta, original)
    high = _yarn_correction_dim(beta_slow, d_head, theta, original)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no division by zero
    ramp = ((torch.arange(d_head // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the frequency (fast pairs), 0: divide it by factor (slow pairs)
    return base / factor * (1 - extrapolate) + base * extrapolate, float(attention)
