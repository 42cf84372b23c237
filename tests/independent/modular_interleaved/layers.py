"""nn.Modules of the decoder. Every module calls the package's component functions (looked up in this
module's globals at call time, so replacing e.g. ``layers.rmsnorm`` changes the model)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .ops import (
    causal_mask,
    embedding,
    gelu_mlp,
    layernorm,
    linear,
    merge_heads,
    rmsnorm,
    rope,
    scaled_dot_product_attention,
    split_heads,
    swiglu,
)


def _normal(shape, std):
    w = torch.empty(*shape)
    nn.init.normal_(w, mean=0.0, std=std)
    return nn.Parameter(w)


class Linear(nn.Module):
    def __init__(self, d_in, d_out, bias=False, std=0.02):
        super().__init__()
        self.weight = _normal((d_out, d_in), std)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x):
        return linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, n, d, std=0.02):
        super().__init__()
        self.weight = _normal((n, d), std)

    def forward(self, ids):
        return embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return layernorm(x, self.weight, self.bias, self.eps)


class LayerKV:
    """One layer's cache: rotated keys and plain values, [B, n_kv_heads, T_cached, d_head]."""

    def __init__(self):
        self.k = None
        self.v = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k, v):
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=2)
            self.v = torch.cat((self.v, v), dim=2)
        return self.k, self.v


class ModelCache:
    def __init__(self, n_layers: int, batch_size: int):
        self.batch_size = batch_size
        self.layers = [LayerKV() for _ in range(n_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length


class Attention(nn.Module):
    def __init__(self, cfg, layer_std, out_std):
        super().__init__()
        d, h, hkv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
        self.n_heads, self.n_kv_heads, self.d_head = h, hkv, d // h
        bias = cfg["family"] == "gpt2"
        self.theta = cfg["rope_theta"] if cfg["family"] == "llama" else None
        self.wq = Linear(d, h * self.d_head, bias, layer_std)
        self.wk = Linear(d, hkv * self.d_head, bias, layer_std)
        self.wv = Linear(d, hkv * self.d_head, bias, layer_std)
        self.wo = Linear(h * self.d_head, d, bias, out_std)

    def forward(self, x, start: int, kv: LayerKV | None = None):
        t = x.shape[1]
        q = split_heads(self.wq(x), self.n_heads)
        k = split_heads(self.wk(x), self.n_kv_heads)
        v = split_heads(self.wv(x), self.n_kv_heads)
        if self.theta is not None:
            pos = torch.arange(start, start + t, device=x.device)
            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        if kv is not None:
            k, v = kv.append(k, v)
        out = scaled_dot_product_attention(q, k, v, causal_mask(t, k.shape[2], device=x.device))
        return self.wo(merge_heads(out))


class SwiGLU(nn.Module):
    def __init__(self, d, d_ff, std, out_std):
        super().__init__()
        self.w_gate = Linear(d, d_ff, False, std)
        self.w_up = Linear(d, d_ff, False, std)
        self.w_down = Linear(d_ff, d, False, out_std)

    def forward(self, x):
        return swiglu(x, self.w_gate.weight, self.w_up.weight, self.w_down.weight)


class GeluMLP(nn.Module):
    def __init__(self, d, d_ff, std, out_std):
        super().__init__()
        self.w_fc = Linear(d, d_ff, True, std)
        self.w_proj = Linear(d_ff, d, True, out_std)

    def forward(self, x):
        return gelu_mlp(x, self.w_fc.weight, self.w_fc.bias, self.w_proj.weight, self.w_proj.bias)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        llama = cfg["family"] == "llama"
        d, eps = cfg["d_model"], cfg["norm_eps"]
        std, out_std = 0.02, 0.02 / math.sqrt(2 * cfg["n_layers"])
        norm = (lambda: RMSNorm(d, eps)) if llama else (lambda: LayerNorm(d, eps))
        self.attn_norm = norm()
        self.attn = Attention(cfg, std, out_std)
        self.mlp_norm = norm()
        mlp = SwiGLU if llama else GeluMLP
        self.mlp = mlp(d, cfg["d_ff"], std, out_std)
        self.resid_drop = nn.Dropout(cfg["dropout"])

    def forward(self, x, start: int, kv: LayerKV | None = None):
        x = x + self.resid_drop(self.attn(self.attn_norm(x), start, kv))
        return x + self.resid_drop(self.mlp(self.mlp_norm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        d = cfg["d_model"]
        llama = cfg["family"] == "llama"
        self.tok_embeddings = Embedding(cfg["vocab_size"], d)
        if not llama:
            self.pos_embeddings = Embedding(cfg["context_length"], d)
        self.emb_drop = nn.Dropout(cfg["dropout"])
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layers"]))
        self.final_norm = RMSNorm(d, cfg["norm_eps"]) if llama else LayerNorm(d, cfg["norm_eps"])
        if not cfg["tie_embeddings"]:
            self.lm_head = Linear(d, cfg["vocab_size"], False, 0.02)

    def head_weight(self):
        return self.tok_embeddings.weight if self.cfg["tie_embeddings"] else self.lm_head.weight

    def logits(self, ids, cache: ModelCache | None = None):
        t = ids.shape[1]
        start = cache.length if cache is not None else 0
        ctx = self.cfg["context_length"]
        if start + t > ctx:
            raise ValueError(f"{start} cached + {t} new tokens exceed context_length={ctx}")
        x = self.tok_embeddings(ids)
        if self.cfg["family"] == "gpt2":
            x = x + self.pos_embeddings(torch.arange(start, start + t, device=ids.device))
        x = self.emb_drop(x)
        for i, block in enumerate(self.layers):
            x = block(x, start, cache.layers[i] if cache is not None else None)
        return linear(self.final_norm(x), self.head_weight())

    def forward(self, ids, cache: ModelCache | None = None):
        return self.logits(ids, cache)

    def step(self, ids, cache: ModelCache | None = None):
        """Logits of the next token after ``ids`` (fed through ``cache`` when given): [B, V]."""
        return self.logits(ids, cache)[:, -1]
