"""The reference against Hugging Face transformers' LlamaForCausalLM and GPT2LMHeadModel with random weights.

HF weights are mapped to canonical names; the reference Llama is built with ``rope_style="half"``
(HF's ``rotate_half`` pairs channels ``(i, i + d_head/2)``), so q/k rows need no permutation.
GPT-2 uses ``Conv1D`` (weights ``[in, out]``, transposed relative to nn.Linear) and one fused
``c_attn`` whose output columns are ``[q | k | v]``.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from spec_adapters.hf_names import llama_name_map

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

import reference as R  # noqa: E402

F64 = torch.float64
THETA = 10000.0
# Llama: V=61, d=48, H=6, Hkv=2 (n_rep 3), d_head=8, d_ff=80, 2 layers, ctx 24; batch 3, T 17
LLAMA = dict(
    vocab_size=61,
    context_length=24,
    d_model=48,
    n_layers=2,
    n_heads=6,
    n_kv_heads=2,
    d_ff=80,
    rope_theta=THETA,
    norm_eps=1e-5,
    family="llama",
)
# GPT-2: V=53, d=40, H=5, d_head=8, d_ff=88, 2 layers, ctx 22; batch 3, T 19
GPT2 = dict(vocab_size=53, context_length=22, d_model=40, n_layers=2, n_heads=5, d_ff=88, norm_eps=1e-5, family="gpt2")
# Stock HF Llama is not float64 end to end even after .double(): LlamaRMSNorm casts its input to float32
# (`hidden_states.to(torch.float32)`), LlamaRotaryEmbedding computes inv_freq and cos/sin in float32, and the
# eager path takes the softmax in float32. With O(1) random weights that leaves a float32-sized discrepancy:
# measured max |logit diff| 2.1e-6 .. 4.4e-6 over 4 weight seeds, on logits up to ~6 (both "eager" and "sdpa").
# 2e-5 is ~5x the worst of those, while a wrong RoPE pairing is off by > 5 (asserted > 0.1 below), so the
# tolerance still discriminates. test_llama_logits_match_float64_hf removes the float32 islands and gets 1e-10.
HF_STOCK_ATOL = 2e-5

FORWARD_PARAMS = inspect.signature(LlamaForCausalLM.forward).parameters
CACHE_KW = "cache" if "cache" in FORWARD_PARAMS else "past_key_values"  # renamed in transformers 5


def out_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def hf_cache_kv(cache, layer):
    """(keys, values) of one layer of an HF DynamicCache, [B, Hkv, T, d_head]."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


@torch.no_grad()
def randomize_hf(model, seed, is_norm):
    """O(1) random weights (HF's own init gives near-uniform logits): matrices N(0, 0.2), norm weights
    1 + N(0, 0.2), norm biases and other biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=F64)
        if is_norm(name) and name.endswith("weight"):
            p.copy_(1 + 0.2 * r)
        elif name.endswith("bias"):
            p.copy_(0.1 * r)
        else:
            p.copy_(0.2 * r)
    return model


def build_reference(cfg, sd, **kwargs):
    """A float64 reference model from a canonical state dict (built in float64 so no weight is rounded)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        return R.build_model(cfg, sd, **kwargs).eval()
    finally:
        torch.set_default_dtype(before)


