"""Protocol v2 adapter for Hugging Face transformers' ``Qwen2ForCausalLM`` (biases on q, k and v; left padding).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_qwen2.py

Qwen2 is Llama with biases on the q, k and v projections (not on ``o_proj``): capability ``qkv_bias``
(amendment 22). transformers defines it from Llama's code (``models/qwen2/modular_qwen2.py``: ``Qwen2MLP(LlamaMLP)``,
``Qwen2Attention(LlamaAttention)``; ``Qwen2RMSNorm``, ``apply_rotary_pos_emb``, ``repeat_kv`` and
``eager_attention_forward`` are generated copies of Llama's), so the component functions are ``hf_llama``'s, and
the parameter names Llama's plus ``self_attn.{q,k,v}_proj.bias`` (``hf_names.QKV_BIAS_NAMES``). Qwen2's own part
is the model.

``Qwen2Attention`` always has the three biases, so the adapter declares ``FIXED_CONFIG = {"qkv_bias": True}``
(amendment 26): the suite builds every llama config with ``qkv_bias``, and the v1 model tests (logits, cache,
generation, training) judge stock Qwen2, biases included; a config with ``qkv_bias`` false is refused
(``ValueError``) rather than computed without them.

Capability ``attention_mask`` (amendment 23): ``forward`` passes transformers' own 2-D mask with the
``position_ids`` transformers' ``generate`` derives from it (``hf_common.forward``; the forward alone would count
positions from the padded start), and ``generate`` passes the mask to ``model.generate``. transformers does not
check the mask (left padding only, values 0/1, a real token per row): those divergences are in the xfails file.

``sliding_window`` is not declared: Qwen2's window (``use_sliding_window``, ``max_window_layers``) is left at
its default, off. Models are built from configs with random or given weights; nothing is downloaded. The
expected failures are ``hf_llama.xfails.toml``'s (the same code and conventions) and ``hf_qwen2.xfails.toml``'s.
"""

from __future__ import annotations

import dataclasses

from transformers import Qwen2Config, Qwen2ForCausalLM

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
CAPABILITIES = (*hf_llama.V2_CAPABILITIES, "qkv_bias", "attention_mask")

FIXED_CONFIG = {"qkv_bias": True}  # amendment 26: every Qwen2 model has them
SPEC_XFAILS = ("hf_llama.xfails.toml", "hf_qwen2.xfails.toml")  # both files; the later overrides

_QWEN2_FIELDS = {f.name for f in dataclasses.fields(Qwen2Config)}


def hf_config(config: dict) -> Qwen2Config:
    """The ``Qwen2Config`` of a protocol config dict: ``hf_llama.hf_config``'s fields that Qwen2 has (Qwen2 has no
    ``attention_bias`` or ``mlp_bias``: it fixes the q, k, v biases on and the others off)."""
    base = hf_llama.hf_config(config)
    fields = {k: v for k, v in base.to_dict().items() if k in _QWEN2_FIELDS}
    return hf_common.make_config(Qwen2Config, **fields, attn_implementation=ATTN_IMPLEMENTATION)


def build_model(config: dict, state_dict: dict | None = None) -> Qwen2ForCausalLM:
    """``Qwen2ForCausalLM(hf_config(config))`` in torch's default dtype and device; weights in canonical names
    (``hf_llama.load_canonical``: Llama's names and ``attn.w{q,k,v}.bias``)."""
    if config.get("family", "llama") == "llama" and config.get("qkv_bias") is not True:
        raise ValueError(
            f"hf_qwen2 adapter: Qwen2's q, k and v projections always have biases, got qkv_bias="
            f"{config.get('qkv_bias')!r} (FIXED_CONFIG: the suite builds every llama config with qkv_bias)"
        )
    return hf_llama.load_canonical(Qwen2ForCausalLM(hf_config(config)), state_dict)


def new_cache(model: Qwen2ForCausalLM, batch_size: int) -> hf_common.HFCache:
    """An empty ``DynamicCache(config=model.config)``; ``Qwen2Config`` has no ``head_dim`` (``Qwen2Attention`` takes
    ``hidden_size // num_attention_heads``), so the empty cache's head size is that."""
    c = model.config
    d_head = c.hidden_size // c.num_attention_heads
    return hf_common.new_cache_for(model, batch_size, c.num_key_value_heads, d_head, c.num_hidden_layers)
