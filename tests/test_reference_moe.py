"""The reference's moe (amendment 28) against transformers' Mixtral and against identities of its own.

Mixtral's ``MixtralSparseMoeBlock``: the router ``MixtralTopKRouter`` (``gate.weight [E, d]``) takes
``softmax(router_logits.float())`` over the experts, keeps ``torch.topk`` of ``num_experts_per_tok`` and renormalises
them to sum 1; ``MixtralExperts`` holds the experts fused, ``gate_up_proj [E, 2f, d]`` (the gate's ``f`` rows first,
then up's) and ``down_proj [E, d, f]``, each expert a SwiGLU (``act_fn(gate) * up``, SiLU). The canonical weights are
those split per expert. Stock transformers takes the router's softmax (and RMSNorm, and the RoPE tables) in float32;
the float64 checks make those islands float64 (keeping transformers' formulas) so that they hold to 1e-10; stock
Mixtral is checked at float32 rounding. ``load_balancing_loss_func`` of one layer's logits is the reference's
``moe_load_balancing_loss`` (transformers accumulates its counts in float32).
"""

from __future__ import annotations

import pytest
import torch

import reference as R
from spec_adapters.hf_names import llama_name_map

transformers = pytest.importorskip("transformers")
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402
from transformers.models.mixtral import modeling_mixtral as mm  # noqa: E402

F64 = torch.float64
THETA = 10000.0
E, K, D, F = 5, 2, 48, 40  # experts, per token, d_model, d_ff (all distinct)
CFG = dict(
    vocab_size=61,
    context_length=24,
    d_model=D,
    n_layers=2,
    n_heads=6,
    n_kv_heads=2,
    d_ff=F,
    rope_theta=THETA,
    norm_eps=1e-5,
    family="llama",
    n_experts=E,
    n_experts_per_token=K,
)


