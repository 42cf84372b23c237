"""Protocol v2 adapter for Lightning AI's litgpt ``GPT`` model: the llama family of ``litgpt_llama.py`` with the
optional capabilities litgpt 0.5.13's ``Config`` implements.

    PYTHONPATH=.ci-litgpt python3 -m pytest spec_tests --impl=spec_adapters/litgpt_v2.py

Install as for ``litgpt_llama.py`` (``pip install --no-deps litgpt==0.5.13 lightning==2.6.6 ...``).

The model is the same ``litgpt.model.GPT`` built from a ``litgpt.Config`` made in code; the component functions,
the sampler, the in-model KV cache, ``forward``, ``generate`` and the parameter count are ``litgpt_llama``'s. Each
v2 config key becomes the ``Config`` field litgpt's own model code reads (``litgpt/model.py``, ``config.py``):

- ``qkv_bias``: ``attn_bias=True`` with ``bias=False`` (``CausalSelfAttention.qkv`` gets a bias, ``proj`` and the
  MLP none); canonical ``attn.w{q,k,v}.bias`` are slices of the fused ``qkv.bias``.
- ``qk_norm``: ``norm_qk=True`` (``norm_qk_type="default"``: an ``RMSNorm(head_size)`` on each head after the
  split, before RoPE); canonical ``attn.{q,k}_norm.weight`` are ``attn.norm_{q,k}.weight``.
- ``sliding_window``: ``sliding_window_size``; ``layer_types``: ``sliding_window_indices`` (1 = sliding). The KV
  cache of a sliding layer is litgpt's ring buffer of ``min(max_seq_length, W)`` positions, read back in time
  order by ``cache_kv`` (amendment 27 allows it).
- ``attn_logit_softcap`` and ``final_logit_softcap``: ``attention_logit_softcapping`` and
  ``final_logit_softcapping`` (``do_softcapping``, ``tanh(x / cap) * cap``).
- ``norm_offset``: litgpt's own switch for ``RMSNorm(add_unit_offset=True)`` is the config name:
  ``Config.norm_class`` passes ``add_unit_offset="Gemma" in self.name``, so such configs are named
  ``spec-Gemma-llama``. The switch reaches every ``RMSNorm`` of the model, q/k norms included.
- ``embed_scale``: ``scale_embeddings=True`` (``x * torch.tensor(n_embd**0.5, dtype=x.dtype)``).
- ``geglu``: ``mlp_class_name="GemmaMLP"`` with ``gelu_approximate="tanh"``.
- ``post_norms``: ``post_attention_norm=True`` and ``post_mlp_norm=True``; canonical ``attn_post_norm.weight``,
  ``mlp_post_norm.weight`` are ``post_attention_norm.weight``, ``post_mlp_norm.weight``.
- ``moe``: ``mlp_class_name="LLaMAMoE"``, ``n_expert``, ``n_expert_per_token``, ``moe_intermediate_size=d_ff``.
  ``LLaMAMoE`` takes ``torch.topk`` of the router logits and a float32 softmax over the chosen ones, which is the
  renormalised top-k of the full softmax (amendment 28's last remark). Canonical ``mlp.router.weight`` is
  ``mlp.gate.weight`` and ``mlp.experts.{e}.{w_gate,w_up,w_down}.weight`` are ``mlp.experts.{e}.{fc_1,fc_2,proj}``.
  ``moe_mlp`` is ``LLaMAMoE`` with the given weights; litgpt has no load-balancing loss (it trains without one), so
  ``moe_load_balancing_loss`` is not provided.
- ``rope_scaling`` (types ``linear`` and ``llama3`` only): ``rope_adjustments`` ``{"factor"}`` (litgpt's linear
  fallback) and ``{"factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len"}``
  (``build_rope_cache``'s Llama 3 branch); ``rope(..., scaling=)`` calls ``build_rope_cache`` with the same
  ``extra_config``.
- ``top_k`` and ``top_p``: ``litgpt.generate.base.sample`` has both.

Left out (their tests skip): ``attention_mask`` (``GPT.forward`` takes no padding mask); ``rope_scaling:dynamic``
(litgpt has no dynamic NTK scaling); ``rope_scaling:yarn`` (litgpt's YaRN branch applies an attention factor only
from ``mscale`` / ``mscale_all_dim``, never transformers' default ``0.1 ln(factor) + 1``, and has no
``attention_factor`` key to map it to; not mapped in the time); ``tied_head`` (no weight tying, as in
``litgpt_llama``). ``causal_mask`` and ``scaled_dot_product_attention`` stay unprovided, as in ``litgpt_llama``
(litgpt's attention is a method of ``CausalSelfAttention``); ``multihead_self_attention`` takes the v2 options
``q_norm``, ``k_norm``, ``norm_eps``, ``softcap`` and ``window`` through the same ``Config`` fields.

A config litgpt cannot express raises ``ValueError`` before anything is built (another rope type, ``geglu``
experts: ``LLaMAMoE``'s experts are always ``LLaMAMLP``), rather than computing something else; so
``test_rope_scaling_rejects_bad_dicts[unknown_type]`` passes on the adapter's refusal (litgpt's ``rope_adjustments``
has no type key: it picks the branch from the keys present). The expected failures are
``litgpt_llama.xfails.toml``'s and ``litgpt_v2.xfails.toml``'s.

With ``attention_logit_softcapping`` or a sliding window, cached chunks of more than one token give wrong logits
(the bool ``mask_cache`` is added to the capped scores; the ring buffer's mask is not rebuilt), while token-by-token
decoding is right: expected failures, the sliding case pinned by
``test_cache_equals_no_cache_past_the_window[chunks-within-the-window]`` (added when this adapter found it).
With ``norm_offset`` and ``qk_norm`` together the q/k norms get the unit offset too (amendment 26 keeps their gains
plain): an expected failure of ``test_norm_offset_leaves_the_qk_norm_gains_plain``, also added when this adapter
found it.
"""

