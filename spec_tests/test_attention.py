"""Masks, grouped-query head sharing, scaled dot-product attention, flash attention and
multi-head self-attention, each on reference inputs."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import inputs
from .assertions import assert_close, require
from .inputs import S
from .strategies import attention_shapes, seeds
from .tolerances import BIT_IDENTICAL, tolerance

pytestmark = pytest.mark.component("attention")

DTYPES = [torch.float64, torch.float32]


def qkv(b, h, h_kv, t_q, t_k, d, *, seed, dtype=torch.float64, device="cpu"):
    q = inputs.per_head(b, h, t_q, d, seed=seed, dtype=dtype, device=device)
    k = inputs.per_head(b, h_kv, t_k, d, seed=seed + 1, dtype=dtype, device=device)
    v = inputs.per_head(b, h_kv, t_k, d, seed=seed + 2, dtype=dtype, device=device)
    return q, k, v


@pytest.mark.bug_class("causal_mask")
@pytest.mark.parametrize("t_q,t_k", [(S.T, S.T), (4, S.T), (1, S.T), (S.T, S.T + 6)])
def test_causal_mask_bottom_right(spec, t_q, t_k):
    """causal_mask(t_q, t_k) is bool [t_q, t_k], True where j <= i + (t_k - t_q) (protocol: Conventions, bottom-right aligned)."""
    mask = spec.impl.causal_mask(t_q, t_k)
    require(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
        component="causal_mask",
        behaviour="causal_mask returns a bool tensor (True = may attend)",
        found=f"got {getattr(mask, 'dtype', type(mask).__name__)}",
    )
    spec.check(
        lambda m, a, b: m.causal_mask(a, b, device=spec.device),
        t_q,
        t_k,
        component="causal_mask",
        behaviour=f"causal_mask({t_q}, {t_k}): query i sees key j iff j <= i + {t_k - t_q}",
    )


@pytest.mark.bug_class("gqa")
@pytest.mark.parametrize("n_rep", [S.n_rep, 1])
def test_repeat_kv_interleaves(spec, n_rep):
    """repeat_kv gives head h the kv head h // n_rep (repeat_interleave, not tile) (course notes: GQA head repetition wrong)."""
    x = inputs.per_head(S.B, S.H_KV, S.T, S.D_HEAD, seed=51, device=spec.device)
    spec.check(
        lambda m, x: m.repeat_kv(x, n_rep),
        x,
        component="repeat_kv",
        behaviour=f"repeat_kv(x [B, {S.H_KV}, T, d], {n_rep}): head h is kv head h // {n_rep}",
    )


@pytest.mark.bug_class("attention_scale", "softmax_dim", "mask_broadcast")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_sdpa_matches_reference(spec, dtype):
    """Attention is softmax over keys of q k^T / sqrt(d_head), masked, times v (course notes: attention equation; why divide by sqrt(d_k); symptoms table: learning stalls, scores not scaled)."""
    q, k, v = qkv(S.B, S.H, S.H, S.T, S.T, S.D_HEAD, seed=52, dtype=dtype, device=spec.device)
    mask = torch.ones(S.T, S.T, dtype=torch.bool).tril().to(spec.device)
    spec.check(
        lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v),
        q,
        k,
        v,
        kind="attention",
        behaviour="unmasked attention: softmax(q k^T / sqrt(d_head), over keys) v",
        component="scaled_dot_product_attention",
    )
    spec.check(
        lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
        q,
        k,
        v,
        mask,
        kind="attention",
        label="causal",
        behaviour="causal attention with a [T, T] bool mask",
        component="scaled_dot_product_attention",
    )


