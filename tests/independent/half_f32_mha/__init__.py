"""Independent implementation 2 of protocol v1: a Meta/Hugging Face-style Llama (half-split RoPE, MHA
only) whose statistics, softmax and RoPE tables are float32 whatever the input dtype."""

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

ROPE_STYLE = "half"
FAMILIES = ("llama",)
CAPABILITIES = ("tied_head", "untied_head", "linear_bias", "dropout", "free_d_ff", "rope_theta")
