"""Training loop and evaluation."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from .losses import cross_entropy
from .model import forward


def _as_tensor(data):
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data.astype(np.int64))
    return torch.as_tensor(data).long()


def get_batch(data, batch_size: int, context_length: int, generator=None, device="cpu"):
    data = _as_tensor(data)
    n = data.shape[0]
    if n < context_length + 1:
        raise ValueError(f"need at least context_length + 1 = {context_length + 1} tokens, got {n}")
    starts = torch.randint(0, n - context_length, (batch_size,), generator=generator)
    x = torch.stack([data[s : s + context_length] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + context_length] for s in starts.tolist()])
    return x.to(device), y.to(device)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    max_grad_norm: float | None = None,
) -> float:
    model.train()
    optimizer.zero_grad()
    logits = forward(model, x)
    loss = cross_entropy(logits, y)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def train(
    model: nn.Module,
    data,
    steps: int,
    batch_size: int,
    context_length: int,
    lr: float = 1e-3,
    max_grad_norm: float = 1.0,
    seed: int = 0,
) -> list[float]:
    torch.manual_seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        x, y = get_batch(data, batch_size, context_length, generator=gen, device=device)
        losses.append(train_step(model, optimizer, x, y, max_grad_norm))
    return losses


def evaluate(model: nn.Module, data, context_length: int, batch_size: int = 8) -> dict:
    data = _as_tensor(data)
    n = data.shape[0]
    if n < 2:
        raise ValueError(f"evaluate needs at least 2 tokens, got {n}")
    device = next(model.parameters()).device
    windows = []
    s = 0
    while s < n - 1:
        length = min(context_length, n - 1 - s)
        windows.append((s, length))
        s += context_length
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    total_nll = 0.0
    total_tokens = 0
    try:
        with torch.no_grad():
            # full windows in batches, the (maybe) shorter last one on its own
            full = [w for w in windows if w[1] == context_length]
            short = [w for w in windows if w[1] != context_length]
            groups = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
            groups += [[w] for w in short]
            for group in groups:
                x = torch.stack([data[s : s + L] for s, L in group]).to(device)
                y = torch.stack([data[s + 1 : s + 1 + L] for s, L in group]).to(device)
                logits = forward(model, x)
                loss = cross_entropy(logits, y)
                count = y.numel()
                total_nll += loss.item() * count
                total_tokens += count
    finally:
        for m, mode in modes:
            m.training = mode
    loss = total_nll / total_tokens
    return {"loss": loss, "perplexity": math.exp(loss)}
