"""RMSNorm and LayerNorm, each on its own."""

import pytest
import torch

from . import inputs
from .assertions import require
from .inputs import S

pytestmark = pytest.mark.component("norms")

DTYPES = [torch.float64, torch.float32]


@pytest.mark.bug_class("rmsnorm")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("scale", [1.0, 3e-3], ids=["unit", "small"])
def test_rmsnorm(spec, dtype, scale):
    """rmsnorm = x / sqrt(mean(x**2) + eps) * weight, eps inside the root (course notes: RMSNorm).

    Small inputs (rms ~ 3e-3, so mean(x**2) ~ eps) make eps placement and value visible.
    """
    x = inputs.randn(S.B, S.T, S.d_model, seed=11, scale=scale, dtype=dtype, device=spec.device)
    w = inputs.norm_weight(S.d_model, seed=12, dtype=dtype, device=spec.device)
    spec.check(
        lambda m, x, w: m.rmsnorm(x, w),
        x,
        w,
        behaviour="rmsnorm(x, w) with default eps=1e-5",
        component="rmsnorm",
        kind="matmul",
    )
    spec.check(
        lambda m, x, w: m.rmsnorm(x, w, eps=1e-3),
        x,
        w,
        behaviour="rmsnorm honours the eps argument",
        component="rmsnorm",
        kind="matmul",
        label="eps",
    )


@pytest.mark.bug_class("layernorm")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("scale", [1.0, 3e-3], ids=["unit", "small"])
def test_layernorm(spec, dtype, scale):
    """layernorm = (x - mean) / sqrt(biased var + eps) * weight + bias, as F.layer_norm (protocol: Component functions)."""
    x = inputs.randn(S.B, S.T, S.d_model, seed=13, scale=scale, dtype=dtype, device=spec.device) + 2 * scale
    w = inputs.norm_weight(S.d_model, seed=14, dtype=dtype, device=spec.device)
    b = inputs.randn(S.d_model, seed=15, dtype=dtype, device=spec.device)
    spec.check(
        lambda m, x, w, b: m.layernorm(x, w, b),
        x,
        w,
        b,
        behaviour="layernorm(x, w, b) with eps=1e-5",
        component="layernorm",
        kind="matmul",
    )
    spec.check(
        lambda m, x, w, b: m.layernorm(x, w, b, eps=1e-3),
        x,
        w,
        b,
        behaviour="layernorm honours the eps argument",
        component="layernorm",
        kind="matmul",
        label="eps",
    )


@pytest.mark.bug_class("precision")
@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_norm_statistics_in_at_least_float32(spec, name):
    """Norms compute their statistics in at least float32: float16 inputs near 300 square past float16's max (protocol: rmsnorm)."""
    x = (inputs.randn(S.B, S.d_model, seed=16, device=spec.device) * 300.0).to(torch.float16)
    w = inputs.norm_weight(S.d_model, seed=17, device=spec.device).to(torch.float16)
    b = torch.zeros(S.d_model, dtype=torch.float16, device=spec.device)
    args = (x, w) if name == "rmsnorm" else (x, w, b)
    out = getattr(spec.impl, name)(*args)
    expected = spec.expected(lambda m, *a: getattr(m, name)(*a), *args)
    behaviour = f"{name} of float16 inputs is finite and accurate to float16 rounding"
    require(
        bool(torch.isfinite(out).all()),
        behaviour=behaviour,
        component=name,
        found=f"{int((~torch.isfinite(out)).sum())} non-finite outputs: the squares overflowed float16",
    )
    err = ((out.double() - expected).abs() / (1 + expected.abs())).max().item()
    # float16 keeps 11 significant bits: output rounding alone is 2**-11 = 4.9e-4 relative.
    require(
        err < 4e-3, behaviour=behaviour, component=name, found=f"relative error {err:.3g} > 4e-3 (8x float16 rounding)"
    )
