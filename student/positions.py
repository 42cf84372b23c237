"""Positional information: rotary embeddings (RoPE, llama) and the sinusoidal table.

RoPE rotates pairs of channels of each query and key vector by the angle
``position * theta ** (-2i / d_head)`` for pair ``i`` (``i = 0 .. d_head/2 - 1``). Which channels
form pair ``i`` is the *style*, declared once in ``student/__init__.py`` as ``ROPE_STYLE``:

- ``"interleaved"``: pair ``i`` is channels ``(2i, 2i+1)`` (the RoFormer paper; the default);
- ``"half"``: pair ``i`` is channels ``(i, i + d_head/2)`` (GPT-NeoX / Hugging Face
  ``rotate_half``).

The two are the same model up to a permutation of the q/k weight rows; the spec suite checks
your code in the style you declare, so implement the one ``ROPE_STYLE`` names.

Rotating a pair ``(a, b)`` by angle ``phi``::

    a' = a * cos(phi) - b * sin(phi)
    b' = a * sin(phi) + b * cos(phi)

The gpt2 family does not use RoPE: it adds learned absolute position embeddings instead.
``sinusoidal_positions`` is the fixed table of "Attention Is All You Need", here for study.
"""

from __future__ import annotations

import torch


def rope(
    x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, *, scaling: dict | None = None
) -> torch.Tensor:
    """Rotary position embedding of queries or keys.

    Shapes::

        x:         [..., T, d_head]   e.g. [B, H, T, d_head]; d_head must be even
        positions: long [T], or broadcastable to x.shape[:-1] (e.g. [B, 1, T] for per-row positions)
        return:    [..., T, d_head]   a new tensor, same dtype as x

    Pair ``i`` (channels chosen by ``ROPE_STYLE``) of the vector at position ``p`` is rotated by
    ``p * theta ** (-2i / d_head)``. Position 0 is the identity. The rotation preserves each
    vector's norm, and ``rope(q, m) . rope(k, n)`` depends only on ``m - n``.

    Odd ``d_head`` -> ``ValueError`` naming the shape.
    Tip: compute the angles in float64 (positions up to thousands times small frequencies lose
    precision in float32), then rotate in x's dtype (at least float32).

    Classic bugs to avoid:
    - RoPE on q and k, never v (rotating values is a listed course bug);
    - frequency exponent ``-2i / d_head`` with ``d_head`` (per-head size), not ``d_model``;
    - mixing the two pairings (e.g. interleaved angles with ``rotate_half``);
    - with a KV cache, positions continue from the cache length -- a new token is not at 0.

    Optional, protocol v2 (docs/protocol.md, amendment 20): a keyword-only ``scaling=None``
    taking a Hugging Face ``rope_scaling`` dict, ``{"rope_type": ..., ...}``, which changes the
    inverse frequencies ``f_i`` for long context (``L0 = original_max_position_embeddings``):

    - ``"linear"``: ``f_i / factor`` (once: not on the positions as well);
    - ``"dynamic"``: ``theta' = theta * (factor * L / L0 - (factor - 1)) ** (d / (d - 2))`` with
      ``L = max(max(positions) + 1, L0)`` (the largest position, not the number of positions);
    - ``"llama3"``: wavelength ``2 pi / f_i`` above ``L0 / low_freq_factor`` -> ``f_i / factor``,
      below ``L0 / high_freq_factor`` -> ``f_i``, between -> ``(1 - s) f_i / factor + s f_i`` with
      ``s = (L0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``;
    - ``"yarn"``: a ramp between ``f_i`` and ``f_i / factor``, and cos/sin times the attention
      factor ``0.1 ln(factor) + 1`` (the "mscale": easy to forget).

    The skeleton declares ``"rope_scaling"`` in ``CAPABILITIES`` (``__init__.py``), so it is judged;
    remove it (or keep one type, ``"rope_scaling:llama3"``) to skip what you do not implement.
    """
    raise NotImplementedError("rope")


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """The fixed sinusoidal position table, ``[n_positions, d_model]``.

    ``pe[p, 2i]   = sin(p / 10000 ** (2i / d_model))``
    ``pe[p, 2i+1] = cos(p / 10000 ** (2i / d_model))``

    Even columns are sines, odd columns cosines, and columns ``2i`` and ``2i+1`` share one
    frequency. An odd ``d_model`` ends with a sine column. Return torch's default dtype
    (compute in float64 for accuracy). Row 0 is ``[0, 1, 0, 1, ...]``.

    Classic bug to avoid: ``concat([sin, cos])`` puts all sines first; the table interleaves
    them (``pe[:, 0::2] = sin``, ``pe[:, 1::2] = cos``).
    """
    raise NotImplementedError("sinusoidal_positions")
