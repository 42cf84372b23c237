"""Implementation protocol v1 as data (see docs/protocol.md): the names, the module attributes, the
capabilities an implementation may lack, and the components in build order. What the suite knows
about each name (its component, what it may call, ...) is its entry in ``entries.py``."""

from __future__ import annotations

from .entries import ENTRIES

_MODEL_COMPONENTS = ("model", "kv_cache", "generation")
_NOT_COMPONENTS = ("sampling", *_MODEL_COMPONENTS, "training")
# The names in four groups, in protocol order: each name's component (its entry, ``entries.py``) says which.
COMPONENT_NAMES = tuple(e.name for e in ENTRIES if e.component not in _NOT_COMPONENTS)
SAMPLING_NAMES = tuple(e.name for e in ENTRIES if e.component == "sampling")
MODEL_NAMES = tuple(e.name for e in ENTRIES if e.component in _MODEL_COMPONENTS)
TRAINING_NAMES = tuple(e.name for e in ENTRIES if e.component == "training")
PROTOCOL_NAMES = COMPONENT_NAMES + SAMPLING_NAMES + MODEL_NAMES + TRAINING_NAMES

ALL_FAMILIES = ("llama", "gpt2")
ROPE_STYLES = ("interleaved", "half")
DEFAULT_ROPE_STYLE = "interleaved"

# Module attribute CAPABILITIES: what the implementation supports (default: all of these). A test
# that needs a capability the implementation does not declare is skipped as "not provided".
CAPABILITIES = {
    "gqa": "grouped-query attention: n_kv_heads < n_heads (models and attention functions)",
    "tied_head": "tie_embeddings = True: the LM head is the token embedding parameter",
    "untied_head": "tie_embeddings = False: a separate lm_head.weight",
    "linear_bias": "linear(x, weight, bias) with a bias",
    "dropout": "config dropout > 0 applies dropout in training mode",
    "free_d_ff": "config d_ff is honoured (without it the suite uses d_ff = 4 * d_model)",
    "rope_theta": "config rope_theta and rope(theta=...) are honoured (without it the suite uses 10000)",
}
ALL_CAPABILITIES = tuple(CAPABILITIES)

# Protocol v2 (docs/protocol.md, "Protocol v2"): optional capabilities, absent unless declared.
ROPE_SCALING_TYPES = ("linear", "dynamic", "llama3", "yarn")
V2_CAPABILITIES = {
    "top_k": "sampling_probs, sample and generate honour top_k",
    "top_p": "sampling_probs, sample and generate honour top_p",
    "rope_scaling": "config rope_scaling and rope(..., scaling=) for every type; "
    "'rope_scaling:<type>' for one of " + ", ".join(ROPE_SCALING_TYPES),
    **{f"rope_scaling:{t}": f"rope_scaling of type {t!r} only" for t in ROPE_SCALING_TYPES},
    "attention_mask": "forward and generate take attention_mask=[B, T] of 0/1 (left padding): each row as if alone",
    "qkv_bias": "config qkv_bias: biases on the q, k, v projections only (llama family, Qwen2-style)",
    "sliding_window": "config sliding_window (W): query i attends keys i - W < j <= i in every layer (Mistral); "
    "causal_mask(..., window=) and multihead_self_attention(..., window=)",
    "layer_types": "config layer_types: a per-layer pattern of sliding and full attention (Gemma 2, Qwen2), with "
    "sliding_window (without it the suite windows every layer, as Mistral)",
    "qk_norm": "config qk_norm: per-head RMSNorm on q and k before RoPE (llama family, Qwen3-style); "
    "multihead_self_attention(..., q_norm=, k_norm=, norm_eps=)",
    "logit_softcap": "config attn_logit_softcap and final_logit_softcap: cap * tanh(x / cap) on the attention scores "
    "(before the mask) and on the logits (Gemma 2); scaled_dot_product_attention and multihead_self_attention "
    "(..., softcap=)",
    "norm_offset": "config norm_offset: the model's RMSNorm gains are 1 + weight, fresh weights 0 (llama, Gemma)",
    "embed_scale": "config embed_scale: input embeddings times sqrt(d_model), not the tied head (llama family, Gemma)",
    "geglu": "config geglu: the gated MLP with tanh-GELU on the gate instead of SiLU (llama family, Gemma)",
    "post_norms": "config post_norms: an RMSNorm on each sublayer's output before the residual add, canonical "
    "attn_post_norm and mlp_post_norm (llama family, Gemma 2)",
    "moe": "config n_experts and n_experts_per_token: Mixtral's sparse mixture-of-experts MLP (softmax router, top-k "
    "experts renormalised, SwiGLU experts; llama family); moe_mlp and moe_load_balancing_loss",
}
# Protocol v2 (amendment 26): the config keys an implementation may fix in FIXED_CONFIG (its models always have
# them), each with the capability it needs; the suite then builds every llama config with them. qkv_bias and qk_norm
# too (amendments 22 and 24): Qwen2's attention always has its q, k, v biases, Qwen3's its q/k norms.
FIXABLE_CONFIG = {key: key for key in ("norm_offset", "embed_scale", "geglu", "post_norms", "qkv_bias", "qk_norm")}
KNOWN_CAPABILITIES = {**CAPABILITIES, **V2_CAPABILITIES}
# v1's sampling_probs has both filters: a v1 capability list (and the default) implies them
IMPLIED_BY_V1 = ("top_k", "top_p")
PROTOCOL_VERSIONS = (1, 2)


