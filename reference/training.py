"""The tiny training loop and token-weighted evaluation."""

from __future__ import annotations

import math

import numpy as np
import torch

from .losses import cross_entropy, token_nll
from .modes import eval_mode


def as_token_tensor(data) -> torch.Tensor:
    """A 1-D numpy array or tensor of token ids as a long tensor."""
    tokens = torch.from_numpy(np.asarray(data)) if not isinstance(data, torch.Tensor) else data
    if tokens.dim() != 1:
        raise ValueError(f"token data must be 1-D, got shape {tuple(tokens.shape)}")
    return tokens.long()


def get_batch(data, batch_size: int, context_length: int, generator=None, device="cpu"):
    """Random windows: ``x, y [batch_size, context_length]``, ``y`` is ``x`` shifted one token ahead.

    Starts are uniform over ``[0, len(data) - context_length - 1]``, every one reachable.
    """
    tokens = as_token_tensor(data)
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"get_batch: batch_size and context_length must be >= 1, got {batch_size}, {context_length}")
    if len(tokens) < context_length + 1:
        raise ValueError(
            f"get_batch: {len(tokens)} tokens is too little for context_length={context_length} "
            f"(need at least {context_length + 1})"
        )
    starts = torch.randint(0, len(tokens) - context_length, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(context_length)[None, :]
    x, y = tokens[offsets], tokens[offsets + 1]
    return x.to(device), y.to(device)


def train_step(model, optimizer, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float | None = None) -> float:
    """One step in training mode on pre-shifted targets ``y [B, T]``; returns the loss before it."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def train(
    model,
    data,
    steps: int,
    batch_size: int,
    context_length: int,
    lr: float = 1e-3,
    max_grad_norm: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """AdamW for ``steps`` steps on random windows of ``data``; deterministic for ``seed``.

    Returns the loss of every step.
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # dropout masks
        for _ in range(steps):
            x, y = get_batch(data, batch_size, context_length, generator, device)
            losses.append(train_step(model, optimizer, x, y, max_grad_norm))
    return losses


@torch.no_grad()
def evaluate(model, data, context_length: int, batch_size: int = 8) -> dict[str, float]:
    """Mean next-token loss over all of ``data`` and its perplexity.

    Consecutive non-overlapping windows start at 0, ``context_length`` apart (the last one
    shorter); ``loss`` = total NLL / number of predicted tokens (``len(data) - 1``), so a short
    last window weighs by its tokens, not as a whole batch. No dropout, no gradients, mode restored.
    """
    tokens = as_token_tensor(data)
    if len(tokens) < 2:
        raise ValueError(f"evaluate: need at least 2 tokens, got {len(tokens)}")
    if context_length < 1 or batch_size < 1:
        raise ValueError(f"evaluate: context_length and batch_size must be >= 1, got {context_length}, {batch_size}")
    device = next(model.parameters()).device
    n_pred = len(tokens) - 1
    full = n_pred // context_length
    windows = [(s, context_length) for s in range(0, full * context_length, context_length)]
    if n_pred % context_length:
        windows.append((full * context_length, n_pred % context_length))
    total = torch.zeros((), dtype=torch.float64)
    with eval_mode(model):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            for length in sorted({n for _, n in group}):  # the short last window goes alone
                starts = torch.tensor([s for s, n in group if n == length])
                offsets = starts[:, None] + torch.arange(length)[None, :]
                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                total += token_nll(model(x), y).sum().double().cpu()
    loss = (total / n_pred).item()
    return {"loss": loss, "perplexity": math.exp(loss)}
