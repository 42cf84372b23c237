"""Protocol v2 adapter for Hugging Face transformers' ``MistralForCausalLM`` (sliding-window attention).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_mistral.py

Mistral is Llama with a sliding window on every layer. transformers defines it from Llama's code
(``models/mistral/modular_mistral.py``: ``MistralMLP(LlamaMLP)``, ``MistralAttention(LlamaAttention)``, ...,
and ``MistralRMSNorm``, its rotary embedding, ``apply_rotary_pos_emb`` and ``eager_attention_forward`` are
generated copies of Llama's), so the component functions are ``hf_llama``'s, and so are the parameter names
(``hf_names.llama_name_map``). Mistral's own part is the model: a config's ``sliding_window`` (W) becomes
``MistralConfig.sliding_window``, transformers' ``create_sliding_window_causal_mask`` masks every layer, and
``DynamicCache(config=model.config)`` (``hf_common.new_cache_for``) builds ``DynamicSlidingWindowLayer``s that
keep only the last W - 1 keys and values once the window is full: a rolling cache, which amendment 27 allows
(``cache_kv`` then shows those W - 1 positions). ``sliding_window = None`` is plain causal attention, v1's model.

``MistralConfig`` has no per-layer pattern (it windows every layer, and only logs a warning about a
``layer_types`` key), so the adapter declares ``sliding_window`` but not ``layer_types``: the suite windows every
layer, and a config that asks for full layers beside sliding ones is refused here rather than silently windowed.
Models are built from configs with random or given weights; nothing is downloaded.

The expected failures are ``hf_llama.xfails.toml``'s (the same code and conventions) and those of
``hf_mistral.xfails.toml``: the divergences only the sliding-window tests reach.
"""

from __future__ import annotations

import dataclasses

from transformers import MistralConfig, MistralForCausalLM

from spec_adapters import hf_common, hf_llama
from spec_adapters.hf_llama import (  # noqa: F401 - the protocol names this adapter shares with hf_llama
    ATTN_IMPLEMENTATION,
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
    rope,
    sample,
    sampling_probs,
    scaled_dot_product_attention,
    silu,
    swiglu,
)

ROPE_STYLE = "half"
FAMILIES = ("llama",)
PROTOCOL_VERSION = 2
CAPABILITIES = (*hf_llama.V2_CAPABILITIES, "sliding_window")

SPEC_XFAILS = ("hf_llama.xfails.toml", "hf_mistral.xfails.toml")  # both files; the later overrides

_MISTRAL_FIELDS = {f.name for f in dataclasses.fields(MistralConfig)}


def hf_config(config: dict) -> MistralConfig:
    """The ``MistralConfig`` of a protocol config dict: ``hf_llama.hf_config``'s fields that Mistral has (all but
    Llama's ``attention_bias``, ``mlp_bias`` and ``pretraining_tp``, which Mistral fixes to none) plus
    ``sliding_window``."""
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    if layer_types is not None and window is not None and set(layer_types) != {"sliding_attention"}:
        raise ValueError(
            f"hf_mistral adapter: MistralConfig windows every layer; layer_types={list(layer_types)} with full "
            "layers is not expressible (capability layer_types is not declared)"
        )
    base = hf_llama.hf_config(config)
    fields = {k: v for k, v in base.to_dict().items() if k in _MISTRAL_FIELDS}
    return hf_common.make_config(
        MistralConfig, **fields, sliding_window=window, attn_implementation=ATTN_IMPLEMENTATION
    )


def build_model(config: dict, state_dict: dict | None = None) -> MistralForCausalLM:
    """``MistralForCausalLM(hf_config(config))`` in torch's default dtype and device; weights as in
    ``hf_llama.build_model`` (canonical names, Llama's parameter names)."""
    return hf_llama.load_canonical(MistralForCausalLM(hf_config(config)), state_dict)
