"""Protocol v2 adapter for Hugging Face transformers' ``MixtralForCausalLM`` (a sparse mixture of SwiGLU experts).

    python3 -m pytest spec_tests --impl=spec_adapters/hf_mixtral.py

Mixtral is Mistral (Llama's attention, norms and RoPE) with ``MixtralSparseMoeBlock`` as every layer's MLP:
capability ``moe`` (amendment 28). Its router ``MixtralTopKRouter`` (``mlp.gate.weight [E, d]``) takes
``softmax(router_logits.float())`` over the experts, keeps ``torch.topk`` of ``num_experts_per_tok`` and renormalises
them; ``MixtralExperts`` holds the experts fused, ``mlp.experts.gate_up_proj [E, 2 d_ff, d]`` (each expert's gate
rows, then its up rows) and ``mlp.experts.down_proj [E, d, d_ff]``. The canonical weights are views of those:
``mlp.router.weight`` is ``gate.weight``, ``mlp.experts.{e}.w_gate.weight`` is ``gate_up_proj[e, :d_ff]``,
``.w_up.weight`` ``gate_up_proj[e, d_ff:]`` and ``.w_down.weight`` ``down_proj[e]``. ``moe_mlp`` is
``MixtralSparseMoeBlock`` with the given weights, ``moe_load_balancing_loss`` transformers'
``load_balancing_loss_func`` of one layer's logits; the other component functions are ``hf_llama``'s.

Every Mixtral layer is a mixture: a protocol config without ``n_experts`` (the v1 model tests' dense SwiGLU) is
built as one expert chosen by every token (``num_local_experts = num_experts_per_tok = 1``: the renormalised weight
is 1, so the layer is that expert's SwiGLU exactly), its weights named ``mlp.w_gate.weight``, ``mlp.w_up.weight``
and ``mlp.w_down.weight`` as views of the one expert's; the one-row router is a parameter outside the canonical
names (it cannot change the output). The experts run through transformers' ``"eager"`` experts implementation (its
loop over the experts hit; ``grouped_mm`` takes no float64).

Models are built from configs with random or given weights; nothing is downloaded. The expected failures are
``hf_llama.xfails.toml``'s (the same code and conventions) and ``hf_mixtral.xfails.toml``'s.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral import modeling_mixtral

from spec_adapters import hf_common, hf_llama
from spec_adapters.hf_llama import (  # noqa: F401 - the protocol names this adapter shares with hf_llama
    ATTN_IMPLEMENTATION,
    _call,
    cache_kv,
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
from spec_adapters.hf_names import llama_name_map

ROPE_STYLE = "half"
FAMILIES = ("llama",)
PROTOCOL_VERSION = 2
CAPABILITIES = (*hf_llama.V2_CAPABILITIES, "moe")

SPEC_XFAILS = ("hf_llama.xfails.toml", "hf_mixtral.xfails.toml")  # both files; the later overrides

_MIXTRAL_FIELDS = {f.name for f in dataclasses.fields(MixtralConfig)}
_DENSE = ("mlp.w_gate.weight", "mlp.w_up.weight", "mlp.w_down.weight")
EXPERTS_IMPLEMENTATION = "eager"  # transformers' loop over the experts (grouped_mm takes no float64)


# ---------------------------------------------------------------------------------- components


def moe_mlp(x, router, w_gate, w_up, w_down, *, top_k):
    """``MixtralSparseMoeBlock`` with ``gate.weight = router [E, d]``, ``experts.gate_up_proj = [w_gate; w_up]``
    (``[E, 2f, d]``) and ``experts.down_proj = w_down [E, d, f]``: ``x [..., d] -> [..., d]``."""
    n_experts, d_ff, d = w_gate.shape
    config = hf_common.make_config(
        MixtralConfig,
        hidden_size=d,
        intermediate_size=d_ff,
        num_local_experts=n_experts,
        num_experts_per_tok=top_k,
        router_jitter_noise=0.0,
        hidden_act="silu",
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )
    block = modeling_mixtral.MixtralSparseMoeBlock(config).to(device=x.device, dtype=x.dtype).eval()
    params = {"gate.weight": router, "experts.gate_up_proj": torch.cat([w_gate, w_up], dim=1)}
    params["experts.down_proj"] = w_down
    out = _call(block, params, x.reshape(1, -1, d))
    return out.reshape(x.shape)


def moe_load_balancing_loss(router_logits, top_k):
    """transformers' ``load_balancing_loss_func((router_logits,), E, top_k)``: router_logits ``[N, E]`` -> a scalar."""
    return modeling_mixtral.load_balancing_loss_func((router_logits,), router_logits.shape[-1], top_k)


