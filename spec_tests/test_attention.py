"""Masks, grouped-query head sharing, scaled dot-product attention, flash attention and
multi-head self-attention, each on reference inputs."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .attention_inputs import bottom_right, kv_heads, loaded_alike, mha_weights, qkv
from .harness.judging.tolerances import BIT_IDENTICAL
from .harness.plugin.markers import judges
from .inputs import S
from .strategies import attention_shapes, seeds

pytestmark = pytest.mark.component("attention")


@judges("causal_mask")
@pytest.mark.bug_class("causal_mask")
@pytest.mark.parametrize("t_q,t_k", [(S.T, S.T), (4, S.T), (1, S.T), (S.T, S.T + 6), (S.T + 3, S.T)])
def test_causal_mask_bottom_right(spec, t_q, t_k):
    """causal_mask(t_q, t_k) is bool [t_q, t_k], True where j <= i + (t_k - t_q), also for more queries than keys
    (the first t_q - t_k rows see nothing) (protocol: Conventions, bottom-right aligned)."""
    mask = spec.impl.causal_mask(t_q, t_k, device=spec.device)
    spec.require(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
        behaviour="causal_mask returns a bool tensor (True = may attend)",
        found=f"got {getattr(mask, 'dtype', type(mask).__name__)}",
    )
    spec.call(
        "causal_mask",
        t_q,
        t_k,
        device=spec.device,
        axes="q k",
        behaviour=f"causal_mask({t_q}, {t_k}): query i sees key j iff j <= i + {t_k - t_q}",
    )


@judges("causal_mask")
@pytest.mark.bug_class("causal_mask")
def test_causal_mask_default_device(spec):
    """causal_mask(t_q, t_k) with its device omitted (the default None) is the same bool mask, on the CPU, as
    torch's own factory functions read None (protocol: causal_mask)."""
    mask = spec.impl.causal_mask(4, S.T)
    spec.require(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.device.type == "cpu",
        behaviour="causal_mask(t_q, t_k) without a device returns a bool tensor on the CPU",
        found=f"got {getattr(mask, 'dtype', type(mask).__name__)} on {getattr(mask, 'device', '?')}",
    )
    spec.call("causal_mask", 4, S.T, axes="q k", behaviour=f"causal_mask(4, {S.T}) with the default device")


@judges("repeat_kv")
@pytest.mark.bug_class("gqa")
@pytest.mark.parametrize("n_rep", [S.n_rep, 1])
def test_repeat_kv_interleaves(spec, n_rep):
    """repeat_kv gives head h the kv head h // n_rep (repeat_interleave, not tile) (course notes: GQA head repetition
    wrong)."""
    if n_rep > 1:
        spec.impl.require_capability("gqa")
    x = spec.inputs.per_head(S.B, S.H_KV, S.T, S.D_HEAD, seed=51)
    spec.call(
        "repeat_kv",
        x,
        n_rep,
        axes="b h t d",
        behaviour=f"repeat_kv(x [B, {S.H_KV}, T, d], {n_rep}): head h is kv head h // {n_rep}",
    )
    spec.call(
        "repeat_kv",
        x[:, :, :0].contiguous(),
        n_rep,
        label="T=0",
        axes="b h t d",
        behaviour=f"repeat_kv(x [B, {S.H_KV}, 0, d], {n_rep}): an empty time axis (a cache before its first token)",
    )


@judges("scaled_dot_product_attention")
@pytest.mark.bug_class("attention_scale", "softmax_dim", "mask_broadcast")
def test_sdpa_matches_reference(spec, dtype):
    """Attention is softmax over keys of q k^T / sqrt(d_head), masked, times v (course notes: attention equation; why
    divide by sqrt(d_k); symptoms table: learning stalls, scores not scaled)."""
    q, k, v = qkv(spec, S.B, S.H, S.H, S.T, S.T, S.D_HEAD, seed=52, dtype=dtype)
    spec.call(
        "scaled_dot_product_attention",
        q,
        k,
        v,
        kind="attention",
        axes="b h t d",
        behaviour="unmasked attention: softmax(q k^T / sqrt(d_head), over keys) v",
    )
    mask = bottom_right(S.T, S.T, spec.device)
    spec.call(
        "scaled_dot_product_attention",
        q,
        k,
        v,
        mask,
        kind="attention",
        label="causal",
        axes="b h t d",
        behaviour="causal attention with a [T, T] bool mask",
    )
    t = 2 * 64 + 7  # a longer sequence: no query count is special (tiles of 64, say)
    q, k, v = qkv(spec, 1, 2, 2, t, t, S.D_HEAD, seed=53, dtype=dtype)
    spec.call(
        "scaled_dot_product_attention",
        q,
        k,
        v,
        bottom_right(t, t, spec.device),
        kind="attention",
        label="long",
        axes="b h t d",
        behaviour=f"causal attention over {t} queries and keys",
    )


