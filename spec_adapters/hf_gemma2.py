"""Protocol v2 adapter for Hugging Face transformers' ``Gemma2ForCausalLM`` (Gemma 2, random weights).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_gemma2.py

Gemma 2 is the llama family with every Gemma-style option of amendment 26 and the soft-caps of amendment 25:
``Gemma2RMSNorm`` multiplies by ``1 + weight`` (``norm_offset``; fresh weights 0), ``Gemma2TextScaledWordEmbedding``
multiplies the input embeddings by ``sqrt(hidden_size)`` cast to the weights' dtype (``embed_scale``; the tied
``lm_head`` is not scaled), ``Gemma2DecoderLayer`` normalises each sublayer's output (``post_attention_layernorm``,
``post_feedforward_layernorm``) before the residual add (``post_norms``), ``Gemma2MLP`` is gated with
``hidden_activation`` (``gelu_pytorch_tanh``: ``geglu``; ``silu`` otherwise), and ``attn_logit_softcapping`` /
``final_logit_softcapping`` cap the scores (in ``eager_attention_forward``, before the additive mask) and the logits
(``logit_softcap``; ``None`` turns either off). The first three are built into the model's classes, so the adapter
declares them in ``FIXED_CONFIG``: the suite builds every llama config with them, and a config without them raises
``ValueError`` here (Gemma 2 cannot be built without them). ``geglu`` and the soft-caps follow the config.

What is set to fit protocol v1's conventions, each a config field of Gemma 2 (no behaviour added):

- ``head_dim = d_model // n_heads`` (Gemma 2's default is 256, independent of ``hidden_size``) and
  ``query_pre_attn_scalar = head_dim``, so the scores are scaled by ``1 / sqrt(d_head)`` as the protocol says
  (Gemma 2 27B uses ``hidden_size / num_attention_heads`` there instead: a model this adapter does not build);
- sliding windows (amendment 27, not judged here): Gemma 2 alternates sliding-window layers (even layers) and
  global ones; ``sliding_window`` is set to ``SLIDING_WINDOW``, longer than any sequence the suite uses, so that
  every layer attends to all keys, as protocol v1's attention;
- ``rms_norm_eps`` from ``norm_eps`` (Gemma 2's default is 1e-6), no special tokens (generation never stops early),
  ``attn_implementation="eager"`` (transformers' own attention code; Gemma 2 does not support ``sdpa``).

Component functions are Gemma 2's own: ``rope`` (``Gemma2RotaryEmbedding`` + ``apply_rotary_pos_emb``, half-split
pairs), ``repeat_kv``, ``swiglu`` (``Gemma2MLP`` with ``silu``), ``scaled_dot_product_attention`` (its
``eager_attention_forward``, with ``softcap=``); the KV cache, sampling, generation, losses and parameter counts are
transformers' generic code (``hf_common``). ``rmsnorm`` is not provided: ``Gemma2RMSNorm`` computes
``x / rms(x) * (1 + weight)``, not protocol v1's ``rmsnorm(x, weight)``, and it is judged inside the model.
Divergences are listed, with their reasons, in ``hf_gemma2.xfails.toml``.
"""

from __future__ import annotations

import types

