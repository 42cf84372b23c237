"""Elementwise and lookup building blocks: ``linear``, ``embedding``, ``softmax``, ``silu``.

Everything else in the course is composed from these four, so get them right first.
Rules that hold for every function you write in ``student/``:

- inputs are ``torch.Tensor`` on CPU or CUDA, float32 or float64 (tests compare against
  float64 ground truth), and are never modified in place;
- you may add private helpers (``_like_this``) to any module; keep the public names and
  signatures exactly as they are here.
"""

from __future__ import annotations

import torch


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """An affine map: ``y = x @ weight.T (+ bias)``.

    Shapes::

        x:      [..., d_in]        any number of leading axes
        weight: [d_out, d_in]      PyTorch's layout: [out_features, in_features]
        bias:   [d_out] or None
        return: [..., d_out]

    Classic bug to avoid: using ``x @ weight`` -- the weight is stored ``[out, in]``, so it must
    be transposed. (With a square weight the wrong version runs and is silently wrong.)
    """
    raise NotImplementedError("linear")


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row lookup: token ``ids`` pick rows of the embedding table.

    Shapes::

        ids:    [...]              integer (long) token ids in [0, V)
        weight: [V, d]
        return: [..., d]           return[..., :] == weight[ids[...], :]

    Gradients must flow back into ``weight`` (only the rows that were looked up get gradient).
    Classic bug to avoid: building a one-hot matrix of float ids -- ids are integers; index
    the table directly.
    """
    raise NotImplementedError("embedding")


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Numerically stable softmax along ``dim``: ``exp(x) / sum(exp(x))``.

    Shapes: ``x`` any shape; the result has ``x``'s shape and sums to 1 along ``dim``.
    Must stay finite for inputs near +-1e4 (``exp(1e4)`` overflows to ``inf``).
    ``-inf`` entries (masked positions) get probability exactly 0. A row that is entirely
    ``-inf`` is unspecified (NaN is acceptable).

    Classic bug to avoid: exponentiating the raw values -- subtract the row max (over ``dim``,
    keepdim) before ``exp``; the result is mathematically the same and never overflows.
    """
    raise NotImplementedError("softmax")


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU (a.k.a. swish), elementwise: ``x * sigmoid(x)``.

    Shapes: any -> same shape.
    Classic bug to avoid: returning ``sigmoid(x)`` alone -- SiLU multiplies by ``x``.
    """
    raise NotImplementedError("silu")
