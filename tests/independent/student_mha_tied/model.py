"""The decoder-only transformer (llama family only; tied embeddings; MHA; no biases)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .attention import causal_mask, scaled_dot_product_attention
from .mlp import swiglu
from .norms import rmsnorm
from .positions import rope
from .primitives import embedding, linear

REQUIRED = ["vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff"]


def _parse_config(config: dict) -> dict:
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise ValueError(f"config is missing required keys: {missing}")
    cfg = dict(config)
    cfg.setdefault("n_kv_heads", cfg["n_heads"])
    if cfg["n_kv_heads"] is None:
        cfg["n_kv_heads"] = cfg["n_heads"]
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("norm_eps", 1e-5)
    cfg.setdefault("tie_embeddings", True)
    cfg.setdefault("dropout", 0.0)
    cfg.setdefault("family", "llama")
    d_model, n_heads, n_kv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    if cfg["family"] != "llama":
        raise ValueError(f"unsupported family {cfg['family']!r}: only 'llama' is implemented")
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    if n_heads % n_kv != 0:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv}")
    if n_kv != n_heads:
        raise ValueError(f"grouped-query attention is not supported: n_heads={n_heads}, n_kv_heads={n_kv}")
    d_head = d_model // n_heads
    if d_head % 2 != 0:
        raise ValueError(f"head dimension d_model/n_heads = {d_model}/{n_heads} = {d_head} is odd; RoPE needs it even")
    if not cfg["tie_embeddings"]:
        raise ValueError("tie_embeddings=False is not supported: this implementation only ties the LM head")
    return cfg


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.n_heads = cfg["n_heads"]
        self.d_head = d // self.n_heads
        self.theta = cfg["rope_theta"]
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x, start_pos, cache=None, layer=0):
        B, T, _ = x.shape
        H, dh = self.n_heads, self.d_head
        q = linear(x, self.wq.weight).view(B, T, H, dh).transpose(1, 2)
        k = linear(x, self.wk.weight).view(B, T, H, dh).transpose(1, 2)
        v = linear(x, self.wv.weight).view(B, T, H, dh).transpose(1, 2)
        positions = torch.arange(start_pos, start_pos + T, device=x.device)
        q = rope(q, positions, self.theta)
        k = rope(k, positions, self.theta)
        if cache is not None:
            k = torch.cat([cache.k[layer], k], dim=2)
            v = torch.cat([cache.v[layer], v], dim=2)
            cache.k[layer] = k.detach()
            cache.v[layer] = v.detach()
        t_k = k.shape[2]
        mask = causal_mask(T, t_k, device=x.device)
        out = scaled_dot_product_attention(q, k, v, mask)
        out = out.transpose(1, 2).contiguous().view(B, T, H * dh)
        return linear(out, self.wo.weight)


class SwiGLU(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w_gate = nn.Linear(d, d_ff, bias=False)
        self.w_up = nn.Linear(d, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return swiglu(x, self.w_gate.weight, self.w_up.weight, self.w_down.weight)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg["d_model"], cfg["norm_eps"])
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg["d_model"], cfg["norm_eps"])
        self.mlp = SwiGLU(cfg["d_model"], cfg["d_ff"])
        self.drop1 = nn.Dropout(cfg["dropout"])
        self.drop2 = nn.Dropout(cfg["dropout"])

    def forward(self, x, start_pos, cache=None, layer=0):
        x = x + self.drop1(self.attn(self.attn_norm(x), start_pos, cache, layer))
        x = x + self.drop2(self.mlp(self.mlp_norm(x)))
        return x


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.drop = nn.Dropout(cfg["dropout"])
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = RMSNorm(cfg["d_model"], cfg["norm_eps"])

    def forward(self, ids, cache=None):
        start_pos = 0 if cache is None else cache.length
        x = embedding(ids, self.tok_embeddings.weight)
        x = self.drop(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, start_pos, cache, i)
        x = self.final_norm(x)
        # tied LM head: the embedding matrix itself
        logits = linear(x, self.tok_embeddings.weight)
        if cache is not None:
            cache.length += ids.shape[1]
        return logits


def _init_weights(model, cfg):
    std = 0.02
    resid_std = 0.02 / math.sqrt(2 * cfg["n_layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("attn.wo.weight") or name.endswith("mlp.w_down.weight"):
                p.normal_(0.0, resid_std)
            else:
                p.normal_(0.0, std)


def build_model(config: dict, state_dict: dict | None = None) -> nn.Module:
    cfg = _parse_config(config)
    model = Transformer(cfg)
    if state_dict is None:
        _init_weights(model, cfg)
        return model
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(params))
    if missing or unexpected:
        raise ValueError(f"state_dict mismatch: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, p in params.items():
            v = state_dict[name]
            if tuple(v.shape) != tuple(p.shape):
                raise ValueError(f"{name}: expected shape {tuple(p.shape)}, got {tuple(v.shape)}")
            p.copy_(v)
    return model


def canonical_state_dict(model: nn.Module) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def forward(model: nn.Module, ids: torch.Tensor, cache=None) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(
            f"ids must be a long tensor [B, T], got {getattr(ids, 'dtype', type(ids))} "
            f"shape {tuple(getattr(ids, 'shape', ()))}"
        )
    ctx = model.config["context_length"]
    t_cached = 0
    if cache is not None:
        if cache.batch_size != ids.shape[0]:
            raise ValueError(f"cache is for batch size {cache.batch_size}, ids have batch size {ids.shape[0]}")
        t_cached = cache.length
    if t_cached + ids.shape[1] > ctx:
        raise ValueError(
            f"{t_cached} cached + {ids.shape[1]} new tokens = {t_cached + ids.shape[1]} exceeds context_length {ctx}"
        )
    return model.forward(ids, cache)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
