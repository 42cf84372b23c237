"""Logit soft-capping (protocol v2, capability ``logit_softcap``; Gemma 2): config keys ``attn_logit_softcap`` and
``final_logit_softcap``, ``x -> cap * tanh(x / cap)`` on the attention scores (after the 1/sqrt(d_head) scaling,
before the mask) and on the final logits; ``scaled_dot_product_attention(..., softcap=)`` and
``multihead_self_attention(..., softcap=)``."""

import math

import pytest
import torch
from einops import einsum

from . import models
from .attention_inputs import bottom_right, kv_heads, mha_weights
from .harness.diagnosis.variant import Variant
from .harness.plugin.markers import judges
from .inputs import S
from .test_kv_cache import check_chunks

pytestmark = pytest.mark.component("model")

# Caps near the scores' and logits' own scale (scores ~ N(0, 1) in the suite's models, logits up to ~3), so that
# tanh bends: with Gemma 2's 50 and 30 the caps would barely touch O(1) values. All distinct from 1 and each other.
ATTN_CAP, FINAL_CAP, SDPA_CAP = 1.2, 1.5, 1.7
FIX = "cap * tanh(x / cap): on the scores after dividing by sqrt(d_head) and before masking, and on the final logits"


def softcap_config(impl, **caps) -> dict:
    """The richest llama config the implementation supports, with the given soft-caps."""
    impl.require_capability("logit_softcap")
    return models.family_config(impl, "llama", **caps)


def capped_attention(q, k, v, mask, cap, mistake=None):
    """Soft-capped attention written out, or with one ``mistake``: "after_mask" (the cap applied to the masked
    scores, so masked keys get -cap instead of -inf), "no_division" (cap * tanh(s)), "before_scaling" (the cap on
    q k^T, then the division by sqrt(d)), "none" (no cap)."""
    n_rep = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(n_rep, dim=-3), v.repeat_interleave(n_rep, dim=-3)
    raw = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk")
    scale = math.sqrt(q.shape[-1])
    if mistake == "before_scaling":
        s = cap * torch.tanh(raw / cap) / scale
    elif mistake == "no_division":
        s = cap * torch.tanh(raw / scale)
    else:
        s = raw / scale
        if mistake not in ("after_mask", "none"):
            s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~mask, float("-inf"))
    if mistake == "after_mask":
        s = cap * torch.tanh(s / cap)
    return einsum(s.softmax(dim=-1), v, "... h tq tk, ... h tk d -> ... h tq d")


ATTENTION_MISTAKES = (
    ("after_mask", "the scores are soft-capped after the mask: masked keys get -cap, not -inf, and some weight"),
    ("no_division", "the cap is applied as cap * tanh(scores), without dividing the scores by the cap first"),
    ("before_scaling", "the cap is applied to q k^T before the division by sqrt(d_head)"),
    ("none", "softcap is ignored: the scores are not capped"),
)


@judges("scaled_dot_product_attention")
@pytest.mark.component("attention")
@pytest.mark.bug_class("logit_softcap")
def test_attention_scores_are_softcapped_before_the_mask(spec):
    """scaled_dot_product_attention(q, k, v, mask, softcap=c) takes the softmax of c * tanh((q k^T / sqrt(d)) / c)
    masked: the cap bends the scaled scores and masked keys keep zero weight (protocol: amendment 25).

    Queries at scale 2 give scores up to about +-6, far into tanh's bend at cap 1.7; 5 queries against 13 keys
    with the bottom-right causal mask leave masked keys in every row but the last."""
    spec.impl.require_capability("logit_softcap")
    t_q, h_kv = 5, kv_heads(spec)
    q = spec.inputs.randn(S.B, S.H, t_q, S.D_HEAD, seed=251, scale=2.0)
    k = spec.inputs.per_head(S.B, h_kv, S.T, S.D_HEAD, seed=252)
    v = spec.inputs.per_head(S.B, h_kv, S.T, S.D_HEAD, seed=253)
    mask = bottom_right(t_q, S.T, spec.device)
    spec.check(
        lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask, softcap=SDPA_CAP),
        q,
        k,
        v,
        mask,
        subject="scaled_dot_product_attention",
        kind="attention",
        axes="b h t d",
        variants=[
            Variant(
                "knob:logit_softcap",
                summary,
                FIX,
                lambda ref, q, k, v, mask, mistake=mistake: capped_attention(q, k, v, mask, SDPA_CAP, mistake),
            )
            for mistake, summary in ATTENTION_MISTAKES
        ],
        behaviour=f"causal attention ({t_q} queries, {S.T} keys) with softcap={SDPA_CAP}: "
        "softmax(cap * tanh(q k^T / sqrt(d) / cap), masked) v",
    )


@judges("multihead_self_attention")
@pytest.mark.component("attention")
@pytest.mark.bug_class("logit_softcap")
def test_multihead_attention_softcaps_its_scores(spec):
    """multihead_self_attention(..., softcap=c) soft-caps the scaled scores of every head before the causal mask
    (protocol: amendment 25)."""
    spec.impl.require_capability("logit_softcap")
    h_kv = kv_heads(spec)
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=254)
    weights = mha_weights(spec, S.H, h_kv, seed=255)
    theta = 10000.0 if "llama" in spec.impl.families else None  # RoPE in attention is the llama configuration
    spec.call(
        "multihead_self_attention",
        x,
        *weights,
        S.H,
        h_kv,
        theta=theta,
        softcap=ATTN_CAP,
        kind="attention",
        axes="b t d",
        behaviour=f"causal self-attention ({S.H} heads, {h_kv} kv heads, theta {theta}) with softcap={ATTN_CAP}",
    )


