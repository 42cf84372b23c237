"""The reference's Gemma-style options (amendments 25 and 26) against transformers' Gemma 2 with random weights.

Each option is checked against the Gemma 2 component that defines it (``Gemma2RMSNorm``: ``(1 + weight)`` in
float32; ``Gemma2TextScaledWordEmbedding``: ``sqrt(hidden_size)`` cast to the weights' dtype; ``Gemma2MLP`` with
``gelu_pytorch_tanh``; ``eager_attention_forward(..., softcap=)``), then the whole ``Gemma2ForCausalLM`` against
the reference built with every option, ``rope_style="half"`` (transformers' ``rotate_half``), ``head_dim = d_model
// n_heads`` and ``query_pre_attn_scalar = head_dim`` (the protocol's ``1 / sqrt(d_head)``), and a sliding window
longer than any sequence here (so every layer attends to all keys: sliding windows are amendment 27's). Stock
Gemma 2 computes RMSNorm, the RoPE tables and the softmax in float32; for the float64 comparison those islands are
made float64 (transformers' formulas kept), so it holds to 1e-10, far below any convention's difference.
"""

from __future__ import annotations

import math

import pytest
import torch

import reference as R
from reference.attention import scaled_dot_product_attention
from reference.mlp import geglu
from reference.model import RMSNorm
from spec_adapters.hf_names import gemma2_name_map

transformers = pytest.importorskip("transformers")
from transformers import Gemma2Config, Gemma2ForCausalLM  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2 as mg  # noqa: E402

F64 = torch.float64
THETA = 10000.0
EPS = 1e-6  # Gemma's default rms_norm_eps, not the protocol's 1e-5: the norms must read the config's
# V=61, d=48, H=6, Hkv=2 (n_rep 3), d_head=8, d_ff=80, 2 layers (sliding, then full), ctx 24
CFG = dict(
    vocab_size=61,
    context_length=24,
    d_model=48,
    n_layers=2,
    n_heads=6,
    n_kv_heads=2,
    d_ff=80,
    rope_theta=THETA,
    norm_eps=EPS,
    family="llama",
    attn_logit_softcap=1.5,
    final_logit_softcap=2.5,
    norm_offset=True,
    embed_scale=True,
    geglu=True,
    post_norms=True,
)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_rmsnorm_offset_equals_gemma2_rmsnorm():
    """``(1 + weight)`` gains, in float32 for float32 and bfloat16 inputs, exactly as ``Gemma2RMSNorm``."""
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 5, 48, generator=gen(0)).to(dtype)
        w = (0.5 * torch.randn(48, generator=gen(1))).to(dtype)
        theirs = mg.Gemma2RMSNorm(48, eps=EPS).to(dtype)
        with torch.no_grad():
            theirs.weight.copy_(w)
        ours = RMSNorm(48, EPS, offset=True).to(dtype)
        with torch.no_grad():
            ours.weight.copy_(w)
        torch.testing.assert_close(ours(x), theirs(x), atol=0, rtol=0)
        assert ours(x).dtype == dtype