import torch
from transformers import Gemma2Config, Gemma2ForCausalLM
from transformers.models.gemma2.modeling_gemma2 import (
    Gemma2MLP,
    Gemma2RotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.models.gemma2.modeling_gemma2 import repeat_kv as _hf_repeat_kv

from spec_adapters import hf_common
from spec_adapters.hf_common import (  # noqa: F401 - protocol names served by transformers' generic code
    cache_kv,
    count_parameters,
    cross_entropy,
    forward,
    generate,
    lm_loss,
    sample,
    sampling_probs,
)
from spec_adapters.hf_names import gemma2_name_map

ROPE_STYLE = "half"
FAMILIES = ("llama",)
PROTOCOL_VERSION = 2
CAPABILITIES = (
    "gqa",
    "tied_head",
    "untied_head",
    "dropout",
    "free_d_ff",
    "rope_theta",
    "top_k",
    "top_p",
    "logit_softcap",
    "norm_offset",
    "embed_scale",
    "geglu",
    "post_norms",
)
# Protocol v2 (amendment 26): what every Gemma 2 model has, whatever its config says
FIXED_CONFIG = {"norm_offset": True, "embed_scale": True, "post_norms": True}
SPEC_XFAILS = "hf_gemma2.xfails.toml"

ATTN_IMPLEMENTATION = "eager"
SLIDING_WINDOW = 1 << 20  # longer than any sequence of the suite: every layer attends to all keys
UNSUPPORTED = ("rope_scaling", "qkv_bias", "qk_norm", "sliding_window", "layer_types")  # not expressed here

# ---------------------------------------------------------------------------------- components


def _rotary(d_head: int, theta: float) -> Gemma2RotaryEmbedding:
    cfg = hf_common.make_config(
        Gemma2Config,
        hidden_size=d_head,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=d_head,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
    )
    return Gemma2RotaryEmbedding(cfg)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """``Gemma2RotaryEmbedding`` tables at ``positions`` applied by Gemma 2's ``apply_rotary_pos_emb`` to
    ``x [..., T, d_head]`` (tables broadcast to ``x``, a leading axis for its ``unsqueeze_dim``)."""
    cos, sin = _rotary(x.shape[-1], theta).to(x.device)(x, position_ids=positions)
    cos, sin = cos.expand(x.shape), sin.expand(x.shape)
    out, _ = apply_rotary_pos_emb(x[None], x[None], cos, sin, unsqueeze_dim=0)
    return out[0]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Gemma 2's ``repeat_kv``: ``[B, Hkv, T, d] -> [B, Hkv*n_rep, T, d]``."""
    return _hf_repeat_kv(x, n_rep)


def swiglu(x, w_gate, w_up, w_down):
    """``Gemma2MLP`` with ``hidden_activation="silu"`` and ``gate_proj/up_proj/down_proj`` = ``w_gate/w_up/w_down``."""
    d_ff, d = w_gate.shape
    cfg = types.SimpleNamespace(hidden_size=d, intermediate_size=d_ff, hidden_activation="silu")
    mlp = Gemma2MLP(cfg).to(device=x.device, dtype=x.dtype)
    params = {"gate_proj.weight": w_gate, "up_proj.weight": w_up, "down_proj.weight": w_down}
    return torch.func.functional_call(mlp, params, (x,))


def scaled_dot_product_attention(q, k, v, mask=None, *, softcap=None):
    """Gemma 2's ``eager_attention_forward`` for ``q [B, Hq, Tq, d]``, ``k, v [B, Hkv, Tk, d]`` -> ``[B, Hq, Tq, d]``;
    ``softcap`` (protocol v2, ``logit_softcap``) is its ``softcap``."""
    groups = q.shape[-3] // k.shape[-3]
    return hf_common.eager_attention(eager_attention_forward, q, k, v, mask, softcap, num_key_value_groups=groups)


# --------------------------------------------------------------------------------------- model


def hf_config(config: dict) -> Gemma2Config:
    """The ``Gemma2Config`` of a protocol config dict, which must have ``FIXED_CONFIG``'s options."""
    if config.get("family", "llama") != "llama":
        raise ValueError(f"hf_gemma2 adapter: family must be 'llama', got {config.get('family')!r}")
    lacking = [key for key in FIXED_CONFIG if config.get(key) is not True]
    if lacking:
        raise ValueError(f"hf_gemma2 adapter: Gemma 2 always has {lacking}; the config has {lacking} not True")
    unsupported = [key for key in UNSUPPORTED if config.get(key) not in (None, False)]
    if unsupported:
        raise ValueError(f"hf_gemma2 adapter: config keys {unsupported} are not expressed by this adapter")
    d_head = config["d_model"] // config["n_heads"]
    return hf_common.make_config(
        Gemma2Config,
        vocab_size=config["vocab_size"],
        hidden_size=config["d_model"],
        intermediate_size=config["d_ff"],
        num_hidden_layers=config["n_layers"],
        num_attention_heads=config["n_heads"],
        num_key_value_heads=config.get("n_kv_heads") or config["n_heads"],
        head_dim=d_head,
        query_pre_attn_scalar=d_head,
        max_position_embeddings=config["context_length"],
        rms_norm_eps=config.get("norm_eps", 1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000.0))},
        hidden_activation="gelu_pytorch_tanh" if config.get("geglu", False) else "silu",
        attn_logit_softcapping=config.get("attn_logit_softcap"),
        final_logit_softcapping=config.get("final_logit_softcap"),
        sliding_window=SLIDING_WINDOW,
        tie_word_embeddings=config.get("tie_embeddings", True),
        attention_dropout=config.get("dropout", 0.0),
        attention_bias=False,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation=ATTN_IMPLEMENTATION,
    )


def canonical_names(model: Gemma2ForCausalLM) -> dict[str, str]:
    return gemma2_name_map(model.config.num_hidden_layers, model.config.tie_word_embeddings)


def build_model(config: dict, state_dict: dict | None = None) -> Gemma2ForCausalLM:
    """``Gemma2ForCausalLM(hf_config(config))`` in torch's default dtype and device (its ``embed_scale`` buffer is
    made in that dtype); ``state_dict`` in canonical names. Without weights, transformers' initialisation stands."""
    model = Gemma2ForCausalLM(hf_config(config))
    if state_dict is not None:
        hf_common.load_named(model, state_dict, canonical_names(model))
    return model


def canonical_state_dict(model: Gemma2ForCausalLM) -> dict[str, torch.Tensor]:
    return hf_common.named_state_dict(model, canonical_names(model))


def new_cache(model: Gemma2ForCausalLM, batch_size: int) -> hf_common.HFCache:
    """An empty ``DynamicCache(config=model.config)`` (its sliding layers keep ``SLIDING_WINDOW`` tokens: all)."""
    c = model.config
    return hf_common.new_cache_for(model, batch_size, c.num_key_value_heads, c.head_dim, c.num_hidden_layers)
