"""Shared inputs and helpers for the diagnosis tests (tests/test_diagnosis_*.py).

Shapes follow the suite's (B=3, T=13, H=8, H_kv=2, d_head=10, V=67). Buggy outputs in the tests are
written with torch.nn.functional or plain formulas here, never with the diagnosis library's own
variants, so a test checks the library against an independent statement of each bug.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spec_tests.harness.diagnosis import cause as _cause

_cause.STRICT = True  # a detector's own error fails the diagnosis tests instead of being skipped

B, T, H, H_KV, D, V = 3, 13, 8, 2, 10, 67
D_MODEL, D_FF = H * D, 56
EXACT = dict(atol=1e-10, rtol=1e-10)
F32_POINTWISE = dict(atol=2e-6, rtol=2e-6)
F32_MATMUL = dict(atol=5e-5, rtol=5e-5)
F32_ATTENTION = dict(atol=1e-5, rtol=1e-5)
CONFIDENT = 0.9


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def uniform(*shape: int, low: float, high: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low


def ids(*shape: int, seed: int, vocab: int = V) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def noise_like(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Random values of the same shape and scale as ``x``: an unrelated wrong output."""
    scale = float(x[torch.isfinite(x)].abs().mean()) if x.numel() else 1.0
    return randn(*x.shape, seed=seed, scale=max(scale, 1e-3)).to(x.dtype)


def codes(causes, min_conf: float = 0.0) -> set[str]:
    return {c.code for c in causes if c.confidence >= min_conf}


def best(causes, code: str):
    """The most confident cause of ``code`` (None when there is none)."""
    hits = [c for c in causes if c.code == code]
    return max(hits, key=lambda c: c.confidence) if hits else None


def assert_names(causes, code: str, min_conf: float = CONFIDENT):
    hit = best(causes, code)
    listing = [(c.code, round(c.confidence, 2), c.summary) for c in causes]
    assert hit is not None and hit.confidence >= min_conf, f"expected {code} >= {min_conf}, got {listing}"
    return hit


def assert_not_confident(causes, code: str, below: float = CONFIDENT):
    hit = best(causes, code)
    assert hit is None or hit.confidence < below, f"unexpected confident {code}: {hit}"


# ---------------------------------------------------------------------------------------------
# independent statements of the specified computations (torch.nn.functional, complex numbers)


def rope_complex(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, style: str = "interleaved"):
    """RoPE as complex multiplication: pair (a, b) -> (a + ib) * exp(i * pos * theta**(-2k/d))."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[..., None] * freqs
    rot = torch.polar(torch.ones_like(angle), angle)
    if style == "interleaved":
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous()) * rot
        return torch.view_as_real(z).reshape(x.shape)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * rot
    return torch.cat((z.real, z.imag), dim=-1)


def causal(t_q: int, t_k: int, diagonal_shift: int = 0) -> torch.Tensor:
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q + diagonal_shift)


def sdpa(q, k, v, mask=None, scale=None):
    """F.scaled_dot_product_attention with GQA and a bool mask (True = may attend)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[-3] != q.shape[-3])


def attention_probs(q, k, mask=None, scale=None):
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1)


def qkv(h_kv: int = H_KV, t_q: int = T, t_k: int = T, seed: int = 52):
    return randn(B, H, t_q, D, seed=seed), randn(B, h_kv, t_k, D, seed=seed + 1), randn(B, h_kv, t_k, D, seed=seed + 2)


def batch_logits(seed: int = 31) -> torch.Tensor:
    """Rows of different spread, as the suite's sampling tests use."""
    scales = torch.tensor([0.3, 1.0, 2.5, 5.0], dtype=torch.float64)[:, None]
    return randn(4, V, seed=seed) * scales


def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """The protocol's sampling_probs, written with a sort-based nucleus (boundary: mass before < top_p)."""
    z = logits / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = z.topk(top_k, -1).values[..., -1:]
        z = torch.where(z >= kth, z, torch.tensor(float("-inf"), dtype=z.dtype))
    p = torch.softmax(z, -1)
    if top_p is not None:
        sp, order = p.sort(-1, descending=True)
        before = sp.cumsum(-1) - sp
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, before < top_p)
        p = p * keep
    return p / p.sum(-1, keepdim=True)
