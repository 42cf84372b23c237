"""Catalogued mistakes in RoPE scaling for long context (protocol v2, ``reference/rope_scaling.py``)."""

from __future__ import annotations

from .bug import Bug
from .model_components import FORWARD

BUGS = (
    Bug(
        "yarn_attention_factor_applied_twice",
        "rope_scaling",
        FORWARD,
        "model.py",
        old="            rope_scaling=cfg.rope_scaling,\n",
        new="""            rope_scaling=(  # the bug: the attention factor again on the scores (f ** 2 on cos and sin)
                {**cfg.rope_scaling, "attention_factor": (0.1 * math.log(cfg.rope_scaling["factor"]) + 1) ** 2}
                if cfg.rope_scaling and cfg.rope_scaling["rope_type"] == "yarn"
                else cfg.rope_scaling
            ),
""",
        explanation="the model applies YaRN's attention factor twice (on cos and sin, as Hugging Face does, and again "
        "on the softmax scale, as DeepSeek's MLA does), so the scores carry f ** 4; the rope function is right",
        fix="multiply cos and sin by the attention factor once; the softmax scale stays 1 / sqrt(d_head)",
        corner=True,
    ),
    Bug(
        "llama3_blend_weights_swapped",
        "rope_scaling",
        ("rope", *FORWARD),
        "rope_scaling.py",
        old="        interpolated = (1 - smooth) * base / factor + smooth * base",
        new="        interpolated = smooth * base / factor + (1 - smooth) * base",
        explanation="llama3's medium band blends the scaled and the plain frequency with the two weights swapped",
        fix="interpolated = (1 - smooth) * base / factor + smooth * base",
    ),
    Bug(
        "llama3_wavelength_bounds_swapped",
        "rope_scaling",
        ("rope", *FORWARD),
        "rope_scaling.py",
        old='        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])',
        new='        low, high = float(scaling["high_freq_factor"]), float(scaling["low_freq_factor"])',
        explanation="the llama3 wavelength rule reads low_freq_factor and high_freq_factor the wrong way round, so "
        "the pairs it should interpolate are divided by factor",
        fix="low_freq_wavelen = L0 / low_freq_factor (longer: divided), high_freq_wavelen = L0 / high_freq_factor "
        "(shorter: kept); smooth = (L0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)",
    ),
    Bug(
        "linear_scaling_applied_twice",
        "rope_scaling",
        ("rope", *FORWARD),
        "rope_scaling.py",
        old="        return base / factor, 1.0",
        new="        return base / factor / factor, 1.0",
        explanation="linear scaling divides the positions by factor and the frequencies by factor again: every "
        "angle is divided by factor**2",
        fix="divide either the positions or the inverse frequencies by factor, not both",
    ),
    Bug(
        "yarn_without_mscale",
        "rope_scaling",
        ("rope", *FORWARD),
        "rope_scaling.py",
        old="    return base / factor * (1 - extrapolate) + base * extrapolate, float(attention)",
        new="    return base / factor * (1 - extrapolate) + base * extrapolate, 1.0",
        explanation="YaRN's attention factor (mscale, 0.1 ln(factor) + 1) is not applied to cos and sin, so the "
        "attention logits are not sharpened",
        fix="multiply cos and sin by the attention factor (attention_factor, or 0.1 ln(factor) + 1 by default)",
    ),
    Bug(
        "dynamic_scaling_counts_positions",
        "rope_scaling",
        ("rope", *FORWARD),
        "positions.py",
        old="    seq_len = int(positions.max()) + 1 if positions.numel() else 0",
        new="    seq_len = positions.shape[-1]",
        explanation="dynamic NTK scaling takes the number of positions as the sequence length, not max(positions) "
        "+ 1: scattered or offset positions (a cache, a window) are scaled as a short sequence",
        fix="seq_len = max(positions) + 1 (as Hugging Face's dynamic_rope_update)",
    ),
)
