"""The reference's component functions against torch.nn.functional and hand-computed values.

Everything in float64 with tolerance 1e-12; every size is distinct so a transposed or mixed-up axis
cannot pass by accident: B=2, Hkv=3, n_rep=4, H=12, Tq=5, d_head=6, Tk=7, T=11, V=13.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as R
from reference.positions import rope_frequencies

B, HKV, NREP, TQ, DH, TK, T, V = 2, 3, 4, 5, 6, 7, 11, 13
H = HKV * NREP
F64 = torch.float64
TOL = dict(atol=1e-12, rtol=0.0)


def randn(*shape, seed=0):
    """Unit-scale float64 noise, reproducible per seed."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def qkv(t_q, t_k, h=H, h_kv=HKV, seed=0):
    return (
        randn(B, h, t_q, DH, seed=seed),
        randn(B, h_kv, t_k, DH, seed=seed + 1),
        randn(B, h_kv, t_k, DH, seed=seed + 2),
    )


def bottom_right(t_q, t_k):
    """Independent bottom-right causal mask: query i sees key j iff j <= i + (t_k - t_q)."""
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)


# ----------------------------------------------------------------------------- primitives


def test_linear_matches_F_linear():
    """linear(x, W, b) equals F.linear on a 3-D input, with and without bias."""
    x, w, b = randn(B, TQ, DH, seed=1), randn(V, DH, seed=2), randn(V, seed=3)
    torch.testing.assert_close(R.linear(x, w, b), F.linear(x, w, b), **TOL)
    torch.testing.assert_close(R.linear(x, w), F.linear(x, w), **TOL)


def test_embedding_matches_F_embedding():
    """embedding(ids, W) equals F.embedding for a [B, T] id tensor."""
    w = randn(V, DH, seed=4)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(R.embedding(ids, w), F.embedding(ids, w), **TOL)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_matches_F_softmax(dim):
    """softmax(x, dim) equals F.softmax along every axis of a 3-D tensor."""
    x = 3 * randn(B, TQ, V, seed=6)
    torch.testing.assert_close(R.softmax(x, dim), F.softmax(x, dim), **TOL)


def test_softmax_is_stable_near_1e4():
    """softmax stays finite and equals F.softmax for logits near +1e4 and -1e4 (naive exp overflows)."""
    x = torch.cat([1e4 + randn(1, V, seed=7), -1e4 + randn(1, V, seed=8), 1e4 * torch.sign(randn(1, V, seed=9))])
    out = R.softmax(x, -1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.softmax(x, -1), **TOL)


def test_silu_matches_F_silu():
    """silu equals F.silu, including large-magnitude inputs."""
    x = 5 * randn(B, TQ, V, seed=10)
    torch.testing.assert_close(R.silu(x), F.silu(x), **TOL)


@pytest.mark.parametrize("eps", [1e-5, 0.3])
def test_rmsnorm_matches_F_rms_norm(eps):
    """rmsnorm with a non-unit weight equals F.rms_norm (eps inside the root; a large eps exposes its placement)."""
    x, w = randn(B, TQ, V, seed=11), 1 + randn(V, seed=12)
    torch.testing.assert_close(R.rmsnorm(x, w, eps), F.rms_norm(x, (V,), w, eps), **TOL)


def test_rmsnorm_computes_half_precision_in_float32():
    """rmsnorm of a bfloat16 input returns bfloat16 that matches the float32 computation rounded once."""
    x, w = randn(B, TQ, V, seed=13).to(torch.bfloat16), (1 + randn(V, seed=14)).to(torch.bfloat16)
    out = R.rmsnorm(x, w)
    assert out.dtype == torch.bfloat16
    want = F.rms_norm(x.float(), (V,), w.float(), 1e-5).to(torch.bfloat16)
    torch.testing.assert_close(out.float(), want.float(), atol=0, rtol=2**-7)


@pytest.mark.parametrize("eps", [1e-5, 0.3])
def test_layernorm_matches_F_layer_norm(eps):
    """layernorm with non-unit weight and non-zero bias equals F.layer_norm (biased variance)."""
    x, w, b = 2 + 3 * randn(B, TQ, V, seed=15), 1 + randn(V, seed=16), randn(V, seed=17)
    torch.testing.assert_close(R.layernorm(x, w, b, eps), F.layer_norm(x, (V,), w, b, eps), **TOL)


