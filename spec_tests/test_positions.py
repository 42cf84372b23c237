"""Rotary position embeddings (in the style the implementation declares) and the sinusoidal table."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import inputs, models
from .assertions import assert_close, require, require_value_error
from .inputs import S
from .strategies import seeds
from .tolerances import EXACT

pytestmark = pytest.mark.component("positions")

DTYPES = [torch.float64, torch.float32]


def rope_pairs(x: torch.Tensor, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two channels of every rotated pair in ``style``: ``[..., d/2]`` each."""
    half = x.shape[-1] // 2
    return (x[..., 0::2], x[..., 1::2]) if style == "interleaved" else (x[..., :half], x[..., half:])


@pytest.mark.bug_class("rope")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_rope_exact(spec, dtype):
    """rope rotates channel pairs of the declared ROPE_STYLE by position * theta**(-2i/d_head), positions from 5, honouring theta (course notes: RoPE, base 10000; symptoms table: raise the RoPE base for longer context)."""
    x = inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=41, dtype=dtype, device=spec.device)
    pos = inputs.positions(S.T, device=spec.device)
    spec.check(
        lambda m, x, p: m.rope(x, p), x, pos, behaviour="rope(x [B, H, T, d_head], positions [T])", component="rope"
    )
    spec.check(
        lambda m, x, p: m.rope(x, p, theta=500.0),
        x,
        pos,
        behaviour="rope honours theta",
        component="rope",
        label="theta",
    )


@pytest.mark.bug_class("rope")
def test_rope_positions_scattered_and_broadcast(spec):
    """rope accepts non-contiguous positions [T] and per-sequence positions broadcastable to x.shape[:-1] (protocol: rope)."""
    x = inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=42, device=spec.device)
    scattered = inputs.scattered_positions(S.T, seed=43, device=spec.device)
    spec.check(lambda m, x, p: m.rope(x, p), x, scattered, behaviour="rope at scattered positions", component="rope")
    per_row = torch.stack([inputs.scattered_positions(S.T, seed=44 + b) for b in range(S.B)])[:, None, :]
    spec.check(
        lambda m, x, p: m.rope(x, p),
        x,
        per_row.to(spec.device),
        behaviour="rope with positions [B, 1, T] (a different offset per sequence)",
        component="rope",
        label="broadcast",
    )
    flat = x[0, 0]  # [T, d_head] with no leading axes
    spec.check(
        lambda m, x, p: m.rope(x, p),
        flat,
        scattered,
        behaviour="rope of a single [T, d_head] matrix",
        component="rope",
        label="2d",
    )


@pytest.mark.bug_class("rope")
def test_rope_position_zero_is_identity(spec):
    """At position 0 every angle is 0, so rope leaves x unchanged (course notes: RoPE rotates by position)."""
    x = inputs.per_head(1, S.H, 1, S.D_HEAD, seed=45, device=spec.device)
    out = spec.impl.rope(x, torch.zeros(1, dtype=torch.long, device=spec.device))
    assert_close(out, x, behaviour="rope at position 0 is the identity", tol=EXACT, component="rope")


