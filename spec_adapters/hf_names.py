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


def llama_name_map(n_layers: int, tied: bool) -> dict[str, str]:
    """Canonical name -> ``LlamaForCausalLM`` parameter name for ``n_layers`` layers."""
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    for i in range(n_layers):
        names.update({f"layers.{i}.{c}": f"model.layers.{i}.{h}" for c, h in LLAMA_LAYER_NAMES.items()})
    if not tied:
        names["lm_head.weight"] = "lm_head.weight"
    return names