@judges("scaled_dot_product_attention")
@pytest.mark.bug_class("mask_broadcast")
def test_sdpa_mask_broadcast(spec):
    """A mask broadcast over batch and heads masks keys of each query row; a [B, 1, Tq, Tk] padding mask differs per
    sequence (course notes: mask broadcast shape wrong; protocol: scaled_dot_product_attention)."""
    t_q, t_k = 5, S.T
    q, k, v = qkv(spec, S.B, S.H, S.H, t_q, t_k, S.D_HEAD, seed=53)
    lengths = torch.tensor([t_k - 4, t_k, t_k - 7])  # each sequence hides a different tail (the first one too)
    padding = (torch.arange(t_k)[None, :] < lengths[:, None])[:, None, None, :].to(spec.device)  # [B, 1, 1, Tk]
    causal = bottom_right(t_q, t_k, spec.device)
    per_head = torch.rand(1, S.H, t_q, t_k, generator=spec.inputs.generator(54, device="cpu")).to(spec.device) > 0.3
    per_head[..., 0] = True  # every row keeps at least one key
    masks = (
        ("keys [B,1,1,Tk]", padding),
        ("causal [Tq,Tk]", causal),
        ("heads [1,H,Tq,Tk]", per_head),
        ("both [B,1,Tq,Tk]", padding & causal),
    )
    for label, mask in masks:
        spec.call(
            "scaled_dot_product_attention",
            q,
            k,
            v,
            mask,
            kind="attention",
            label=label,
            axes="b h t d",
            behaviour=f"attention with a mask shaped {label}, broadcast to [B, H, Tq, Tk]",
        )


@judges("scaled_dot_product_attention")
@pytest.mark.bug_class("gqa")
@pytest.mark.parametrize("h_kv", [S.H_KV, 1], ids=["gqa", "mqa"])
def test_sdpa_gqa_mapping(spec, dtype, h_kv):
    """With GQA, query head h attends with kv head h // (H / H_kv), T_q != T_k; one kv head is multi-query attention
    (protocol: Conventions, GQA)."""
    spec.impl.require_capability("gqa")
    t_q = 6
    q, k, v = qkv(spec, S.B, S.H, h_kv, t_q, S.T, S.D_HEAD, seed=55, dtype=dtype)
    mask = bottom_right(t_q, S.T, spec.device)
    spec.call(
        "scaled_dot_product_attention",
        q,
        k,
        v,
        mask,
        kind="attention",
        axes="b h t d",
        behaviour=f"GQA attention: {S.H} query heads over {h_kv} kv heads, bottom-right causal mask",
    )


@judges("scaled_dot_product_attention")
@pytest.mark.bug_class("gqa")
def test_sdpa_mask_per_query_head_with_gqa(spec):
    """With GQA a mask still has one slice per query head: [B, Hq, Tq, Tk] and [Hq, Tq, Tk] masks that differ
    between the query heads sharing a kv head (protocol: scaled_dot_product_attention, mask broadcastable to
    [..., Hq, Tq, Tk]; Conventions, GQA)."""
    spec.impl.require_capability("gqa")
    t_q = 6
    q, k, v = qkv(spec, S.B, S.H, S.H_KV, t_q, S.T, S.D_HEAD, seed=57)
    draw = spec.inputs.generator(58, device="cpu")
    per_row = torch.rand(S.B, S.H, t_q, S.T, generator=draw) > 0.4  # every query head of every row its own keys
    per_row[..., -1] = True  # every row keeps at least one key
    masks = (("heads and rows [B,Hq,Tq,Tk]", per_row), ("heads [Hq,Tq,Tk]", per_row[0]))
    for label, mask in masks:
        spec.call(
            "scaled_dot_product_attention",
            q,
            k,
            v,
            mask.to(spec.device),
            kind="attention",
            label=label,
            axes="b h t d",
            behaviour=f"GQA attention ({S.H} query heads over {S.H_KV} kv heads) with a mask shaped {label}",
        )