# --------------------------------------------------------------------------------------- model


def hf_config(config: dict) -> MixtralConfig:
    """The ``MixtralConfig`` of a protocol config dict: ``hf_llama.hf_config``'s fields that Mixtral has, no sliding
    window, ``num_local_experts = n_experts`` and ``num_experts_per_tok = n_experts_per_token`` (one expert, chosen by
    every token, without ``n_experts``)."""
    base = hf_llama.hf_config(config)
    fields = {k: v for k, v in base.to_dict().items() if k in _MIXTRAL_FIELDS}
    n_experts = config.get("n_experts") or 0
    experts = {"num_local_experts": 1, "num_experts_per_tok": 1}
    if n_experts:
        experts = {"num_local_experts": n_experts, "num_experts_per_tok": config.get("n_experts_per_token")}
    return hf_common.make_config(
        MixtralConfig,
        **fields,
        **experts,
        sliding_window=None,
        router_jitter_noise=0.0,
        output_router_logits=False,
        attn_implementation=ATTN_IMPLEMENTATION,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def build_model(config: dict, state_dict: dict | None = None) -> MixtralForCausalLM:
    """``MixtralForCausalLM(hf_config(config))`` in torch's default dtype and device; ``state_dict`` in canonical
    names (the router and each expert's SwiGLU, or the dense names without ``n_experts``)."""
    model = MixtralForCausalLM(hf_config(config))
    model.spec_dense = not config.get("n_experts")  # the v1 names: one expert, mlp.w_gate/w_up/w_down
    if state_dict is not None:
        views = canonical_state_dict(model)
        unknown, missing = sorted(set(state_dict) - set(views)), sorted(set(views) - set(state_dict))
        if unknown or missing:
            raise ValueError(f"state_dict does not match the canonical names: missing {missing}, unexpected {unknown}")
        with torch.no_grad():
            for name, value in state_dict.items():
                if tuple(value.shape) != tuple(views[name].shape):
                    raise ValueError(
                        f"state_dict[{name!r}] has shape {tuple(value.shape)}, expected {tuple(views[name].shape)}"
                    )
                views[name].copy_(value)
    return model


def canonical_state_dict(model: MixtralForCausalLM) -> dict[str, torch.Tensor]:
    """Canonical name -> the parameter (or the view of a fused expert parameter) it names, detached."""
    params = dict(model.named_parameters(remove_duplicate=False))
    c = model.config
    d_ff, dense = c.intermediate_size, getattr(model, "spec_dense", c.num_local_experts == 1)
    names = llama_name_map(c.num_hidden_layers, c.tie_word_embeddings)
    sd = {ours: params[theirs].detach() for ours, theirs in names.items() if not ours.endswith(_DENSE)}
    for i in range(c.num_hidden_layers):
        prefix = f"model.layers.{i}.mlp"
        gate_up = params[f"{prefix}.experts.gate_up_proj"].detach()
        down = params[f"{prefix}.experts.down_proj"].detach()
        if dense:
            sd[f"layers.{i}.mlp.w_gate.weight"] = gate_up[0, :d_ff]
            sd[f"layers.{i}.mlp.w_up.weight"] = gate_up[0, d_ff:]
            sd[f"layers.{i}.mlp.w_down.weight"] = down[0]
            continue
        sd[f"layers.{i}.mlp.router.weight"] = params[f"{prefix}.gate.weight"].detach()
        for e in range(c.num_local_experts):
            sd[f"layers.{i}.mlp.experts.{e}.w_gate.weight"] = gate_up[e, :d_ff]
            sd[f"layers.{i}.mlp.experts.{e}.w_up.weight"] = gate_up[e, d_ff:]
            sd[f"layers.{i}.mlp.experts.{e}.w_down.weight"] = down[e]
    return sd
