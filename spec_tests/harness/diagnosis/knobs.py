"""Knob search: is the output the reference's with one knob changed?

For each protocol function, a small family of variants written from docs/protocol.md (independently
of ``reference/`` and of the bug catalog): the function as specified, and the same function with one
knob turned (eps outside the root, softmax over the wrong axis, the other RoPE pairing, tiled GQA,
top-p before temperature, ...). ``knob_causes`` evaluates every variant on float64 copies of the
failing call's inputs and reports those that reproduce the implementation's output within tolerance.

A variant that gives the specified output on these inputs (within tolerance) says nothing and is
skipped. One fitting variant (or several of the same code) is reported with confidence >= 0.9;
variants of different codes that all fit are each reported as ambiguous (0.6).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch

from ...protocol import KNOB_FAMILIES, NAN_UNSPECIFIED
from . import cause as cause_module
from .cause import AMBIGUOUS, EXACT, EXACT_SHARED, Cause, as_array, as_float, fits
from .variant import Variant

F64 = torch.float64


class _Args(dict):
    """Bound call arguments (float tensors as float64 CPU copies), readable as attributes."""

    __getattr__ = dict.__getitem__


def _f64(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.to(F64) if x.is_floating_point() else x.clone()
    return x


def _bind(signature: str, args, kwargs) -> _Args:
    """Bind ``args``/``kwargs`` to a protocol signature such as ``"x, weight, eps=1e-5"``."""
    ns: dict = {}
    exec(f"def f({signature}): pass", {}, ns)  # a fixed signature string from this module
    bound = inspect.signature(ns["f"]).bind(*args, **kwargs)
    bound.apply_defaults()
    return _Args({k: _f64(v) for k, v in bound.arguments.items()})


# ---------------------------------------------------------------------------------------------
# norms


def _norm(x, w, b, eps, *, center, dim=-1, eps_mode="inside", unbiased=False, weight="once", bias="once"):
    dims = tuple(range(x.dim())) if dim is None else (dim,)
    n = math.prod(x.shape[d] for d in dims)
    xx = x - x.mean(dims, keepdim=True) if center else x
    ms = (xx * xx).sum(dims, keepdim=True) / (n - 1 if unbiased else n)
    if eps_mode == "inside":
        y = xx / torch.sqrt(ms + eps)
    elif eps_mode == "outside":
        y = xx / (torch.sqrt(ms) + eps)
    else:
        y = xx / torch.sqrt(ms)
    y = {"once": lambda: y * w, "none": lambda: y, "twice": lambda: y * w * w, "plus_one": lambda: y * (1 + w)}[
        weight
    ]()
    if b is not None:
        y = {"once": y + b, "none": y, "twice": y + 2 * b}[bias]
    return y


def _norm_family(p: _Args, center: bool):
    b = p.get("bias")
    kind = "layernorm" if center else "rmsnorm"

    def v(code, summary, where, fix, **kw):
        return Variant(
            f"knob:{code}",
            summary,
            where=where,
            fix=fix,
            compute=lambda: _norm(p.x, p.weight, b, p.eps, **({"center": center} | kw)),
        )

    where_denominator = f"the denominator of {kind}: sqrt({'var' if center else 'mean(x**2)'} + eps)"
    out = [
        v(
            "eps_placement",
            "eps is added outside the square root",
            where_denominator,
            "use sqrt(... + eps)",
            eps_mode="outside",
        ),
        v(
            "eps_placement",
            "eps is missing from the denominator",
            where_denominator,
            "add eps inside the root",
            eps_mode="none",
        ),
        v(
            "variance_bias",
            "the variance is the unbiased (n-1) one instead of the biased (n) one",
            f"the mean of squares in {kind}",
            "divide by n (torch: unbiased=False / correction=0)",
            unbiased=True,
        ),
        v("norm_weight", "the norm weight is not applied", f"the end of {kind}", "multiply by weight", weight="none"),
        v(
            "norm_weight",
            "the norm weight is applied twice",
            f"the end of {kind}",
            "multiply by weight once",
            weight="twice",
        ),
        v(
            "norm_weight",
            "the output is multiplied by (1 + weight) instead of weight",
            f"the end of {kind}",
            "multiply by weight",
            weight="plus_one",
        ),
    ]
    for other in (1e-5, 1e-6, 1e-8, 1e-4, 1e-3):
        if not math.isclose(other, p.eps):
            ignored = " (the eps argument is ignored)" if other == 1e-5 else ""
            out.append(
                Variant(
                    "knob:eps_value",
                    f"eps = {other:g} is used instead of {p.eps:g}{ignored}",
                    where=f"the eps used by {kind} (its default, a hard-coded value)",
                    fix="pass the eps argument through",
                    compute=(lambda o: lambda: _norm(p.x, p.weight, b, o, center=center))(other),
                )
            )
    if center:
        out.append(
            Variant(
                "knob:mean_subtraction",
                "the mean is not subtracted from x (RMSNorm computed instead)",
                where="the centring step of layernorm",
                fix="subtract the mean over the last axis first",
                compute=lambda: _norm(p.x, p.weight, b, p.eps, center=False),
            )
        )
        out.append(
            Variant(
                "knob:mean_subtraction",
                "x is divided by the standard deviation but the mean is not subtracted from the numerator",
                where="the numerator of layernorm",
                fix="normalise x - mean(x)",
                compute=lambda: p.x / torch.sqrt(p.x.var(-1, unbiased=False, keepdim=True) + p.eps) * p.weight + b,
            )
        )
        out += [
            v("bias", "the layernorm bias is not added", "the end of layernorm", "add bias", bias="none"),
            v("bias", "the layernorm bias is added twice", "the end of layernorm", "add bias once", bias="twice"),
            Variant(
                "knob:norm_weight",
                "weight and bias are swapped",
                where="the argument order of layernorm",
                fix="multiply by weight, add bias",
                compute=lambda: _norm(p.x, b, p.weight, p.eps, center=True),
            ),
        ]
    else:
        out.append(
            v(
                "mean_subtraction",
                "the mean is subtracted (a LayerNorm without bias instead of RMSNorm)",
                "the statistics of rmsnorm",
                "use mean(x**2) of x itself, without centring",
                center=True,
            )
        )
        out.append(
            Variant(
                "knob:mean_subtraction",
                "x is divided by the square root of its variance about the mean (x.var()), not of its mean square: "
                "x / sqrt(var(x) + eps), x itself not centred (Keras 3.0's rms_scaling)",
                where="the statistic in the denominator of rmsnorm",
                fix="use mean(x**2) over the last axis: x * rsqrt(mean(x**2) + eps) * weight",
                compute=lambda: p.x / torch.sqrt(p.x.var(-1, unbiased=False, keepdim=True) + p.eps) * p.weight,
            )
        )
    for d in list(range(p.x.dim() - 1)) + [None]:
        label = "all axes" if d is None else f"axis {d}"
        out.append(
            v(
                "reduction_dim",
                f"the statistics are taken over {label} instead of the last axis",
                f"the dim of the mean in {kind}",
                "reduce over the last axis (dim=-1, keepdim=True)",
                dim=d,
            )
        )
    return (lambda: _norm(p.x, p.weight, b, p.eps, center=center)), out


def _rmsnorm(args, kwargs, style):
    return _norm_family(_bind("x, weight, eps=1e-5", args, kwargs), center=False)


def _layernorm(args, kwargs, style):
    return _norm_family(_bind("x, weight, bias, eps=1e-5", args, kwargs), center=True)


# ---------------------------------------------------------------------------------------------
# primitives


def _naive_softmax(x, dim, dtype):
    e = torch.exp(x.to(dtype))
    return (e / e.sum(dim, keepdim=True)).to(F64)


def _softmax(args, kwargs, style):
    p = _bind("x, dim", args, kwargs)
    x, dim = p.x, p.dim % p.x.dim()
    out = [
        Variant(
            "knob:reduction_dim",
            f"the softmax runs over axis {d} instead of axis {dim}",
            where="the dim passed to the softmax's max/sum",
            fix=f"reduce over dim={p.dim}",
            compute=partial(torch.softmax, x, d),
        )
        for d in range(x.dim())
        if d != dim
    ]
    for d in range(x.dim()):
        if d == dim:
            continue
        # the stabilising max taken over another axis: it varies along dim, so it is no longer cancelled

        def other_max(d=d):
            e = torch.exp(x - x.amax(d, keepdim=True))
            return e / e.sum(dim, keepdim=True)

        out.append(
            Variant(
                "knob:reduction_dim",
                f"the max subtracted before exp is taken over axis {d} instead of axis {dim} (the sum over axis "
                f"{dim}): it varies along axis {dim}, so it no longer cancels",
                where="the dim of the softmax's stabilising max",
                fix=f"subtract x.max(dim={p.dim}, keepdim=True): the max over the axis the sum runs over",
                compute=other_max,
            )
        )
    for dtype, label in ((F64, "float64"), (torch.float32, "float32")):
        out.append(
            Variant(
                "knob:max_subtraction",
                f"exp(x) is taken without subtracting the max ({label})",
                where="the softmax's exponential",
                fix="subtract x.max(dim, keepdim=True) before exp",
                compute=(lambda dt: lambda: _naive_softmax(x, dim, dt))(dtype),
            )
        )
    return (lambda: torch.softmax(x, dim)), out


def _linear(args, kwargs, style):
    p = _bind("x, weight, bias=None", args, kwargs)
    x, w, b = p.x, p.weight, p.bias
    plus = (lambda y: y + b) if b is not None else (lambda y: y)
    out = []
    if w.shape[0] == x.shape[-1]:
        out.append(
            Variant(
                "knob:weight_layout",
                "the weight is used as [in, out]: x @ W instead of x @ W.T",
                where="the matmul in linear",
                fix="compute x @ weight.T (weights are [out_features, in_features])",
                compute=lambda: plus(x @ w),
            )
        )
    if b is not None:
        out += [
            Variant(
                "knob:bias", "the bias is not added", where="the end of linear", fix="add bias", compute=lambda: x @ w.T
            ),
            Variant(
                "knob:bias",
                "the bias is added twice",
                where="the end of linear",
                fix="add bias once",
                compute=lambda: x @ w.T + 2 * b,
            ),
        ]
    return (lambda: plus(x @ w.T)), out


def _embedding(args, kwargs, style):
    p = _bind("ids, weight", args, kwargs)
    ids, w = p.ids.long(), p.weight
    rows = lambda: w[ids]
    d = w.shape[-1]
    out = [
        Variant(
            "knob:embed_scale",
            f"the rows are multiplied by sqrt(d_model) = sqrt({d}) (the original Transformer's embedding scale)",
            where="the end of embedding",
            fix="give the rows as they are: only embed_scale (Gemma's) scales the token embeddings, in the model",
            compute=lambda: w[ids] * math.sqrt(d),
        )
    ]
    return rows, out


def _gelu_tanh(x, cubic=0.044715):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + cubic * x**3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _silu(x):
    return x * torch.sigmoid(x)


def _silu_family(args, kwargs, style):
    p = _bind("x", args, kwargs)
    x = p.x
    act = "the activation function"
    out = [
        Variant(
            "knob:activation",
            "sigmoid(x) is returned (the factor x is missing)",
            where=act,
            fix="return x * sigmoid(x)",
            compute=lambda: torch.sigmoid(x),
        ),
        Variant(
            "knob:activation",
            "GELU is computed instead of SiLU",
            where=act,
            fix="return x * sigmoid(x)",
            compute=lambda: _gelu_erf(x),
        ),
    ]
    return (lambda: _silu(x)), out


def _swiglu(args, kwargs, style):
    p = _bind("x, w_gate, w_up, w_down", args, kwargs)
    g, u = p.x @ p.w_gate.T, p.x @ p.w_up.T
    down = lambda h: h @ p.w_down.T
    where = "the gating line of swiglu: silu(x @ w_gate.T) * (x @ w_up.T)"
    out = [
        Variant(
            "knob:activation",
            "SiLU is applied to the up projection instead of the gate (equivalently: w_gate and w_up swapped)",
            where=where,
            fix="apply silu to x @ w_gate.T only",
            compute=lambda: down(g * _silu(u)),
        ),
        Variant(
            "knob:activation",
            "SiLU is applied to both the gate and the up projection",
            where=where,
            fix="apply silu to the gate only",
            compute=lambda: down(_silu(g) * _silu(u)),
        ),
        Variant(
            "knob:activation",
            "no SiLU: the gate is used linearly",
            where=where,
            fix="apply silu to the gate",
            compute=lambda: down(g * u),
        ),
        Variant(
            "knob:activation",
            "SiLU is applied to the product of the gate and the up projection, silu(gate * up), not to the gate alone",
            where=where,
            fix="silu(x @ w_gate.T) * (x @ w_up.T): the activation gates, then multiplies",
            compute=lambda: down(_silu(g * u)),
        ),
        Variant(
            "knob:activation",
            "sigmoid instead of SiLU on the gate",
            where=where,
            fix="silu(g) = g * sigmoid(g)",
            compute=lambda: down(torch.sigmoid(g) * u),
        ),
        Variant(
            "knob:activation",
            "GELU instead of SiLU on the gate",
            where=where,
            fix="use silu",
            compute=lambda: down(_gelu_erf(g) * u),
        ),
    ]
    return (lambda: down(_silu(g) * u)), out


def _gelu_mlp(args, kwargs, style):
    p = _bind("x, w_fc, b_fc, w_proj, b_proj", args, kwargs)
    h = p.x @ p.w_fc.T + p.b_fc
    proj = lambda a: a @ p.w_proj.T + p.b_proj
    where = "the activation of gelu_mlp"
    out = [
        Variant(
            "knob:activation",
            "the exact (erf) GELU is used instead of the tanh approximation",
            where=where,
            fix="use F.gelu(h, approximate='tanh')",
            compute=lambda: proj(_gelu_erf(h)),
        ),
        Variant(
            "knob:activation",
            "the tanh GELU is missing its cubic term (0.044715 x**3)",
            where=where,
            fix="0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))",
            compute=lambda: proj(_gelu_tanh(h, cubic=0.0)),
        ),
        Variant(
            "knob:activation",
            "ReLU is used instead of GELU",
            where=where,
            fix="use the tanh GELU",
            compute=lambda: proj(torch.relu(h)),
        ),
        Variant(
            "knob:activation",
            "SiLU is used instead of GELU",
            where=where,
            fix="use the tanh GELU",
            compute=lambda: proj(_silu(h)),
        ),
        Variant(
            "knob:bias",
            "b_fc is not added",
            where="the first projection of gelu_mlp",
            fix="add b_fc",
            compute=lambda: proj(_gelu_tanh(h - p.b_fc)),
        ),
        Variant(
            "knob:bias",
            "b_proj is not added",
            where="the output projection of gelu_mlp",
            fix="add b_proj",
            compute=lambda: _gelu_tanh(h) @ p.w_proj.T,
        ),
    ]
    return (lambda: proj(_gelu_tanh(h))), out


# ---------------------------------------------------------------------------------------------
# positions


def _rope(x, pos, theta, style, *, exponent="2i", denom=None, sign=1.0, pos_shift=0, restart=False, pair_sign=None):
    d = x.shape[-1]
    half = d // 2
    i = torch.arange(half, dtype=F64)
    num = {"2i": 2 * i, "i": i, "4i": 4 * i}[exponent]
    freqs = theta ** (-num / (denom or d))
    pos = pos.to(F64)
    if restart:
        pos = torch.arange(x.shape[-2], dtype=F64)
    angle = (pos + pos_shift)[..., None] * freqs * sign
    cos, sin = torch.cos(angle), torch.sin(angle)
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :half], x[..., half:]
    sa, sb = (1.0, 1.0) if pair_sign is None else pair_sign
    ra = a * cos - sa * b * sin
    rb = sb * a * sin + b * cos
    if style == "interleaved":
        return torch.stack((ra, rb), dim=-1).flatten(-2)
    return torch.cat((ra, rb), dim=-1)


def rope_with_tables(x, pos, theta, pairing, layout):
    """RoPE written with per-channel cos/sin tables (``x * cos + rotate(x) * sin``): ``pairing`` the rotation's
    (rotate_half for "half", every two channels for "interleaved"), ``layout`` the tables' (each frequency for
    channels i and i + d/2, ``cat(freqs, freqs)``, or for 2i and 2i + 1, ``repeat_interleave(2)``)."""
    d = x.shape[-1]
    freqs = theta ** (-2 * torch.arange(d // 2, dtype=F64) / d)
    angle = pos.to(F64)[..., None] * freqs
    angle = torch.cat((angle, angle), -1) if layout == "half" else angle.repeat_interleave(2, -1)
    if pairing == "half":
        rotated = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1)
    else:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    return x * torch.cos(angle) + rotated * torch.sin(angle)


def _rope_family(args, kwargs, style):
    p = _bind("x, positions, theta=10000.0", args, kwargs)
    x, pos, theta = p.x, p.positions, float(p.theta)
    other = "half" if style == "interleaved" else "interleaved"
    r = lambda **kw: lambda: _rope(x, pos, kw.pop("theta", theta), kw.pop("style", style), **kw)
    freq = "the RoPE frequencies theta ** (-2i / d_head)"
    out = [
        Variant(
            "knob:rope_style",
            f"channels are paired in the {other} style instead of the declared {style} one",
            where="the channel pairing of the rotation (x[..., 0::2]/x[..., 1::2] vs x[..., :d/2]/x[..., d/2:])",
            fix=f"pair channels {style}: " + ("(2i, 2i+1)" if style == "interleaved" else "(i, i + d/2)"),
            compute=r(style=other),
        ),
        *(
            Variant(
                "knob:rope_style",
                f"the cos/sin tables are laid out {layout} ({how}) while the rotation pairs channels {pairing} "
                f"({pairs}): each channel turns at another pair's frequency",
                where="how the cos/sin tables are built beside how the rotation pairs the channels",
                fix=f"lay the tables out to match the {pairing} pairing: "
                + ("cat(freqs, freqs)" if pairing == "half" else "freqs.repeat_interleave(2)"),
                compute=lambda pairing=pairing, layout=layout: rope_with_tables(x, pos, theta, pairing, layout),
            )
            for pairing, layout, how, pairs in (
                ("half", "interleaved", "f0, f0, f1, f1, ...", "i with i + d/2, rotate_half"),
                ("interleaved", "half", "cat(freqs, freqs)", "2i with 2i + 1"),
            )
        ),
        Variant(
            "sign",
            "the rotation goes the wrong way (by -angle: the sin terms have the wrong sign)",
            where="the signs of the sin terms (rotate_half = cat(-x2, x1))",
            fix="out = x cos + rotate(x) sin with rotate(a, b) = (-b, a)",
            compute=r(sign=-1.0),
        ),
        Variant(
            "sign",
            "the first channel of each pair rotates with the wrong sign (rotate_half without the minus)",
            where="rotate_half / the sin term of the first channel of each pair",
            fix="use (a cos - b sin, a sin + b cos)",
            compute=r(pair_sign=(-1.0, 1.0)),
        ),
        Variant(
            "sign",
            "the second channel of each pair rotates with the wrong sign",
            where="the sin term of the second channel of each pair",
            fix="use (a cos - b sin, a sin + b cos)",
            compute=r(pair_sign=(1.0, -1.0)),
        ),
        Variant(
            "knob:rope_base",
            "the exponent uses i instead of 2i: theta ** (-i / d_head)",
            where=freq,
            fix="use theta ** (-2i / d_head) for pair i",
            compute=r(exponent="i"),
        ),
        Variant(
            "knob:rope_base",
            "the exponent doubles 2i: theta ** (-4i / d_head) (arange(0, d, 2) times 2, or divided by d/2)",
            where=freq,
            fix="use theta ** (-2i / d_head) for pair i",
            compute=r(exponent="4i"),
        ),
        Variant(
            "knob:position_offset",
            "positions are off by +1",
            where="the positions passed to the rotation",
            fix="rotate by the given positions",
            compute=r(pos_shift=1),
        ),
        Variant(
            "knob:position_offset",
            "positions are off by -1",
            where="the positions passed to the rotation",
            fix="rotate by the given positions",
            compute=r(pos_shift=-1),
        ),
        Variant(
            "knob:position_offset",
            "the positions argument is ignored: positions restart at 0 (arange(T))",
            where="the positions used by the rotation",
            fix="use the given positions",
            compute=r(restart=True),
        ),
    ]
    if x.dim() >= 3:
        dm = x.shape[-1] * x.shape[-3]
        out.append(
            Variant(
                "knob:rope_base",
                f"the exponent divides by d_model ({dm}) instead of d_head ({x.shape[-1]})",
                where=freq,
                fix="use theta ** (-2i / d_head)",
                compute=r(denom=dm),
            )
        )
    if not math.isclose(theta, 10000.0):
        out.append(
            Variant(
                "knob:rope_theta",
                f"theta = 10000 is used instead of the given {theta:g} (the theta argument is ignored)",
                where="the theta used for the frequencies",
                fix="use the theta argument",
                compute=r(theta=10000.0),
            )
        )
    return r(), out


def _sinusoid(n, d, *, exponent="2i", swap=False, halves=False, pos_shift=0):
    pos = torch.arange(n, dtype=F64)[:, None] + pos_shift
    cols = torch.arange(d)
    pair = cols // 2
    num = {"2i": 2 * pair, "i": pair, "4i": 4 * pair, "j": cols}[exponent].to(F64)
    angle = pos / 10000.0 ** (num / d)
    even = cols % 2 == 0
    if swap:
        even = ~even
    table = torch.where(even, torch.sin(angle), torch.cos(angle))
    if halves:
        h = (d + 1) // 2
        first = torch.arange(h)
        table = torch.empty(n, d, dtype=F64)
        ang = pos / 10000.0 ** (2 * first.to(F64) / d)
        table[:, :h] = torch.sin(ang)
        table[:, h:] = torch.cos(ang[:, : d - h])
    return table


def _sinusoidal(args, kwargs, style):
    p = _bind("n_positions, d_model", args, kwargs)
    n, d = int(p.n_positions), int(p.d_model)
    where = "the sinusoidal table: pe[p, 2i] = sin(p / 10000**(2i/d)), pe[p, 2i+1] = cos(...)"
    s = lambda **kw: lambda: _sinusoid(n, d, **kw)
    out = [
        Variant(
            "knob:sinusoid_layout",
            "sin and cos are swapped (cos in the even channels)",
            where=where,
            fix="sin in even channels, cos in odd ones",
            compute=s(swap=True),
        ),
        Variant(
            "knob:sinusoid_layout",
            "sin and cos are laid out in halves instead of alternating channels",
            where=where,
            fix="interleave: sin at 2i, cos at 2i+1",
            compute=s(halves=True),
        ),
        Variant(
            "knob:rope_base",
            "the exponent uses the channel index j instead of 2i (the cos channel 2i+1 gets its own frequency)",
            where=where,
            fix="both channels of pair i use 10000**(2i/d)",
            compute=s(exponent="j"),
        ),
        Variant(
            "knob:rope_base",
            "the exponent uses i instead of 2i",
            where=where,
            fix="use 10000**(2i/d)",
            compute=s(exponent="i"),
        ),
        Variant(
            "knob:rope_base",
            "the exponent uses 4i instead of 2i",
            where=where,
            fix="use 10000**(2i/d)",
            compute=s(exponent="4i"),
        ),
        Variant(
            "knob:position_offset",
            "positions start at 1 instead of 0",
            where=where,
            fix="rows are p = 0 .. n-1",
            compute=s(pos_shift=1),
        ),
    ]
    return s(), out


# ---------------------------------------------------------------------------------------------
# masks and attention


def _causal(tq, tk, shift=0, top_left=False):
    i = torch.arange(tq)[:, None]
    j = torch.arange(tk)[None, :]
    return j <= i + (0 if top_left else tk - tq) + shift


def _causal_mask(args, kwargs, style):
    p = _bind("t_q, t_k, device=None", args, kwargs)
    tq, tk = int(p.t_q), int(p.t_k)
    where = "the causal mask: query i may attend key j iff j <= i + (t_k - t_q)"
    fix = "return j <= i + (t_k - t_q) as bool (True = may attend)"
    out = [
        Variant(
            "knob:mask_alignment",
            "the mask is aligned top-left (j <= i) instead of bottom-right",
            where=where,
            fix=fix,
            compute=lambda: _causal(tq, tk, top_left=True),
        ),
        Variant(
            "knob:mask_alignment",
            "the diagonal is excluded (j < i + t_k - t_q)",
            where=where,
            fix=fix,
            compute=lambda: _causal(tq, tk, shift=-1),
        ),
        Variant(
            "knob:mask_alignment",
            "the mask lets each query see one key too many (j <= i + t_k - t_q + 1)",
            where=where,
            fix=fix,
            compute=lambda: _causal(tq, tk, shift=1),
        ),
        Variant(
            "knob:mask_polarity",
            "the mask is inverted (True marks masked keys)",
            where=where,
            fix=fix,
            compute=lambda: ~_causal(tq, tk),
        ),
        Variant(
            "knob:mask_polarity",
            "the mask is inverted and aligned top-left (triu(1): True marks future keys)",
            where=where,
            fix=fix,
            compute=lambda: ~_causal(tq, tk, top_left=True),
        ),
        Variant(
            "knob:mask_polarity",
            "the upper triangle including the diagonal is returned (triu instead of tril)",
            where=where,
            fix=fix,
            compute=lambda: ~_causal(tq, tk, top_left=True, shift=-1),
        ),
    ]
    return (lambda: _causal(tq, tk)), out


def _repeat(x, n_rep, tiled=False):
    if n_rep == 1:
        return x
    return x.repeat(*([1] * (x.dim() - 3)), n_rep, 1, 1) if tiled else x.repeat_interleave(n_rep, dim=-3)


def _repeat_kv(args, kwargs, style):
    p = _bind("x, n_rep", args, kwargs)
    out = [
        Variant(
            "knob:gqa_mapping",
            "key/value heads are tiled (head h gets kv head h % n_kv) instead of interleaved (h // n_rep)",
            where="the head repetition in repeat_kv",
            fix="use x.repeat_interleave(n_rep, dim=-3) (or expand on a new axis after the kv-head axis)",
            compute=lambda: _repeat(p.x, int(p.n_rep), tiled=True),
        ),
    ]
    return (lambda: _repeat(p.x, int(p.n_rep))), out


def _alibi_slopes(n_heads: int, geometric: bool = False) -> torch.Tensor:
    """ALiBi's head slopes (Press et al.): 2^(-8 h / n) for h = 1..n, and for n not a power of two the slopes of
    the power of two below it followed by every other slope of the one above (the paper's code); ``geometric``:
    2^(-8 h / n) for every n (what simpler code writes)."""
    below = n_heads if geometric else 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * (h + 1) / below) for h in range(below)]
    slopes += [2 ** (-8 * (h + 1) / (2 * below)) for h in range(0, 2 * below, 2)][: n_heads - below]
    return torch.tensor(slopes, dtype=F64)


def _attend(q, k, v, mask, *, scale=None, tiled=False, dim=-1, mask_mode="apply", alibi=None):
    rep = q.shape[-3] // k.shape[-3]
    k, v = _repeat(k, rep, tiled), _repeat(v, rep, tiled)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if alibi:  # a distance penalty per head: -slope_h * (i - j), the query at position i + t_k - t_q
        tq, tk = s.shape[-2], s.shape[-1]
        distance = (torch.arange(tq)[:, None] + (tk - tq) - torch.arange(tk)[None, :]).to(F64)
        s = s - _alibi_slopes(s.shape[-3], alibi == "geometric")[:, None, None].to(s) * distance.to(s)
    if mask is not None:
        mask = mask.to(torch.bool)
        if mask_mode == "apply":
            s = s.masked_fill(~mask, -math.inf)
        elif mask_mode == "inverted":
            s = s.masked_fill(mask, -math.inf)
        elif mask_mode == "added":
            s = s + mask.to(F64)
        elif mask_mode == "zero":
            s = s.masked_fill(~mask, 0.0)
        elif mask_mode == "fill_min":  # a finite fill (torch.finfo(dtype).min, -1e4): the same value in every head
            s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.softmax(s, dim) @ v


def _attention_variants(q, k, v, mask, *, scale_where: str):
    d, h = q.shape[-1], q.shape[-3]
    a = lambda **kw: lambda: _attend(q, k, v, mask, **kw)
    fix_scale = "multiply q k^T by 1/sqrt(d_head)"
    out = [
        Variant(
            "knob:scale_constant",
            "the scores are not scaled (1/sqrt(d_head) missing)",
            where=scale_where,
            fix=fix_scale,
            compute=a(scale=1.0),
        ),
        Variant(
            "knob:scale_constant",
            f"the scores are divided by d_head ({d}) instead of sqrt(d_head)",
            where=scale_where,
            fix=fix_scale,
            compute=a(scale=1.0 / d),
        ),
        Variant(
            "knob:scale_constant",
            f"the scores are divided by sqrt(d_model) = sqrt({h * d}) instead of sqrt(d_head)",
            where=scale_where,
            fix=fix_scale,
            compute=a(scale=1.0 / math.sqrt(h * d)),
        ),
        Variant(
            "knob:scale_constant",
            "the scores are multiplied by sqrt(d_head) instead of divided",
            where=scale_where,
            fix=fix_scale,
            compute=a(scale=math.sqrt(d)),
        ),
    ]
    tk, tq = k.shape[-2], q.shape[-2]
    # the size of another axis where d_head belongs: k's key axis, q's query axis (where the two are the same size
    # here, either one: the line says both)
    lengths = {tk: "the number of keys" if tq != tk else "the number of keys, which is also the number of queries here"}
    if tq != tk:
        lengths[tq] = "the number of queries"
    for size, said in lengths.items():
        if size == d:
            continue
        out.append(
            Variant(
                "knob:scale_constant",
                f"the scores are divided by sqrt({size}), {said}, instead of sqrt(d_head)",
                where=scale_where,
                fix=f"{fix_scale} (the size of q's and k's last axis, not of a sequence axis)",
                compute=a(scale=1.0 / math.sqrt(size)),
            )
        )
    out += [
        Variant(
            "knob:reduction_dim",
            "the softmax runs over the queries (dim -2) instead of the keys",
            where="the dim of the attention softmax",
            fix="softmax over the last axis (keys)",
            compute=a(dim=-2),
        ),
    ]
    if q.dim() >= 3 and h > 1:  # held out: an exported graph's Softmax with axis=1 of [B, H, T, T] scores
        # over the heads, a mask filled with -inf gives NaN, one finite value 1 / H for each masked key, an added one
        # cancels
        for mode in ("apply", "fill_min", "ignored"):
            out.append(
                Variant(
                    "knob:reduction_dim",
                    "the softmax runs over the heads (dim 1 of the [B, H, T_q, T_k] scores, dim -3) instead of the "
                    "keys",
                    where="the dim of the attention softmax",
                    fix="softmax over the last axis (keys): softmax(scores, dim=-1)",
                    compute=a(dim=-3, mask_mode=mode),
                )
            )
    power_of_two = h & (h - 1) == 0
    out += [
        Variant(
            "knob:score_bias",
            "the scores get ALiBi's distance penalty (-slope_h * (i - j) per head"
            + ("" if power_of_two else f", slopes 2^(-8 h / {h})" if style == "geometric" else ", the paper's slopes")
            + "), which this family does not have",
            where="what is added to the scores before the softmax (an ALiBi bias switched on, or left from a config)",
            fix="add nothing to the scaled scores but the mask (positions come from RoPE or the learned embeddings)",
            compute=a(alibi=style),
        )
        for style in (("paper",) if power_of_two else ("paper", "geometric"))
    ]
    if k.shape[-3] not in (1, q.shape[-3]):
        out.append(
            Variant(
                "knob:gqa_mapping",
                "query heads use the tiled key/value head (h % n_kv) instead of h // n_rep",
                where="the head repetition before the scores",
                fix="repeat_interleave k and v over the head axis",
                compute=a(tiled=True),
            )
        )
    if mask is None:
        tq, tk = q.shape[-2], k.shape[-2]
        out += [
            Variant(
                "knob:mask_missing",
                f"a causal mask is applied although no mask was given ({'bottom-right' if top else 'top-left'} "
                "aligned): mask=None means every query attends to every key",
                where="what the attention does when mask is None",
                fix="with mask=None mask nothing (is_causal=False); only a given mask hides keys",
                compute=lambda top=top: _attend(q, k, v, _causal(tq, tk, top_left=not top)),
            )
            for top in ((True,) if tq == tk else (True, False))
        ]
    if mask is not None:
        mwhere = "where the mask is applied to the scores (masked_fill(~mask, -inf))"
        mfix = "set scores to -inf where mask is False, before the softmax"
        out += [
            Variant(
                "knob:mask_missing",
                "the mask has no effect: the output is attention without it (the mask not applied, or one built or "
                "sliced so that it keeps every key)",
                where=mwhere,
                fix=mfix,
                compute=a(mask_mode="ignored"),
            ),
            Variant(
                "knob:mask_polarity",
                "the mask is inverted (True taken as masked)",
                where=mwhere,
                fix=mfix,
                compute=a(mask_mode="inverted"),
            ),
            Variant(
                "knob:mask_missing",
                "the bool mask is added to the scores as 0/1 instead of masking with -inf",
                where=mwhere,
                fix=mfix,
                compute=a(mask_mode="added"),
            ),
            Variant(
                "knob:mask_missing",
                "masked scores are set to 0 instead of -inf",
                where=mwhere,
                fix=mfix,
                compute=a(mask_mode="zero"),
            ),
        ]
    return out


def _sdpa(args, kwargs, style):
    p = _bind("q, k, v, mask=None", args, kwargs)
    out = _attention_variants(p.q, p.k, p.v, p.mask, scale_where="the score scaling in attention")
    return (lambda: _attend(p.q, p.k, p.v, p.mask)), out


def _flash(args, kwargs, style):
    p = _bind("q, k, v, causal=True, block_size=64", args, kwargs)
    tq, tk = p.q.shape[-2], p.k.shape[-2]
    mask = _causal(tq, tk) if p.causal else None
    out = _attention_variants(p.q, p.k, p.v, mask, scale_where="the score scaling in flash_attention")
    if p.causal and tq != tk:
        out.append(
            Variant(
                "knob:mask_alignment",
                "the causal mask is aligned top-left (j <= i) instead of bottom-right",
                where="the causal condition inside the blocks",
                fix="allow j <= i + t_k - t_q",
                compute=lambda: _attend(p.q, p.k, p.v, _causal(tq, tk, top_left=True)),
            )
        )
    if p.causal and int(p.block_size) < tq:  # several query blocks: a key block skipped by the wrong query's reach
        bs = int(p.block_size)
        i, j = torch.arange(tq)[:, None], torch.arange(tk)[None, :]
        first = (j // bs) * bs <= (i // bs) * bs + (tk - tq)
        out.append(
            Variant(
                "knob:flash_block_skip",
                "a key block is skipped when it starts after the query block's first query can see (k0 > q0 + t_k - "
                "t_q) instead of its last: the block's later queries lose keys the causal mask allows them",
                where="the causal early exit over key blocks",
                fix="skip a key block only when k0 > q0 + n_q - 1 + (t_k - t_q), the last query of the block",
                compute=lambda: _attend(p.q, p.k, p.v, _causal(tq, tk) & first),
            )
        )
    if p.causal:
        out.append(
            Variant(
                "knob:mask_alignment",
                "the diagonal is excluded from the causal mask",
                where="the causal condition inside the blocks",
                fix="allow j <= i + t_k - t_q",
                compute=lambda: _attend(p.q, p.k, p.v, _causal(tq, tk, shift=-1)),
            )
        )
    else:
        out.append(
            Variant(
                "knob:mask_missing",
                "a causal mask is applied although causal=False",
                where="the causal flag",
                fix="mask only when causal=True",
                compute=lambda: _attend(p.q, p.k, p.v, _causal(tq, tk)),
            )
        )
    return (lambda: _attend(p.q, p.k, p.v, mask)), out


def _mha(
    x,
    wq,
    wk,
    wv,
    wo,
    h,
    hkv,
    theta,
    positions,
    style,
    *,
    split_view=False,
    merge_view=False,
    channel_major=None,
    rope_values=False,
    rope_q_only=False,
    keys_from_zero=False,
    rope_flat=None,
    time_major=(),
    group_minor_merge=False,
    group_minor_split=False,
    batch_minor_merge=False,
    **attend,
):
    b, t, _ = x.shape
    dh = wq.shape[0] // h

    def project(w, role):  # time_major: the projection made [T, B, D] and read back as [B, T, D] by a plain view
        y = x @ w.T
        return y.transpose(0, 1).reshape(b, t, -1) if role in time_major else y

    def split(y, heads):
        if split_view:
            return y.reshape(b, heads, t, dh)
        if channel_major in ("split", "both"):  # (d h): the channel index outer, the head inner
            return y.reshape(b, t, dh, heads).permute(0, 3, 1, 2)
        return y.reshape(b, t, heads, dh).transpose(1, 2)

    if rope_flat is not None:  # RoPE on the flat [B, T, H * d_head] projections, pairs indexed across the heads
        pos = positions if positions is not None else torch.arange(t)
        denom = None if rope_flat == "own" else rope_flat  # "own": each projection's own width, as rope(q), rope(k)
        q = split(_rope(x @ wq.T, pos, theta, style, denom=denom), h)
        k = split(_rope(x @ wk.T, pos, theta, style, denom=denom), hkv)
        o = _attend(q, k, split(x @ wv.T, hkv), attend.pop("mask", _causal(t, t)), **attend)
        return o.transpose(1, 2).reshape(b, t, h * dh) @ wo.T
    q, k, v = split(project(wq, "q"), h), split(project(wk, "k"), hkv), split(project(wv, "v"), hkv)
    if group_minor_split:  # wq's heads indexed (r g) read as if indexed (g r): each kv group gets heads spread apart
        q = q.reshape(b, h // hkv, hkv, t, dh).transpose(1, 2).reshape(b, h, t, dh)
    if theta is not None:
        pos = positions if positions is not None else torch.arange(t)
        q = _rope(q, pos, theta, style)
        if not rope_q_only:
            k = _rope(k, torch.arange(t) if keys_from_zero else pos, theta, style)
        if rope_values:
            v = _rope(v, pos, theta, style)
    mask = attend.pop("mask", _causal(t, t))
    o = _attend(q, k, v, mask, **attend)
    if batch_minor_merge:  # heads folded into the batch as (b h), unfolded as if (h b): rows and heads mixed
        o = o.reshape(h, b, t, dh).transpose(0, 1)
    if group_minor_merge:  # heads indexed (g r) merged as if indexed (r g): each group's heads spread apart
        o = o.reshape(b, hkv, h // hkv, t, dh).transpose(1, 2).reshape(b, h, t, dh)
    if channel_major in ("merge", "both"):
        return o.permute(0, 2, 3, 1).reshape(b, t, h * dh) @ wo.T
    o = o.reshape(b, t, h * dh) if merge_view else o.transpose(1, 2).reshape(b, t, h * dh)
    return o @ wo.T


def _swapped_projections(p, h, hkv, theta, style) -> list[Variant]:
    """Two of wq, wk, wv of the same shape exchanged (a loader or an adapter that maps them in the wrong order)."""
    role = {"wq": "queries", "wk": "keys", "wv": "values"}
    out = []
    for a, b in (("wk", "wv"), ("wq", "wk"), ("wq", "wv")):
        w = {"wq": p.wq, "wk": p.wk, "wv": p.wv}
        if w[a].shape != w[b].shape:
            continue
        w[a], w[b] = w[b], w[a]
        out.append(
            Variant(
                "knob:qkv_layout",
                f"{a} and {b} are exchanged: the {role[a]} are projected with {b} and the {role[b]} with {a}",
                where="which weight projects the queries, the keys and the values",
                fix="q = x @ wq.T, k = x @ wk.T, v = x @ wv.T",
                compute=lambda w=w: _mha(p.x, w["wq"], w["wk"], w["wv"], p.wo, h, hkv, theta, p.positions, style),
            )
        )
    return out


def _fused_per_head_projections(p, h, hkv, theta, style) -> list[Variant]:
    """The fused [wq; wk; wv] matrix split per head ([H, 3, d_head] rows, GPT-NeoX's and Megatron's layout) where it
    was laid out as the three projections one after the other: MHA only (a GQA split has unequal parts)."""
    if hkv != h or not (p.wq.shape == p.wk.shape == p.wv.shape):
        return []
    dh = p.wq.shape[0] // h
    rows = torch.cat([p.wq, p.wk, p.wv]).reshape(h, 3, dh, p.wq.shape[1])
    wq, wk, wv = (rows[:, i].reshape(h * dh, -1) for i in range(3))
    return [
        Variant(
            "knob:qkv_layout",
            "the fused q, k, v projection is split per head ([n_heads, 3, d_head] rows, GPT-NeoX's and Megatron's "
            "layout) where its rows are the three projections one after the other ([wq; wk; wv])",
            where="how the fused qkv output is split into queries, keys and values",
            fix="split the fused output as [q; k; v] (qkv.split(n_heads * d_head, dim=-1)), the order its weights "
            "were stacked in, or stack them per head to match a per-head split",
            compute=lambda: _mha(p.x, wq, wk, wv, p.wo, h, hkv, theta, p.positions, style),
        )
    ]


def _transposed_projections(p, h, hkv, theta, style) -> list[Variant]:
    """A square weight used transposed: kept [in, out] (a Conv1D, a DenseGeneral kernel) and used as given, or
    reshaped without its transpose where it was converted (held out 79: the output kernel at load)."""
    w = {"wq": p.wq, "wk": p.wk, "wv": p.wv, "wo": p.wo}
    out = []
    for name in ("wo", "wq", "wk", "wv"):
        if w[name].shape[0] != w[name].shape[1]:
            continue
        used = dict(w, **{name: w[name].T})
        out.append(
            Variant(
                "knob:weight_layout",
                f"{name} is used transposed: as [in, out] where [out, in] is given (x @ {name} instead of "
                f"x @ {name}.T; a kernel kept [in, out], or reshaped without its transpose where it is converted)",
                where=f"how multihead_self_attention uses {name}",
                fix=f"multiply by {name}.T: weights are [out_features, in_features]",
                compute=lambda u=used: _mha(p.x, u["wq"], u["wk"], u["wv"], u["wo"], h, hkv, theta, p.positions, style),
            )
        )
    return out


def _windowed(t: int, window) -> torch.Tensor:
    """The causal mask of ``t`` tokens, narrowed to the last ``window`` keys (protocol v2, amendment 27)."""
    mask = _causal(t, t)
    if window is None:
        return mask
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    return mask & (i - j < int(window))


def _mha_family(args, kwargs, style):
    p = _bind("x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None, *, window=None", args, kwargs)
    h = int(p.n_heads)
    hkv = int(p.n_kv_heads) if p.n_kv_heads is not None else h
    theta = float(p.theta) if p.theta is not None else None
    base = (p.x, p.wq, p.wk, p.wv, p.wo, h, hkv)
    t = p.x.shape[1]
    window = None if p.window is None else int(p.window)
    m = lambda **kw: (
        lambda: _mha(
            *base,
            kw.pop("theta", theta),
            kw.pop("positions", p.positions),
            kw.pop("style", style),
            **{"mask": _windowed(t, window), **kw},
        )
    )
    dh = p.wq.shape[0] // h
    scale_where = "the score scaling in multihead_self_attention"
    out = [
        Variant(
            "knob:head_layout",
            "heads are merged with a plain reshape of [B, H, T, d_head] (no transpose back to [B, T, H, d_head])",
            where="the reshape that merges heads before wo",
            fix="o.transpose(1, 2).reshape(B, T, H * d_head)",
            compute=m(merge_view=True),
        ),
        Variant(
            "knob:head_layout",
            "heads are split with a plain view to [B, H, T, d_head] (no transpose from [B, T, H, d_head])",
            where="the view that splits q/k/v into heads",
            fix="y.view(B, T, H, d_head).transpose(1, 2)",
            compute=m(split_view=True),
        ),
        *(
            Variant(
                "knob:head_layout",
                f"heads are {what} channel-major, '(d h)' instead of head-major '(h d)': the channel index outer and "
                "the head inner",
                where="the rearrange patterns that split and merge heads",
                fix="rearrange(o, 'b h t d -> b t (h d)') and rearrange(y, 'b t (h d) -> b h t d'): the head outer",
                compute=m(channel_major=which),
            )
            for what, which in (("merged", "merge"), ("split", "split"), ("split and merged", "both"))
        ),
        *(
            Variant(
                "knob:head_layout",
                f"the {what} held sequence-first ([T, B, ...]) are read as batch-first ([B, T, ...]) by a view or "
                "reshape without a transpose, so each row attends tokens of other rows",
                where="the layout change between sequence-first and batch-first tensors in attention",
                fix="x.transpose(0, 1) (then .contiguous() or .reshape) where [T, B, ...] becomes [B, T, ...]",
                compute=m(time_major=roles),
            )
            for what, roles in (
                ("keys", ("k",)),
                ("values", ("v",)),
                ("queries", ("q",)),
                ("keys and values", ("k", "v")),
                ("queries, keys and values", ("q", "k", "v")),
            )
            if p.x.shape[0] > 1
        ),
        Variant(
            "knob:scale_constant",
            "the scores are not scaled",
            where=scale_where,
            fix="divide by sqrt(d_head)",
            compute=m(scale=1.0),
        ),
        Variant(
            "knob:scale_constant",
            f"the scores are divided by d_head ({dh})",
            where=scale_where,
            fix="divide by sqrt(d_head)",
            compute=m(scale=1.0 / dh),
        ),
        Variant(
            "knob:scale_constant",
            f"the scores are divided by sqrt(d_model) = sqrt({p.x.shape[-1]})",
            where=scale_where,
            fix="divide by sqrt(d_head)",
            compute=m(scale=1.0 / math.sqrt(p.x.shape[-1])),
        ),
        *(
            [
                Variant(
                    "knob:scale_constant",
                    f"the scores are divided by sqrt(T) = sqrt({t}), the sequence's length (its number of queries "
                    "and of keys), instead of sqrt(d_head)",
                    where=scale_where,
                    fix="divide by sqrt(d_head) (the size of k's last axis, not of its key axis)",
                    compute=m(scale=1.0 / math.sqrt(t)),
                )
            ]
            if t != dh
            else []
        ),
        *(
            [
                Variant(
                    "knob:head_layout",
                    "the heads' outputs are merged in (query heads per group, kv heads) order instead of (kv heads, "
                    "query heads per group): head g * n_rep + r lands where head r * n_kv + g belongs, so wo reads "
                    "the heads permuted",
                    where="the rearrange that merges the heads of the GQA groups before wo",
                    fix="merge as rearrange(o, 'b (g r) t d -> b t (g r d)'): the group outer, as the heads were split",
                    compute=m(group_minor_merge=True),
                ),
                Variant(
                    "knob:head_layout",
                    "the query heads are split in (query heads per group, kv heads) order: query head r * n_kv + g "
                    "lands where head g * n_rep + r belongs, so kv group g attends with queries of heads spread apart "
                    "(wq's rows grouped per kv group the other way, as in a fused per-group qkv weight)",
                    where="the split of the query heads into GQA groups (or the grouping of a fused qkv weight)",
                    fix="split as rearrange(q, 'b t (g r d) -> b (g r) t d'): head h in kv group h // n_rep",
                    compute=m(group_minor_split=True),
                ),
            ]
            if 1 < hkv < h
            else []
        ),
        *(
            [
                Variant(
                    "knob:head_layout",
                    "the heads, folded into the batch as [B * H, T, d_head] with index b * H + h, are unfolded as if "
                    "indexed h * B + b: each row's merged output takes heads of other rows (right for a batch of one)",
                    where="the reshape that unfolds [B * H, T, d_head] back into rows and heads before wo",
                    fix="unfold as rearrange(o, '(b h) t d -> b t (h d)', h=n_heads), the order they were folded in",
                    compute=m(batch_minor_merge=True),
                )
            ]
            if p.x.shape[0] > 1 and h > 1
            else []
        ),
        *_swapped_projections(p, h, hkv, theta, style),
        *_fused_per_head_projections(p, h, hkv, theta, style),
        *_transposed_projections(p, h, hkv, theta, style),
        Variant(
            "knob:mask_missing",
            "no causal mask is applied",
            where="the causal mask of self-attention",
            fix="mask keys j > i",
            compute=m(mask=None),
        ),
        Variant(
            "knob:mask_alignment",
            "the causal mask excludes the diagonal",
            where="the causal mask of self-attention",
            fix="allow j <= i",
            compute=m(mask=_causal(t, t, shift=-1)),
        ),
        *(
            [
                Variant(
                    "knob:mask_alignment",
                    "the causal mask compares the RoPE positions (key j visible where positions[j] <= positions[i]) "
                    "instead of the tokens' order in the sequence, so with positions that are not increasing a query "
                    "sees later tokens and misses earlier ones",
                    where="what the causal mask of self-attention is built from",
                    fix="mask by the sequence index: key j visible to query i iff j <= i, whatever the positions",
                    compute=m(mask=p.positions[None, :].cpu() <= p.positions[:, None].cpu()),
                )
            ]
            if isinstance(p.positions, torch.Tensor)
            and p.positions.ndim == 1
            and bool((p.positions[1:] < p.positions[:-1]).any())
            else []
        ),
        Variant(
            "knob:reduction_dim",
            "the softmax runs over the queries",
            where="the dim of the attention softmax",
            fix="softmax over keys",
            compute=m(dim=-2),
        ),
    ]
    if window is not None:
        window_fix = "query i attends the keys j with i - W < j <= i (W keys, itself included)"
        out += [
            Variant(
                "knob:sliding_window",
                "the window is ignored: every query attends every earlier key",
                where="the window of multihead_self_attention",
                fix=window_fix,
                compute=m(mask=_causal(t, t)),
            ),
            *(
                Variant(
                    "knob:sliding_window",
                    f"the window is one key too {word} ({window + d} keys instead of {window})",
                    where="the window of multihead_self_attention",
                    fix=window_fix,
                    compute=m(mask=_windowed(t, window + d)),
                )
                for d, word in ((1, "wide"), (-1, "narrow"))
                if window + d >= 1
            ),
        ]
    if hkv not in (1, h):
        out.append(
            Variant(
                "knob:gqa_mapping",
                "query heads use the tiled key/value head (h % n_kv) instead of h // n_rep",
                where="the head repetition of k and v",
                fix="repeat_interleave over the head axis",
                compute=m(tiled=True),
            )
        )
    if theta is not None:
        other = "half" if style == "interleaved" else "interleaved"
        out += [
            Variant(
                "knob:rope_style",
                f"RoPE pairs channels in the {other} style instead of {style}",
                where="the RoPE pairing",
                fix=f"pair channels {style}",
                compute=m(style=other),
            ),
            Variant(
                "knob:rope_target",
                "RoPE is applied to the values too",
                where="where RoPE is applied",
                fix="rotate queries and keys only",
                compute=m(rope_values=True),
            ),
            Variant(
                "knob:rope_target",
                "RoPE is applied to the queries only",
                where="where RoPE is applied",
                fix="rotate queries and keys",
                compute=m(rope_q_only=True),
            ),
        ]
        if h > 1:  # one head: the flat vector is the head
            rope_fix = "split the heads first and rotate each head's d_head channels alike: pair i of every head turns "
            rope_fix += "at theta ** (-2i / d_head)"
            out += [
                Variant(
                    "knob:rope_base",
                    "RoPE's pairs are indexed over all heads' channels (the flat q/k vector: head_dim = i, not "
                    "i % d_head), so head h turns theta ** -h times as fast as head 0",
                    where="the RoPE frequencies of each head",
                    fix=rope_fix,
                    compute=m(rope_flat=dh),
                ),
                Variant(
                    "knob:rope_base",
                    "RoPE is applied before the head split, over each projection's channels (frequencies theta ** "
                    "(-2i / width) across the heads, width d_model for q)",
                    where="the RoPE frequencies of each head",
                    fix=rope_fix,
                    compute=m(rope_flat="own"),
                ),
            ]
        if p.positions is not None:
            out.append(
                Variant(
                    "knob:position_offset",
                    "the positions argument is ignored (arange(T) used)",
                    where="the positions passed to RoPE",
                    fix="use the given positions",
                    compute=m(positions=None),
                ),
            )
            out.append(
                Variant(
                    "knob:position_offset",
                    "the keys are rotated at arange(T), not at the given positions (which reach the queries' RoPE "
                    "only)",
                    where="the positions passed to the keys' RoPE",
                    fix="rotate the keys at the same positions as the queries",
                    compute=m(keys_from_zero=True),
                )
            )
        if not math.isclose(theta, 10000.0):
            out.append(
                Variant(
                    "knob:rope_theta",
                    f"theta = 10000 is used instead of {theta:g}",
                    where="the theta passed to RoPE",
                    fix="pass theta through",
                    compute=m(theta=10000.0),
                )
            )
    return m(), out


# ---------------------------------------------------------------------------------------------
# losses


def _ce(
    logits,
    targets,
    ignore_index=-100,
    *,
    count_ignored=False,
    reduction="mean",
    dim=-1,
    naive=None,
    row_means=False,
    log_of=None,
    max_kept=False,
):
    if log_of is not None:  # log(softmax(x)): the max is subtracted, but a probability that underflows gives -inf
        lp = torch.log(torch.softmax(logits.to(log_of), dim)).to(F64)
    elif max_kept:  # log-sum-exp of x - max, less the target's own logit x (not x - max): every row off by its max
        lp = torch.log_softmax(logits, dim) + logits.amax(dim, keepdim=True)
    elif naive is not None:
        x = logits.to(naive)
        lp = (x - torch.log(torch.exp(x).sum(dim, keepdim=True))).to(F64)
    else:
        lp = torch.log_softmax(logits, dim)
    valid = targets != ignore_index
    t = torch.where(valid, targets, torch.zeros_like(targets))
    if ((t < 0) | (t >= logits.shape[-1])).any():
        raise IndexError("target out of range")
    nll = torch.where(valid, -lp.gather(-1, t[..., None]).squeeze(-1), torch.zeros((), dtype=F64))
    if reduction == "sum":
        return nll.sum()
    if row_means:
        if targets.dim() < 2:
            raise ValueError("no rows")
        return (nll.sum(-1) / valid.sum(-1)).mean()
    return nll.sum() / (valid.numel() if count_ignored else valid.sum())


def _cross_entropy(args, kwargs, style):
    p = _bind("logits, targets, ignore_index=-100", args, kwargs)
    lg, tg, ig = p.logits, p.targets, int(p.ignore_index)
    c = lambda **kw: lambda: _ce(lg, tg, kw.pop("ignore_index", ig), **kw)
    where = "the reduction of cross_entropy"
    out = [
        Variant(
            "knob:ignore_index",
            "ignored targets are counted in the mean (sum / all targets)",
            where=where,
            fix="divide by the number of non-ignored targets",
            compute=c(count_ignored=True),
        ),
        Variant(
            "knob:loss_reduction",
            "the loss is summed instead of averaged",
            where=where,
            fix="average over the non-ignored targets",
            compute=c(reduction="sum"),
        ),
        Variant(
            "knob:loss_reduction",
            "the loss is the mean of per-row means instead of the mean over all targets",
            where=where,
            fix="sum the NLL over every non-ignored target, then divide by their number",
            compute=c(row_means=True),
        ),
        Variant(
            "knob:reduction_dim",
            "the log-softmax runs over the wrong axis (dim 0)",
            where="the dim of the log-softmax",
            fix="normalise over the vocabulary axis (dim=-1)",
            compute=c(dim=0),
        ),
    ]
    for dtype, label in ((F64, "float64"), (torch.float32, "float32")):
        out.append(
            Variant(
                "knob:max_subtraction",
                f"log-sum-exp is computed without subtracting the max ({label})",
                where="the log-softmax / log-sum-exp",
                fix="use torch.logsumexp or subtract the row max first",
                compute=c(naive=dtype),
            )
        )
        out.append(
            Variant(
                "knob:log_of_softmax",
                f"the log-probabilities are log(softmax(logits)) ({label}): the max is subtracted, but a "
                "probability that underflows to 0 gives log(0) = -inf",
                where="the log-softmax",
                fix="use torch.log_softmax (x - max - log(sum(exp(x - max)))), never log of a softmax",
                compute=c(log_of=dtype),
            )
        )
    out.append(
        Variant(
            "knob:max_subtraction",
            "the row max is subtracted inside the log-sum-exp but not from the target's logit: each target's loss is "
            "off by its row's max",
            where="the log-sum-exp and the target logit it is taken from",
            fix="logsumexp(x) - x[target], with the max subtracted from both or from neither (torch.logsumexp)",
            compute=c(max_kept=True),
        )
    )
    if ig != -100:
        out.append(
            Variant(
                "knob:ignore_index",
                f"the ignore_index argument ({ig}) is not honoured (-100 is used)",
                where="the ignore_index used by cross_entropy",
                fix="pass ignore_index through",
                compute=c(ignore_index=-100),
            )
        )
    return c(), out


def _lm_loss(args, kwargs, style):
    p = _bind("logits, ids", args, kwargs)
    lg, ids = p.logits, p.ids
    where = "the shift in lm_loss: cross_entropy(logits[:, :-1], ids[:, 1:])"
    fix = "score logits[:, :-1] against ids[:, 1:]"
    out = [
        Variant(
            "knob:label_shift",
            "labels are not shifted (logits at t scored against ids at t)",
            where=where,
            fix=fix,
            compute=lambda: _ce(lg, ids),
        ),
        Variant(
            "knob:label_shift",
            "labels are not shifted while the logits are sliced: logits[:, :-1] scored against ids[:, :-1] (each "
            "position against its own token, the last dropped)",
            where=where,
            fix=fix,
            compute=lambda: _ce(lg[:, :-1], ids[:, :-1]),
        ),
        Variant(
            "knob:label_shift",
            "labels are shifted twice (logits at t scored against ids at t+2)",
            where=where,
            fix=fix,
            compute=lambda: _ce(lg[:, :-2], ids[:, 2:]),
        ),
        Variant(
            "knob:label_shift",
            "the shift goes the wrong way (logits at t+1 scored against ids at t)",
            where=where,
            fix=fix,
            compute=lambda: _ce(lg[:, 1:], ids[:, :-1]),
        ),
        Variant(
            "knob:label_shift",
            "labels are rolled instead of sliced (the last position scored against the first id)",
            where=where,
            fix=fix,
            compute=lambda: _ce(lg, torch.roll(ids, -1, 1)),
        ),
        Variant(
            "knob:label_shift",
            "the shifted labels are padded at the end with 0 instead of the ignore index: the last position is "
            "scored against token 0",
            where=where,
            fix="pad the shifted labels with -100 (ignored), or slice: logits[:, :-1] against ids[:, 1:]",
            compute=lambda: _ce(lg, torch.cat((ids[:, 1:], torch.zeros_like(ids[:, :1])), dim=1)),
        ),
        Variant(
            "knob:loss_reduction",
            "the loss is summed instead of averaged",
            where="the reduction in lm_loss",
            fix="average over the predicted tokens",
            compute=lambda: _ce(lg[:, :-1], ids[:, 1:], reduction="sum"),
        ),
        Variant(
            "knob:loss_reduction",
            "the loss is the mean of per-sequence means",
            where="the reduction in lm_loss",
            fix="average over all predicted tokens",
            compute=lambda: _ce(lg[:, :-1], ids[:, 1:], row_means=True),
        ),
    ]
    return (lambda: _ce(lg[:, :-1], ids[:, 1:])), out


# ---------------------------------------------------------------------------------------------
# sampling


def _top_k_filter(z, k):
    if k is None or k >= z.shape[-1]:
        return z
    if k < 1:
        raise ValueError("k < 1")
    kth = torch.topk(z, k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth, -math.inf)


def _nucleus(probs, top_p, crossing="keep"):
    """Bool mask of the nucleus of ``probs`` (rows on the last axis). ``crossing``: ``"keep"`` (specified), ``"drop"``
    the crossing token, ``"extra"`` one more; ``"ascending"``: the specified rule (keep while the mass before is below
    top_p, the first kept) on an ascending sort; ``"hf_descending"``: Hugging Face's ascending-sort rule (remove where
    the cumulative mass is <= 1 - top_p, the last kept) on a descending sort. Both keep the least likely tokens."""
    if top_p is None:
        return torch.ones_like(probs, dtype=torch.bool)
    sp, order = torch.sort(probs, dim=-1, descending=crossing not in ("ascending", "vocabulary_mass_ascending"))
    cum = sp.cumsum(-1)
    before = cum - sp
    if crossing.startswith("vocabulary_mass"):  # the mass summed in vocabulary order, the cut laid on the sorted order
        cum = probs.cumsum(-1)
        before = cum - probs
        if crossing == "vocabulary_mass_ascending":  # the ascending rule: remove where the mass is <= 1 - top_p
            keep_sorted = ~(cum <= 1 - top_p + 16 * torch.finfo(F64).eps)
            keep_sorted[..., -1] = True
            return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        crossing = "keep"
    tol = 16 * torch.finfo(F64).eps
    if crossing == "hf_descending":
        keep_sorted = ~(cum <= 1 - top_p + tol)
        keep_sorted[..., -1] = True
        return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    if crossing in ("keep", "ascending"):
        keep_sorted = before < top_p - tol
    elif crossing == "drop":
        keep_sorted = cum <= top_p + tol
    else:  # one more than the nucleus
        inside = before < top_p - tol
        keep_sorted = inside | torch.cat((inside[..., :1], inside[..., :-1]), dim=-1)
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def _sampling(
    logits,
    temperature,
    top_k,
    top_p,
    *,
    temp="divide",
    order="specified",
    crossing="keep",
    k_delta=0,
    renorm=True,
    keep_least=False,
    fill=-math.inf,
    mask_gathered=None,
    mask_to_ascending=False,
):
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(F64)
    z = {
        "divide": lambda: logits / temperature,
        "multiply": lambda: logits * temperature,
        "ignore": lambda: logits,
        "twice": lambda: logits / temperature**2,
    }[temp]()
    k = None if top_k is None else int(top_k) + k_delta
    zk = _top_k_filter(z, k)
    if order == "k_excludes_p" and k is not None:  # an elif: top-p never runs where top-k is given
        top_p = None
    if order == "p_excludes_k" and top_p is not None:  # the other elif: top-k never runs where top-p is given
        zk = z
    if order == "p_before_temperature":
        keep = _nucleus(torch.softmax(_top_k_filter(logits, k), -1), top_p, crossing) & torch.isfinite(zk)
    elif order == "p_before_k":
        keep = _nucleus(torch.softmax(z, -1), top_p, crossing) & torch.isfinite(zk)
    elif order == "p_unnormalised":  # the nucleus cut on p ** (1 / T): log-probabilities divided, not renormalised
        keep = _nucleus(torch.softmax(_top_k_filter(logits, k), -1) ** (1 / temperature), top_p, crossing)
    elif order == "k_unrenormalised_ascending" and top_p is not None:
        # top-k's survivors keep the whole softmax's probabilities (mass S < 1), and the nucleus removes the tokens
        # whose ascending cumulative mass is <= 1 - top_p: the same as the specified cut at top_p - (1 - S)
        kept = torch.softmax(z, -1) * torch.isfinite(zk)
        keep = _nucleus(kept, top_p - (1 - kept.sum(-1, keepdim=True)), crossing)
    else:
        keep = _nucleus(torch.softmax(zk, -1), top_p, crossing)
    if keep_least and top_p is not None and top_p < 1:  # the kept minimum taken at the wrong end of the sort
        probs_all = torch.softmax(zk, -1)
        least = probs_all.masked_fill(~torch.isfinite(zk), math.inf).argmin(-1, keepdim=True)
        keep = keep.scatter(-1, least, True)
    if mask_gathered is not None:  # the keep mask, made in sorted order, put back with the permutation, not its inverse
        keep = _gathered_twice(keep, logits, mask_gathered)
    if mask_to_ascending:  # the keep mask made in descending order, scattered to the ids of an ascending sort
        made = keep.gather(-1, zk.argsort(dim=-1, descending=True, stable=True))
        keep = torch.zeros_like(keep).scatter(-1, zk.argsort(dim=-1, descending=False, stable=True), made)
    if fill != -math.inf:  # the filtered logits set to a finite value: they keep weight in the softmax
        return torch.softmax(torch.where(torch.isfinite(zk) & keep, z, torch.full_like(z, fill)), -1)
    if renorm == "unfiltered":  # the filters zero probabilities of the whole softmax, and nothing renormalises
        return torch.softmax(z, -1) * torch.isfinite(zk) * keep
    probs = torch.softmax(zk, -1) * keep
    return probs / probs.sum(-1, keepdim=True) if renorm else probs


def _gathered_twice(probs: torch.Tensor, logits: torch.Tensor, descending: bool) -> torch.Tensor:
    """``probs`` (or a keep mask; already in vocabulary order) taken into the logits' sorted order and then "unsorted"
    with the same permutation again: what code that restores the order with ``gather`` instead of ``scatter``
    returns."""
    idx = logits.argsort(dim=-1, descending=descending, stable=True)
    return probs.gather(-1, idx).gather(-1, idx)


def _sampling_probs(args, kwargs, style):
    p = _bind("logits, temperature=1.0, top_k=None, top_p=None", args, kwargs)
    lg, t, k, tp = p.logits, float(p.temperature), p.top_k, p.top_p
    tp = None if tp is None else float(tp)
    s = lambda **kw: lambda: _sampling(lg, t, k, tp, **kw)
    order_where = "the order of sampling_probs: divide by temperature, top-k, top-p on the scaled distribution"
    out = [
        Variant(
            "knob:temperature",
            "the logits are multiplied by the temperature instead of divided",
            where="the temperature step",
            fix="divide the logits by temperature",
            compute=s(temp="multiply"),
        ),
        Variant(
            "knob:temperature",
            "the temperature is applied twice (logits / temperature**2)",
            where="the temperature step",
            fix="divide by temperature once",
            compute=s(temp="twice"),
        ),
        Variant(
            "knob:temperature",
            "the temperature is ignored",
            where="the temperature step",
            fix="divide the logits by temperature",
            compute=s(temp="ignore"),
        ),
        Variant(
            "knob:renormalisation",
            "the kept probabilities are not renormalised",
            where="the end of sampling_probs",
            fix="divide by the kept mass",
            compute=s(renorm=False),
        ),
        Variant(
            "knob:renormalisation",
            "the filters zero the probabilities of the whole (temperature-scaled) softmax and the kept ones are not "
            "renormalised: each row sums to the mass the filters kept",
            where="the end of sampling_probs (a filter that zeroes probabilities instead of masking logits)",
            fix="divide by the kept mass (or mask the logits to -inf and take the softmax after filtering)",
            compute=s(renorm="unfiltered"),
        ),
    ]
    if t == 0:  # greedy written as the sampled path: logits / 0 is inf wherever a logit is positive
        out.append(
            Variant(
                "knob:temperature",
                "temperature 0 divides the logits by zero: every positive logit becomes inf, so the argmax lands on "
                "the first token whose logit is positive, not on the largest",
                where="the temperature step at temperature 0",
                fix="at temperature 0 take the argmax of the logits themselves (divide only for temperature > 0)",
                compute=lambda: torch.nn.functional.one_hot((lg / 0.0).argmax(-1), lg.shape[-1]).to(F64),
            )
        )
    if k is None:  # a library's default top-k applied where none is given (llama.cpp's 40, transformers' 50)
        out += [
            Variant(
                "knob:top_k",
                f"a top-k of {default} is applied where top_k is None (a library default, as llama.cpp's 40 or "
                "transformers' 50): only the most probable tokens keep probability",
                where="the default of top_k",
                fix="top_k=None keeps every token: apply top-k only when it is given",
                compute=lambda default=default: _sampling(lg, t, default, tp),
            )
            for default in (40, 50)
            if default < lg.shape[-1]
        ]
    if (k is not None and k < lg.shape[-1]) or (tp is not None and tp < 1):
        out.append(
            Variant(
                "knob:sampling_order",
                "the filtered logits are set to 0 instead of -inf (masked_fill(..., 0)): every removed token keeps "
                "exp(0) weight in the softmax",
                where="the top-k / top-p filters' fill value",
                fix='masked_fill(removed, float("-inf")): a removed token gets probability 0',
                compute=s(fill=0.0),
            )
        )
    skipped = [
        ("top-p", "top_p < 1", "top_k", lambda: _sampling(lg, t, k, None), tp is not None and tp < 1),
        ("top-k", "top_k is given", "top_p", lambda: _sampling(lg, t, None, tp), k is not None and k < lg.shape[-1]),
    ]
    out += [
        Variant(
            "knob:sampling_order",
            f"the {which} filter is not applied (skipped where it is given alone, or behind a condition that needs "
            "another option too)",
            where=order_where,
            fix=f"apply {which} whenever {when}, with or without {other}",
            compute=compute,
        )
        for which, when, other, compute, given in skipped
        if given
    ]
    if tp is not None:
        out += [
            Variant(
                "knob:sampling_order",
                "the nucleus is taken from the distribution before temperature",
                where=order_where,
                fix="apply top-p to softmax(logits / temperature)",
                compute=s(order="p_before_temperature"),
            ),
            Variant(
                "knob:sampling_order",
                "the nucleus is cut on p ** (1 / temperature) without renormalising it (log-probabilities divided by "
                "the temperature, not log-softmaxed again), so its mass is not that of the scaled distribution",
                where=order_where,
                fix="apply top-p to softmax(logits / temperature), a distribution that sums to 1",
                compute=s(order="p_unnormalised") if t not in (0, 1) else (lambda: None),
            ),
            Variant(
                "knob:sampling_order",
                "top-p is applied before top-k (on the unfiltered distribution)",
                where=order_where,
                fix="apply top-k first, then top-p on the top-k distribution",
                compute=s(order="p_before_k"),
            ),
            Variant(
                "knob:top_p_boundary",
                "the nucleus drops the token that crosses top_p (keeps cumsum <= top_p)",
                where="the top-p cut",
                fix="keep tokens while the mass before them is < top_p",
                compute=s(crossing="drop"),
            ),
            Variant(
                "knob:top_p_complement",
                f"the nucleus is cut at 1 - top_p = {1 - tp:.4g}: an ascending sort's threshold (remove the tokens "
                "whose cumulative mass is <= 1 - top_p) written as top_p",
                where="the top-p cut",
                fix="keep the smallest set of most probable tokens whose mass reaches top_p (sorted ascending: remove "
                "the tokens whose cumulative mass is <= 1 - top_p)",
                compute=lambda: _sampling(lg, t, k, 1 - tp) if 0 < tp < 1 else None,
            ),
            *(
                Variant(
                    "knob:top_p_direction",
                    "the nucleus keeps the least likely tokens: the probabilities are sorted in the other direction "
                    "than the top-p rule assumes (ascending for 'keep while the mass before is below top_p', "
                    "descending for 'remove where the cumulative mass is <= 1 - top_p'), so the cut starts at the "
                    "wrong end",
                    where="the sort of the top-p cut and the rule applied to it",
                    fix="keep the smallest set of most probable tokens whose mass reaches top_p: sort descending and "
                    "keep while the mass before is < top_p (or sort ascending and remove where cumsum <= 1 - top_p)",
                    compute=s(crossing=crossing),
                )
                for crossing in ("ascending", "hf_descending")
            ),
            Variant(
                "knob:sampling_order",
                "the nucleus's cumulative mass is summed over the probabilities in vocabulary order (not sorted) while "
                "the cut is laid on the sorted order: the wrong number of tokens is kept",
                where="the top-p cut: the probabilities its cumulative sum runs over",
                fix="sort the probabilities (descending), take the cumulative sum of the sorted ones, cut there and "
                "scatter the mask back",
                compute=s(crossing="vocabulary_mass"),
            ),
            Variant(
                "knob:sampling_order",
                "the nucleus's cumulative mass is summed over the probabilities in vocabulary order (not sorted) while "
                "the cut is laid on the ascending sort (remove where the mass is <= 1 - top_p): the wrong tokens are "
                "kept",
                where="the top-p cut: the probabilities its cumulative sum runs over",
                fix="take the cumulative sum of the sorted probabilities (the same sort the cut is laid on)",
                compute=s(crossing="vocabulary_mass_ascending"),
            ),
            Variant(
                "knob:top_p_boundary",
                "the nucleus keeps one token more than the smallest set reaching top_p",
                where="the top-p cut",
                fix="keep tokens while the mass before them is < top_p",
                compute=s(crossing="extra"),
            ),
            Variant(
                "knob:top_p_boundary",
                "the nucleus also keeps the least probable token: the 'keep at least one token' rule applied at the "
                "wrong end of the sorted order",
                where="the top-p cut's minimum of kept tokens",
                fix="always keep the most probable token (the first of a descending sort, the last of an ascending)",
                compute=s(keep_least=True),
            ),
        ]
        if k is not None:
            out += [
                Variant(
                    "knob:sampling_order",
                    "top-p runs on top-k's log-probabilities without renormalising them (the whole softmax's, summing "
                    "to the mass top-k kept), with the ascending rule (remove the tokens whose cumulative mass is <= 1 "
                    "- top_p): the mass top-k removed is missing from the cut, so too few tokens are kept",
                    where=order_where,
                    fix="renormalise after top-k (log_softmax again, or mask logits and take the softmax) before "
                    "top-p measures the nucleus",
                    compute=s(order="k_unrenormalised_ascending"),
                ),
                Variant(
                    "knob:sampling_order",
                    "top-p is ignored when top-k is given (the filters as if / elif: only top-k runs)",
                    where=order_where,
                    fix="apply top-k, then top-p on what top-k kept: both filters when both are given",
                    compute=s(order="k_excludes_p"),
                ),
                Variant(
                    "knob:sampling_order",
                    "top-k is ignored when top-p is given (the filters as if / elif: only top-p runs)",
                    where=order_where,
                    fix="apply top-k, then top-p on what top-k kept: both filters when both are given",
                    compute=s(order="p_excludes_k"),
                ),
            ]
    if (k is not None or tp is not None) and t > 0:
        out += [
            Variant(
                "knob:unsort",
                f"the filtered probabilities land on the wrong token ids: after filtering in {order} sorted order they "
                "are put back by applying the sort's permutation again (gather) instead of its inverse (scatter)",
                where="putting the filtered values back in vocabulary order",
                fix="scatter the sorted values back to the sort's indices: out.scatter(-1, sorted_idx, sorted_values)",
                compute=lambda descending=descending: _gathered_twice(_sampling(lg, t, k, tp), lg, descending),
            )
            for order, descending in (("descending", True), ("ascending", False))
        ]
    if tp is not None and tp < 1 and t > 0:
        out += [
            Variant(
                "knob:unsort",
                f"the top-p keep mask lands on the wrong token ids: made in {order} sorted order, it is put back by "
                "applying the sort's permutation again (gather) instead of its inverse (scatter), so other tokens "
                "than the nucleus are kept",
                where="putting the top-p mask back in vocabulary order",
                fix="scatter the sorted mask back to the sort's indices: mask.scatter(-1, sorted_idx, sorted_mask)",
                compute=lambda descending=descending: _sampling(lg, t, k, tp, mask_gathered=descending),
            )
            for order, descending in (("descending", True), ("ascending", False))
        ] + [
            Variant(
                "knob:unsort",
                "the top-p keep mask, made on the probabilities sorted in descending order, is scattered back to the "
                "token ids of an ascending sort (an argsort left at its ascending default): the nucleus's decisions "
                "land on the least probable tokens",
                where="the order of the indices the top-p mask is scattered back with",
                fix="scatter the mask with the indices of the same (descending) sort it was made in",
                compute=s(mask_to_ascending=True),
            )
        ]
    if k is not None:
        out += [
            Variant(
                "knob:top_k",
                "top-k keeps k+1 tokens",
                where="the top-k cut",
                fix="keep exactly the k largest logits",
                compute=s(k_delta=1),
            ),
            Variant(
                "knob:top_k",
                "top-k keeps k-1 tokens",
                where="the top-k cut",
                fix="keep exactly the k largest logits",
                compute=s(k_delta=-1),
            ),
        ]
        v = lg.shape[-1]
        if 0 < int(k) < v:  # k = 1 keeps every token, as top-k skipped: both fit there, and the line says both
            out.append(
                Variant(
                    "knob:top_k",
                    f"top-k's threshold is the k-th smallest logit, not the k-th largest (kthvalue(k) or "
                    f"topk(k, largest=False)): it keeps V - k + 1 = {v - int(k) + 1} tokens, not k",
                    where="the top-k cut",
                    fix="threshold at the k-th largest logit: logits.topk(k).values[..., -1:] (or kthvalue(V - k + 1))",
                    compute=lambda: _sampling(lg, t, v - int(k) + 1, tp),
                )
            )
    return s(), out


# ---------------------------------------------------------------------------------------------
# mixture of experts (protocol v2, amendment 28)


def _moe(x, router, w_gate, w_up, w_down, top_k, *, over="experts", renorm=True, k_delta=0):
    """Mixtral's MoE MLP with one routing knob: the softmax ``over`` the experts or over every token (the rows
    flattened), the chosen weights renormalised or not, ``top_k + k_delta`` experts per token."""
    logits = x @ router.T  # [..., E]
    if over == "tokens":
        probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=0).reshape(logits.shape)
    else:
        probs = torch.softmax(logits, dim=-1)
    k = min(max(int(top_k) + k_delta, 1), probs.shape[-1])
    top, chosen = torch.topk(probs, k, dim=-1)
    if renorm:
        top = top / top.sum(dim=-1, keepdim=True)
    gates = torch.zeros_like(probs).scatter(-1, chosen, top)
    out = torch.zeros_like(x)
    for e in range(router.shape[0]):
        h = _silu(x @ w_gate[e].T) * (x @ w_up[e].T)
        out = out + gates[..., e : e + 1] * (h @ w_down[e].T)
    return out


def _moe_mlp(args, kwargs, style):
    p = _bind("x, router, w_gate, w_up, w_down, *, top_k", args, kwargs)
    m = lambda **kw: lambda: _moe(p.x, p.router, p.w_gate, p.w_up, p.w_down, p.top_k, **kw)
    where = "the routing of moe_mlp: softmax(x @ router.T) over the experts, the top_k kept and renormalised"
    fix = "softmax over the experts (the last axis) per token, keep the top_k, divide them by their sum"
    out = [
        Variant(
            "knob:moe",
            "the router's softmax runs over the tokens (every row of the input, flattened) instead of over the experts",
            where=where,
            fix=fix,
            compute=m(over="tokens"),
        ),
        Variant(
            "knob:moe",
            "the chosen experts keep their raw softmax probabilities: not renormalised to sum 1",
            where=where,
            fix=fix,
            compute=m(renorm=False),
        ),
        Variant("knob:moe", "each token keeps top_k + 1 experts", where=where, fix=fix, compute=m(k_delta=1)),
        Variant("knob:moe", "each token keeps top_k - 1 experts", where=where, fix=fix, compute=m(k_delta=-1)),
        Variant(
            "knob:moe",
            "top_k is ignored: every expert is mixed by its softmax probability",
            where=where,
            fix=fix,
            compute=m(k_delta=10**6),
        ),
    ]
    return m(), out


# attention: "rows with no allowed key are unspecified" (NaN in these computations)
# NAN_UNSPECIFIED (imported): the entries with ``nan_rows_unspecified``

# name -> its knob family: each entry's ``knob_family`` names a function of this module
FAMILIES: dict[str, Callable] = {name: globals()[fn] for name, fn in KNOB_FAMILIES.items()}


# ---------------------------------------------------------------------------------------------
# the search


def _as_compared(x, bool_like: bool) -> np.ndarray | None:
    arr = as_array(x)
    if arr is None:
        return None
    if bool_like and arr.dtype != np.bool_:
        arr = as_float(arr)
        arr = (arr == 0) if np.isin(arr, (0.0, -np.inf)).all() and np.isneginf(arr).any() else (arr != 0)
    return as_float(arr)


def variants(name: str, args, kwargs, *, rope_style: str = "interleaved"):
    """(specified computation, [Variant]) for protocol function ``name``; None when no family exists."""
    family = FAMILIES.get(name)
    if family is None:
        return None
    with torch.no_grad():
        return family(tuple(args), dict(kwargs or {}), rope_style)


@contextmanager
def _one_thread():
    """The tensors are tiny: with several intra-op threads, OpenMP start-up and spinning cost 10-30x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # variants on odd inputs (x.T of a vector, overflow) may warn
            yield
    finally:
        torch.set_num_threads(before)


