"""The decoder-only transformer, both families, readable top to bottom.

``llama``: RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases.
``gpt2``: LayerNorm, learned absolute positions, GELU MLP, biases on every projection.
Both are pre-norm: ``x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))``, then a final norm
and the LM head (by default the token embedding itself). Module names are the canonical weight
names of protocol v1, so ``state_dict`` needs no renaming.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import ATTENTION_PATHS, merge_heads, split_heads
from .config import ModelConfig, parse_config
from .kv_cache import KVCache
from .mlp import gelu_tanh
from .norms import layernorm, rmsnorm
from .positions import apply_rotation, check_rope_style, rope_angles


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return layernorm(x, self.weight, self.bias, self.eps)


class Rotary(nn.Module):
    """RoPE with cos/sin tables for positions ``[0, context_length)``.

    Tables are computed in float64 and cached per (device, dtype), so casting the model never
    degrades them; they are not buffers and so not part of the state dict.
    """

    def __init__(self, d_head: int, context_length: int, theta: float, style: str):
        super().__init__()
        self.d_head, self.context_length, self.theta = d_head, context_length, theta
        self.style = check_rope_style(style)
        self._tables: dict = {}

    def tables(self, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (str(device), dtype)
        if key not in self._tables:
            angles = rope_angles(torch.arange(self.context_length, device=device), self.d_head, self.theta)
            compute = torch.promote_types(dtype, torch.float32)
            self._tables[key] = (angles.cos().to(compute), angles.sin().to(compute))
        return self._tables[key]

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate ``x [B, H, T, d_head]`` as positions ``start .. start+T-1``."""
        cos, sin = self.tables(x.device, x.dtype)
        t = x.shape[-2]
        rotated = apply_rotation(x.to(cos.dtype), cos[start : start + t], sin[start : start + t], self.style)
        return rotated.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, bias: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.kv_heads, cfg.d_head
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=bias)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.d_head, bias=bias)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.d_head, bias=bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=bias)
        self.attend = ATTENTION_PATHS[cfg.attention]

    def forward(self, x, rotary: Rotary | None, start: int, cache: KVCache | None, layer: int):
        q = split_heads(self.wq(x), self.n_heads)  # [B, H, T, d_head]
        k = split_heads(self.wk(x), self.n_kv_heads)  # [B, Hkv, T, d_head]
        v = split_heads(self.wv(x), self.n_kv_heads)
        if rotary is not None:
            q, k = rotary(q, start), rotary(k, start)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        return self.wo(merge_heads(self.attend(q, k, v, causal=True)))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))  # F.silu: x * sigmoid(x), one kernel


class GeluMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w_proj = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        return self.w_proj(gelu_tanh(self.w_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        llama = cfg.family == "llama"
        Norm = RMSNorm if llama else LayerNorm
        self.attn_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, bias=not llama)
        self.mlp_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg) if llama else GeluMLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, rotary, start, cache, layer):
        x = x + self.drop(self.attn(self.attn_norm(x), rotary, start, cache, layer))
        return x + self.drop(self.mlp(self.mlp_norm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope_style: str = "interleaved"):
        super().__init__()
        self.config = cfg
        llama = cfg.family == "llama"
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if not llama:
            self.pos_embeddings = nn.Embedding(cfg.context_length, cfg.d_model)
        self.rotary = Rotary(cfg.d_head, cfg.context_length, cfg.rope_theta, rope_style) if llama else None
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = (RMSNorm if llama else LayerNorm)(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight  # one parameter, two uses

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """ids ``[B, T]`` long -> logits ``[B, T, V]``; with a cache, positions continue from it."""
        check_ids(ids, self.config.vocab_size)
        start = 0 if cache is None else cache.length
        if cache is not None and cache.batch_size != ids.shape[0]:
            raise ValueError(f"forward: cache holds {cache.batch_size} sequences but ids has batch {ids.shape[0]}")
        if start + ids.shape[1] > self.config.context_length:
            raise ValueError(
                f"forward: {start} cached + {ids.shape[1]} new tokens exceed context_length="
                f"{self.config.context_length}"
            )
        x = self.tok_embeddings(ids)
        if self.rotary is None:
            x = x + self.pos_embeddings(torch.arange(start, start + ids.shape[1], device=ids.device))
        x = self.drop(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.rotary, start, cache, i)
        return self.lm_head(self.final_norm(x))


def check_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Token ids must be a long ``[B, T]`` tensor with values in ``[0, vocab_size)``."""
    if ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(f"ids must be a long tensor [B, T], got {ids.dtype} {tuple(ids.shape)}")
    if ids.device.type == "cpu" and ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got min {ids.min().item()} max {ids.max().item()}")


RESIDUAL_PROJECTIONS = ("attn.wo.weight", "mlp.w_down.weight", "mlp.w_proj.weight")


@torch.no_grad()
def init_weights(model: Transformer) -> None:
    """Linear/Embedding weights ~ N(0, 0.02); residual projections ~ N(0, 0.02/sqrt(2 n_layers));
    biases 0; norm weights 1."""
    residual_std = 0.02 / math.sqrt(2 * model.config.n_layers)
    for name, p in model.named_parameters():
        if name.endswith(RESIDUAL_PROJECTIONS):
            p.normal_(0.0, residual_std)
        elif name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, 0.02)


def build_model(config: dict, state_dict: dict | None = None, *, rope_style: str = "interleaved") -> Transformer:
    """A model for ``config``; weights from a canonical ``state_dict`` or freshly initialised.

    Parameters are created in torch's default dtype on its default device. ``rope_style``
    (reference option) selects the RoPE channel pairing, ``"interleaved"`` or ``"half"``.
    """
    model = Transformer(parse_config(config), rope_style)
    if state_dict is None:
        init_weights(model)
    else:
        load_canonical(model, state_dict)
    return model


@torch.no_grad()
def load_canonical(model: Transformer, state_dict: dict) -> None:
    params = dict(model.named_parameters())  # a tied lm_head is not listed separately
    missing = sorted(set(params) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(params))
    if missing or unexpected:
        raise ValueError(f"state_dict does not match the canonical names: missing {missing}, unexpected {unexpected}")
    for name, value in state_dict.items():
        if tuple(value.shape) != tuple(params[name].shape):
            raise ValueError(
                f"state_dict[{name!r}] has shape {tuple(value.shape)}, expected {tuple(params[name].shape)}"
            )
        params[name].copy_(value)


def canonical_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The weights under canonical names (``lm_head.weight`` only when untied)."""
    return {name: p.detach() for name, p in model.named_parameters()}


def forward(model: Transformer, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    """logits ``[B, T, V]`` for ids ``[B, T]``; with ``cache``, ids follow the cached tokens."""
    return model(ids, cache)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters: a tied matrix counts once. Works on the ``meta`` device."""
    return sum(p.numel() for p in model.parameters())
