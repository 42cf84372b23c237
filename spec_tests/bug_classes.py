"""Bug classes, and the spec test files meant to catch each.

``tools/bugcheck.py`` fails a catalogued bug that is caught only by test files *unrelated* to its
class: a bug killed by accident (a crash somewhere else) shows a hole in the tests that are about
it. Names match the suite's ``bug_class`` markers where one exists. Files are test-module stems.
"""

from __future__ import annotations

ATTENTION, MODEL, CACHE, GENERATION = "test_attention", "test_model", "test_kv_cache", "test_generation"
SAMPLING, TRAINING, LOSSES, POSITIONS = "test_sampling", "test_training", "test_losses", "test_positions"
PRIMITIVES, NORMS, MLP = "test_primitives", "test_norms", "test_mlp"

# class -> (what it is, the test files meant to catch it)
BUG_CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "layout": ("wrong tensor layout after reshape/transpose", (PRIMITIVES, ATTENTION, MODEL)),
    "leading_dims": (
        "a fixed rank assumed where the protocol allows any leading dims",
        # sampling_probs' and sample's own shapes (test_sampling_probs_any_...), generate's prompt of one row
        ("test_leading_dims", "test_sampling", GENERATION),
    ),
    "mask_broadcast": ("mask broadcast over the wrong axes", (ATTENTION,)),
    "masking": ("mask applied at the wrong stage", (ATTENTION,)),
    "softmax_dim": ("softmax over the wrong dimension", (PRIMITIVES, ATTENTION)),
    "causality": ("no causal mask: the model sees the future", (ATTENTION, MODEL, CACHE)),
    "causal_mask": ("causal mask aligned top-left instead of bottom-right", (ATTENTION, CACHE, MODEL)),
    "attention_scale": ("scores not scaled by 1/sqrt(d_head)", (ATTENTION,)),
    "stability": ("exp of a large number: no max subtraction", (PRIMITIVES, LOSSES, ATTENTION, SAMPLING)),
    "flash": ("online softmax bookkeeping", (ATTENTION,)),
    "gqa": ("grouped-query head sharing", (ATTENTION, MODEL, CACHE)),
    "rope": ("rotary embedding rotation or positions", (POSITIONS, ATTENTION, MODEL)),
    "rope_frequency": ("wrong RoPE frequency exponent", (POSITIONS, ATTENTION, MODEL)),
    "rope_on_values": ("RoPE applied to values", (ATTENTION, MODEL, CACHE)),
    "rope_q_only": ("RoPE applied to queries only", (ATTENTION, MODEL, CACHE)),
    "rope_scaling": ("RoPE scaling for long context (linear, dynamic, llama3, yarn)", ("test_rope_scaling",)),
    "qkv_bias": ("Qwen2-style biases on the q, k, v projections only", ("test_qkv_bias",)),
    "config_defaults": ("a config key written out at its default read as set", ("test_config_defaults",)),
    "sliding_window": (
        "sliding-window attention (protocol v2): the window's width, alignment, per-layer pattern, cached path",
        ("test_sliding_window",),
    ),
    "qk_norm": ("Qwen3-style per-head RMSNorm on q and k before RoPE", ("test_qk_norm",)),
    "logit_softcap": (
        "Gemma 2's soft-caps cap * tanh(x / cap): on the attention scores before the mask, on the final logits",
        ("test_logit_softcap",),
    ),
    "norm_offset": ("Gemma's RMSNorm gains 1 + weight (weights stored as offsets)", ("test_gemma_style",)),
    "embed_scale": ("Gemma's input embeddings times sqrt(d_model), not the tied head", ("test_gemma_style",)),
    "geglu": ("Gemma's GeGLU MLP: tanh-GELU on the gate projection", ("test_gemma_style",)),
    "post_norms": ("Gemma 2's norms on each sublayer's output, before the residual add", ("test_gemma_style",)),
    "moe": (
        "Mixtral's sparse MoE MLP: the router's softmax axis, the top-k and its renormalisation, the expert order, "
        "the load-balancing loss",
        ("test_moe",),
    ),
    "sinusoidal": ("sinusoidal position table", (POSITIONS,)),
    "rmsnorm": ("RMSNorm formula (eps placement)", (NORMS, MODEL)),
    "layernorm": ("LayerNorm formula (variance)", (NORMS, MODEL)),
    "precision": ("statistics in too low a precision", (NORMS, "test_precision")),
    "float64_precision": ("float64 inputs computed in float32", ("test_precision",)),
    "half_precision": ("a model that does not run in bfloat16: dtypes mixed on the way", ("test_precision_bfloat16",)),
    "swiglu": ("SwiGLU gate and up projections", (MLP, MODEL)),
    "gelu": ("GELU variant", (MLP, MODEL)),
    "norm_placement": ("post-LN or a missing norm", (MODEL,)),
    "wiring": (
        "how the model connects its parts (residuals, parallel branches, scales) or lays out its weights",
        (MODEL,),
    ),
    "tied_weights": ("tied weights copied instead of shared", (MODEL, TRAINING)),
    "weight_copies": ("the model keeps the caller's weight tensors instead of copies", (MODEL, TRAINING)),
    "init": ("initialisation scale", (MODEL,)),
    "validation": ("bad configuration accepted silently", (MODEL, POSITIONS)),
    "kv_cache": ("KV cache layout or contents", (CACHE, GENERATION)),
    "cache_positions": ("positions do not continue in the cache", (CACHE, GENERATION)),
    "prompt_cropping": ("no cropping to the last context_length tokens", (GENERATION,)),
    "dropout_generation": ("dropout on during generation", (GENERATION,)),
    "mode_restore": ("the module's train/eval mode not restored", (GENERATION, TRAINING)),
    "sampling_order": ("sampling before the temperature/top-k/top-p transforms", (SAMPLING, GENERATION)),
    "top_p": ("nucleus boundary", (SAMPLING,)),
    "top_k": ("top-k count", (SAMPLING,)),
    "unshifted_labels": ("loss on unshifted labels", (LOSSES, TRAINING)),
    "ignore_index": ("ignored targets counted", (LOSSES,)),
    "evaluation": ("evaluation loss weighting or mode", (TRAINING,)),
    "training": ("optimisation step", (TRAINING,)),
    "gradient_clipping": ("gradient clipping", (TRAINING,)),
    "get_batch": ("batch sampling windows", (TRAINING,)),
    "memory": ("KV cache memory accounting", (CACHE, MODEL)),
    "batch_mixing": ("a sequence's output depends on the other sequences of the batch", (ATTENTION, MODEL)),
    "padding": (
        "left-padded batches (protocol v2, attention_mask): positions, padding masks, the cached path",
        ("test_batched_generation",),
    ),
}


def related_files(bug_class: str) -> tuple[str, ...]:
    """The test-file stems meant to catch bugs of ``bug_class``."""
    try:
        return BUG_CLASSES[bug_class][1]
    except KeyError:
        raise ValueError(f"unknown bug class {bug_class!r}; known: {sorted(BUG_CLASSES)}") from None
