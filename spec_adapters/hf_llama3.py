"""Protocol v2 adapter for Hugging Face transformers' ``LlamaForCausalLM`` with RoPE scaling (Llama 3.1's llama3).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_llama3.py

``hf_llama.py`` with the capability ``rope_scaling`` (amendment 20): a config's ``rope_scaling`` dict becomes
``LlamaConfig.rope_parameters`` (with ``rope_theta``), and ``rope(..., scaling=)`` builds a
``LlamaRotaryEmbedding`` from the same dict, so transformers' own ``ROPE_INIT_FUNCTIONS`` (``llama3``,
``linear``, ``dynamic``, ``yarn``) and its ``dynamic_rope_update`` compute every scaled frequency. Models are
built from configs with random or given weights; nothing is downloaded. For ``dynamic`` transformers reads the
original length from ``max_position_embeddings`` (not from the dict), so the adapter puts the protocol's
``original_max_position_embeddings`` there: a translation of where the number lives, not new behaviour.

The expected failures are ``hf_llama.xfails.toml``'s (the same model and conventions) and those of
``hf_llama3.xfails.toml``: the divergences only the v2 tests reach.
"""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from spec_adapters import hf_common, hf_llama
from spec_adapters.hf_llama import (  # noqa: F401 - the protocol names this adapter shares with hf_llama
    ATTN_IMPLEMENTATION,
    apply_rotary_pos_emb,
    cache_kv,
    canonical_state_dict,
    count_parameters,
    cross_entropy,
    forward,
    generate,
    lm_loss,
    new_cache,
    repeat_kv,
    rmsnorm,
    sample,
    sampling_probs,
    scaled_dot_product_attention,
    silu,
    swiglu,
)

ROPE_STYLE = "half"
FAMILIES = ("llama",)
PROTOCOL_VERSION = 2
CAPABILITIES = (*hf_llama.V2_CAPABILITIES, "rope_scaling")

SPEC_XFAILS = ("hf_llama.xfails.toml", "hf_llama3.xfails.toml")  # both files; the later overrides


def rope_parameters(theta: float, scaling: dict | None) -> dict:
    """transformers' ``rope_parameters``: the protocol's ``rope_scaling`` dict plus ``rope_theta``."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": float(theta)}
    scaling = dict(scaling)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    return {**scaling, "rope_theta": float(theta)}


def _max_positions(scaling: dict | None, default: int) -> int:
    """Where transformers reads dynamic scaling's original length: ``max_position_embeddings``."""
    if scaling and (scaling.get("rope_type") or scaling.get("type")) == "dynamic":
        return scaling.get("original_max_position_embeddings") or default
    return default


def rope(x, positions, theta: float = 10000.0, *, scaling: dict | None = None):
    """``LlamaRotaryEmbedding`` (built from ``scaling``, a Hugging Face rope_scaling dict) at ``positions``,
    applied by ``apply_rotary_pos_emb`` to ``x [..., T, d_head]``; as ``hf_llama.rope`` otherwise."""
    d_head = x.shape[-1]
    cfg = hf_common.make_config(
        LlamaConfig,
        hidden_size=d_head,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=d_head,
        max_position_embeddings=_max_positions(scaling, 2048),
        rope_parameters=rope_parameters(theta, scaling),
    )
    rotary = LlamaRotaryEmbedding(cfg).to(x.device)
    cos, sin = rotary(x, position_ids=positions)
    cos, sin = cos.expand(x.shape), sin.expand(x.shape)
    out, _ = apply_rotary_pos_emb(x[None], x[None], cos, sin, unsqueeze_dim=0)
    return out[0]


def hf_config(config: dict) -> LlamaConfig:
    """``hf_llama.hf_config`` with the config's ``rope_scaling`` in ``rope_parameters``."""
    base = hf_llama.hf_config(config)
    scaling = config.get("rope_scaling")
    if scaling is None:
        return base
    return hf_common.make_config(
        LlamaConfig,
        **{
            **base.to_dict(),
            "rope_parameters": rope_parameters(config.get("rope_theta", 10000.0), scaling),
            "max_position_embeddings": _max_positions(scaling, config["context_length"]),
            "attn_implementation": ATTN_IMPLEMENTATION,
        },
    )


def build_model(config: dict, state_dict: dict | None = None) -> LlamaForCausalLM:
    """``LlamaForCausalLM`` of ``hf_config(config)`` (with its rope scaling); weights as in ``hf_llama.build_model``."""
    model = LlamaForCausalLM(hf_config(config))
    return hf_llama.load_canonical(model, state_dict)
