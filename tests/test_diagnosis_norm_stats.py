"""diagnosis/norm_stats.py: the mean a layernorm subtracted, read back row by row from its output."""

import torch

from spec_tests.harness.diagnosis.norm_stats import norm_statistics_causes


def layernorm(x, w, b, count=None, eps=1e-5):
    n = x.shape[-1]
    mean = x.sum(-1, keepdim=True) / (count or n)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 80, generator=g, dtype=torch.float64) + 0.5
    w = torch.rand(80, generator=g, dtype=torch.float64) + 0.5
    return x, w, torch.randn(80, generator=g, dtype=torch.float64)


def test_a_mean_over_a_padded_count_is_named_with_that_count():
    x, w, b = inputs()
    causes = norm_statistics_causes("layernorm", {"x": x, "weight": w, "bias": b}, layernorm(x, w, b, count=128))
    assert [c.code for c in causes] == ["knob:norm_count"], causes
    assert "sum divided by 128, not by its 80 entries" in causes[0].summary


def test_nothing_for_the_right_mean_another_name_or_a_non_affine_output():
    x, w, b = inputs()
    named = {"x": x, "weight": w, "bias": b}
    assert norm_statistics_causes("layernorm", named, layernorm(x, w, b)) == []  # the specified mean
    assert norm_statistics_causes("rmsnorm", named, layernorm(x, w, b, count=128)) == []
    assert norm_statistics_causes("layernorm", named, torch.tanh(layernorm(x, w, b, count=128))) == []
