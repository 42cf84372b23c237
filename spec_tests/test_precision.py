"""Precision, as a behaviour of its own: float64 inputs are computed in float64.

The math tests judge formulas at a tolerance a float32-internal computation meets; these tests,
one per computing function, hold float64 inputs to float64 rounding (1e-10). Code that upcasts to
float32 inside (``x.float()`` in RMSNorm, float32 RoPE tables, a float32 softmax, as Meta's and
Hugging Face's Llama do for bf16 safety) fails exactly these, and nothing else for it.

The functions judged, their float64 inputs and their math tolerances are their protocol entries'
(``spec_tests/protocol/entries.py``: ``precision_sample``, ``tolerance``), as ``@ops(op_db)`` reads OpInfos.
"""

import pytest
import torch

from . import filters, models, oracles
from .harness.judging.compare import mismatch
from .harness.judging.tolerances import EXACT, tolerance
from .harness.plugin.markers import judges
from .inputs import S
from .protocol import COMPONENT_OF, ENTRY, PRECISION_FUNCTIONS
from .test_model import held_weights


def inputs_for(spec, name):
    """Positional and keyword arguments exercising ``name`` in float64 (its entry's ``precision_sample``)."""
    return ENTRY[name].precision_sample(spec.inputs, S, spec.device)


def _param(name: str, uses=()):
    marks = [pytest.mark.component(COMPONENT_OF[name]), judges(name, uses=uses), pytest.mark.bug_class("precision")]
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in PRECISION_FUNCTIONS])
def test_float64_computed_in_float64(spec, name):
    """A float64 input is computed in float64: equal to the reference to float64 rounding (protocol: Conventions,
    ground truth in float64; amendment 11)."""
    args, kwargs = inputs_for(spec, name)
    kwargs = filters.supported(spec.impl, kwargs)  # sampling_probs: its top_k only where declared (protocol v2)
    if "theta" in kwargs:
        spec.impl.require_family("llama")  # RoPE is the llama configuration; gpt2's attention has its own test
    math_first(spec, name, lambda m, *a: getattr(m, name)(*a, **kwargs), args)
    spec.call(
        name,
        *args,
        tol=EXACT,
        kind=ENTRY[name].tolerance or "pointwise",  # the float32 rounding an upstream's may carry (consequences)
        behaviour=f"{name} of float64 inputs, to float64 rounding",
        **kwargs,
    )


def math_first(spec, name, compute, args):
    """Precision is judged only where the math is right: a math error is the math tests' to report."""
    actual = compute(spec.impl, *args)
    expected = spec.expected(compute, *args, label="math")
    if mismatch(actual, expected, tolerance(ENTRY[name].tolerance, device=spec.device)) is not None:
        raise spec.defer(
            [name],
            f"{name}: precision is judged once the math is right",
            f"not judged: {name}'s result is wrong beyond float32 rounding, which its own tests report",
        )


@pytest.mark.parametrize("name", [_param("forward", uses=("build_model",))])
def test_float64_model_computed_in_float64(spec, name):
    """A float64 model's logits are computed in float64 (protocol: Conventions, ground truth in float64;
    amendment 11)."""
    config = models.family_config(spec.impl, spec.impl.families[0])
    sd = models.random_state_dict(config, seed=114, device=spec.device)
    ids = spec.inputs.token_ids(3, 11, vocab=config["vocab_size"], seed=115)

    def compute(m, sd, ids):
        return models.logits(m, config, sd, ids)

    math_first(spec, name, compute, (sd, ids))
    spec.check(
        compute,
        sd,
        ids,
        tol=EXACT,
        kind="model",
        axes="b t v",
        behaviour=f"logits of a float64 {config['family']} model, to float64 rounding",
        given=held_weights(spec, config, sd, ids, tol=EXACT),  # weights rounded at load: the roundtrip's to report
    )


