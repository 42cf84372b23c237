"""Inputs chosen to expose bugs.

Every size differs from every other (so a transposed or mis-broadcast axis is a shape error or a
wrong value, never a coincidence); grouped-query attention has ``n_kv_heads > 1`` and
``n_rep > 1``; component weights are unit scale (0.02-scale init hides scale and RoPE bugs);
norm weights are not 1; positions do not start at 0; batch rows differ.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sizes:
    B: int = 3  # batch
    T: int = 13  # sequence
    H: int = 8  # query heads
    H_KV: int = 2  # key/value heads -> n_rep = 4
    D_HEAD: int = 10  # even, for RoPE
    D_FF: int = 56
    V: int = 67  # vocabulary

    @property
    def n_rep(self) -> int:
        return self.H // self.H_KV

    @property
    def d_model(self) -> int:
        return self.H * self.D_HEAD


S = Sizes()
POSITION_OFFSET = 5  # positions start here unless a test says otherwise


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, scale: float = 1.0, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Standard normal values (times ``scale``), reproducible from ``seed``, made on the CPU."""
    x = torch.randn(*shape, generator=generator(seed), dtype=torch.float64) * scale
    return x.to(dtype=dtype, device=device)


def uniform(*shape: int, low: float, high: float, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    x = torch.rand(*shape, generator=generator(seed), dtype=torch.float64) * (high - low) + low
    return x.to(dtype=dtype, device=device)


def weight(d_out: int, d_in: int, *, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """A unit-scale ``[d_out, d_in]`` matrix (entries ~ N(0, 1))."""
    return randn(d_out, d_in, seed=seed, dtype=dtype, device=device)


def fan_in_weight(d_out: int, d_in: int, *, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """``[d_out, d_in]`` with entries ~ N(0, 1/d_in): outputs stay O(1) for O(1) inputs."""
    return randn(d_out, d_in, seed=seed, scale=1.0 / math.sqrt(d_in), dtype=dtype, device=device)


def norm_weight(d: int, *, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Norm gains in [0.5, 1.5]: a forgotten weight, or one applied twice, changes the output."""
    return uniform(d, low=0.5, high=1.5, seed=seed, dtype=dtype, device=device)


def token_ids(*shape: int, vocab: int = S.V, seed: int, device="cpu") -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=generator(seed)).to(device)


def positions(t: int, *, start: int = POSITION_OFFSET, device="cpu") -> torch.Tensor:
    return torch.arange(start, start + t, device=device)


def scattered_positions(t: int, *, seed: int, high: int = 500, device="cpu") -> torch.Tensor:
    """Distinct, unsorted, non-contiguous positions in ``[0, high)``."""
    return torch.randperm(high, generator=generator(seed))[:t].to(device)


def per_head(b: int, h: int, t: int, d: int, *, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """A unit-scale ``[B, H, T, d_head]`` tensor whose batch rows and heads all differ."""
    return randn(b, h, t, d, seed=seed, dtype=dtype, device=device)


def probs_to_logits(probs, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Logits whose softmax is ``probs`` (plus an offset, to show the shift is irrelevant)."""
    return (torch.tensor(probs, dtype=torch.float64).log() + 3.0).to(dtype=dtype, device=device)


class On:
    """The input helpers above with ``device`` bound: ``spec.inputs.randn(3, 4, seed=1)``."""

    def __init__(self, device: str):
        self.device = device

    def __getattr__(self, name: str):
        fn = globals()[name]
        if not callable(fn) or "device" not in inspect.signature(fn).parameters:
            raise AttributeError(f"inputs.{name} takes no device")
        return functools.partial(fn, device=self.device)
