"""The decoder-only transformer, both families: building it, its weights, its forward pass.

Config is a plain dict::

    vocab_size, context_length, d_model, n_layers, n_heads, d_ff,        (required)
    n_kv_heads (default n_heads), rope_theta (10000.0), norm_eps (1e-5),
    tie_embeddings (True), dropout (0.0), family ("llama" | "gpt2", default "llama")

- ``llama``: RMSNorm, RoPE on q/k, SwiGLU MLP, grouped-query attention, no biases anywhere.
- ``gpt2``: LayerNorm (with bias), learned absolute position embeddings added to the token
  embeddings, GELU (tanh) MLP, a bias on every projection.

Both are pre-norm (pre-LN)::

    x = tok_embeddings(ids) (+ pos_embeddings(positions) for gpt2)
    for each layer:
        x = x + attn(attn_norm(x))
        x = x + mlp(mlp_norm(x))
    logits = lm_head(final_norm(x))

A suggested layout (write it yourself; name your submodules as below and ``state_dict()``
already uses the canonical names, so ``canonical_state_dict`` needs no renaming)::

    class Transformer(nn.Module):
        tok_embeddings: nn.Embedding(V, d)
        pos_embeddings: nn.Embedding(context_length, d)       # gpt2 only
        layers: nn.ModuleList of Block
            Block.attn_norm, Block.mlp_norm: your RMSNorm / LayerNorm modules (weight [+ bias])
            Block.attn: Attention with wq, wk, wv, wo = nn.Linear(..., bias=(family == "gpt2"))
            Block.mlp:  SwiGLU (w_gate, w_up, w_down)  or  GeluMLP (w_fc, w_proj)
        final_norm
        lm_head: nn.Linear(d, V, bias=False)                  # tied: same Parameter as tok_embeddings
        config                                                # keep the parsed config around

Canonical weight names (``build_model`` takes them, ``canonical_state_dict`` returns them)::

    tok_embeddings.weight              [V, d]
    pos_embeddings.weight              [context_length, d]      gpt2 only
    layers.{i}.attn_norm.weight        [d]         (+ .bias gpt2)
    layers.{i}.attn.wq.weight          [n_heads*d_head, d]      (+ .bias gpt2, and for wk/wv/wo)
    layers.{i}.attn.wk.weight          [n_kv_heads*d_head, d]
    layers.{i}.attn.wv.weight          [n_kv_heads*d_head, d]
    layers.{i}.attn.wo.weight          [d, n_heads*d_head]
    layers.{i}.mlp_norm.weight         [d]         (+ .bias gpt2)
    llama: layers.{i}.mlp.w_gate.weight [d_ff, d], .w_up.weight [d_ff, d], .w_down.weight [d, d_ff]
    gpt2:  layers.{i}.mlp.w_fc.weight [d_ff, d] + .bias, layers.{i}.mlp.w_proj.weight [d, d_ff] + .bias
    final_norm.weight                  [d]         (+ .bias gpt2)
    lm_head.weight                     [V, d]      only when tie_embeddings is False

Protocol v2, capability ``qkv_bias`` (docs/protocol.md, amendment 22; Qwen2-style): config key ``qkv_bias``
(default False; llama only, on gpt2 raise ``ValueError`` naming it) gives wq, wk and wv a bias, and nothing
else (no ``attn.wo.bias``, no MLP bias)::

    layers.{i}.attn.wq.bias [n_heads*d_head], layers.{i}.attn.wk.bias, .wv.bias [n_kv_heads*d_head]

added to the projections before splitting heads and before RoPE, with the cache as without it. The skeleton
declares ``"qkv_bias"`` in ``CAPABILITIES`` (``__init__.py``); remove it to skip these tests.

Protocol v2, capabilities ``sliding_window`` and ``layer_types`` (amendment 27; Mistral, Gemma 2, Qwen2): config
keys ``sliding_window`` (an int ``W >= 1``, default None) and ``layer_types`` (default None: every layer
``"sliding_attention"`` when ``sliding_window`` is set, as Mistral; else a list of ``n_layers`` entries, each
``"sliding_attention"`` or ``"full_attention"``, as Hugging Face's configs). In a sliding layer the query at
position ``i`` attends the keys ``j`` with ``i - W < j <= i`` (W keys, itself included); a full layer is
plain causal attention. The cache of a sliding layer may keep only its last ``W - 1`` (or more) entries, but
positions keep counting every token, and cached logits must equal the uncached ones past the window.
``W < 1``, a ``layer_types`` of the wrong length, an unknown entry, or sliding layers without a window ->
``ValueError`` naming the value. The skeleton declares ``"sliding_window"`` and ``"layer_types"``; remove
``"layer_types"`` to have every layer windowed (Mistral), both to skip these tests.

Protocol v2, capability ``qk_norm`` (amendment 24; Qwen3-style): config key ``qk_norm`` (default False; llama
only, on gpt2 raise ``ValueError`` naming it) gives each attention layer two norm weights, ones when fresh::

    layers.{i}.attn.q_norm.weight [d_head], layers.{i}.attn.k_norm.weight [d_head]

(e.g. ``Block.attn.q_norm = RMSNorm(d_head)``), passed to ``multihead_self_attention(..., q_norm=, k_norm=,
norm_eps=config norm_eps)``: each query and key head is RMS-normalised over its own d_head channels before RoPE,
on the cached path too. The skeleton declares ``"qk_norm"``; remove it to skip these tests.

Protocol v2, capability ``logit_softcap`` (amendment 25; Gemma 2): config keys ``attn_logit_softcap`` and
``final_logit_softcap`` (default None; a number > 0, else ``ValueError`` naming the key). ``softcap(x) = cap *
tanh(x / cap)``: pass ``softcap=attn_logit_softcap`` to ``multihead_self_attention`` (scores capped before the
mask), and cap the logits after the LM head *inside the model*, so that ``train_step`` and ``evaluate``, which
run the model, see capped logits too. The skeleton declares ``"logit_softcap"``; remove it to skip these tests.

Protocol v2, the Gemma-style options (amendment 26), each its own capability and config key (default False; llama
only, on gpt2 raise ``ValueError`` naming it), declared by the skeleton; remove one to skip its tests:

- ``norm_offset``: every RMSNorm of the model multiplies by ``1 + weight``; the stored (canonical) weights are the
  offsets, ones that start at 0 (a gain of 1). Compute ``rmsnorm(x, 1 + weight)``, ``1 + weight`` in at least
  float32. Classic bug: ``rmsnorm(x, weight)``, which zeroes everything at initialisation.
- ``embed_scale``: multiply the looked-up token embeddings by ``sqrt(d_model)`` (as a tensor of the embeddings'
  dtype). The tied LM head uses the stored matrix: scale the lookup's output, never the shared weight.
- ``geglu``: the llama MLP with GELU instead of SiLU, ``(gelu_tanh(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T``,
  the tanh approximation (``F.gelu(x, approximate="tanh")``, as ``gelu_mlp``), on the gate only.
- ``post_norms`` (Gemma 2): two more norms per layer, ``layers.{i}.attn_post_norm.weight`` and
  ``layers.{i}.mlp_post_norm.weight`` ``[d]``, applied to each sublayer's output before the residual add::

      x = x + attn_post_norm(attn(attn_norm(x)))
      x = x + mlp_post_norm(mlp(mlp_norm(x)))

Protocol v2, capability ``moe`` (amendment 28; Mixtral): config keys ``n_experts`` (default 0: the dense MLP) and
``n_experts_per_token`` (top-k, an int in ``[1, n_experts]``; required with experts, else ``ValueError`` naming
the value; llama only, on gpt2 raise ``ValueError``). With ``n_experts = E`` each layer's MLP is a router and E
SwiGLU experts of width ``d_ff``, in place of ``mlp.w_gate``, ``mlp.w_up``, ``mlp.w_down``::

    layers.{i}.mlp.router.weight [E, d_model]
    layers.{i}.mlp.experts.{e}.w_gate.weight [d_ff, d_model], .w_up.weight [d_ff, d_model],
    .w_down.weight [d_model, d_ff]

computed by ``moe_mlp`` (``moe.py``) with the experts' weights stacked (``torch.stack``) and ``top_k =
n_experts_per_token``. Fresh weights as v1's (each expert's ``w_down`` is a residual projection). The
load-balancing loss is not part of ``train_step``'s loss. The skeleton declares ``"moe"``; remove it to skip these
tests.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def build_model(config: dict, state_dict: dict | None = None) -> nn.Module:
    """Build the model described by ``config`` (a dict, keys and defaults in the module docstring).

    ``state_dict``: canonical names -> tensors; load them (names and shapes must match exactly,
    else ``ValueError`` listing the missing/unexpected names or the bad shape).
    ``state_dict is None``: initialise --

    - every Linear / Embedding weight ~ N(0, 0.02);
    - residual output projections (``attn.wo``, ``mlp.w_down``, ``mlp.w_proj``) ~
      N(0, 0.02 / sqrt(2 * n_layers));
    - norm weights 1, all biases 0.

    With ``tie_embeddings`` (the default) the LM head *is* the token-embedding parameter: one
    tensor, receiving gradient from both uses.

    Dropout (``config["dropout"]``, default 0) goes after the embeddings and on each sublayer's
    output before it is added to the residual stream; it must be inactive in ``eval()`` mode.
    Parameters are created in torch's default dtype and device.

    Validation, each a ``ValueError`` naming the offending values:
    ``d_model % n_heads != 0``, ``n_heads % n_kv_heads != 0``, an odd head dimension for llama
    (RoPE needs pairs), an unknown family, missing required keys.

    Classic bugs to avoid:
    - raise ValueError naming the values when d_model % n_heads != 0 (don't let a reshape fail
      later with an unreadable message);
    - tie the LM head by assigning the same Parameter (``lm_head.weight = tok_embeddings.weight``),
      not a copy -- a copy saves nothing and the two drift apart in training;
    - pre-LN, not post-LN: normalise the sublayer *input*, add the raw sublayer output to the
      residual (post-LN deep stacks diverge);
    - init residual projections with 0.02/sqrt(2*n_layers), not 0.02;
    - gpt2 position embeddings are added to the token embeddings, llama has none (RoPE instead).
    """
    raise NotImplementedError("build_model")


def canonical_state_dict(model: nn.Module) -> dict:
    """The model's weights under the canonical names (see the module docstring) -> ``dict[str, Tensor]``.

    Exactly the canonical names, nothing else (no buffers such as masks or RoPE tables);
    ``lm_head.weight`` only when the embeddings are untied. ``build_model(config,
    canonical_state_dict(m))`` must reproduce ``m``'s outputs exactly.

    Classic bug to avoid: listing a tied ``lm_head.weight`` (``model.state_dict()`` includes
    both names for a tied pair; ``named_parameters()`` lists a shared Parameter once).
    """
    raise NotImplementedError("canonical_state_dict")


def forward(model: nn.Module, ids: torch.Tensor, cache=None, *, attention_mask=None) -> torch.Tensor:
    """Logits for every position: ``ids long [B, T] -> logits [B, T, V]``.

    Without a cache positions are ``0 .. T-1``. With ``cache`` (from ``new_cache``), ``ids`` are
    the next tokens after the ``T_cached`` already cached: their positions are
    ``T_cached .. T_cached + T - 1``, their keys/values are appended to the cache (keys after
    RoPE), and they attend to all cached keys plus themselves (bottom-right causal mask).
    Feeding a sequence in chunks through one cache gives the same logits as feeding it whole.

    More than ``context_length`` tokens in view (``T_cached + T > context_length``) ->
    ``ValueError`` naming the numbers; ids not long ``[B, T]`` or a cache for a different batch
    size -> ``ValueError``.

    Classic bugs to avoid:
    - positions continue from the cache length (RoPE angles and gpt2 position embeddings both);
      restarting at 0 for each new token is the most common cache bug;
    - concatenate the cache along the time axis (dim=-2 of ``[B, Hkv, T, d_head]``), not the
      head or batch axis;
    - with a cache, ``t_q != t_k``: the causal mask must be bottom-right aligned (``is_causal``
      of ``F.scaled_dot_product_attention`` is top-left aligned).

    Optional, protocol v2 (docs/protocol.md, amendment 23): a keyword-only ``attention_mask``,
    ``[B, T_cached + T]`` of 0/1 over every token in view (cached, then new), left padding only
    (each row zeros, then ones). Each row then computes exactly what it computes alone:

    - positions: a row's first real token is at 0 (``cumsum(mask, -1) - 1``); with a cache they
      continue from the row's real-token count, not from the cache length;
    - no query attends a key whose mask is 0: the mask is over keys, ``mask[:, None, None, :]``
      against scores ``[B, H, T_q, T_k]``, combined with the causal mask (not over queries);
    - logits at padded positions are unspecified; keep them finite (let a padded query attend
      itself), or a NaN there reaches real tokens through the next layer (``0 * NaN``);
    - the cache holds padding too (v1 layout) and not the mask: pass the whole mask every call;
    - a 0 after a 1 (right padding), an all-zero row or a wrong shape -> ``ValueError``.

    Judged only when ``"attention_mask"`` is in ``CAPABILITIES`` (``__init__.py``; the skeleton
    lists it: remove it there if you do not build it).
    """
    raise NotImplementedError("forward")


def count_parameters(model: nn.Module) -> int:
    """Number of unique trainable scalars -> ``int``; a tied matrix counts once.

    GPT-2 small (gpt2 family, V=50257, context 1024, d 768, 12 layers, 12 heads, d_ff 3072,
    tied) has 124,439,808. Should also work for a model whose parameters live on the ``meta``
    device (no data is needed to count).

    Classic bug to avoid: summing over ``model.state_dict()`` counts a tied embedding twice
    (163 M instead of 124 M for GPT-2 small); ``model.parameters()`` deduplicates shared Parameters.
    """
    raise NotImplementedError("count_parameters")
