"""Autoregressive generation: sample a token, append it, repeat (with or without the KV cache)."""

from __future__ import annotations

import torch
import torch.nn as nn


def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    *,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Extend ``prompt`` by ``max_new_tokens`` sampled tokens.

    Shapes: ``prompt long [B, T]`` (T >= 1) -> ``ids [B, T + max_new_tokens]``, starting with
    the prompt unchanged. Each step: logits of the last position -> ``sample(...,
    temperature, top_k, top_p, generator)`` -> append. ``max_new_tokens == 0`` returns the
    prompt; ``max_new_tokens < 0`` -> ``ValueError``.

    - No gradients (``torch.no_grad()``).
    - Runs without dropout whatever the module's mode, and leaves every submodule's mode as it
      found it (a model in ``train()`` mode is still in ``train()`` mode afterwards).
    - Conditions on the last ``context_length`` tokens: a longer prompt is cropped, and
      generation may run past the context, the window sliding along.
    - ``use_cache=True``: encode the prompt once, then feed one token per step through the
      cache. ``use_cache`` changes speed, never the result: greedy decoding gives identical ids
      either way.

    Classic bugs to avoid:
    - dropout off while generating (and restore the mode): call ``model.eval()`` and put the
      previous mode back afterwards (in a ``finally``), rather than ``model.train()``
      unconditionally;
    - crop prompts to the last context_length tokens (``ids[:, -context_length:]``), not the first;
    - once the sequence is longer than the context, every position in the window shifts by one
      each step, so cached keys (rotated at their old positions) are stale: re-encode the window
      (or drop the cache) rather than feeding past ``context_length`` cached tokens;
    - apply temperature and top-p before sampling (use ``sample``, not ``argmax`` of raw logits
      unless temperature is 0).

    Optional, protocol v2 (docs/protocol.md, amendment 23): a keyword-only ``attention_mask``,
    ``[B, T]`` of 0/1 for a left-padded prompt. Return the prompt as given (padding kept), then
    the new tokens; grow the mask by a 1 per new token and pass it whole (cached + new) to every
    ``forward``, cached steps included. Greedy decoding gives each row exactly the tokens it gets
    generated alone. Judged only with ``"attention_mask"`` in ``CAPABILITIES``.
    """
    raise NotImplementedError("generate")
