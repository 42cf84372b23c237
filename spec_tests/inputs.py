"""Inputs chosen to expose bugs.

Every size differs from every other (so a transposed or mis-broadcast axis is a shape error or a
wrong value, never a coincidence); grouped-query attention has ``n_kv_heads > 1`` and
``n_rep > 1``; component weights are unit scale (0.02-scale init hides scale and RoPE bugs);
norm weights are not 1; positions do not start at 0; batch rows differ.

Every value drawn here comes from a per-call ``seed`` mixed with the session's spec seed
(``--spec-seed``, ``set_seed``): with the default seed, ``DEFAULT_SEED``, each call draws exactly what
it always drew (the handout's recordings hold those values); any other seed draws other values
from every call, so that grading inputs (drawn from a seed the submission cannot know) match no
recording. Component sizes (``S``) stay fixed: test ids and the tests' structure depend on them.
Model configs vary with the seed within a few valid sizes (``spec_tests/models.py``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import sys
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


DEFAULT_SEED = 0  # the suite's own inputs: every call draws what it drew before spec seeds existed
_SEED = DEFAULT_SEED


def spec_seed() -> int:
    """The session's spec seed (``--spec-seed``; ``DEFAULT_SEED`` unless one was given)."""
    return _SEED


def set_seed(value: int) -> None:
    """Draw every later input from ``value`` (and size the model configs for it)."""
    global _SEED
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"spec seed must be an integer in [0, 2**63), got {value!r}")
    _SEED = value
    models = sys.modules.get(f"{__package__}.models")
    if models is not None:  # imported before the seed was set: size its configs again, in place
        models.size_configs(value)


def mixed(seed: int, *, salt: str = "") -> int:
    """The torch seed a test's ``seed`` stands for under the spec seed: ``seed`` itself with the
    default spec seed, else a 63-bit digest of both (distinct seeds stay distinct, equal stay equal)."""
    if _SEED == DEFAULT_SEED and not salt:
        return int(seed)
    digest = hashlib.blake2b(f"{_SEED}:{salt}:{int(seed)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generator(seed: int, device="cpu") -> torch.Generator:
    """A generator seeded from ``seed`` under the spec seed (``mixed``), on ``device``."""
    return torch.Generator(device).manual_seed(mixed(seed))


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

    @staticmethod
    def torch_seed(seed: int) -> int:
        """The seed for ``manual_seed`` that ``seed`` stands for under the spec seed (``mixed``)."""
        return mixed(seed)

    def __getattr__(self, name: str):
        fn = globals()[name]
        if not callable(fn) or "device" not in inspect.signature(fn).parameters:
            raise AttributeError(f"inputs.{name} takes no device")
        return functools.partial(fn, device=self.device)
