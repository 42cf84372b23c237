"""Canonical weight names <-> Hugging Face ``LlamaForCausalLM`` parameter names, in one place.

Plain data (no transformers import): the adapter, the benchmarks and the reference's own HF checks
all read it. ``nn.Linear`` layouts match, so no weight needs a transpose.
"""

from __future__ import annotations

LLAMA_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}


# protocol v2: Qwen2's q, k, v biases (capability qkv_bias) and Qwen3's per-head q/k norms (capability qk_norm)
QKV_BIAS_NAMES = {
    "attn.wq.bias": "self_attn.q_proj.bias",
    "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.bias": "self_attn.v_proj.bias",
}
QK_NORM_NAMES = {"attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight"}


def llama_name_map(n_layers: int, tied: bool, *, qkv_bias: bool = False, qk_norm: bool = False) -> dict[str, str]:
    """Canonical name -> ``LlamaForCausalLM`` parameter name for ``n_layers`` layers (the same in Qwen2 and
    Qwen3, which add ``qkv_bias``'s projection biases and ``qk_norm``'s per-head norms)."""
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    layer = {**LLAMA_LAYER_NAMES, **(QKV_BIAS_NAMES if qkv_bias else {}), **(QK_NORM_NAMES if qk_norm else {})}
    for i in range(n_layers):
        names.update({f"layers.{i}.{c}": f"model.layers.{i}.{h}" for c, h in layer.items()})
    if not tied:
        names["lm_head.weight"] = "lm_head.weight"
    return names


# protocol v2 (amendment 26, post_norms): Gemma 2 names its four norms per layer differently. Its
# post_attention_layernorm is the attention's output norm (attn_post_norm), not Llama's pre-MLP norm.
GEMMA2_LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    "attn_post_norm.weight": "post_attention_layernorm.weight",
    "mlp_norm.weight": "pre_feedforward_layernorm.weight",
    "mlp_post_norm.weight": "post_feedforward_layernorm.weight",
}


def gemma2_name_map(n_layers: int, tied: bool) -> dict[str, str]:
    """Canonical name -> ``Gemma2ForCausalLM`` parameter name (a config with ``post_norms``) for ``n_layers``."""
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    for i in range(n_layers):
        names.update({f"layers.{i}.{c}": f"model.layers.{i}.{h}" for c, h in GEMMA2_LAYER_NAMES.items()})
    if not tied:
        names["lm_head.weight"] = "lm_head.weight"
    return names
