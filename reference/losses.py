"""Token-level losses: cross-entropy and the next-token language-model loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Stable ``log softmax``: ``x - max - log(sum(exp(x - max)))``."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    return shifted - shifted.exp().sum(dim=dim, keepdim=True).log()


def check_targets(logits: torch.Tensor, targets: torch.Tensor) -> None:
    """Targets ``[...]`` must index the rows of logits ``[..., V]``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"cross_entropy: logits {tuple(logits.shape)} need targets shaped {tuple(logits.shape[:-1])}, "
            f"got {tuple(targets.shape)}"
        )


def token_nll(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token negative log-likelihood ``[...]`` (0 where ignored), from logits ``[..., V]``."""
    check_targets(logits, targets)
    keep = targets != ignore_index
    safe = torch.where(keep, targets, torch.zeros_like(targets))
    logp = log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    nll = -logp.gather(-1, safe[..., None])[..., 0]
    return torch.where(keep, nll, torch.zeros_like(nll))


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, *, fused: bool = False
) -> torch.Tensor:
    """Mean NLL over the non-ignored targets; a 0-dim tensor.

    logits: ``[N, V]`` or ``[..., V]``; targets: long ``[N]`` or ``[...]`` (``ignore_index`` skipped).
    Stable for logits near ±1e4. All targets ignored gives NaN (0/0), as ``F.cross_entropy``.
    ``fused`` (the training step's fast path): PyTorch's ``F.cross_entropy``, the same value to rounding.
    """
    if fused:
        check_targets(logits, targets)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(
            rearrange(logits, "... v -> (...) v"), rearrange(targets, "... -> (...)"), ignore_index=ignore_index
        )
    nll = token_nll(logits, targets, ignore_index)
    return nll.sum() / (targets != ignore_index).sum()


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token loss: position ``t`` predicts ``ids[:, t+1]``.

    logits: ``[B, T, V]``; ids: ``[B, T]``. Equals ``cross_entropy(logits[:, :-1], ids[:, 1:])``.
    """
    if logits.shape[:2] != ids.shape:
        raise ValueError(f"lm_loss: logits {tuple(logits.shape)} and ids {tuple(ids.shape)} disagree on [B, T]")
    return cross_entropy(logits[:, :-1], ids[:, 1:])  # as the protocol states it: [B, T-1, V] against [B, T-1]
