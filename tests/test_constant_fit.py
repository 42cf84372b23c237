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
    return fitted_constant(name, None, args, kwargs or {}, out, tolerance("attention"), "half")


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


def rope_with(table):
    """A RoPE (half style) whose per-pair angle at position p is ``table(p, i)``, written out apart from the suite."""

    def rope(x, positions, theta=10000.0):
        half = x.shape[-1] // 2
        i = torch.arange(half, dtype=torch.float64)
        angle = table(positions.to(torch.float64)[..., None], i, half, theta)
        cos, sin = torch.cos(angle), torch.sin(angle)
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    return rope


def rope_lines(rope):
    g = torch.Generator().manual_seed(1)
    x, positions = torch.randn(2, 3, 7, 10, generator=g, dtype=torch.float64), torch.arange(4, 11)
    return fitted_constant("rope", rope, (x, positions), {}, rope(x, positions), tolerance("positions"), "half")


def test_rope_s_rotation_is_measured_and_said():
    """A linspace grid of exponents (the speedrun's) and a table of (sin, cos) where (cos, sin) belongs (held-out
    batches 32 and 33): each pair's unit vector turned at positions 0 to 2 gives the rotation, and it is said."""
    linspace = rope_with(lambda p, i, half, theta: p * theta ** (-i / (half - 1)))
    lines, codes = rope_lines(linspace)
    assert "theta ** (-0.25 i) (a linspace(0, 1, d_head / 2) grid of exponents)" in lines[0], lines
    assert codes == ["knob:rope_base"]
    swapped = rope_with(lambda p, i, half, theta: math.pi / 2 - p * theta ** (-2 * i / (2 * half)))
    lines, codes = rope_lines(swapped)
    assert "the table holds sin where cos belongs" in lines[0] and codes == ["knob:rope_table"], lines
    backwards = rope_with(lambda p, i, half, theta: -p * theta ** (-2 * i / (2 * half)))
    lines, codes = rope_lines(backwards)
    assert "turns every pair the other way" in lines[0] and codes == ["sign"], lines


def test_a_right_rope_or_one_that_is_no_rotation_gets_no_measured_line():
    """The control: the specified rotation says nothing, also with float32 frequencies (held-out batch 26: the
    precision tests say that); a RoPE that scales its pairs (no rotation) says nothing."""
    right = rope_with(lambda p, i, half, theta: p * theta ** (-2 * i / (2 * half)))
    assert rope_lines(right) == ([], [])
    rounded = rope_with(lambda p, i, half, theta: p * (theta ** (-2 * i / (2 * half))).float().double())
    assert rope_lines(rounded) == ([], [])
    assert rope_lines(lambda x, positions, theta=10000.0: 1.5 * right(x, positions, theta)) == ([], [])
