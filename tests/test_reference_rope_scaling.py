"""The reference's RoPE scaling (protocol v2) against transformers' own ``ROPE_INIT_FUNCTIONS``.

Hugging Face computes the inverse frequencies in float32 and the reference in float64, so they agree to
float32 rounding (rtol 1e-5): any formula difference (a swapped factor, a missing ramp) is far larger.
"""

import math

import pytest
import torch

import reference as R
from reference.rope_scaling import check_rope_scaling, scaled_frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

SCALINGS = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "linear", "factor": 8.0},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16},
    {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 2.0,
        "high_freq_factor": 8.0,
        "original_max_position_embeddings": 512,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16, "beta_slow": 2},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "attention_factor": 0.9},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.7, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "truncate": False},
]


def hf_frequencies(scaling: dict, d_head: int, theta: float, seq_len=None):
    original = scaling.get("original_max_position_embeddings", 16)
    params = {**scaling, "rope_theta": theta}
    config = LlamaConfig(
        hidden_size=d_head * 4, num_attention_heads=4, max_position_embeddings=original, rope_parameters=params
    )
    freqs, attention = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu", seq_len=seq_len)
    return freqs.double(), float(attention)


@pytest.mark.parametrize("theta", [10000.0, 500.0])
@pytest.mark.parametrize("d_head", [10, 64])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_frequencies_equal_transformers(scaling, d_head, theta):
    lengths = (None, 10, 17, 200) if scaling["rope_type"] == "dynamic" else (None,)
    for seq_len in lengths:
        want, want_attention = hf_frequencies(scaling, d_head, theta, seq_len)
        got, attention = scaled_frequencies(d_head, theta, check_rope_scaling(scaling), seq_len)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
        assert math.isclose(attention, want_attention, rel_tol=1e-6), (attention, want_attention)


def test_rope_applies_the_frequencies_and_the_attention_factor():
    """rope with a scaling rotates pair i by position * f_i and multiplies by the attention factor."""
    d, theta = 10, 500.0
    x = torch.randn(2, 3, 7, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([0, 3, 15, 16, 17, 40, 63])
    for scaling in SCALINGS:
        freqs, attention = scaled_frequencies(d, theta, check_rope_scaling(scaling), 64)
        angles = pos.double()[:, None] * freqs
        x0, x1 = x[..., 0::2], x[..., 1::2]
        want = torch.stack((x0 * angles.cos() - x1 * angles.sin(), x0 * angles.sin() + x1 * angles.cos()), -1)
        want = want.flatten(-2) * attention
        torch.testing.assert_close(R.rope(x, pos, theta, scaling=scaling), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(R.rope(x, pos, theta, scaling=scaling, table_size=64), want, rtol=1e-12, atol=1e-12)


def test_linear_scaling_is_interpolated_positions():
    x = torch.randn(1, 2, 6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([0, 2, 4, 10, 30, 58])
    scaled = R.rope(x, pos, 500.0, scaling={"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(scaled, R.rope(x, pos // 2, 500.0), rtol=1e-12, atol=1e-12)


def test_model_with_rope_scaling_equals_its_components():
    """A llama model's attention uses the config's rope_scaling (the table path equals the computed one)."""
    config = dict(
        vocab_size=31, context_length=40, d_model=20, n_layers=1, n_heads=2, d_ff=24, rope_theta=500.0, family="llama"
    )
    ids = torch.randint(0, 31, (2, 40), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    plain = R.build_model(config).double()
    sd = R.canonical_state_dict(plain)
    for scaling in SCALINGS:
        model = R.build_model(dict(config, rope_scaling=scaling, attention="naive"), sd).double()
        fast = R.build_model(dict(config, rope_scaling=scaling), sd).double()
        got = R.forward(model, ids)
        torch.testing.assert_close(R.forward(fast, ids), got, rtol=1e-10, atol=1e-10)
        if scaling["rope_type"] != "dynamic" or scaling["original_max_position_embeddings"] < 40:
            assert not torch.allclose(got, R.forward(plain, ids)), scaling  # dynamic acts past its length only


@pytest.mark.parametrize(
    "scaling,words",
    [
        ({"rope_type": "cubic", "factor": 2.0}, "cubic"),
        ({"rope_type": "linear"}, "factor"),
        ({"rope_type": "linear", "factor": 0.5}, "0.5"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "high_freq_factor"),
        ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, "beta_fast"),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            },
            "low_freq_factor != high_freq_factor",
        ),
    ],
)
def test_bad_scalings_raise_naming_the_value(scaling, words):
    with pytest.raises(ValueError, match=words):
        R.rope(torch.zeros(1, 4, 10), torch.arange(4), scaling=scaling)


def test_config_defaults_and_family():
    base = dict(vocab_size=11, context_length=24, d_model=20, n_layers=1, n_heads=2, d_ff=8)
    model = R.build_model(dict(base, rope_scaling={"type": "dynamic", "factor": 2.0}))
    assert model.config.rope_scaling == {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 24}
    assert R.build_model(dict(base, rope_scaling={"rope_type": "default"})).config.rope_scaling is None
    with pytest.raises(ValueError, match="gpt2"):
        R.build_model(dict(base, family="gpt2", rope_scaling={"rope_type": "linear", "factor": 2.0}))