from __future__ import annotations

import dataclasses
import types

import torch
from litgpt import Config
from litgpt.model import GPT, CausalSelfAttention, LLaMAMoE, apply_rope, build_rope_cache

from spec_adapters import litgpt_llama
from spec_adapters.litgpt_llama import (  # noqa: F401 - the protocol names this adapter shares with litgpt_llama
    LitCache,
    count_parameters,
    cross_entropy,
    forward,
    generate,
    new_cache,
    rmsnorm,
    sample,
    swiglu,
)

ROPE_STYLE = "half"
FAMILIES = ("llama",)
PROTOCOL_VERSION = 2
CAPABILITIES = (
    "gqa",
    "untied_head",
    "linear_bias",
    "dropout",
    "free_d_ff",
    "rope_theta",
    "top_k",
    "top_p",
    "rope_scaling:linear",
    "rope_scaling:llama3",
    "qkv_bias",
    "qk_norm",
    "sliding_window",
    "layer_types",
    "logit_softcap",
    "norm_offset",
    "embed_scale",
    "geglu",
    "post_norms",
    "moe",
)


SPEC_XFAILS = ("litgpt_llama.xfails.toml", "litgpt_v2.xfails.toml")  # both files; the later overrides

# ------------------------------------------------------------------------------------------ rope


def rope_adjustments(scaling: dict | None, context_length: int) -> dict | None:
    """litgpt's ``rope_adjustments`` of a Hugging Face ``rope_scaling`` dict (``None``: plain RoPE).

    ``linear`` is litgpt's fallback branch (only ``factor``), ``llama3`` its Llama 3 branch; a missing
    ``original_max_position_embeddings`` is ``context_length`` (amendment 20). Other types have no litgpt
    equivalent and are refused.
    """
    if scaling is None:
        return None
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", scaling.pop("type", None))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return {"factor": scaling["factor"]}
    if kind == "llama3":
        return {
            "factor": scaling["factor"],
            "low_freq_factor": scaling["low_freq_factor"],
            "high_freq_factor": scaling["high_freq_factor"],
            "original_max_seq_len": scaling.get("original_max_position_embeddings") or context_length,
        }
    raise ValueError(f"litgpt_v2 adapter: litgpt has no rope scaling of type {kind!r} (linear and llama3 only)")


