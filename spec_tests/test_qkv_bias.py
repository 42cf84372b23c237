"""Attention biases on the q, k, v projections only (protocol v2, capability ``qkv_bias``; Qwen2-style): config key
``qkv_bias``, canonical names ``layers.{i}.attn.w{q,k,v}.bias``, added before the head split and before RoPE."""

import pytest
import torch

from . import models
from .harness.diagnosis.variant import Variant
from .harness.diagnosis.wiring import wiring_variant
from .harness.plugin.markers import judges
from .test_kv_cache import check_chunks

pytestmark = pytest.mark.component("model")

FIX = "add bq, bk, bv to x wq^T, x wk^T, x wv^T before splitting heads and before RoPE; wo and the MLP have no bias"


def bias_config(impl) -> dict:
    """The richest llama config the implementation supports, with ``qkv_bias``."""
    impl.require_capability("qkv_bias")
    return models.family_config(impl, "llama", qkv_bias=True)


def without(sd: dict, which: str) -> dict:
    """``sd`` with the biases of the projections in ``which`` (letters of "qkv") set to zero."""
    return {k: torch.zeros_like(v) if k.endswith(tuple(f"attn.w{p}.bias" for p in which)) else v for k, v in sd.items()}


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("qkv_bias")
def test_logits_match_reference_with_qkv_bias(spec):
    """A llama config with qkv_bias adds non-zero biases to the q, k and v projections (per head, before RoPE): its
    logits equal the reference's (protocol: amendment 22)."""
    config = bias_config(spec.impl)
    sd = models.random_state_dict(config, seed=221, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=222)
    models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        variants=[
            Variant(
                "knob:qkv_bias",
                f"the {name} bias{'es are' if len(which) > 1 else ' is'} not used (loaded, then dropped)",
                FIX,
                lambda ref, sd, ids, which=which: models.logits(ref, config, without(sd, which), ids),
            )
            for name, which in (("q, k and v", "qkv"), ("query and key", "qk"), ("value", "v"))
        ]
        + [wiring_variant("qkv_bias_after_rope", lambda ref, sd, ids: models.logits(ref, config, sd, ids))],
        behaviour="logits of a llama model with qkv_bias (biases ~ N(0, 0.3²) on q, k, v) for ids [2, 11]",
    )


@judges("canonical_state_dict", uses=("build_model",))
@pytest.mark.bug_class("qkv_bias")
def test_qkv_bias_canonical_names(spec):
    """With qkv_bias the canonical weights gain exactly attn.wq.bias, attn.wk.bias and attn.wv.bias per layer: no
    bias on the output projection wo nor on the MLP, and the biases come back as loaded (protocol: amendment 22)."""
    config = bias_config(spec.impl)
    sd = models.random_state_dict(config, seed=223, device=spec.device)
    got = spec.impl.canonical_state_dict(models.build(spec.impl, config, sd))
    spec.require(
        sorted(got) == sorted(sd),
        behaviour="canonical_state_dict with qkv_bias names exactly the v1 llama weights plus attn.w{q,k,v}.bias",
        found=f"missing {sorted(set(sd) - set(got))}, unexpected {sorted(set(got) - set(sd))}"
        + (" (wo has a bias: qkv_bias puts biases on q, k, v only)" if any("wo.bias" in k for k in got) else ""),
    )
    biases = {k: v for k, v in sd.items() if k.endswith(".bias")}
    spec.close({k: got[k] for k in biases}, biases, behaviour="the q, k, v biases come back exactly as loaded")


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("qkv_bias")
def test_cache_equals_no_cache_with_qkv_bias(spec):
    """With qkv_bias, logits fed chunk by chunk through the cache equal one uncached forward: the cached keys and
    values carry their biases and new tokens get theirs (protocol: amendment 22, forward with cache)."""
    check_chunks(spec, bias_config(spec.impl), [6, 1, 1, 9], seed=224)


@judges("build_model")
@pytest.mark.bug_class("validation")
def test_qkv_bias_needs_the_llama_family(spec):
    """qkv_bias on a gpt2 config (which has every bias already) raises ValueError naming qkv_bias (protocol:
    amendment 22)."""
    spec.impl.require_capability("qkv_bias")
    config = models.family_config(spec.impl, "gpt2", qkv_bias=True)
    spec.raises(
        ValueError,
        lambda: spec.impl.build(config, None, seed=0),
        behaviour="build_model({family: 'gpt2', qkv_bias: True}) raises ValueError",
        mention=("qkv_bias",),
    )
