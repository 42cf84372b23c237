"""The two feed-forward blocks: SwiGLU (llama) and the GELU MLP (gpt2)."""

import pytest

from . import round_trip
from .harness.plugin.markers import judges
from .inputs import S

pytestmark = pytest.mark.component("mlp")


@judges("swiglu", explained_by=round_trip.LOADING)
@pytest.mark.bug_class("swiglu")
def test_swiglu(spec, dtype):
    """swiglu = (silu(x @ W_gate.T) * (x @ W_up.T)) @ W_down.T; only the gate goes through SiLU (course notes:
    SwiGLU)."""
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=21, dtype=dtype)
    w_gate = spec.inputs.fan_in_weight(S.D_FF, S.d_model, seed=22, dtype=dtype)
    w_up = spec.inputs.fan_in_weight(S.D_FF, S.d_model, seed=23, dtype=dtype)
    w_down = spec.inputs.fan_in_weight(S.d_model, S.D_FF, seed=24, dtype=dtype)
    spec.call(
        "swiglu",
        x,
        w_gate,
        w_up,
        w_down,
        behaviour="swiglu(x, w_gate, w_up, w_down)",
        kind="matmul",
        rebase=round_trip.for_call(spec, "swiglu", (x, w_gate, w_up, w_down), {}),
    )


@judges("gelu_mlp", explained_by=round_trip.LOADING)
@pytest.mark.bug_class("gelu")
def test_gelu_mlp(spec, dtype):
    """gelu_mlp = gelu_tanh(x @ W_fc.T + b_fc) @ W_proj.T + b_proj with the tanh-approximate GELU (protocol:
    gelu_mlp)."""
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=25, dtype=dtype)
    w_fc = spec.inputs.fan_in_weight(S.D_FF, S.d_model, seed=26, dtype=dtype) * 2
    b_fc = spec.inputs.randn(S.D_FF, seed=27, dtype=dtype)
    w_proj = spec.inputs.fan_in_weight(S.d_model, S.D_FF, seed=28, dtype=dtype)
    b_proj = spec.inputs.randn(S.d_model, seed=29, dtype=dtype)
    spec.call(
        "gelu_mlp",
        x,
        w_fc,
        b_fc,
        w_proj,
        b_proj,
        behaviour="gelu_mlp(x, w_fc, b_fc, w_proj, b_proj), tanh GELU",
        kind="matmul",
        rebase=round_trip.for_call(spec, "gelu_mlp", (x, w_fc, b_fc, w_proj, b_proj), {}),
    )
