"""The Gemma-style model options (protocol v2, amendment 26), each its own capability and config key: ``norm_offset``
(RMSNorm gains ``1 + weight``, weights stored as offsets), ``embed_scale`` (input embeddings times
``sqrt(d_model)``), ``geglu`` (the gated MLP with the tanh-approximate GELU) and ``post_norms`` (Gemma 2's RMSNorm
on each sublayer's output, before the residual add)."""

import pytest
import torch

from . import models
from .harness.diagnosis.variant import Variant
from .harness.plugin.markers import judges
from .test_kv_cache import check_chunks

pytestmark = pytest.mark.component("model")

OPTIONS = ("norm_offset", "embed_scale", "geglu", "post_norms")
FIX = {
    "norm_offset": "every RMSNorm of the model multiplies by 1 + weight (the stored weights are offsets)",
    "embed_scale": "multiply the looked-up input embeddings by sqrt(d_model) (in their dtype); the tied head is not "
    "scaled",
    "geglu": "(gelu_tanh(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T: the tanh-approximate GELU, on the gate only",
    "post_norms": "x = x + attn_post_norm(attn(attn_norm(x))); x = x + mlp_post_norm(mlp(mlp_norm(x)))",
}


def option_config(impl, *options, **changes) -> dict:
    """The richest llama config the implementation supports, with the given options on (each needs its capability)."""
    impl.require_capability(*options)
    return models.family_config(impl, "llama", **dict.fromkeys(options, True), **changes)


def logits_check(spec, config, sd, ids, behaviour, variants):
    return models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        variants=variants,
        behaviour=behaviour,
    )


# ------------------------------------------------------------------------------------------------ norm_offset


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("norm_offset")
def test_logits_match_reference_with_norm_offset(spec):
    """With norm_offset every RMSNorm multiplies by 1 + weight: offsets in [-0.5, 0.5] (gains in [0.5, 1.5]) give
    the reference's logits (protocol: amendment 26)."""
    config = option_config(spec.impl, "norm_offset")
    sd = models.random_state_dict(config, seed=261, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=262)
    logits_check(
        spec,
        config,
        sd,
        ids,
        "logits of a llama model with norm_offset (gains 1 + weight) for ids [2, 11]",
        [
            Variant(
                "knob:norm_offset",
                "the stored weight is used as the gain, not 1 + weight",
                FIX["norm_offset"],
                lambda ref, sd, ids: models.logits(ref, dict(config, norm_offset=False), sd, ids),
            ),
            Variant(
                "knob:norm_offset",
                "the final norm uses its weight as the gain (the blocks' norms take 1 + weight)",
                FIX["norm_offset"] + ", the final norm included",
                lambda ref, sd, ids: models.logits(
                    ref, config, dict(sd, **{"final_norm.weight": sd["final_norm.weight"] - 1}), ids
                ),
            ),
        ],
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("norm_offset", "qk_norm")
def test_norm_offset_leaves_the_qk_norm_gains_plain(spec):
    """With norm_offset and qk_norm together, the model's RMSNorms take 1 + weight but the per-head q and k norms keep
    their stored weights as gains: the reference's logits (protocol: amendment 26, "other norms (amendment 24's
    q_norm, k_norm) keep plain gains")."""
    config = option_config(spec.impl, "norm_offset", "qk_norm")
    sd = models.random_state_dict(config, seed=263, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=264)
    qk = [k for k in sd if k.endswith(("attn.q_norm.weight", "attn.k_norm.weight"))]
    logits_check(
        spec,
        config,
        sd,
        ids,
        "logits of a llama model with norm_offset and qk_norm for ids [2, 11]",
        [
            Variant(
                "knob:norm_offset",
                "the per-head q and k norms take 1 + weight too (norm_offset applied to qk_norm's gains)",
                "with norm_offset only the model's RMSNorms (attn_norm, mlp_norm, final_norm, post_norms) take "
                "1 + weight; q_norm and k_norm keep their weights as gains",
                lambda ref, sd, ids: models.logits(ref, config, dict(sd, **{k: 1 + sd[k] for k in qk}), ids),
            ),
        ],
    )


@judges("build_model", uses=("canonical_state_dict", "forward"))
@pytest.mark.bug_class("norm_offset")
def test_zero_offsets_are_the_identity_gain(spec):
    """With norm_offset, fresh norm weights are all 0 (a gain of 1), and zero offsets give the logits of plain
    normalisation: the reference's with every gain 1 (protocol: amendment 26)."""
    config = option_config(spec.impl, "norm_offset")
    fresh = spec.impl.canonical_state_dict(spec.impl.build(config, None, seed=0))
    offsets = sorted(models.offset_norm_names(config) & set(fresh))
    nonzero = [name for name in offsets if not bool((fresh[name] == 0).all())]
    spec.require(
        not nonzero,
        behaviour="fresh norm weights (offsets) are 0 under norm_offset",
        found=f"{nonzero[:3]} are not all 0" + (" (1: the plain-norm initialisation)" if nonzero else ""),
        codes=("knob:norm_offset",),
    )
    sd = models.random_state_dict(config, seed=263, device=spec.device)
    sd = {k: torch.zeros_like(v) if k in offsets else v for k, v in sd.items()}
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=264)
    logits_check(
        spec,
        config,
        sd,
        ids,
        "logits of a llama model with norm_offset and every norm weight 0 (gain 1) for ids [2, 11]",
        [
            Variant(
                "knob:norm_offset",
                "the zero weights are used as gains (the outputs of every norm are 0), not 1 + 0",
                FIX["norm_offset"],
                lambda ref, sd, ids: models.logits(ref, dict(config, norm_offset=False), sd, ids),
            )
        ],
    )


