"""Linear, embedding, softmax and SiLU: the building blocks, each checked on its own."""

import pytest
import torch

from . import inputs
from .assertions import require
from .inputs import S

pytestmark = pytest.mark.component("primitives")

DTYPES = [torch.float64, torch.float32]


@pytest.mark.bug_class("layout")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("d_out", [S.D_FF, S.d_model], ids=["non-square", "square"])
def test_linear_layout(spec, dtype, d_out):
    """linear computes x @ W.T + b with W stored [out_features, in_features] (protocol: Conventions)."""
    x = inputs.randn(S.B, S.T, S.d_model, seed=1, dtype=dtype, device=spec.device)
    w = inputs.weight(d_out, S.d_model, seed=2, dtype=dtype, device=spec.device)
    b = inputs.randn(d_out, seed=3, dtype=dtype, device=spec.device)
    spec.check(
        lambda m, x, w, b: m.linear(x, w, b),
        x,
        w,
        b,
        behaviour="linear(x, W, b) = x @ W.T + b, W is [out, in]",
        component="linear",
        kind="matmul",
    )
    spec.check(
        lambda m, x, w: m.linear(x, w),
        x,
        w,
        behaviour="linear(x, W) without bias = x @ W.T",
        component="linear",
        kind="matmul",
        label="no_bias",
    )


def test_embedding_lookup(spec):
    """embedding returns row ids[...] of the table for ids of any shape (protocol: Component functions)."""
    table = inputs.randn(S.V, S.d_model, seed=4, device=spec.device)
    ids = inputs.token_ids(S.B, S.T, seed=5, device=spec.device)
    spec.check(
        lambda m, ids, w: m.embedding(ids, w),
        ids,
        table,
        behaviour="embedding(ids, W)[b, t] = W[ids[b, t]]",
        component="embedding",
    )
    flat = ids[0]
    spec.check(
        lambda m, ids, w: m.embedding(ids, w),
        flat,
        table,
        behaviour="embedding accepts 1-D ids",
        component="embedding",
        label="1d",
    )


@pytest.mark.bug_class("softmax_dim")
@pytest.mark.parametrize("dim", [-1, 0, 1], ids=["last", "first", "middle"])
def test_softmax_over_given_dim(spec, dim):
    """softmax normalises over the dim it is given, and only that one (course notes: softmax over the wrong dimension)."""
    x = inputs.randn(S.B, S.T, S.V, seed=6, scale=3.0, device=spec.device)
    spec.check(
        lambda m, x: m.softmax(x, dim=dim),
        x,
        behaviour=f"softmax(x, dim={dim}) sums to 1 along dim {dim}",
        component="softmax",
    )


@pytest.mark.bug_class("stability")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_softmax_is_stable_for_large_inputs(spec, dtype):
    """softmax of inputs near ±1e4 is finite and exact (symptoms table: softmax gives inf -> subtract the row max)."""
    x = inputs.randn(S.B, S.V, seed=7, dtype=dtype, device=spec.device) * 1e4
    x[:, 0] = 1e4  # one dominant entry per row
    out = spec.check(
        lambda m, x: m.softmax(x, dim=-1), x, behaviour="softmax is finite for logits near ±1e4", component="softmax"
    )
    require(
        bool(torch.isfinite(out).all()),
        behaviour="softmax is finite for logits near ±1e4",
        found="non-finite output",
        component="softmax",
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_silu(spec, dtype):
    """silu(x) = x * sigmoid(x), elementwise, including large |x| (protocol: Component functions)."""
    x = inputs.randn(S.B, S.T, S.D_FF, seed=8, scale=4.0, dtype=dtype, device=spec.device)
    x[0, 0, :4] = torch.tensor([-80.0, -30.0, 30.0, 80.0], dtype=dtype)
    spec.check(lambda m, x: m.silu(x), x, behaviour="silu(x) = x * sigmoid(x)", component="silu")
