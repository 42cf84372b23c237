"""The decoder-only transformer, both families, composed from the component functions.

``llama``: RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases.
``gpt2``: LayerNorm, learned absolute positions, GELU MLP, biases on every projection.
Both are pre-norm: ``x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))``, then a final norm
and the LM head (by default the token embedding itself). Module names are the canonical weight
names of protocol v1, so ``state_dict`` needs no renaming.

Each module holds its parameters (``nn.Linear``/``nn.Embedding`` only hold weights under those
names) and calls one component function by its module-level name (``rmsnorm``,
``multihead_self_attention``, ``swiglu`` ...), choosing that function's fast path where it has one:
the model computes nothing a component function does not, and rebinding a component's name in the
module that calls it (as the suite's root-cause reruns do) changes what the model computes.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn

from .attention import multihead_self_attention
from .config import ModelConfig, parse_config
from .kv_cache import KVCache
from .mlp import geglu, gelu_mlp, swiglu
from .moe import moe_mlp
from .norms import layernorm, rmsnorm
from .padding import check_attention_mask, key_mask, padded_positions
from .positions import check_rope_style
from .primitives import embedding, linear


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float, offset: bool = False):
        super().__init__()
        self.eps, self.offset = eps, offset  # offset (protocol v2, norm_offset): the gain is 1 + weight
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        """``[..., d] -> [..., d]``."""
        if self.offset:  # amendment 26 (Gemma): 1 + weight taken in the statistics' dtype (>= float32), as Gemma
            return rmsnorm(x, 1.0 + self.weight.to(torch.promote_types(x.dtype, torch.float32)), self.eps)
        return rmsnorm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        """``[..., d] -> [..., d]``."""
        return layernorm(x, self.weight, self.bias, self.eps)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads; RoPE on q and k (llama), biases (gpt2; q, k, v with qkv_bias)."""

    def __init__(self, cfg: ModelConfig, rope_style: str):
        super().__init__()
        llama = cfg.family == "llama"
        self.config, self.rope_style = cfg, rope_style
        self.theta = cfg.rope_theta if llama else None  # gpt2 adds learned positions instead
        qkv_bias = not llama or cfg.qkv_bias  # protocol v2 (amendment 22): Qwen2-style biases on q, k, v only
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=qkv_bias)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.d_head, bias=qkv_bias)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.d_head, bias=qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=not llama)
        if cfg.qk_norm:  # protocol v2 (amendment 24): per-head RMSNorm weights [d_head], shared by the heads
            self.q_norm = RMSNorm(cfg.d_head, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.d_head, cfg.norm_eps)

    def forward(self, x, positions: torch.Tensor, cache: KVCache | None, layer: int, mask=None):
        """x ``[B, T, d_model]`` at positions ``[T]`` (or ``[B, T]``) -> ``[B, T, d_model]``; keys and values go
        to the cache. ``mask`` (protocol v2, ``attention_mask``): bool ``[B, 1, T, T_k]`` of keys that may be seen."""
        cfg = self.config
        padded = {} if mask is None else {"mask": mask}  # a v1 multihead_self_attention is asked as v1
        window = cfg.layer_window(layer)  # protocol v2 (sliding_window, amendment 27): this layer's window
        windowed = {} if window is None else {"window": window}  # likewise: only in a sliding layer
        normed = {}  # likewise the qk_norm keywords (amendment 24): only when the config has them
        if cfg.qk_norm:
            normed = {"q_norm": self.q_norm.weight, "k_norm": self.k_norm.weight, "norm_eps": cfg.norm_eps}
        cap = cfg.attn_logit_softcap  # protocol v2 (logit_softcap, amendment 25): passed only when set
        capped = {} if cap is None else {"softcap": cap}
        return multihead_self_attention(
            x,
            self.wq.weight,
            self.wk.weight,
            self.wv.weight,
            self.wo.weight,
            cfg.n_heads,
            cfg.kv_heads,
            self.theta,
            positions,
            bq=self.wq.bias,
            bk=self.wk.bias,
            bv=self.wv.bias,
            bo=self.wo.bias,
            cache=cache,
            layer=layer,
            rope_style=self.rope_style,
            rope_table_size=cfg.context_length,  # cos/sin looked up, not recomputed
            rope_scaling=cfg.rope_scaling,
            attention=cfg.attention,  # "sdpa" by default: PyTorch's fused kernel
            **padded,
            **windowed,
            **normed,
            **capped,
        )


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        """``[B, T, d_model] -> [B, T, d_model]``."""
        return swiglu(x, self.w_gate.weight, self.w_up.weight, self.w_down.weight, fused=True)  # F.silu


