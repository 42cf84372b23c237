"""The reference's qk_norm (amendment 24) against transformers' Qwen3 and against identities of its own.

Qwen3's attention (``Qwen3Attention``) applies ``Qwen3RMSNorm(head_dim, eps=rms_norm_eps)`` to the queries and to
the keys after the head split (``view(..., -1, head_dim)``) and before ``apply_rotary_pos_emb``: one weight
``[head_dim]`` each, shared by every head, the model's own eps. The reference built with ``rope_style="half"``
(transformers' ``rotate_half`` pairing) and ``qk_norm`` must compute the same logits and cache the same keys.
Stock transformers computes RMSNorm and the RoPE tables in float32 (and the eager attention its softmax); the
float64 checks make the two islands float64 (keeping transformers' formulas) and use the sdpa attention, so that
they hold to 1e-10, far below any formula difference; stock eager Qwen3 is checked at float32 rounding.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import reference as R
from reference.attention import multihead_self_attention
from spec_adapters.hf_names import llama_name_map

transformers = pytest.importorskip("transformers")
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

F64 = torch.float64
CACHE_KW = "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"
THETA = 10000.0
EPS = 1e-6  # Qwen3's own default rms_norm_eps, not the protocol's 1e-5: the norms must read the config's
# V=61, d=48, H=6, Hkv=2 (n_rep 3), d_head=8, d_ff=80, 2 layers, ctx 24
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
    qk_norm=True,
)


@pytest.fixture
def float64_qwen3(monkeypatch):
    """Qwen3's RMSNorm and RoPE tables in float64 (stock: float32), transformers' formulas otherwise."""
    from transformers.models.qwen3 import modeling_qwen3 as mq

    def rmsnorm64(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary64(self, x, position_ids):
        d = 2 * self.inv_freq.shape[-1]
        inv_freq = THETA ** (-torch.arange(0, d, 2, dtype=F64, device=x.device) / d)
        emb = (position_ids[..., None].to(F64) * inv_freq).repeat(1, 1, 2)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(mq.Qwen3RMSNorm, "forward", rmsnorm64)
    monkeypatch.setattr(mq.Qwen3RotaryEmbedding, "forward", rotary64)


@torch.no_grad()
def qwen3(seed: int, attn: str = "sdpa"):
    """A float64 ``Qwen3ForCausalLM`` of ``CFG`` with O(1) random weights (norm gains 1 + N(0, 0.3²), so a norm
    placed or shared wrongly shows) and its canonical state dict."""
    config = Qwen3Config(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=24,
        rms_norm_eps=EPS,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        tie_word_embeddings=True,
        attention_bias=False,
        attention_dropout=0.0,
        attn_implementation=attn,  # eager takes the softmax in float32; sdpa stays float64
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen3ForCausalLM(config).to(F64).eval()
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=F64)
        p.copy_(1 + 0.3 * r if name.endswith("norm.weight") else 0.2 * r)
    hf = dict(model.named_parameters())
    sd = {ours: hf[theirs].detach() for ours, theirs in llama_name_map(2, tied=True, qk_norm=True).items()}
    assert len(sd) == len(hf)  # every Qwen3 parameter has its canonical name (q_norm, k_norm included)
    return model, sd


def reference(sd, **changes):
    before = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        return R.build_model(dict(CFG, **changes), sd, rope_style="half").eval()
    finally:
        torch.set_default_dtype(before)


def ids_for(batch, length, seed):
    return torch.randint(0, 61, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_match_qwen3(float64_qwen3):
    """The reference with qk_norm computes Qwen3's logits (GQA, eps 1e-6); without the norms it does not."""
    hf, sd = qwen3(seed=0)
    ids = ids_for(3, 17, seed=0)
    want = hf(ids).logits
    torch.testing.assert_close(R.forward(reference(sd), ids), want, atol=1e-10, rtol=0)
    plain = {k: v for k, v in sd.items() if "q_norm" not in k and "k_norm" not in k}
    assert (R.forward(reference(plain, qk_norm=False), ids) - want).abs().max() > 0.1


