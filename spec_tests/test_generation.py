"""Generation: greedy decoding equals the reference token for token, the cache never changes it,
dropout never applies and the mode is restored, long prompts are cropped, generation slides past
the context, and sampling filters are applied."""

import pytest
import torch

from . import inputs, models
from .assertions import require, require_value_error
from .models import CONFIGS

pytestmark = pytest.mark.component("generation")

PROMPT_T = 6
CROP_SEEDS = (47, 48)  # (weights, prompt); tests/test_suite_inputs.py checks they expose a missing crop
SLIDE_SEEDS = (49, 50)  # likewise for a missing slide


def slide_steps(cfg) -> int:
    """New tokens that take a PROMPT_T-token prompt 8 tokens past the context."""
    return cfg["context_length"] + 8 - PROMPT_T


@pytest.fixture(params=list(CONFIGS))
def config(request, impl):
    cfg = CONFIGS[request.param]
    impl.require_family(cfg["family"])
    return cfg


def greedy(m, cfg, sd, prompt, n, **kw):
    """Greedy continuation of ``prompt`` by a freshly built model."""
    return m.generate(models.build(m, cfg, sd), prompt, n, temperature=0.0, **kw)


def prompt_for(cfg, t=PROMPT_T, seed=41, device="cpu"):
    return inputs.token_ids(2, t, vocab=cfg["vocab_size"], seed=seed, device=device)


def check_tokens(actual, expected, *, behaviour: str) -> None:
    require(
        tuple(actual.shape) == tuple(expected.shape),
        component="generation",
        behaviour=behaviour,
        found=f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}",
    )
    diff = torch.nonzero(actual.cpu() != expected.cpu())
    if len(diff):
        b, t = diff[0].tolist()
        require(
            False,
            component="generation",
            behaviour=behaviour,
            found=f"first difference at sequence {b}, position {t}: expected token {int(expected[b, t])}, "
            f"got {int(actual[b, t])} ({len(diff)} tokens differ)",
        )


@pytest.mark.bug_class("generation", "kv_cache")
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_greedy_matches_reference(spec, config, use_cache):
    """Greedy generation (temperature 0) equals the reference's token for token, in float64 (course notes: generation)."""
    sd = models.random_state_dict(config, seed=42, device=spec.device)
    prompt = prompt_for(config, device=spec.device)
    n = 12
    out = spec.check(
        lambda m, sd, p: greedy(m, config, sd, p, n, use_cache=use_cache),
        sd,
        prompt,
        component="generation",
        behaviour=f"greedy generate(use_cache={use_cache}) of {n} tokens equals the reference",
    )
    check_tokens(out[:, :PROMPT_T], prompt, behaviour="generate returns the prompt followed by the new tokens")


def test_generation_from_a_single_token(spec, config):
    """A one-token prompt is extended like any other, equal to the reference (protocol: generate)."""
    sd = models.random_state_dict(config, seed=55, device=spec.device)
    prompt = prompt_for(config, t=1, seed=56, device=spec.device)
    spec.check(
        lambda m, sd, p: greedy(m, config, sd, p, 6),
        sd,
        prompt,
        component="generation",
        behaviour="greedy generation of 6 tokens from a 1-token prompt",
    )


@pytest.mark.bug_class("validation")
def test_generate_rejects_an_empty_prompt(spec, family):
    """A prompt with no tokens raises ValueError: there is nothing to condition on (protocol: generate, prompt [B, T]; bad input is a ValueError)."""
    config = models.LLAMA_GQA if family == "llama" else models.GPT2
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=57, device=spec.device))
    empty = torch.zeros(2, 0, dtype=torch.long, device=spec.device)
    require_value_error(
        lambda: spec.impl.generate(model, empty, 3, temperature=0.0),
        component="generation",
        behaviour="generate from a [2, 0] prompt raises ValueError",
    )


@pytest.mark.bug_class("kv_cache")
def test_cache_does_not_change_greedy_output(spec, config):
    """use_cache changes speed, never the result of greedy decoding (protocol: generate)."""
    sd = models.random_state_dict(config, seed=43, device=spec.device)
    prompt = prompt_for(config, t=3, seed=44, device=spec.device)
    model = models.build(spec.impl, config, sd)
    n = config["context_length"] - 3 + 4  # fills the context and slides past it
    with_cache = spec.impl.generate(model, prompt, n, temperature=0.0, use_cache=True)
    without = spec.impl.generate(model, prompt, n, temperature=0.0, use_cache=False)
    check_tokens(with_cache, without, behaviour=f"generate with and without the cache agree for {n} greedy tokens")


