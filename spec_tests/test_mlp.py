"""The two feed-forward blocks: SwiGLU (llama) and the GELU MLP (gpt2)."""

import pytest
import torch

from . import inputs
from .inputs import S

pytestmark = pytest.mark.component("mlp")

DTYPES = [torch.float64, torch.float32]


@pytest.mark.bug_class("swiglu")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_swiglu(spec, dtype):
    """swiglu = (silu(x @ W_gate.T) * (x @ W_up.T)) @ W_down.T; only the gate goes through SiLU (course notes: SwiGLU)."""
    x = inputs.randn(S.B, S.T, S.d_model, seed=21, dtype=dtype, device=spec.device)
    w_gate = inputs.fan_in_weight(S.D_FF, S.d_model, seed=22, dtype=dtype, device=spec.device)
    w_up = inputs.fan_in_weight(S.D_FF, S.d_model, seed=23, dtype=dtype, device=spec.device)
    w_down = inputs.fan_in_weight(S.d_model, S.D_FF, seed=24, dtype=dtype, device=spec.device)
    spec.check(
        lambda m, *a: m.swiglu(*a),
        x,
        w_gate,
        w_up,
        w_down,
        behaviour="swiglu(x, w_gate, w_up, w_down)",
        component="swiglu",
        kind="matmul",
    )


@pytest.mark.bug_class("gelu")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_gelu_mlp(spec, dtype):
    """gelu_mlp = gelu_tanh(x @ W_fc.T + b_fc) @ W_proj.T + b_proj with the tanh-approximate GELU (protocol: gelu_mlp)."""
    x = inputs.randn(S.B, S.T, S.d_model, seed=25, dtype=dtype, device=spec.device)
    w_fc = inputs.fan_in_weight(S.D_FF, S.d_model, seed=26, dtype=dtype, device=spec.device) * 2
    b_fc = inputs.randn(S.D_FF, seed=27, dtype=dtype, device=spec.device)
    w_proj = inputs.fan_in_weight(S.d_model, S.D_FF, seed=28, dtype=dtype, device=spec.device)
    b_proj = inputs.randn(S.d_model, seed=29, dtype=dtype, device=spec.device)
    spec.check(
        lambda m, *a: m.gelu_mlp(*a),
        x,
        w_fc,
        b_fc,
        w_proj,
        b_proj,
        behaviour="gelu_mlp(x, w_fc, b_fc, w_proj, b_proj), tanh GELU",
        component="gelu_mlp",
        kind="matmul",
    )
