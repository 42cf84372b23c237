"""The statistics a norm actually used, read back from its output: a layernorm's output is affine in its input row
by row, ``y = (x - mean') * r' * weight + bias``, so each row's ``mean'`` and ``r'`` can be solved for exactly. Where
every row's ``mean'`` is its sum over another count than the row's ``n`` entries, that count is named: the padding of
a block loop's last, partial block counted (a Welford merge that weighs every block as full)."""

from __future__ import annotations

import numpy as np
import torch

from .cause import LOCAL, Cause


def _rows(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().reshape(-1, t.shape[-1]).numpy()


def norm_statistics_causes(name: str, named: dict, actual) -> list[Cause]:
    """For ``layernorm``: the mean each row's output subtracted, where it is the row's sum over one count ``m != n``
    for every row (one cause, naming ``m``); nothing otherwise."""
    if name != "layernorm" or not isinstance(actual, torch.Tensor):
        return []
    x, w, b = named.get("x"), named.get("weight"), named.get("bias")
    if not all(isinstance(t, torch.Tensor) for t in (x, w)) or actual.shape != x.shape or x.shape[-1] < 4:
        return []
    xs, ys = _rows(x), _rows(actual)
    wv, bv = w.detach().double().cpu().numpy(), (b.detach().double().cpu().numpy() if b is not None else 0.0)
    if np.any(np.abs(wv) < 1e-6) or not np.all(np.isfinite(ys)):
        return []
    z = (ys - bv) / wv  # = r' * x - r' * mean' per row
    n = x.shape[-1]
    counts = []
    for xr, zr in zip(xs, z, strict=True):
        design = np.stack([xr, np.ones_like(xr)], axis=1)
        (r, c), *_ = np.linalg.lstsq(design, zr, rcond=None)
        if not r or np.max(np.abs(design @ np.array([r, c]) - zr)) > 1e-6 * max(1.0, np.max(np.abs(zr))):
            return []  # not affine in the row: not a wrong statistic alone
        total = xr.sum()
        if abs(total) < 1e-3 * np.abs(xr).sum():
            continue  # a row summing to about 0 says nothing about the count
        counts.append(total / (-c / r))
    if len(counts) < 2:
        return []
    m = round(float(np.median(counts)))
    if m == n or m < 1 or not all(abs(k - m) <= 1e-6 * m for k in counts):
        return []
    return [
        Cause(
            "knob:norm_count",
            f"each row's mean is its sum divided by {m}, not by its {n} entries: the statistics count {m - n:+d} "
            "entries (zeros of a partial last block counted, as a block loop that weighs every block as full does)",
            where="the count of layernorm's mean (and variance) in a loop over blocks of the last axis",
            fix="count only the entries that exist: the last block's mask in the sums and in the count",
            evidence=f"the output solved row by row as (x - mean') * r' * weight + bias: mean' == sum(x) / {m} in "
            "every row",
            confidence=LOCAL,
        )
    ]
