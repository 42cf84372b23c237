"""A rule that fires for more than one cause is a symptom: it is shown as weak evidence or as a description of the
difference, never as a confident cause. These pin the evidence-reading helpers of the spec tests that used to name
one cause whatever the mechanism (issue 18, item 4)."""

from __future__ import annotations

import torch

from spec_tests.test_sampling import N_DRAWS, ids_shape_causes, sharpness_causes, unfiltered_draw_causes, uniform_race


def _counts(p: torch.Tensor, seed: int = 0) -> torch.Tensor:
    draws = torch.multinomial(p.expand(N_DRAWS, -1), 1, generator=torch.Generator().manual_seed(seed))[:, 0]
    return torch.bincount(draws, minlength=p.numel()).double() / N_DRAWS


LOGITS = torch.randn(20, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2


def test_draws_from_the_raw_distribution_are_named():
    causes, codes = unfiltered_draw_causes(_counts((LOGITS / 0.8).softmax(-1)), LOGITS, dict(temperature=0.8, top_k=6))
    assert codes == ("knob:sampling_order",) and "temperature-scaled" in causes[0]
    causes, codes = unfiltered_draw_causes(_counts(LOGITS.softmax(-1)), LOGITS, dict(temperature=0.8, top_k=6))
    assert codes == ("knob:sampling_order",) and "unfiltered raw" in causes[0]


def test_a_filter_keeping_one_token_too_many_is_not_called_raw_logits():
    """top-k keeping k + 1 draws a filtered-out token too: weak evidence only (the sampling_probs tests name it)."""
    scaled = LOGITS / 0.8
    kept = scaled.topk(7).indices  # k = 6, one too many
    p = torch.full_like(scaled, float("-inf"))
    p[kept] = scaled[kept]
    causes, codes = unfiltered_draw_causes(_counts(p.softmax(-1)), LOGITS, dict(temperature=0.8, top_k=6))
    assert codes == ("~knob:sampling_order",) and causes[0].startswith("likely cause (weak evidence)")


def test_a_wrong_ids_shape_is_named_only_where_the_shape_pins_it():
    assert ids_shape_causes((12,), (3, 4)) and "flattened" in ids_shape_causes((12,), (3, 4))[0]
    assert ids_shape_causes((5, 1), (5,)) and "trailing axis" in ids_shape_causes((5, 1), (5,))[0]
    assert ids_shape_causes((5,), (5,)) == ()
    assert ids_shape_causes((4, 3), (3, 4)) == ()  # the right count in another shape: described, not named
    assert ids_shape_causes((6,), (3, 4)) == ()


def test_a_draw_from_another_distribution_is_named_by_the_one_it_follows():
    """Draws that keep the right tokens but follow another distribution: the exponential race with uniform noise
    (argmax(p / U), computed by ``uniform_race`` and drawn here by simulating that race), a second softmax, every
    kept token alike, the temperature applied twice. Each is named by its own reading alone; draws that follow p
    name nothing."""
    p = torch.zeros(20, dtype=torch.float64)
    p[:6] = (LOGITS[:6] / 0.8).softmax(-1)
    g = torch.Generator().manual_seed(5)
    race = (p / torch.rand(N_DRAWS, 20, generator=g, dtype=torch.float64)).argmax(-1)
    counts = torch.bincount(race, minlength=20).double() / N_DRAWS
    causes, codes = sharpness_causes(counts, p, 0.8)
    assert codes == ("knob:draw",) and "uniform noise" in causes[0], causes
    assert torch.allclose(uniform_race(p), counts, atol=0.01)
    causes, codes = sharpness_causes(
        _counts(torch.where(p > 0, p.exp(), 0.0) / torch.where(p > 0, p.exp(), 0.0).sum()), p, 0.8
    )
    assert codes == ("knob:draw",) and "second softmax" in causes[0], causes
    causes, codes = sharpness_causes(_counts((p > 0).double() / 6), p, 0.8)
    assert codes == ("knob:draw",) and "drawn alike" in causes[0], causes
    causes, codes = sharpness_causes(_counts(p**1.25 / (p**1.25).sum()), p, 0.8)
    assert codes == ("knob:temperature",) and "twice" in causes[0], causes
    gumbel = -torch.log(-torch.log(torch.rand(N_DRAWS, 20, generator=g, dtype=torch.float64)))
    negated = (torch.where(p > 0, p, 1.0).log().masked_fill(p == 0, float("-inf")) - gumbel).argmax(-1)
    causes, codes = sharpness_causes(torch.bincount(negated, minlength=20).double() / N_DRAWS, p, 0.8)
    assert codes == ("knob:draw",) and "wrong sign" in causes[0], causes
    assert sharpness_causes(_counts(p), p, 0.8) == ((), ())


def test_draws_that_are_ranks_are_named():
    """A top-p sampler returning the drawn token's place in the sorted order (held-out batch 31): ids 0, 1, 2 ...
    drawn with the sorted probabilities. Named only with the protocol's distribution given, and draws of the ids
    themselves are not read as ranks."""
    p = torch.zeros(20, dtype=torch.float64)
    p[[7, 2, 11]] = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    ranks = torch.zeros(20, dtype=torch.float64)
    ranks[:3] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    causes, codes = unfiltered_draw_causes(_counts(ranks), LOGITS, dict(top_p=0.9), p)
    assert codes == ("knob:unsort",) and "rank in the sorted order" in causes[0], causes
    causes, codes = unfiltered_draw_causes(_counts(ranks), LOGITS, dict(top_p=0.9))
    assert codes != ("knob:unsort",), causes
