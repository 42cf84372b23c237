"""Structural detectors: each names its own bug family on a synthetic buggy output and stays quiet
(no confident cause of that code) on an unrelated wrong output."""

import math

import pytest
import torch
import torch.nn.functional as F
from diagnosis_cases import (
    D_MODEL,
    EXACT,
    F32_MATMUL,
    H_KV,
    B,
    D,
    H,
    T,
    V,
    assert_names,
    assert_not_confident,
    attention_probs,
    best,
    causal,
    noise_like,
    qkv,
    randn,
    rope_complex,
    sdpa,
    uniform,
)

from spec_tests.harness.diagnosis import structural_causes
from spec_tests.harness.diagnosis.codes import is_valid


def diagnose(expected, actual, tol=EXACT, **kw):
    causes = structural_causes(expected, actual, **tol, **kw)
    assert all(is_valid(c.code) for c in causes)
    return causes


HEADS = randn(B, H, T, D, seed=1)  # a per-head tensor [B, H, T, d]
MERGED = HEADS.transpose(1, 2).reshape(B, T, D_MODEL)  # heads merged correctly: [B, T, H*d]
LOGITS = randn(B, T, V, seed=2, scale=3.0)


def test_correct_output_has_no_causes():
    assert diagnose(HEADS, HEADS.clone(), axes="b h t d") == []


# --- layout -----------------------------------------------------------------------------------


@pytest.mark.parametrize("axes", ["b t (h d)", None], ids=["named", "unnamed"])
def test_heads_merged_without_transpose_is_layout(axes):
    wrong = HEADS.reshape(B, T, D_MODEL)  # [B, H, T, d] viewed as [B, T, H*d]
    cause = assert_names(diagnose(MERGED, wrong, axes=axes), "layout", 0.95)
    assert "reshape" in cause.summary
    if axes:
        assert "[b, h, t, d]" in cause.summary and cause.summary.startswith("heads merged without transposing back")


def test_square_weight_transposed_is_layout():
    w = randn(D_MODEL, D_MODEL, seed=3)
    cause = assert_names(diagnose(w, w.T.contiguous(), axes="out in"), "layout", 0.95)
    assert "axes out and in are transposed" in cause.summary


def test_heads_permuted_is_layout():
    perm = torch.tensor([3, 0, 7, 1, 6, 2, 5, 4])
    cause = assert_names(diagnose(HEADS, HEADS[:, perm], axes="b h t d"), "layout", 0.95)
    assert "sigma = [3, 0, 7, 1, 6, 2, 5, 4]" in cause.summary


@pytest.mark.parametrize(
    "wrong",
    [noise_like(MERGED, 4), MERGED * 1.5, MERGED.roll(1, dims=1)],
    ids=["noise", "scaled", "shifted"],
)
def test_layout_not_claimed_for_other_mistakes(wrong):
    assert_not_confident(diagnose(MERGED, wrong, axes="b t (h d)"), "layout")


# --- scale ------------------------------------------------------------------------------------


def test_constant_factor_is_named():
    cause = assert_names(diagnose(HEADS, HEADS / math.sqrt(D), axes="b h t d"), "scale", 0.95)
    assert "1/sqrt(10)" in cause.summary


def test_factor_named_from_the_inputs_head_size():
    q, k, v = qkv(h_kv=H)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    cause = assert_names(diagnose(scores, scores / math.sqrt(D), inputs={"q": q, "k": k}), "scale", 0.95)
    assert "1/sqrt(d) for d = 10" in cause.summary


def test_per_row_factor_of_a_norm():
    """rmsnorm with eps outside the root: every row off by its own factor."""
    x = randn(B, T, D_MODEL, seed=5, scale=3e-3)
    w = uniform(D_MODEL, low=0.5, high=1.5, seed=6)
    expected = F.rms_norm(x, (D_MODEL,), w, 1e-5)
    wrong = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5) * w
    cause = assert_names(diagnose(expected, wrong, axes="b t d", inputs={"x": x, "weight": w}), "scale")
    assert "each row" in cause.summary


def test_norm_weight_applied_twice_names_the_weight():
    x = randn(B, T, D_MODEL, seed=7)
    w = uniform(D_MODEL, low=0.5, high=1.5, seed=8)
    expected = F.rms_norm(x, (D_MODEL,), w, 1e-5)
    cause = assert_names(diagnose(expected, expected * w, axes="b t d", inputs={"x": x, "weight": w}), "scale")
    assert "'weight'" in cause.summary and "applied twice" in cause.summary