def knob_causes(
    name: str,
    args,
    kwargs,
    actual,
    *,
    rope_style: str = "interleaved",
    atol: float,
    rtol: float,
    second=None,
    reduced=None,
):
    """Causes of the form "the specified ``name`` with one knob changed reproduces ``actual``".

    ``second()``: ``(args, actual)`` of the same call on a second input (``mixed_input``), or ``None``: a knob setting
    is kept only where it reproduces that output too, or where the second input does not show the difference (one
    that fits a single input by coincidence is no cause); ``reduced()``: ``(kwargs, actual)`` of the same call with
    one option dropped, each, and a setting is kept only where it explains each of those outputs too (or they show
    no difference); ambiguity is judged among the settings kept."""
    try:
        with _one_thread():
            return _knob_causes(name, args, kwargs, actual, rope_style, atol, rtol, second, reduced) or []
    except Exception:  # arguments the families cannot handle: no diagnosis rather than a broken report
        if cause_module.STRICT:
            raise
        return []


def knob_codes(name: str, args, kwargs, actual, *, rope_style: str = "interleaved", atol: float, rtol: float):
    """The codes of the knob settings that reproduce ``actual`` on these inputs (``knob_causes``), or ``None`` where
    the specified output itself fits ``actual`` (these inputs do not show the difference) or the search cannot run."""
    try:
        with _one_thread():
            found = _knob_causes(name, args, kwargs, actual, rope_style, atol, rtol)
    except Exception:  # noqa: BLE001 - arguments the families cannot handle: nothing to confirm with
        return None
    return None if found is None else {c.code for c in found}


