"""Protocol names for the functional model: build/load, forward, the buffer cache, sampling by sorting,
generation, training and evaluation."""

from __future__ import annotations

import math

import numpy as np
import torch

from .fn import cross_entropy, softmax
from .model import FunctionalLM, KVBuffers, init_params, parameter_shapes, resolve_config

# ------------------------------------------------------------------------------------------- model


def build_model(config, state_dict=None):
    cfg = resolve_config(config)
    shapes = parameter_shapes(cfg)
    if state_dict is None:
        params = init_params(cfg)
    else:
        if set(state_dict) != set(shapes):
            raise KeyError(
                f"weights do not match the config: missing {sorted(set(shapes) - set(state_dict))}, "
                f"unexpected {sorted(set(state_dict) - set(shapes))}"
            )
        params = {}
        for name, (shape, _) in shapes.items():
            t = state_dict[name]
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
            params[name] = t.detach().clone()
    return FunctionalLM(cfg, params)


def canonical_state_dict(model):
    return {name: t.detach() for name, t in model.named_canonical().items()}


def forward(model, ids, cache=None):
    return model(ids, cache)


def new_cache(model, batch_size):
    ref = model.p("tok_embeddings.weight")
    return KVBuffers(model.cfg, batch_size, ref.dtype, ref.device)


def cache_kv(cache, layer):
    return cache.keys[layer, :, :, : cache.filled], cache.values[layer, :, :, : cache.filled]


def count_parameters(model):
    return sum(t.numel() for t in model.params.values())


def kv_cache_bytes(config, batch_size, seq_len, dtype=torch.float32):
    cfg = dict(config)
    kv = cfg.get("n_kv_heads") or cfg["n_heads"]
    per_token = 2 * cfg["n_layers"] * kv * (cfg["d_model"] // cfg["n_heads"])
    return per_token * seq_len * batch_size * torch.tensor([], dtype=dtype).element_size()


# ---------------------------------------------------------------------------------------- sampling


def _check(temperature, top_k, top_p):
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature} is negative")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be at least 1")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} is outside (0, 1]")


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    vocab = logits.shape[-1]
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    z = logits / temperature
    # rank every token once; top-k and top-p are both cuts of this order
    z_sorted, order = torch.sort(z, dim=-1, descending=True)
    keep = torch.ones_like(z_sorted, dtype=torch.bool)
    if top_k is not None and top_k < vocab:
        keep[..., top_k:] = False
    z_sorted = z_sorted.masked_fill(~keep, float("-inf"))
    p_sorted = softmax(z_sorted, dim=-1)
    if top_p is not None:
        mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted
        keep = keep & (mass_before < top_p)
        keep[..., 0] = True
        p_sorted = p_sorted.masked_fill(~keep, 0.0)
        p_sorted = p_sorted / p_sorted.sum(dim=-1, keepdim=True)
    return torch.zeros_like(p_sorted).scatter(-1, order, p_sorted)


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Inverse-CDF sampling over the tokens sorted by probability."""
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(-1)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    p_sorted, order = torch.sort(probs, dim=-1, descending=True)
    cdf = torch.cumsum(p_sorted, dim=-1)
    u = torch.rand(probs.shape[:-1], generator=generator, dtype=probs.dtype, device=probs.device)
    u = u.unsqueeze(-1) * cdf[..., -1:]
    rank = torch.searchsorted(cdf.contiguous(), u.contiguous(), right=True)
    last_kept = (p_sorted > 0).sum(-1, keepdim=True) - 1
    rank = torch.minimum(rank, last_kept)
    return order.gather(-1, rank).squeeze(-1)


# -------------------------------------------------------------------------------------- generation


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"generate needs a prompt [B, T] with T >= 1, got {tuple(prompt.shape)}")
    ctx = model.cfg["context_length"]
    flags = [(m, m.training) for m in model.modules()]
    model.train(False)
    out = prompt
    try:
        with torch.no_grad():
            cache = None
            for _ in range(max_new_tokens):
                if use_cache and cache is not None and out.shape[1] <= ctx:
                    logits = forward(model, out[:, -1:], cache)
                elif use_cache and out.shape[1] <= ctx:
                    cache = new_cache(model, out.shape[0])
                    logits = forward(model, out, cache)
                else:  # no cache, or the window slides: positions move, so recompute the window
                    logits = forward(model, out[:, -ctx:])
                token = sample(logits[:, -1], temperature, top_k, top_p, generator)
                out = torch.cat([out, token[:, None]], dim=1)
    finally:
        for m, flag in flags:
            m.training = flag
    return out


# ---------------------------------------------------------------------------------------- training


def _flat_tokens(data):
    return torch.as_tensor(np.asarray(data.cpu() if isinstance(data, torch.Tensor) else data)).long().reshape(-1)


def get_batch(data, batch_size, context_length, generator=None, device="cpu"):
    tokens = _flat_tokens(data)
    last_start = len(tokens) - context_length - 1
    if last_start < 0:
        raise ValueError(
            f"need at least {context_length + 1} tokens for context_length={context_length}, got {len(tokens)}"
        )
    starts = torch.randint(last_start + 1, (batch_size,), generator=generator)
    windows = torch.stack([tokens[s : s + context_length + 1] for s in starts.tolist()])
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def _clip_global_norm(params, max_norm):
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.sqrt(sum((g.detach() ** 2).sum() for g in grads))
    factor = max_norm / total
    if factor < 1:
        for g in grads:
            g.mul_(factor)


def train_step(model, optimizer, x, y, max_grad_norm=None):
    was_training = model.training
    model.train()
    try:
        for p in model.parameters():
            p.grad = None
        loss = cross_entropy(forward(model, x), y)
        loss.backward()
        if max_grad_norm is not None:
            _clip_global_norm(list(model.parameters()), max_grad_norm)
        optimizer.step()
    finally:
        model.train(was_training)
    return loss.item()


def train(model, data, steps, batch_size, context_length, lr=1e-3, max_grad_norm=1.0, seed=0):
    tokens = _flat_tokens(data)
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        batches = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        return [
            train_step(model, opt, *get_batch(tokens, batch_size, context_length, batches, device), max_grad_norm)
            for _ in range(steps)
        ]


def evaluate(model, data, context_length, batch_size=8):
    tokens = _flat_tokens(data)
    device = next(model.parameters()).device
    if len(tokens) < 2:
        raise ValueError(f"evaluate needs at least 2 tokens, got {len(tokens)}")
    windows = [(s, min(s + context_length, len(tokens) - 1)) for s in range(0, len(tokens) - 1, context_length)]
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    nll, count = 0.0, 0
    try:
        with torch.no_grad():
            i = 0
            while i < len(windows):
                length = windows[i][1] - windows[i][0]
                group = [w for w in windows[i : i + batch_size] if w[1] - w[0] == length]
                x = torch.stack([tokens[a:b] for a, b in group]).to(device)
                y = torch.stack([tokens[a + 1 : b + 1] for a, b in group]).to(device)
                logits = forward(model, x)
                logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
                nll -= logp.gather(-1, y.unsqueeze(-1)).sum().item()
                count += y.numel()
                i += len(group)
    finally:
        for m, flag in flags:
            m.training = flag
    loss = nll / count
    return {"loss": loss, "perplexity": math.exp(loss)}
