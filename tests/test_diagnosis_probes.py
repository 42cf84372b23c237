"""Probes that rerun the implementation: causality (does the past see the future?) and batch mixing."""

import math

import torch
from diagnosis_cases import D_MODEL, B, D, H, T, assert_names, causal, randn, sdpa

from spec_tests.harness.diagnosis import batch_probe, causality_probe

X = randn(B, T, D_MODEL, seed=1)
WQ, WK, WV = (randn(D_MODEL, D_MODEL, seed=s) / math.sqrt(D_MODEL) for s in (2, 3, 4))


def self_attention(mask=None):
    """A toy multi-head self-attention over x [B, T, d_model] with the given [T, T] mask."""

    def run(inputs):
        x = inputs["x"]
        b, t, _ = x.shape
        q, k, v = ((x @ w.T).view(b, t, H, D).transpose(1, 2) for w in (WQ, WK, WV))
        return sdpa(q, k, v, mask).transpose(1, 2).reshape(b, t, D_MODEL)

    return run


def test_missing_mask_breaks_causality():
    cause = assert_names(causality_probe(self_attention(None), {"x": X}, time_axis=1), "causality", 0.95)
    assert cause.source == "probe" and "sees the future" in cause.summary


def test_mask_one_step_ahead_is_reported_as_such():
    causes = causality_probe(self_attention(causal(T, T, diagonal_shift=1)), {"x": X}, time_axis=1)
    cause = assert_names(causes, "causality", 0.95)
    assert "one step ahead" in cause.summary


def test_causal_attention_passes_the_causality_probe():
    assert causality_probe(self_attention(causal(T, T)), {"x": X}, time_axis=1) == []


def test_causality_probe_with_per_input_axes():
    """sdpa(q, k, v) with time on axis 2 of every input; keys longer than queries are aligned at the end."""
    q, k, v = randn(B, H, 6, D, seed=5), randn(B, H, T, D, seed=6), randn(B, H, T, D, seed=7)
    inputs = {"q": q, "k": k, "v": v}
    top_left = lambda i: sdpa(i["q"], i["k"], i["v"], torch.ones(6, T, dtype=torch.bool).tril())
    bottom_right = lambda i: sdpa(i["q"], i["k"], i["v"], causal(6, T))
    no_mask = lambda i: sdpa(i["q"], i["k"], i["v"])
    axes = {"q": 2, "k": 2, "v": 2}
    assert causality_probe(bottom_right, inputs, axes, output_time_axis=2) == []
    assert causality_probe(top_left, inputs, axes, output_time_axis=2) == []  # top-left sees less, not more
    assert_names(causality_probe(no_mask, inputs, axes, output_time_axis=2), "causality", 0.95)


def test_nondeterministic_implementation_is_not_judged():
    def noisy(inputs):
        return self_attention(None)(inputs) + torch.rand(B, T, D_MODEL, dtype=torch.float64)

    assert causality_probe(noisy, {"x": X}, time_axis=1) == []


def test_batch_statistics_mix_sequences():
    def batch_norm_by_mistake(inputs):
        x = inputs["x"]
        return (x - x.mean(0)) / x.std(0)  # normalised over the batch instead of the features

    cause = assert_names(batch_probe(batch_norm_by_mistake, {"x": X}, batch_axis=0), "batch_mixing", 0.95)
    assert "other sequences" in cause.summary


def test_reshape_merging_batch_and_time_mixes_sequences():
    def attention_over_flattened_batch(inputs):
        x = inputs["x"].reshape(1, B * T, D_MODEL)  # every token sees every other sequence's tokens
        return self_attention(None)({"x": x}).reshape(B, T, D_MODEL)

    assert_names(batch_probe(attention_over_flattened_batch, {"x": X}), "batch_mixing", 0.95)


def test_per_sequence_computation_passes_the_batch_probe():
    assert batch_probe(self_attention(causal(T, T)), {"x": X}) == []
    assert batch_probe(lambda i: torch.softmax(i["x"], -1), {"x": X}) == []


def _wrong_from(full, spans):
    out = full.clone()
    for start, n in spans:
        out[:, start : start + n] += 1.0
    return out


def test_cache_hints_read_which_chunks_are_wrong():
    """The cache tests' hint names the path from the first wrong chunk: a single token into an empty
    cache (decoding's own path), multi-token chunks after the cache only (the mask), or every later
    chunk (positions, most often); nothing when the pattern says none of these."""
    from spec_tests.test_kv_cache import chunk_hint

    full = torch.randn(2, 17, 5, dtype=torch.float64)
    hint, code = chunk_hint(_wrong_from(full, [(0, 17)]), full, [1, 16])
    assert "one token into an empty cache" in hint and code == "~boundary"
    hint, code = chunk_hint(_wrong_from(full, [(8, 9)]), full, [6, 1, 1, 9])
    assert "multi-token chunks that follow cached tokens" in hint and code == "knob:mask_alignment"
    hint, code = chunk_hint(_wrong_from(full, [(6, 11)]), full, [6, 1, 1, 9])
    assert "first chunk is right" in hint and code == "~knob:position_offset"
    assert chunk_hint(_wrong_from(full, [(0, 6)]), full, [6, 1, 1, 9]) == (None, "")
    assert chunk_hint(full.clone(), full, [6, 1, 1, 9]) == (None, "")
