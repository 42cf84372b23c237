"""The student skeleton of protocol v1: build a GPT-2 / Llama-style decoder from scratch.

Every protocol function is here with its exact signature and a docstring to work from; every
body raises ``NotImplementedError("<name>")`` until you write it. Run the spec suite against
your work with::

    pytest spec_tests --impl=student

Functions still raising ``NotImplementedError`` show up as one-line "not implemented" failures
naming the function, so you can implement one concept at a time. A suggested order (each
module's docstring says what it holds):

    primitives.py   linear, embedding, softmax, silu
    norms.py        rmsnorm, layernorm
    mlp.py          swiglu, gelu_mlp
    moe.py          moe_mlp, moe_load_balancing_loss (protocol v2, optional: capability "moe")
    positions.py    rope, sinusoidal_positions
    attention.py    causal_mask, repeat_kv, scaled_dot_product_attention,
                    multihead_self_attention, flash_attention
    losses.py       cross_entropy, lm_loss
    sampling.py     sampling_probs, sample
    model.py        build_model, canonical_state_dict, forward, count_parameters
    kv_cache.py     new_cache, cache_kv, kv_cache_bytes
    generation.py   generate
    training.py     get_batch, train_step, train, evaluate

Conventions (protocol v1): weights are ``[out_features, in_features]``; hidden states
``[B, T, d_model]``; per-head tensors ``[B, H, T, d_head]``; boolean masks ``True`` = may attend;
causal masks are bottom-right aligned; inputs are never modified in place; everything works on
CPU and CUDA, float32 and float64.
"""

from .attention import (
    causal_mask,
    flash_attention,
    multihead_self_attention,
    repeat_kv,
    scaled_dot_product_attention,
)
from .generation import generate
from .kv_cache import cache_kv, kv_cache_bytes, new_cache
from .losses import cross_entropy, lm_loss
from .mlp import gelu_mlp, swiglu
from .model import build_model, canonical_state_dict, count_parameters, forward
from .moe import moe_load_balancing_loss, moe_mlp
from .norms import layernorm, rmsnorm
from .positions import rope, sinusoidal_positions
from .primitives import embedding, linear, silu, softmax
from .sampling import sample, sampling_probs
from .training import evaluate, get_batch, train, train_step

# Which channels RoPE pairs up; the spec suite checks your rope/model in the style named here.
#   "interleaved": pair i is channels (2i, 2i+1)           -- RoFormer paper (the default)
#   "half":        pair i is channels (i, i + d_head/2)    -- GPT-NeoX / Hugging Face `rotate_half`
# Students may switch to "half" if that is the style they implement; the two are the same model
# up to a permutation of the q/k weight rows, so either is correct -- but not a mix of both.
ROPE_STYLE = "interleaved"

# The model families this implementation supports; the skeleton lists both, so both are tested.
FAMILIES = ("llama", "gpt2")

# What it supports (docs/protocol.md, amendments 10 and 18). The skeleton lists everything, so everything
# is tested; remove what you choose not to build, e.g. "rope_scaling" (long-context RoPE, optional) or,
# for a sampler without nucleus sampling, "top_p", or "attention_mask" (left-padded batched generation,
# amendment 23). Under PROTOCOL_VERSION = 2 the list holds exactly what it names.
PROTOCOL_VERSION = 2
CAPABILITIES = (
    "gqa",
    "tied_head",
    "untied_head",
    "linear_bias",
    "dropout",
    "free_d_ff",
    "rope_theta",
    "top_k",
    "top_p",
    "rope_scaling",
    "attention_mask",
    "qkv_bias",
    "sliding_window",
    "layer_types",
    "qk_norm",
    "logit_softcap",
    "norm_offset",
    "embed_scale",
    "geglu",
    "post_norms",
    "moe",
)

__all__ = [
    "linear",
    "embedding",
    "softmax",
    "silu",
    "rmsnorm",
    "layernorm",
    "swiglu",
    "gelu_mlp",
    "moe_mlp",
    "rope",
    "sinusoidal_positions",
    "causal_mask",
    "repeat_kv",
    "scaled_dot_product_attention",
    "flash_attention",
    "multihead_self_attention",
    "cross_entropy",
    "lm_loss",
    "moe_load_balancing_loss",
    "sampling_probs",
    "sample",
    "build_model",
    "canonical_state_dict",
    "forward",
    "new_cache",
    "cache_kv",
    "generate",
    "count_parameters",
    "kv_cache_bytes",
    "get_batch",
    "train_step",
    "train",
    "evaluate",
    "ROPE_STYLE",
    "FAMILIES",
]
