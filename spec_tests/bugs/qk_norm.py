"""Catalogued mistakes in Qwen3-style per-head q/k norms (protocol v2, ``qk_norm``, amendment 24)."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION

FIX = (
    "rmsnorm(q, q_norm, norm_eps) and rmsnorm(k, k_norm, norm_eps) on each head's d_head channels, after the head "
    "split and before RoPE; v as projected"
)
ATTENTION = ("multihead_self_attention", *FORWARD, *CACHE, *GENERATION)
Q_NORM = "        q = rmsnorm(q, q_norm, norm_eps)\n"
K_NORM = "        k = rmsnorm(k, k_norm, norm_eps)\n"
ROPE_QK = (
    "        q = rope(q, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)\n"
    "        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)\n"
)

BUGS = (
    Bug(
        "qk_norm_unit_offset",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old=Q_NORM + "    if k_norm is not None:\n" + K_NORM,
        new="        q = rmsnorm(q, 1 + q_norm, norm_eps)  # the block norms' Gemma-style offset, copied\n"
        "    if k_norm is not None:\n"
        "        k = rmsnorm(k, 1 + k_norm, norm_eps)\n",
        explanation="the q and k norms' gains are 1 + weight, the Gemma-style offset of the block norms, where "
        "Qwen3's q/k norms use the weight itself",
        fix=FIX,
    ),
    Bug(
        "qk_norm_over_d_model",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old=Q_NORM + "    if k_norm is not None:\n" + K_NORM,
        new="        q = split_heads(rmsnorm(merge_heads(q), repeat(q_norm, 'd -> (h d)', h=n_heads), norm_eps), "
        "n_heads)\n"
        "    if k_norm is not None:\n"
        "        k = split_heads(rmsnorm(merge_heads(k), repeat(k_norm, 'd -> (h d)', h=n_kv_heads), norm_eps), "
        "n_kv_heads)\n",
        explanation="the q and k norms take one statistic over all heads' channels (d_model, the gain tiled per head), "
        "not one per head over d_head",
        fix=FIX,
    ),
    Bug(
        "qk_norm_after_rope",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old="    if q_norm is not None:  # protocol v2 (qk_norm, amendment 24): per head, over d_head, before RoPE\n"
        + Q_NORM
        + "    if k_norm is not None:\n"
        + K_NORM
        + "    if theta is not None:\n"
        "        if positions is None:\n"
        "            start = 0 if cache is None else cache.length\n"
        "            positions = torch.arange(start, start + x.shape[1], device=x.device)\n"
        "        if positions.dim() == 2:\n"
        '            positions = rearrange(positions, "b t -> b 1 t")  # broadcast over heads\n' + ROPE_QK,
        new="    if theta is not None:\n"
        "        if positions is None:\n"
        "            start = 0 if cache is None else cache.length\n"
        "            positions = torch.arange(start, start + x.shape[1], device=x.device)\n"
        "        if positions.dim() == 2:\n"
        '            positions = rearrange(positions, "b t -> b 1 t")  # broadcast over heads\n'
        + ROPE_QK
        + "    if q_norm is not None:  # after RoPE\n"
        + Q_NORM
        + "    if k_norm is not None:\n"
        + K_NORM,
        explanation="the q and k norms are applied after RoPE, so their gains scale channels RoPE has already mixed "
        "(the same only when every gain is 1)",
        fix=FIX,
    ),
    Bug(
        "qk_norm_on_values",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old=K_NORM,
        new=K_NORM + "        v = rmsnorm(v, k_norm, norm_eps)\n",
        explanation="the values are normalised too, with k_norm's weight: the attention output loses v's scale",
        fix=FIX,
    ),
    Bug(
        "qk_norm_keys_not_normalised",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old="    if k_norm is not None:\n" + K_NORM,
        new="",
        explanation="only the queries are normalised: k_norm is taken and ignored, the keys keep their scale",
        fix=FIX,
    ),
    Bug(
        "qk_norm_q_weight_for_keys",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old=K_NORM,
        new="        k = rmsnorm(k, q_norm, norm_eps)\n",
        explanation="the keys are normalised with q_norm's weight (a copy-paste slip), k_norm is never used",
        fix=FIX,
    ),
    Bug(
        "qk_norm_eps_outside_root",
        "qk_norm",
        ATTENTION,
        "attention.py",
        old=Q_NORM + "    if k_norm is not None:\n" + K_NORM,
        new="        q = q / (q.pow(2).mean(-1, keepdim=True).sqrt() + norm_eps) * q_norm\n"
        "    if k_norm is not None:\n"
        "        k = k / (k.pow(2).mean(-1, keepdim=True).sqrt() + norm_eps) * k_norm\n",
        explanation="the q/k norms are written inline with eps added to the root instead of inside it: "
        "x / (sqrt(mean(x**2)) + eps)",
        fix="x / sqrt(mean(x**2, -1) + norm_eps) * gain, as rmsnorm (or call rmsnorm)",
    ),
    Bug(
        "qk_norm_loaded_not_used",
        "qk_norm",
        (*FORWARD, *CACHE, *GENERATION),
        "model.py",
        old='            normed = {"q_norm": self.q_norm.weight, "k_norm": self.k_norm.weight, "norm_eps": '
        "cfg.norm_eps}",
        new='            normed = {"norm_eps": cfg.norm_eps}',
        explanation="the q and k norm weights are created, loaded and returned by canonical_state_dict, but never "
        "passed to the attention: the model computes as if qk_norm were off",
        fix=FIX,
    ),
    Bug(
        "qk_norm_dropped_when_decoding",
        "qk_norm",
        (*CACHE, *GENERATION),
        "model.py",
        old="        if cfg.qk_norm:\n            normed = {",
        new="        if cfg.qk_norm and (cache is None or cache.length == 0):\n            normed = {",
        explanation="the norms run on the uncached forward and the prefill only: a decoding step after cached tokens "
        "skips them, so its query and its new key are not normalised",
        fix=FIX + ", on every cached step as on the uncached forward",
        corner=True,
    ),
)
