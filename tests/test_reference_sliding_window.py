"""The reference's sliding-window attention (amendment 27) against transformers' Mistral, Ministral and Qwen2.

Mistral applies its window on every layer; Ministral and Qwen2 take a per-layer ``layer_types`` pattern (Qwen2
derives it from ``max_window_layers``: full below, sliding from there). transformers' mask is
``kv_idx > q_idx - sliding_window`` (``masking_utils.sliding_window_overlay``): query i sees the W keys
``i - W < j <= i``, itself included, which is the reference's rule. Stock transformers computes RMSNorm, the RoPE
tables and the softmax in float32, so the models agree to float32 rounding (``HF_ATOL``, as
``test_reference_hf.py`` measured); a window one key wider or narrower moves the logits by far more, which is
asserted too, so the comparison discriminates.
"""

from __future__ import annotations

import pytest
import torch

import reference as R
from reference.attention import causal_mask
from spec_adapters.hf_names import llama_name_map

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    MinistralConfig,
    MinistralForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.masking_utils import sliding_window_overlay  # noqa: E402

F64 = torch.float64
HF_ATOL = 2e-5
W = 5
# V=61, d=48, H=6, Hkv=2, d_head=8, d_ff=80, 3 layers, ctx 32; batch 2, T 23 (more than four windows)
CFG = dict(vocab_size=61, context_length=32, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=80, norm_eps=1e-5)
T = 23
PATTERN = ["sliding_attention", "full_attention", "sliding_attention"]  # Gemma 2's alternation, from sliding


def hf_kwargs(**extra) -> dict:
    return dict(
        vocab_size=CFG["vocab_size"],
        hidden_size=CFG["d_model"],
        intermediate_size=CFG["d_ff"],
        num_hidden_layers=CFG["n_layers"],
        num_attention_heads=CFG["n_heads"],
        num_key_value_heads=CFG["n_kv_heads"],
        max_position_embeddings=CFG["context_length"],
        rms_norm_eps=CFG["norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        attention_dropout=0.0,
        hidden_act="silu",
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )


def randomized(model, seed: int):
    """``model`` in float64, eval mode, every weight drawn at a scale that keeps activations O(1)."""
    g = torch.Generator().manual_seed(seed)
    model = model.to(F64).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=F64))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=F64))
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=F64) / p.shape[-1] ** 0.5)
    return model


def canonical(model, *, biases: bool = False) -> dict:
    hf = dict(model.named_parameters())
    sd = {ours: hf[theirs].detach() for ours, theirs in llama_name_map(CFG["n_layers"], tied=True).items()}
    if biases:
        for i in range(CFG["n_layers"]):
            for p in "qkv":
                sd[f"layers.{i}.attn.w{p}.bias"] = hf[f"model.layers.{i}.self_attn.{p}_proj.bias"].detach()
    return sd


def reference(sd: dict, **extra):
    return R.build_model(dict(CFG, **extra), sd, rope_style="half").to(F64).eval()


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CFG["vocab_size"], (2, T), generator=torch.Generator().manual_seed(seed))


def mistral(seed: int = 0):
    return randomized(MistralForCausalLM(MistralConfig(**hf_kwargs(sliding_window=W))), seed)


@pytest.mark.parametrize("t_q,t_k", [(7, 7), (3, 11), (1, 9)])
def test_mask_is_transformers_sliding_overlay(t_q, t_k):
    """causal_mask(..., window=W) is transformers' causal mask and ``kv_idx > q_idx - W``, queries at the end."""
    q_idx = torch.arange(t_k - t_q, t_k)[:, None]
    kv_idx = torch.arange(t_k)[None, :]
    theirs = (kv_idx <= q_idx) & sliding_window_overlay(W)(0, 0, q_idx, kv_idx)
    assert torch.equal(causal_mask(t_q, t_k, window=W), theirs)
    assert (causal_mask(t_q, t_k, window=W).sum(-1) <= W).all()  # exactly W keys once the window is full


def test_mistral_logits_equal_the_reference():
    """Every layer sliding (Mistral): the reference's logits are transformers' past the window."""
    model = mistral()
    x = ids()
    with torch.no_grad():
        theirs = model(input_ids=x, use_cache=False).logits
    ours = R.forward(reference(canonical(model), sliding_window=W), x)
    torch.testing.assert_close(ours, theirs, atol=HF_ATOL, rtol=0)
    for wrong in (W - 1, W + 1, None):  # the comparison tells a window one key off, and no window at all
        other = R.forward(reference(canonical(model), sliding_window=wrong), x)
        assert (other - theirs).abs().max() > 1e-2, wrong


