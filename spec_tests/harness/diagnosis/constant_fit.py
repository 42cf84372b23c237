"""Which constant a failing computation used: one constant of the specified computation fitted to the output.

A constant written into the code (an attention scale of 0.12, a 1/sqrt of the wrong size) is no knob setting the
suite could list. It is fitted instead: the specified computation, with that one constant free, is searched for the
value that reproduces the failing output (a grid over its logarithm, then a golden-section search around the best
point). A fit is said only where the fitted computation reproduces the output at the check's tolerance, and where
the value is not the specified one (within 1e-3, relative): the evidence is the failing output itself, so the line
is confident.

Families, keyed by ``Entry.constant_fit`` (``spec_tests/protocol/entries.py``):

- ``sdpa_scale``, ``flash_scale``, ``mha_scale``: the factor the attention scores ``q k^T`` are multiplied by
  before the softmax (in ``scaled_dot_product_attention``, ``flash_attention``, ``multihead_self_attention``);
  specified ``1/sqrt(d_head)``; the same factor inside a failing model (``model_scale_lines``: the reference model
  with its attention's scale free, for code whose attention functions are right and whose model scales otherwise);
- ``rope_rotation`` (``rope``): not fitted but measured, as ``activation_fit.py`` measures an activation: the
  implementation turns each pair's unit vector at positions 0, 1 and 2, which gives each pair's angle at position 0
  and its angle per position; where that is a rotation linear in the position, differs from the specified one and
  reproduces the failing output, it is said (a table of sin where cos belongs, a linspace grid of exponents).
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


SCORE_SCALE = {"sdpa_scale": _sdpa, "flash_scale": _flash, "mha_scale": _mha_scaled}  # by Entry.constant_fit


def _error(out, actual) -> float:
    diff = (out - actual).abs()
    return math.inf if not torch.isfinite(diff).all() else float(diff.max())


def _search(error: Callable[[float], float], points: int = GRID, steps: int = 80) -> float:
    """The log-scale that minimises ``error``: the best of a grid of ``points``, refined by a golden-section search of
    ``steps`` between its neighbours."""
    lo, hi = LOG_RANGE
    grid = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    errors = [error(g) for g in grid]
    best = min(range(points), key=errors.__getitem__)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, points - 1)]
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = error(c), error(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = error(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = error(d)
    return (a + b) / 2


def _named(value: float, sizes: dict[str, int]) -> str:
    """``value`` as a reader may recognise it: ``1/sqrt(n)`` or ``1/n`` for a whole ``n`` (with the call's size of
    that value, ``sizes``: ``d_model``, ``d_head``), else its digits."""
    for form, n in (("1/sqrt({})", 1 / value**2), ("1/{}", 1 / value), ("sqrt({})", value**2), ("{}", value)):
        if n >= 1 and abs(n - round(n)) <= 1e-6 * n:
            known = [k for k, v in sizes.items() if v == round(n)]
            return f"{value:.4g} = {form.format(round(n))}" + (f" = {form.format(known[0])}" if known else "")
    return f"{value:.4g} (1/{1 / value:.4g})"


def fitted_constant(name: str, run: Callable, args64: tuple, kwargs: dict, actual, tol, rope_style: str):
    """``(lines, codes)``: the constant the failing output of ``name(*args64, **kwargs)`` was computed with, where it
    is not the specified one and the computation with it reproduces the output (``run(*args)`` calls the
    implementation's ``name``: RoPE's rotation is measured on it, ``rotation_lines``)."""
    family = CONSTANT_FIT.get(name)
    if family == "rope_rotation":
        return rotation_lines(run, args64, kwargs, actual, tol, rope_style)
    if family not in SCORE_SCALE or not isinstance(actual, torch.Tensor):
        return [], []
    try:
        run, d_head = SCORE_SCALE[family](args64, kwargs, rope_style)
        target = actual.detach().double()
        best = math.exp(_search(lambda log_s: _error(run(math.exp(log_s)), target)))
        explained = run(best)
    except Exception:  # noqa: BLE001 - inputs the fit cannot bind or run say nothing
        return [], []
    specified = 1 / math.sqrt(d_head)
    sizes = {"d_head": d_head}
    if family == "mha_scale":
        sizes["d_model"] = int(args64[0].shape[-1])
    if abs(best - specified) <= SAME * specified or mismatch(target, explained, tol) is not None:
        return [], []
    line = (
        f"likely cause: {name} multiplies the scores q·kᵀ by {_named(best, sizes)} instead of 1/sqrt(d_head) = "
        f"1/sqrt({d_head}) = {specified:.4g} (a constant written into the code, or the root of another size). Look at "
        f"the score scaling of {name}; fix: scale by 1/sqrt(d_head), d_head the size of q's last axis (evidence: the "
        f"specified computation with this one scale reproduces the failing output)"
    )
    return [line], ["knob:scale_constant"]


# A model's search runs the reference model about 70 times: once per test function and implementation; its later
# cases (other configurations, other head sizes) try only the power of d_head the first fitted (None: none did).
_MODEL_SEARCHED: dict[str, float | None] = {}


class _Unbound(Exception):
    """An attention call the scale fit does not model (a softcap, an option of protocol v2)."""


def model_scale_lines(compute: Callable, reference, args64: tuple, actual, tol, memo: str | None = None):
    """``(lines, codes)``: the scale the failing model's attention multiplies its scores by, where the reference model
    (``compute(reference, *args64)``) with that one scale in its attention reproduces ``actual`` and the scale is not
    1/sqrt(d_head) (held out: an inference kernel's sqrt(sqrt(d_head)) norm factor, right in the attention
    functions, inside the model only)."""
    from .model_knobs import _protocol_arguments

    if (
        not isinstance(actual, torch.Tensor)
        or not actual.is_floating_point()
        or memo in _MODEL_SEARCHED
        and (_MODEL_SEARCHED[memo] is None)
    ):
        return [], []
    heads: set[int] = set()

    def run(scale: Callable[[int], float]):
        def attention(*a, **k):
            pa, pk = _protocol_arguments("scaled_dot_product_attention", a, k)
            if set(pk) - {"mask"}:
                raise _Unbound
            p = _bind("q, k, v, mask=None", pa, pk)
            heads.add(p.q.shape[-1])
            q, k, v = p.q.double(), p.k.double(), p.v.double()
            return _attend(q, k, v, p.mask, scale=scale(p.q.shape[-1])).to(a[0].dtype)

        with torch.no_grad(), reference.substituted({"scaled_dot_product_attention": attention}):
            return torch.as_tensor(compute(reference, *args64)).detach().double().cpu()

    target = actual.detach().double().cpu()
    try:
        if memo in _MODEL_SEARCHED:
            power = _MODEL_SEARCHED[memo]
            explained = run(lambda d: d**power)
        else:
            best = math.exp(_search(lambda log_s: _error(run(lambda d: math.exp(log_s)), target), points=24, steps=40))
            explained = run(lambda d: best)
    except Exception:  # noqa: BLE001 - a model the fit cannot run says nothing
        explained = None
    d_head = next(iter(heads)) if len(heads) == 1 else 0
    if d_head > 1 and explained is not None:
        best = d_head**power if memo in _MODEL_SEARCHED else best
        power = math.log(best) / math.log(d_head)
    fits = (
        d_head > 1
        and explained is not None
        and abs(power + 0.5) > SAME
        and explained.shape == target.shape
        and mismatch(target, explained, tol) is None
    )
    if memo and memo not in _MODEL_SEARCHED:
        _MODEL_SEARCHED[memo] = power if fits else None
    if not fits:
        return [], []
    specified = 1 / math.sqrt(d_head)
    said = _named(best, {"d_head": d_head})
    if abs(power * 4 - round(power * 4)) < 1e-3 and round(power * 4) != 0:
        said += f" = d_head ** {round(power * 4) / 4:g}"
    line = (
        f"likely cause: the model's attention multiplies the scores q·kᵀ by {said} instead of 1/sqrt(d_head) = "
        f"1/sqrt({d_head}) = {specified:.4g} (a scale of the model's own: a norm factor rooted twice or applied twice, "
        "the root of another size, a constant written in). Look at where the model's attention scales q·kᵀ; fix: "
        "scale by 1/sqrt(d_head) once (evidence: the specified model with this one scale in its attention reproduces "
        "the failing output)"
    )
    return [line], ["knob:scale_constant"]


# ---------------------------------------------------------------------------------------------
# RoPE's rotation, measured on the implementation

MATERIAL = 1e-4  # a rotation differing by less (an angle, a frequency relative to its own) is the specified one
ROTATION = 1e-9  # how far from a rotation (a pair's norm kept, the angle linear in the position) a measure may be


def _pairs(d: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The channels of each pair's first and second entries in ``style``."""
    i = torch.arange(d // 2)
    return (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + d // 2)


def _rotated(x, positions, phase, freqs, style):
    """``x [..., T, d]`` with pair ``i`` at position ``p`` turned by ``phase[i] + p * freqs[i]``."""
    first, second = _pairs(x.shape[-1], style)
    angle = phase + positions.to(torch.float64)[..., None] * freqs
    a, b = x[..., first], x[..., second]
    out = torch.empty_like(x)
    out[..., first] = a * torch.cos(angle) - b * torch.sin(angle)
    out[..., second] = a * torch.sin(angle) + b * torch.cos(angle)
    return out


def _turn(angle: torch.Tensor) -> torch.Tensor:
    """``angle`` taken into (-pi, pi], as a measured angle is."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def measured_rotation(run: Callable, d: int, style: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(phase, freqs)``: the angle each pair of the implementation's ``rope`` is turned by at position 0 and the
    angle it adds per position, measured from ``run(x, positions)`` on each pair's unit vector at positions 0, 1 and
    2; None where it does not turn each pair of ``style`` as a rotation linear in the position."""
    first, second = _pairs(d, style)
    x = torch.zeros(3, d, dtype=torch.float64)
    x[:, first] = 1.0
    out = torch.as_tensor(run(x, torch.arange(3))).detach().double().cpu()
    if out.shape != x.shape or not torch.isfinite(out).all():
        return None
    a, b = out[:, first], out[:, second]
    if (a.square() + b.square() - 1).abs().max() > ROTATION:
        return None
    angle = torch.atan2(b, a)  # [3, d/2]
    freqs = _turn(angle[1] - angle[0])
    if (_turn(angle[2] - angle[1] - freqs)).abs().max() > 1e-6:
        return None
    return angle[0], freqs


def _said(values: torch.Tensor) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:4].tolist())
    return f"[{shown}{', ...' if len(values) > 4 else ''}]"


