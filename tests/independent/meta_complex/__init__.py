"""Independent Meta-Llama-style implementation of transformer-spec protocol v1."""

from .functional import (
    causal_mask,
    cross_entropy,
    embedding,
    flash_attention,
    gelu_mlp,
    layernorm,
    linear,
    lm_loss,
    multihead_self_attention,
    repeat_kv,
    rmsnorm,
    rope,
    scaled_dot_product_attention,
    silu,
    sinusoidal_positions,
    softmax,
    swiglu,
)
from .model import build_model, cache_kv, canonical_state_dict, count_parameters, forward, kv_cache_bytes, new_cache
from .sampling import sample, sampling_probs
from .training import evaluate, generate, get_batch, train, train_step

ROPE_STYLE = "interleaved"
FAMILIES = ("llama", "gpt2")
