"""Model-level protocol names: building, loading, the forward pass, the cache, generation, counts."""

from __future__ import annotations

import torch

from .layers import ModelCache, Transformer
from .sampling import sample

DEFAULTS = dict(n_kv_heads=None, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=True, dropout=0.0, family="llama")


def _config(config: dict) -> dict:
    cfg = {**DEFAULTS, **config}
    if cfg["n_kv_heads"] is None:
        cfg["n_kv_heads"] = cfg["n_heads"]
    d, h, hkv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    if cfg["family"] not in ("llama", "gpt2"):
        raise ValueError(f"unknown family {cfg['family']!r}")
    if d % h:
        raise ValueError(f"d_model={d} is not divisible by n_heads={h}")
    if h % hkv:
        raise ValueError(f"n_heads={h} is not divisible by n_kv_heads={hkv}")
    if cfg["family"] == "llama" and (d // h) % 2:
        raise ValueError(f"RoPE needs an even head dimension: d_model={d} / n_heads={h} gives d_head={d // h}")
    return cfg


def canonical_state_dict(model) -> dict:
    return dict(model.state_dict(keep_vars=False))


def build_model(config, state_dict=None):
    model = Transformer(_config(config))
    if state_dict is not None:
        own = dict(model.named_parameters())
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise KeyError(f"state_dict does not match the config: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for name, param in own.items():
                value = state_dict[name]
                if tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)}, expected {tuple(param.shape)}")
                param.copy_(value)
    return model


def forward(model, ids, cache=None):
    return model.logits(ids, cache)


def new_cache(model, batch_size):
    return ModelCache(model.cfg["n_layers"], batch_size)


def cache_kv(cache, layer):
    kv = cache.layers[layer]
    return kv.k, kv.v


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config, batch_size, seq_len, dtype=torch.float32) -> int:
    n_kv = config.get("n_kv_heads") or config["n_heads"]
    d_head = config["d_model"] // config["n_heads"]
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config["n_layers"] * n_kv * d_head * seq_len * batch_size * element


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [B, T] with T >= 1, got shape {tuple(prompt.shape)}")
    ctx = model.cfg["context_length"]
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            seq = prompt
            cache, cache_start = None, None
            for _ in range(max_new_tokens):
                total = seq.shape[1]
                start = max(0, total - ctx)
                if use_cache and cache is not None and cache_start == start:
                    logits = model.step(seq[:, start + cache.length :], cache)
                else:  # first step, or the window slid: (re)fill the cache from the window
                    cache = new_cache(model, seq.shape[0]) if use_cache else None
                    cache_start = start
                    logits = model.step(seq[:, start:], cache)
                nxt = sample(logits, temperature, top_k, top_p, generator)
                seq = torch.cat((seq, nxt.unsqueeze(1).to(seq.dtype)), dim=1)
    finally:
        for m, training in modes.items():
            m.training = training
    return seq