def test_softmax_of_scaled_scores_is_a_power():
    """Attention probabilities with the scores scaled by 1/d instead of 1/sqrt(d): p**(1/sqrt(d)) renormalised."""
    q, k, _ = qkv(h_kv=H)
    expected = attention_probs(q, k, causal(T, T))
    wrong = attention_probs(q, k, causal(T, T), scale=1 / D)
    cause = assert_names(diagnose(expected, wrong, axes="b h q k"), "scale", 0.95)
    assert "1/sqrt(10)" in cause.summary


def test_zeroed_entries_are_not_a_factor():
    """Filtered distributions (some tokens zeroed, the rest renormalised) are not a per-token factor, even
    when every row happens to keep the same mass."""
    logits = torch.tensor([[0.5, 0.3, 0.12, 0.08], [0.45, 0.35, 0.12, 0.08]], dtype=torch.float64).log()
    p = torch.softmax(logits, -1)
    filtered = torch.zeros_like(p)
    filtered[:, :2] = p[:, :2] / p[:, :2].sum(-1, keepdim=True)
    assert best(diagnose(p, filtered, axes="b v"), "scale") is None


@pytest.mark.parametrize("wrong", [noise_like(HEADS, 9), HEADS.roll(1, dims=2)], ids=["noise", "shifted"])
def test_scale_not_claimed_for_other_mistakes(wrong):
    assert_not_confident(diagnose(HEADS, wrong, axes="b h t d"), "scale")


def test_a_constant_added_to_the_logits_is_an_offset():
    """Logits capped as 2c·sigmoid(2x/c) = c + c·tanh(x/c) (held-out batch 32's speedrun form): the expected ones plus
    c everywhere; a constant per row (a bias of each row) is said per row; noise and a shift are no offset."""
    cap = 1.5
    expected = cap * torch.tanh(LOGITS / cap)
    cause = assert_names(diagnose(expected, 2 * cap * torch.sigmoid(2 * LOGITS / cap), axes="b t v"), "offset")
    assert "plus 1.5 everywhere" in cause.summary
    rows = LOGITS + torch.arange(LOGITS.shape[1], dtype=LOGITS.dtype)[None, :, None]
    assert "its own constant" in assert_names(diagnose(LOGITS, rows, axes="b t v"), "offset", 0.9).summary
    assert_not_confident(diagnose(HEADS, noise_like(HEADS, 9), axes="b h t d"), "offset")
    assert_not_confident(diagnose(HEADS, HEADS.roll(1, dims=2), axes="b h t d"), "offset")


# --- shift ------------------------------------------------------------------------------------


def test_shift_by_one_along_time():
    wrong = torch.zeros_like(LOGITS)
    wrong[:, 1:] = LOGITS[:, :-1]
    cause = assert_names(diagnose(LOGITS, wrong, axes="b t v"), "shift")
    assert "+1 along t" in cause.summary and "vacated" in cause.evidence


def test_roll_is_an_exact_shift():
    cause = assert_names(diagnose(LOGITS, LOGITS.roll(-2, dims=1), axes="b t v"), "shift", 0.95)
    assert "-2 along t" in cause.summary


def test_positions_that_restart():
    """A position table for a second chunk of 8 tokens after 5 cached ones, with positions restarting at 0."""
    table = randn(T, D_MODEL, seed=30)  # row p: the embedding of position p
    wrong = torch.cat((table[:5], table[:8]))
    cause = assert_names(diagnose(table, wrong, axes="p d"), "shift")
    assert "restarts at p = 5" in cause.summary


@pytest.mark.parametrize("wrong", [noise_like(LOGITS, 10), LOGITS * 2], ids=["noise", "scaled"])
def test_shift_not_claimed_for_other_mistakes(wrong):
    assert_not_confident(diagnose(LOGITS, wrong, axes="b t v"), "shift")


# --- no-op ------------------------------------------------------------------------------------