def mixed_input(args) -> tuple | None:
    """A second input for the same call: every floating tensor mixed with itself shifted by one along its last axis
    (``0.7 x + 0.3 roll(x)``), other values of the same shapes, scales and dtypes; ``None`` without one."""
    floating = [isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() > 0 for a in args]
    if not any(floating):
        return None
    return tuple(0.7 * a + 0.3 * a.roll(1, dims=-1) if f else a for a, f in zip(args, floating, strict=True))


def _knob_causes(name, args, kwargs, actual, rope_style, atol, rtol, second=None, reduced=None):
    """The fitting knob causes (``[]``: none fits), or ``None`` where the specified output fits ``actual`` or the
    search cannot run."""
    try:
        found = variants(name, args, kwargs, rope_style=rope_style)
    except TypeError:  # the arguments do not bind to the protocol signature
        return None
    except (RuntimeError, ValueError, IndexError):  # arguments of shapes the specified computation rejects
        return None
    if found is None:
        return None
    specified, candidates = found
    try:
        with torch.no_grad():
            spec_out = specified()
    except (RuntimeError, ValueError, IndexError, TypeError):
        return None
    bool_like = isinstance(spec_out, torch.Tensor) and spec_out.dtype == torch.bool
    expected = _as_compared(spec_out, False)
    a = _as_compared(actual, bool_like)
    if a is None or expected is None or a.shape != expected.shape:
        return None
    if bool_like:
        atol = rtol = 0.0
    care = ~np.isnan(expected)  # rows the protocol leaves unspecified (every key masked)
    if fits(expected, a, atol, rtol, care):
        return None
    matches, tried = [], 0
    for v in candidates:
        try:
            with torch.no_grad(), np.errstate(all="ignore"):
                out = _as_compared(v.compute(), False)
        except (RuntimeError, ValueError, IndexError, TypeError, ZeroDivisionError):
            continue
        if out is None or out.shape != a.shape:
            continue
        care_v = care
        if name in NAN_UNSPECIFIED:  # rows the variant's own mask leaves without keys are unspecified too
            care_v = care & ~np.isnan(out)
            if care_v.sum() < care.sum() / 2:
                continue
        if fits(out, expected, atol, rtol, care_v):
            continue  # indistinguishable from the specified computation on these inputs
        tried += 1
        if fits(out, a, atol, rtol, care_v):
            matches.append(v)

    def confirmed_on(call_args, call_kwargs, got):  # the matches that explain this call too (all: it shows nothing)
        codes = knob_codes(name, call_args, call_kwargs, got, rope_style=rope_style, atol=atol, rtol=rtol)
        return matches if codes is None else [v for v in matches if v.code in codes]

    again = second() if matches and second is not None else None
    if again is not None:
        matches = confirmed_on(again[0], kwargs, again[1])
    for fewer, got in reduced() if matches and reduced is not None else ():
        matches = confirmed_on(args, fewer, got)
    if not matches:
        return []
    by_code: dict[str, list[Variant]] = {}
    for v in matches:
        by_code.setdefault(v.code, []).append(v)
    ambiguous = len(by_code) > 1
    causes = []
    tol = f"atol {atol:.0e} + rtol {rtol:.0e}"
    for code, vs in by_code.items():
        said = list(dict.fromkeys(v.summary for v in vs))  # settings of one knob said alike are one line
        summary = said[0] + ("; equally: " + "; ".join(said[1:]) if len(said) > 1 else "")
        evidence = (
            f"{name} as specified but with this knob changed reproduces actual within {tol} at every entry; "
            f"{len(matches)} of the {tried} knob settings that change the output on these inputs fit"
        )
        if ambiguous:
            others = [x.summary for c, xs in by_code.items() if c != code for x in xs]
            summary = f"ambiguous ({len(matches)} knob settings fit): {summary}"
            evidence += f"; also fitting: {'; '.join(others)}"
            conf = AMBIGUOUS
        else:
            conf = EXACT if len(vs) == 1 else EXACT_SHARED
        causes.append(Cause(code, summary, vs[0].where, vs[0].fix, evidence, conf, source="knob"))
    return causes
