"""Linear, embedding, softmax and SiLU: the building blocks, each checked on its own."""

import pytest
import torch

from .harness.plugin.markers import judges
from .inputs import S

pytestmark = pytest.mark.component("primitives")


@judges("linear")
@pytest.mark.bug_class("layout")
@pytest.mark.parametrize("d_out", [S.D_FF, S.d_model], ids=["non-square", "square"])
def test_linear_layout(spec, dtype, d_out):
    """linear computes x @ W.T with W stored [out_features, in_features] (protocol: Conventions, linear)."""
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=1, dtype=dtype)
    w = spec.inputs.weight(d_out, S.d_model, seed=2, dtype=dtype)
    spec.call("linear", x, w, behaviour="linear(x, W) = x @ W.T, W is [out, in]", kind="matmul")


@judges("linear")
@pytest.mark.bug_class("layout")
def test_linear_bias(spec, dtype):
    """linear adds the bias: x @ W.T + b (protocol: linear)."""
    spec.impl.require_capability("linear_bias")
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=1, dtype=dtype)
    w = spec.inputs.weight(S.D_FF, S.d_model, seed=2, dtype=dtype)
    b = spec.inputs.randn(S.D_FF, seed=3, dtype=dtype)
    spec.call("linear", x, w, b, behaviour="linear(x, W, b) = x @ W.T + b", kind="matmul")


@judges("embedding")
def test_embedding_lookup(spec):
    """embedding returns row ids[...] of the table for ids of any shape (protocol: Component functions)."""
    table = spec.inputs.randn(S.V, S.d_model, seed=4)
    ids = spec.inputs.token_ids(S.B, S.T, seed=5)
    spec.call("embedding", ids, table, behaviour="embedding(ids, W)[b, t] = W[ids[b, t]]")
    spec.call("embedding", ids[0], table, behaviour="embedding accepts 1-D ids", label="1d")


@judges("softmax")
@pytest.mark.bug_class("softmax_dim")
@pytest.mark.parametrize("dim", [-1, 0, 1], ids=["last", "first", "middle"])
def test_softmax_over_given_dim(spec, dim):
    """softmax normalises over the dim it is given, and only that one (course notes: softmax over the wrong
    dimension)."""
    x = spec.inputs.randn(S.B, S.T, S.V, seed=6, scale=3.0)
    spec.call("softmax", x, dim=dim, behaviour=f"softmax(x, dim={dim}) sums to 1 along dim {dim}", axes="b t v")


@judges("softmax")
@pytest.mark.bug_class("stability")
def test_softmax_is_stable_for_large_inputs(spec, dtype):
    """softmax of inputs near ±1e4 is finite and right (symptoms table: softmax gives inf -> subtract the row max)."""
    x = spec.inputs.randn(S.B, S.V, seed=7, dtype=dtype) * 1e4
    x[:, 0] = 1e4  # one dominant entry per row
    spec.call("softmax", x, dim=-1, behaviour="softmax(x, dim=-1) for logits near ±1e4")


@judges("silu")
def test_silu(spec, dtype):
    """silu(x) = x * sigmoid(x), elementwise, including large |x| (protocol: Component functions)."""
    x = spec.inputs.randn(S.B, S.T, S.D_FF, seed=8, scale=4.0, dtype=dtype)
    x[0, 0, :4] = torch.tensor([-80.0, -30.0, 30.0, 80.0], dtype=dtype)
    spec.call("silu", x, behaviour="silu(x) = x * sigmoid(x)")
    scalar = spec.inputs.randn(1, seed=9, scale=4.0, dtype=dtype)[0]  # elementwise: a 0-d tensor is an x too
    spec.call("silu", scalar, label="0-d", behaviour="silu of a 0-d tensor")