def test_swiglu_matches_functional():
    """swiglu equals F.linear(F.silu(x Wg^T) * x Wu^T, Wd), gate through SiLU and up not."""
    d, d_ff = DH, V
    x, wg, wu, wd = randn(B, TQ, d, seed=18), randn(d_ff, d, seed=19), randn(d_ff, d, seed=20), randn(d, d_ff, seed=21)
    want = F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
    torch.testing.assert_close(R.swiglu(x, wg, wu, wd), want, **TOL)


def test_gelu_mlp_matches_functional_tanh_gelu():
    """gelu_mlp equals F.gelu(approximate="tanh") between two F.linear layers, and differs from exact-erf GELU."""
    d, d_ff = DH, V
    x, w1, b1 = randn(B, TQ, d, seed=22), randn(d_ff, d, seed=23), randn(d_ff, seed=24)
    w2, b2 = randn(d, d_ff, seed=25), randn(d, seed=26)
    out = R.gelu_mlp(x, w1, b1, w2, b2)
    torch.testing.assert_close(out, F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2), **TOL)
    erf = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    assert (out - erf).abs().max() > 1e-6  # the tolerance above can tell the two GELUs apart


def test_inputs_are_not_modified_in_place():
    """Component functions leave their input tensors unchanged."""
    x, w, b = randn(B, TQ, DH, seed=27), 1 + randn(DH, seed=28), randn(DH, seed=29)
    q, k, v = qkv(TQ, TK)
    saved = [t.clone() for t in (x, w, b, q, k, v)]
    R.softmax(x, -1), R.silu(x), R.rmsnorm(x, w), R.layernorm(x, w, b)
    R.rope(q, torch.arange(TQ)), R.scaled_dot_product_attention(q, k, v, R.causal_mask(TQ, TK))
    R.flash_attention(q, k, v, block_size=3)
    for before, after in zip(saved, (x, w, b, q, k, v)):
        assert torch.equal(before, after)


# ----------------------------------------------------------------------------- positions


def test_rope_two_tokens_by_hand_interleaved():
    """rope on 2 tokens, d_head=4, theta=100 equals rotations of pairs (0,1), (2,3) written out with math.cos/sin."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=F64)
    # freqs: 100**(-0/4) = 1, 100**(-2/4) = 0.1; position 0 is the identity, position 1 rotates by 1 and 0.1
    c1, s1, c2, s2 = math.cos(1.0), math.sin(1.0), math.cos(0.1), math.sin(0.1)
    want = torch.tensor(
        [[1.0, 2.0, 3.0, 4.0], [5 * c1 - 6 * s1, 5 * s1 + 6 * c1, 7 * c2 - 8 * s2, 7 * s2 + 8 * c2]], dtype=F64
    )
    torch.testing.assert_close(R.rope(x, torch.arange(2), theta=100.0), want, **TOL)
    torch.testing.assert_close(R.rope(x, torch.arange(2), theta=100.0, style="interleaved"), want, **TOL)


def test_rope_two_tokens_by_hand_half():
    """rope(style="half") on 2 tokens, d_head=4, theta=100 rotates pairs (0,2), (1,3) as written out by hand."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=F64)
    c1, s1, c2, s2 = math.cos(1.0), math.sin(1.0), math.cos(0.1), math.sin(0.1)
    want = torch.tensor(
        [[1.0, 2.0, 3.0, 4.0], [5 * c1 - 7 * s1, 6 * c2 - 8 * s2, 5 * s1 + 7 * c1, 6 * s2 + 8 * c2]], dtype=F64
    )
    torch.testing.assert_close(R.rope(x, torch.arange(2), theta=100.0, style="half"), want, **TOL)