def _extra_config(adjustments: dict | None) -> dict | None:
    """``GPT.rope_cache``'s ``extra_config`` of ``rope_adjustments`` (the two branches mapped above)."""
    if adjustments is None:
        return None
    if "low_freq_factor" in adjustments:
        return {k: adjustments[k] for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len")}
    return {"factor": adjustments["factor"]}


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, *, scaling: dict | None = None):
    """``litgpt_llama.rope`` with ``build_rope_cache(..., extra_config=)`` of ``scaling`` (linear, llama3)."""
    if scaling is None:
        return litgpt_llama.rope(x, positions, theta)
    extra = _extra_config(rope_adjustments(scaling, 2048))
    *_, t, d = x.shape
    n = int(positions.max()) + 1 if positions.numel() else 1
    cos, sin = build_rope_cache(seq_len=n, n_elem=d, device=positions.device, base=theta, extra_config=extra)
    cos, sin = cos[positions], sin[positions]
    cos, sin = cos.expand(x.shape).reshape(-1, t, d), sin.expand(x.shape).reshape(-1, t, d)
    return apply_rope(x.reshape(-1, t, d), cos, sin).reshape(x.shape)


# ------------------------------------------------------------------------------------- attention


def multihead_self_attention(
    x,
    wq,
    wk,
    wv,
    wo,
    n_heads,
    n_kv_heads=None,
    theta=None,
    positions=None,
    *,
    q_norm=None,
    k_norm=None,
    norm_eps: float = 1e-5,
    softcap=None,
    window=None,
):
    """litgpt's ``CausalSelfAttention`` as in ``litgpt_llama``, with the v2 options as its ``Config`` fields:
    ``q_norm``/``k_norm`` -> ``norm_qk`` (``RMSNorm`` with ``norm_eps``, weights ``norm_q``, ``norm_k``),
    ``softcap`` -> ``attention_logit_softcapping``, ``window`` -> ``sliding_window_size``."""
    b, t, d = x.shape
    n_kv_heads = n_kv_heads or n_heads
    qk_norm = q_norm is not None or k_norm is not None
    cfg = Config(
        n_embd=d,
        n_head=n_heads,
        n_query_groups=n_kv_heads,
        rotary_percentage=0.0 if theta is None else 1.0,
        bias=False,
        block_size=t,
        padded_vocab_size=1,
        vocab_size=1,
        n_layer=1,
        norm_class_name="RMSNorm",
        norm_eps=norm_eps,
        norm_qk=qk_norm,
        attention_logit_softcapping=softcap,
        sliding_window_size=window,
    )
    attn = CausalSelfAttention(cfg, block_idx=0).to(device=x.device, dtype=x.dtype)
    if positions is None:
        positions = torch.arange(t, device=x.device)
    if theta is None:
        cos = sin = torch.ones(1, t, 0, dtype=x.dtype, device=x.device)
    else:
        cos, sin = litgpt_llama._tables(positions, cfg.head_size, theta)
        cos, sin = cos.reshape(-1, t, cfg.head_size), sin.reshape(-1, t, cfg.head_size)
    params = {"qkv.weight": torch.cat((wq, wk, wv)), "proj.weight": wo}
    if qk_norm:
        params.update({"norm_q.weight": q_norm, "norm_k.weight": k_norm})
    return torch.func.functional_call(attn, params, (x, cos, sin))


# ------------------------------------------------------------------------------------------- moe