def test_output_equal_to_input_is_noop():
    pos = torch.arange(5, 5 + T)
    expected = rope_complex(HEADS, pos)
    cause = assert_names(
        diagnose(expected, HEADS.clone(), axes="b h t d", inputs={"x": HEADS, "positions": pos}), "noop"
    )
    assert "'x' unchanged" in cause.summary


def test_softmax_of_input_is_noop_function():
    x = randn(B, T, V, seed=11)
    expected = F.gelu(x)
    cause = assert_names(diagnose(expected, torch.softmax(x, dim=1), inputs={"x": x}), "noop")
    assert "softmax over axis 1" in cause.summary


def test_noop_when_shape_also_wrong():
    """repeat_kv returning its input: shape [B, 2, T, d] instead of [B, 8, T, d], values = the input."""
    x = randn(B, H_KV, T, D, seed=12)
    causes = diagnose(x.repeat_interleave(4, dim=1), x.clone(), inputs={"x": x})
    assert_names(causes, "noop")
    assert "shape" in {c.code for c in causes}


def test_noop_not_claimed_for_noise():
    pos = torch.arange(T)
    expected = rope_complex(HEADS, pos)
    assert_not_confident(diagnose(expected, noise_like(expected, 13), inputs={"x": HEADS}), "noop")


# --- masks ------------------------------------------------------------------------------------


def test_top_left_mask_in_attention_probabilities():
    t_q = 6
    q, k, _ = qkv(h_kv=H, t_q=t_q)
    expected = attention_probs(q, k, causal(t_q, T))
    wrong = attention_probs(q, k, torch.ones(t_q, T, dtype=torch.bool).tril())  # top-left aligned
    causes = diagnose(expected, wrong, axes="b h q k")
    cause = assert_names(causes, "mask", 0.8)
    assert "top-left" in cause.summary
    assert_not_confident(causes, "layout")


def test_bool_mask_without_diagonal():
    cause = assert_names(diagnose(causal(T, T), causal(T, T, diagonal_shift=-1), axes="q k"), "mask", 0.95)
    assert "diagonal excluded" in cause.summary


def test_bool_mask_inverted():
    assert_names(diagnose(causal(4, T), ~causal(4, T)), "mask", 0.95)


def test_bool_mask_offset_with_the_wrong_sign():
    t_q, t_k = 9, T
    i, j = torch.arange(t_q)[:, None], torch.arange(t_k)[None, :]
    cause = assert_names(diagnose(causal(t_q, t_k), j <= i - (t_k - t_q), axes="q k"), "mask", 0.95)
    assert "wrong sign" in cause.summary


def test_masked_scores_not_masked():
    """Scores [B, H, T, T] with -inf above the diagonal; the bug leaves them finite."""
    q, k, _ = qkv(h_kv=H)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    expected = scores.masked_fill(~causal(T, T), float("-inf"))
    cause = assert_names(diagnose(expected, scores, axes="b h q k"), "mask", 0.8)
    assert "not applied" in cause.summary


def test_attention_rows_all_but_last_wrong():
    """An attention output [B, H, T, d] computed without the causal mask: only the last query row is right."""
    q, k, v = qkv()
    expected = sdpa(q, k, v, causal(T, T))
    cause = assert_names(diagnose(expected, sdpa(q, k, v), axes="b h t d"), "mask", 0.8)
    assert "last" in cause.summary


@pytest.mark.parametrize("kind", ["noise", "transposed"])
def test_mask_not_claimed_for_other_mistakes(kind):
    q, k, _ = qkv(h_kv=H)
    expected = attention_probs(q, k)
    wrong = noise_like(expected, 14) if kind == "noise" else expected.transpose(-1, -2)
    causes = diagnose(expected, wrong, axes="b h q k")
    assert best(causes, "mask") is None
    if kind == "transposed":
        assert_names(causes, "layout", 0.95)


# --- boundary ---------------------------------------------------------------------------------


def test_wrong_only_in_last_block():
    """Flash attention whose last partial block (t >= 12 for block 4, T=13) is handled wrongly."""
    q, k, v = qkv()
    expected = sdpa(q, k, v, causal(T, T))
    wrong = expected.clone()
    wrong[:, :, 12:] = 0.0
    cause = assert_names(diagnose(expected, wrong, axes="b h t d"), "boundary", 0.8)
    assert "t = 12" in cause.summary


