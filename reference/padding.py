"""Left-padded batches (protocol v2, capability ``attention_mask``, amendment 23).

``attention_mask`` is ``[B, T]`` of 0/1 over every token in view (cached and new): each row is zeros
(padding) and then ones (its tokens). A row's first real token is at position 0, and no query attends
a padding key. Padded queries attend only themselves, so their (unspecified) outputs stay finite and
never leak into a real token through a later layer.
"""

from __future__ import annotations

import torch
from einops import rearrange


def check_attention_mask(mask: torch.Tensor, batch: int, length: int, *, where: str = "forward") -> torch.Tensor:
    """``mask [B, T]`` of 0/1, left padding only, a real token in every row -> bool ``[B, T]``; else ValueError."""
    if tuple(mask.shape) != (batch, length):
        raise ValueError(
            f"{where}: attention_mask must be [B, T] = [{batch}, {length}] (batch, cached + new tokens), "
            f"got shape {tuple(mask.shape)}"
        )
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        raise ValueError(f"{where}: attention_mask must hold 0 and 1 only, got {mask[bad][0].item()!r}")
    real = mask.to(torch.bool)
    empty = ~real.any(dim=-1)
    if empty.any():
        row = int(torch.nonzero(empty)[0])
        raise ValueError(f"{where}: attention_mask row {row} is all zeros: every row needs a real token in view")
    after_real = real.cummax(dim=-1).values & ~real  # a 0 after a 1: right padding or a hole
    if after_real.any():
        row, t = (int(i) for i in torch.nonzero(after_real)[0])
        raise ValueError(
            f"{where}: attention_mask row {row} has a 0 at position {t} after a 1 ({mask[row].tolist()}): "
            "only left padding is supported (zeros before each row's tokens)"
        )
    return real


def padded_positions(real: torch.Tensor) -> torch.Tensor:
    """bool ``[B, T]`` -> long ``[B, T]``: the number of real tokens before each one (padding: 0)."""
    return (real.long().cumsum(dim=-1) - 1).clamp(min=0)


def key_mask(real: torch.Tensor, t_q: int) -> torch.Tensor:
    """bool ``[B, T_k]`` -> bool ``[B, 1, T_q, T_k]`` (True = may attend): real keys, and each query itself.

    The last ``t_q`` keys are the queries (bottom-right aligned, as the causal mask).
    """
    t_k = real.shape[-1]
    itself = torch.arange(t_k, device=real.device)[None, :] == torch.arange(t_k - t_q, t_k, device=real.device)[:, None]
    allowed = rearrange(real, "b tk -> b 1 1 tk") | itself
    return allowed
