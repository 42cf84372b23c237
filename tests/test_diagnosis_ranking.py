"""Ranking and the ``likely cause`` lines: confusable pairs are told apart, several fitting causes are listed
ranked, ambiguous evidence is said to be ambiguous, and no wrong name is stated with confidence."""

import pytest
import torch
from diagnosis_cases import (
    H_KV,
    B,
    D,
    H,
    T,
    V,
    assert_names,
    assert_not_confident,
    attention_probs,
    batch_logits,
    causal,
    noise_like,
    qkv,
    randn,
    sampling_probs,
    sdpa,
)
from diagnosis_knob_cases import POSITIVE

from spec_tests.harness.diagnosis import Cause, describe, knob_causes, rank, structural_causes

EXACT = dict(atol=1e-10, rtol=1e-10)


def cause(code, confidence, source="structural", summary=None):
    return Cause(code, summary or f"{code} summary", "here", "fix it", "measured", confidence, source=source)


def confident(lines):
    return bool(lines) and lines[0].startswith("likely cause: ")


# --- rank and describe on their own -----------------------------------------------------------


def test_rank_orders_by_confidence_then_specificity():
    layout = cause("layout", 0.95)
    knob = cause("knob:gqa_mapping", 0.95, source="knob")
    weak = cause("boundary", 0.8)
    assert rank([weak, layout, knob, layout]) == [knob, layout, weak]


def test_describe_lists_every_fitting_cause_ranked():
    causes = [cause("boundary", 0.8), cause("knob:top_k", 0.95, source="knob"), cause("scale", 0.9)]
    lines = describe(causes)
    assert lines[0] == rank(causes)[0].line()
    assert lines[0].startswith("likely cause: knob:top_k summary")
    assert [line.split(": ", 1)[1].split(".")[0] for line in lines] == [
        "knob:top_k summary",
        "scale summary",
        "boundary summary",
    ]
    assert all(line.startswith("likely cause") for line in lines)


def test_describe_says_nothing_without_causes():
    assert describe([]) == []
    assert describe([cause("layout", 0.3)]) == []


def test_weak_evidence_is_not_stated_confidently():
    lines = describe([cause("boundary", 0.7)])
    assert lines[0].startswith("likely cause (weak evidence, 0.70): ")


def test_close_conflicting_structural_causes_are_ambiguous():
    lines = describe([cause("layout", 0.95), cause("scale", 0.9)])
    assert lines[0].startswith("likely cause (ambiguous, 2 fit): ")
    assert not any(line.startswith("likely cause: ") for line in lines)


def test_two_views_of_one_mistake_are_not_ambiguous():
    """A shift and a permutation (or a mask and a boundary) describe one geometric mistake."""
    assert confident(describe([cause("shift", 0.95), cause("layout", 0.9)]))
    assert confident(describe([cause("mask", 0.85), cause("boundary", 0.8)]))


# --- confusable pairs -------------------------------------------------------------------------


def test_transposed_probabilities_are_layout_not_mask():
    q, k, _ = qkv(h_kv=H)
    expected = attention_probs(q, k, causal(T, T))
    causes = structural_causes(expected, expected.transpose(-1, -2), axes="b h q k", **EXACT)
    assert rank(causes)[0].code == "layout"
    assert_not_confident(causes, "mask", below=0.5)
    lines = describe(causes)
    assert confident(lines) and "transposed" in lines[0]


def test_misaligned_mask_is_mask_not_layout():
    t_q = 6
    q, k, _ = qkv(h_kv=H, t_q=t_q)
    expected = attention_probs(q, k, causal(t_q, T))
    wrong = attention_probs(q, k, torch.ones(t_q, T, dtype=torch.bool).tril())
    causes = structural_causes(expected, wrong, axes="b h q k", **EXACT)
    assert rank(causes)[0].code == "mask"
    assert_not_confident(causes, "layout")
    lines = describe(causes)
    assert confident(lines) and "top-left" in lines[0]


def test_attention_scale_is_scale_constant_not_temperature():
    q, k, v = qkv()
    m = causal(T, T)
    actual = sdpa(q, k, v, m, scale=1 / D)
    causes = knob_causes("scaled_dot_product_attention", (q, k, v, m), {}, actual, **EXACT)
    causes += structural_causes(sdpa(q, k, v, m), actual, axes="b h t d", **EXACT)
    assert rank(causes)[0].code == "knob:scale_constant"
    assert "knob:temperature" not in {c.code for c in causes}
    lines = describe(causes)
    assert confident(lines) and "divided by d_head (10)" in lines[0]


def test_temperature_twice_is_temperature_not_scale_constant():
    logits = batch_logits()
    expected, actual = sampling_probs(logits, 0.7), torch.softmax(logits / 0.49, -1)
    causes = knob_causes("sampling_probs", (logits,), {"temperature": 0.7}, actual, **EXACT)
    causes += structural_causes(expected, actual, axes="b v", **EXACT)
    assert_names(causes, "scale", 0.95)  # the structural view: the distribution sharpened by 1/0.7
    assert rank(causes)[0].code == "knob:temperature"
    assert "knob:scale_constant" not in {c.code for c in causes}
    lines = describe(causes)
    assert confident(lines) and "applied twice" in lines[0]
    assert any("also fits" in line and "power" in line for line in lines[1:])