def _frequency_reading(freqs: torch.Tensor, theta: float, d: int) -> str:
    """What the measured frequencies are, where a reader may recognise them."""
    half = d // 2
    i = torch.arange(half, dtype=torch.float64)
    if half > 1 and theta > 1 and (_turn(theta ** (2 * i / d) - freqs)).abs().max() < 1e-6:  # angles mod 2 pi
        return (
            "theta ** (+2i / d_head) (the angles shown modulo 2 pi: pair 1 turns by "
            f"{theta ** (2 / d):.4g} radians per position): the reciprocal of the specified theta ** (-2i / d_head), "
            "the 1 / of the inverse frequencies dropped, or p * f where p / f belongs"
        )
    if (freqs <= 0).any() or theta <= 1:
        return f"per-position angles {_said(freqs)}"
    exponents = -torch.log(freqs) / math.log(theta)
    slope = float(exponents[1] - exponents[0]) if half > 1 else 0.0
    if half > 1 and (exponents - slope * i).abs().max() < 1e-6:
        grid = " (a linspace(0, 1, d_head / 2) grid of exponents)" if abs(slope * (half - 1) - 1) < 1e-6 else ""
        return f"theta ** (-{slope:.4g} i){grid}, where theta ** (-2i / d_head) = theta ** (-{2 / d:.4g} i)"
    a, b = slope * d, float(exponents[0]) * d  # exponents (a i + b) / d_head, in units of 1 / d_head
    if half > 1 and (exponents - (slope * i + exponents[0])).abs().max() < 1e-6 and abs(a - round(a)) < 1e-4:
        a, b = round(a), round(b, 3)
        shifted = (
            f": pair i turns at pair i + {b / 2:g}'s frequency (a pair number counted from {1 + b / 2:g}, or an "
            "index off by one)"
            if a == 2 and b > 0 and float(b / 2).is_integer()
            else ""
        )
        return f"theta ** (-({a}i + {b:g}) / d_head) where theta ** (-2i / d_head) belongs{shifted}"
    return f"per-position angles {_said(freqs)}"


