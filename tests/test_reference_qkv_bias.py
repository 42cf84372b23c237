"""The reference's qkv_bias (amendment 22) against identities that do not use its code paths."""

import pytest
import torch
from einops import repeat

from reference import build_model, canonical_state_dict, forward
from reference.attention import multihead_self_attention

H, HKV, D_HEAD, D = 4, 2, 6, 24


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(2, 7, D), r(H * D_HEAD, D), r(HKV * D_HEAD, D), r(HKV * D_HEAD, D), r(D, H * D_HEAD), r(HKV * D_HEAD)


def test_value_bias_adds_wo_times_the_bias_to_every_output():
    """Softmax weights sum to 1, so a value bias bv adds wo @ (bv repeated to every query head) everywhere."""
    x, wq, wk, wv, wo, b = weights()
    plain = multihead_self_attention(x, wq, wk, wv, wo, H, HKV, 10000.0)
    biased = multihead_self_attention(x, wq, wk, wv, wo, H, HKV, 10000.0, bv=b)
    per_query_head = repeat(b, "(h d) -> (h rep d)", h=HKV, rep=H // HKV)
    torch.testing.assert_close(biased, plain + wo @ per_query_head)


def test_key_bias_without_rope_changes_nothing():
    """Without RoPE a key bias adds q . bk to every key's score of a query: softmax is shift-invariant."""
    x, wq, wk, wv, wo, b = weights(1)
    plain = multihead_self_attention(x, wq, wk, wv, wo, H, HKV)
    torch.testing.assert_close(multihead_self_attention(x, wq, wk, wv, wo, H, HKV, bk=b), plain)


def test_model_with_zero_biases_equals_the_model_without():
    cfg = dict(vocab_size=50, context_length=16, d_model=D, n_layers=2, n_heads=H, n_kv_heads=HKV, d_ff=32)
    torch.manual_seed(0)
    plain = build_model(cfg).double()
    sd = canonical_state_dict(plain)
    biased = {
        **sd,
        **{
            f"layers.{i}.attn.w{p}.bias": torch.zeros(sd[f"layers.{i}.attn.w{p}.weight"].shape[0], dtype=torch.float64)
            for i in range(2)
            for p in "qkv"
        },
    }
    model = build_model(dict(cfg, qkv_bias=True), biased).double()
    ids = torch.randint(0, 50, (2, 9))
    torch.testing.assert_close(forward(model, ids), forward(plain, ids))
    assert not any(k.endswith(("wo.bias", "mlp.w_gate.bias")) for k in canonical_state_dict(model))


@pytest.mark.parametrize("bad", [{"family": "gpt2", "qkv_bias": True}, {"qkv_bias": 1}])
def test_bad_qkv_bias_raises(bad):
    cfg = dict(vocab_size=50, context_length=16, d_model=D, n_layers=1, n_heads=H, d_ff=32, **bad)
    with pytest.raises(ValueError, match="qkv_bias"):
        build_model(cfg)