# ------------------------------------------------------------------------------------------------ embed_scale


def embed_scale_variants(config):
    """The model with the scale left out, by d_model, or on the tied head too (as untied reference models)."""
    d = config["d_model"]

    def untied(sd, emb_factor, head_factor):
        weight = sd["tok_embeddings.weight"]
        head = sd.get("lm_head.weight", weight)
        return dict(sd, **{"tok_embeddings.weight": weight * emb_factor, "lm_head.weight": head * head_factor})

    plain = dict(config, tie_embeddings=False)
    variants = [
        Variant(
            "knob:embed_scale",
            "the input embeddings are not scaled",
            FIX["embed_scale"],
            lambda ref, sd, ids: models.logits(ref, dict(config, embed_scale=False), sd, ids),
        ),
        Variant(
            "knob:embed_scale",
            "the input embeddings are multiplied by d_model, not sqrt(d_model)",
            FIX["embed_scale"],
            lambda ref, sd, ids: models.logits(ref, plain, untied(sd, d**0.5, 1.0), ids),
        ),
    ]
    if config.get("tie_embeddings", True):
        variants.append(
            Variant(
                "knob:embed_scale",
                "the tied LM head is scaled by sqrt(d_model) too (the scale folded into the shared matrix)",
                FIX["embed_scale"],
                lambda ref, sd, ids: models.logits(ref, plain, untied(sd, 1.0, d**0.5), ids),
            )
        )
    return variants


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("embed_scale")
def test_logits_match_reference_with_embed_scale(spec):
    """With embed_scale the looked-up input embeddings are multiplied by sqrt(d_model) and the tied LM head is not:
    the logits equal the reference's (protocol: amendment 26)."""
    config = option_config(spec.impl, "embed_scale")
    sd = models.random_state_dict(config, seed=265, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=266)
    tied = "tied" if config.get("tie_embeddings", True) else "untied"
    logits_check(
        spec,
        config,
        sd,
        ids,
        f"logits of a {tied} llama model with embed_scale (x sqrt({config['d_model']})) for ids [2, 11]",
        embed_scale_variants(config),
    )


# ------------------------------------------------------------------------------------------------ geglu


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("geglu")
def test_logits_match_reference_with_geglu(spec):
    """With geglu the MLP is (gelu_tanh(x W_gate^T) * x W_up^T) W_down^T with the tanh-approximate GELU: the logits
    equal the reference's (protocol: amendment 26).

    The up projections are scaled by 4 so that the MLPs dominate the residual stream: the exact (erf) GELU differs
    from the tanh one by at most 4.7e-4, which must show in the logits well above the model tolerance."""
    config = option_config(spec.impl, "geglu")
    sd = models.random_state_dict(config, seed=267, device=spec.device)
    sd = {k: 4 * v if k.endswith("mlp.w_up.weight") else v for k, v in sd.items()}
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=268)

    def swapped(sd):
        gates = {k.replace("w_up", "w_gate"): v for k, v in sd.items() if k.endswith("w_up.weight")}
        ups = {k.replace("w_gate", "w_up"): v for k, v in sd.items() if k.endswith("w_gate.weight")}
        return dict(sd, **gates, **ups)

    logits_check(
        spec,
        config,
        sd,
        ids,
        "logits of a llama model with geglu (tanh-GELU gated MLP, w_up x 4) for ids [2, 11]",
        [
            Variant(
                "knob:activation",
                "the MLP is SwiGLU (SiLU on the gate), not GeGLU",
                FIX["geglu"],
                lambda ref, sd, ids: models.logits(ref, dict(config, geglu=False), sd, ids),
            ),
            Variant(
                "knob:activation",
                "the GELU is applied to the up projection instead of the gate",
                FIX["geglu"],
                lambda ref, sd, ids: models.logits(ref, config, swapped(sd), ids),
            ),
        ],
    )