def test_tiled_gqa_is_gqa_mapping_first():
    x = randn(B, H_KV, T, D, seed=51)
    expected, actual = x.repeat_interleave(4, dim=1), x.repeat(1, 4, 1, 1)
    causes = knob_causes("repeat_kv", (x, 4), {}, actual, **EXACT)
    causes += structural_causes(expected, actual, axes="b h t d", **EXACT)
    assert rank(causes)[0].code == "knob:gqa_mapping"
    assert_names(causes, "layout")
    lines = describe(causes)
    assert confident(lines) and "tiled" in lines[0]


def test_head_permutation_is_layout_not_gqa_mapping():
    q, k, v = qkv()
    expected = sdpa(q, k, v, causal(T, T))
    actual = expected[:, torch.tensor([1, 0, 2, 3, 5, 4, 7, 6])]
    causes = knob_causes("scaled_dot_product_attention", (q, k, v, causal(T, T)), {}, actual, **EXACT)
    causes += structural_causes(expected, actual, axes="b h t d", **EXACT)
    assert "knob:gqa_mapping" not in {c.code for c in causes}
    assert rank(causes)[0].code == "layout"
    assert confident(describe(causes))


def test_two_knob_settings_that_fit_are_ambiguous():
    """top_k=3, top_p=0.9 on [0.5, 0.3, 0.12, 0.08]: keeping k-1 tokens and dropping the crossing token give
    the same distribution; the lines must not pick one."""
    logits = torch.tensor([[0.5, 0.3, 0.12, 0.08], [0.45, 0.35, 0.12, 0.08]], dtype=torch.float64).log() + 3.0
    p = torch.softmax(logits, -1)
    actual = torch.zeros_like(p)
    actual[:, :2] = p[:, :2] / p[:, :2].sum(-1, keepdim=True)
    causes = knob_causes("sampling_probs", (logits,), dict(top_k=3, top_p=0.9), actual, **EXACT)
    causes += structural_causes(sampling_probs(logits, 1.0, 3, 0.9), actual, axes="b v", **EXACT)
    assert {c.code for c in causes if c.source == "knob"} == {"knob:top_k", "knob:top_p_boundary"}
    assert all(c.confidence < 0.9 for c in causes if c.source == "knob")
    lines = describe(causes)
    assert lines[0].startswith("likely cause (ambiguous, 2 fit): ")
    assert "top-k keeps k-1 tokens" in lines[0] and "drops the token that crosses" in lines[0]
    assert not any(line.startswith("likely cause: ") for line in lines)


def test_swapped_columns_with_a_factor_pattern_are_ambiguous():
    """When expected has a symmetry, two unrelated transforms reproduce actual: say so."""
    u = randn(B, T, 1, seed=3)
    expected = torch.cat((u, 2 * u), dim=-1)  # column 1 is twice column 0
    causes = structural_causes(expected, expected.flip(-1), axes="b t c", **EXACT)
    assert {"layout", "scale"} <= {c.code for c in causes if c.confidence >= 0.9}
    lines = describe(causes)
    assert lines[0].startswith("likely cause (ambiguous, 2 fit): ")


def test_noise_gives_no_lines():
    q, k, v = qkv()
    m = causal(T, T)
    expected = sdpa(q, k, v, m)
    actual = noise_like(expected, 5)
    causes = knob_causes("scaled_dot_product_attention", (q, k, v, m), {}, actual, **EXACT)
    causes += structural_causes(expected, actual, axes="b h t d", inputs={"q": q, "k": k, "v": v}, **EXACT)
    assert describe(causes) == []


# --- no confident wrong name over the whole knob catalogue of bugs ----------------------------


@pytest.mark.parametrize("case,label", POSITIVE, ids=[f"{c.name}-{label}" for c, label in POSITIVE])
def test_first_line_names_the_bug(case, label):
    """With structural and knob causes together, the first line is confident and names the bug's code."""
    make, code = case.bugs[label]
    with torch.no_grad():
        actual = make()
    causes = case.diagnose(actual) + structural_causes(case.correct, actual, **case.tol)
    assert rank(causes)[0].code == code
    assert confident(describe(causes))


def test_float32_result_lists_dtype_and_precision():
    """A float32 result for float64 inputs: the dtype and the rounding both fit, one mistake, two lines."""
    x = randn(B, T, V, seed=4)
    expected = torch.softmax(x, -1)
    causes = structural_causes(expected, torch.softmax(x.float(), -1), axes="b t v", inputs={"x": x}, **EXACT)
    lines = describe(causes)
    assert confident(lines) and len(lines) == 2
    assert {"dtype", "precision"} == {c.code for c in causes}
    assert lines[1].startswith("likely cause (also fits, 0.90): ")