def rotation_lines(run: Callable, args64: tuple, kwargs: dict, actual, tol, style: str) -> tuple[list, list]:
    """``(lines, codes)``: how the implementation's ``rope`` turns each pair (``measured_rotation``), where that differs
    from the specified rotation and reproduces the failing output."""
    try:
        p = _bind("x, positions, theta=10000.0", args64, kwargs)
        d, theta = p.x.shape[-1], float(p.theta)
        found = measured_rotation(lambda x, pos: run(x, pos, *args64[2:]), d, style)
    except Exception:  # noqa: BLE001 - a probe the implementation cannot run says nothing
        return [], []
    if found is None or not isinstance(actual, torch.Tensor):
        return [], []
    phase, freqs = found
    specified = theta ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    if phase.abs().max() < MATERIAL and ((freqs - specified).abs() <= MATERIAL * specified).all():
        return [], []  # the specified rotation, up to rounding (float32 tables): the precision tests say that
    explained = _rotated(p.x.double().cpu(), torch.as_tensor(p.positions).cpu(), phase, freqs, style)
    if explained.shape != actual.shape or mismatch(actual.detach().double().cpu(), explained, tol) is not None:
        return [], []
    if phase.abs().max() < MATERIAL and ((freqs + specified).abs() <= MATERIAL * specified).all():
        return [
            "likely cause: rope turns every pair the other way: by minus the specified angle (the sin terms' signs "
            "swapped). Look at the signs in the rotation; fix: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos) "
            "(evidence: rope measured on unit vectors at positions 0 to 2, and that rotation reproduces the failing "
            "output)"
        ], ["sign"]
    said = []
    if phase.abs().max() >= MATERIAL:
        quarter = (phase - math.pi / 2).abs().max() < MATERIAL and (
            (freqs + specified).abs() <= MATERIAL * specified
        ).all()
        said.append(
            "at position 0 every pair is already turned by a quarter turn and the angle falls with the position "
            "(pi/2 - p·f): the table holds sin where cos belongs and cos where sin"
            if quarter
            else f"at position 0 the pairs are already turned by {_said(phase)}"
        )
    if (
        not said
        or ((freqs - specified).abs() > MATERIAL * specified).any()
        and not said[0].startswith("at position 0 every pair")
    ):
        said.append(f"the angle per position is {_frequency_reading(freqs, theta, d)}")
    line = (
        f"likely cause: rope turns each pair otherwise than specified: {'; '.join(said)}. Look at how the rotary "
        f"table (the frequencies, and cos and sin) is built; fix: pair i at position p turns by p·theta ** (-2i / "
        f"d_head), cos in the first entry's place (evidence: rope measured on unit vectors at positions 0 to 2, and "
        f"that rotation reproduces the failing output)"
    )
    return [line], ["knob:rope_table" if phase.abs().max() >= MATERIAL else "knob:rope_base"]