@pytest.mark.bug_class("dropout_generation")
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_generation_ignores_dropout_and_restores_mode(spec, family, mode):
    """With dropout 0.5 and the model in training mode, generation equals generation in eval mode, and the mode is left as found (course notes: dropout accidentally enabled during generation)."""
    config = dict(models.LLAMA_GQA if family == "llama" else models.GPT2, dropout=0.5)
    sd = models.random_state_dict(config, seed=45, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt = prompt_for(config, seed=46, device=spec.device)
    reference_run = spec.impl.generate(model.eval(), prompt, 10, temperature=0.0)
    model.train(mode == "train")
    torch.manual_seed(0)
    out = spec.impl.generate(model, prompt, 10, temperature=0.0)
    modes = {m.training for m in model.modules()}
    require(
        modes == {mode == "train"},
        component="generation",
        behaviour=f"generate leaves a model in {mode} mode in {mode} mode",
        found=f"after generate, module training flags are {sorted(modes)}",
    )
    check_tokens(
        out, reference_run, behaviour=f"generation in {mode} mode with dropout 0.5 equals eval-mode generation"
    )


@pytest.mark.bug_class("cropping")
def test_long_prompt_is_cropped(spec, config):
    """A prompt longer than context_length conditions on its last context_length tokens (symptoms table: crop to the last context_length tokens)."""
    sd = models.random_state_dict(config, seed=CROP_SEEDS[0], device=spec.device)
    ctx = config["context_length"]
    prompt = prompt_for(config, t=ctx + 7, seed=CROP_SEEDS[1], device=spec.device)
    out = spec.check(
        lambda m, sd, p: greedy(m, config, sd, p, 5),
        sd,
        prompt,
        component="generation",
        behaviour=f"a {ctx + 7}-token prompt, context {ctx}: generation equals the reference's",
    )
    check_tokens(out[:, : ctx + 7], prompt, behaviour="generate returns the whole (uncropped) prompt first")
    cropped = greedy(spec.impl, config, sd, prompt[:, -ctx:], 5)
    check_tokens(
        out[:, ctx + 7 :], cropped[:, ctx:], behaviour=f"a {ctx + 7}-token prompt continues like its last {ctx} tokens"
    )


@pytest.mark.bug_class("cropping", "kv_cache")
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_generation_slides_past_the_context(spec, config, use_cache):
    """Generating beyond context_length keeps going on the last context_length tokens, equal to the reference (protocol: generate)."""
    sd = models.random_state_dict(config, seed=SLIDE_SEEDS[0], device=spec.device)
    prompt = prompt_for(config, t=PROMPT_T, seed=SLIDE_SEEDS[1], device=spec.device)
    n = slide_steps(config)
    spec.check(
        lambda m, sd, p: greedy(m, config, sd, p, n, use_cache=use_cache),
        sd,
        prompt,
        component="generation",
        behaviour=f"generating {n} tokens from {PROMPT_T} slides past context {config['context_length']}",
    )


@pytest.mark.bug_class("sampling_order", "top_k")
def test_generate_applies_sampling_filters(spec, config):
    """generate samples from the filtered distribution: top_k=1, or a tiny top_p, is greedy whatever the temperature (course notes: sampling before the transforms)."""
    sd = models.random_state_dict(config, seed=51, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt = prompt_for(config, seed=52, device=spec.device)
    want = spec.impl.generate(model, prompt, 8, temperature=0.0)
    for kw in (dict(top_k=1), dict(top_p=1e-6)):
        got = spec.impl.generate(
            model, prompt, 8, temperature=1.7, generator=torch.Generator(spec.device).manual_seed(3), **kw
        )
        check_tokens(got, want, behaviour=f"generate(temperature=1.7, {kw}) equals greedy decoding")


def test_sampled_generation_is_reproducible(spec, config):
    """generate with generators seeded alike produces the same tokens (protocol: sample, reproducible per generator)."""
    sd = models.random_state_dict(config, seed=53, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt = prompt_for(config, seed=54, device=spec.device)
    run = lambda: spec.impl.generate(
        model, prompt, 10, temperature=1.2, top_p=0.9, generator=torch.Generator(spec.device).manual_seed(5)
    )  # noqa: E731
    first = run()
    check_tokens(run(), first, behaviour="the same generator seed gives the same sampled continuation")
