"""Independent implementation 1 of protocol v1: nn.Module-heavy, interleaved RoPE, both families,
computed in the input dtype (float64-exact)."""

from .api import (
    build_model,
    cache_kv,
    canonical_state_dict,
    count_parameters,
    forward,
    generate,
    kv_cache_bytes,
    new_cache,
)
from .ops import (
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
from .sampling import sample, sampling_probs
from .training import evaluate, get_batch, train, train_step

ROPE_STYLE = "interleaved"
FAMILIES = ("llama", "gpt2")
