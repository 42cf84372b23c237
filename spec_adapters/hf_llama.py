"""Protocol v1 adapter for Hugging Face transformers' ``LlamaForCausalLM`` (llama family).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_llama.py

Models are built from a ``LlamaConfig`` made in code, with random or given weights (nothing is
downloaded). Only what transformers implements is exposed: its ``LlamaRMSNorm``, ``LlamaMLP``
(SwiGLU), ``SiLUActivation``, ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (half-split
pairs), ``repeat_kv``, the eager attention function, the causal-LM loss, the logits warpers, the
model's forward with ``DynamicCache``, ``num_parameters`` and ``generate``. Every other protocol
name is left undefined, so the suite reports it as not provided. Divergences from protocol v1 are
listed with their reasons in ``hf_llama.xfails.toml``.
"""

from __future__ import annotations

import types

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.models.llama.modeling_llama import repeat_kv as _hf_repeat_kv

from spec_adapters import hf_common
from spec_adapters.hf_names import llama_name_map as name_map
from spec_tests.protocol import ALL_CAPABILITIES, IMPLIED_BY_V1

ROPE_STYLE = "half"
FAMILIES = ("llama",)
SPEC_XFAILS = "hf_llama.xfails.toml"
# What a protocol-v2 adapter of a Llama-derived transformers model declares besides its own capabilities: every v1
# capability, and the sampler's top_k and top_p (this adapter, v1, implies them all).
V2_CAPABILITIES = (*ALL_CAPABILITIES, *IMPLIED_BY_V1)

ATTN_IMPLEMENTATION = "eager"  # transformers' own attention code (the default "sdpa" calls torch's kernel)

# ---------------------------------------------------------------------------------- components


def _call(module: torch.nn.Module, params: dict[str, torch.Tensor], *args, **kwargs):
    """``module(*args)`` with its parameters replaced by ``params`` (no copy; gradients flow to them)."""
    return torch.func.functional_call(module, params, args, kwargs)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``LlamaRMSNorm(d, eps)`` with ``weight``: ``x [..., d] -> [..., d]``."""
    return _call(LlamaRMSNorm(x.shape[-1], eps=eps).to(x.device), {"weight": weight}, x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``transformers.activations.SiLUActivation`` (Llama's ``hidden_act="silu"``)."""
    return SiLUActivation()(x)


def swiglu(x, w_gate, w_up, w_down):
    """``LlamaMLP`` with ``gate_proj/up_proj/down_proj`` = ``w_gate/w_up/w_down`` (``[out, in]``, as nn.Linear)."""
    d_ff, d = w_gate.shape
    cfg = types.SimpleNamespace(hidden_size=d, intermediate_size=d_ff, mlp_bias=False, hidden_act="silu")
    mlp = LlamaMLP(cfg).to(device=x.device, dtype=x.dtype)
    params = {"gate_proj.weight": w_gate, "up_proj.weight": w_up, "down_proj.weight": w_down}
    return _call(mlp, params, x)


def _rotary(d_head: int, theta: float) -> LlamaRotaryEmbedding:
    cfg = hf_common.make_config(
        LlamaConfig,
        hidden_size=d_head,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=d_head,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
    )
    return LlamaRotaryEmbedding(cfg)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """``LlamaRotaryEmbedding`` tables at ``positions`` applied by ``apply_rotary_pos_emb`` to ``x [..., T, d_head]``.

    ``positions`` is ``[T]`` or broadcastable to ``x.shape[:-1]``; the tables (``positions.shape + [d_head]``)
    are broadcast to ``x``'s shape and a leading axis added because ``apply_rotary_pos_emb``
    unsqueezes one (``unsqueeze_dim=0``).
    """
    rotary = _rotary(x.shape[-1], theta).to(x.device)
    cos, sin = rotary(x, position_ids=positions)
    cos, sin = cos.expand(x.shape), sin.expand(x.shape)
    out, _ = apply_rotary_pos_emb(x[None], x[None], cos, sin, unsqueeze_dim=0)
    return out[0]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: ``[B, Hkv, T, d] -> [B, Hkv*n_rep, T, d]``."""
    return _hf_repeat_kv(x, n_rep)


def scaled_dot_product_attention(q, k, v, mask=None):
    """Llama's ``eager_attention_forward`` for ``q [B, Hq, Tq, d]``, ``k, v [B, Hkv, Tk, d]`` -> ``[B, Hq, Tq, d]``.

    The key/value heads are shared through the module's ``num_key_value_groups``.
    """
    return hf_common.eager_attention(
        eager_attention_forward, q, k, v, mask, num_key_value_groups=q.shape[-3] // k.shape[-3]
    )


cross_entropy = hf_common.cross_entropy
lm_loss = hf_common.lm_loss
sampling_probs = hf_common.sampling_probs
sample = hf_common.sample

# --------------------------------------------------------------------------------------- model


def hf_config(config: dict) -> LlamaConfig:
    """The ``LlamaConfig`` of a protocol config dict (no special tokens: generation never stops early)."""
    if config.get("family", "llama") != "llama":
        raise ValueError(f"hf_llama adapter: family must be 'llama', got {config.get('family')!r}")
    return hf_common.make_config(
        LlamaConfig,
        vocab_size=config["vocab_size"],
        hidden_size=config["d_model"],
        intermediate_size=config["d_ff"],
        num_hidden_layers=config["n_layers"],
        num_attention_heads=config["n_heads"],
        num_key_value_heads=config.get("n_kv_heads") or config["n_heads"],
        max_position_embeddings=config["context_length"],
        rms_norm_eps=config.get("norm_eps", 1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000.0))},
        tie_word_embeddings=config.get("tie_embeddings", True),
        attention_dropout=config.get("dropout", 0.0),
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation=ATTN_IMPLEMENTATION,
    )


def build_model(config: dict, state_dict: dict | None = None) -> LlamaForCausalLM:
    """``LlamaForCausalLM(LlamaConfig(...))`` in torch's default dtype and device; ``state_dict`` in canonical names.

    Without weights, transformers' own initialisation (``post_init``) stands.
    """
    model = LlamaForCausalLM(hf_config(config))
    return load_canonical(model, state_dict)


def load_canonical(model: LlamaForCausalLM, state_dict: dict | None) -> LlamaForCausalLM:
    """Copy ``state_dict`` (canonical names, exact shapes) into ``model``'s parameters; ``None`` keeps them."""
    if state_dict is not None:
        hf_common.load_named(model, state_dict, canonical_names(model))
    return model


def canonical_names(model) -> dict[str, str]:
    """Canonical name -> parameter name of ``model``: Llama's, and (protocol v2) the q, k, v biases of Qwen2 and the
    per-head q/k norms of Qwen3 where the model has them (their other parameters are named as Llama's)."""
    params, first = dict(model.named_parameters()), "model.layers.0.self_attn."
    return name_map(
        model.config.num_hidden_layers,
        model.config.tie_word_embeddings,
        qkv_bias=first + "q_proj.bias" in params,
        qk_norm=first + "q_norm.weight" in params,
    )


def canonical_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters(remove_duplicate=False))
    names = canonical_names(model)
    return {canonical: params[hf].detach() for canonical, hf in names.items()}


def new_cache(model: LlamaForCausalLM, batch_size: int) -> hf_common.HFCache:
    """An empty ``DynamicCache(config=model.config)``."""
    c = model.config
    return hf_common.new_cache_for(model, batch_size, c.num_key_value_heads, c.head_dim, c.num_hidden_layers)


forward = hf_common.forward
cache_kv = hf_common.cache_kv
generate = hf_common.generate
count_parameters = hf_common.count_parameters
