"""Rotary position embeddings (in the style the implementation declares) and the sinusoidal table."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .harness.diagnosis.knobs import rope_with_tables
from .harness.diagnosis.variant import Variant
from .harness.plugin.markers import judges
from .inputs import S
from .strategies import seeds

pytestmark = pytest.mark.component("positions")


def rope_pairs(x: torch.Tensor, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two channels of every rotated pair in ``style``: ``[..., d/2]`` each."""
    half = x.shape[-1] // 2
    return (x[..., 0::2], x[..., 1::2]) if style == "interleaved" else (x[..., :half], x[..., half:])


@judges("rope")
@pytest.mark.bug_class("rope")
def test_rope(spec, dtype):
    """rope rotates channel pairs of the declared ROPE_STYLE by position * theta**(-2i/d_head), positions from 5
    (course notes: RoPE, base 10000)."""
    x = spec.inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=41, dtype=dtype)
    pos = spec.inputs.positions(S.T)
    spec.call("rope", x, pos, behaviour="rope(x [B, H, T, d_head], positions [T])", kind="positions", axes="b h t d")


@judges("rope")
@pytest.mark.bug_class("rope")
def test_rope_honours_theta(spec):
    """rope(x, positions, theta) uses the given theta (symptoms table: raise the RoPE base for longer context)."""
    spec.impl.require_capability("rope_theta")
    x = spec.inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=41)
    pos = spec.inputs.positions(S.T)
    spec.call("rope", x, pos, theta=500.0, behaviour="rope(x, positions, theta=500)", kind="positions", axes="b h t d")


@judges("rope")
@pytest.mark.bug_class("rope")
def test_rope_positions_scattered_and_broadcast(spec):
    """rope accepts non-contiguous positions [T] and per-sequence positions broadcastable to x.shape[:-1] (protocol:
    rope)."""
    x = spec.inputs.per_head(S.B, S.H, S.T, S.D_HEAD, seed=42)
    scattered = spec.inputs.scattered_positions(S.T, seed=43)
    spec.call("rope", x, scattered, behaviour="rope at scattered positions", kind="positions", axes="b h t d")
    per_row = torch.stack([spec.inputs.scattered_positions(S.T, seed=44 + b) for b in range(S.B)])[:, None, :]
    spec.call(
        "rope",
        x,
        per_row,
        behaviour="rope with positions [B, 1, T] (a different offset per sequence)",
        kind="positions",
        label="broadcast",
        axes="b h t d",
    )
    spec.call(
        "rope",
        x[0, 0],
        scattered,
        behaviour="rope of a single [T, d_head] matrix",
        kind="positions",
        label="2d",
        axes="t d",
    )
    # any non-negative positions, past a 4096- or 8192-row table: compared as each vector's norm (RoPE rotates), which
    # float32 tables keep there while their angles drift past the positions tolerance (tools/measure_tolerances.py)
    spec.check(
        lambda m, x, p: m.rope(x, p).norm(dim=-1),
        x,
        scattered + 9000,
        subject="rope",
        kind="pointwise",
        label="far",
        axes="b h t",
        behaviour="rope at positions past 9000 runs and keeps each vector's norm (a rotation)",
    )


@judges("rope")
@pytest.mark.bug_class("rope")
def test_rope_position_zero_is_identity(spec):
    """At position 0 every angle is 0, so rope leaves x unchanged (course notes: RoPE rotates by position)."""
    x = spec.inputs.per_head(1, S.H, 1, S.D_HEAD, seed=45)
    out = spec.impl.rope(x, torch.zeros(1, dtype=torch.long, device=spec.device))
    spec.close(out, x, behaviour="rope at position 0 is the identity", kind="positions")


