"""Which constants an activation computes with: the implementation's activation measured alone and fitted.

A wrong constant inside an activation (the tanh GELU's ``sqrt(2/pi)`` written ``sqrt(2)/pi``, its cubic
coefficient mistyped, SiLU's sigmoid scaled as in the sigmoid GELU approximation ``x * sigmoid(1.702 x)``) is no
knob setting the suite could list. It is measured instead: the implementation's own function is called once on a
ramp of inputs with identity weights, so its output is the activation itself (``gelu_mlp(x, I, 0, I, 0) = act(x)``,
``swiglu(x, I, I, I) = silu(x) * x``), and the activation's family is fitted to it:

- the tanh GELU, ``0.5 x (1 + tanh(a (x + b x**3)))``: ``atanh(2 y / x - 1) = a x + a b x**3``, least squares;
- SiLU, ``x sigmoid(beta x)``: ``logit(y / x) = beta x``, least squares.

A fit is said only where it holds on every ramp point and where the fitted activation, put in the check's own
weights and biases, reproduces the failing output at the check's tolerance: the evidence is the failing call's
own output, so the line is confident. Constants within 1e-3 (relative) of the specified ones say nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...protocol import ACTIVATION_FIT
from ..judging.compare import mismatch
from .knobs import _bind

RAMP = torch.cat([torch.linspace(-2.5, -0.2, 24), torch.linspace(0.2, 2.5, 24)]).double()
SAME = 1e-3  # fitted constants this close (relative) to the specified ones are the specified ones
FIT = 1e-6  # the largest error of the fitted activation on the ramp, relative to its largest value


def _gelu_tanh(x, a, b):
    return 0.5 * x * (1 + torch.tanh(a * (x + b * x**3)))


def _silu(x, beta):
    return x * torch.sigmoid(beta * x)


def _least_squares(columns: list[torch.Tensor], target: torch.Tensor) -> list[float] | None:
    matrix = torch.stack(columns, dim=-1)
    solution = torch.linalg.lstsq(matrix, target[:, None]).solution[:, 0]
    return solution.tolist() if torch.isfinite(solution).all() else None


def _fit_gelu_tanh(x, y) -> tuple[float, float] | None:
    t = 2 * y / x - 1
    if not (t.abs() < 1 - 1e-9).all():
        return None
    fitted = _least_squares([x, x**3], torch.atanh(t))
    if fitted is None or fitted[0] == 0:
        return None
    a, ab = fitted
    return a, ab / a


def _fit_silu(x, y) -> tuple[float] | None:
    s = y / x
    if not ((s > 1e-12) & (s < 1 - 1e-12)).all():
        return None
    fitted = _least_squares([x], torch.log(s / (1 - s)))
    return None if fitted is None else (fitted[0],)


def _eye(n, like):
    return torch.eye(n, dtype=like.dtype, device=like.device)


# name -> (the signature, the probe's arguments from a ramp, the activation from the probe's output, the family,
# its fit, the specified constants with their names, how the check's output follows from an activation)
def _gelu_mlp_output(p, act):
    return act(p.x @ p.w_fc.T + p.b_fc) @ p.w_proj.T + p.b_proj


def _swiglu_output(p, act):
    return (act(p.x @ p.w_gate.T) * (p.x @ p.w_up.T)) @ p.w_down.T


def _silu_output(p, act):
    return act(p.x)


FAMILIES = {  # keyed by ``Entry.activation_fit`` (spec_tests/protocol/entries.py)
    "tanh_gelu": dict(
        signature="x, w_fc, b_fc, w_proj, b_proj",
        probe=lambda x: (x[None], _eye(len(x), x), torch.zeros_like(x), _eye(len(x), x), torch.zeros_like(x)),
        activation=lambda x, out: out[0],
        form="0.5·x·(1 + tanh(a·(x + b·x³)))",
        where="the GELU of gelu_mlp",
        model=_gelu_tanh,
        fit=_fit_gelu_tanh,
        specified=(("a", math.sqrt(2 / math.pi), "sqrt(2/π) ≈ 0.7979"), ("b", 0.044715, "0.044715")),
        output=_gelu_mlp_output,
    ),
    "gated_silu": dict(
        signature="x, w_gate, w_up, w_down",
        probe=lambda x: (x[None], _eye(len(x), x), _eye(len(x), x), _eye(len(x), x)),
        activation=lambda x, out: out[0] / x,
        form="x·sigmoid(β·x)",
        where="the SiLU of swiglu's gate",
        model=_silu,
        fit=_fit_silu,
        specified=(("β", 1.0, "1"),),
        output=_swiglu_output,
    ),
    "plain_silu": dict(
        signature="x",
        probe=lambda x: (x,),
        activation=lambda x, out: out,
        form="x·sigmoid(β·x)",
        where="silu",
        model=_silu,
        fit=_fit_silu,
        specified=(("β", 1.0, "1"),),
        output=_silu_output,
    ),
}


def fitted_activation(name: str, run: Callable, args64: tuple, kwargs: dict, actual, tol) -> tuple[list, list]:
    """``(lines, codes)``: the constants the implementation's activation computes with, where they differ from the
    specified ones and explain the failing output. ``run(*args)`` calls the implementation's ``name``."""
    family = FAMILIES.get(ACTIVATION_FIT.get(name))
    if family is None or not isinstance(actual, torch.Tensor):
        return [], []
    try:
        bound = _bind(family["signature"], args64, kwargs)
        like = bound.x
        x = RAMP.to(device=like.device)
        out = run(*family["probe"](x))
        y = family["activation"](x, torch.as_tensor(out).detach().double().to(x.device))
    except Exception:  # noqa: BLE001 - a probe the implementation cannot run says nothing
        return [], []
    if tuple(y.shape) != tuple(x.shape) or not torch.isfinite(y).all():
        return [], []
    constants = family["fit"](x, y)
    if constants is None:
        return [], []
    model = lambda v: family["model"](v, *constants)
    if (model(x) - y).abs().max() > FIT * max(1.0, y.abs().max().item()):
        return [], []
    specified = family["specified"]
    if all(abs(c - s) <= SAME * abs(s) for c, (_, s, _) in zip(constants, specified, strict=True)):
        return [], []
    explained = family["output"](bound, model)
    if mismatch(actual.double().to(explained.device), explained, tol) is not None:
        return [], []
    measured = ", ".join(f"{label} = {c:.4g}" for c, (label, _, _) in zip(constants, specified, strict=True))
    wanted = ", ".join(f"{label} = {text}" for label, _, text in specified)
    line = (
        f"likely cause: the activation computes {family['form']} with {measured} instead of {wanted}. Look at the "
        f"constants of {family['where']}; fix: {wanted} (evidence: {name} called on a ramp of inputs with identity "
        f"weights, its activation fitted, and the fit reproduces the failing output)"
    )
    return [line], ["knob:activation"]