class GeGLU(SwiGLU):
    """Protocol v2 (``geglu``, amendment 26; Gemma): SwiGLU's weights, tanh-approximate GELU on the gate."""

    def forward(self, x):
        """``[B, T, d_model] -> [B, T, d_model]``."""
        return geglu(x, self.w_gate.weight, self.w_up.weight, self.w_down.weight)


class MoE(nn.Module):
    """Protocol v2 (``moe``, amendment 28; Mixtral): a router ``[n_experts, d_model]`` and ``n_experts`` SwiGLU
    experts, canonical ``mlp.router.weight`` and ``mlp.experts.{e}.w_gate.weight`` (``w_up``, ``w_down``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.n_experts_per_token
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg) for _ in range(cfg.n_experts))

    def forward(self, x):
        """``[B, T, d_model] -> [B, T, d_model]``."""
        w_gate = torch.stack([expert.w_gate.weight for expert in self.experts])  # [E, d_ff, d_model]
        w_up = torch.stack([expert.w_up.weight for expert in self.experts])  # [E, d_ff, d_model]
        w_down = torch.stack([expert.w_down.weight for expert in self.experts])  # [E, d_model, d_ff]
        return moe_mlp(x, self.router.weight, w_gate, w_up, w_down, top_k=self.top_k)


class GeluMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w_proj = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        """``[B, T, d_model] -> [B, T, d_model]``."""
        return gelu_mlp(x, self.w_fc.weight, self.w_fc.bias, self.w_proj.weight, self.w_proj.bias)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, rope_style: str):
        super().__init__()
        llama = cfg.family == "llama"
        Norm = functools.partial(RMSNorm, offset=cfg.norm_offset) if llama else LayerNorm
        self.attn_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, rope_style)
        self.mlp_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.mlp = (GeGLU(cfg) if cfg.geglu else SwiGLU(cfg)) if llama else GeluMLP(cfg)
        if cfg.n_experts:  # protocol v2 (amendment 28; Mixtral): the sparse mixture of SwiGLU experts instead
            self.mlp = MoE(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.post_norms = cfg.post_norms  # protocol v2 (amendment 26; Gemma 2): a norm on each sublayer's output
        if cfg.post_norms:
            self.attn_post_norm = Norm(cfg.d_model, cfg.norm_eps)
            self.mlp_post_norm = Norm(cfg.d_model, cfg.norm_eps)

    def forward(self, x, positions, cache, layer, mask=None):
        """``[B, T, d_model] -> [B, T, d_model]``, pre-norm residual."""
        if self.post_norms:
            return self.forward_post_norms(x, positions, cache, layer, mask)
        x = x + self.drop(self.attn(self.attn_norm(x), positions, cache, layer, mask))
        return x + self.drop(self.mlp(self.mlp_norm(x)))

    def forward_post_norms(self, x, positions, cache, layer, mask=None):
        """Protocol v2 (``post_norms``, amendment 26; Gemma 2): each sublayer's output normalised before the add."""
        h = self.attn(self.attn_norm(x), positions, cache, layer, mask)
        x = x + self.drop(self.attn_post_norm(h))
        h = self.mlp(self.mlp_norm(x))
        return x + self.drop(self.mlp_post_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope_style: str = "interleaved"):
        super().__init__()
        self.config = cfg
        llama = cfg.family == "llama"
        check_rope_style(rope_style)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embeddings = None if llama else nn.Embedding(cfg.context_length, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg, rope_style) for _ in range(cfg.n_layers))
        Norm = functools.partial(RMSNorm, offset=cfg.norm_offset) if llama else LayerNorm
        self.final_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight  # one parameter, two uses

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, *, attention_mask=None, positions=None
    ) -> torch.Tensor:
        """ids ``[B, T]`` long -> logits ``[B, T, V]``; with a cache, positions continue from it.

        ``attention_mask`` (protocol v2, amendment 23): ``[B, T_cached + T]`` of 0/1, left padding; positions
        count each row's real tokens from 0 and no query attends padding. ``positions`` (reference-only):
        ``[T]`` or ``[B, T]`` positions instead of those.
        """
        check_ids(ids, self.config.vocab_size)
        start = 0 if cache is None else cache.length
        if cache is not None and cache.batch_size != ids.shape[0]:
            raise ValueError(f"forward: cache holds {cache.batch_size} sequences but ids has batch {ids.shape[0]}")
        if start + ids.shape[1] > self.config.context_length:
            raise ValueError(
                f"forward: {start} cached + {ids.shape[1]} new tokens exceed context_length="
                f"{self.config.context_length}"
            )
        mask = None
        if attention_mask is not None:
            real = check_attention_mask(attention_mask.to(ids.device), ids.shape[0], start + ids.shape[1])
            mask = key_mask(real, ids.shape[1])  # [B, 1, T, T_cached + T]
            positions = padded_positions(real)[:, start:] if positions is None else positions
        if positions is None:
            positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = embedding(ids, self.tok_embeddings.weight)  # [B, T, d_model]
        if self.config.embed_scale:  # protocol v2 (amendment 26; Gemma): sqrt(d_model), rounded to x's dtype first
            x = x * torch.tensor(self.config.d_model**0.5, dtype=x.dtype, device=x.device)
        if self.pos_embeddings is not None:
            x = x + embedding(positions, self.pos_embeddings.weight)
        x = self.drop(x)
        for layer, block in enumerate(self.layers):
            x = block(x, positions, cache, layer, mask)
        cap = self.config.final_logit_softcap
        if cap is not None:  # protocol v2 (amendment 25; Gemma 2): the logits soft-capped, cap * tanh(logits / cap)
            return cap * torch.tanh(linear(self.final_norm(x), self.lm_head.weight) / cap)
        return linear(self.final_norm(x), self.lm_head.weight)