def test_fresh_offsets_are_zero_and_give_the_plain_norm():
    """Fresh offset weights are zeros (Gemma 2's ``_init_weights``): a gain of 1, the plain normalisation."""
    model = R.build_model(dict(CFG, n_layers=1))
    norms = {k: v for k, v in R.canonical_state_dict(model).items() if k.endswith("norm.weight")}
    assert len(norms) == 5 and all(bool((v == 0).all()) for v in norms.values())
    x = torch.randn(2, 48, generator=gen(2), dtype=F64)
    ours = RMSNorm(48, EPS, offset=True).to(F64)
    with torch.no_grad():
        ours.weight.zero_()
    torch.testing.assert_close(ours(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def with_default_dtype(dtype, make, *args, **kwargs):
    """``make(*args, **kwargs)`` under torch's default dtype ``dtype`` (buffers are made in it)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make(*args, **kwargs)
    finally:
        torch.set_default_dtype(before)


def test_embedding_scale_is_rounded_like_gemma2():
    """``sqrt(d_model)`` is cast to the weights' dtype before the multiply (bf16: sqrt(48) = 6.928 -> 6.9375)."""
    ids = torch.randint(0, 61, (2, 7), generator=gen(3))
    for dtype in (F64, torch.float32, torch.bfloat16):
        cfg = dict(CFG, n_layers=1, embed_scale=True)
        weight = torch.randn(61, 48, generator=gen(4)).to(dtype)
        made_in = F64 if dtype == F64 else torch.float32  # bf16: a float32 buffer cast, as from_pretrained does
        theirs = with_default_dtype(made_in, mg.Gemma2TextScaledWordEmbedding, 61, 48, None, 48**0.5).to(dtype)
        with torch.no_grad():
            theirs.weight.copy_(weight)
        model = R.build_model(cfg).to(dtype)
        with torch.no_grad():
            model.tok_embeddings.weight.copy_(weight)
        seen = {}
        model.layers[0].attn_norm.register_forward_pre_hook(lambda m, args, seen=seen: seen.setdefault("x", args[0]))
        R.forward(model, ids)
        torch.testing.assert_close(seen["x"], theirs(ids), atol=0, rtol=0)


def test_geglu_equals_gemma2_mlp_with_tanh_gelu():
    """GeGLU is ``Gemma2MLP`` with ``gelu_pytorch_tanh``; exact erf GELU differs visibly on the same weights."""
    x = 2.0 * torch.randn(2, 5, 48, generator=gen(5), dtype=F64)
    mlp = mg.Gemma2MLP(Gemma2Config(hidden_size=48, intermediate_size=80, hidden_activation="gelu_pytorch_tanh"))
    mlp = mlp.to(F64)
    ws = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    with torch.no_grad():
        torch.testing.assert_close(geglu(x, *ws), mlp(x), atol=1e-12, rtol=1e-12)
        erf = torch.nn.functional.linear(
            torch.nn.functional.gelu(x @ ws[0].T) * (x @ ws[1].T), ws[2]
        )  # the exact-erf GELU Gemma does not use
        assert (erf - mlp(x)).abs().max() > 1e-5


def test_attention_softcap_equals_gemma2_eager_attention():
    """``softcap * tanh(scores / softcap)`` after the scaling and before the (additive) mask, as Gemma 2's eager
    attention; capping after masking would give masked keys weight."""
    q = 3.0 * torch.randn(2, 6, 9, 8, generator=gen(6), dtype=F64)
    k = 3.0 * torch.randn(2, 2, 9, 8, generator=gen(7), dtype=F64)
    v = torch.randn(2, 2, 9, 8, generator=gen(8), dtype=F64)
    mask = R.causal_mask(9, 9)
    additive = torch.zeros(9, 9, dtype=F64).masked_fill(~mask, torch.finfo(F64).min)
    module = type("M", (), {"num_key_value_groups": 3, "training": False})()
    theirs, _ = mg.eager_attention_forward(module, q, k, v, additive, scaling=8**-0.5, softcap=1.5)
    ours = scaled_dot_product_attention(q, k, v, mask, softcap=1.5)
    # eager's softmax is float32 (softmax(..., dtype=torch.float32)): float32 rounding of weights <= 1
    torch.testing.assert_close(ours, theirs.transpose(1, 2), atol=2e-6, rtol=0)
    assert (scaled_dot_product_attention(q, k, v, mask) - ours).abs().max() > 0.1


@pytest.fixture
def float64_gemma2(monkeypatch):
    """Gemma 2's RMSNorm, RoPE tables and eager softmax in float64 (stock: float32), its formulas otherwise."""

    def rmsnorm64(self, x):
        return self._norm(x) * (1.0 + self.weight)

    def rotary64(self, x, position_ids):
        d = 2 * self.inv_freq.shape[-1]
        inv_freq = THETA ** (-torch.arange(0, d, 2, dtype=F64, device=x.device) / d)
        emb = (position_ids[..., None].to(F64) * inv_freq).repeat(1, 1, 2)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    stock_softmax = torch.nn.functional.softmax

    def softmax64(x, dim=None, dtype=None, **kw):
        return stock_softmax(x, dim=dim, **kw)  # eager asks for dtype=float32; keep float64

    monkeypatch.setattr(mg.Gemma2RMSNorm, "forward", rmsnorm64)
    monkeypatch.setattr(mg.Gemma2RotaryEmbedding, "forward", rotary64)
    monkeypatch.setattr(mg.nn.functional, "softmax", softmax64)


@torch.no_grad()
def gemma2(seed: int):
    """A float64 ``Gemma2ForCausalLM`` of ``CFG`` with O(1) random weights (norm offsets N(0, 0.3²)) and its
    canonical state dict."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # the embed_scale buffer is made in the default dtype
    try:
        config = Gemma2Config(
            vocab_size=61,
            hidden_size=48,
            intermediate_size=80,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=8,
            query_pre_attn_scalar=8,
            max_position_embeddings=24,
            rms_norm_eps=EPS,
            rope_parameters={"rope_type": "default", "rope_theta": THETA},
            hidden_activation="gelu_pytorch_tanh",
            attn_logit_softcapping=1.5,
            final_logit_softcapping=2.5,
            sliding_window=4096,  # longer than any sequence here: every layer attends to all keys
            tie_word_embeddings=True,
            attention_dropout=0.0,
            attn_implementation="eager",
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
        torch.manual_seed(seed)
        model = Gemma2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(before)
    g = gen(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=F64)
        p.copy_(0.3 * r if "norm" in name else r / math.sqrt(p.shape[-1]) if "proj" in name else 0.2 * r)
    params = dict(model.named_parameters())
    sd = {ours: params[theirs].detach().clone() for ours, theirs in gemma2_name_map(2, tied=True).items()}
    return model, sd


def reference_model(sd, **changes):
    return with_default_dtype(F64, R.build_model, dict(CFG, **changes), sd, rope_style="half").eval()


@pytest.mark.parametrize("seed", [0, 1])
def test_model_equals_gemma2_for_causal_lm(float64_gemma2, seed):
    """Logits of the reference with every Gemma option equal Gemma2ForCausalLM's, uncached and through the cache;
    each option left out changes them by far more."""
    model, sd = gemma2(seed)
    ids = torch.randint(0, 61, (2, 17), generator=gen(10 + seed))
    with torch.no_grad():
        theirs = model(input_ids=ids, use_cache=False).logits
        ours = R.forward(reference_model(sd), ids)
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)
        assert ours.abs().max() < 2.5  # the final soft-cap bounds the logits
        ref = reference_model(sd)
        cache = R.new_cache(ref, 2)
        chunks = [R.forward(ref, ids[:, a:b], cache) for a, b in ((0, 6), (6, 7), (7, 17))]
        torch.testing.assert_close(torch.cat(chunks, dim=1), theirs, atol=1e-10, rtol=1e-10)
        for option in ("attn_logit_softcap", "final_logit_softcap", "norm_offset", "embed_scale", "geglu"):
            other = R.forward(reference_model(sd, **{option: None if "softcap" in option else False}), ids)
            assert (other - theirs).abs().max() > 1e-3, option
