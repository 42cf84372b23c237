"""Batches, one optimisation step, the tiny training loop and token-weighted evaluation."""

from __future__ import annotations

import math

import numpy as np
import torch

from .api import forward
from .ops import cross_entropy


def _as_tensor(data) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data.detach().to("cpu", torch.long).reshape(-1)
    return torch.as_tensor(np.asarray(data), dtype=torch.long).reshape(-1)


def get_batch(data, batch_size, context_length, generator=None, device="cpu"):
    tokens = _as_tensor(data)
    n_starts = tokens.numel() - context_length
    if n_starts < 1:
        raise ValueError(
            f"get_batch needs at least context_length + 1 = {context_length + 1} tokens, got {tokens.numel()}"
        )
    starts = torch.randint(0, n_starts, (batch_size,), generator=generator)
    offsets = torch.arange(context_length + 1)
    windows = tokens[starts.unsqueeze(1) + offsets]
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def train_step(model, optimizer, x, y, max_grad_norm=None):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = cross_entropy(forward(model, x), y)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return float(loss.detach())


def train(model, data, steps, batch_size, context_length, lr=1e-3, max_grad_norm=1.0, seed=0):
    torch.manual_seed(seed)  # dropout masks
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        x, y = get_batch(data, batch_size, context_length, generator=gen, device=device)
        losses.append(train_step(model, optimizer, x, y, max_grad_norm))
    return losses


def evaluate(model, data, context_length, batch_size=8):
    tokens = _as_tensor(data)
    n_pred = tokens.numel() - 1
    if n_pred < 1:
        raise ValueError(f"evaluate needs at least 2 tokens, got {tokens.numel()}")
    device = next(model.parameters()).device
    modes = {m: m.training for m in model.modules()}
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            starts = list(range(0, n_pred, context_length))
            full = [s for s in starts if s + context_length <= n_pred]
            rest = [s for s in starts if s + context_length > n_pred]
            groups = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
            groups += [[s] for s in rest]
            for group in groups:
                length = min(context_length, n_pred - group[0])
                x = torch.stack([tokens[s : s + length] for s in group]).to(device)
                y = torch.stack([tokens[s + 1 : s + 1 + length] for s in group]).to(device)
                loss = cross_entropy(forward(model, x), y)
                total += float(loss) * y.numel()
                count += y.numel()
    finally:
        for m, training in modes.items():
            m.training = training
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(loss)}