def test_mistral_cached_chunks_equal_the_reference():
    """transformers' cache for a sliding config (DynamicSlidingWindowLayer: the last W - 1 entries) gives the
    reference's logits in chunks past the window, and holds a suffix of the reference's cache."""
    model = mistral(1)
    x = ids(1)
    ref = reference(canonical(model), sliding_window=W)
    cache = transformers.DynamicCache(config=model.config)
    ref_cache = R.new_cache(ref, 2)
    start = 0
    for n in (7, 1, 1, 9, 5):
        with torch.no_grad():
            theirs = model(input_ids=x[:, start : start + n], cache=cache, use_cache=True).logits
        torch.testing.assert_close(R.forward(ref, x[:, start : start + n], ref_cache), theirs, atol=HF_ATOL, rtol=0)
        start += n
    for layer in range(CFG["n_layers"]):
        k, v = cache.layers[layer].keys, cache.layers[layer].values
        assert k.shape[-2] == W - 1  # what transformers keeps: enough for the next query's window
        rk, rv = R.cache_kv(ref_cache, layer)
        torch.testing.assert_close(k, rk[..., -(W - 1) :, :], atol=HF_ATOL, rtol=0)
        torch.testing.assert_close(v, rv[..., -(W - 1) :, :], atol=HF_ATOL, rtol=0)


def test_ministral_layer_types_equal_the_reference():
    """A per-layer pattern (Ministral's layer_types): sliding layers windowed, the full layer not."""
    config = MinistralConfig(**hf_kwargs(sliding_window=W, layer_types=PATTERN, head_dim=8))
    model = randomized(MinistralForCausalLM(config), 2)
    x = ids(2)
    with torch.no_grad():
        theirs = model(input_ids=x, use_cache=False).logits
    ours = R.forward(reference(canonical(model), sliding_window=W, layer_types=PATTERN), x)
    torch.testing.assert_close(ours, theirs, atol=HF_ATOL, rtol=0)
    every = R.forward(reference(canonical(model), sliding_window=W), x)  # the pattern ignored: every layer sliding
    assert (every - theirs).abs().max() > 1e-2


def test_qwen2_max_window_layers_equal_the_reference():
    """Qwen2's max_window_layers = 1 (full below, sliding from layer 1) is layer_types [full, sliding, sliding]."""
    config = Qwen2Config(**hf_kwargs(use_sliding_window=True, sliding_window=W, max_window_layers=1))
    pattern = ["full_attention", "sliding_attention", "sliding_attention"]
    assert list(config.layer_types) == pattern
    model = randomized(Qwen2ForCausalLM(config), 3)
    x = ids(3)
    with torch.no_grad():
        theirs = model(input_ids=x, use_cache=False).logits
    ours = R.forward(reference(canonical(model, biases=True), sliding_window=W, layer_types=pattern, qkv_bias=True), x)
    torch.testing.assert_close(ours, theirs, atol=HF_ATOL, rtol=0)


@pytest.mark.parametrize(
    "bad,word",
    [
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": -3}, "sliding_window"),
        ({"sliding_window": 4.0}, "sliding_window"),
        ({"sliding_window": True}, "sliding_window"),
        ({"sliding_window": 4, "layer_types": ["sliding_attention"] * 2}, "layer_types"),
        ({"sliding_window": 4, "layer_types": ["sliding_attention", "local", "full_attention"]}, "local"),
        ({"layer_types": ["sliding_attention", "full_attention", "full_attention"]}, "sliding_window"),
    ],
)
def test_bad_sliding_window_raises(bad, word):
    with pytest.raises(ValueError, match=word):
        R.build_model(dict(CFG, **bad))


def test_without_a_window_the_config_is_v1():
    """No window, or every layer full, is the causal model of v1 exactly."""
    sd = canonical(mistral(4))
    plain = reference(sd)
    x = ids(4)
    full = reference(sd, layer_types=["full_attention"] * 3)
    wide = reference(sd, sliding_window=T)  # a window as long as the sequence: nothing is cut
    torch.testing.assert_close(R.forward(full, x), R.forward(plain, x), atol=0, rtol=0)
    torch.testing.assert_close(R.forward(wide, x), R.forward(plain, x), atol=1e-12, rtol=0)
