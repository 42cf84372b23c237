"""Catalogued mistakes in sliding-window attention (protocol v2, ``sliding_window``, amendment 27)."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION

MHA = "multihead_self_attention"
FIX = "in a sliding layer query i attends the keys j with i - W < j <= i (W keys, itself included); full layers none"

BUGS = (
    Bug(
        "rotating_buffer_read_in_slot_order",
        "sliding_window",
        (*CACHE, *GENERATION),
        "attention.py",
        old="    if window is not None:  # protocol v2 (sliding_window): the causal mask narrowed to the last `window` "
        "keys",
        new="""    if window is not None and cache is not None and k.shape[-2] - q.shape[-2] > window:  # the bug: a
        cached = k.shape[-2] - q.shape[-2]  # rotating buffer of `window` slots read back in slot order
        held = sorted(range(cached - window, cached), key=lambda p: p % window)
        order = torch.tensor(held + list(range(cached, k.shape[-2])), device=k.device)
        k, v = k[..., order, :], v[..., order, :]
    if window is not None:  # protocol v2 (sliding_window): the causal mask narrowed to the last `window` keys""",
        explanation="a cache of sliding_window slots (position p at slot p % W) is read back in slot order once it "
        "has wrapped, while the mask is built for time order (mistral-inference's unrotate)",
        fix="read a wrapped buffer back in time order, the oldest slot first",
    ),
    Bug(
        "window_mask_python_and",
        "sliding_window",
        ("causal_mask", MHA, *FORWARD, *CACHE, *GENERATION),
        "attention.py",
        old="        return (k_pos <= q_pos) & (q_pos - k_pos < window)",
        new="        return (k_pos <= q_pos) and (q_pos - k_pos < window)",
        explanation="the causal and window conditions are combined with Python's and, which takes the truth value "
        "of a tensor of several values: every windowed mask raises",
        fix="combine the two boolean tensors elementwise: (k_pos <= q_pos) & (q_pos - k_pos < window)",
        code="crash",
    ),
    Bug(
        "sliding_window_off_by_one",
        "sliding_window",
        ("causal_mask", MHA, *FORWARD, *CACHE, *GENERATION),
        "attention.py",
        old="        return (k_pos <= q_pos) & (q_pos - k_pos < window)",
        new="        return (k_pos <= q_pos) & (q_pos - k_pos <= window)",
        explanation="the window keeps keys with i - j <= W: W + 1 keys, one older than the window holds",
        fix=FIX,
    ),
    Bug(
        "sliding_window_top_left",
        "sliding_window",
        ("causal_mask", MHA, *CACHE, *GENERATION),
        "attention.py",
        old="        return (k_pos <= q_pos) & (q_pos - k_pos < window)",
        new="        return (k_pos <= q_pos) & (q_pos - (t_k - t_q) - k_pos < window)",
        explanation="the window's distance is counted from the query's row in this call, not from its position "
        "after the cached keys: right for a whole sequence, too wide for every query that follows a cache",
        fix=FIX + "; with t_q queries after t_k - t_q cached keys query i is at i + (t_k - t_q)",
        corner=True,
    ),
    Bug(
        "sliding_window_on_every_layer",
        "sliding_window",
        (*FORWARD, *CACHE, *GENERATION),
        "model.py",
        old="        window = cfg.layer_window(layer)",
        new="        window = cfg.sliding_window",
        explanation="layer_types is ignored: every layer is windowed, the 'full_attention' ones too",
        fix=FIX + "; read each layer's type from layer_types",
    ),
    Bug(
        "sliding_window_not_on_cached_path",
        "sliding_window",
        (*CACHE, *GENERATION),
        "model.py",
        old="        window = cfg.layer_window(layer)",
        new="        window = cfg.layer_window(layer) if cache is None else None",
        explanation="the window is applied without a cache only: cached forwards and generation attend every "
        "earlier key",
        fix=FIX + ", on the cached path as on the uncached one",
        corner=True,
    ),
    Bug(
        "sliding_window_cache_drops_one_too_many",
        "sliding_window",
        (*CACHE, *GENERATION),
        "attention.py",
        old="        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]\n",
        new="        k, v = cache.update(layer, k, v)  # [B, Hkv, T_cached + T, d_head]\n"
        "        if window is not None:  # a rolling cache of W - 2 entries: one too few\n"
        "            keep = max(window - 2, 0) + x.shape[1]\n"
        "            k, v = k[..., -keep:, :], v[..., -keep:, :]\n",
        explanation="a rolling cache keeps the last W - 2 keys and values, so the oldest key of a new query's "
        "window is gone",
        fix=FIX + "; a rolling cache keeps at least the last W - 1 entries (the new query is the W-th)",
        corner=True,
    ),
    Bug(
        "sliding_window_ignored",
        "sliding_window",
        (*FORWARD, *CACHE, *GENERATION),
        "model.py",
        old='        windowed = {} if window is None else {"window": window}',
        new="        windowed = {}",
        explanation="sliding_window is read from the config and never applied: every layer attends every earlier key",
        fix=FIX,
    ),
)