@pytest.mark.bug_class("rope_frequency")
def test_rope_frequencies(spec):
    """Pair i turns by theta**(-2i/d_head) radians per position, in the declared style (protocol: RoPE)."""
    d, theta = 16, 10000.0
    style = spec.impl.rope_style
    x = torch.zeros(d // 2, 1, d, dtype=torch.float64, device=spec.device)  # row i: unit vector on pair i
    first_channel = torch.arange(0, d, 2) if style == "interleaved" else torch.arange(d // 2)
    x[torch.arange(d // 2), 0, first_channel] = 1.0
    out = spec.impl.rope(x, torch.ones(1, dtype=torch.long, device=spec.device), theta)
    a, b = rope_pairs(out[:, 0], style)
    measured = torch.atan2(b.diagonal(), a.diagonal())
    expected = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=spec.device) / d)
    assert_close(
        measured,
        expected,
        tol=EXACT,
        component="rope",
        behaviour=f"angle of pair i at position 1 is theta**(-2i/d_head) ({style} pairs)",
    )


@pytest.mark.bug_class("rope")
@given(seed=seeds, shift=st.integers(-40, 40))
def test_rope_scores_depend_only_on_relative_position(spec, seed, shift):
    """<rope(q, m), rope(k, n)> depends only on m - n: shifting both positions leaves scores unchanged (course notes: RoPE intuition)."""
    q = inputs.per_head(1, 2, S.T, S.D_HEAD, seed=seed, device=spec.device)
    k = inputs.per_head(1, 2, S.T, S.D_HEAD, seed=seed + 1, device=spec.device)
    pos = inputs.scattered_positions(S.T, seed=seed, high=200, device=spec.device) + 50
    scores = spec.impl.rope(q, pos) @ spec.impl.rope(k, pos).transpose(-1, -2)
    shifted = spec.impl.rope(q, pos + shift) @ spec.impl.rope(k, pos + shift).transpose(-1, -2)
    assert_close(
        shifted,
        scores,
        tol=EXACT,
        component="rope",
        behaviour=f"q·k after RoPE is unchanged when both positions shift by {shift}",
    )


@given(seed=seeds)
def test_rope_preserves_norms(spec, seed):
    """RoPE is a rotation: every pair keeps its length, so each vector keeps its norm (course notes: RoPE rotates)."""
    x = inputs.per_head(2, 3, S.T, S.D_HEAD, seed=seed, device=spec.device)
    pos = inputs.scattered_positions(S.T, seed=seed + 1, device=spec.device)
    out = spec.impl.rope(x, pos)
    style = spec.impl.rope_style
    pair_norm = lambda t: torch.hypot(*rope_pairs(t, style))  # noqa: E731
    assert_close(
        pair_norm(out),
        pair_norm(x),
        tol=EXACT,
        component="rope",
        behaviour=f"each {style} pair keeps its length under RoPE",
    )


@pytest.mark.bug_class("validation")
def test_rope_rejects_odd_head_dim(spec):
    """rope of an odd d_head raises ValueError (protocol: rope)."""
    x = inputs.per_head(1, 1, 3, S.D_HEAD + 1, seed=46, device=spec.device)
    require_value_error(
        lambda: spec.impl.rope(x, torch.arange(3, device=spec.device)),
        component="rope",
        behaviour=f"rope of odd d_head={S.D_HEAD + 1} raises ValueError",
    )


@pytest.mark.bug_class("sinusoidal")
@pytest.mark.parametrize("d_model", [S.d_model, 7], ids=["even", "odd"])
def test_sinusoidal_table(spec, d_model):
    """pe[p, 2i] = sin(p / 10000**(2i/d)), pe[p, 2i+1] = cos(same) (course notes: fill sinusoidal table)."""
    n = 37
    # The protocol leaves the table's dtype open: under float64 as the default dtype, a table in
    # float64 is held to 1e-10; one that stays float32 to float32 rounding of values in [-1, 1] at
    # arguments up to 36 rad (2**-24 * 36 ~ 2e-6; x8 = 2e-5).
    float32_table = type(EXACT)(2e-5, 0.0, "float32 sin/cos of arguments up to 36 rad", "float32 table")
    with models.default_dtype(torch.float64):
        table = spec.impl.sinusoidal_positions(n, d_model)
        spec.check(
            lambda m, n, d: m.sinusoidal_positions(n, d),
            n,
            d_model,
            component="sinusoidal_positions",
            tol=EXACT if table.dtype == torch.float64 else float32_table,
            behaviour=f"sinusoidal_positions({n}, {d_model})",
        )
    require(
        math.isclose(float(table[0, 1]), 1.0),
        behaviour="pe[0, 1] = cos(0) = 1",
        component="sinusoidal_positions",
        found=f"pe[0, 1] = {float(table[0, 1])}",
    )
