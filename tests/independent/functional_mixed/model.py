"""The model as functions over a flat parameter dict; a thin nn.Module holds the parameters."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .fn import causal_mask, embedding, gelu_mlp, layernorm, linear, rmsnorm, rope, swiglu

_SEP = "::"  # ParameterDict keys cannot contain "."


def _key(name: str) -> str:
    return name.replace(".", _SEP)


def _name(key: str) -> str:
    return key.replace(_SEP, ".")


def resolve_config(config: dict) -> dict:
    cfg = dict(config)
    cfg.setdefault("family", "llama")
    cfg["n_kv_heads"] = cfg.get("n_kv_heads") or cfg["n_heads"]
    for key, default in (("rope_theta", 10000.0), ("norm_eps", 1e-5), ("tie_embeddings", True), ("dropout", 0.0)):
        cfg.setdefault(key, default)
    d, h, kv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    if cfg["family"] not in ("llama", "gpt2"):
        raise ValueError(f"family must be 'llama' or 'gpt2', got {cfg['family']!r}")
    if d % h:
        raise ValueError(f"d_model ({d}) must be a multiple of n_heads ({h})")
    if h % kv:
        raise ValueError(f"n_heads ({h}) must be a multiple of n_kv_heads ({kv})")
    if cfg["family"] == "llama" and (d // h) % 2:
        raise ValueError(f"RoPE needs an even head dimension, but d_model {d} / n_heads {h} = {d // h}")
    return cfg


def parameter_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """canonical name -> (shape, init kind) with kind in normal / residual / one / zero."""
    d, f, v = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    dh = d // cfg["n_heads"]
    q_rows, kv_rows = cfg["n_heads"] * dh, cfg["n_kv_heads"] * dh
    gpt2 = cfg["family"] == "gpt2"
    out = {"tok_embeddings.weight": ((v, d), "normal")}
    if gpt2:
        out["pos_embeddings.weight"] = ((cfg["context_length"], d), "normal")
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        out[p + "attn_norm.weight"] = ((d,), "one")
        for proj, rows in (("wq", q_rows), ("wk", kv_rows), ("wv", kv_rows)):
            out[p + f"attn.{proj}.weight"] = ((rows, d), "normal")
        out[p + "attn.wo.weight"] = ((d, q_rows), "residual")
        out[p + "mlp_norm.weight"] = ((d,), "one")
        if gpt2:
            out[p + "mlp.w_fc.weight"] = ((f, d), "normal")
            out[p + "mlp.w_proj.weight"] = ((d, f), "residual")
            for name, size in (
                ("attn_norm.bias", d),
                ("mlp_norm.bias", d),
                ("attn.wq.bias", q_rows),
                ("attn.wk.bias", kv_rows),
                ("attn.wv.bias", kv_rows),
                ("attn.wo.bias", d),
                ("mlp.w_fc.bias", f),
                ("mlp.w_proj.bias", d),
            ):
                out[p + name] = ((size,), "zero")
        else:
            out[p + "mlp.w_gate.weight"] = ((f, d), "normal")
            out[p + "mlp.w_up.weight"] = ((f, d), "normal")
            out[p + "mlp.w_down.weight"] = ((d, f), "residual")
    out["final_norm.weight"] = ((d,), "one")
    if gpt2:
        out["final_norm.bias"] = ((d,), "zero")
    if not cfg["tie_embeddings"]:
        out["lm_head.weight"] = ((v, d), "normal")
    return out


class FunctionalLM(nn.Module):
    """Holds ``params`` (canonical names, '.' -> '::') and the config; the maths lives in functions."""

    def __init__(self, cfg: dict, params: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        self.params = nn.ParameterDict({_key(k): nn.Parameter(v) for k, v in params.items()})

    def p(self, name: str) -> torch.Tensor:
        return self.params[_key(name)]

    def named_canonical(self) -> dict[str, torch.Tensor]:
        return {_name(k): v for k, v in self.params.items()}

    def forward(self, ids, cache=None):
        return transformer(self, ids, cache)


def init_params(cfg: dict) -> dict[str, torch.Tensor]:
    residual_std = 0.02 / math.sqrt(2 * cfg["n_layers"])
    params = {}
    for name, (shape, kind) in parameter_shapes(cfg).items():
        t = torch.empty(shape)
        if kind == "one":
            t.fill_(1.0)
        elif kind == "zero":
            t.zero_()
        else:
            t.normal_(0.0, residual_std if kind == "residual" else 0.02)
        params[name] = t
    return params


class KVBuffers:
    """Preallocated keys and values for every layer: [n_layers, B, n_kv_heads, context_length, d_head]."""

    def __init__(self, cfg, batch_size, dtype, device):
        dh = cfg["d_model"] // cfg["n_heads"]
        shape = (cfg["n_layers"], batch_size, cfg["n_kv_heads"], cfg["context_length"], dh)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.filled = 0

    def write(self, layer, start, k, v):
        stop = start + k.shape[-2]
        self.keys[layer, :, :, start:stop] = k
        self.values[layer, :, :, start:stop] = v
        return self.keys[layer, :, :, :stop], self.values[layer, :, :, :stop]


def _norm(model, prefix, x):
    eps = model.cfg["norm_eps"]
    if model.cfg["family"] == "llama":
        return rmsnorm(x, model.p(prefix + ".weight"), eps)
    return layernorm(x, model.p(prefix + ".weight"), model.p(prefix + ".bias"), eps)


def _bias(model, name):
    return model.p(name) if model.cfg["family"] == "gpt2" else None


def _attention(model, i, x, start, cache):
    cfg = model.cfg
    b, t, _ = x.shape
    h, kv = cfg["n_heads"], cfg["n_kv_heads"]
    pre = f"layers.{i}.attn."
    q = linear(x, model.p(pre + "wq.weight"), _bias(model, pre + "wq.bias")).unflatten(-1, (h, -1)).transpose(1, 2)
    k = linear(x, model.p(pre + "wk.weight"), _bias(model, pre + "wk.bias")).unflatten(-1, (kv, -1)).transpose(1, 2)
    v = linear(x, model.p(pre + "wv.weight"), _bias(model, pre + "wv.bias")).unflatten(-1, (kv, -1)).transpose(1, 2)
    if cfg["family"] == "llama":
        pos = torch.arange(start, start + t, device=x.device)
        q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    if cache is not None:
        k, v = cache.write(i, start, k, v)
    t_k = k.shape[-2]
    drop = cfg["dropout"] if model.training else 0.0
    if t_k == t:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop, enable_gqa=kv != h)
    else:  # is_causal would align the mask top-left; decoding needs it bottom-right
        mask = causal_mask(t, t_k, device=x.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, enable_gqa=kv != h)
    o = o.transpose(1, 2).flatten(-2)
    return linear(o, model.p(pre + "wo.weight"), _bias(model, pre + "wo.bias"))


def _mlp(model, i, x):
    pre = f"layers.{i}.mlp."
    if model.cfg["family"] == "llama":
        return swiglu(x, model.p(pre + "w_gate.weight"), model.p(pre + "w_up.weight"), model.p(pre + "w_down.weight"))
    return gelu_mlp(
        x,
        model.p(pre + "w_fc.weight"),
        model.p(pre + "w_fc.bias"),
        model.p(pre + "w_proj.weight"),
        model.p(pre + "w_proj.bias"),
    )


def transformer(model, ids, cache=None):
    cfg = model.cfg
    t = ids.shape[-1]
    start = cache.filled if cache is not None else 0
    if start + t > cfg["context_length"]:
        raise ValueError(
            f"{start + t} tokens in view ({start} cached, {t} new) exceed context_length {cfg['context_length']}"
        )
    p_drop = cfg["dropout"]
    x = embedding(ids, model.p("tok_embeddings.weight"))
    if cfg["family"] == "gpt2":
        x = x + model.p("pos_embeddings.weight")[start : start + t]
    x = F.dropout(x, p_drop, model.training)
    for i in range(cfg["n_layers"]):
        x = x + F.dropout(
            _attention(model, i, _norm(model, f"layers.{i}.attn_norm", x), start, cache), p_drop, model.training
        )
        x = x + F.dropout(_mlp(model, i, _norm(model, f"layers.{i}.mlp_norm", x)), p_drop, model.training)
    if cache is not None:
        cache.filled = start + t
    head = model.p("tok_embeddings.weight") if cfg["tie_embeddings"] else model.p("lm_head.weight")
    return linear(_norm(model, "final_norm", x), head)
