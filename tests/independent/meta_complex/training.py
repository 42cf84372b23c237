"""generate, get_batch, train_step, train, evaluate."""

import math

import numpy as np
import torch

from .model import forward, new_cache
from .sampling import sample


class _eval_mode:
    """Every submodule in eval mode inside; each module's own flag restored after."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.flags = [(m, m.training) for m in self.model.modules()]
        self.model.eval()

    def __exit__(self, *exc):
        for m, flag in self.flags:
            m.training = flag
        return False


def _device(model):
    return next(model.parameters()).device


@torch.inference_mode()
def _generate(model, prompt, max_new_tokens, temperature, top_k, top_p, generator, use_cache):
    ctx = model.params.context_length
    tokens = prompt
    cache = None
    for _ in range(max_new_tokens):
        if not use_cache:
            logits = forward(model, tokens[:, -ctx:])
        elif cache is None or tokens.shape[1] > ctx:
            cache = new_cache(model, tokens.shape[0])
            logits = forward(model, tokens[:, -ctx:], cache)
        else:
            logits = forward(model, tokens[:, -1:], cache)
        nxt = sample(logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        tokens = torch.cat([tokens, nxt.to(tokens.dtype)[:, None]], dim=1)
    return tokens


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None, use_cache=True):
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [B, T] with T >= 1, got shape {tuple(prompt.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"bad sampling arguments temperature={temperature} top_k={top_k} top_p={top_p}")
    with _eval_mode(model):
        return _generate(model, prompt, max_new_tokens, temperature, top_k, top_p, generator, use_cache)


def _as_tensor(data):
    if isinstance(data, torch.Tensor):
        return data.reshape(-1).long()
    return torch.from_numpy(np.asarray(data).reshape(-1).astype(np.int64))


def get_batch(data, batch_size, context_length, generator=None, device="cpu"):
    data = _as_tensor(data)
    n = data.numel()
    if n < context_length + 1:
        raise ValueError(f"need at least context_length + 1 = {context_length + 1} tokens, got {n}")
    gen_dev = generator.device if generator is not None else "cpu"
    starts = torch.randint(0, n - context_length, (batch_size,), generator=generator, device=gen_dev).cpu()
    data = data.cpu()
    offs = torch.arange(context_length)
    x = data[starts[:, None] + offs]
    y = data[starts[:, None] + offs + 1]
    return x.to(device), y.to(device)


def _clip_grad_norm(params, max_norm):
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.sqrt(sum((g.detach().to(torch.float64) ** 2).sum() for g in grads))
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return float(total)


def train_step(model, optimizer, x, y, max_grad_norm=None):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    if max_grad_norm is not None:
        _clip_grad_norm(list(model.parameters()), max_grad_norm)
    optimizer.step()
    return loss.item()


def train(model, data, steps, batch_size, context_length, lr=1e-3, max_grad_norm=1.0, seed=0):
    dev = _device(model)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    fork_devices = [dev] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        for _ in range(steps):
            x, y = get_batch(data, batch_size, context_length, generator=gen, device=dev)
            losses.append(train_step(model, optimizer, x, y, max_grad_norm))
    return losses


def evaluate(model, data, context_length, batch_size=8):
    data = _as_tensor(data)
    n = data.numel()
    if n < 2:
        raise ValueError(f"need at least 2 tokens to evaluate, got {n}")
    dev = _device(model)
    windows = []
    for s in range(0, n - 1, context_length):
        e = min(s + context_length, n - 1)
        windows.append((s, e))
    total_nll = 0.0
    count = 0
    with _eval_mode(model), torch.no_grad():
        i = 0
        while i < len(windows):
            length = windows[i][1] - windows[i][0]
            group = [windows[i]]
            i += 1
            while i < len(windows) and len(group) < batch_size and windows[i][1] - windows[i][0] == length:
                group.append(windows[i])
                i += 1
            x = torch.stack([data[s:e] for s, e in group]).to(dev)
            y = torch.stack([data[s + 1 : e + 1] for s, e in group]).to(dev)
            logits = forward(model, x)
            lf = logits.to(torch.float64)
            nll = torch.nn.functional.cross_entropy(lf.reshape(-1, lf.shape[-1]), y.reshape(-1), reduction="sum")
            total_nll += float(nll)
            count += y.numel()
    loss = total_nll / count
    return {"loss": loss, "perplexity": math.exp(loss)}
