"""Names and module attributes of implementation protocol v1 (see docs/protocol.md)."""

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