@judges("rope")
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
    other = "half" if style == "interleaved" else "interleaved"

    def tables_of_the_other_layout():  # the angles measured where the cos/sin tables are laid out for the other style
        mixed = rope_with_tables(x.cpu(), torch.ones(1, dtype=torch.float64), theta, style, other)
        a, b = rope_pairs(mixed[:, 0], style)
        return torch.atan2(b.diagonal(), a.diagonal()).to(spec.device)

    spec.close(
        measured,
        expected,
        kind="positions",
        behaviour=f"angle of pair i at position 1 is theta**(-2i/d_head) ({style} pairs)",
        variants=[
            Variant(
                "knob:rope_style",
                f"the cos/sin tables are laid out for {other} pairs while the rotation pairs channels {style}: each "
                "channel turns at another pair's frequency",
                "lay the cos/sin tables out as the rotation pairs the channels",
                tables_of_the_other_layout,
            )
        ],
    )


@judges("rope")
@pytest.mark.bug_class("rope")
@given(seed=seeds, shift=st.integers(-40, 40))
def test_rope_scores_depend_only_on_relative_position(spec, seed, shift):
    """<rope(q, m), rope(k, n)> depends only on m - n: shifting both positions leaves scores unchanged (course notes:
    RoPE intuition)."""
    q = spec.inputs.per_head(1, 2, S.T, S.D_HEAD, seed=seed)
    k = spec.inputs.per_head(1, 2, S.T, S.D_HEAD, seed=seed + 1)
    pos = spec.inputs.scattered_positions(S.T, seed=seed, high=200) + 50
    scores = spec.impl.rope(q, pos) @ spec.impl.rope(k, pos).transpose(-1, -2)
    shifted = spec.impl.rope(q, pos + shift) @ spec.impl.rope(k, pos + shift).transpose(-1, -2)
    spec.close(
        shifted, scores, kind="positions", behaviour=f"q·k after RoPE is unchanged when both positions shift by {shift}"
    )


@judges("rope")
@pytest.mark.bug_class("rope")
@given(seed=seeds)
def test_rope_preserves_norms(spec, seed):
    """RoPE is a rotation: every pair keeps its length, so each vector keeps its norm (course notes: RoPE rotates)."""
    x = spec.inputs.per_head(2, 3, S.T, S.D_HEAD, seed=seed)
    pos = spec.inputs.scattered_positions(S.T, seed=seed + 1)
    out = spec.impl.rope(x, pos)
    style = spec.impl.rope_style
    pair_norm = lambda t: torch.hypot(*rope_pairs(t, style))
    spec.close(pair_norm(out), pair_norm(x), kind="positions", behaviour=f"each {style} pair keeps its length")


@judges("rope")
@pytest.mark.bug_class("validation")
def test_rope_rejects_odd_head_dim(spec):
    """rope of an odd d_head raises ValueError (protocol: rope)."""
    x = spec.inputs.per_head(1, 1, 3, S.D_HEAD + 1, seed=46)
    spec.raises(
        ValueError,
        lambda: spec.impl.rope(x, torch.arange(3, device=spec.device)),
        behaviour=f"rope of odd d_head={S.D_HEAD + 1} raises ValueError",
        mention=(str(S.D_HEAD + 1),),
    )


@judges("sinusoidal_positions")
@pytest.mark.bug_class("sinusoidal")
@pytest.mark.parametrize("d_model", [S.d_model, 7], ids=["even", "odd"])
def test_sinusoidal_table(spec, d_model):
    """pe[p, 2i] = sin(p / 10000**(2i/d)), pe[p, 2i+1] = cos(same) (course notes: fill sinusoidal table)."""
    n = 37
    table = spec.call(
        "sinusoidal_positions",
        n,
        d_model,
        behaviour=f"sinusoidal_positions({n}, {d_model})",
        kind="positions",
        axes="p d",
    )
    spec.require(
        math.isclose(float(table[0, 1]), 1.0),
        behaviour="pe[0, 1] = cos(0) = 1",
        found=f"pe[0, 1] = {float(table[0, 1])}",
    )