def moe_mlp(x, router, w_gate, w_up, w_down, *, top_k):
    """litgpt's ``LLaMAMoE`` (``gate`` = ``router``, expert ``e``'s ``fc_1, fc_2, proj`` = ``w_gate[e], w_up[e],
    w_down[e]``) on ``x [..., d]``, flattened to the ``(1, N, d)`` its forward takes."""
    n_experts, d_ff, d = w_gate.shape
    cfg = types.SimpleNamespace(
        n_embd=d,
        n_expert=n_experts,
        n_expert_per_token=top_k,
        intermediate_size=d_ff,
        moe_intermediate_size=d_ff,
        bias=False,
        n_expert_groups=None,
        n_shared_expert=None,
        routed_scaling_factor=1.0,
    )
    moe = LLaMAMoE(cfg).to(device=x.device, dtype=x.dtype)
    params = {"gate.weight": router}
    for e in range(n_experts):
        params.update(
            {
                f"experts.{e}.fc_1.weight": w_gate[e],
                f"experts.{e}.fc_2.weight": w_up[e],
                f"experts.{e}.proj.weight": w_down[e],
            }
        )
    out = torch.func.functional_call(moe, params, (x.reshape(1, -1, d),))
    return out.reshape(x.shape)


# ----------------------------------------------------------------------------------------- model


def lit_config(config: dict) -> Config:
    """The ``litgpt.Config`` of a llama-family protocol v2 config: ``litgpt_llama.lit_config``'s fields plus each
    v2 key's field (see the module docstring)."""
    if config.get("family", "llama") != "llama":
        raise ValueError(f"litgpt_v2 adapter: family must be 'llama', got {config.get('family')!r}")
    n_experts = config.get("n_experts") or 0
    if n_experts and config.get("geglu"):
        raise ValueError("litgpt_v2 adapter: litgpt's LLaMAMoE experts are LLaMAMLP (SwiGLU); geglu experts, n_experts")
    fields = {}
    if config.get("qkv_bias"):
        fields["attn_bias"] = True
    if config.get("qk_norm"):
        fields["norm_qk"] = True
    if config.get("sliding_window") is not None:
        fields["sliding_window_size"] = config["sliding_window"]
    if config.get("layer_types") is not None:  # another entry is passed as it is, for litgpt's check to judge
        codes = {"sliding_attention": 1, "full_attention": 0}
        fields["sliding_window_indices"] = [codes.get(kind, kind) for kind in config["layer_types"]]
    if config.get("attn_logit_softcap") is not None:
        fields["attention_logit_softcapping"] = config["attn_logit_softcap"]
    if config.get("final_logit_softcap") is not None:
        fields["final_logit_softcapping"] = config["final_logit_softcap"]
    if config.get("embed_scale"):
        fields["scale_embeddings"] = True
    if config.get("geglu"):
        fields.update(mlp_class_name="GemmaMLP", gelu_approximate="tanh")
    if config.get("post_norms"):
        fields.update(post_attention_norm=True, post_mlp_norm=True)
    if n_experts:
        fields.update(mlp_class_name="LLaMAMoE", n_expert=n_experts, moe_intermediate_size=config["d_ff"])
    if config.get("n_experts_per_token") is not None:  # absent: litgpt's default 0
        fields["n_expert_per_token"] = config["n_experts_per_token"]
    adjustments = rope_adjustments(config.get("rope_scaling"), config["context_length"])
    if adjustments is not None:
        fields["rope_adjustments"] = adjustments
    base = litgpt_llama.lit_config({**config, "family": "llama"})
    # litgpt's switch for RMSNorm(add_unit_offset=True): Config.norm_class reads '"Gemma" in self.name'
    name = "spec-Gemma-llama" if config.get("norm_offset") else base.name
    return dataclasses.replace(base, name=name, **fields)


def plain_names(config: Config, tied: bool) -> dict[str, str]:
    """Canonical name -> ``GPT`` parameter, for every weight except the fused ``qkv`` (weight and bias)."""
    names = litgpt_llama.plain_names(config.n_layer, tied)
    for i in range(config.n_layer):
        layer, lit = f"layers.{i}.", f"transformer.h.{i}."
        if config.norm_qk:
            names.update({layer + "attn.q_norm.weight": lit + "attn.norm_q.weight"})
            names.update({layer + "attn.k_norm.weight": lit + "attn.norm_k.weight"})
        if config.post_attention_norm:
            names[layer + "attn_post_norm.weight"] = lit + "post_attention_norm.weight"
        if config.post_mlp_norm:
            names[layer + "mlp_post_norm.weight"] = lit + "post_mlp_norm.weight"
        if config.mlp_class_name == "LLaMAMoE":
            for w in ("w_gate", "w_up", "w_down"):
                del names[f"{layer}mlp.{w}.weight"]
            names[layer + "mlp.router.weight"] = lit + "mlp.gate.weight"
            for e in range(config.n_expert):
                for c, g in (("w_gate", "fc_1"), ("w_up", "fc_2"), ("w_down", "proj")):
                    names[f"{layer}mlp.experts.{e}.{c}.weight"] = f"{lit}mlp.experts.{e}.{g}.weight"
    return names


