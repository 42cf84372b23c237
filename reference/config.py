"""The model configuration: a plain dict in the protocol, validated into a dataclass here."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .attention import ATTENTION_KERNELS
from .rope_scaling import check_rope_scaling

FAMILIES = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelConfig:
    """Protocol keys (defaults as in protocol v1) plus the reference's own ``attention`` path."""

    vocab_size: int
    context_length: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    family: str = "llama"
    rope_scaling: dict | None = None  # protocol v2: a Hugging Face rope_scaling dict (checked: rope_type set)
    qkv_bias: bool = False  # protocol v2 (amendment 22): biases on the q, k, v projections only (llama family)
    qk_norm: bool = False  # protocol v2 (amendment 24): per-head RMSNorm on q and k before RoPE (llama family)
    sliding_window: int | None = None  # protocol v2 (amendment 27): window W, query i sees keys i - W < j <= i
    layer_types: tuple | None = None  # protocol v2 (amendment 27): "sliding_attention" | "full_attention" per layer
    attn_logit_softcap: float | None = None  # protocol v2 (amendment 25): scores -> cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # protocol v2 (amendment 25): logits -> cap * tanh(logits / cap)
    norm_offset: bool = False  # protocol v2 (amendment 26): RMSNorm gains are 1 + weight (Gemma; llama family)
    embed_scale: bool = False  # protocol v2 (amendment 26): input embeddings times sqrt(d_model) (llama family)
    geglu: bool = False  # protocol v2 (amendment 26): the gated MLP with tanh-GELU instead of SiLU (llama family)
    post_norms: bool = False  # protocol v2 (amendment 26): an RMSNorm on each sublayer's output (llama family)
    n_experts: int = 0  # protocol v2 (amendment 28): Mixtral-style MoE MLP with this many experts (0: dense)
    n_experts_per_token: int | None = None  # protocol v2 (amendment 28): top-k experts per token, 1 <= k <= n_experts
    attention: str = "sdpa"  # reference only: multihead_self_attention's attention, "sdpa" (fastest), "flash", "naive"

    def layer_window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (amendment 27): ``sliding_window`` in a sliding layer, else None."""
        if self.layer_types is None or self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


REQUIRED = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff")


def parse_config(config: dict) -> ModelConfig:
    """Validate a protocol config dict; every problem is a ``ValueError`` naming the values."""
    if isinstance(config, ModelConfig):
        return config
    known = {f.name for f in fields(ModelConfig)}
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise ValueError(f"config is missing {missing}")
    cfg = ModelConfig(**{k: v for k, v in config.items() if k in known})
    for key in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff"):
        if int(getattr(cfg, key)) < 1:
            raise ValueError(f"config {key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.family not in FAMILIES:
        raise ValueError(f"config family must be one of {FAMILIES}, got {cfg.family!r}")
    if cfg.attention not in ATTENTION_KERNELS:
        raise ValueError(f"config attention must be one of {ATTENTION_KERNELS}, got {cfg.attention!r}")
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
    if cfg.kv_heads < 1 or cfg.n_heads % cfg.kv_heads:
        raise ValueError(f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={cfg.kv_heads}")
    if cfg.family == "llama" and cfg.d_head % 2:
        raise ValueError(
            f"RoPE needs an even head dimension: d_model={cfg.d_model} / n_heads={cfg.n_heads} = {cfg.d_head}"
        )
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"config dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.rope_scaling is not None:
        if cfg.family != "llama":
            raise ValueError(f"config rope_scaling needs RoPE (family 'llama'), got family {cfg.family!r}")
        cfg = replace(cfg, rope_scaling=check_rope_scaling(cfg.rope_scaling, cfg.context_length))
    if not isinstance(cfg.qkv_bias, bool):
        raise ValueError(f"config qkv_bias must be True or False, got {cfg.qkv_bias!r}")
    if cfg.qkv_bias and cfg.family != "llama":
        raise ValueError(f"config qkv_bias is for family 'llama' (gpt2 has every bias already), got {cfg.family!r}")
    if not isinstance(cfg.qk_norm, bool):
        raise ValueError(f"config qk_norm must be True or False, got {cfg.qk_norm!r}")
    if cfg.qk_norm and cfg.family != "llama":
        raise ValueError(
            f"config qk_norm is for family 'llama' (it normalises q and k before RoPE), got {cfg.family!r}"
        )
    if cfg.sliding_window is not None or cfg.layer_types is not None:
        cfg = replace(cfg, layer_types=check_layer_types(cfg.sliding_window, cfg.layer_types, cfg.n_layers))
    check_gemma_options(cfg)
    check_moe(cfg)
    return cfg


def check_moe(cfg: ModelConfig) -> None:
    """Protocol v2 (amendment 28): ``n_experts`` an int >= 0 (0: the dense MLP), llama family only; with experts,
    ``n_experts_per_token`` an int in ``[1, n_experts]``, without them absent."""
    n, k = cfg.n_experts, cfg.n_experts_per_token
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"config n_experts must be an int >= 0 (0: dense MLP), got {n!r}")
    if n == 0:
        if k is not None:
            raise ValueError(f"config n_experts_per_token={k!r} needs n_experts >= 1, got n_experts={n!r}")
        return
    if cfg.family != "llama":
        raise ValueError(f"config n_experts is for family 'llama' (SwiGLU experts), got family {cfg.family!r}")
    if cfg.geglu:
        raise ValueError(f"config n_experts={n} with geglu: the experts are SwiGLU (no GeGLU experts)")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"config n_experts_per_token must be an int in [1, n_experts={n}], got {k!r}")


GEMMA_OPTIONS = ("norm_offset", "embed_scale", "geglu", "post_norms")  # protocol v2, amendment 26


def check_gemma_options(cfg: ModelConfig) -> None:
    """Protocol v2: the soft-caps (amendment 25) are None or a number > 0; the Gemma-style options (amendment 26)
    are True or False, and llama-family only (gpt2 has LayerNorm, learned positions and a biased GELU MLP)."""
    for key in ("attn_logit_softcap", "final_logit_softcap"):
        cap = getattr(cfg, key)
        if cap is None:
            continue
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0 or cap == float("inf"):
            raise ValueError(f"config {key} must be a finite number > 0 (or None), got {cap!r}")
    for key in GEMMA_OPTIONS:
        value = getattr(cfg, key)
        if not isinstance(value, bool):
            raise ValueError(f"config {key} must be True or False, got {value!r}")
        if value and cfg.family != "llama":
            raise ValueError(f"config {key} is for family 'llama' (Gemma-style options), got family {cfg.family!r}")


LAYER_TYPES = ("sliding_attention", "full_attention")  # Hugging Face's layer_types values (amendment 27)


def check_layer_types(window, layer_types, n_layers: int) -> tuple[str, ...]:
    """Protocol v2 (amendment 27): ``sliding_window`` and ``layer_types`` checked; the per-layer types as a tuple.

    ``layer_types`` None: every layer sliding when there is a window (Mistral), else every layer full.
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"config sliding_window must be an int >= 1 (or None), got {window!r}")
    if layer_types is None:
        return ("sliding_attention" if window is not None else "full_attention",) * n_layers
    if not isinstance(layer_types, (list, tuple)) or len(layer_types) != n_layers:
        raise ValueError(
            f"config layer_types must be a list of n_layers={n_layers} entries, got {layer_types!r}"
            + (f" ({len(layer_types)} entries)" if isinstance(layer_types, (list, tuple)) else "")
        )
    unknown = [t for t in layer_types if t not in LAYER_TYPES]
    if unknown:
        raise ValueError(f"config layer_types entries must be one of {LAYER_TYPES}, got {unknown[0]!r}")
    if window is None and "sliding_attention" in layer_types:
        raise ValueError(
            f"config layer_types has 'sliding_attention' layers ({list(layer_types)}) but sliding_window is None: "
            "give the window W"
        )
    return tuple(layer_types)
