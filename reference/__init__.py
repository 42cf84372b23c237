"""The reference implementation of protocol v1 and of the v2 capabilities it declares: the ground truth
the spec suite compares against.

Written with einops, in float64-exact form, CPU and CUDA. Every protocol name is re-exported here.
"""

from .attention import (
    causal_mask,
    flash_attention,
    multihead_self_attention,
    repeat_kv,
    scaled_dot_product_attention,
)
from .generation import generate
from .kv_cache import KVCache, cache_kv, kv_cache_bytes, new_cache
from .losses import cross_entropy, lm_loss
from .mlp import gelu_mlp, swiglu
from .model import build_model, canonical_state_dict, count_parameters, forward
from .moe import moe_load_balancing_loss, moe_mlp
from .norms import layernorm, rmsnorm
from .positions import rope, sinusoidal_positions
from .primitives import embedding, linear, silu, softmax
from .sampling import sample, sampling_probs
from .training import evaluate, get_batch, train, train_step

ROPE_STYLE = "interleaved"
FAMILIES = ("llama", "gpt2")
# Protocol v2: CAPABILITIES holds exactly what it names (every v1 capability, and the v2 ones).
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

PROTOCOL_NAMES = (
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
)

__all__ = [*PROTOCOL_NAMES, "ROPE_STYLE", "FAMILIES", "KVCache"]  # not its CAPABILITIES: a star import stays v1