@pytest.mark.parametrize("kind", ["noise", "scaled", "first_row_right"])
def test_boundary_not_claimed_for_other_mistakes(kind):
    q, k, v = qkv()
    expected = sdpa(q, k, v, causal(T, T))
    if kind == "noise":
        wrong = noise_like(expected, 15)
    elif kind == "scaled":
        wrong = expected * 1.1
    else:  # a scale bug in causal attention: row 0 (one key) is right whatever the scale
        wrong = sdpa(q, k, v, causal(T, T), scale=1.0)
    for axes in ("b h t d", None):
        assert best(diagnose(expected, wrong, axes=axes), "boundary") is None


# --- precision --------------------------------------------------------------------------------


def test_float32_rounding_is_precision():
    x = randn(B, T, D_MODEL, seed=16)
    w = uniform(D_MODEL, low=0.5, high=1.5, seed=17)
    expected = F.rms_norm(x, (D_MODEL,), w, 1e-5)
    wrong = F.rms_norm(x.float(), (D_MODEL,), w.float(), 1e-5).double()  # computed in float32, returned float64
    cause = assert_names(diagnose(expected, wrong, axes="b t d", inputs={"x": x, "weight": w}), "precision")
    assert "float32" in cause.summary


def test_float16_rounding_is_precision():
    expected = randn(B, T, D_MODEL, seed=18)
    assert_names(diagnose(expected, expected.half().double(), axes="b t d"), "precision")


def test_small_systematic_error_is_not_precision():
    """An error of 1e-6 relative that grows with the value (x * |x|) is math, however small: no factor fits it,
    and it is correlated with the values, which rounding is not."""
    expected = randn(B, T, D_MODEL, seed=33)
    wrong = expected + 1e-6 * expected * expected.abs()
    assert best(diagnose(expected, wrong, axes="b t d"), "precision") is None


@pytest.mark.parametrize("kind", ["eps_value", "noise"])
def test_precision_not_claimed_for_math(kind):
    """eps 1e-6 instead of 1e-5 on unit inputs: an error of ~5e-6, but a per-row factor, not rounding."""
    x = randn(B, T, D_MODEL, seed=19)
    w = uniform(D_MODEL, low=0.5, high=1.5, seed=20)
    expected = F.rms_norm(x, (D_MODEL,), w, 1e-5)
    wrong = F.rms_norm(x, (D_MODEL,), w, 1e-6) if kind == "eps_value" else noise_like(expected, 21)
    causes = diagnose(expected, wrong, axes="b t d")
    assert_not_confident(causes, "precision", below=0.7)
    if kind == "eps_value":
        assert_names(causes, "scale")


# --- RoPE pairing -----------------------------------------------------------------------------


def test_rotate_half_without_minus_is_rope_pairing():
    pos = torch.arange(5, 5 + T)
    expected = rope_complex(HEADS, pos, style="half")
    d2 = D // 2
    freqs = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.cat([pos[:, None] * freqs] * 2, dim=-1)
    x1, x2 = HEADS[..., :d2], HEADS[..., d2:]
    wrong = HEADS * ang.cos() + torch.cat((x2, x1), dim=-1) * ang.sin()  # rotate_half without the minus
    cause = assert_names(diagnose(expected, wrong, axes="b h t d"), "rope_pairing", 0.8)
    assert "first-half" in cause.summary


def test_interleaved_odd_channels():
    pos = torch.arange(T)
    expected = rope_complex(HEADS, pos)
    wrong = expected.clone()
    wrong[..., 1::2] = HEADS[..., 1::2]  # the odd channel of each pair never rotated
    assert_names(diagnose(expected, wrong, axes="b h t d"), "rope_pairing", 0.8)


@pytest.mark.parametrize("kind", ["other_style", "noise"])
def test_rope_pairing_not_claimed_for_other_mistakes(kind):
    pos = torch.arange(5, 5 + T)
    expected = rope_complex(HEADS, pos, style="interleaved")
    wrong = rope_complex(HEADS, pos, style="half") if kind == "other_style" else noise_like(expected, 22)
    assert best(diagnose(expected, wrong, axes="b h t d"), "rope_pairing") is None


# --- non-finite -------------------------------------------------------------------------------