@judges("flash_attention")
@pytest.mark.bug_class("flash")
@pytest.mark.parametrize("block_size", [1, 4, 5, 64])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_attention_matches_reference(spec, block_size, causal):
    """flash_attention equals exact attention for any block size, T not a multiple of it, GQA where supported, T_q !=
    T_k (course notes: is Flash Attention approximate? no)."""
    q, k, v = qkv(spec, S.B, S.H, kv_heads(spec), 7, S.T + 4, S.D_HEAD, seed=56)
    spec.call(
        "flash_attention",
        q,
        k,
        v,
        causal=causal,
        block_size=block_size,
        kind="attention",
        axes="b h t d",
        behaviour=f"flash_attention(causal={causal}, block_size={block_size}) with T_q=7, T_k={S.T + 4}",
    )


@judges("flash_attention", uses=("scaled_dot_product_attention",))
@pytest.mark.bug_class("flash")
@given(shape=attention_shapes(), seed=seeds, block_size=st.integers(1, 9), causal=st.booleans())
def test_flash_equals_naive_attention(spec, shape, seed, block_size, causal):
    """The implementation's flash_attention equals its own masked attention for any shape and block size (course notes:
    running (max, sum) keeps it exact)."""
    b, h, h_kv, t_q, t_k, d = shape
    if "gqa" not in spec.impl.capabilities:
        h_kv = h
    q, k, v = qkv(spec, b, h, h_kv, t_q, t_k, d, seed=seed)
    mask = bottom_right(t_q, t_k, spec.device) if causal else None
    naive = spec.impl.scaled_dot_product_attention(q, k, v, mask)
    flash = spec.impl.flash_attention(q, k, v, causal=causal, block_size=block_size)
    spec.close(
        flash,
        naive,
        kind="attention",
        axes="b h t d",
        behaviour=f"flash_attention == masked attention, shape {shape}, block_size {block_size}, causal {causal}",
    )