@torch.no_grad()
def test_stock_qwen3_logits_match_within_float32():
    """Stock Qwen3 (float32 RMSNorm and RoPE tables) agrees to float32 rounding: the patch changes no formula."""
    hf, sd = qwen3(seed=1, attn="eager")
    ids = ids_for(2, 13, seed=1)
    torch.testing.assert_close(R.forward(reference(sd), ids), hf(ids).logits, atol=2e-5, rtol=0)


@torch.no_grad()
def test_cached_decoding_matches_qwen3(float64_qwen3):
    """Prefill then one token at a time: logits per step, and the cached keys (normalised, then rotated) and
    values of every layer, equal Qwen3's ``DynamicCache``."""
    hf, sd = qwen3(seed=2)
    ref, ids = reference(sd), ids_for(2, 11, seed=2)
    out = hf(ids[:, :5], use_cache=True)
    hf_cache = out.past_key_values if getattr(out, "cache", None) is None else out.cache
    cache = R.new_cache(ref, 2)
    torch.testing.assert_close(R.forward(ref, ids[:, :5], cache), out.logits, atol=1e-10, rtol=0)
    for t in range(5, ids.shape[1]):
        out = hf(ids[:, t : t + 1], use_cache=True, **{CACHE_KW: hf_cache})
        torch.testing.assert_close(R.forward(ref, ids[:, t : t + 1], cache), out.logits, atol=1e-10, rtol=0)
    for layer in range(2):
        k, v = R.cache_kv(cache, layer)
        assert k.shape == (2, 2, 11, 8)
        torch.testing.assert_close(k, hf_cache.layers[layer].keys, atol=1e-10, rtol=0)
        torch.testing.assert_close(v, hf_cache.layers[layer].values, atol=1e-10, rtol=0)


# ------------------------------------------------------------------ identities (no transformers code)

H, HKV, D_HEAD, D = 4, 2, 6, 24


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)
    gain = lambda: 1 + 0.3 * r(D_HEAD)
    return r(2, 7, D), r(H * D_HEAD, D), r(HKV * D_HEAD, D), r(HKV * D_HEAD, D), r(D, H * D_HEAD), gain(), gain()


def attend(x, wq, wk, wv, wo, qn, kn, **kw):
    return multihead_self_attention(x, wq, wk, wv, wo, H, HKV, THETA, q_norm=qn, k_norm=kn, norm_eps=1e-30, **kw)


def test_scaling_one_head_changes_nothing():
    """A per-head norm forgets each head's scale: scaling one query head's and one key head's projection rows
    (by 7 and 1/5) leaves the output as it was (eps negligible). A norm over all heads together would not."""
    x, wq, wk, wv, wo, qn, kn = weights(1)
    wq2, wk2 = wq.clone(), wk.clone()
    wq2[D_HEAD : 2 * D_HEAD] *= 7.0
    wk2[:D_HEAD] /= 5.0
    torch.testing.assert_close(attend(x, wq2, wk2, wv, wo, qn, kn), attend(x, wq, wk, wv, wo, qn, kn))
    assert (attend(x, wq2, wk2, wv, wo, None, None) - attend(x, wq, wk, wv, wo, None, None)).abs().max() > 0.1


def test_values_are_not_normalised():
    """Values pass unnormalised: scaling wv by 3 scales the output by 3 (attention weights see only q and k)."""
    x, wq, wk, wv, wo, qn, kn = weights(2)
    torch.testing.assert_close(attend(x, wq, wk, 3 * wv, wo, qn, kn), 3 * attend(x, wq, wk, wv, wo, qn, kn))


@pytest.mark.parametrize("bad", [{"family": "gpt2", "qk_norm": True}, {"qk_norm": "yes"}])
def test_bad_qk_norm_raises(bad):
    cfg = dict(vocab_size=50, context_length=16, d_model=D, n_layers=1, n_heads=H, d_ff=32, **bad)
    with pytest.raises(ValueError, match="qk_norm"):
        R.build_model(cfg)


def test_fresh_norm_weights_are_ones():
    model = R.build_model(
        dict(vocab_size=50, context_length=16, d_model=D, n_layers=2, n_heads=H, d_ff=32, qk_norm=True)
    )
    sd = R.canonical_state_dict(model)
    for i in range(2):
        for name in ("q_norm", "k_norm"):
            assert torch.equal(sd[f"layers.{i}.attn.{name}.weight"], torch.ones(D_HEAD))