# ------------------------------------------------------------------------------------------------ post_norms


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("post_norms")
def test_logits_match_reference_with_post_norms(spec):
    """With post_norms each sublayer's output goes through its own RMSNorm (attn_post_norm, mlp_post_norm) before
    the residual add, besides the pre-norms: the logits equal the reference's (protocol: amendment 26)."""
    config = option_config(spec.impl, "post_norms")
    sd = models.random_state_dict(config, seed=269, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=270)
    post = ("attn_post_norm.weight", "mlp_post_norm.weight")

    def swapped(sd):
        names = {"attn_post_norm": "mlp_post_norm", "mlp_post_norm": "attn_post_norm"}
        return {
            (k.replace(k.split(".")[2], names[k.split(".")[2]]) if k.endswith(post) else k): v for k, v in sd.items()
        }

    logits_check(
        spec,
        config,
        sd,
        ids,
        "logits of a llama model with post_norms for ids [2, 11]",
        [
            Variant(
                "knob:post_norms",
                "the post-norm weights are loaded but the sublayers' outputs are not normalised",
                FIX["post_norms"],
                lambda ref, sd, ids: models.logits(
                    ref, dict(config, post_norms=False), {k: v for k, v in sd.items() if not k.endswith(post)}, ids
                ),
            ),
            Variant(
                "knob:post_norms",
                "attn_post_norm and mlp_post_norm are swapped",
                FIX["post_norms"],
                lambda ref, sd, ids: models.logits(ref, config, swapped(sd), ids),
            ),
        ],
    )


@judges("canonical_state_dict", uses=("build_model",))
@pytest.mark.bug_class("post_norms")
def test_post_norms_canonical_names(spec):
    """With post_norms the canonical weights gain exactly layers.{i}.attn_post_norm.weight and
    layers.{i}.mlp_post_norm.weight [d_model], returned as loaded (protocol: amendment 26)."""
    config = option_config(spec.impl, "post_norms")
    sd = models.random_state_dict(config, seed=271, device=spec.device)
    got = spec.impl.canonical_state_dict(models.build(spec.impl, config, sd))
    spec.require(
        sorted(got) == sorted(sd),
        behaviour="canonical_state_dict with post_norms names the llama weights plus attn_post_norm and mlp_post_norm",
        found=f"missing {sorted(set(sd) - set(got))}, unexpected {sorted(set(got) - set(sd))}",
    )
    post = {k: v for k, v in sd.items() if "post_norm" in k}
    spec.close({k: got[k] for k in post}, post, behaviour="the post-norm weights come back exactly as loaded")


# ------------------------------------------------------------------------------------------------ all together


def held_options(impl) -> tuple[str, ...]:
    """The amendment-26 options the implementation holds (at least one, or the test is skipped)."""
    held = tuple(o for o in OPTIONS if o in impl.capabilities)
    if not held:
        impl.require_capability("norm_offset")  # skips, naming one of them
    return held


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("norm_offset", "embed_scale", "geglu", "post_norms")
def test_cache_equals_no_cache_with_gemma_options(spec):
    """With every Gemma-style option the implementation holds (and the soft-caps, when it holds logit_softcap),
    logits fed chunk by chunk through the cache equal one uncached forward (protocol: amendment 26, forward with
    cache)."""
    caps = {"attn_logit_softcap": 1.2, "final_logit_softcap": 1.5} if "logit_softcap" in spec.impl.capabilities else {}
    config = option_config(spec.impl, *held_options(spec.impl), **caps)
    check_chunks(spec, config, [6, 1, 1, 9], seed=272)


@judges("build_model")
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize("option", OPTIONS)
def test_gemma_options_need_the_llama_family(spec, option):
    """A Gemma-style option on a gpt2 config (LayerNorm, learned positions, a biased GELU MLP) raises ValueError
    naming the option (protocol: amendment 26)."""
    spec.impl.require_capability(option)
    config = models.family_config(spec.impl, "gpt2", **{option: True})
    spec.raises(
        ValueError,
        lambda: spec.impl.build(config, None, seed=0),
        behaviour=f"build_model({{family: 'gpt2', {option}: True}}) raises ValueError",
        mention=(option,),
    )