def softcap_variants(config):
    """The model with one soft-cap left out, or applied as cap * tanh(x) (the final one)."""

    def no_division(ref, sd, ids):
        uncapped = models.logits(ref, dict(config, final_logit_softcap=None), sd, ids)
        return FINAL_CAP * torch.tanh(uncapped)

    return [
        Variant(
            "knob:logit_softcap",
            "the attention scores are not soft-capped (attn_logit_softcap ignored)",
            FIX,
            lambda ref, sd, ids: models.logits(ref, dict(config, attn_logit_softcap=None), sd, ids),
        ),
        Variant(
            "knob:logit_softcap",
            "the final logits are not soft-capped (final_logit_softcap ignored)",
            FIX,
            lambda ref, sd, ids: models.logits(ref, dict(config, final_logit_softcap=None), sd, ids),
        ),
        Variant("knob:logit_softcap", "the final cap is cap * tanh(logits), without the division", FIX, no_division),
    ]


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("logit_softcap")
def test_logits_match_reference_with_softcaps(spec):
    """A llama config with attn_logit_softcap and final_logit_softcap: the logits equal the reference's, and every
    logit lies strictly within (-cap, cap) (protocol: amendment 25)."""
    config = softcap_config(spec.impl, attn_logit_softcap=ATTN_CAP, final_logit_softcap=FINAL_CAP)
    sd = models.random_state_dict(config, seed=256, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=257)
    logits = models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        variants=softcap_variants(config),
        behaviour=f"logits of a llama model with attn_logit_softcap={ATTN_CAP}, final_logit_softcap={FINAL_CAP} "
        "for ids [2, 11]",
    )
    top = float(logits.detach().abs().max())
    spec.require(
        top < FINAL_CAP,
        behaviour=f"every logit lies within (-{FINAL_CAP}, {FINAL_CAP}), the final cap",
        found=f"max |logit| = {top:.4g}: the final logits are not soft-capped",
        codes=("knob:logit_softcap",),
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("logit_softcap")
def test_whole_number_softcaps_are_those_floats(spec):
    """Soft-caps given as Python ints (2 and 3) are the floats of the same value: the logits equal the reference's
    (protocol: amendment 25, "a finite number > 0"; amendment 35)."""
    config = softcap_config(spec.impl, attn_logit_softcap=2, final_logit_softcap=3)
    sd = models.random_state_dict(config, seed=258, device=spec.device)
    ids = spec.inputs.token_ids(2, 7, vocab=config["vocab_size"], seed=259)
    models.check_option_logits(
        spec, config, sd, ids, behaviour="logits of a llama model with attn_logit_softcap=2, final_logit_softcap=3 "
        "(ints) for ids [2, 7]"
    )  # fmt: skip


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("logit_softcap")
def test_cache_equals_no_cache_with_softcaps(spec):
    """With both soft-caps, logits fed chunk by chunk through the cache equal one uncached forward: the new
    queries' scores against the cached keys are capped too (protocol: amendment 25, forward with cache)."""
    config = softcap_config(spec.impl, attn_logit_softcap=ATTN_CAP, final_logit_softcap=FINAL_CAP)
    check_chunks(spec, config, [6, 1, 1, 9], seed=258)


@judges("evaluate", uses=("build_model", "forward"))
@pytest.mark.bug_class("logit_softcap")
def test_loss_uses_the_capped_logits(spec):
    """evaluate's loss is the NLL of the soft-capped logits, the model's outputs: a cap applied only in the
    protocol's forward function, not in the model the loss runs, changes it (protocol: amendment 25)."""
    config = softcap_config(spec.impl, final_logit_softcap=FINAL_CAP)
    sd = models.random_state_dict(config, seed=259, device=spec.device)
    data = spec.inputs.token_ids(40, vocab=config["vocab_size"], seed=260).cpu()
    spec.check(
        lambda m, sd, data: m.evaluate(models.build(m, config, sd), data, 11)["loss"],
        sd,
        data,
        given=models.plain_given(spec),
        subject="evaluate",
        kind="model",
        variants=[
            Variant(
                "knob:logit_softcap",
                "the loss is taken on the uncapped logits (the cap is applied outside the model)",
                FIX + "; inside the model, so that training and evaluation see the capped logits",
                lambda ref, sd, data: ref.evaluate(
                    models.build(ref, dict(config, final_logit_softcap=None), sd), data, 11
                )["loss"],
            )
        ],
        behaviour=f"evaluate's loss (40 tokens, context 11) of a model with final_logit_softcap={FINAL_CAP}",
    )


@judges("build_model")
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize("key,cap", [("attn_logit_softcap", 0.0), ("final_logit_softcap", -2.0)])
def test_softcaps_must_be_positive(spec, key, cap):
    """A soft-cap of 0 or below raises ValueError naming the key (protocol: amendment 25)."""
    config = softcap_config(spec.impl, **{key: cap})
    spec.raises(
        ValueError,
        lambda: spec.impl.build(config, None, seed=0),
        behaviour=f"build_model({{{key}: {cap}}}) raises ValueError",
        mention=(key,),
    )