@pytest.mark.bug_class("mask_broadcast")
def test_sdpa_mask_broadcast(spec):
    """A mask broadcast over batch and heads masks keys of each query row; a [B, 1, Tq, Tk] padding mask differs per sequence (course notes: mask broadcast shape wrong; protocol: scaled_dot_product_attention)."""
    t_q, t_k = 5, S.T
    q, k, v = qkv(S.B, S.H, S.H, t_q, t_k, S.D_HEAD, seed=53, device=spec.device)
    lengths = torch.tensor([t_k, t_k - 3, t_k - 6])  # each sequence hides a different tail of keys
    padding = (torch.arange(t_k)[None, :] < lengths[:, None])[:, None, None, :].to(spec.device)  # [B, 1, 1, Tk]
    causal = (torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)).to(spec.device)
    per_head = torch.rand(1, S.H, t_q, t_k, generator=inputs.generator(54)).to(spec.device) > 0.3
    per_head[..., 0] = True  # every row keeps at least one key
    for label, mask in (
        ("keys [B,1,1,Tk]", padding),
        ("causal [Tq,Tk]", causal),
        ("heads [1,H,Tq,Tk]", per_head),
        ("both [B,1,Tq,Tk]", padding & causal),
    ):
        spec.check(
            lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
            q,
            k,
            v,
            mask,
            kind="attention",
            label=label,
            component="scaled_dot_product_attention",
            behaviour=f"attention with a mask shaped {label}, broadcast to [B, H, Tq, Tk]",
        )


@pytest.mark.bug_class("gqa")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("h_kv", [S.H_KV, 1], ids=["gqa", "mqa"])
def test_sdpa_gqa_mapping(spec, dtype, h_kv):
    """With GQA, query head h attends with kv head h // (H / H_kv), T_q != T_k; one kv head is multi-query attention (protocol: Conventions, GQA)."""
    t_q = 6
    q, k, v = qkv(S.B, S.H, h_kv, t_q, S.T, S.D_HEAD, seed=55, dtype=dtype, device=spec.device)
    mask = (torch.arange(S.T)[None, :] <= torch.arange(t_q)[:, None] + (S.T - t_q)).to(spec.device)
    spec.check(
        lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
        q,
        k,
        v,
        mask,
        kind="attention",
        component="scaled_dot_product_attention",
        behaviour=f"GQA attention: {S.H} query heads over {h_kv} kv heads, bottom-right causal mask",
    )


@pytest.mark.bug_class("flash")
@pytest.mark.parametrize("block_size", [1, 4, 5, 64])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_attention_matches_reference(spec, block_size, causal):
    """flash_attention equals exact attention for any block size, T not a multiple of it, GQA, T_q != T_k (course notes: is Flash Attention approximate? no)."""
    q, k, v = qkv(S.B, S.H, S.H_KV, 7, S.T + 4, S.D_HEAD, seed=56, device=spec.device)
    spec.check(
        lambda m, q, k, v: m.flash_attention(q, k, v, causal=causal, block_size=block_size),
        q,
        k,
        v,
        kind="attention",
        component="flash_attention",
        behaviour=f"flash_attention(causal={causal}, block_size={block_size}) with T_q=7, T_k={S.T + 4}",
    )


@pytest.mark.bug_class("flash")
@given(shape=attention_shapes(), seed=seeds, block_size=st.integers(1, 9), causal=st.booleans())
def test_flash_equals_naive_attention(spec, shape, seed, block_size, causal):
    """The implementation's flash_attention equals its own masked attention for any shape and block size (course notes: running (max, sum) keeps it exact)."""
    spec.impl.require("scaled_dot_product_attention")
    b, h, h_kv, t_q, t_k, d = shape
    q, k, v = qkv(b, h, h_kv, t_q, t_k, d, seed=seed, device=spec.device)
    mask = (torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)).to(spec.device) if causal else None
    naive = spec.impl.scaled_dot_product_attention(q, k, v, mask)
    flash = spec.impl.flash_attention(q, k, v, causal=causal, block_size=block_size)
    assert_close(
        flash,
        naive,
        tol=tolerance("attention", torch.float64),
        component="flash_attention",
        behaviour=f"flash_attention == masked attention, shape {shape}, block_size {block_size}, causal {causal}",
    )


@pytest.mark.bug_class("flash", "stability")
def test_flash_attention_stable_for_large_scores(spec):
    """flash_attention rescales its running max, so scores near 1e4 stay finite and exact (course notes: running (max, sum))."""
    q, k, v = qkv(2, 4, 2, 9, 9, 8, seed=57, device=spec.device)
    spec.check(
        lambda m, q, k, v: m.flash_attention(q, k, v, causal=True, block_size=4),
        q * 300,
        k * 30,
        v,
        kind="attention",
        component="flash_attention",
        behaviour="flash_attention with scores near ±1e4",
    )