def test_rope_frequencies_by_hand():
    """RoPE frequencies are theta**(-2i/d): the helper's table and the angles rope actually applies."""
    d, theta = 10, 500.0
    want = torch.tensor([theta ** (-2 * i / d) for i in range(d // 2)], dtype=F64)
    torch.testing.assert_close(rope_frequencies(d, theta), want, **TOL)
    # rotate unit vector e_{2i} at position 1: channel (2i, 2i+1) becomes (cos f_i, sin f_i)
    e = torch.eye(d, dtype=F64)[0::2]  # [d/2, d], row i = e_{2i}
    out = R.rope(e[:, None, :], torch.tensor([1]), theta)[:, 0]  # [d/2, d]
    idx = torch.arange(d // 2)
    torch.testing.assert_close(out[idx, 2 * idx], want.cos(), **TOL)
    torch.testing.assert_close(out[idx, 2 * idx + 1], want.sin(), **TOL)


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rope_matches_complex_multiplication(style, oracles):
    """rope on [B, H, T, d_head] at arbitrary positions equals multiplying channel pairs by exp(i*pos*freq)."""
    x = randn(B, H, TQ, DH, seed=30)
    pos = torch.tensor([3, 0, 9, 4, 15])
    torch.testing.assert_close(R.rope(x, pos, 321.0, style=style), oracles.rope(x, pos, 321.0, style), **TOL)


def test_rope_broadcasts_per_batch_positions(oracles):
    """rope with positions [B, 1, T] rotates each batch row at its own positions."""
    x = randn(B, H, TQ, DH, seed=31)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    out = R.rope(x, pos[:, None, :])
    for b in range(B):
        torch.testing.assert_close(out[b], oracles.rope(x[b], pos[b]), **TOL)


def test_rope_odd_head_dim_raises_naming_it():
    """rope on an odd head dimension raises ValueError naming the dimension."""
    with pytest.raises(ValueError, match=r"\b7\b"):
        R.rope(randn(TQ, 7, seed=32), torch.arange(TQ))


def test_sinusoidal_entries_by_hand():
    """sinusoidal_positions(P, d) has pe[p, 2i] = sin(p / 10000**(2i/d)) and pe[p, 2i+1] = cos(...), by hand."""
    P, d = 9, 10
    pe = R.sinusoidal_positions(P, d, dtype=F64)
    assert pe.shape == (P, d)
    for p in (0, 1, 8):
        for i in range(d // 2):
            ang = p / 10000 ** (2 * i / d)
            assert abs(pe[p, 2 * i].item() - math.sin(ang)) < 1e-12
            assert abs(pe[p, 2 * i + 1].item() - math.cos(ang)) < 1e-12
    odd = R.sinusoidal_positions(P, 7, dtype=F64)  # an odd width ends with a sine column
    assert odd.shape == (P, 7)
    assert abs(odd[5, 6].item() - math.sin(5 / 10000 ** (6 / 7))) < 1e-12


# ----------------------------------------------------------------------------- masks and heads


def test_causal_mask_literal():
    """causal_mask(2, 4) is the literal bottom-right mask [[1,1,1,0],[1,1,1,1]] (bool)."""
    m = R.causal_mask(2, 4)
    assert m.dtype == torch.bool
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("t_q,t_k", [(TQ, TQ), (TQ, TK), (1, TK), (TK, TK)])
def test_causal_mask_matches_tril(t_q, t_k):
    """causal_mask(t_q, t_k) equals ones.tril(diagonal=t_k - t_q)."""
    assert torch.equal(R.causal_mask(t_q, t_k), bottom_right(t_q, t_k))


def test_repeat_kv_literal_mapping():
    """repeat_kv output head h is kv head h // n_rep (repeat_interleave, not tile)."""
    x = torch.arange(HKV, dtype=F64)[None, :, None, None].expand(B, HKV, TQ, DH)
    out = R.repeat_kv(x, NREP)
    assert out.shape == (B, H, TQ, DH)
    assert out[0, :, 0, 0].tolist() == [float(h // NREP) for h in range(H)]
    y = randn(B, HKV, TQ, DH, seed=33)
    assert torch.equal(R.repeat_kv(y, NREP), y.repeat_interleave(NREP, dim=1))


# ----------------------------------------------------------------------------- attention


def test_naive_attention_unmasked_matches_F_sdpa():
    """scaled_dot_product_attention without a mask equals F.scaled_dot_product_attention (MHA, Tq != Tk)."""
    q, k, v = qkv(TQ, TK, h=H, h_kv=H)
    torch.testing.assert_close(R.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), **TOL)


def test_naive_attention_gqa_causal_matches_F_sdpa():
    """Causal GQA attention (H=12, Hkv=3) equals F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)."""
    q, k, v = qkv(T, T)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(R.scaled_dot_product_attention(q, k, v, R.causal_mask(T, T)), want, **TOL)


def test_naive_attention_bottom_right_mask_matches_F_sdpa():
    """With Tq != Tk, the bottom-right causal mask gives F.sdpa's result for that explicit mask with enable_gqa."""
    q, k, v = qkv(TQ, TK)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right(TQ, TK), enable_gqa=True)
    torch.testing.assert_close(R.scaled_dot_product_attention(q, k, v, R.causal_mask(TQ, TK)), want, **TOL)
    # is_causal=True would be top-left aligned: different, so the check above can tell the two apart
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (top_left - want).abs().max() > 1e-3


def test_naive_attention_arbitrary_broadcast_mask_matches_F_sdpa():
    """An arbitrary bool mask [B, 1, Tq, Tk] (every row has an allowed key) gives F.sdpa's result."""
    q, k, v = qkv(TQ, TK)
    mask = torch.rand(B, 1, TQ, TK, generator=torch.Generator().manual_seed(34)) < 0.5
    mask[..., 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(R.scaled_dot_product_attention(q, k, v, mask), want, **TOL)


BLOCKS = [1, 3, 4, 7, 64, T + 5]


@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t_q,t_k", [(T, T), (TQ, TK), (1, TK)])
def test_flash_attention_equals_naive_and_F_sdpa(block_size, causal, t_q, t_k):
    """flash_attention equals naive attention and F.sdpa (bottom-right mask when causal) for many block sizes."""
    q, k, v = qkv(t_q, t_k, seed=block_size)
    mask = bottom_right(t_q, t_k) if causal else None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    naive = R.scaled_dot_product_attention(q, k, v, R.causal_mask(t_q, t_k) if causal else None)
    out = R.flash_attention(q, k, v, causal=causal, block_size=block_size)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(out, naive, **TOL)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    t_q=st.integers(1, 13),
    extra=st.integers(0, 6),
    block=st.integers(1, 9),
    n_rep=st.sampled_from([1, 2, 4]),
    causal=st.booleans(),
)
def test_flash_attention_property(t_q, extra, block, n_rep, causal):
    """For random shapes, GQA groupings and block sizes, flash_attention equals F.sdpa with the bottom-right mask."""
    q, k, v = qkv(t_q, t_q + extra, h=HKV * n_rep, seed=t_q * 100 + extra)
    mask = bottom_right(t_q, t_q + extra) if causal else None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1)
    torch.testing.assert_close(R.flash_attention(q, k, v, causal=causal, block_size=block), want, **TOL)


def test_flash_attention_bad_block_size_names_it():
    """flash_attention(block_size=0) raises ValueError naming the value."""
    q, k, v = qkv(TQ, TK)
    with pytest.raises(ValueError, match="block_size.*0"):
        R.flash_attention(q, k, v, block_size=0)


@pytest.mark.parametrize("use_rope", [False, True])
def test_multihead_self_attention_matches_functional(use_rope, oracles):
    """multihead_self_attention equals F.linear projections (head-major rows) + RoPE + causal GQA F.sdpa + F.linear."""
    d_model = H * DH
    x = randn(B, T, d_model, seed=42)
    wq, wk = randn(H * DH, d_model, seed=43) / 8, randn(HKV * DH, d_model, seed=44) / 8
    wv, wo = randn(HKV * DH, d_model, seed=45), randn(d_model, H * DH, seed=46)
    q = F.linear(x, wq).view(B, T, H, DH).transpose(1, 2)
    k = F.linear(x, wk).view(B, T, HKV, DH).transpose(1, 2)
    v = F.linear(x, wv).view(B, T, HKV, DH).transpose(1, 2)
    theta = 777.0 if use_rope else None
    if use_rope:
        q, k = oracles.rope(q, torch.arange(T), theta), oracles.rope(k, torch.arange(T), theta)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = F.linear(a.transpose(1, 2).reshape(B, T, H * DH), wo)
    out = R.multihead_self_attention(x, wq, wk, wv, wo, n_heads=H, n_kv_heads=HKV, theta=theta)
    torch.testing.assert_close(out, want, **TOL)


def test_multihead_self_attention_positions_offset(oracles):
    """Explicit positions shift the RoPE angles: positions p..p+T-1 equal the oracle at those positions."""
    d_model = H * DH
    x = randn(B, TQ, d_model, seed=47)
    wq, wk, wv, wo = (
        randn(r, c, seed=48 + i) / 4
        for i, (r, c) in enumerate([(d_model, d_model), (HKV * DH, d_model), (HKV * DH, d_model), (d_model, d_model)])
    )
    pos = torch.arange(9, 9 + TQ)
    q = oracles.rope(F.linear(x, wq).view(B, TQ, H, DH).transpose(1, 2), pos)
    k = oracles.rope(F.linear(x, wk).view(B, TQ, HKV, DH).transpose(1, 2), pos)
    v = F.linear(x, wv).view(B, TQ, HKV, DH).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = F.linear(a.transpose(1, 2).reshape(B, TQ, d_model), wo)
    out = R.multihead_self_attention(x, wq, wk, wv, wo, H, HKV, theta=10000.0, positions=pos)
    torch.testing.assert_close(out, want, **TOL)


# ----------------------------------------------------------------------------- losses


def test_cross_entropy_matches_F_cross_entropy():
    """cross_entropy on [N, V] equals F.cross_entropy (mean over targets)."""
    logits, targets = 3 * randn(T, V, seed=50), torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(51))
    torch.testing.assert_close(R.cross_entropy(logits, targets), F.cross_entropy(logits, targets), **TOL)


@pytest.mark.parametrize("ignore_index", [-100, 4])
def test_cross_entropy_ignore_index(ignore_index):
    """Ignored targets are left out of both the sum and the count, as in F.cross_entropy(ignore_index=...)."""
    logits = 3 * randn(T, V, seed=52)
    targets = torch.tensor([0, 4, 12, 4, 7, 1, 4, 3, 9, 4, 2])
    targets = torch.where(targets == 4, torch.tensor(ignore_index), targets)
    want = F.cross_entropy(logits, targets, ignore_index=ignore_index)
    torch.testing.assert_close(R.cross_entropy(logits, targets, ignore_index=ignore_index), want, **TOL)
    assert abs(want.item() - F.cross_entropy(logits, targets.clamp(min=0)).item()) > 1e-3  # ignoring matters


def test_cross_entropy_stable_near_1e4():
    """cross_entropy is finite and equals F.cross_entropy for logits near ±1e4."""
    logits = 1e4 * torch.sign(randn(T, V, seed=53)) + randn(T, V, seed=54)
    targets = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(55))
    out = R.cross_entropy(logits, targets)
    assert torch.isfinite(out)
    torch.testing.assert_close(out, F.cross_entropy(logits, targets), atol=1e-12, rtol=1e-15)


def test_cross_entropy_on_batched_logits():
    """cross_entropy accepts logits [B, T, V] with targets [B, T] and equals F.cross_entropy on the flattened pairs."""
    logits = 2 * randn(B, T, V, seed=58)
    targets = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(59))
    targets[1, 3] = -100
    want = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    torch.testing.assert_close(R.cross_entropy(logits, targets), want, **TOL)


def test_lm_loss_is_shifted_cross_entropy():
    """lm_loss(logits, ids) equals F.cross_entropy(logits[:, :-1], ids[:, 1:]) flattened."""
    logits = 2 * randn(B, T, V, seed=56)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(57))
    want = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(R.lm_loss(logits, ids), want, **TOL)


def test_value_error_messages_name_the_value():
    """repeat_kv(n_rep=0) and a mismatched linear raise ValueError naming the offending numbers."""
    with pytest.raises(ValueError, match=r"n_rep.*\b0\b"):
        R.repeat_kv(randn(B, HKV, TQ, DH), 0)
    with pytest.raises(ValueError, match=r"\b6\b"):
        R.linear(randn(B, 6), randn(V, 5))
