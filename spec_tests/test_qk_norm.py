"""Per-head RMSNorm on queries and keys (protocol v2, capability ``qk_norm``; Qwen3-style): config key ``qk_norm``,
canonical names ``layers.{i}.attn.q_norm.weight`` and ``attn.k_norm.weight`` (``[d_head]``, one gain shared by every
head), applied to each head's ``d_head`` channels after the head split and before RoPE, never to the values;
``multihead_self_attention(..., q_norm=, k_norm=, norm_eps=)``.

RoPE keeps each head's norm, so a norm placed after RoPE differs from one before it only through the gains: the
gains here are drawn in [0.5, 1.5] (``inputs.norm_weight``), never 1, and the positions lie far from 0.
"""

import pytest
import torch
from einops import rearrange, repeat

from . import models
from .attention_inputs import kv_heads, loaded_alike, mha_weights
from .harness.diagnosis.variant import Variant
from .harness.plugin.markers import judges
from .inputs import S
from .test_kv_cache import check_chunks

pytestmark = pytest.mark.component("model")

FIX = (
    "normalise q and k per head: rmsnorm(q [B, H, T, d_head], q_norm, norm_eps) and rmsnorm(k, k_norm, norm_eps) after "
    "splitting heads and before RoPE; leave v as projected"
)

# knob -> what the mistake is; mistaken_attention computes each with the reference's own functions
MISTAKES = {
    "over_d_model": "the norm runs over all heads' channels together (d_model), not over each head's d_head",
    "after_rope": "the norm comes after RoPE (its gains are not rotated with q and k)",
    "values_too": "the values are normalised too (with k_norm)",
    "keys_plain": "the keys are not normalised (only the queries)",
    "q_weight_for_keys": "the keys are normalised with q_norm's weight instead of k_norm's",
    "unit_offset": "the q and k norms' gains are 1 + weight (a Gemma-style norm offset) instead of the weight itself",
}


def without_qk_norms(sd: dict) -> dict:
    """``sd`` without the ``attn.q_norm.weight`` and ``attn.k_norm.weight`` entries (v1's llama names)."""
    return {k: v for k, v in sd.items() if not k.endswith(("attn.q_norm.weight", "attn.k_norm.weight"))}


def norm_config(impl) -> dict:
    """The richest llama config the implementation supports, with ``qk_norm``."""
    impl.require_capability("qk_norm")
    return models.family_config(impl, "llama", qk_norm=True)


def mistaken_attention(ref, knob: str):
    """``multihead_self_attention`` with the qk-norm mistake ``knob`` (``MISTAKES``), composed here from the
    reference's own functions; it takes (and ignores) the reference model's options, so the model can call it."""

    def norm(t, w, eps, heads):
        if knob == "over_d_model":  # one statistic over every head's channels at each token; the gain tiled
            flat = ref.rmsnorm(rearrange(t, "b h t d -> b t (h d)"), repeat(w, "d -> (h d)", h=heads), eps)
            return rearrange(flat, "b t (h d) -> b h t d", h=heads)
        return ref.rmsnorm(t, 1 + w if knob == "unit_offset" else w, eps)

    def attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None, *, q_norm, k_norm,
                  norm_eps=1e-5, bq=None, bk=None, bv=None, bo=None, **_):  # fmt: skip
        h_kv = n_heads if n_kv_heads is None else n_kv_heads
        q = rearrange(ref.linear(x, wq, bq), "b t (h d) -> b h t d", h=n_heads)
        k = rearrange(ref.linear(x, wk, bk), "b t (h d) -> b h t d", h=h_kv)
        v = rearrange(ref.linear(x, wv, bv), "b t (h d) -> b h t d", h=h_kv)
        k_gain = q_norm if knob == "q_weight_for_keys" else k_norm
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        if positions.dim() == 2:
            positions = rearrange(positions, "b t -> b 1 t")
        if knob != "after_rope":
            q = norm(q, q_norm, norm_eps, n_heads)
            k = k if knob == "keys_plain" else norm(k, k_gain, norm_eps, h_kv)
        if theta is not None:
            q, k = ref.rope(q, positions, theta), ref.rope(k, positions, theta)
        if knob == "after_rope":
            q, k = norm(q, q_norm, norm_eps, n_heads), norm(k, k_gain, norm_eps, h_kv)
        if knob == "values_too":
            v = norm(v, k_norm, norm_eps, h_kv)
        mask = ref.causal_mask(x.shape[1], x.shape[1], device=x.device)
        out = ref.scaled_dot_product_attention(q, k, v, mask)
        return ref.linear(rearrange(out, "b h t d -> b t (h d)"), wo, bo)

    return attention


