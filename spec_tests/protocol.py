"""Implementation protocol v1 as data (see docs/protocol.md): the names, the module attributes, the
capabilities an implementation may lack, which component each name belongs to, and which names
each one may call."""

from __future__ import annotations

COMPONENT_NAMES = (
    "linear",
    "embedding",
    "softmax",
    "silu",
    "rmsnorm",
    "layernorm",
    "swiglu",
    "gelu_mlp",
    "rope",
    "sinusoidal_positions",
    "causal_mask",
    "repeat_kv",
    "scaled_dot_product_attention",
    "flash_attention",
    "multihead_self_attention",
    "cross_entropy",
    "lm_loss",
)
SAMPLING_NAMES = ("sampling_probs", "sample")
MODEL_NAMES = (
    "build_model",
    "canonical_state_dict",
    "forward",
    "new_cache",
    "cache_kv",
    "generate",
    "count_parameters",
    "kv_cache_bytes",
)
TRAINING_NAMES = ("get_batch", "train_step", "train", "evaluate")
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
}
KNOWN_CAPABILITIES = {**CAPABILITIES, **V2_CAPABILITIES}
# v1's sampling_probs has both filters: a v1 capability list (and the default) implies them
IMPLIED_BY_V1 = ("top_k", "top_p")
PROTOCOL_VERSIONS = (1, 2)


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


# Which component (test module, rubric entry) each protocol name belongs to.
COMPONENT_OF = {
    **dict.fromkeys(("linear", "embedding", "softmax", "silu"), "primitives"),
    **dict.fromkeys(("rmsnorm", "layernorm"), "norms"),
    **dict.fromkeys(("swiglu", "gelu_mlp"), "mlp"),
    **dict.fromkeys(("rope", "sinusoidal_positions"), "positions"),
    **dict.fromkeys(
        ("causal_mask", "repeat_kv", "scaled_dot_product_attention", "flash_attention", "multihead_self_attention"),
        "attention",
    ),
    **dict.fromkeys(("cross_entropy", "lm_loss"), "losses"),
    **dict.fromkeys(("sampling_probs", "sample"), "sampling"),
    **dict.fromkeys(("build_model", "canonical_state_dict", "forward", "count_parameters", "kv_cache_bytes"), "model"),
    **dict.fromkeys(("new_cache", "cache_kv"), "kv_cache"),
    "generate": "generation",
    **dict.fromkeys(TRAINING_NAMES, "training"),
}
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

_MODEL_PARTS = (
    "linear",
    "embedding",
    "softmax",
    "silu",
    "rmsnorm",
    "layernorm",
    "swiglu",
    "gelu_mlp",
    "rope",
    "sinusoidal_positions",
    "causal_mask",
    "repeat_kv",
    "scaled_dot_product_attention",
    "flash_attention",
    "multihead_self_attention",
)
# name -> the protocol names an implementation of it may call (directly or not): where a failing
# test may trace back to.
MAY_CALL = {
    "swiglu": ("linear", "silu"),
    "gelu_mlp": ("linear",),
    "scaled_dot_product_attention": ("softmax", "repeat_kv", "causal_mask"),
    "flash_attention": ("repeat_kv", "causal_mask"),
    "multihead_self_attention": (
        "linear",
        "rope",
        "repeat_kv",
        "scaled_dot_product_attention",
        "flash_attention",
        "softmax",
        "causal_mask",
    ),
    "cross_entropy": ("softmax",),
    "lm_loss": ("cross_entropy", "softmax"),
    "sampling_probs": ("softmax",),
    "sample": ("sampling_probs", "softmax"),
    "forward": _MODEL_PARTS,
    # building a model and bookkeeping over its parameters compute nothing with the components (a
    # table made at build time matters only through forward, whose closure holds them); so a
    # component's failure never excuses these, and a rerun with it replaced is never tried
    **dict.fromkeys(("build_model", "canonical_state_dict", "count_parameters"), ()),
    **dict.fromkeys(("new_cache", "cache_kv"), ("forward", *_MODEL_PARTS)),
    "generate": ("forward", "new_cache", "sample", "sampling_probs", *_MODEL_PARTS),
    "train_step": ("forward", "cross_entropy", "lm_loss", *_MODEL_PARTS),
    "train": ("get_batch", "train_step", "forward", "cross_entropy", "lm_loss", *_MODEL_PARTS),
    "evaluate": ("forward", "cross_entropy", "lm_loss", *_MODEL_PARTS),
}
# Names a correct version can stand in for inside an implementation: functions of tensors and
# numbers. Model-bound names (built models, caches, optimizers) cannot be swapped one at a time.
SUBSTITUTABLE = frozenset(COMPONENT_NAMES + SAMPLING_NAMES + ("get_batch", "kv_cache_bytes"))
