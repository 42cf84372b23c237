"""Whether a non-finite output is an overflow of exp: the implementation's own call on its logits shifted.

A softmax, a log-softmax, a cross-entropy and the sampling distribution are unchanged when a constant is added to each
row of the logits (``Entry.shift_invariant``). Where the implementation gives inf or NaN where the specified output
is finite, and gives the specified output on the same logits with each row's maximum subtracted (a change the math
does not see), its exp overflowed on the large values: the max is not subtracted before exp. The evidence is the
implementation's own two calls, so the line is confident.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...protocol import SHIFT_INVARIANT
from ..judging.compare import mismatch


def shifted(name: str, run: Callable, args: tuple, kwargs: dict, actual, expected, tol) -> tuple[list, list]:
    """``(lines, codes)``: "exp overflowed", measured by ``run(*args)`` (the implementation's call of ``name``) on
    ``args[0]`` with each row's max along the last axis subtracted; ``([], [])`` where that is not what happened."""
    if name not in SHIFT_INVARIANT or not args or not isinstance(actual, torch.Tensor):
        return [], []
    logits = args[0]
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        return [], []
    dim = kwargs.get("dim", -1)
    if not isinstance(dim, int) or dim % logits.dim() != logits.dim() - 1:  # the shift is along the last axis only
        return [], []
    if not isinstance(expected, torch.Tensor) or not torch.isfinite(expected).all() or torch.isfinite(actual).all():
        return [], []
    top = logits.detach().amax(dim=-1, keepdim=True)
    if not torch.isfinite(top).all():
        return [], []
    try:
        out = run(logits - top, *args[1:])
    except Exception:  # noqa: BLE001 - a call that raises on the shifted logits says nothing here
        return [], []
    if not isinstance(out, torch.Tensor) or mismatch(out.detach().double(), expected, tol) is not None:
        return [], []
    bad = int((~torch.isfinite(actual)).sum())
    return [
        f"likely cause: {name} gives {bad} inf or NaN entries on these logits (up to {float(logits.abs().max()):.4g}) "
        "and the specified output on the same logits with each row's max subtracted, which the math does not see: "
        f"exp overflows on the large values. Fix: subtract each row's max before exp (or use torch.softmax / "
        f"log_softmax) (evidence: your own {name} on the shifted logits gives the specified output)"
    ], ["knob:max_subtraction"]
