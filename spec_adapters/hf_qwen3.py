"""Protocol v2 adapter for Hugging Face transformers' ``Qwen3ForCausalLM`` (per-head RMSNorm on queries and keys).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_qwen3.py

Qwen3 is Llama with ``Qwen3RMSNorm(head_dim, eps=rms_norm_eps)`` on each query and key head after the head split
and before RoPE (``Qwen3Attention``: ``self.q_norm``, ``self.k_norm``): capability ``qk_norm`` (amendment 24).
transformers defines it from Llama's and Qwen2's code (``models/qwen3/modular_qwen3.py``: ``Qwen3RMSNorm`` is
``Qwen2RMSNorm``, itself Llama's; ``Qwen3MLP`` is ``GemmaMLP``, Llama's SwiGLU with ``hidden_act``; the rotary
embedding, ``apply_rotary_pos_emb`` and ``eager_attention_forward`` are generated copies of Llama's), so the
component functions are ``hf_llama``'s, and the parameter names Llama's plus ``self_attn.{q,k}_norm.weight``
(``hf_names.QK_NORM_NAMES``). ``Qwen3Config.head_dim`` defaults to 128, so it is set to ``d_model // n_heads``.

``Qwen3Attention`` always applies the two norms, so the adapter declares ``FIXED_CONFIG = {"qk_norm": True}``
(amendment 26): the suite builds every llama config with ``qk_norm``, and the v1 model tests (logits, cache,
generation, training) judge stock Qwen3, norms included; a config with ``qk_norm`` false is refused (``ValueError``)
rather than computed without the norms. ``multihead_self_attention`` is not provided (as in ``hf_llama``):
transformers has no attention function of weights, only the module, so the function-level qk_norm tests are
skipped and the norms are judged in the model.

Models are built from configs with random or given weights; nothing is downloaded. The expected failures are
``hf_llama.xfails.toml``'s (the same code and conventions) and ``hf_qwen3.xfails.toml``'s.
"""

from __future__ import annotations

import dataclasses

from transformers import Qwen3Config, Qwen3ForCausalLM

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
CAPABILITIES = (*hf_llama.V2_CAPABILITIES, "qk_norm")

FIXED_CONFIG = {"qk_norm": True}  # amendment 26: every Qwen3 model has them
SPEC_XFAILS = ("hf_llama.xfails.toml", "hf_qwen3.xfails.toml")  # both files; the later overrides

_QWEN3_FIELDS = {f.name for f in dataclasses.fields(Qwen3Config)}


def hf_config(config: dict) -> Qwen3Config:
    """The ``Qwen3Config`` of a protocol config dict: ``hf_llama.hf_config``'s fields that Qwen3 has, with
    ``head_dim = d_model // n_heads`` (Qwen3's default is 128) and ``attention_bias`` off (Qwen3's would put a bias
    on ``o_proj`` too, which no protocol config has)."""
    base = hf_llama.hf_config(config)
    fields = {k: v for k, v in base.to_dict().items() if k in _QWEN3_FIELDS}
    fields.update(head_dim=config["d_model"] // config["n_heads"], attention_bias=False)
    return hf_common.make_config(Qwen3Config, **fields, attn_implementation=ATTN_IMPLEMENTATION)


def build_model(config: dict, state_dict: dict | None = None) -> Qwen3ForCausalLM:
    """``Qwen3ForCausalLM(hf_config(config))`` in torch's default dtype and device; weights in canonical names
    (``hf_llama.load_canonical``: Llama's names and ``attn.{q,k}_norm.weight``)."""
    if config.get("family", "llama") == "llama" and config.get("qk_norm") is not True:
        raise ValueError(
            f"hf_qwen3 adapter: Qwen3's attention always normalises q and k, got qk_norm={config.get('qk_norm')!r} "
            "(FIXED_CONFIG: the suite builds every llama config with qk_norm)"
        )
    return hf_llama.load_canonical(Qwen3ForCausalLM(hf_config(config)), state_dict)
