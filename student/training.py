"""The tiny training loop (random windows, AdamW, gradient clipping) and token-weighted evaluation."""

from __future__ import annotations

import torch
import torch.nn as nn


def get_batch(data, batch_size: int, context_length: int, generator=None, device="cpu"):
    """Random training windows from a 1-D token array -> ``(x, y)``.

    Shapes::

        data:   1-D numpy array or tensor of token ids, length N
        x, y:   long [batch_size, context_length] on ``device``
                x[b] = data[s_b : s_b + context_length]
                y[b] = data[s_b + 1 : s_b + context_length + 1]   (x shifted one token ahead)

    Starts ``s_b`` are drawn uniformly from ``[0, N - context_length - 1]`` (both ends
    inclusive, every start reachable) using ``generator`` (a ``torch.Generator``; same seed ->
    same batch). ``N < context_length + 1`` (no full window plus its target) -> ``ValueError``
    naming the numbers.

    Classic bugs to avoid:
    - off-by-one on the last start: ``torch.randint``'s upper bound is exclusive, so the bound is
      ``N - context_length``; one less never samples the last window, one more reads past the end;
    - ``y`` must be ``x`` shifted by one, not a copy of ``x``.
    """
    raise NotImplementedError("get_batch")


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    max_grad_norm: float | None = None,
) -> float:
    """One optimisation step on a batch -> the loss (a Python ``float``) *before* the step.

    ``x, y``: long ``[B, T]``; ``y`` is already shifted (``y[:, t]`` is the target of ``x[:, t]``).
    Steps: put the model in training mode; zero the gradients; logits ``[B, T, V]``; mean
    cross-entropy against ``y``; backward; if ``max_grad_norm`` is given, clip the global
    gradient norm over all parameters to it (``torch.nn.utils.clip_grad_norm_``); step.

    Classic bugs to avoid:
    - ``y`` is pre-shifted: do NOT shift again (``lm_loss(logits, y)`` would predict two ahead);
    - forgetting ``optimizer.zero_grad()`` -- gradients accumulate across steps;
    - clipping before ``backward()`` or after ``step()`` (it must sit between them), or per
      parameter instead of by the global norm;
    - returning the tensor (keeps the graph alive) instead of ``loss.item()``.
    """
    raise NotImplementedError("train_step")


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
    """The tiny training loop -> the list of ``steps`` per-step losses.

    AdamW with learning rate ``lr`` over all parameters; each step a fresh ``get_batch`` of
    ``data`` on the model's device, then ``train_step`` with ``max_grad_norm``.
    Deterministic for a seed: two runs from the same initial weights and ``seed`` return the same
    losses -- seed a ``torch.Generator`` for the batches and seed torch's RNG for dropout.
    On a tiny repetitive corpus the loss should fall well below its starting value.

    Classic bug to avoid: drawing batches from the global RNG without seeding it, so two runs
    with the same seed differ.
    """
    raise NotImplementedError("train")


def evaluate(model: nn.Module, data, context_length: int, batch_size: int = 8) -> dict:
    """Mean next-token loss over all of ``data``, and its perplexity.

    Returns ``{"loss": float, "perplexity": float}``.

    Windows are consecutive and non-overlapping, starting at 0, ``context_length`` apart; each
    window of inputs ``data[s : s + n]`` predicts ``data[s + 1 : s + n + 1]``, and the last
    window is shorter so that every one of the ``len(data) - 1`` predictable tokens is predicted
    exactly once. Windows are run ``batch_size`` at a time.
    ``loss = total NLL / number of predicted tokens``; ``perplexity = exp(loss)``.
    No dropout, no gradients, and the model's mode is restored afterwards.
    Fewer than 2 tokens -> ``ValueError``.

    Classic bugs to avoid:
    - evaluate is token-weighted: averaging per-batch (or per-window) mean losses gives the
      short last window the weight of a full one;
    - perplexity is ``exp`` of the mean loss, not the mean of per-batch perplexities;
    - leaving the model in ``eval()`` mode (or forcing ``train()``) afterwards -- restore
      whatever mode it had; and no dropout while evaluating.
    """
    raise NotImplementedError("evaluate")