@judges("flash_attention", "multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("causality", "gqa")
def test_attention_defaults(spec):
    """Omitted arguments take their documented defaults: flash_attention is causal, and multihead_self_attention
    without n_kv_heads has one kv head per query head (protocol: flash_attention, multihead_self_attention)."""
    q, k, v = qkv(spec, 2, 4, 4, 6, 9, S.D_HEAD, seed=63)
    spec.call(
        "flash_attention",
        q,
        k,
        v,
        kind="attention",
        axes="b h t d",
        behaviour="flash_attention(q, k, v) with its defaults: causal (bottom-right), any block size",
    )
    x = spec.inputs.randn(2, S.T, S.d_model, seed=64)
    weights = mha_weights(spec, S.H, S.H, seed=65)
    spec.call(
        "multihead_self_attention",
        x,
        *weights,
        S.H,
        kind="attention",
        axes="b t d",
        behaviour=f"multihead_self_attention(x, wq, wk, wv, wo, {S.H}): n_kv_heads defaults to n_heads, no RoPE",
        rebase=loaded_alike(spec, x, weights, S.H, S.H),
    )


@judges("flash_attention")
@pytest.mark.bug_class("flash", "stability")
def test_flash_attention_stable_for_large_scores(spec):
    """flash_attention rescales its running max, so scores near 1e4 stay finite and right (course notes: running (max,
    sum))."""
    q, k, v = qkv(spec, 2, 4, 2 if "gqa" in spec.impl.capabilities else 4, 9, 9, 8, seed=57)
    spec.call(
        "flash_attention",
        q * 300,
        k * 30,
        v,
        causal=True,
        block_size=4,
        kind="attention",
        axes="b h t d",
        behaviour="flash_attention with scores near ±1e4",
    )


@judges("multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("layout", "gqa")
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_multihead_attention_layout(spec, dtype, grouped):
    """Heads are split head-major from projection rows and merged back with a transpose before the reshape (course
    notes: wrong layout after reshape/transpose)."""
    if grouped:
        spec.impl.require_capability("gqa")
    h_kv = S.H_KV if grouped else S.H
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=58, dtype=dtype)
    weights = mha_weights(spec, S.H, h_kv, seed=59, dtype=dtype)
    spec.call(
        "multihead_self_attention",
        x,
        *weights,
        S.H,
        h_kv,
        kind="attention",
        axes="b t d",
        behaviour=f"causal self-attention, {S.H} heads, {h_kv} kv heads, no RoPE",
        rebase=loaded_alike(spec, x, weights, S.H, h_kv),
    )


@judges("multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("rope", "rope_on_values")
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_multihead_attention_with_rope(spec, grouped):
    """With theta, RoPE rotates queries and keys (never values) at the given positions (course notes: RoPE applied to
    values)."""
    spec.impl.require_family("llama")  # RoPE in attention is the llama configuration
    if grouped:
        spec.impl.require_capability("gqa")
    h_kv = S.H_KV if grouped else S.H
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=60)
    weights = mha_weights(spec, S.H, h_kv, seed=61)
    pos = spec.inputs.scattered_positions(S.T, seed=62)
    spec.call(
        "multihead_self_attention",
        x,
        *weights,
        S.H,
        h_kv,
        theta=10000.0,
        kind="attention",
        axes="b t d",
        label="default_positions",
        behaviour="self-attention with RoPE at default positions arange(T)",
        rebase=loaded_alike(spec, x, weights, S.H, h_kv, theta=10000.0),
    )
    # A uniform shift of arange(T) would not do: RoPE scores depend only on relative positions.
    spec.call(
        "multihead_self_attention",
        x,
        *weights,
        S.H,
        h_kv,
        theta=10000.0,
        positions=pos,
        kind="attention",
        axes="b t d",
        label="scattered_positions",
        behaviour=f"self-attention with RoPE at scattered positions {pos.tolist()}",
        rebase=loaded_alike(spec, x, weights, S.H, h_kv, theta=10000.0, positions=pos),
    )


@judges("multihead_self_attention")
@pytest.mark.bug_class("causality")
@given(seed=seeds, cut=st.integers(1, S.T - 1))
def test_multihead_attention_is_causal(spec, seed, cut):
    """Changing tokens after position t leaves attention outputs up to t bit-identical (course notes: causal masking;
    why -inf in the mask: future positions get zero weight)."""
    spec.impl.require_family("llama")  # RoPE in attention is the llama configuration (gpt2: the test below)
    h_kv = kv_heads(spec)
    x = spec.inputs.randn(2, S.T, S.d_model, seed=seed)
    weights = mha_weights(spec, S.H, h_kv, seed=seed + 7)
    changed = x.clone()
    changed[:, cut:] = spec.inputs.randn(2, S.T - cut, S.d_model, seed=seed + 3)
    out = spec.impl.multihead_self_attention(x, *weights, S.H, h_kv, theta=10000.0)
    out_changed = spec.impl.multihead_self_attention(changed, *weights, S.H, h_kv, theta=10000.0)
    spec.close(
        out_changed[:, :cut],
        out[:, :cut],
        tol=BIT_IDENTICAL,
        axes="b t d",
        behaviour=f"outputs before position {cut} do not depend on tokens from {cut} on",
    )


@judges("multihead_self_attention")
@pytest.mark.bug_class("causality")
def test_multihead_attention_without_rope_is_causal(spec):
    """Without theta (the gpt2 configuration: no RoPE, positions are added to the embeddings), changing tokens after
    position t leaves attention outputs up to t bit-identical (course notes: causal masking; why -inf in the mask:
    future positions get zero weight; protocol: multihead_self_attention; amendment 21)."""
    x = spec.inputs.randn(2, S.T, S.d_model, seed=66)
    weights = mha_weights(spec, S.H, S.H, seed=67)
    mha = spec.impl.multihead_self_attention
    out = mha(x, *weights, S.H, S.H)
    for cut in (1, S.T // 2, S.T - 1):
        changed = x.clone()
        changed[:, cut:] = spec.inputs.randn(2, S.T - cut, S.d_model, seed=68 + cut)
        out_changed = mha(changed, *weights, S.H, S.H)
        if torch.equal(out_changed[:, :cut], out[:, :cut]):
            continue
        with_rope = mha(x, *weights, S.H, S.H, theta=10000.0), mha(changed, *weights, S.H, S.H, theta=10000.0)
        only_rope = torch.equal(with_rope[0][:, :cut], with_rope[1][:, :cut])
        spec.close(
            out_changed[:, :cut],
            out[:, :cut],
            tol=BIT_IDENTICAL,
            axes="b t d",
            behaviour=f"without RoPE, outputs before position {cut} do not depend on tokens from {cut} on",
            hint="likely cause: the causal mask is applied only on the RoPE path (with theta the outputs are "
            "causal). Fix: mask the future whether or not positions are rotated"
            if only_rope
            else None,
            hint_code="causality" if only_rope else None,
        )