def test_first_row_nan_is_nan_rows():
    """Attention whose mask excludes the diagonal: query 0 has no key left, its output row is NaN."""
    q, k, v = qkv()
    expected = sdpa(q, k, v, causal(T, T))
    wrong = expected.clone()
    wrong[:, :, 0] = float("nan")
    cause = assert_names(diagnose(expected, wrong, axes="b h t d"), "nan_rows")
    assert "t = [0]" in cause.summary


def test_nan_rows_without_any_mask_point_at_the_max_subtracted():
    """softmax subtracting the whole tensor's max: rows far below it underflow to 0/0; no input is masked."""
    x = randn(B, V, seed=25) * 10
    x[1] += 1e4
    expected = torch.softmax(x, -1)
    shifted = (x - x.max()).exp()
    wrong = shifted / shifted.sum(-1, keepdim=True)
    cause = assert_names(diagnose(expected, wrong, inputs={"x": x}), "nan_rows", 0.8)
    assert "no input is masked" in cause.summary and "own max" in cause.where and "filtered out" in cause.summary


def test_softmax_overflow():
    x = randn(B, V, seed=23) * 1e4
    expected = torch.softmax(x, -1)
    with torch.no_grad():
        wrong = (x.float().exp() / x.float().exp().sum(-1, keepdim=True)).double()  # no max subtraction
    cause = assert_names(diagnose(expected, wrong, tol=F32_MATMUL, inputs={"x": x}), "overflow", 0.7)
    assert "the inputs reach |x| =" in cause.evidence
    # inf where the expected value is finite has several causes (no max subtracted, the log of an underflowed
    # softmax, float16 squares): a symptom, shown as weak evidence; the knob search names the mechanism
    assert cause.confidence < 0.8


@pytest.mark.parametrize("kind", ["noise", "nan_rows"])
def test_overflow_not_claimed_for_finite_or_row_errors(kind):
    expected = randn(B, T, V, seed=31)
    wrong = noise_like(expected, 32)
    if kind == "nan_rows":
        wrong = expected.clone()
        wrong[:, 0] = float("nan")
    assert best(diagnose(expected, wrong, axes="b t v"), "overflow") is None


def test_scattered_nan_is_not_nan_rows():
    expected = randn(B, T, V, seed=24)
    wrong = expected.clone()
    wrong[0, 3, 5] = wrong[2, 7, 1] = float("nan")
    causes = diagnose(expected, wrong, axes="b t v")
    assert best(causes, "nan_rows") is None
    assert_names(causes, "overflow", 0.6)


# --- sign -------------------------------------------------------------------------------------


def test_negated_output_is_sign():
    assert_names(diagnose(LOGITS, -LOGITS, axes="b t v"), "sign", 0.95)


@pytest.mark.parametrize("wrong", [noise_like(LOGITS, 25), LOGITS * -0.5], ids=["noise", "scaled"])
def test_sign_not_claimed_for_other_mistakes(wrong):
    assert_not_confident(diagnose(LOGITS, wrong, axes="b t v"), "sign")


# --- shape and dtype --------------------------------------------------------------------------


def test_unreduced_loss_is_shape():
    per_token = randn(B * T, seed=26).abs()
    cause = assert_names(diagnose(per_token.mean(), per_token), "shape", 0.95)
    assert "mean" in cause.summary


def test_axes_swapped_by_shape_is_layout():
    cause = assert_names(diagnose(HEADS, HEADS.transpose(1, 2), axes="b h t d"), "layout", 0.95)
    assert "[b, t, h, d]" in cause.summary


def test_heads_left_unmerged_is_shape():
    assert_names(diagnose(MERGED, HEADS.clone(), axes="b t d"), "shape", 0.95)


def test_one_short_along_an_axis():
    cause = assert_names(diagnose(LOGITS, LOGITS[:, :-1].clone(), axes="b t v"), "shape", 0.9)
    assert "12 entries instead of 13" in cause.summary


def test_float_mask_is_dtype():
    m = causal(4, T)
    assert_names(diagnose(m, m.double()), "dtype", 0.95)
    additive = torch.zeros(4, T, dtype=torch.float64).masked_fill(~m, float("-inf"))
    assert "additive" in assert_names(diagnose(m, additive), "dtype", 0.95).evidence


def test_float32_output_for_float64_inputs_is_dtype():
    x = randn(B, T, D_MODEL, seed=27)
    assert_names(diagnose(x.exp(), x.exp().float(), inputs={"x": x}, tol=F32_MATMUL), "dtype")