def fused_names(config: Config) -> dict[str, tuple[str, str]]:
    """Canonical q, k, v weights (and biases, with ``attn_bias``) -> (``qkv`` parameter, slice key)."""
    kinds = ("weight", "bias") if config.attn_bias else ("weight",)
    return {
        f"layers.{i}.attn.{w}.{kind}": (f"transformer.h.{i}.attn.qkv.{kind}", w)
        for i in range(config.n_layer)
        for w in ("wq", "wk", "wv")
        for kind in kinds
    }


def build_model(config: dict, state_dict: dict | None = None) -> GPT:
    """``GPT(lit_config(config))`` in torch's default dtype and device; ``state_dict`` in canonical names.

    Without weights: ``model.apply(model._init_weights)``, litgpt's own initialiser (norms keep their construction
    value, ones). With ``tie_embeddings`` the head holds a copy of the embedding, as in ``litgpt_llama``.
    """
    model = GPT(lit_config(config))
    model._spec_tie_embeddings = bool(config.get("tie_embeddings", True))
    if state_dict is None:
        model.apply(model._init_weights)
        if litgpt_llama._tied(model):
            with torch.no_grad():
                model.lm_head.weight.copy_(model.transformer.wte.weight)
    else:
        load_canonical(model, state_dict)
    return model


@torch.no_grad()
def load_canonical(model: GPT, state_dict: dict) -> None:
    tied = litgpt_llama._tied(model)
    plain, fused = plain_names(model.config, tied), fused_names(model.config)
    unknown = sorted(set(state_dict) - set(plain) - set(fused))
    missing = sorted((set(plain) | set(fused)) - set(state_dict))
    if unknown or missing:
        raise ValueError(f"state_dict does not match the canonical names: missing {missing}, unexpected {unknown}")
    params, slices = dict(model.named_parameters()), litgpt_llama._qkv_slices(model)
    for name, value in state_dict.items():
        if name in plain:
            target = params[plain[name]]
        else:
            param, w = fused[name]
            target = params[param][slices[w]]
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"state_dict[{name!r}] has shape {tuple(value.shape)}, expected {tuple(target.shape)}")
        target.copy_(value)
    if tied:  # litgpt's converters: lm_head.weight = transformer.wte.weight (a copy)
        model.lm_head.weight.copy_(model.transformer.wte.weight)


def canonical_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    params = {k: p.detach() for k, p in model.named_parameters()}
    out = {c: params[g] for c, g in plain_names(model.config, litgpt_llama._tied(model)).items()}
    slices = litgpt_llama._qkv_slices(model)
    for c, (param, w) in fused_names(model.config).items():
        out[c] = params[param][slices[w]]
    return out


def cache_kv(cache: LitCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The filled part of litgpt's buffers ``k, v (B, n_query_groups, positions, head_size)``: every position of a
    full layer; for a sliding layer, the ring buffer (``min(max_seq_length, W)`` positions, position ``p`` in slot
    ``p % W``) read back in time order."""
    blocks = cache.model.transformer.h
    if not 0 <= layer < len(blocks):
        raise ValueError(f"cache_kv: layer {layer} out of range for {len(blocks)} layers")
    kv = blocks[layer].attn.kv_cache
    if not kv.is_sliding_window or cache.length <= kv.max_cache_len:
        return kv.k[:, :, : cache.length], kv.v[:, :, : cache.length]
    slots = torch.arange(cache.length - kv.max_cache_len, cache.length, device=kv.k.device) % kv.max_cache_len
    return kv.k[:, :, slots], kv.v[:, :, slots]
