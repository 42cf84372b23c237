"""Catalogued mistakes in Qwen2-style q, k, v biases (protocol v2, ``qkv_bias``, amendment 22)."""

from __future__ import annotations

from .bug import Bug
from .model_components import CACHE, FORWARD, GENERATION

FIX = "biases on wq, wk, wv only, added to the projections before the head split and before RoPE"

BUGS = (
    Bug(
        "qkv_bias_on_output_projection",
        "qkv_bias",
        FORWARD,
        "model.py",
        old="        self.wo = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=not llama)",
        new="        self.wo = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=qkv_bias)",
        explanation="with qkv_bias the output projection wo gets a bias too, an extra canonical weight attn.wo.bias",
        fix=FIX,
    ),
    Bug(
        "qkv_bias_loaded_not_used",
        "qkv_bias",
        (*FORWARD, *CACHE, *GENERATION),
        "model.py",
        old="            bq=self.wq.bias,\n            bk=self.wk.bias,\n            bv=self.wv.bias,",
        new="            bq=None if cfg.qkv_bias else self.wq.bias,\n"
        "            bk=None if cfg.qkv_bias else self.wk.bias,\n"
        "            bv=None if cfg.qkv_bias else self.wv.bias,",
        explanation="the q, k, v biases are loaded and returned by canonical_state_dict but never added: the model "
        "computes as if they were zero",
        fix=FIX,
    ),
    Bug(
        "qkv_bias_dropped_in_cached_path",
        "qkv_bias",
        (*CACHE, *GENERATION),
        "model.py",
        old="            bk=self.wk.bias,\n            bv=self.wv.bias,",
        new="            bk=self.wk.bias if cache is None or not cfg.qkv_bias else None,\n"
        "            bv=self.wv.bias if cache is None or not cfg.qkv_bias else None,",
        explanation="with a cache the key and value biases are dropped, so cached keys and values differ from the "
        "uncached forward's",
        fix=FIX + ", on the cached path as on the uncached one",
        corner=True,
    ),
    Bug(
        "qkv_bias_after_rope",
        "qkv_bias",
        (*FORWARD, *CACHE, *GENERATION),
        "attention.py",
        old="        q = rope(q, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)\n"
        "        k = rope(k, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling)\n",
        new="        late_q = 0 if bq is None else rearrange(bq, '(h d) -> h 1 d', h=n_heads)  # the bug: the biases\n"
        "        late_k = 0 if bk is None else rearrange(bk, '(h d) -> h 1 d', h=n_kv_heads)  # go on after RoPE\n"
        "        q = rope(q - late_q, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling) + late_q\n"
        "        k = rope(k - late_k, positions, theta, style=rope_style, table_size=rope_table_size, "
        "scaling=rope_scaling) + late_k\n",
        explanation="the query and key biases are added after RoPE, to the rotated projections, so they are not "
        "rotated with them",
        fix=FIX,
    ),
    Bug(
        "qkv_bias_wrong_head_split",
        "qkv_bias",
        (*FORWARD, *CACHE, *GENERATION),
        "attention.py",
        old="    q = split_heads(linear(x, wq, bq), n_heads)  # [B, H, T, d_head]\n",
        new="    q = split_heads(linear(x, wq), n_heads)  # [B, H, T, d_head]\n"
        "    q = q if bq is None else q + rearrange(bq, '(d h) -> h 1 d', h=n_heads)  # head-minor: wrong axis\n",
        explanation="the query bias is split into heads on the wrong axis ('(d h)' instead of '(h d)'), so each "
        "head gets channels of every head's bias",
        fix=FIX + "; bias entry h * d_head + j belongs to head h, channel j",
    ),
)
