"""Each fast path of the reference equals the readable math it stands in for.

The model calls the component functions with their fast-path options (``fused=True``, RoPE tables,
``attention="sdpa"``); the suite calls them with the defaults, the readable math, which is the
oracle. These checks tie the two together: float64, tolerance 1e-12, sizes all distinct
(B=2, Hkv=3, n_rep=4, H=12, Tq=5, d_head=6, Tk=7, T=11, V=13), with grouped-query heads,
``Tq != Tk``, a single query, and a KV cache.
"""

from __future__ import annotations

import pytest
import torch

import reference as R
from reference.config import parse_config
from reference.kv_cache import KVCache
from reference.positions import rope_table

B, HKV, NREP, TQ, DH, TK, T, V = 2, 3, 4, 5, 6, 7, 11, 13
H = HKV * NREP
F64 = torch.float64
TOL = dict(atol=1e-12, rtol=0.0)


def randn(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def bottom_right(t_q, t_k):
    """Independent bottom-right causal mask: query i sees key j iff j <= i + (t_k - t_q)."""
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)


# ----------------------------------------------------------------------------- attention


SHAPES = [(T, T), (TQ, TK), (1, TK), (1, 1)]


@pytest.mark.parametrize("t_q,t_k", SHAPES)
@pytest.mark.parametrize("n_rep", [1, NREP])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("with_mask", [False, True])
def test_fused_attention_equals_the_math(t_q, t_k, n_rep, causal, with_mask):
    """scaled_dot_product_attention(fused=True) (F.scaled_dot_product_attention) equals the written-out
    math, with and without a mask and the causal option, MHA and GQA, for Tq == Tk, Tq < Tk and one query."""
    q, k, v = randn(B, HKV * n_rep, t_q, DH, seed=1), randn(B, HKV, t_k, DH, seed=2), randn(B, HKV, t_k, DH, seed=3)
    mask = None
    if with_mask:
        mask = torch.rand(B, 1, t_q, t_k, generator=torch.Generator().manual_seed(4)) < 0.6
        mask[..., 0] = True  # every row keeps a key, also under the causal mask
    want = R.scaled_dot_product_attention(q, k, v, mask, causal=causal)
    got = R.scaled_dot_product_attention(q, k, v, mask, causal=causal, fused=True)
    assert got.shape == (B, HKV * n_rep, t_q, DH)
    torch.testing.assert_close(got, want, **TOL)
    # the causal option is the bottom-right mask (and'ed with the given one), not top-left
    explicit = bottom_right(t_q, t_k) if causal else torch.ones(t_q, t_k, dtype=torch.bool)
    explicit = explicit if mask is None else explicit & mask
    torch.testing.assert_close(want, R.scaled_dot_product_attention(q, k, v, explicit), **TOL)


def test_fused_attention_in_float32_and_its_gradient():
    """In float32 the fused path agrees to float32 rounding; in float64 its gradients equal the math's."""
    q, k, v = randn(B, H, TQ, DH, seed=5), randn(B, HKV, TK, DH, seed=6), randn(B, HKV, TK, DH, seed=7)
    args = [t.float() for t in (q, k, v)]
    torch.testing.assert_close(
        R.scaled_dot_product_attention(*args, causal=True, fused=True),
        R.scaled_dot_product_attention(*args, causal=True),
        atol=1e-5,
        rtol=0,
    )
    grads = []
    for fused in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = R.scaled_dot_product_attention(*leaves, causal=True, fused=fused)
        (out * randn(*out.shape, seed=8)).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, **TOL)


def weights(bias: bool, seed: int = 20):
    d = H * DH
    shapes = {"wq": (H * DH, d), "wk": (HKV * DH, d), "wv": (HKV * DH, d), "wo": (d, H * DH)}
    w = {name: randn(*shape, seed=seed + i) / 8 for i, (name, shape) in enumerate(shapes.items())}
    b = {"b" + name[1]: randn(shape[0], seed=seed + 10 + i) for i, (name, shape) in enumerate(shapes.items())}
    return w, (b if bias else {})


def new_cache(n_layers=1):
    cfg = dict(vocab_size=V, context_length=32, d_model=H * DH, n_layers=n_layers, n_heads=H, n_kv_heads=HKV, d_ff=8)
    return KVCache(parse_config(cfg), B, torch.device("cpu"), F64)


@pytest.mark.parametrize("attention", ["sdpa", "flash"])
@pytest.mark.parametrize("theta,bias", [(777.0, False), (None, True)])
def test_attention_paths_equal_the_math_with_a_cache(attention, theta, bias):
    """multihead_self_attention with attention="sdpa"/"flash" and RoPE tables equals the written-out math
    (GQA, llama-like with RoPE or gpt2-like with biases), in one call and fed through a KV cache in chunks
    (Tq != Tk, then single queries); the cached keys and values are the same too."""
    w, b = weights(bias)
    x = randn(B, T, H * DH, seed=30)
    args = (w["wq"], w["wk"], w["wv"], w["wo"], H, HKV, theta)
    want = R.multihead_self_attention(x, *args, **b)
    full = R.multihead_self_attention(x, *args, **b, attention=attention, rope_table_size=32)
    torch.testing.assert_close(full, want, **TOL)
    caches, outs = {}, {}
    for path, extra in (("naive", {}), (attention, {"attention": attention, "rope_table_size": 32})):
        cache, chunks, start = new_cache(), [], 0
        for n in (4, 3, 1, 1, 2):
            pos = torch.arange(start, start + n)
            chunks.append(R.multihead_self_attention(x[:, start : start + n], *args, pos, **b, cache=cache, **extra))
            start += n
        caches[path], outs[path] = R.cache_kv(cache, 0), torch.cat(chunks, dim=1)
    torch.testing.assert_close(outs["naive"], want, **TOL)
    torch.testing.assert_close(outs[attention], want, **TOL)
    for got, ref in zip(caches[attention], caches["naive"]):
        torch.testing.assert_close(got, ref, **TOL)