def mha_weights(h, h_kv, *, seed, dtype=torch.float64, device="cpu"):
    d, dh = S.d_model, S.D_HEAD
    kw = dict(dtype=dtype, device=device)
    return (
        inputs.fan_in_weight(h * dh, d, seed=seed, **kw),
        inputs.fan_in_weight(h_kv * dh, d, seed=seed + 1, **kw),
        inputs.fan_in_weight(h_kv * dh, d, seed=seed + 2, **kw),
        inputs.fan_in_weight(d, h * dh, seed=seed + 3, **kw),
    )


@pytest.mark.bug_class("layout", "gqa")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("h_kv", [S.H, S.H_KV], ids=["mha", "gqa"])
def test_multihead_attention_layout(spec, dtype, h_kv):
    """Heads are split head-major from projection rows and merged back with a transpose before the reshape (course notes: wrong layout after reshape/transpose)."""
    x = inputs.randn(S.B, S.T, S.d_model, seed=58, dtype=dtype, device=spec.device)
    weights = mha_weights(S.H, h_kv, seed=59, dtype=dtype, device=spec.device)
    spec.check(
        lambda m, x, *w: m.multihead_self_attention(x, *w, S.H, h_kv),
        x,
        *weights,
        kind="attention",
        component="multihead_self_attention",
        behaviour=f"causal self-attention, {S.H} heads, {h_kv} kv heads, no RoPE",
    )


@pytest.mark.bug_class("rope", "rope_on_values")
@pytest.mark.parametrize("h_kv", [S.H, S.H_KV], ids=["mha", "gqa"])
def test_multihead_attention_with_rope(spec, h_kv):
    """With theta, RoPE rotates queries and keys (never values) at the given positions (course notes: RoPE applied to values)."""
    x = inputs.randn(S.B, S.T, S.d_model, seed=60, device=spec.device)
    weights = mha_weights(S.H, h_kv, seed=61, device=spec.device)
    pos = inputs.scattered_positions(S.T, seed=62, device=spec.device)
    spec.check(
        lambda m, x, *w: m.multihead_self_attention(x, *w, S.H, h_kv, theta=10000.0),
        x,
        *weights,
        kind="attention",
        component="multihead_self_attention",
        label="default_positions",
        behaviour="self-attention with RoPE at default positions arange(T)",
    )
    # A uniform shift of arange(T) would not do: RoPE scores depend only on relative positions.
    spec.check(
        lambda m, x, *w: m.multihead_self_attention(x, *w, S.H, h_kv, theta=10000.0, positions=pos),
        x,
        *weights,
        kind="attention",
        component="multihead_self_attention",
        label="scattered_positions",
        behaviour=f"self-attention with RoPE at scattered positions {pos.tolist()}",
    )


@pytest.mark.bug_class("causality")
@given(seed=seeds, cut=st.integers(1, S.T - 1))
def test_multihead_attention_is_causal(spec, seed, cut):
    """Changing tokens after position t leaves attention outputs up to t bit-identical (course notes: causal masking; why -inf in the mask: future positions get zero weight)."""
    x = inputs.randn(2, S.T, S.d_model, seed=seed, device=spec.device)
    weights = mha_weights(S.H, S.H_KV, seed=seed + 7, device=spec.device)
    changed = x.clone()
    changed[:, cut:] = inputs.randn(2, S.T - cut, S.d_model, seed=seed + 3, device=spec.device)
    out = spec.impl.multihead_self_attention(x, *weights, S.H, S.H_KV, theta=10000.0)
    out_changed = spec.impl.multihead_self_attention(changed, *weights, S.H, S.H_KV, theta=10000.0)
    assert_close(
        out_changed[:, :cut],
        out[:, :cut],
        tol=BIT_IDENTICAL,
        component="multihead_self_attention",
        behaviour=f"outputs before position {cut} do not depend on tokens from {cut} on",
    )
