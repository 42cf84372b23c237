"""What an in-place edit did to an input: the protocol's functions never modify what they are given, and where one
does, the input's values before and after the call show the operation (``x /= temperature``, ``x -= x.max()``,
``x.masked_fill_(...)``, ``x.sort()`` into the input's own memory)."""

from __future__ import annotations

import numpy as np
import torch


def in_place_edit(before: torch.Tensor, after: torch.Tensor) -> str | None:
    """The operation that turns ``before`` into ``after`` where one simple one does (a scale, a shift per row, entries
    set to -inf, a sort along the last axis); None where none does."""
    if before.shape != after.shape or not (before.is_floating_point() and after.is_floating_point()):
        return None
    b = before.detach().cpu().double().numpy()
    a = after.detach().cpu().double().numpy()
    if b.size == 0:
        return None
    finite = np.isfinite(a) & np.isfinite(b)
    masked = np.isneginf(a) & np.isfinite(b)
    if masked.any() and np.array_equal(a[~masked], b[~masked]):
        return f"{int(masked.sum())} of its {a.size} entries were set to -inf in place (a filter's masked_fill_ on it)"
    scale = b != 0
    if (scale & finite).any():
        ratios = a[scale & finite] / b[scale & finite]
        r = float(np.median(ratios))
        if r == 0 and np.allclose(a, 0):
            return "it was set to zero in place (x.zero_(), or x.mul_(0), on the caller's tensor)"
        if r not in (0, 1) and np.allclose(ratios, r, rtol=1e-9, atol=0) and np.allclose(a[~scale], 0):
            return (
                f"it was scaled in place by {r:.6g} (divided by {1 / r:.6g}: x /= temperature, or x.div_(...) on the "
                "caller's tensor)"
            )
    if b.ndim >= 1 and finite.all():
        shift = a - b
        per_row = shift[..., :1]
        if not np.allclose(per_row, 0) and np.allclose(shift, per_row, rtol=0, atol=1e-9 * (1 + np.abs(b).max())):
            return "each row was shifted in place by a constant (x -= x.max(dim, keepdim=True) on the caller's tensor)"
    if b.ndim >= 1 and np.array_equal(np.sort(b, axis=-1), np.sort(a, axis=-1)):
        return "its entries were reordered in place along the last axis (a sort written into the input's memory)"
    return None
