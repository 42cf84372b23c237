"""An activation's constants measured on the implementation (``spec_tests/harness/diagnosis/activation_fit.py``): a
wrong constant is named with the value the implementation computes with; a right activation, or a wrong one of
another form, gets no such line."""

import math

import torch

from spec_tests.harness.diagnosis.activation_fit import fitted_activation
from spec_tests.harness.judging.tolerances import tolerance


def gelu_tanh(x, a=math.sqrt(2 / math.pi), b=0.044715):
    return 0.5 * x * (1 + torch.tanh(a * (x + b * x**3)))


def gelu_mlp_with(act):
    return lambda x, w_fc, b_fc, w_proj, b_proj: act(x @ w_fc.T + b_fc) @ w_proj.T + b_proj


def mlp_inputs():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(2, 5, 8), r(12, 8) / 2, r(12), r(8, 12) / 3, r(8)


def lines_for(name, fn, args):
    return fitted_activation(name, fn, args, {}, fn(*args), tolerance("matmul"))


def test_a_misplaced_root_in_the_tanh_gelu_is_measured():
    """``sqrt(2)/pi`` for ``sqrt(2/pi)`` (a held-out bug no knob named): the line gives the constant computed with."""
    lines, codes = lines_for("gelu_mlp", gelu_mlp_with(lambda h: gelu_tanh(h, a=math.sqrt(2) / math.pi)), mlp_inputs())
    assert len(lines) == 1 and "a = 0.4502, b = 0.04471 instead of a = sqrt(2/π) ≈ 0.7979" in lines[0], lines
    assert codes == ["knob:activation"]


def test_a_right_gelu_or_one_of_another_form_gets_no_fitted_line():
    """The control: the specified activation says nothing; the exact (erf) GELU fits no tanh form (its knob names
    it); a wrong output the fit does not reproduce (a bias dropped beside a right GELU) says nothing either."""
    args = mlp_inputs()
    assert lines_for("gelu_mlp", gelu_mlp_with(gelu_tanh), args) == ([], [])
    erf = lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    assert lines_for("gelu_mlp", gelu_mlp_with(erf), args) == ([], [])
    right = gelu_mlp_with(gelu_tanh)
    no_bias = lambda x, w_fc, b_fc, w_proj, b_proj: right(x, w_fc, b_fc, w_proj, b_proj) - b_proj
    wrong_a = gelu_mlp_with(lambda h: gelu_tanh(h, a=0.5))
    assert fitted_activation("gelu_mlp", wrong_a, args, {}, no_bias(*args), tolerance("matmul")) == ([], [])


def test_a_scaled_sigmoid_in_silu_and_swiglu_is_measured():
    """``x * sigmoid(1.702 x)`` (the sigmoid approximation of GELU) where SiLU is specified, alone and as swiglu's
    gate."""
    act = lambda v: v * torch.sigmoid(1.702 * v)
    x = torch.randn(3, 7, dtype=torch.float64) * 3
    lines, _ = lines_for("silu", act, (x,))
    assert len(lines) == 1 and "β = 1.702 instead of β = 1" in lines[0], lines
    swiglu = lambda x, wg, wu, wd: (act(x @ wg.T) * (x @ wu.T)) @ wd.T
    g = torch.Generator().manual_seed(1)
    args = tuple(torch.randn(*s, generator=g, dtype=torch.float64) for s in ((2, 4, 6), (10, 6), (10, 6), (6, 10)))
    lines, _ = lines_for("swiglu", swiglu, args)
    assert len(lines) == 1 and "the SiLU of swiglu's gate" in lines[0], lines
    assert lines_for("silu", lambda v: v * torch.sigmoid(v), (x,)) == ([], [])