def hf_llama(attn="sdpa", seed=0):
    rope = (
        {"rope_parameters": {"rope_type": "default", "rope_theta": THETA}}
        if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters
        else {"rope_theta": THETA}
    )
    config = LlamaConfig(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=24,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        attn_implementation=attn,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **rope,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(F64).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied as configured
    inv_freq = model.model.rotary_emb.inv_freq  # theta reached the model, whatever the config API
    torch.testing.assert_close(inv_freq, THETA ** (-torch.arange(0, 8, 2, dtype=F64) / 8), atol=1e-7, rtol=0)
    randomize_hf(model, seed, lambda n: "norm" in n)
    hf = dict(model.named_parameters())
    sd = {ours: hf[theirs].detach() for ours, theirs in llama_name_map(2, tied=True).items()}
    return model, sd


def hf_gpt2(attn="eager", seed=0):
    config = GPT2Config(
        vocab_size=53,
        n_positions=22,
        n_embd=40,
        n_layer=2,
        n_head=5,
        n_inner=88,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        attn_implementation=attn,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).to(F64).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    randomize_hf(model, seed, lambda n: ".ln_" in n or "ln_f" in n)
    hf = {k: v.detach() for k, v in model.named_parameters()}
    d = 40
    sd = {
        "tok_embeddings.weight": hf["transformer.wte.weight"],
        "pos_embeddings.weight": hf["transformer.wpe.weight"],
        "final_norm.weight": hf["transformer.ln_f.weight"],
        "final_norm.bias": hf["transformer.ln_f.bias"],
    }
    for i in range(2):
        p, c = f"transformer.h.{i}.", f"layers.{i}."
        w, b = hf[p + "attn.c_attn.weight"], hf[p + "attn.c_attn.bias"]  # Conv1D: [in, 3*d], columns [q | k | v]
        for j, name in enumerate(("wq", "wk", "wv")):
            sd[c + f"attn.{name}.weight"] = w[:, j * d : (j + 1) * d].T
            sd[c + f"attn.{name}.bias"] = b[j * d : (j + 1) * d]
        for theirs, ours in (("attn.c_proj", "attn.wo"), ("mlp.c_fc", "mlp.w_fc"), ("mlp.c_proj", "mlp.w_proj")):
            sd[c + ours + ".weight"] = hf[p + theirs + ".weight"].T  # Conv1D [in, out] -> Linear [out, in]
            sd[c + ours + ".bias"] = hf[p + theirs + ".bias"]
        for theirs, ours in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            sd[c + ours + ".weight"], sd[c + ours + ".bias"] = hf[p + theirs + ".weight"], hf[p + theirs + ".bias"]
    return model, sd


@pytest.fixture
def float64_llama(monkeypatch):
    """Remove stock HF Llama's two float32 islands (RMSNorm and RoPE cos/sin), keeping HF's formulas otherwise."""
    from transformers.models.llama import modeling_llama as ml

    def rmsnorm64(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary64(self, x, position_ids):
        d = 2 * self.inv_freq.shape[-1]
        inv_freq = THETA ** (-torch.arange(0, d, 2, dtype=F64, device=x.device) / d)
        freqs = position_ids[..., None].to(F64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", rmsnorm64)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rotary64)


def ids_for(vocab, batch, length, seed=0):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- Llama


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_llama_logits_match_stock_hf(attn):
    """Reference logits equal stock HF LlamaForCausalLM's within float32-island tolerance; wrong RoPE pairing does
    not."""
    hf, sd = hf_llama(attn)
    ids = ids_for(61, 3, 17)
    with torch.no_grad():
        want = hf(ids).logits
        got = R.forward(build_reference(LLAMA, sd, rope_style="half"), ids)
        wrong = R.forward(build_reference(LLAMA, sd, rope_style="interleaved"), ids)
    assert want.abs().max() > 1.0  # logits are far from uniform
    torch.testing.assert_close(got, want, atol=HF_STOCK_ATOL, rtol=0)
    assert (wrong - want).abs().max() > 0.1


def test_llama_logits_match_float64_hf(float64_llama):
    """With HF's float32 RMSNorm/RoPE made float64 (sdpa attention), logits agree to 1e-10."""
    hf, sd = hf_llama("sdpa", seed=1)
    ids = ids_for(61, 3, 17, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(
            R.forward(build_reference(LLAMA, sd, rope_style="half"), ids), hf(ids).logits, atol=1e-10, rtol=0
        )


def assert_cached_decoding_matches(hf, ref, ids, prefill: int, kv_shape: tuple[int, ...]) -> None:
    """Prefill ``prefill`` tokens, then one token at a time: per-step logits, then the cached keys
    and values of every layer, equal HF's."""
    out = hf(ids[:, :prefill], use_cache=True)
    cache, hf_cache = R.new_cache(ref, ids.shape[0]), out_cache(out)
    torch.testing.assert_close(R.forward(ref, ids[:, :prefill], cache), out.logits, atol=1e-10, rtol=0)
    for t in range(prefill, ids.shape[1]):
        out = hf(ids[:, t : t + 1], use_cache=True, **{CACHE_KW: hf_cache})
        hf_cache = out_cache(out)
        torch.testing.assert_close(R.forward(ref, ids[:, t : t + 1], cache), out.logits, atol=1e-10, rtol=0)
    for layer in range(2):
        k, v = R.cache_kv(cache, layer)
        hk, hv = hf_cache_kv(hf_cache, layer)
        assert k.shape == hk.shape == kv_shape
        torch.testing.assert_close(k, hk, atol=1e-10, rtol=0)
        torch.testing.assert_close(v, hv, atol=1e-10, rtol=0)


@torch.no_grad()
def test_llama_cached_decoding_matches_hf(float64_llama):
    """Prefill then one token at a time: per-step logits and the cached post-RoPE keys and values equal HF's cache."""
    hf, sd = hf_llama("sdpa", seed=2)
    ref = build_reference(LLAMA, sd, rope_style="half")
    assert_cached_decoding_matches(hf, ref, ids_for(61, 3, 17, seed=2), prefill=6, kv_shape=(3, 2, 17, 8))


@torch.no_grad()
def test_llama_greedy_generation_matches_hf():
    """Greedy generate equals stock HF generate(do_sample=False) token for token, cache on and off."""
    hf, sd = hf_llama("sdpa", seed=3)
    ref = build_reference(LLAMA, sd, rope_style="half")
    prompt = ids_for(61, 3, 5, seed=3)
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=18, do_sample=False)
    assert want.shape == (3, 23)
    for use_cache in (True, False):
        assert torch.equal(R.generate(ref, prompt, 18, temperature=0.0, use_cache=use_cache), want)


# ----------------------------------------------------------------------------- GPT-2


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2_logits_match_hf(attn):
    """Reference gpt2 logits equal HF GPT2LMHeadModel's (Conv1D weights transposed, c_attn split) to 1e-10."""
    hf, sd = hf_gpt2(attn)
    ids = ids_for(53, 3, 19)
    with torch.no_grad():
        want = hf(ids).logits
        got = R.forward(build_reference(GPT2, sd), ids)
    assert want.abs().max() > 1.0
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@torch.no_grad()
def test_gpt2_cached_decoding_matches_hf():
    """Prefill then one token at a time: per-step logits and cached keys/values equal HF GPT-2's cache."""
    hf, sd = hf_gpt2("eager", seed=1)
    ref = build_reference(GPT2, sd)
    assert_cached_decoding_matches(hf, ref, ids_for(53, 3, 19, seed=1), prefill=7, kv_shape=(3, 5, 19, 8))


@torch.no_grad()
def test_gpt2_greedy_generation_matches_hf():
    """Greedy generate equals HF GPT-2 generate(do_sample=False) token for token, cache on and off."""
    hf, sd = hf_gpt2("sdpa", seed=2)
    ref = build_reference(GPT2, sd)
    prompt = ids_for(53, 3, 4, seed=2)
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=18, do_sample=False)
    assert want.shape == (3, 22)
    for use_cache in (True, False):
        assert torch.equal(R.generate(ref, prompt, 18, temperature=0.0, use_cache=use_cache), want)
