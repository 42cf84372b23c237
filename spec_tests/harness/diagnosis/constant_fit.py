"""Which constant a failing computation used: one constant of the specified computation fitted to the output.

A constant written into the code (an attention scale of 0.12, a 1/sqrt of the wrong size) is no knob setting the
suite could list. It is fitted instead: the specified computation, with that one constant free, is searched for the
value that reproduces the failing output (a grid over its logarithm, then a golden-section search around the best
point). A fit is said only where the fitted computation reproduces the output at the check's tolerance, and where
the value is not the specified one (within 1e-3, relative): the evidence is the failing output itself, so the line
is confident.

Families, keyed by ``Entry.constant_fit`` (``spec_tests/protocol/entries.py``):

- ``score_scale``: the factor the attention scores ``q k^T`` are multiplied by before the softmax
  (``scaled_dot_product_attention``, ``flash_attention``, ``multihead_self_attention``); specified ``1/sqrt(d_head)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...protocol import CONSTANT_FIT
from ..judging.compare import mismatch
from .knobs import _attend, _bind, _causal, _mha, _windowed

SAME = 1e-3  # fitted constants this close (relative) to the specified one are the specified one
LOG_RANGE = (math.log(1e-3), math.log(30.0))  # where a scale is searched
GRID = 64
GOLDEN = (math.sqrt(5) - 1) / 2


def _sdpa(args, kwargs, style) -> tuple[Callable, int] | None:
    p = _bind("q, k, v, mask=None", args, kwargs)
    return (lambda s: _attend(p.q, p.k, p.v, p.mask, scale=s)), p.q.shape[-1]


def _flash(args, kwargs, style) -> tuple[Callable, int] | None:
    p = _bind("q, k, v, causal=True, block_size=64", args, kwargs)
    mask = _causal(p.q.shape[-2], p.k.shape[-2]) if p.causal else None
    return (lambda s: _attend(p.q, p.k, p.v, mask, scale=s)), p.q.shape[-1]


def _mha_scaled(args, kwargs, style) -> tuple[Callable, int] | None:
    p = _bind("x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None, *, window=None", args, kwargs)
    h = int(p.n_heads)
    hkv = int(p.n_kv_heads) if p.n_kv_heads is not None else h
    theta = float(p.theta) if p.theta is not None else None
    window = None if p.window is None else int(p.window)
    mask = _windowed(p.x.shape[1], window)

    def run(s):
        return _mha(p.x, p.wq, p.wk, p.wv, p.wo, h, hkv, theta, p.positions, style, mask=mask, scale=s)

    return run, p.wq.shape[0] // h


SCORE_SCALE = {
    "scaled_dot_product_attention": _sdpa,
    "flash_attention": _flash,
    "multihead_self_attention": _mha_scaled,
}


def _error(out, actual) -> float:
    diff = (out - actual).abs()
    return math.inf if not torch.isfinite(diff).all() else float(diff.max())


def _search(error: Callable[[float], float]) -> float:
    """The log-scale that minimises ``error``: the best of a grid, refined by a golden-section search between its
    neighbours."""
    lo, hi = LOG_RANGE
    grid = [lo + (hi - lo) * i / (GRID - 1) for i in range(GRID)]
    errors = [error(g) for g in grid]
    best = min(range(GRID), key=errors.__getitem__)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, GRID - 1)]
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = error(c), error(d)
    for _ in range(80):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = error(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = error(d)
    return (a + b) / 2


def _named(value: float) -> str:
    """``value`` as a reader may recognise it: ``1/sqrt(n)`` or ``1/n`` for a whole ``n``, else its digits."""
    for form, n in (("1/sqrt({})", 1 / value**2), ("1/{}", 1 / value), ("sqrt({})", value**2), ("{}", value)):
        if n >= 1 and abs(n - round(n)) <= 1e-6 * n:
            return f"{value:.4g} = {form.format(round(n))}"
    return f"{value:.4g} (1/{1 / value:.4g})"


def fitted_constant(name: str, args64: tuple, kwargs: dict, actual, tol, rope_style: str) -> tuple[list, list]:
    """``(lines, codes)``: the constant the failing output of ``name(*args64, **kwargs)`` was computed with, where it
    is not the specified one and the computation with it reproduces the output."""
    family = CONSTANT_FIT.get(name)
    if family != "score_scale" or not isinstance(actual, torch.Tensor):
        return [], []
    try:
        run, d_head = SCORE_SCALE[name](args64, kwargs, rope_style)
        target = actual.detach().double()
        best = math.exp(_search(lambda log_s: _error(run(math.exp(log_s)), target)))
        explained = run(best)
    except Exception:  # noqa: BLE001 - inputs the fit cannot bind or run say nothing
        return [], []
    specified = 1 / math.sqrt(d_head)
    if abs(best - specified) <= SAME * specified or mismatch(target, explained, tol) is not None:
        return [], []
    line = (
        f"likely cause: {name} multiplies the scores q·kᵀ by {_named(best)} instead of 1/sqrt(d_head) = "
        f"1/sqrt({d_head}) = {specified:.4g} (a constant written into the code, or the root of another size). Look at "
        f"the score scaling of {name}; fix: scale by 1/sqrt(d_head), d_head the size of q's last axis (evidence: the "
        f"specified computation with this one scale reproduces the failing output)"
    )
    return [line], ["knob:scale_constant"]