def test_shape_and_dtype_not_claimed_when_both_right():
    x = randn(B, T, D_MODEL, seed=28)
    causes = diagnose(x, noise_like(x, 29), inputs={"x": x})
    assert best(causes, "shape") is None and best(causes, "dtype") is None


def test_nan_rows_beside_a_boolean_mask_are_not_said_to_have_no_mask():
    """Rows of NaN where a boolean mask is among the inputs: a row with every key masked, never "no input is masked"
    (bool inputs were left out of the inputs the detectors read)."""
    expected = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    actual = expected.clone()
    actual[:, 4] = float("nan")
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    inputs = {"q": expected + 1.0, "mask": mask}
    causes = structural_causes(expected, actual, axes="b t d", inputs=inputs, atol=1e-8, rtol=1e-8)
    said = [c.summary for c in causes if c.code == "nan_rows"]
    assert said and all("no input is masked" not in s for s in said), said


def test_every_row_nan_with_no_inputs_recorded_is_not_read_as_a_mask():
    """Every row of a weight read back NaN, with no inputs recorded to read a mask from (held-out batch 63's loader
    leaving a projection in torch.empty's memory): a NaN reached every position, said without confidence, never
    "a row with every key masked" with it. Some rows NaN, the others right, stays the mask's reading."""
    expected = torch.randn(6, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    causes = structural_causes(expected, torch.full_like(expected, float("nan")), atol=1e-8, rtol=1e-8)
    said = [c for c in causes if c.code == "nan_rows"]
    assert said and all("every key masked" not in c.summary and c.confidence < 0.8 for c in said), said
    assert "never filled" in said[0].summary
    one_row = expected.clone()
    one_row[0] = float("nan")
    causes = structural_causes(expected, one_row, atol=1e-8, rtol=1e-8)
    assert any("every key masked" in c.summary for c in causes if c.code == "nan_rows"), causes


def test_rope_pairing_needs_a_named_channel_axis():
    """A distribution over the vocabulary wrong only in its even entries (probabilities put back on the wrong ids)
    names no RoPE pairing: the last axis is not a named channel axis (held-out batches 28 and 30)."""
    expected = torch.rand(4, 8, dtype=torch.float64)
    wrong = expected.clone()
    wrong[:, 0::2] = wrong[:, 0::2].flip(-1)
    assert best(diagnose(expected, wrong), "rope_pairing") is None
    assert best(diagnose(expected, wrong, axes="b v"), "rope_pairing") is None


def test_a_reshape_where_a_transpose_belongs_is_named():
    """A [V, d] head ported to [d, V] by reshape and brought back by .T (held-out batch 31): the same entries in
    another order of the flat buffer; a plain transpose of a square matrix is not read as one."""
    expected = torch.randn(7, 5, dtype=torch.float64)
    cause = assert_names(diagnose(expected, expected.reshape(5, 7).T.contiguous()), "layout", 0.8)
    assert "reshape where a transpose belongs" in cause.summary
    square = torch.randn(6, 6, dtype=torch.float64)
    assert not any("reshape where" in c.summary for c in diagnose(square, square * 1.5))


def test_nested_sequences_describe_their_first_differing_tensor():
    """A cache's layers of (keys, values): the first tensor that differs is described under its path (a preallocated
    buffer handed back whole: its time axis longer, the written part right)."""
    from spec_tests.harness.diagnosis import diagnose
    from spec_tests.harness.judging.tolerances import tolerance

    g = torch.Generator().manual_seed(3)
    want = [tuple(torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64) for _ in "kv") for _ in range(2)]
    got = [tuple(torch.cat([t, torch.zeros(2, 2, 7, 4, dtype=t.dtype)], dim=2) for t in layer) for layer in want]
    lines, codes = diagnose(
        subject="cache_kv",
        call=None,
        args64=(),
        actual=got,
        expected=want,
        tol=tolerance("model"),
        axes=None,
        rope_style="half",
        known_bugs=lambda: [],
    )
    assert codes[:1] == ["shape"], lines
    said = "likely cause: [0][0]: axis dim 2 has 12 entries instead of 5: the 5 expected ones, then 7 zeros: a "
    assert lines[0].startswith(said + "preallocated buffer handed back whole"), lines