@pytest.mark.parametrize("name", [_param("evaluate", uses=("build_model", "forward"))])
def test_float64_evaluation_computed_in_float64(spec, name):
    """evaluate of a float64 model computes in float64: its loss equals the model's own token-weighted NLL to
    float64 rounding (protocol: Conventions, ground truth in float64; amendment 11)."""
    config = models.family_config(spec.impl, spec.impl.families[0])
    sd = models.random_state_dict(config, seed=116, device=spec.device)
    model = models.build(spec.impl, config, sd)
    data = spec.inputs.token_ids(61, vocab=config["vocab_size"], seed=117).cpu()
    got = spec.impl.evaluate(model, data, 11)
    want = oracles.evaluate_teacher(spec.impl, model, data, 11, spec.device)
    if mismatch(got, want, tolerance("model", device=spec.device)) is not None:
        raise spec.defer(
            ["evaluate"],
            "evaluate: precision is judged once the math is right",
            "not judged: evaluate's loss is wrong beyond float32 rounding, which its own tests report",
        )
    if mismatch(got, want, EXACT) is not None and not float64_logits(spec, config, sd, model, data[:11]):
        raise spec.defer(
            ["forward"],
            "evaluate: precision is judged once the model's float64 logits are",
            "not judged: your model's own float64 logits already differ from the reference's beyond float64 "
            "rounding (test_float64_model_computed_in_float64 reports it), so no loss computed from them can be exact",
        )
    spec.close(
        got,
        want,
        tol=EXACT,
        behaviour="evaluate of a float64 model (61 tokens, context 11): loss and perplexity to float64 rounding",
        subject="evaluate",
    )


def float64_logits(spec, config, sd, model, ids) -> bool:
    """Whether the implementation's float64 ``model`` (built from ``sd``) gives the reference's logits on ``ids`` to
    float64 rounding."""
    ids = ids.reshape(1, -1).to(spec.device)
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: the model's own tests report its crashes
    try:
        actual = raw.forward(model, ids)
    except Exception:  # noqa: BLE001
        return True
    expected = spec.expected(lambda m, sd, ids: models.logits(m, config, sd, ids), sd, ids, label="logits")
    return mismatch(actual, expected, EXACT) is None


@pytest.mark.parametrize("name", [_param("multihead_self_attention")])
def test_float64_attention_without_rope_computed_in_float64(spec, name):
    """multihead_self_attention without theta (the gpt2 configuration) computes float64 inputs in float64 (protocol:
    Conventions, ground truth in float64; amendment 11; amendment 21)."""
    args, _ = inputs_for(spec, name)
    math_first(spec, name, lambda m, *a: m.multihead_self_attention(*a), args)
    spec.call(
        name, *args, tol=EXACT, kind="attention", behaviour="multihead_self_attention without RoPE of float64 inputs"
    )


@pytest.mark.parametrize("name", [_param("new_cache", uses=("build_model", "forward"))])
def test_float64_cached_model_computed_in_float64(spec, name):
    """A float64 model's cached path computes in float64: logits fed through a new cache (a 6-token prompt, then
    one token, then four) equal the reference's to float64 rounding, so the cache holds keys and values in the
    model's dtype (protocol: Conventions, ground truth in float64; new_cache, forward with a cache; amendment 11).

    Judged only where the uncached float64 logits already are (``test_float64_model_computed_in_float64``
    reports those) and the cached ones are right at the model tolerance (the cache tests report the math)."""
    spec.impl.require("new_cache")
    config = models.family_config(spec.impl, spec.impl.families[0])
    sd = models.random_state_dict(config, seed=118, device=spec.device)
    ids = spec.inputs.token_ids(2, 11, vocab=config["vocab_size"], seed=119)

    def uncached(m, sd, ids):
        return models.logits(m, config, sd, ids)

    def cached(m, sd, ids):
        model = models.build(m, config, sd)
        cache = m.new_cache(model, ids.shape[0])
        return torch.cat([m.forward(model, chunk, cache) for chunk in ids.split([6, 1, 4], dim=1)], dim=1)

    full = uncached(spec.impl, sd, ids)
    if mismatch(full, spec.expected(uncached, sd, ids, label="uncached"), EXACT) is not None:
        raise spec.defer(
            ["forward"],
            "new_cache: the cached path's precision is judged once the uncached float64 logits are exact",
            "not judged: the uncached float64 logits already differ beyond float64 rounding, which "
            "test_float64_model_computed_in_float64 reports",
        )
    math_first(spec, name, cached, (sd, ids))
    spec.check(
        cached,
        sd,
        ids,
        tol=EXACT,
        kind="model",
        axes="b t v",
        behaviour=f"logits of a float64 {config['family']} model through a new cache (chunks 6, 1, 4), to float64 "
        "rounding",
    )