def check_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Token ids must be a long ``[B, T]`` tensor with values in ``[0, vocab_size)``."""
    if ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(f"ids must be a long tensor [B, T], got {ids.dtype} {tuple(ids.shape)}")
    if ids.device.type == "cpu" and ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got min {ids.min().item()} max {ids.max().item()}")


# the MLP's w_down: the dense one (mlp.w_down.weight) and each expert's (mlp.experts.{e}.w_down.weight, amendment 28)
RESIDUAL_PROJECTIONS = ("attn.wo.weight", "w_down.weight", "mlp.w_proj.weight")


@torch.no_grad()
def init_weights(model: Transformer) -> None:
    """Linear/Embedding weights ~ N(0, 0.02); residual projections ~ N(0, 0.02/sqrt(2 n_layers));
    biases 0; norm weights 1 (0 for the offsets of ``norm_offset``, amendment 26: a gain of 1 either way)."""
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
    for module in model.modules():
        if isinstance(module, RMSNorm) and module.offset:
            module.weight.zero_()


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


def forward(
    model: Transformer, ids: torch.Tensor, cache: KVCache | None = None, *, attention_mask=None, positions=None
) -> torch.Tensor:
    """logits ``[B, T, V]`` for ids ``[B, T]``; with ``cache``, ids follow the cached tokens.

    ``attention_mask`` (protocol v2): ``[B, T_cached + T]``, see ``Transformer.forward``; ``positions``: reference-only.
    """
    if attention_mask is None and positions is None:
        return model(ids, cache)
    return model(ids, cache, attention_mask=attention_mask, positions=positions)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters: a tied matrix counts once. Works on the ``meta`` device."""
    return sum(p.numel() for p in model.parameters())