def test_cached_positions_default_to_continuing_the_cache():
    """With a cache and no positions, RoPE continues from the cached length (as the model's positions)."""
    w, _ = weights(False)
    x = randn(B, T, H * DH, seed=31)
    args = (w["wq"], w["wk"], w["wv"], w["wo"], H, HKV, 500.0)
    cache = new_cache()
    got = torch.cat(
        [
            R.multihead_self_attention(x[:, :6], *args, cache=cache),
            R.multihead_self_attention(x[:, 6:], *args, cache=cache),
        ],
        1,
    )
    torch.testing.assert_close(got, R.multihead_self_attention(x, *args), **TOL)


def test_unknown_attention_path_names_it():
    w, _ = weights(False)
    with pytest.raises(ValueError, match="'fast'"):
        R.multihead_self_attention(randn(B, T, H * DH), w["wq"], w["wk"], w["wv"], w["wo"], H, HKV, attention="fast")


# ----------------------------------------------------------------------------- RoPE tables


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_rope_table_lookup_equals_computed_angles(style, dtype):
    """rope(table_size=...) gives exactly the values of computing the angles, for offset positions [T] and
    per-batch positions [B, 1, T], in float64 and float32."""
    x = randn(B, H, TQ, DH, seed=40, dtype=dtype)
    for pos in (torch.arange(9, 9 + TQ), torch.tensor([[3, 0, 29, 4, 15], [7, 8, 9, 10, 11]])[:, None, :]):
        want = R.rope(x, pos, 321.0, style=style)
        got = R.rope(x, pos, 321.0, style=style, table_size=30)
        assert got.dtype == dtype
        assert torch.equal(got, want)
    cos, sin = rope_table(30, DH, 321.0, torch.device("cpu"), dtype)
    assert cos.shape == sin.shape == (30, DH // 2) and cos.dtype == dtype


# ----------------------------------------------------------------------------- SiLU, SwiGLU, cross-entropy


def test_fused_silu_equals_the_math_and_its_gradient():
    """silu(fused=True) (F.silu) equals x * sigmoid(x), values and gradients, including large inputs."""
    x = torch.cat(
        [
            5 * randn(B, TQ, V, seed=50),
            torch.tensor([-800.0, -40.0, 0.0, 40.0, 800.0], dtype=F64)[None, :, None].expand(B, 5, V),
        ]
    )
    grads = []
    for fused in (False, True):
        leaf = x.clone().requires_grad_()
        out = R.silu(leaf, fused=fused)
        (out * randn(*out.shape, seed=51)).sum().backward()
        grads.append((out.detach(), leaf.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], **TOL)
    torch.testing.assert_close(grads[1][1], grads[0][1], **TOL)


def test_fused_swiglu_equals_the_math():
    """swiglu(fused=True) equals the written-out swiglu."""
    x, wg, wu, wd = randn(B, TQ, DH, seed=52), randn(V, DH, seed=53), randn(V, DH, seed=54), randn(DH, V, seed=55)
    torch.testing.assert_close(R.swiglu(x, wg, wu, wd, fused=True), R.swiglu(x, wg, wu, wd), **TOL)


@pytest.mark.parametrize("shape", [(T,), (B, T)])
@pytest.mark.parametrize("ignore_index", [-100, 4])
@pytest.mark.parametrize("scale", [3.0, 1e4])
def test_fused_cross_entropy_equals_the_math(shape, ignore_index, scale):
    """cross_entropy(fused=True) (F.cross_entropy) equals the written-out mean NLL, [N, V] and [B, T, V],
    with ignored targets and logits near ±1e4."""
    logits = scale * randn(*shape, V, seed=56)
    targets = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(57))
    targets[..., 2] = ignore_index
    want = R.cross_entropy(logits, targets, ignore_index=ignore_index)
    got = R.cross_entropy(logits, targets, ignore_index=ignore_index, fused=True)
    assert got.shape == () and torch.isfinite(got)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-15)


def test_fused_cross_entropy_edge_cases():
    """Both paths: float32 results for bfloat16 logits, NaN when every target is ignored, ValueError on a
    shape mismatch naming the shapes."""
    logits, targets = randn(T, V, seed=58), torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(59))
    for fused in (False, True):
        out = R.cross_entropy(logits.to(torch.bfloat16), targets, fused=fused)
        assert out.dtype == torch.float32
        assert R.cross_entropy(logits, torch.full((T,), -100), fused=fused).isnan()
        with pytest.raises(ValueError, match=r"\(11, 13\).*\(10,\)"):
            R.cross_entropy(logits, targets[:-1], fused=fused)
    torch.testing.assert_close(
        R.cross_entropy(logits.to(torch.bfloat16), targets, fused=True),
        R.cross_entropy(logits.to(torch.bfloat16), targets),
        atol=1e-6,
        rtol=0,
    )
