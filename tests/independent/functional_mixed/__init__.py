"""Independent implementation 3 of protocol v1: functional (parameters in a ParameterDict, the forward
pass as functions over it), torch's fused attention kernel, sampling by sorting, a preallocated KV
cache; interleaved RoPE, both families, computed in the input dtype."""

from .api import (
    build_model,
    cache_kv,
    canonical_state_dict,
    count_parameters,
    evaluate,
    forward,
    generate,
    get_batch,
    kv_cache_bytes,
    new_cache,
    sample,
    sampling_probs,
    train,
    train_step,
)
from .fn import (
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

ROPE_STYLE = "interleaved"
FAMILIES = ("llama", "gpt2")
