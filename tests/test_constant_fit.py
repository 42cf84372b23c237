"""A constant of a failing computation fitted to its output (``spec_tests/harness/diagnosis/constant_fit.py``): an
attention scale written into the code is named with its value; the specified scale, or a wrong output of another
kind, gets no such line."""

import math

import torch

from spec_tests.harness.diagnosis.constant_fit import fitted_constant
from spec_tests.harness.judging.tolerances import tolerance


def attention(q, k, v, mask=None, *, scale=None, masked_value=-math.inf):
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        s = s.masked_fill(~mask, masked_value)
    return torch.softmax(s, -1) @ v


def inputs():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(2, 3, 7, 10), r(2, 3, 7, 10), r(2, 3, 7, 10), torch.ones(7, 7, dtype=torch.bool).tril()


def lines_for(name, out, args, kwargs=None):
    return fitted_constant(name, args, kwargs or {}, out, tolerance("attention"), "half")


def test_an_attention_scale_written_into_the_code_is_measured():
    """The speedrun's fixed 0.12 and a head size of 64 assumed (1/8): the line gives the scale computed with, and a
    whole-number form where there is one."""
    args = inputs()
    lines, codes = lines_for("scaled_dot_product_attention", attention(*args, scale=0.12), args)
    assert len(lines) == 1 and "by 0.12 (1/8.333) instead of 1/sqrt(d_head) = 1/sqrt(10)" in lines[0], lines
    assert codes == ["knob:scale_constant"]
    lines, _ = lines_for("scaled_dot_product_attention", attention(*args, scale=0.125), args)
    assert "by 0.125 = 1/sqrt(64) instead" in lines[0], lines


def test_the_specified_scale_or_another_mistake_gets_no_fitted_line():
    """The control: the specified scale says nothing; masked scores set to a finite -1e4 beside the right scale (no
    scale reproduces it) say nothing either; a name with no constant to fit is left alone."""
    args = inputs()
    assert lines_for("scaled_dot_product_attention", attention(*args), args) == ([], [])
    wrong = attention(*args, masked_value=-1.0)
    assert lines_for("scaled_dot_product_attention", wrong, args) == ([], [])
    assert lines_for("softmax", wrong, args) == ([], [])
