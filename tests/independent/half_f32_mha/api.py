"""Protocol names over the Hugging Face-style model: name mapping, generation, training, evaluation."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .functional import STATS
from .modeling import KVCache, LlamaForCausalLM

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}


def _name_map(config) -> dict[str, str]:
    """canonical name -> internal (Hugging Face) name."""
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    for i in range(config["n_layers"]):
        for canon, hf in _LAYER_NAMES.items():
            names[f"layers.{i}.{canon}"] = f"model.layers.{i}.{hf}"
    if not config["tie_embeddings"]:
        names["lm_head.weight"] = "lm_head.weight"
    return names


def _config(config):
    cfg = {"rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": True, "dropout": 0.0, "family": "llama"}
    cfg.update(config)
    if cfg.get("n_kv_heads") is None:
        cfg["n_kv_heads"] = cfg["n_heads"]
    if cfg["family"] != "llama":
        raise ValueError(f"only the llama family is implemented, not {cfg['family']!r}")
    d, h, kv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    if d % h != 0:
        raise ValueError(f"hidden size d_model={d} must be divisible by n_heads={h}")
    if h % kv != 0:
        raise ValueError(f"n_heads={h} must be divisible by n_kv_heads={kv}")
    if (d // h) % 2 != 0:
        raise ValueError(f"rotary embeddings need an even head dim, got {d // h} (d_model={d}, n_heads={h})")
    if kv != h:
        raise ValueError(f"grouped-query attention is not supported: n_kv_heads={kv} != n_heads={h}")
    return cfg


def build_model(config, state_dict=None):
    cfg = _config(config)
    model = LlamaForCausalLM(cfg)
    if state_dict is not None:
        names = _name_map(cfg)
        unknown = sorted(set(state_dict) - set(names))
        if unknown:
            raise KeyError(f"unexpected weights {unknown}")
        internal = {names[k]: v for k, v in state_dict.items()}
        if cfg["tie_embeddings"]:
            internal["lm_head.weight"] = internal["model.embed_tokens.weight"]
        model.load_state_dict(internal, strict=True)
    return model


def canonical_state_dict(model):
    params = dict(model.named_parameters(remove_duplicate=False))
    return {canon: params[hf].detach() for canon, hf in _name_map(model.config).items()}


def forward(model, ids, cache=None):
    return model(ids, past_key_values=cache)


def new_cache(model, batch_size):
    return KVCache(batch_size)


def cache_kv(cache, layer):
    return cache.key_cache[layer], cache.value_cache[layer]


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(config, batch_size, seq_len, dtype=torch.float32):
    head_dim = config["d_model"] // config["n_heads"]
    n_kv = config.get("n_kv_heads") or config["n_heads"]
    return 2 * config["n_layers"] * n_kv * head_dim * seq_len * batch_size * torch.finfo(dtype).bits // 8


# ----------------------------------------------------------------------------------------- sampling


def _check_sampling_args(temperature, top_k, top_p):
    if temperature < 0:
        raise ValueError("temperature must be non-negative")
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be a positive integer")
    if top_p is not None and not (0.0 < top_p <= 1.0):
        raise ValueError("top_p must lie in the interval (0, 1]")


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    _check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return F.one_hot(torch.argmax(logits, dim=-1), logits.shape[-1]).to(logits.dtype)
    scores = logits / temperature
    if top_k is not None:
        k = min(top_k, scores.shape[-1])
        indices_to_remove = scores < torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(indices_to_remove, float("-inf"))
    if top_p is not None:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
        sorted_indices_to_remove[..., -1:] = False  # keep at least one token
        indices_to_remove = sorted_indices_to_remove.scatter(-1, sorted_indices, sorted_indices_to_remove)
        scores = scores.masked_fill(indices_to_remove, float("-inf"))
    return torch.softmax(scores, dim=-1)


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    if temperature == 0:
        _check_sampling_args(temperature, top_k, top_p)
        return torch.argmax(logits, dim=-1)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    next_tokens = torch.multinomial(probs.reshape(-1, probs.shape[-1]), num_samples=1, generator=generator)
    return next_tokens.reshape(probs.shape[:-1])


# --------------------------------------------------------------------------------------- generation


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
    if prompt.ndim != 2 or prompt.shape[-1] < 1:
        raise ValueError(f"generate needs a non-empty prompt [B, T], got shape {tuple(prompt.shape)}")
    ctx = model.config["context_length"]
    was_training = [(m, m.training) for m in model.modules()]
    model.eval()
    input_ids = prompt
    past, past_start = None, 0
    try:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                window_start = max(0, input_ids.shape[1] - ctx)
                if use_cache and past is not None and past_start == window_start:
                    new_tokens = input_ids[:, window_start + past.get_seq_length() :]
                else:
                    past = KVCache(input_ids.shape[0]) if use_cache else None
                    past_start = window_start
                    new_tokens = input_ids[:, window_start:]
                logits = model(new_tokens, past_key_values=past)[:, -1, :]
                next_tokens = sample(logits, temperature, top_k, top_p, generator)
                input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
    finally:
        for module, mode in was_training:
            module.training = mode
    return input_ids


# ----------------------------------------------------------------------------------------- training


def _tokens(data):
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    return torch.as_tensor(data).long().flatten().cpu()


def get_batch(data, batch_size, context_length, generator=None, device="cpu"):
    data = _tokens(data)
    if len(data) < context_length + 1:
        raise ValueError(f"{len(data)} tokens are too few for windows of {context_length} + 1")
    ix = torch.randint(len(data) - context_length, (batch_size,), generator=generator)
    x = torch.stack([data[i : i + context_length] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + context_length] for i in ix.tolist()])
    return x.to(device), y.to(device)


def train_step(model, optimizer, x, y, max_grad_norm=None):
    model.train()
    loss = model.loss(x, y)
    optimizer.zero_grad()
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def train(model, data, steps, batch_size, context_length, lr=1e-3, max_grad_norm=1.0, seed=0):
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    device = model.lm_head.weight.device
    history = []
    for _ in range(steps):
        x, y = get_batch(data, batch_size, context_length, generator=generator, device=device)
        history.append(train_step(model, optimizer, x, y, max_grad_norm))
    return history


@torch.no_grad()
def evaluate(model, data, context_length, batch_size=8):
    """Consecutive windows padded to context_length; padded targets are -100 and carry no loss."""
    data = _tokens(data)
    n_pred = len(data) - 1
    if n_pred < 1:
        raise ValueError(f"evaluate needs at least 2 tokens, got {len(data)}")
    device = model.lm_head.weight.device
    was_training = [(m, m.training) for m in model.modules()]
    model.eval()
    xs, ys = [], []
    for start in range(0, n_pred, context_length):
        n = min(context_length, n_pred - start)
        x = torch.zeros(context_length, dtype=torch.long)
        y = torch.full((context_length,), -100, dtype=torch.long)
        x[:n], y[:n] = data[start : start + n], data[start + 1 : start + 1 + n]
        xs.append(x)
        ys.append(y)
    total_nll, n_tokens = 0.0, 0
    try:
        for i in range(0, len(xs), batch_size):
            x = torch.stack(xs[i : i + batch_size]).to(device)
            y = torch.stack(ys[i : i + batch_size]).to(device)
            logits = model(x)
            nll = F.cross_entropy(logits.to(STATS).reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
            total_nll += nll.item()
            n_tokens += int((y != -100).sum())
    finally:
        for module, mode in was_training:
            module.training = mode
    loss = total_nll / n_tokens
    return {"loss": loss, "perplexity": math.exp(loss)}
