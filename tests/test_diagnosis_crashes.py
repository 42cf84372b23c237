"""Crash probes (spec_tests/harness/diagnosis/crashes.py): a call that raises is retried on input variants, and
the property whose change makes it run is named; nothing is claimed when no variant runs."""

from __future__ import annotations

import torch
from suite_subprocess import implementation, run_suite

from spec_tests.harness.diagnosis.crashes import own_frame, probe


def randn(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype)


def rmsnorm_3d_only(x, w):
    b, t, d = x.shape  # the bug: any leading dims are allowed
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def test_rank_is_named():
    lines, codes = probe("rmsnorm", rmsnorm_3d_only, (randn(2, 3, 4, 8), randn(8)), {})
    assert codes == ["crash"]
    assert any("rmsnorm raises for 4-D input and works for 3-D" in line for line in lines), lines
    assert "any leading dims" in lines[0]


def sdpa_needs_mask(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))  # the bug: mask=None crashes
    return scores.softmax(-1) @ v


def test_none_mask_is_named():
    q = randn(1, 2, 5, 4)
    lines, _ = probe("scaled_dot_product_attention", sdpa_needs_mask, (q, q, q), {"mask": None})
    assert any("raises for mask=None and works for an all-True mask" in line for line in lines), lines


def rope_needs_full_positions(x, positions):
    angles = positions[..., None].double() * torch.ones(x.shape[-1] // 2, dtype=torch.float64)
    if angles.shape[:-1] != x.shape[:-1]:
        raise RuntimeError("shape mismatch")  # the bug: positions [T] do not broadcast
    return x * angles.cos().repeat_interleave(2, -1)


def test_broadcast_positions_are_named():
    lines, _ = probe("rope", rope_needs_full_positions, (randn(2, 3, 5, 4), torch.arange(5)), {})
    assert any("1-D positions [5] with a [2, 3, 5, 4] input" in line for line in lines), lines


def batcher_rejecting_exact_length(data, batch_size, context_length):
    if len(data) <= context_length + 1:  # the bug: exactly context_length + 1 tokens is enough
        raise ValueError("too little data")
    return data[:context_length][None].repeat(batch_size, 1)


def test_size_boundary_is_named():
    lines, _ = probe("get_batch", batcher_rejecting_exact_length, (torch.arange(9), 2, 8), {})
    assert any("a 1-D input of exactly 9 entries and works for 10 entries" in line for line in lines), lines


def float32_only(x):
    if x.dtype != torch.float32:
        raise TypeError("expected float32")
    return x


def test_dtype_is_named():
    lines, _ = probe("silu", float32_only, (randn(2, 3),), {})
    assert any("silu raises for float64 input and works for float32" in line for line in lines), lines


def always_raises(x, w):
    raise RuntimeError("broken")


def test_nothing_is_claimed_when_every_variant_raises():
    lines, codes = probe("rmsnorm", always_raises, (randn(2, 3, 4), randn(4)), {})
    assert codes == [] and not any(line.startswith("likely cause") for line in lines), lines
    assert lines and "does not depend on what was probed" in lines[0]


def test_own_frame_skips_the_suite_and_torch():
    try:
        torch.nn.functional.linear(randn(2, 3), randn(4, 5))
    except RuntimeError as exc:
        assert own_frame(exc).startswith("tests/test_diagnosis_crashes.py:"), own_frame(exc)


def test_a_crash_in_the_suite_names_its_trigger(tmp_path):
    """End to end: a copy of the reference whose rmsnorm accepts only 3-D input and whose get_batch rejects
    exactly context_length + 1 tokens; the failure reports say which input property makes each raise."""

    def edit(folder):
        norms = folder / "norms.py"
        norms.write_text(norms.read_text().replace("    xf = x.to(_compute_dtype(x))\n", "    b, t, d = x.shape\n"
                                                   "    xf = x.to(_compute_dtype(x))\n", 1))  # fmt: skip
        training = folder / "training.py"
        training.write_text(
            training.read_text().replace("len(tokens) < context_length + 1", "len(tokens) <= context_length + 1")
        )

    folder = implementation(tmp_path, edit=edit)
    proc = run_suite(f"--impl={folder}", "-k", "norm_statistics or exactly_enough", cwd=tmp_path)
    out = proc.stdout
    assert "rmsnorm raises for 2-D input and works for 3-D" in out, out[-3000:]
    assert "get_batch raises for a 1-D input of exactly 9 entries and works for 10 entries" in out, out[-3000:]
