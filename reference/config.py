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
    attention: str = "sdpa"  # reference only: multihead_self_attention's attention, "sdpa" (fastest), "flash", "naive"

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
    return cfg
