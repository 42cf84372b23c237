"""The suite's own inputs are strong enough: checks on the inputs spec_tests uses, run with the
reference, proving that a test *can* fail for the bug it targets (not a test of the reference)."""

import pytest
import torch

import reference
from spec_tests import inputs, models
from spec_tests.test_generation import CROP_SEEDS, PROMPT_T, SLIDE_SEEDS, slide_steps

STYLES = ("interleaved", "half")
# generation is judged on the richest config of each family (models.family_config)
CONFIGS = {"llama": models.LLAMA_GQA, "gpt2": models.GPT2}
CASES = [(name, style) for name in CONFIGS for style in STYLES if name == "llama" or style == STYLES[0]]


def prompt_for(cfg, t, seed):
    """The prompt test_generation.py's prompt_for draws (on the CPU)."""
    return inputs.token_ids(2, t, vocab=cfg["vocab_size"], seed=seed)


def unlimited(cfg, sd, style, extra=64):
    """The same model with a longer context: it neither crops nor slides within ``extra`` tokens."""
    big = dict(cfg, context_length=cfg["context_length"] + extra)
    sd = dict(sd)
    if "pos_embeddings.weight" in sd:  # gpt2: positions past the old context get fresh rows
        fresh = torch.randn(
            extra, cfg["d_model"], generator=torch.Generator().manual_seed(0), dtype=sd["pos_embeddings.weight"].dtype
        )
        sd["pos_embeddings.weight"] = torch.cat([sd["pos_embeddings.weight"], fresh * models.EMBEDDING_STD])
    return reference.build_model(big, sd, rope_style=style)


@pytest.mark.parametrize("name,style", CASES)
def test_crop_test_inputs_expose_a_missing_crop(name, style):
    """With test_long_prompt_is_cropped's weights and prompt, not cropping changes the greedy tokens."""
    cfg = CONFIGS[name]
    sd = models.random_state_dict(cfg, seed=CROP_SEEDS[0])
    prompt = prompt_for(cfg, t=cfg["context_length"] + 7, seed=CROP_SEEDS[1])
    cropped = reference.generate(reference.build_model(cfg, sd, rope_style=style), prompt, 5, temperature=0.0)
    whole = reference.generate(unlimited(cfg, sd, style), prompt, 5, temperature=0.0)
    assert not torch.equal(cropped, whole)


@pytest.mark.parametrize("name,style", CASES)
def test_slide_test_inputs_expose_a_missing_slide(name, style):
    """With test_generation_slides_past_the_context's inputs, attending to every token (no slide) changes the tokens."""
    cfg = CONFIGS[name]
    sd = models.random_state_dict(cfg, seed=SLIDE_SEEDS[0])
    prompt = prompt_for(cfg, t=PROMPT_T, seed=SLIDE_SEEDS[1])
    n = slide_steps(cfg)
    slid = reference.generate(reference.build_model(cfg, sd, rope_style=style), prompt, n, temperature=0.0)
    whole = reference.generate(unlimited(cfg, sd, style), prompt, n, temperature=0.0)
    assert not torch.equal(slid, whole)