def check_attention(spec, *, seed: int, behaviour: str, q_scales=None, k_scales=None, v_scale=1.0, eps=1e-5):
    """``multihead_self_attention`` with ``q_norm`` and ``k_norm`` (GQA where supported, RoPE at scattered positions)
    against the reference. ``q_scales``, ``k_scales``: factors on the rows of wq (wk), one per equal group of heads
    (one per head when there are as many as heads); ``v_scale``: on wv. Every mistake of ``MISTAKES`` is offered as
    a diagnosis."""
    spec.impl.require_capability("qk_norm")
    spec.impl.require_family("llama")  # RoPE in attention is the llama configuration
    h_kv = kv_heads(spec)
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=seed)
    wq, wk, wv, wo = mha_weights(spec, S.H, h_kv, seed=seed + 1)
    wq, wk = per_head_scaled(wq, q_scales), per_head_scaled(wk, k_scales)
    q_norm = spec.inputs.norm_weight(S.D_HEAD, seed=seed + 5)
    k_norm = spec.inputs.norm_weight(S.D_HEAD, seed=seed + 6)
    pos = spec.inputs.scattered_positions(S.T, seed=seed + 7)

    def attend(mha, x, wq, wk, wv, wo, q_norm, k_norm):
        return mha(x, wq, wk, wv, wo, S.H, h_kv, 10000.0, pos, q_norm=q_norm, k_norm=k_norm, norm_eps=eps)

    spec.check(
        lambda m, *a: attend(m.multihead_self_attention, *a),
        x,
        wq,
        wk,
        wv * v_scale,
        wo,
        q_norm,
        k_norm,
        subject="multihead_self_attention",
        kind="attention",
        axes="b t d",
        variants=[
            Variant("knob:qk_norm", summary, FIX, lambda ref, *a, k=knob: attend(mistaken_attention(ref, k), *a))
            for knob, summary in MISTAKES.items()
        ],
        behaviour=behaviour,
        rebase=loaded_alike(
            spec, x, (wq, wk, wv * v_scale, wo), S.H, h_kv, (q_norm, k_norm), theta=10000.0, positions=pos, norm_eps=eps
        ),
    )


