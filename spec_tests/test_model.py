"""The whole model: canonical weights, logits for both families (MHA and GQA), causality, batch
independence, weight tying, initialisation, parameter counts and configuration errors."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import inputs, models
from .assertions import assert_close, require, require_value_error
from .models import CONFIGS
from .strategies import seeds
from .tolerances import BIT_IDENTICAL, EXACT

pytestmark = pytest.mark.component("model")

DTYPES = [torch.float64, torch.float32]


@pytest.fixture(params=list(CONFIGS))
def config(request, impl):
    """Each test config (llama GQA, llama MHA untied, gpt2); skipped for families the impl lacks."""
    cfg = CONFIGS[request.param]
    impl.require_family(cfg["family"])
    return cfg


def ids_for(cfg, b=3, t=11, seed=0, device="cpu"):
    return inputs.token_ids(b, t, vocab=cfg["vocab_size"], seed=seed, device=device)


def test_canonical_state_dict_roundtrip(spec, config):
    """build_model(config, sd) loads canonical weights and canonical_state_dict returns them unchanged (protocol: canonical weight names)."""
    sd = models.random_state_dict(config, seed=1, device=spec.device)
    got = spec.impl.canonical_state_dict(models.build(spec.impl, config, sd))
    names = sorted(got)
    require(
        names == sorted(sd),
        component="model",
        behaviour="canonical_state_dict uses exactly the canonical names",
        found=f"missing {sorted(set(sd) - set(got))}, unexpected {sorted(set(got) - set(sd))}",
    )
    assert_close(
        {k: got[k] for k in sd}, sd, tol=EXACT, component="model", behaviour="weights come back as they were loaded"
    )


@pytest.mark.bug_class("layout", "attention_scale", "prenorm", "rope", "gqa", "mlp")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_logits_match_reference(spec, config, dtype):
    """Logits of a pre-norm decoder with the given canonical weights equal the reference's (course notes: decoder-only forward pass, add positions x = tok + pos; symptoms table: deep stack diverges, use pre-LN)."""
    sd = models.random_state_dict(config, seed=2, dtype=dtype, device=spec.device)
    ids = ids_for(config, seed=3, device=spec.device)
    spec.check(
        lambda m, sd, ids: models.logits(m, config, sd, ids),
        sd,
        ids,
        kind="model",
        component="model",
        behaviour=f"logits of the {config['family']} model (n_heads {config['n_heads']}, "
        f"n_kv_heads {models.n_kv(config)}) for ids [3, 11]",
    )


REQUIRED_KEYS = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff")


def test_config_defaults(spec, family):
    """Omitted config keys take protocol defaults: n_kv_heads = n_heads, rope_theta 10000, norm_eps 1e-5, tied, no dropout, family llama (protocol: Model)."""
    base = models.LLAMA_MHA if family == "llama" else models.GPT2
    minimal = {k: base[k] for k in REQUIRED_KEYS} | ({} if family == "llama" else {"family": "gpt2"})
    sd = models.random_state_dict(dict(minimal, n_kv_heads=minimal["n_heads"]), seed=11, device=spec.device)
    ids = ids_for(base, seed=12, device=spec.device)
    spec.check(
        lambda m, sd, ids: models.logits(m, minimal, sd, ids),
        sd,
        ids,
        kind="model",
        component="model",
        behaviour=f"logits of a {family} model configured only by {list(minimal)}",
    )