@pytest.fixture
def float64_mixtral(monkeypatch):
    """Mixtral's router softmax, RMSNorm and RoPE tables in float64 (stock: float32), its formulas otherwise."""

    def router64(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = torch.nn.functional.linear(hidden_states, self.weight)
        router_probs = torch.nn.functional.softmax(router_logits, dim=-1)  # no .float()
        top, indices = torch.topk(router_probs, self.top_k, dim=-1)
        return router_logits, top / top.sum(dim=-1, keepdim=True), indices

    def rmsnorm64(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary64(self, x, position_ids):
        d = 2 * self.inv_freq.shape[-1]
        inv_freq = THETA ** (-torch.arange(0, d, 2, dtype=F64, device=x.device) / d)
        emb = (position_ids[..., None].to(F64) * inv_freq).repeat(1, 1, 2)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(mm.MixtralTopKRouter, "forward", router64)
    monkeypatch.setattr(mm.MixtralRMSNorm, "forward", rmsnorm64)
    monkeypatch.setattr(mm.MixtralRotaryEmbedding, "forward", rotary64)


def mixtral_config(attn: str = "sdpa") -> MixtralConfig:
    return MixtralConfig(
        vocab_size=61,
        hidden_size=D,
        intermediate_size=F,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=E,
        num_experts_per_tok=K,
        max_position_embeddings=24,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        sliding_window=None,
        tie_word_embeddings=True,
        router_jitter_noise=0.0,
        attention_dropout=0.0,
        attn_implementation=attn,
        experts_implementation="eager",  # the loop over experts (grouped_mm takes no float64)
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def canonical_moe(prefix: str, hf: dict, ours: str) -> dict:
    """The canonical router and expert weights under ``ours`` (``layers.{i}.mlp``) from Mixtral's block ``prefix``."""
    gate_up, down = hf[f"{prefix}.experts.gate_up_proj"], hf[f"{prefix}.experts.down_proj"]
    sd = {f"{ours}.router.weight": hf[f"{prefix}.gate.weight"]}
    for e in range(gate_up.shape[0]):
        sd[f"{ours}.experts.{e}.w_gate.weight"] = gate_up[e, :F]
        sd[f"{ours}.experts.{e}.w_up.weight"] = gate_up[e, F:]
        sd[f"{ours}.experts.{e}.w_down.weight"] = down[e]
    return sd


@torch.no_grad()
def mixtral(seed: int, attn: str = "sdpa"):
    """A float64 ``MixtralForCausalLM`` with O(1) random weights (norm gains 1 + N(0, 0.3²)) and its canonical state
    dict: the attention and norms by ``llama_name_map``, each layer's router and experts split by ``canonical_moe``."""
    model = MixtralForCausalLM(mixtral_config(attn)).to(F64).eval()
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        r = torch.randn(p.shape, generator=g, dtype=F64)
        p.copy_(1 + 0.3 * r if name.endswith("norm.weight") else 0.2 * r)
    hf = {k: v.detach() for k, v in model.named_parameters()}
    dense = {"mlp.w_gate.weight", "mlp.w_up.weight", "mlp.w_down.weight"}
    sd = {
        ours: hf[theirs] for ours, theirs in llama_name_map(2, tied=True).items() if ours.split(".", 2)[-1] not in dense
    }
    for i in range(2):
        sd.update(canonical_moe(f"model.layers.{i}.mlp", hf, f"layers.{i}.mlp"))
    assert len(sd) == len(hf) + 2 * (1 + 3 * E - 3)  # per layer: router, gate_up, down -> router, 3 per expert
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


def block(seed: int, dtype=F64):
    """A ``MixtralSparseMoeBlock`` with N(0, 1/d) weights (the router's x3: logits of a few units) and x ``[2, 9, D]``;
    the block and ``moe_mlp``'s arguments."""
    moe = mm.MixtralSparseMoeBlock(mixtral_config()).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            fan_in = p.shape[-1]
            p.copy_(
                torch.randn(p.shape, generator=g, dtype=F64) / fan_in**0.5 * (3.0 if "gate.weight" in name else 1.0)
            )
    x = torch.randn(2, 9, D, generator=g, dtype=F64).to(dtype)
    gate_up, down = moe.experts.gate_up_proj.detach(), moe.experts.down_proj.detach()
    return moe, (x, moe.gate.weight.detach(), gate_up[:, :F], gate_up[:, F:], down)


@torch.no_grad()
def test_moe_mlp_matches_mixtral_block(float64_mixtral):
    """moe_mlp of the split weights computes MixtralSparseMoeBlock (top 2 of 5, float64 router)."""
    moe, args = block(seed=0)
    torch.testing.assert_close(R.moe_mlp(*args, top_k=K), moe(args[0]), atol=1e-12, rtol=0)


@torch.no_grad()
def test_stock_mixtral_block_matches_within_float32():
    """Stock Mixtral (its router's softmax in float32) agrees at float32 rounding, in float32 as in float64."""
    for dtype, tol in ((F64, 1e-6), (torch.float32, 1e-5)):
        moe, args = block(seed=1, dtype=dtype)
        out = R.moe_mlp(*args, top_k=K)
        assert out.dtype == dtype
        torch.testing.assert_close(out, moe(args[0]), atol=tol, rtol=0)


@torch.no_grad()
def test_logits_match_mixtral(float64_mixtral):
    """The reference with n_experts=5, n_experts_per_token=2 computes MixtralForCausalLM's logits; with a different
    top-k it does not."""
    hf, sd = mixtral(seed=0)
    ids = ids_for(3, 17, seed=0)
    want = hf(ids).logits
    torch.testing.assert_close(R.forward(reference(sd), ids), want, atol=1e-10, rtol=0)
    assert (R.forward(reference(sd, n_experts_per_token=1), ids) - want).abs().max() > 0.01


@torch.no_grad()
def test_stock_mixtral_logits_match_within_float32():
    hf, sd = mixtral(seed=1, attn="eager")
    ids = ids_for(2, 13, seed=1)
    torch.testing.assert_close(R.forward(reference(sd), ids), hf(ids).logits, atol=2e-5, rtol=0)


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_loss_matches_load_balancing_loss_func(top_k):
    """moe_load_balancing_loss of one layer's router logits is transformers' load_balancing_loss_func((logits,), E,
    top_k) (which counts in float32)."""
    logits = torch.randn(37, E, generator=torch.Generator().manual_seed(top_k), dtype=F64) * 2
    want = mm.load_balancing_loss_func((logits,), E, top_k)
    torch.testing.assert_close(R.moe_load_balancing_loss(logits, top_k), want.to(F64), atol=1e-6, rtol=0)


# ------------------------------------------------------------------ identities (no transformers code)


def weights(seed=0, n_experts=E):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)
    return (
        r(2, 7, D),
        r(n_experts, D) * 0.5,
        r(n_experts, F, D) / D**0.5,
        r(n_experts, F, D) / D**0.5,
        r(n_experts, D, F),
    )


def test_every_expert_is_the_softmax_mixture():
    x, router, wg, wu, wd = weights(1)
    p = torch.softmax(x @ router.T, dim=-1)
    dense = sum(p[..., e, None] * R.swiglu(x, wg[e], wu[e], wd[e]) for e in range(E))
    torch.testing.assert_close(R.moe_mlp(x, router, wg, wu, wd, top_k=E), dense)


def test_top_1_is_the_argmax_expert():
    x, router, wg, wu, wd = weights(2)
    best = (x @ router.T).argmax(-1)
    want = torch.stack([R.swiglu(x, wg[e], wu[e], wd[e]) for e in range(E)], dim=-2)
    want = want.gather(-2, best[..., None, None].expand(*best.shape, 1, D)).squeeze(-2)
    torch.testing.assert_close(R.moe_mlp(x, router, wg, wu, wd, top_k=1), want)


def test_identical_experts_give_their_swiglu():
    """The renormalised weights sum to 1: identical experts give their SwiGLU, whatever the routing."""
    x, router, wg, wu, wd = weights(3)
    same = [w[:1].expand_as(w) for w in (wg, wu, wd)]
    torch.testing.assert_close(R.moe_mlp(x, router, *same, top_k=2), R.swiglu(x, wg[0], wu[0], wd[0]))


def test_unchosen_expert_gets_no_gradient():
    x, router, wg, wu, wd = weights(4)
    router = router.clone()
    router[E - 1] = (router[0] + router[1]) / 2  # never above both: never the top 1
    ws = [w.clone().requires_grad_() for w in (wg, wu, wd)]
    R.moe_mlp(x, router, *ws, top_k=1).pow(2).sum().backward()
    for w in ws:
        assert torch.count_nonzero(w.grad[E - 1]) == 0 and torch.count_nonzero(w.grad[0]) > 0


def test_uniform_router_loss_is_top_k():
    for top_k in range(1, E + 1):
        assert R.moe_load_balancing_loss(torch.zeros(10, E, dtype=F64), top_k).item() == pytest.approx(top_k)


@pytest.mark.parametrize(
    "bad",
    [
        {"n_experts_per_token": 0},
        {"n_experts_per_token": E + 1},
        {"n_experts_per_token": None},
        {"n_experts": -1},
        {"n_experts": 0},
        {"family": "gpt2"},
        {"geglu": True},
    ],
)
def test_bad_moe_config_raises(bad):
    cfg = {k: v for k, v in dict(CFG, **bad).items() if v is not None}
    with pytest.raises(ValueError, match="n_experts"):
        R.build_model(cfg)


@pytest.mark.parametrize("top_k", [0, E + 1, 1.5, True])
def test_bad_top_k_raises(top_k):
    x, router, wg, wu, wd = weights(5)
    with pytest.raises(ValueError, match="top_k"):
        R.moe_mlp(x, router, wg, wu, wd, top_k=top_k)
    with pytest.raises(ValueError, match="top_k"):
        R.moe_load_balancing_loss(x[0] @ router.T, top_k)


def test_fresh_moe_model_names_and_init():
    sd = R.canonical_state_dict(R.build_model(CFG))
    assert "layers.0.mlp.w_gate.weight" not in sd and sd["layers.1.mlp.router.weight"].shape == (E, D)
    assert sd[f"layers.0.mlp.experts.{E - 1}.w_down.weight"].shape == (D, F)
    residual = torch.cat(
        [sd[f"layers.{i}.mlp.experts.{e}.w_down.weight"].flatten() for i in range(2) for e in range(E)]
    )
    assert residual.std().item() == pytest.approx(0.02 / 2, rel=0.1)  # 0.02 / sqrt(2 n_layers)
