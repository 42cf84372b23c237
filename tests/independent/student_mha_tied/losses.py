"""cross_entropy and lm_loss."""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits shape {tuple(logits.shape)} does not match targets shape {tuple(targets.shape)}")
    m = logits.max(dim=-1, keepdim=True).values
    shifted = logits - m
    logsumexp = torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))
    log_probs = shifted - logsumexp
    keep = targets != ignore_index
    safe_targets = torch.where(keep, targets, torch.zeros_like(targets))
    picked = log_probs.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
    nll = -picked * keep.to(logits.dtype)
    return nll.sum() / keep.sum().to(logits.dtype)


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return cross_entropy(logits[:, :-1], ids[:, 1:])