def per_head_scaled(w, scales):
    """``w [H*d_head, d]`` with the g-th of ``len(scales)`` equal groups of rows times ``scales[g]`` (``None``:
    unchanged)."""
    if scales is None:
        return w
    factor = torch.tensor(scales, dtype=w.dtype, device=w.device).repeat_interleave(w.shape[0] // len(scales))
    return w * factor[:, None]


@judges("multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("qk_norm")
def test_qk_norm_is_per_head(spec):
    """Each head's queries and keys are normalised over that head's d_head channels, with one [d_head] gain shared by
    the heads: heads projected at scales from 0.2 to 5 each come out at unit RMS times the gain. A norm over all
    heads together (d_model) keeps their relative scales (protocol: amendment 24)."""
    check_attention(
        spec,
        seed=241,
        q_scales=(0.2, 3.0, 1.0, 5.0, 0.5, 2.0, 0.3, 1.5),
        k_scales=(4.0, 0.25),
        behaviour="multihead_self_attention(q_norm, k_norm) with query heads scaled 0.2..5 and key heads by 4 and "
        "0.25: each head normalised over its own d_head",
    )


@judges("multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("qk_norm")
def test_qk_norm_comes_before_rope(spec):
    """The norms act on the projected heads before RoPE rotates them: with gains in [0.5, 1.5] and positions up to 500,
    normalising after RoPE scales channels that RoPE has already mixed (protocol: amendment 24)."""
    check_attention(
        spec,
        seed=245,
        behaviour="multihead_self_attention(q_norm, k_norm) at scattered positions: the gains applied before RoPE",
    )


@judges("multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("qk_norm")
def test_qk_norm_on_queries_and_keys_not_values(spec):
    """q_norm normalises the queries and k_norm the keys; the values stay as projected: keys projected 4x larger are
    normalised back, values projected 3x larger stay 3x larger (protocol: amendment 24)."""
    check_attention(
        spec,
        seed=249,
        k_scales=(4.0,),
        v_scale=3.0,
        behaviour="multihead_self_attention(q_norm, k_norm) with wk and wv scaled by 4 and 3: q and k normalised, "
        "each with its own gain, v not",
    )


@judges("multihead_self_attention", explained_by=("build_model", "canonical_state_dict"))
@pytest.mark.bug_class("qk_norm")
def test_qk_norm_eps_inside_the_root(spec):
    """norm_eps is the norms' eps, inside the square root as in rmsnorm: with norm_eps = 0.25 (against unit-scale
    heads) an ignored or misplaced eps is far off (protocol: amendment 24; rmsnorm)."""
    check_attention(
        spec,
        seed=253,
        eps=0.25,
        behaviour="multihead_self_attention(q_norm, k_norm, norm_eps=0.25): x / sqrt(mean(x**2) + 0.25) * gain",
    )


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("qk_norm")
def test_logits_match_reference_with_qk_norm(spec):
    """A llama config with qk_norm normalises each layer's query and key heads (gains in [0.5, 1.5]) before RoPE: its
    logits equal the reference's (protocol: amendment 24)."""
    config = norm_config(spec.impl)
    sd = models.random_state_dict(config, seed=257, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=258)
    plain = dict(config, qk_norm=False)

    def mistaken(ref, knob, sd, ids):
        with ref.substituted({"multihead_self_attention": mistaken_attention(ref, knob)}):
            return models.logits(ref, config, sd, ids)

    models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        variants=[
            Variant(
                "knob:qk_norm",
                "the model ignores qk_norm (the norm weights are loaded, then not used)",
                FIX,
                lambda ref, sd, ids: models.logits(ref, plain, without_qk_norms(sd), ids),
            ),
            *(
                Variant("knob:qk_norm", summary, FIX, lambda ref, sd, ids, k=knob: mistaken(ref, k, sd, ids))
                for knob, summary in MISTAKES.items()
            ),
        ],
        behaviour="logits of a llama model with qk_norm (gains in [0.5, 1.5]) for ids [2, 11]",
    )


@judges("canonical_state_dict", uses=("build_model",))
@pytest.mark.bug_class("qk_norm")
def test_qk_norm_canonical_names(spec):
    """With qk_norm the canonical weights gain exactly attn.q_norm.weight and attn.k_norm.weight [d_head] per layer;
    they come back as loaded, and a fresh model's are ones (protocol: amendment 24)."""
    config = norm_config(spec.impl)
    sd = models.random_state_dict(config, seed=259, device=spec.device)
    got = spec.impl.canonical_state_dict(models.build(spec.impl, config, sd))
    spec.require(
        sorted(got) == sorted(sd),
        behaviour="canonical_state_dict with qk_norm names exactly the v1 llama weights plus attn.{q,k}_norm.weight",
        found=f"missing {sorted(set(sd) - set(got))}, unexpected {sorted(set(got) - set(sd))}",
    )
    gains = {k: v for k, v in sd.items() if k not in without_qk_norms(sd)}
    spec.close({k: got.get(k) for k in gains}, gains, behaviour="the q and k norm weights come back exactly as loaded")
    fresh = spec.impl.canonical_state_dict(spec.impl.build(config, None, seed=0))
    spec.close(
        {k: fresh.get(k) for k in gains},
        {k: torch.ones_like(v) for k, v in gains.items()},
        behaviour="a freshly initialised model's q and k norm weights are ones [d_head]",
    )


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("qk_norm")
def test_cache_equals_no_cache_with_qk_norm(spec):
    """With qk_norm, logits fed chunk by chunk through the cache equal one uncached forward: the cache holds the
    normalised, rotated keys and new tokens are normalised alike (protocol: amendment 24, forward with cache)."""
    check_chunks(spec, norm_config(spec.impl), [6, 1, 1, 9], seed=260)


@judges("build_model")
@pytest.mark.bug_class("validation")
def test_qk_norm_needs_the_llama_family(spec):
    """qk_norm on a gpt2 config raises ValueError naming qk_norm (protocol: amendment 24)."""
    spec.impl.require_capability("qk_norm")
    config = models.family_config(spec.impl, "gpt2", qk_norm=True)
    spec.raises(
        ValueError,
        lambda: spec.impl.build(config, None, seed=0),
        behaviour="build_model({family: 'gpt2', qk_norm: True}) raises ValueError",
        mention=("qk_norm",),
    )