@pytest.mark.bug_class("causality")
@given(seed=seeds, cut=st.integers(1, 10))
def test_future_tokens_do_not_change_earlier_logits(spec, config, seed, cut):
    """Changing tokens from position t on leaves logits before t bit-identical (course notes: causal masking, symptom "model cheats")."""
    sd = models.random_state_dict(config, seed=4, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids = ids_for(config, b=2, seed=seed, device=spec.device)
    changed = ids.clone()
    changed[:, cut:] = (ids[:, cut:] + 1 + seed % 7) % config["vocab_size"]
    before, after = spec.impl.forward(model, ids), spec.impl.forward(model, changed)
    assert_close(
        after[:, :cut],
        before[:, :cut],
        tol=BIT_IDENTICAL,
        component="model",
        behaviour=f"logits before position {cut} ignore tokens from {cut} on",
    )


@pytest.mark.bug_class("batch")
def test_batch_rows_are_independent(spec, config):
    """Each sequence's logits are the same computed alone or in a batch of different sequences (course notes: shapes [B, T, ...])."""
    sd = models.random_state_dict(config, seed=5, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids = ids_for(config, b=3, seed=6, device=spec.device)
    batched = spec.impl.forward(model, ids)
    alone = torch.cat([spec.impl.forward(model, ids[b : b + 1]) for b in range(3)])
    assert_close(batched, alone, tol=EXACT, component="model", behaviour="row b of a batch equals sequence b alone")


def _embedding_parameter(spec, model):
    """The parameter behind tok_embeddings.weight (found through its storage)."""
    emb = spec.impl.canonical_state_dict(model)["tok_embeddings.weight"]
    found = [p for p in model.parameters() if p.data_ptr() == emb.data_ptr() and p.shape == emb.shape]
    require(
        len(found) == 1,
        component="model",
        behaviour="tok_embeddings.weight is a parameter of the model",
        found=f"{len(found)} parameters share its storage",
    )
    return found[0]


@pytest.mark.bug_class("tying")
def test_tied_head_is_the_embedding_parameter(spec, family):
    """With tie_embeddings the LM head is the embedding Parameter itself, with gradients from both uses (symptoms table: weights copied, not shared)."""
    config = models.LLAMA_GQA if family == "llama" else models.GPT2
    sd = models.random_state_dict(config, seed=7, device=spec.device)
    model = models.build(spec.impl, config, sd)
    v_by_d = [p for p in model.parameters() if tuple(p.shape) == (config["vocab_size"], config["d_model"])]
    require(
        len(v_by_d) == 1,
        component="model",
        behaviour="a tied model holds one [V, d_model] parameter",
        found=f"it holds {len(v_by_d)}: the head was copied, not shared",
    )
    emb = _embedding_parameter(spec, model)
    ids = ids_for(config, seed=8, device=spec.device)
    spec.impl.forward(model, ids).pow(2).mean().backward()

    def embedding_grad(m, sd, ids):
        ref_model = models.build(m, config, sd)
        m.forward(ref_model, ids).pow(2).mean().backward()
        return dict(ref_model.named_parameters())["tok_embeddings.weight"].grad

    expected = spec.expected(embedding_grad, sd, ids)
    assert_close(
        emb.grad,
        expected,
        tol=EXACT,
        component="model",
        behaviour="the embedding's gradient sums the lookup's and the LM head's contributions",
    )


INIT_CONFIG = dict(
    models.LLAMA_GQA, d_model=256, n_heads=8, n_kv_heads=2, d_ff=320, n_layers=4, vocab_size=300, tie_embeddings=False
)
RESIDUAL = ("attn.wo.weight", "mlp.w_down.weight", "mlp.w_proj.weight")


@pytest.mark.bug_class("init")
def test_initialisation_statistics(spec, family):
    """Fresh weights ~ N(0, 0.02), residual projections ~ N(0, 0.02/sqrt(2 n_layers)), norm weights 1, biases 0 (course notes: init std, residual projection scale)."""
    config = INIT_CONFIG if family == "llama" else dict(INIT_CONFIG, family="gpt2", n_kv_heads=8)
    torch.manual_seed(0)
    with models.default_dtype(torch.float64):
        sd = spec.impl.canonical_state_dict(spec.impl.build_model(config))
    residual_std = 0.02 / math.sqrt(2 * config["n_layers"])
    for name, w in sd.items():
        if name.endswith("norm.weight"):
            require(
                bool((w == 1).all()),
                component="init",
                behaviour="norm weights start at 1",
                found=f"{name} is not all 1",
            )
        elif name.endswith(".bias"):
            require(bool((w == 0).all()), component="init", behaviour="biases start at 0", found=f"{name} is not all 0")
        else:
            want = residual_std if name.endswith(RESIDUAL) else 0.02
            n = w.numel()
            # The sample std of n normal draws has relative standard error 1/sqrt(2n) (<= 0.9% here,
            # n >= 6400); 6% is >= 6.7 standard errors, and the residual/plain ratio is sqrt(8) = 2.8x.
            got = w.double().std().item()
            require(
                abs(got / want - 1) < 0.06,
                component="init",
                behaviour=f"{name} ~ N(0, {want:.4g})" + (" (residual projection)" if want != 0.02 else ""),
                found=f"std {got:.4g} over {n} entries (expected {want:.4g} ± 6%)",
            )
            mean = w.double().mean().item()
            require(
                abs(mean) < 6 * want / math.sqrt(n),
                component="init",
                behaviour=f"{name} has mean 0",
                found=f"mean {mean:.3g} (6 standard errors: {6 * want / math.sqrt(n):.3g})",
            )


@pytest.mark.bug_class("tying")
def test_count_parameters(spec, config):
    """count_parameters counts unique parameters, a tied matrix once (protocol: count_parameters)."""
    sd = models.random_state_dict(config, seed=9, device=spec.device)
    got = spec.impl.count_parameters(models.build(spec.impl, config, sd))
    want = sum(t.numel() for t in sd.values())  # canonical names list a tied matrix once
    require(
        got == want,
        component="model",
        behaviour="count_parameters = number of unique weights",
        found=f"got {got}, expected {want}",
    )


GPT2_SMALL = dict(
    family="gpt2",
    vocab_size=50257,
    context_length=1024,
    d_model=768,
    n_layers=12,
    n_heads=12,
    n_kv_heads=12,
    d_ff=3072,
    tie_embeddings=True,
)


def test_count_parameters_gpt2_small_on_meta(spec):
    """GPT-2 small built on the meta device has 124,439,808 parameters (protocol: count_parameters; course notes: about 124M)."""
    spec.impl.require_family("gpt2")
    with torch.device("meta"):
        model = spec.impl.build_model(GPT2_SMALL)
    got = spec.impl.count_parameters(model)
    require(
        got == 124_439_808,
        component="model",
        behaviour="count_parameters(GPT-2 small) = 124,439,808",
        found=f"got {got:,}",
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
def test_kv_cache_bytes(spec, dtype):
    """kv_cache_bytes = 2 * n_layers * n_kv_heads * d_head * seq_len * batch * element size (course notes: KV bytes per token per layer; why GQA: it cuts KV cache memory by N/G)."""
    variants = dict(CONFIGS, llama_mqa_3_layers=dict(models.LLAMA_GQA, n_layers=3, n_kv_heads=1))
    for name, cfg in variants.items():
        got = spec.impl.kv_cache_bytes(cfg, 3, 17, dtype)
        want = spec.expected(lambda m, c: m.kv_cache_bytes(c, 3, 17, dtype), cfg, label=name)
        require(
            got == want,
            component="model",
            behaviour=f"kv_cache_bytes({name}, batch 3, seq 17, {dtype})",
            found=f"got {got}, expected {want}",
        )


@pytest.mark.bug_class("validation")
def test_config_errors_name_the_values(spec, family):
    """d_model % n_heads != 0, n_heads % n_kv_heads != 0 and an odd RoPE head dim raise ValueError naming the values (symptoms table: ValueError on d_model and n_heads)."""
    base = models.LLAMA_GQA if family == "llama" else models.GPT2
    bad_heads = dict(base, d_model=base["d_model"] + 3)
    require_value_error(
        lambda: spec.impl.build_model(bad_heads),
        must_mention=(str(bad_heads["d_model"]), str(base["n_heads"])),
        behaviour=f"d_model={bad_heads['d_model']} with n_heads={base['n_heads']} raises ValueError",
    )
    bad_kv = dict(base, n_kv_heads=base["n_heads"] - 1)
    require_value_error(
        lambda: spec.impl.build_model(bad_kv),
        must_mention=(str(base["n_heads"]), str(bad_kv["n_kv_heads"])),
        behaviour=f"n_heads={base['n_heads']} with n_kv_heads={bad_kv['n_kv_heads']} raises ValueError",
    )
    if family == "llama":
        odd = dict(base, d_model=3 * 8, n_heads=8, n_kv_heads=2)  # d_head = 3
        require_value_error(
            lambda: spec.impl.build_model(odd),
            must_mention=("3",),
            behaviour="an odd RoPE head dimension (d_head=3) raises ValueError",
        )


@pytest.mark.bug_class("context_overflow")
def test_forward_past_context_raises(spec, config):
    """More than context_length tokens in one forward raise ValueError (symptoms table: seq_len exceeds max_context_length)."""
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=10, device=spec.device))
    ids = ids_for(config, b=1, t=config["context_length"] + 1, device=spec.device)
    require_value_error(
        lambda: spec.impl.forward(model, ids),
        behaviour=f"{config['context_length'] + 1} tokens with context_length={config['context_length']} raise ValueError",
    )
    full = ids[:, : config["context_length"]]
    out = spec.impl.forward(model, full)
    require(
        tuple(out.shape) == (1, config["context_length"], config["vocab_size"]),
        component="model",
        behaviour="exactly context_length tokens are accepted",
        found=f"logits shape {tuple(out.shape)}",
    )