def config_defaults(config: dict) -> dict:
    """The protocol's defaults of the optional v1 config keys, for ``config`` (protocol: Model): n_kv_heads =
    n_heads, norm_eps 1e-5, tied, no dropout, family llama, and rope_theta 10000 where there is RoPE."""
    defaults = {"norm_eps": 1e-5, "tie_embeddings": True, "dropout": 0.0, "family": "llama"}
    defaults["n_kv_heads"] = config.get("n_heads")
    if config.get("family", "llama") == "llama":
        defaults["rope_theta"] = 10000.0
    return defaults


# The optional config keys of protocol v2 -> (the capability that gives the key, its documented default, whether
# gpt2 has it too): amendments 20 and 22-28. Written out at its default a key means what leaving it out means
# (amendment 31).
V2_CONFIG_DEFAULTS = {
    "rope_scaling": ("rope_scaling", None, False),
    "qkv_bias": ("qkv_bias", False, False),
    "qk_norm": ("qk_norm", False, False),
    "attn_logit_softcap": ("logit_softcap", None, True),
    "final_logit_softcap": ("logit_softcap", None, True),
    "norm_offset": ("norm_offset", False, False),
    "embed_scale": ("embed_scale", False, False),
    "geglu": ("geglu", False, False),
    "post_norms": ("post_norms", False, False),
    "sliding_window": ("sliding_window", None, True),
    "layer_types": ("layer_types", None, True),
    "n_experts": ("moe", 0, False),
}


# The canonical weights (per layer, by suffix) a v2 config key adds where it is set: a crash probe that leaves the
# key at its default leaves them out of the state dict too.
V2_OPTION_WEIGHTS = {
    "qkv_bias": ("attn.wq.bias", "attn.wk.bias", "attn.wv.bias"),
    "qk_norm": ("attn.q_norm.weight", "attn.k_norm.weight"),
    "post_norms": ("attn_post_norm.weight", "mlp_post_norm.weight"),
}
# v1 config options a crash probe may set to their default too -> (the default, the weights the other value adds).
V1_OPTIONS = {"tie_embeddings": (True, ("lm_head.weight",))}
# Keys a probe never turns off alone: the MoE's weights are another MLP's, and layer_types needs its window.
V2_OPTIONS_KEPT = frozenset(("n_experts", "layer_types"))


def effective_capabilities(declared, version=None) -> frozenset[str]:
    """What a ``CAPABILITIES`` list means under ``PROTOCOL_VERSION`` ``version``.

    Version 1: the list (v1 names only) plus ``IMPLIED_BY_V1``, so every v1 implementation keeps its verdicts.
    Version 2: exactly what the list names; ``rope_scaling`` stands for every type. ``None`` (a list given to
    the suite, as grading's rubric, whatever the implementation declares): 2 if it names a v2 capability, else 1.
    """
    names = frozenset(declared)
    if version is None:
        version = 2 if names & set(V2_CAPABILITIES) else 1
    if version not in PROTOCOL_VERSIONS:
        raise ValueError(f"PROTOCOL_VERSION must be one of {PROTOCOL_VERSIONS}, got {version!r}")
    unknown = sorted(names - set(KNOWN_CAPABILITIES))
    if unknown:
        raise ValueError(f"CAPABILITIES lists unknown capabilities {unknown}; known: {list(KNOWN_CAPABILITIES)}")
    if version == 1:
        v2 = sorted(names & set(V2_CAPABILITIES))
        if v2:
            raise ValueError(
                f"CAPABILITIES lists protocol v2 capabilities {v2}: declare PROTOCOL_VERSION = 2 (then list "
                "top_k and top_p too where supported: a v2 list holds exactly what it names)"
            )
        return names | frozenset(IMPLIED_BY_V1)
    if "rope_scaling" in names:
        names |= {f"rope_scaling:{t}" for t in ROPE_SCALING_TYPES}
    elif any(n.startswith("rope_scaling:") for n in names):
        names |= {"rope_scaling"}  # some types: the tests of rope_scaling in general run in one of them
    return names


# Components in the order a student builds them (and the suite runs them: upstream first).
COMPONENT_ORDER = (
    "primitives",
    "norms",
    "mlp",
    "positions",
    "attention",
    "losses",
    "sampling",
    "model",
    "kv_cache",
    "generation",
    "training",
)
