"""Catalogued mistakes in left-padded batches (protocol v2, capability ``attention_mask``, ``reference/padding.py``)."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION

PADDED = GENERATION + FORWARD + CACHE

BUGS = (
    Bug(
        "padding_mask_kept_integer",
        "padding",
        PADDED,
        "padding.py",
        old="    real = mask.to(torch.bool)\n",
        new="    real = mask\n",
        explanation="the padding mask keeps the caller's dtype: an integer 0/1 mask reaches masked_fill and the "
        "bitwise ~, which need bool (a bool mask runs)",
        fix="real = attention_mask.to(torch.bool): the protocol takes a mask of any integer or bool dtype",
        code="crash",
    ),
    Bug(
        "positions_from_padded_start",
        "padding",
        PADDED,
        "padding.py",
        old="    return (real.long().cumsum(dim=-1) - 1).clamp(min=0)",
        new="    return torch.arange(real.shape[-1], device=real.device).expand(real.shape)",
        explanation="positions are the column index of the padded batch, so a row's first real token sits at its "
        "padding length instead of 0 (gpt2's learned positions differ; RoPE's cached keys are rotated too far)",
        fix="positions = cumsum(attention_mask, -1) - 1 per row (as Hugging Face derives position_ids from the mask)",
        code="knob:position_offset",
    ),
    Bug(
        "padding_keys_not_masked",
        "padding",
        PADDED,
        "padding.py",
        old='    allowed = rearrange(real, "b tk -> b 1 1 tk") | itself',
        new='    allowed = torch.ones_like(rearrange(real, "b tk -> b 1 1 tk")) | itself',
        explanation="the attention mask is causal only: real tokens attend the padding before them",
        fix="mask every key whose attention_mask is 0, for every query",
        code="mask",
    ),
    Bug(
        "padding_mask_on_queries",
        "padding",
        PADDED,
        "padding.py",
        old='    allowed = rearrange(real, "b tk -> b 1 1 tk") | itself',
        new='    allowed = rearrange(real[:, -t_q:], "b tq -> b 1 tq 1") | itself',
        explanation="the padding mask is applied to the queries (rows of the scores) instead of the keys "
        "(columns): padded queries are masked and real ones still attend the padding",
        fix="broadcast attention_mask over the key axis: mask[:, None, None, :] against scores [B, H, T_q, T_k]",
        code="mask",
    ),
    Bug(
        "mask_dropped_in_cached_steps",
        "padding",
        PADDED,
        "generation.py",
        old="                logits = model(ids[:, -1:], cache, **padded(mask))",
        new="                logits = model(ids[:, -1:], cache)",
        explanation="generate passes attention_mask to the prefill only: each cached step's new token attends the "
        "cached padding keys and takes its position from the cache length",
        fix="pass the whole mask (cached + new, grown by a 1 per new token) to every cached forward",
        code="knob:cache_contents",
    ),
    Bug(
        "cached_positions_from_cache_length",
        "padding",
        PADDED,
        "model.py",
        old="            positions = padded_positions(real)[:, start:] if positions is None else positions",
        new="            positions = padded_positions(real)[:, start:] if positions is None and not start "
        "else positions",
        explanation="with a cache, positions continue from the cache length (padding included), not from each "
        "row's real-token count, so decoded tokens of padded rows sit too far from their prompt",
        fix="positions of new tokens = cumsum(attention_mask over cached + new) - 1, the last T of them",
        code="knob:position_offset",
    ),
    Bug(
        "right_padding_accepted",
        "padding",
        PADDED,
        "padding.py",
        old="    if after_real.any():",
        new="    if False:",
        explanation="a mask with a 0 after a 1 (right padding, a hole) is accepted, and its rows are silently "
        "computed with positions and masks the protocol does not define",
        fix="raise ValueError naming the row when a 0 follows a 1: only left padding is supported",
    ),
)
