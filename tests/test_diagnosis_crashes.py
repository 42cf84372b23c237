"""Crash probes (spec_tests/harness/diagnosis/crashes.py): a call that raises is retried on input variants, and
the property whose change makes it run is named; nothing is claimed when no variant runs."""

from __future__ import annotations

import importlib.util
import json
import math

import torch
from suite_subprocess import implementation, run_suite

from spec_tests.bugs.bug import replace_once
from spec_tests.harness.diagnosis.crashes import own_frame, probe, probes_for

pytest_plugins = ["pytester"]


def cache_through_a_ledger(subject, config, model, fed=()):
    """A new cache of ``model`` (batch 2) with the id chunks ``fed`` forwarded into it, and the ``Ledger`` that
    recorded it all as a test's calls would have: ``(ledger, cache)``."""
    from spec_tests.harness.diagnosis.model_variants import Ledger

    ledger = Ledger(subject)
    ledger.record("build", (config, None), {}, model)
    cache = subject.new_cache(model, 2)
    ledger.record("new_cache", (model, 2), {}, cache)
    for ids in fed:
        subject.forward(model, ids, cache)
        ledger.record("forward", (model, ids, cache), {}, None)
    return ledger, cache


def never_cached(subject):
    """A forward that raises for any call through a cache: the control of the cached-path probes."""

    def forward(model, ids, cache=None):
        if cache is not None:
            raise RuntimeError("the cache is broken")
        return subject.forward(model, ids, cache)

    return forward


def cached_call_lines(subject, config, ids, fn):
    """The crash lines of ``fn(model, ids, cache)`` on a model built from ``config`` and a new cache of it."""
    from spec_tests import models

    model = subject.build(config, models.random_state_dict(config, seed=1))
    ledger, cache = cache_through_a_ledger(subject, config, model)
    return probe("forward", fn, (model, ids, cache), {}, ledger)[0]


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
    want = "a 1-D input of exactly 9 entries (9 - 1 = 1 x context_length: its predictions fill 1 whole window) and "
    assert any(want + "works for 10 entries" in line for line in lines), lines


def probs_rejecting_top_k_of_the_vocabulary(logits, temperature=1.0, top_k=None, top_p=None):
    if top_k is not None and top_k >= logits.shape[-1]:  # the bug: a top_k of the whole vocabulary keeps it all
        raise ValueError(f"top_k must be below the vocabulary size, got {top_k}")
    return torch.softmax(logits / temperature, -1)


def test_a_size_that_matters_against_a_keyword_is_said_against_it():
    """Held out (batch 77): upstream's range check on top_k. The last axis runs from some size up, and top_k lies
    between the sizes that raise and those that run, so the line says the size against top_k, not a least width."""
    lines, _ = probe("sampling_probs", probs_rejecting_top_k_of_the_vocabulary, (randn(3, 67),), {"top_k": 70})
    assert any("the size matters against top_k=70" in line for line in lines), lines
    assert not any("assumes a size of at least" in line for line in lines), lines


def angles_of_each_row_against_the_heads(x, positions=None):
    """Held out (batch 98): per-row angles ``[B, T, d/2]`` broadcast against ``[B, H, T, d/2]`` without a head axis,
    so the batch axis meets the heads' axis: right for a batch of one row, a shape error for others."""
    b, h, t, d = x.shape
    angles = torch.arange(t, dtype=x.dtype)[None, :, None].expand(b, t, d)
    return x * angles.cos()  # the bug: angles[:, None] was meant


def test_a_batch_of_several_rows_is_named_where_each_row_alone_runs():
    lines, _ = probe("rope", angles_of_each_row_against_the_heads, (randn(3, 4, 5, 2),), {})
    assert any("rope raises for a batch of 3 rows and works for one row alone" in line for line in lines), lines


def one_bad_row(x, w):
    if bool((x[2:3] > 1e3).any()):  # the control: the third row's values, not the number of rows
        raise ValueError("overflow")
    return x * w


def test_a_row_whose_values_raise_is_not_read_as_the_batch_size():
    x = randn(3, 4, 8)
    x[2] += 1e4
    lines, _ = probe("rmsnorm", one_bad_row, (x, randn(8)), {})
    assert not any("a batch of 3 rows" in line for line in lines), lines


def evaluate_padding_short_windows_with_minus_one(data, context_length, batch_size=8):
    """Held out (batch 99): windows padded with -1 into one batch, the padding fed to the embedding; a short last
    window raises only where it shares a batch with a full one and is more than one token short."""
    n = len(data) - 1
    starts = list(range(0, n, context_length))
    for b in range(0, len(starts), batch_size):
        lens = [min(context_length, n - s) for s in starts[b : b + batch_size]]
        if max(lens) - min(lens) > 1:  # the -1 padding reaches the inputs
            raise IndexError("index out of range in self")
    return {"loss": 1.0, "perplexity": math.e}


def test_a_window_structure_that_varies_with_a_size_is_not_read_as_its_parity():
    lines, _ = probe(
        "evaluate", evaluate_padding_short_windows_with_minus_one, (torch.arange(40), 7), {"batch_size": 3}
    )
    assert not any("an odd size" in line for line in lines), lines


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


def test_a_variant_that_runs_out_of_memory_ends_probing():
    """Memory running out is a raise under an address-space limit and a kill under a memory cgroup: a variant that
    runs out ends probing as a lost process would, so the lines are the same on either machine (both kinds of
    raise, torch's allocator and Python's)."""
    from spec_tests.harness.diagnosis.crashes import out_of_memory

    for exhausted in (
        MemoryError(),
        RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory"),
    ):

        def rmsnorm_3d_or_runaway(x, w, exhausted=exhausted):
            if x.dim() != 3:
                raise exhausted
            raise RuntimeError("broken")

        assert out_of_memory(exhausted)
        lines, codes = probe("rmsnorm", rmsnorm_3d_or_runaway, (randn(2, 3, 4), randn(4)), {})
        assert (lines, codes) == ([], []), lines
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError("memory layout"))


def test_own_frame_skips_the_suite_and_torch():
    try:
        torch.nn.functional.linear(randn(2, 3), randn(4, 5))
    except RuntimeError as exc:
        assert own_frame(exc).startswith("tests/test_diagnosis_crashes.py:"), own_frame(exc)


def test_a_crash_in_the_suite_names_its_trigger(tmp_path, pytester):
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
    proc = run_suite(f"--impl={folder}", "-k", "norm_statistics or exactly_enough", cwd=tmp_path, pytester=pytester)
    out = proc.stdout
    assert "rmsnorm raises for 2-D input and works for 3-D" in out, out[-3000:]
    assert "get_batch raises for a 1-D input of exactly 9 entries (9 - 1 = 1 x context_length" in out, out[-3000:]


def nll_of_batched_logits(logits, targets):
    b, t, v = logits.shape  # the bug: amendment 3 allows logits [..., V] with targets [...]
    return -logits.log_softmax(-1).gather(-1, targets[..., None]).mean()


def test_rank_is_named_for_inputs_that_share_the_leading_dim():
    """The targets get the leading dim the logits get: a rank probe that changed the logits alone would break the
    call for another reason and wrongly conclude that the rank is not the trigger."""
    logits, targets = randn(12, 7), torch.arange(12) % 7
    lines, codes = probe("cross_entropy", nll_of_batched_logits, (logits, targets), {})
    assert codes == ["crash"] and "cross_entropy raises for 2-D input and works for 3-D" in lines[0], lines
    assert "any leading dims" in lines[0]


def lookup_of_batched_ids(ids, weight):
    b, t = ids.shape  # the bug: ids [...] of any rank
    return weight[ids]


def test_rank_of_an_integer_first_argument_is_named():
    lines, _ = probe("embedding", lookup_of_batched_ids, (torch.arange(5), randn(9, 4)), {})
    assert any("embedding raises for 1-D input and works for 2-D" in line for line in lines), lines


def attention_needing_positions(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    if theta is not None:
        positions.shape  # the bug: positions default to arange(T)  # noqa: B018
    return x


def test_an_omitted_optional_argument_is_given_what_none_means():
    """``positions`` is not passed at all: the protocol's meaning of None (``Entry.none_means``) is tried."""
    x, w = randn(2, 5, 8), randn(8, 8)
    lines, _ = probe("multihead_self_attention", attention_needing_positions, (x, w, w, w, w, 2, 2), {"theta": 1e4})
    assert any("raises for positions=None and works for positions=arange(T)" in line for line in lines), lines


def step_always_clipping(model, optimizer, x, y, max_grad_norm=None):
    return float(min(max_grad_norm, 1.0))  # the bug: None means no clipping


def test_max_grad_norm_none_is_named():
    model = torch.nn.Linear(3, 3)
    lines, _ = probe("train_step", step_always_clipping, (model, None, torch.zeros(2, 4), torch.zeros(2, 4)), {})
    assert any("raises for max_grad_norm=None and works for max_grad_norm=inf" in line for line in lines), lines


def forward_rejecting_a_full_context(ids, context_length=8):
    if ids.shape[1] >= context_length:  # the bug: exactly context_length tokens are allowed
        raise ValueError("too long")
    return ids


def test_a_length_limit_is_named_once_by_the_nearest_length_that_runs():
    lines, _ = probe("forward", forward_rejecting_a_full_context, (torch.zeros(2, 8, dtype=torch.long),), {})
    causes = [line for line in lines if line.startswith("likely cause")]
    assert len(causes) == 1 and "a [B, T] id input of T=8 tokens and works for T=7" in causes[0], lines


def rope_needing_one_row(x, positions):
    if positions.ndim != 1:
        raise RuntimeError("outer() needs 1-D")  # the bug: positions broadcastable to x.shape[:-1] are allowed
    return x


def test_fuller_positions_are_named():
    x, positions = randn(3, 2, 6, 4), torch.arange(6).repeat(3, 1)[:, None, :]
    lines, _ = probe("rope", rope_needing_one_row, (x, positions), {})
    assert any("3-D positions [3, 1, 6] with a [3, 2, 6, 4] input and works for positions 1-D [6]" in line
               for line in lines), lines  # fmt: skip


def forward_of_a_float32_cache(model, ids):
    if next(model.parameters()).dtype != torch.float32:
        raise RuntimeError("expected scalar type Float but found Double")  # the bug: the cache is always float32
    return ids


def test_a_models_dtype_is_named_on_a_copy():
    model = torch.nn.Linear(3, 3).double()
    lines, _ = probe("forward", forward_of_a_float32_cache, (model, torch.zeros(1, 4, dtype=torch.long)), {})
    assert any("raises for a float64 model and works for the same model in float32" in line for line in lines), lines
    assert model.weight.dtype == torch.float64  # probed on a copy


def attention_without_head_sharing(q, k, v, causal=True, block_size=64):
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v  # the bug: 2 kv heads do not broadcast against 8


def test_gqa_is_named():
    q, kv = randn(2, 8, 5, 4), randn(2, 2, 5, 4)
    lines, _ = probe("flash_attention", attention_without_head_sharing, (q, kv, kv), {"causal": True})
    assert any("k and v with 2 heads beside 8 query heads (GQA) and works for k and v repeated" in line
               for line in lines), lines  # fmt: skip


def probs_with_a_pivot_of_2d_logits(logits, temperature=1.0, top_k=None, top_p=None):
    if top_k is not None and top_k < logits.shape[-1]:
        v = torch.topk(logits, top_k).values
        return logits.masked_fill(logits < v[:, [-1]], float("-inf")).softmax(-1)  # the bug: [B, V] logits only
    return logits.softmax(-1)


def test_sizes_that_run_only_below_top_k_are_a_clue_not_a_cause():
    """Held out (batch 87): gpt-fast's top-k pivot v[:, [-1]] raises for 3-D logits. The last axis runs only at sizes
    top_k covers (the filter has nothing to do there): that is top_k's path, so the size is said as a clue."""
    lines, _ = probe("sampling_probs", probs_with_a_pivot_of_2d_logits, (randn(2, 1, 3, 67),), {"top_k": 9})
    size = [line for line in lines if "last-axis size" in line]
    assert size and all(line.startswith("note:") and "top_k=9 covers" in line for line in size), lines


def probs_of_a_multiple_of_8(logits, temperature=1.0, top_k=None, top_p=None):
    blocks = logits.reshape(*logits.shape[:-1], -1, 8)  # the bug: a kernel of 8-wide blocks, no tail
    return blocks.softmax(-1).reshape(logits.shape)


def test_sizes_that_run_only_at_multiples_are_said_as_such():
    """Held out (batch 87): gpt-fast rounds its cache up to a multiple of 8 and not its mask. Where exactly the sizes
    that are multiples of 8 run, the line says the code needs a multiple of 8, not a least size."""
    lines, _ = probe("sampling_probs", probs_of_a_multiple_of_8, (randn(2, 1, 3, 67),), {})
    assert any("that is a multiple of 8" in line for line in lines), lines


def probs_with_unclamped_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    return torch.topk(logits, top_k).values  # the bug: top_k above V keeps every token


def test_a_count_above_the_axis_is_named():
    lines, _ = probe("sampling_probs", probs_with_unclamped_top_k, (randn(3, 7),), {"top_k": 9})
    assert any("top_k=9, above the last axis's 7 entries and works for top_k=7" in line for line in lines), lines


def bytes_through_numpy(config, batch_size, seq_len, dtype=torch.float32):
    import numpy as np

    return np.dtype(str(dtype).removeprefix("torch.")).itemsize  # the bug: numpy has no bfloat16


def test_a_dtype_argument_is_named():
    lines, _ = probe("kv_cache_bytes", bytes_through_numpy, ({}, 2, 3), {"dtype": torch.bfloat16})
    assert any("raises for dtype bfloat16 and works for float32" in line for line in lines), lines


def linear_needing_a_bias(x, weight, bias=None):
    return torch.addmm(bias, x, weight.T)  # the bug: bias=None is no bias


def test_an_omitted_bias_is_given_zeros():
    lines, _ = probe("linear", linear_needing_a_bias, (randn(3, 4), randn(5, 4)), {})
    assert any("raises for bias=None and works for a zero bias" in line for line in lines), lines


def cached_step_of_one_token(ids):
    if ids.shape[1] > 1:
        raise RuntimeError("one slot per step")  # the bug: a cached chunk of several tokens
    return ids


def test_a_chunk_that_only_works_token_by_token_is_a_clue_not_a_cause():
    """One token runs where a wrong shape broadcasts by chance (a cache appended on the head axis): said as a
    note, never a likely cause."""
    lines, codes = probe("forward", cached_step_of_one_token, (torch.zeros(2, 9, dtype=torch.long),), {})
    assert codes == [] and not any(line.startswith("likely cause") for line in lines), lines
    assert any(line.startswith("note: forward raises for a [B, T] id input of T=9 tokens and works for T=1")
               for line in lines), lines  # fmt: skip


def test_a_size_boundary_stands_for_the_boundary_code():
    lines, codes = probe("forward", forward_rejecting_a_full_context, (torch.zeros(2, 8, dtype=torch.long),), {})
    assert codes == ["boundary"], (codes, lines)


def bytes_needing_n_kv_heads(config, batch_size, seq_len, dtype=torch.float32):
    return 2 * config["n_kv_heads"] * seq_len * batch_size  # the bug: n_kv_heads defaults to n_heads


def test_a_config_default_is_written_out():
    config = {"vocab_size": 10, "context_length": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16}
    lines, _ = probe("kv_cache_bytes", bytes_needing_n_kv_heads, (config, 2, 3), {})
    causes = [line for line in lines if line.startswith("likely cause")]
    assert len(causes) == 1 and "leaves optional keys out and works for n_kv_heads=2 written out" in causes[0], lines


def table_with_even_width(seq_len, d_model):
    table = torch.zeros(seq_len, d_model)
    table[:, 1::2] = torch.ones(seq_len, (d_model + 1) // 2)  # the bug: ceil(d/2) cosine columns
    return table


def test_an_odd_size_is_named():
    lines, _ = probe("sinusoidal_positions", table_with_even_width, (5, 7), {})
    assert any("raises for an odd size 7 (argument 2) and works for 8" in line for line in lines), lines


def nucleus_needing_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    if top_p is not None and top_k < logits.shape[-1]:  # the bug: top_k=None means every token
        return logits
    return logits


def test_top_k_none_is_given_every_token():
    lines, _ = probe("sampling_probs", nucleus_needing_top_k, (randn(2, 6),), {"top_p": 0.9})
    assert any("raises for top_k=None and works for top_k=6 (every token)" in line for line in lines), lines


def flash_with_a_square_mask_table(q, k, v, causal=True, block_size=64):
    t_q, t_k = q.shape[-2], k.shape[-2]
    rows, cols = torch.arange(t_q)[:, None], torch.arange(t_k)[None, :]
    allowed = torch.ones(t_q, t_q, dtype=torch.bool).tril(t_k - t_q)[rows, cols]  # the bug: a [t_q, t_q] table
    return (q @ k.transpose(-2, -1)).masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def test_more_keys_than_queries_is_named():
    q, k = randn(2, 4, 5, 8), randn(2, 4, 9, 8)
    lines, codes = probe("flash_attention", flash_with_a_square_mask_table, (q, k, k), {"block_size": 4})
    assert codes == ["boundary"]
    expected = "raises for 9 keys beside 5 queries and works for as many keys as queries (5)"
    assert any(expected in line for line in lines), lines


def batcher_squeezing_a_batch_of_one(data, batch_size, context_length, generator=None):
    starts = torch.randint(0, len(data) - context_length, (batch_size, 1), generator=generator).squeeze()
    x = torch.stack([data[s : s + context_length] for s in starts[:, None][:, 0]])  # the bug: B=1 squeezed to 0-d
    return x, x


def test_a_count_of_one_is_named():
    args = (torch.arange(20), 1, 8)
    lines, codes = probe("get_batch", batcher_squeezing_a_batch_of_one, args, {"generator": torch.Generator()})
    assert codes == ["boundary"]
    assert any("get_batch raises for batch_size=1 and works for batch_size=2" in line for line in lines), lines


def train_with_an_interval_of_a_tenth(model, data, steps, batch_size, context_length, lr=1e-3, seed=0):
    every = steps // 10  # the bug: 0 for fewer than ten steps
    return [float(step % every) for step in range(steps)]


def test_a_small_count_is_named():
    lines, _ = probe("train", train_with_an_interval_of_a_tenth, (None, torch.arange(50), 3, 4, 8), {})
    assert any("train raises for steps=3 and works for steps=30" in line for line in lines), lines
    assert not any("batch_size" in line or "context_length" in line for line in lines), lines


def attention_splitting_kv_in_equal_thirds(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    qkv = x @ torch.cat([wq, wk, wv]).T
    q, k, v = qkv.chunk(3, dim=-1)  # the bug: equal thirds, right only without GQA
    b, t, _ = x.shape
    q, k, v = (z.reshape(b, t, n_heads, -1).transpose(1, 2) for z in (q, k, v))
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def test_gqa_weights_are_named():
    d, h, h_kv, dh = 16, 4, 2, 4
    args = (randn(2, 5, d), randn(h * dh, d), randn(h_kv * dh, d), randn(h_kv * dh, d), randn(d, h * dh), h, h_kv)
    lines, _ = probe("multihead_self_attention", attention_splitting_kv_in_equal_thirds, args, {})
    expected = "raises for n_kv_heads=2 beside n_heads=4 (GQA) and works for the key and value weights repeated to 4"
    assert any(expected in line for line in lines), lines


def top_k_for_2d_logits_only(logits, temperature=1.0, top_k=None, top_p=None):
    if top_k is not None and top_k < logits.shape[-1]:
        ranked = logits.sort(-1, descending=True).values
        kth = ranked.gather(-1, torch.full((logits.shape[0], 1), top_k - 1))  # the bug: [B, V] logits only
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return (logits / temperature).softmax(-1)


def test_a_filter_turned_off_by_a_larger_count_is_not_a_cause():
    """top_k ten times larger than 9 is above V and skips the filter that raises: never "works for top_k=90"."""
    lines, _ = probe("sampling_probs", top_k_for_2d_logits_only, (randn(2, 3, 67),), {"top_k": 9})
    assert not any("top_k=90" in line for line in lines), lines
    assert any("raises for 3-D input and works for 2-D" in line for line in lines), lines


def rope_with_a_fixed_table(x, positions, theta=10000.0):
    table = torch.ones(4096, x.shape[-1], dtype=x.dtype)  # the bug: cos/sin kept for 4096 positions only
    return x * torch.nn.functional.embedding(positions, table)


def test_far_positions_are_named():
    x, positions = randn(2, 5, 4), torch.tensor([0, 3, 700, 5000, 9001])
    lines, codes = probe("rope", rope_with_a_fixed_table, (x, positions), {})
    assert codes == ["boundary"]
    assert any(
        "rope raises for positions up to 9001 and works for the same positions modulo 1024" in ln for ln in lines
    )
    near = [p.working for p in probes_for("rope", (x, torch.tensor([0, 3, 700, 1500, 2047])), {})]
    assert "the same positions modulo 1024" not in near, near  # positions of a typical context are not probed


def rope_with_a_table_cut_to_the_length(x, positions):
    t, half = x.shape[-2], x.shape[-1] // 2
    table = torch.arange(64, dtype=torch.float64)[:, None] * torch.ones(half, dtype=torch.float64)
    angles = table[:t][positions]  # the bug: the table is cut to the sequence length before it is indexed
    return x * angles.cos().repeat_interleave(2, -1)


def test_positions_past_the_number_of_tokens_are_named():
    """A cos/sin table cut to T raises for positions at or past T: named as such, not as a size of the input."""
    x = randn(2, 5, 4)
    lines, codes = probe("rope", rope_with_a_table_cut_to_the_length, (x, torch.tensor([3, 4, 5, 6, 9])), {})
    assert codes == ["boundary"], lines
    assert any(
        "rope raises for positions up to 9 with 5 tokens and works for the same positions moved below 5" in ln
        for ln in lines
    ), lines
    within = [p.working for p in probes_for("rope", (x, torch.tensor([0, 1, 2, 3, 4])), {})]
    assert not any("moved below" in w for w in within), within  # positions below T are not probed
    # one token [3, 1, 4] at position 1: merging the leading dims into T runs too, but only the values' variant is said
    lines, _ = probe("rope", rope_with_a_table_cut_to_the_length, (randn(3, 1, 4), torch.tensor([1])), {})
    assert any("positions up to 1 with 1 tokens" in ln for ln in lines), lines
    assert not any("input and works for" in ln for ln in lines), lines


def repeat_kv_view_after_expand(x, n_rep):
    b, h, t, d = x.shape  # the bug: .view of an expanded axis works for one kv head only
    return x[:, :, None].expand(b, h, n_rep, t, d).view(b, h * n_rep, t, d)


def test_several_kv_heads_are_named():
    lines, codes = probe("repeat_kv", repeat_kv_view_after_expand, (randn(2, 3, 5, 4), 2), {})
    assert codes == ["crash"]
    assert any("repeat_kv raises for 3 kv heads repeated 2 times and works for one kv head" in ln for ln in lines)


def build_stacking_qkv(config, state_dict):
    stacked = torch.stack([state_dict[f"layers.0.attn.{w}.weight"] for w in ("wq", "wk", "wv")])  # the bug
    return stacked.sum(0)


def test_a_gqa_model_is_named():
    config = {"n_heads": 4, "n_kv_heads": 2, "d_model": 8}
    weights = {f"layers.0.attn.{w}.weight": randn(rows, 8) for w, rows in (("wq", 8), ("wk", 4), ("wv", 4))}
    lines, _ = probe("build_model", build_stacking_qkv, (config, weights), {})
    assert any("build_model raises for a GQA config (n_kv_heads=2 beside n_heads=4)" in ln for ln in lines), lines


def generate_needing_top_p(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
    if abs(top_p - 1.0) < 1e-6:  # the bug: the protocol's default top_p=None
        return prompt
    return prompt


def test_an_omitted_sampling_option_of_generate_is_given_what_none_means():
    lines, _ = probe("generate", generate_needing_top_p, (torch.nn.Identity(), torch.zeros(1, 3).long(), 2), {})
    assert any("generate raises for top_p=None and works for top_p=1.0" in ln for ln in lines), lines


def sdpa_tiling_queries_by_four(q, k, v, mask=None):
    q.unflatten(-2, (-1, 4))  # the bug: a query count that is not a multiple of 4 raises
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def test_an_argument_given_by_position_is_not_said_to_be_none():
    q = randn(1, 2, 5, 4)
    mask = torch.ones(5, 5, dtype=torch.bool)
    lines, _ = probe("scaled_dot_product_attention", sdpa_tiling_queries_by_four, (q, q, q, mask), {})
    assert not any("mask=None" in line for line in lines), lines


def test_a_models_config_is_named_through_the_model_it_was_built_from(tmp_path, pytester):
    """End to end: a copy of the reference whose train_step raises for a model with several kv heads shared by groups
    of query heads. The model is an argument the suite built (``spec.impl.build``): the crash is retried on the model
    built again with one config property changed (its optimizer made again over it), and the change that runs names
    the trigger (``diagnosis/model_variants.py``)."""

    def edit(folder):
        training = folder / "training.py"
        training.write_text(
            training.read_text().replace(
                "    model.train()\n    optimizer.zero_grad(set_to_none=True)\n",
                "    model.train()\n    if 1 < model.config.n_kv_heads < model.config.n_heads:\n"
                "        raise RuntimeError('custom backward: one kv head only')\n"
                "    optimizer.zero_grad(set_to_none=True)\n",
                1,
            )
        )

    folder = implementation(tmp_path, edit=edit)
    selected = "test_train_step_matches_reference and llama-no-clip-sgd"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    said = "train_step raises for a GQA model (n_kv_heads=2 beside n_heads=8) and works for the same model with"
    assert said in out, out[-3000:]


def silu_needing_a_leading_dim(x):
    x.shape[0]  # the bug: silu is elementwise, a 0-d tensor is an input too
    return x * torch.sigmoid(x)


def test_a_0d_input_of_an_elementwise_name_is_named():
    lines, _ = probe("silu", silu_needing_a_leading_dim, (torch.tensor(0.5, dtype=torch.float64),), {})
    assert any("silu raises for a 0-d input and works for 1-D" in line for line in lines), lines


def sdpa_tiling_queries_by_64(q, k, v, mask=None):
    if q.shape[-2] > 64:
        q.unflatten(-2, (-1, 64))  # the bug: above one tile, a query count that is not a multiple of 64 raises
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def test_a_size_of_an_axis_is_named_when_nothing_specific_runs():
    """No specific probe runs (the mask is given, the dtype and rank are not the trigger): the sizes of the first
    tensor's axes are tried, each on every tensor axis of that size alike, and the one that runs is named."""
    q = randn(1, 2, 135, 4)
    mask = torch.ones(135, 135, dtype=torch.bool).tril()
    lines, codes = probe("scaled_dot_product_attention", sdpa_tiling_queries_by_64, (q, q, q, mask), {})
    axes = "q's axis 2, k's axis 2, v's axis 2, mask's axis 0, mask's axis 1"
    said = f"raises for a size of 135 ({axes}) and works for 256 (every entry kept, repeated)"
    assert any(said in line for line in lines), lines
    assert codes == ["boundary"]


def attention_limited_to_100_queries(q, k, v, mask=None):
    if q.shape[-2] > 100:
        raise ValueError("too many queries")  # the bug: the protocol sets no such limit
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def nan_rows_raise(q, k, v, mask=None):
    if torch.isnan(q[..., 100:, :]).any():
        raise RuntimeError("nan")  # a crash on values, not on a size
    return q


def test_a_size_limit_is_a_clue_and_a_crash_on_values_is_no_size():
    """Cutting an axis keeps a prefix: the limit runs below it, and the kept entries copied back to the full size
    raise again, so the size is the cause; a crash on values (a NaN past row 100) runs when cut as well, but its
    copies run too, so it is a clue, never a cause; growing keeps every entry, so the NaN crash raises there and no
    size is named as its cause."""
    q = randn(1, 2, 135, 4)
    lines, codes = probe("scaled_dot_product_attention", attention_limited_to_100_queries, (q, q, q), {})
    limit = "works for 67 (its first 67); 135 entries copied from those raise as well"
    assert codes == ["boundary"] and any(ln.startswith("likely cause") and limit in ln for ln in lines), lines
    q[..., 120, :] = float("nan")
    lines, codes = probe("scaled_dot_product_attention", nan_rows_raise, (q, q, q), {})
    assert codes == [] and not any(ln.startswith("likely cause") for ln in lines), lines


def test_sizes_are_not_tried_when_a_specific_property_runs():
    lines, _ = probe("rmsnorm", rmsnorm_3d_only, (randn(2, 3, 4, 8), randn(8)), {})
    assert not any("a size of" in line for line in lines), lines


def causal_mask_from_a_square(t_q, t_k, device=None):
    square = torch.ones(t_k, t_k, dtype=torch.bool).tril()
    rows = square[t_k - t_q :]  # the bug: more queries than keys leaves too few rows
    if rows.shape[0] != t_q:
        raise RuntimeError(f"shape {tuple(rows.shape)}")
    return rows


def test_an_integer_size_above_another_is_a_clue():
    """Said as a clue, never a cause: a smaller value of the same call may run for another reason (a held-out
    evaluate needing (n - 1) % context_length == 0 ran with context_length set to its batch_size)."""
    lines, codes = probe("causal_mask", causal_mask_from_a_square, (16, 13), {})
    said = "note: causal_mask raises for t_q=16 and works for t_q=13 (as t_k)"
    assert any(line.startswith(said) for line in lines) and codes == [], lines


def sdpa_with_a_matrix_mask(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask.expand(q.shape[-2], k.shape[-2]), float("-inf"))
    return scores.softmax(-1) @ v  # the bug: a mask with leading dims (broadcastable) is expanded to 2-D


def test_a_mask_with_leading_dims_is_named():
    q = randn(2, 3, 5, 4)
    mask = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 1, 5, 5)
    lines, _ = probe("scaled_dot_product_attention", sdpa_with_a_matrix_mask, (q, q, q, mask), {})
    said = "raises for a 4-D mask [2, 1, 5, 5] and works for the same mask as [5, 5]"
    assert any(said in line for line in lines), lines


def test_probing_stops_at_a_variant_that_takes_the_process_down():
    """In grading a variant that times out or crashes the worker costs a restart, and restarts are limited: the first
    such variant ends probing (a chaos submission's probes once used up its 25 restarts, and its later tests could
    not run)."""
    from spec_tests.harness.subject.subject import ImplementationError

    calls = []

    def rmsnorm_lost(x, w):
        calls.append(x.shape)
        raise ImplementationError("rmsnorm", ("Crash",), "the worker crashed", process=True)

    lines, codes = probe("rmsnorm", rmsnorm_lost, (randn(2, 3, 4, 8), randn(8)), {})
    assert len(calls) == 1 and (lines, codes) == ([], [])

    def rmsnorm_raises(x, w):
        calls.append(x.shape)
        raise ImplementationError("rmsnorm", ("RuntimeError",), "shape")

    calls.clear()
    probe("rmsnorm", rmsnorm_raises, (randn(2, 3, 4, 8), randn(8)), {})
    assert len(calls) > 1  # an ordinary raise is probed on


def evaluate_windows_dividing_the_data(model, data, context_length, batch_size=8):
    if (len(data) - 1) % context_length:  # the bug: a shorter last window indexes past the end
        raise IndexError("index out of range")
    return 0.0


def test_a_limit_or_a_parity_needs_its_control_to_hold():
    """A change that runs names a limit, a parity or a multiple only where further variants agree: 36 entries run
    where 35 raise, but 37 raise again (no minimum length) and 39 too (not a multiple of batch_size 3); context_length
    7 -> 8 runs, but 9 raises again (no parity); context_length 7 -> 3 (as batch_size) runs, but 4 raises again (no
    limit). What is said is the size the windows need: one more than a multiple of context_length (43 runs too)."""
    lines, codes = probe("evaluate", evaluate_windows_dividing_the_data, (None, torch.arange(35), 7, 3), {})
    causes = [ln for ln in lines if ln.startswith("likely cause")]
    said = "raises for a size of 35 (data's axis 0) with context_length=7 and works for 36, one more than a multiple"
    assert len(causes) == 1 and said in causes[0], lines
    assert codes == ["boundary"]


def flash_needing_whole_key_blocks(q, k, v, causal=True, block_size=64):
    if k.shape[-2] % block_size:  # the bug: the last key block is assumed full
        raise RuntimeError("The size of tensor a must match the size of tensor b")
    return q


def test_a_size_that_must_be_a_multiple_of_an_integer_argument_is_named():
    q, k = randn(1, 2, 7, 4), randn(1, 2, 9, 4)
    lines, codes = probe("flash_attention", flash_needing_whole_key_blocks, (q, k, k), {"block_size": 4})
    said = "raises for a size of 9 (k's axis 2, v's axis 2) with block_size=4 and works for 12, a multiple of"
    assert any(said in line for line in lines), lines
    assert codes == ["boundary"]


def attention_needing_n_kv_heads(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, theta=None, positions=None):
    if n_heads % n_kv_heads:  # the bug: None means n_heads
        raise ValueError("bad heads")
    return x


def test_an_omitted_n_kv_heads_is_given_n_heads():
    x, w = randn(2, 5, 8), randn(8, 8)
    lines, _ = probe("multihead_self_attention", attention_needing_n_kv_heads, (x, w, w, w, w, 2), {})
    assert any("raises for n_kv_heads=None and works for n_kv_heads=2 (n_heads)" in line for line in lines), lines


def repeat_kv_inferring_heads(x, n_rep):
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, -1, t, d)  # the bug: -1 is ambiguous for t = 0


def test_an_empty_axis_is_named():
    lines, codes = probe("repeat_kv", repeat_kv_inferring_heads, (randn(1, 2, 0, 4), 3), {})
    assert any("raises for an empty axis (x's axis 2 of size 0) and works for one entry there" in ln for ln in lines)
    assert codes == ["boundary"]


def sampling_probs_dividing_first(logits, temperature=1.0, top_k=None, top_p=None):
    scaled = logits * (1.0 / temperature)  # the bug: temperature 0 (greedy) is handled after this
    return torch.softmax(scaled, -1)


def test_a_float_argument_of_zero_is_named():
    lines, _ = probe("sampling_probs", sampling_probs_dividing_first, (randn(2, 9),), {"temperature": 0.0})
    assert any("raises for temperature=0 and works for temperature=0.001" in ln for ln in lines), lines


def cross_entropy_flattening_leading_axes(logits, targets, ignore_index=-100):
    flat = logits.flatten(0, -2)  # the bug: a 1-D [V] logits row has no leading axis to flatten
    return torch.nn.functional.cross_entropy(flat, targets.reshape(-1), ignore_index=ignore_index)


def test_rank_is_named_with_a_0d_target_beside_1d_logits():
    lines, _ = probe("cross_entropy", cross_entropy_flattening_leading_axes, (randn(9), torch.tensor(3)), {})
    said = "raises for 1-D input and works for 2-D (a leading dim added to it and to the inputs sharing its leading"
    assert any(said in ln for ln in lines), lines


def test_a_family_is_named_on_fresh_models_of_both_families():
    """A call that raises for every gpt2 model (fresh weights too) and runs for a llama one of the same sizes names the
    family; the gpt2 config's odd head size (RoPE needs an even one) takes the nearest head count that gives an even
    one, and gpt2 with that head count must raise too. A crash on these weights' values names nothing."""
    from spec_tests import models
    from spec_tests.harness.diagnosis.model_variants import Ledger
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    ledger = Ledger(subject)
    config = dict(models.CONFIGS["gpt2"])  # d_model 42, 6 heads: a head size of 7
    model = subject.build(config, models.random_state_dict(config, seed=1))
    ledger.record("build", (config, None), {}, model)

    def new_cache_reading_rotary_sizes(model, batch_size):
        if model.config.family == "gpt2":  # the bug: the head size is read from the rotary tables
            raise AttributeError("'NoneType' object has no attribute 'head_dim'")
        return subject.new_cache(model, batch_size)

    lines, _ = probe("new_cache", new_cache_reading_rotary_sizes, (model, 2), {}, ledger=ledger)
    said = "new_cache raises for a gpt2 model and works for a llama model of the same sizes with n_heads=7"
    assert any(said in ln for ln in lines), lines

    first = model.tok_embeddings.weight.detach().clone()

    def new_cache_raising_on_these_weights(m, batch_size):
        if torch.equal(m.tok_embeddings.weight.detach(), first):  # a crash on values, not on the family
            raise RuntimeError("nan")
        return subject.new_cache(m, batch_size)

    lines, _ = probe("new_cache", new_cache_raising_on_these_weights, (model, 2), {}, ledger=ledger)
    assert not any("a gpt2 model" in ln and ln.startswith("likely cause") for ln in lines), lines


def generate_squeezing_the_next_token(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                      generator=None):  # fmt: skip
    nxt = prompt[:, -1].squeeze()  # the bug: a batch of one row is squeezed to a 0-d tensor
    return torch.cat([prompt, nxt[:, None]], dim=1)


def test_a_batch_of_one_row_is_named():
    prompt = torch.tensor([[3, 1, 4]])
    lines, codes = probe("generate", generate_squeezing_the_next_token, (torch.nn.Identity(), prompt, 1), {})
    assert any("generate raises for a batch of one row and works for 2 rows (the row repeated)" in ln for ln in lines)
    assert codes == ["boundary"]


def gelu_mlp_viewing_its_input(x, w_fc, b_fc, w_proj, b_proj):
    flat = x.view(-1, x.shape[-1])  # the bug (Hugging Face's Conv1D): a view of a non-contiguous input raises
    hidden = torch.nn.functional.gelu(flat @ w_fc.T + b_fc, approximate="tanh")
    return (hidden @ w_proj.T + b_proj).view(*x.shape[:-1], -1)


def test_a_non_contiguous_input_is_named_and_no_rank_is():
    """A crash on a view is named by the contiguous copy alone: merging the leading dims runs too (a 2-D input's view
    to [N, d] changes nothing), but the rank is not what it raises on."""
    x = randn(3, 2, 5, 4).transpose(1, 2)
    w_fc, w_proj = randn(6, 4), randn(4, 6)
    args = (x, w_fc, torch.zeros(6, dtype=torch.float64), w_proj, torch.zeros(4, dtype=torch.float64))
    lines, _ = probe("gelu_mlp", gelu_mlp_viewing_its_input, args, {})
    causes = [ln for ln in lines if ln.startswith("likely cause")]
    assert len(causes) == 1 and "raises for a non-contiguous x and works for a contiguous copy" in causes[0], lines


def generate_refusing_zero_tokens(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                  generator=None):  # fmt: skip
    if max_new_tokens <= 0:  # the bug: zero new tokens returns the prompt
        raise ValueError("max_new_tokens must be positive")
    return prompt


def test_a_count_of_zero_is_named():
    lines, _ = probe("generate", generate_refusing_zero_tokens, (torch.nn.Identity(), torch.zeros(2, 3).long(), 0), {})
    assert any("raises for max_new_tokens=0 and works for max_new_tokens=1" in ln for ln in lines), lines


def sampling_probs_thresholding_without_keepdim(logits, temperature=1.0, top_k=None, top_p=None):
    kth = logits.topk(top_k, dim=-1).values[..., -1]  # the bug: [N] against [N, V] broadcasts only for N = 1
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), -1)


def test_several_rows_are_named_where_each_row_alone_runs():
    lines, _ = probe("sampling_probs", sampling_probs_thresholding_without_keepdim, (randn(3, 9),), {"top_k": 2})
    assert any("raises for 3 rows (2-D input) and works for each row alone" in ln for ln in lines), lines


def sampling_probs_failing_on_one_row(logits, temperature=1.0, top_k=None, top_p=None):
    if (logits[:, 0] > 0.5).any():  # a crash on a row's values: not the number of rows
        raise RuntimeError("bad row")
    return torch.softmax(logits, -1)


def test_rows_are_not_named_where_a_row_alone_raises():
    x = randn(3, 9)
    x[1, 0], x[0, 0], x[2, 0] = 1.0, 0.0, 0.0
    lines, _ = probe("sampling_probs", sampling_probs_failing_on_one_row, (x,), {})
    assert not any("each row alone" in ln and ln.startswith("likely cause") for ln in lines), lines


def cross_entropy_gathering_every_target(logits, targets, ignore_index=-100):
    picked = logits.gather(-1, targets[..., None])  # the bug: ignored targets (-100) are gathered before masking
    return -(picked.squeeze(-1) - logits.logsumexp(-1))[targets != ignore_index].mean()


def test_negative_ignored_targets_are_named():
    targets = torch.tensor([1, -100, 3, 2])
    lines, _ = probe("cross_entropy", cross_entropy_gathering_every_target, (randn(4, 5), targets), {})
    assert any("raises for targets holding -100 and works for those entries set to 0" in ln for ln in lines), lines


RESULTS_DUMP = """
import json, pathlib

def pytest_runtest_logreport(report):
    if report.when == "call":
        for key, value in report.user_properties:
            if key == "spec_results":
                with pathlib.Path("results.jsonl").open("a") as f:
                    f.write(json.dumps({"test": report.nodeid, "outcome": report.outcome, "results": value}) + "\\n")
"""


def test_an_expected_error_is_not_probed_as_a_crash(tmp_path, pytester):
    """A validation test whose call raises the protocol's error passes with no crash record: the probe of
    "which input makes it raise" is for calls on inputs the protocol allows, and would name the invalid one."""
    (tmp_path / "results_dump.py").write_text(RESULTS_DUMP)
    proc = run_suite(
        "--impl=reference", "-k", "test_invalid_arguments_raise or rope_rejects_odd", "-p", "results_dump",
        cwd=tmp_path, pytester=pytester,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(lines) >= 10 and all(line["outcome"] == "passed" for line in lines)
    failed = [(line["test"], r) for line in lines for r in line["results"] if r["outcome"] != "passed"]
    assert not failed, failed[:2]


def batcher_stacking_slices(data, batch_size, context_length):
    starts = range(batch_size)
    return torch.stack([data[i : i + context_length] for i in starts])  # the bug: numpy slices are not tensors


def test_numpy_data_is_named():
    """Amendment 29 allows numpy token data; a batcher that stacks its slices with torch raises for it only."""
    import numpy as np

    data = np.arange(40, dtype=np.uint16)
    lines, codes = probe("get_batch", batcher_stacking_slices, (data, 2, 8), {})
    assert codes == ["crash"], lines
    found = "get_batch raises for data given as a numpy array (uint16) and works for the same values as a torch"
    assert found in lines[0], lines


def test_a_written_default_is_named(tmp_path, pytester):
    """End to end: a copy of the reference that reads sliding_window as int(config["sliding_window"]) whenever the
    key is present (Hugging Face's files write "sliding_window": null) fails the written-default test, and the
    probe names the written default (amendment 31)."""
    present = (
        "    if cfg.sliding_window is not None or cfg.layer_types is not None:\n",
        '    if "sliding_window" in config:\n        cfg = replace(cfg, sliding_window=int(config["sliding_window"]))\n'
        "    if cfg.sliding_window is not None or cfg.layer_types is not None:\n",
    )
    folder = implementation(tmp_path, patch=("config.py", *present))
    out = run_suite(f"--impl={folder}", "-k", "written_at_its_default", cwd=tmp_path, pytester=pytester).stdout
    assert "1 failed, 11 passed" in out, out[-3000:]
    assert "raises for a config that writes sliding_window=None (the default) and works for the same config" in out


def build_rejecting_odd_heads(config, state_dict=None):
    if (config["d_model"] // config["n_heads"]) % 2:  # the bug: only RoPE (llama) needs an even head size
        raise ValueError("head size must be even")
    return config


def test_an_odd_head_size_of_a_gpt2_config_is_named():
    config = dict(family="gpt2", d_model=42, n_heads=6, n_kv_heads=6, vocab_size=11, context_length=8, d_ff=8)
    lines, codes = probe("build_model", build_rejecting_odd_heads, (config, None), {})
    assert codes == ["crash"], lines
    assert "odd head size (d_model=42 / n_heads=6 = 7) and works for n_heads=7" in lines[0], lines
    llama = dict(config, family="llama")
    assert not any("odd head size" in line for line in probe("build_model", build_rejecting_odd_heads, (llama,), {})[0])


def test_a_crash_through_a_filled_cache_names_the_fill_and_no_length():
    """A mask whose rows are sliced without the cache's offset (``mask[cached:T]``) raises for one new token after one
    cached and runs for two (the one row broadcasts by chance) or through an empty cache: the filled cache is the
    trigger, said as the likely cause, and the length only as a clue. The control, the same crash with nothing known
    of how the cache was filled (no ledger), names the length."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_gqa"])
    model = subject.build(config, models.random_state_dict(config, seed=1))
    ids = torch.randint(0, config["vocab_size"], (2, 3))

    def forward_slicing_the_mask_from_the_offset(model, ids, cache=None):
        cached = int(subject.cache_kv(cache, 0)[0].shape[-2]) if cache is not None else 0
        rows = max(0, ids.shape[1] - cached)  # the bug: mask[cached:T] instead of mask[cached:cached + T]
        if cached and rows not in (1, ids.shape[1]):
            raise RuntimeError(f"The size of tensor a ({rows}) must match the size of tensor b ({ids.shape[1]})")
        return subject.forward(model, ids, cache)

    def filled():
        return cache_through_a_ledger(subject, config, model, [ids[:, :1]])

    ledger, cache = filled()
    lines, codes = probe("forward", forward_slicing_the_mask_from_the_offset, (model, ids[:, 1:2], cache), {}, ledger)
    causes = [ln for ln in lines if ln.startswith("likely cause")]
    assert len(causes) == 1 and "a cache already holding 1 position and works for a new, empty cache" in causes[0]
    assert any(ln.startswith("note: forward raises for a sequence of length 1 (T=1)") for ln in lines), lines
    assert codes == ["cache_fill"]

    _, cache = filled()
    lines, _ = probe("forward", forward_slicing_the_mask_from_the_offset, (model, ids[:, 1:2], cache), {})
    assert any(ln.startswith("likely cause: forward raises for a sequence of length 1 (T=1)") for ln in lines), lines


def get_batch_for_numpy_tokens(data, batch_size, context_length, generator=None, device="cpu"):
    ids = torch.as_tensor(data.astype("int64"))  # the bug: a tensor has no astype (nanoGPT's numpy tokens)
    starts = torch.randint(0, len(ids) - context_length, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + context_length] for s in starts])
    return x, torch.stack([ids[s + 1 : s + 1 + context_length] for s in starts])


def test_token_data_given_as_a_tensor_is_named():
    """Token data may be a numpy array or a tensor (amendment 29): code that takes it for numpy raises on a tensor,
    and the same values as a numpy array run. The control: numpy data that raises for another reason names nothing
    of the kind."""
    data = torch.arange(40, dtype=torch.int64) % 7
    lines, _ = probe("get_batch", get_batch_for_numpy_tokens, (data, 3, 5), {})
    assert any("get_batch raises for data given as a torch tensor (int64) and works for the same values as a numpy "
               "array" in ln and ln.startswith("likely cause") for ln in lines), lines  # fmt: skip
    lines, _ = probe("get_batch", get_batch_for_numpy_tokens, (data.numpy(), 3, 50), {})
    assert not any("raises for data given as a torch tensor" in ln for ln in lines), lines


def rope_of_batched_positions(x, positions, theta=10000.0):
    if (
        positions.ndim != x.ndim - 1
    ):  # the bug (Hugging Face's position_ids [B, T]): positions must have x's leading dims
        raise RuntimeError("The size of tensor a must match the size of tensor b at non-singleton dimension 0")
    return x


def rope_of_3d_input(x, positions, theta=10000.0):
    if x.ndim < 3:  # the bug: the input's own rank
        raise RuntimeError("not enough values to unpack (expected 3, got 2)")
    return x


def test_a_leading_dim_added_to_every_input_sharing_it_names_which_input_s_rank_matters():
    """A leading dim added to the input and to the positions sharing its leading dim runs; added to the input alone it
    raises too for code that needs positions of x's rank, and the line says the positions' rank is the trigger. The
    control: code that needs a 3-D input runs with the dim added to the input alone, and its line says nothing of the
    positions."""
    args = (randn(13, 10), torch.arange(13))
    lines, _ = probe("rope", rope_of_batched_positions, args, {})
    assert any("so the rank of positions [13] is what it raises on" in ln for ln in lines), lines
    lines, _ = probe("rope", rope_of_3d_input, args, {})
    assert any(ln.startswith("likely cause: rope raises for 2-D input and works for 3-D") for ln in lines), lines
    assert not any("the rank of positions" in ln for ln in lines), lines


def test_a_fixed_mlp_width_is_named():
    """A declared free d_ff that the code fixes at 4 x d_model (GPT-2's width) raises for any other d_ff: the config
    given with d_ff = 4 x d_model, its MLP weights cut or padded to it, runs, and another width resized alike raises.
    The control: code that raises on the MLP weights' values (which padding with zeros changes) names no width."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["gpt2"])
    assert config["d_ff"] != 4 * config["d_model"]
    sd = models.random_state_dict(config, seed=1)

    def build_with_a_fixed_width(config, state_dict=None, **kw):
        if config["d_ff"] != 4 * config["d_model"]:  # the bug: nn.Linear(d, 4 * d) loaded with d_ff-shaped weights
            raise ValueError("size mismatch for mlp.c_fc.weight")
        return subject.build(config, state_dict, **kw)

    lines, _ = probe("build_model", build_with_a_fixed_width, (config, sd), {})
    said = f"raises for a config with d_ff={config['d_ff']} (not 4 × d_model = {4 * config['d_model']})"
    assert any(said in ln and ln.startswith("likely cause") for ln in lines), lines

    def build_refusing_these_weights(config, state_dict=None, **kw):
        if state_dict is not None and bool((state_dict["layers.0.mlp.w_fc.weight"] != 0).all()):
            raise ValueError("weights out of range")  # on the values: cut or padded with zeros, it runs
        return subject.build(config, state_dict, **kw)

    lines, _ = probe("build_model", build_refusing_these_weights, (config, sd), {})
    assert not any("raises for a config with d_ff" in ln for ln in lines), lines  # another width resized runs too


def test_a_size_compared_with_the_kv_heads_is_not_named_gqa():
    """A cached forward that raises once the cache holds more positions than there are kv heads (a length read from
    the head axis) runs for the GQA model given as MHA (8 kv heads) at 3 cached positions, but not with the cache
    filled to the context: no GQA line, and the filled cache is the trigger. The control: a crash of every GQA
    model whatever the fill names GQA."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_gqa"])
    ids = torch.randint(0, config["vocab_size"], (2, 4))

    def forward_reading_the_head_axis(model, ids, cache=None):
        if cache is not None:
            k = subject.cache_kv(cache, 0)[0]
            if k.shape[-2] > k.shape[-3]:  # the bug: cached positions compared with the kv heads
                raise IndexError("index 3 is out of bounds for dimension 1 with size 2")
        return subject.forward(model, ids, cache)

    def forward_refusing_gqa(model, ids, cache=None):
        if model.config.n_kv_heads != model.config.n_heads:
            raise RuntimeError("shape '[2, 1, 8, 10]' is invalid for input of size 320")
        return subject.forward(model, ids, cache)

    def lines_for(fn):
        model = subject.build(config, models.random_state_dict(config, seed=1))
        ledger, cache = cache_through_a_ledger(subject, config, model, [ids[:, t : t + 1] for t in range(3)])
        return probe("forward", fn, (model, ids[:, 3:4], cache), {}, ledger)[0]

    lines = lines_for(forward_reading_the_head_axis)
    assert not any("a GQA model" in ln for ln in lines), lines
    assert any(ln.startswith("likely cause: forward raises for a cache already holding 3") for ln in lines), lines
    lines = lines_for(forward_refusing_gqa)
    assert any(ln.startswith("likely cause: forward raises for a GQA model") for ln in lines), lines


def sampling_probs_with_an_open_top_p_range(logits, temperature=1.0, top_k=None, top_p=None):
    if top_p is not None and not 0.0 < top_p < 1.0:  # the bug: the protocol's range is (0, 1]
        raise ValueError(f"top_p must be in (0, 1), got {top_p}")
    return torch.softmax(logits / temperature, -1)


def train_step_with_a_1d_only_norm(model, optimizer, x, y, max_grad_norm=None):
    if max_grad_norm is not None:  # the bug: torch.vdot takes 1-D tensors only
        torch.vdot(torch.ones(2, 2), torch.ones(2, 2))
    return 0.0


def test_a_range_closed_at_one_and_a_given_optional_argument_are_named():
    """top_p=1.0 (the whole distribution) rejected by an open range is named by 1 -> 0.999; train_step raising on the
    clipping path is named by max_grad_norm given -> None. The controls: the same functions on other values run, and
    a crash that does not depend on them names neither."""
    lines, _ = probe("sampling_probs", sampling_probs_with_an_open_top_p_range, (randn(2, 9),), {"top_p": 1.0})
    assert any("raises for top_p=1 and works for top_p=0.999" in ln for ln in lines), lines
    assert not any("works for top_p=None" in ln for ln in lines), lines  # a path, said only where nothing nearer is
    lines, _ = probe("train_step", train_step_with_a_1d_only_norm, (None, None, None, None), {"max_grad_norm": 0.5})
    assert any("raises for max_grad_norm=0.5 and works for max_grad_norm=None" in ln for ln in lines), lines

    def always(*args, **kwargs):
        raise RuntimeError("boom")

    lines, _ = probe("train_step", always, (None, None, None, None), {"max_grad_norm": 0.5})
    assert not any(ln.startswith("likely cause") for ln in lines), lines


def test_a_cached_path_that_takes_one_token_only_is_named():
    """A cache that reserves one slot per call raises for a chunk of several tokens through it and runs for the same
    tokens fed one at a time: said as the trigger. The control: a cached path that raises for any call names no
    chunk."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_mha"])
    ids = torch.randint(0, config["vocab_size"], (2, 5))

    def forward_one_slot(model, ids, cache=None):
        if cache is not None and ids.shape[1] > 1:  # the bug: one slot written per call
            raise RuntimeError(
                "shape mismatch: value tensor of shape [2, 8, 5, 10] cannot be broadcast to [2, 8, 1, 10]"
            )
        return subject.forward(model, ids, cache)

    forward_never_cached = never_cached(subject)

    def lines_for(fn):
        return cached_call_lines(subject, config, ids, fn)

    lines = lines_for(forward_one_slot)
    said = "forward raises for a chunk of 5 tokens through the cache and works for the same tokens fed one at a time"
    assert any(ln.startswith("likely cause: " + said) for ln in lines), lines
    assert not any("a chunk of 5 tokens" in ln and ln.startswith("likely") for ln in lines_for(forward_never_cached))


def test_a_cache_that_holds_one_row_is_named():
    """A cache that holds one sequence whatever batch size it was made for (held out: llama2.c's RunState made for
    one sequence) raises for two rows through it and runs for one row through a cache made for one: said as the
    trigger. The control: a cached path that raises for any call says no row count."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_mha"])
    ids = torch.randint(0, config["vocab_size"], (2, 5))

    def forward_one_row(model, ids, cache=None):
        if cache is not None and ids.shape[0] > 1:  # the bug: the cache's buffers hold one sequence
            raise RuntimeError("The expanded size of the tensor (1) must match the existing size (2) at dimension 0")
        return subject.forward(model, ids, cache)

    forward_never_cached = never_cached(subject)

    def lines_for(fn):
        return cached_call_lines(subject, config, ids, fn)

    said = "forward raises for a batch of 2 rows through a cache made for 2 and works for one row"
    assert any(ln.startswith("likely cause: " + said) for ln in lines_for(forward_one_row)), lines_for(forward_one_row)
    assert not any("a batch of 2 rows" in ln and ln.startswith("likely") for ln in lines_for(forward_never_cached))


def test_a_crash_on_the_dropout_path_is_named():
    """A train_step that raises for a model with dropout (held out: an in-place dropout on the attention weights that
    autograd needs) runs for the same model with dropout 0 while another rate raises too: said as the trigger. The
    control: a crash whatever the rate names no dropout."""
    from spec_tests import models
    from spec_tests.harness.diagnosis.model_variants import Ledger
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_mha"], dropout=0.1)
    ids = torch.randint(0, config["vocab_size"], (2, 6))

    def with_dropout_raising(model, optimizer, x, y, max_grad_norm=None):
        if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
            raise RuntimeError("one of the variables needed for gradient computation has been modified by an inplace")
        return subject.train_step(model, optimizer, x, y)

    def always(model, optimizer, x, y, max_grad_norm=None):
        raise RuntimeError("boom")

    def lines_for(fn):
        ledger = Ledger(subject)
        model = subject.build(config, models.random_state_dict(config, seed=1))
        ledger.record("build", (config, None), {}, model)
        optimizer = subject.make_optimizer(model, "sgd", 0.1)
        ledger.record("make_optimizer", (model, "sgd", 0.1), {}, optimizer)
        return probe("train_step", fn, (model, optimizer, ids[:, :-1], ids[:, 1:]), {}, ledger)[0]

    lines = lines_for(with_dropout_raising)
    said = "train_step raises for a model with dropout=0.1 and works for the same model with dropout=0.0"
    assert any(ln.startswith("likely cause: " + said) for ln in lines), lines
    assert not any("dropout=0.0" in ln and ln.startswith("likely") for ln in lines_for(always))


def test_a_crash_on_token_id_0_is_named_by_the_id_not_the_length():
    """A generate that infers a padding mask from pad id 0 (held out: a Hugging-Face-style loop) raises for a prompt
    with token 0 inside it: the cut prompt (T=2) runs, but so would any prompt without a 0, and the kept tokens
    repeated to T=5 run too, so no length is said; token 0 replaced by 1 (and by 2) runs: said. The control: a
    length limit (T > 4 raises) is said as a length, with no token-0 line."""
    ids = torch.tensor([[5, 7, 0, 3, 9], [4, 0, 6, 2, 8]])

    def pad_id_zero(model, prompt, max_new_tokens):
        if bool((prompt[:, 1:] == 0).any()):  # the bug: a 0 after a real token is a hole in the inferred mask
            raise ValueError("attention_mask must be left padding only")
        return prompt

    def at_most_four(model, prompt, max_new_tokens):
        if prompt.shape[1] > 4:
            raise ValueError("too long")
        return prompt

    lines, _ = probe("generate", pad_id_zero, (None, ids, 3), {})
    assert any(ln.startswith("likely cause: generate raises for prompt holding token id 0") for ln in lines), lines
    assert not any("T=5 tokens and works for T=" in ln and ln.startswith("likely") for ln in lines), lines
    lines, _ = probe("generate", at_most_four, (None, ids, 3), {})
    assert any("T=5 tokens and works for T=4" in ln and ln.startswith("likely") for ln in lines), lines
    assert not any("token id 0" in ln and ln.startswith("likely") for ln in lines), lines


def test_a_crash_on_a_bool_attention_mask_is_named():
    """A forward that subtracts mask columns in the mask's dtype (held out) raises for a bool mask and runs for the
    same 0/1 values in int64: said. The control: a forward that raises for any mask says no dtype."""
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]]).bool()

    def subtracts(model, ids, attention_mask=None):
        return attention_mask[:, 1:] - attention_mask[:, :-1]  # raises on bool tensors

    def always(model, ids, attention_mask=None):
        raise ValueError("no masks")

    lines, _ = probe("forward", subtracts, (None, torch.zeros(2, 3, dtype=torch.long)), {"attention_mask": mask})
    said = "forward raises for a bool attention_mask and works for the same 0/1 values as int64"
    assert any(ln.startswith("likely cause: " + said) for ln in lines), lines
    lines, _ = probe("forward", always, (None, torch.zeros(2, 3, dtype=torch.long)), {"attention_mask": mask})
    assert not any("bool attention_mask" in ln and ln.startswith("likely") for ln in lines), lines


def test_a_crash_on_a_config_option_is_named():
    """build_model raising for an option (held out: a window as wide as the context rejected, a q/k norm built over
    d_model, an untied head not padded at load) is named by the option: an int option one smaller (and below the
    context) runs while one larger raises too; the option at its default, the weights it adds left out, runs. The
    control: a build that raises for any config names no option."""
    from spec_tests import models

    base = dict(models.CONFIGS["llama_gqa"])

    def build(config, state_dict=None, seed=0):
        if (config.get("sliding_window") or 0) >= config["context_length"]:
            raise ValueError("sliding_window must be an int >= 1")
        if config.get("qk_norm") and state_dict is not None and "layers.0.attn.q_norm.weight" in state_dict:
            raise RuntimeError("size mismatch for q_norm.weight")
        if config.get("tie_embeddings") is False and state_dict is not None:
            raise RuntimeError("size mismatch for output_layer.weight")
        return object()

    def always(config, state_dict=None, seed=0):
        raise RuntimeError("boom")

    ctx = base["context_length"]
    window = {**base, "sliding_window": ctx + 3}
    lines, _ = probe("build_model", build, (window, None), {})
    assert any(f"works for sliding_window={ctx - 1} (below context_length={ctx})" in ln for ln in lines), lines
    qk = {**base, "qk_norm": True}
    sd = models.random_state_dict(qk, seed=0)
    lines, _ = probe("build_model", build, (qk, sd), {})
    said = (
        "raises for a config with qk_norm=True and works for the same config with qk_norm=False (its weights left out)"
    )
    assert any(said in ln and ln.startswith("likely") for ln in lines), lines
    untied = {**base, "tie_embeddings": False}
    lines, _ = probe("build_model", build, (untied, models.random_state_dict(untied, seed=0)), {})
    assert any("works for the same config with tie_embeddings=True" in ln for ln in lines), lines
    for config, state in ((window, None), (qk, sd)):
        lines, _ = probe("build_model", always, (config, state), {})
        assert not any(ln.startswith("likely") for ln in lines), lines


def test_a_crash_of_the_cached_path_of_generate_is_named():
    """generate that raises on its cached path only (held out: a cached step handed the new token's mask column
    alone) runs with use_cache=False, which changes speed, never the result: said, as a path. The control: a generate
    raising either way says nothing of use_cache."""
    ids = torch.tensor([[5, 7, 3], [4, 1, 6]])

    def cached_path_raises(model, prompt, max_new_tokens, use_cache=True):
        if use_cache:
            raise RuntimeError(
                "The size of tensor a (4) must match the size of tensor b (1) at non-singleton dimension 3"
            )
        return prompt

    def always(model, prompt, max_new_tokens, use_cache=True):
        raise RuntimeError("boom")

    lines, _ = probe("generate", cached_path_raises, (None, ids, 3), {})
    said = "generate raises for use_cache=True and works for use_cache=False"
    assert any(ln.startswith("likely cause: " + said) for ln in lines), lines
    lines, _ = probe("generate", always, (None, ids, 3), {})
    assert not any("use_cache=False" in ln and ln.startswith("likely") for ln in lines), lines


def test_a_crash_on_a_model_s_option_is_named():
    """A forward that raises for a model built with an explicit layer_types pattern (held out: the sliding mask built
    only when another key said so) runs on the same model with layer_types left out, while a fresh model with the
    pattern raises too: said. The control: a forward raising for any model names no option."""
    from spec_tests import models
    from spec_tests.harness.diagnosis.model_variants import Ledger
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_mha"], sliding_window=3, layer_types=["full_attention", "sliding_attention"])
    ids = torch.randint(0, config["vocab_size"], (2, 6))

    def with_pattern_raising(model, ids, cache=None):
        if "full_attention" in (model.config.layer_types or ()):  # a pattern given, not every layer sliding
            raise KeyError("sliding_attention")
        return subject.forward(model, ids)

    def always(model, ids, cache=None):
        raise KeyError("boom")

    def lines_for(fn):
        ledger = Ledger(subject)
        model = subject.build(config, models.random_state_dict(config, seed=1))
        ledger.record("build", (config, None), {}, model)
        return probe("forward", fn, (model, ids), {}, ledger)[0]

    said = "forward raises for a model with layer_types=['full_attention', 'sliding_attention'] and works for the same"
    lines = lines_for(with_pattern_raising)
    assert any(ln.startswith("likely cause: " + said) for ln in lines), lines
    assert not any("layer_types=None" in ln and ln.startswith("likely") for ln in lines_for(always))


_SCORE_BUFFERS: dict = {}


def sdpa_with_a_buffer_never_regrown(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    buffer = _SCORE_BUFFERS.setdefault(scores.dtype, torch.empty(scores.numel(), dtype=scores.dtype))
    scores = buffer[: scores.numel()].view(scores.shape).copy_(scores)  # the bug: sized by the first call
    return scores.softmax(-1) @ v


def test_a_crash_that_only_state_explains_is_said_as_state():
    """A buffer kept per dtype and sized by the first call: a larger float64 call raises, and the float32 variant
    runs only because its own buffer is new. The same call in a fresh copy of the code runs, so the state is the
    cause, not the dtype; a function whose fresh copy raises as well keeps its trigger."""
    _SCORE_BUFFERS.clear()
    small, large = randn(1, 2, 3, 4), randn(1, 2, 6, 4)
    sdpa_with_a_buffer_never_regrown(small, small, small)

    def fresh():
        _SCORE_BUFFERS.clear()  # what a module loaded again starts with
        return sdpa_with_a_buffer_never_regrown

    name = "scaled_dot_product_attention"
    lines, codes = probe(name, sdpa_with_a_buffer_never_regrown, (large, large, large), {}, fresh=fresh)
    assert codes == ["crash_state"] and "only after earlier calls" in lines[0], lines
    _SCORE_BUFFERS.clear()
    sdpa_with_a_buffer_never_regrown(small, small, small)
    lines, _ = probe(name, sdpa_with_a_buffer_never_regrown, (large, large, large), {})  # no fresh copy to ask
    assert not any("only after earlier calls" in line for line in lines), lines
    lines, codes = probe("silu", float32_only, (randn(2, 3),), {}, fresh=lambda: float32_only)
    assert codes == ["crash"] and "silu raises for float64 input and works for float32" in lines[0], lines


def test_a_crash_after_earlier_calls_is_named_by_state_in_the_suite(tmp_path, pytester):
    """End to end: a copy of the reference whose attention copies its scores into a module-level buffer kept per
    dtype and never regrown. The suite loads a fresh copy of the implementation's modules, where the failing call
    runs, and says the crash depends on earlier calls (before: "raises for float64 and works for float32")."""

    def edit(folder):
        attention = folder / "attention.py"
        old = '    scores = einsum(q, k, "... h tq d, ... h tk d -> ... h tq tk") / math.sqrt(q.shape[-1])\n'
        new = old + (
            "    buffer = _BUFFERS.setdefault(scores.dtype, torch.empty(scores.numel(), dtype=scores.dtype))\n"
            "    scores = buffer[: scores.numel()].view(scores.shape).copy_(scores)\n"
        )
        text = replace_once(attention.read_text(), old, new, "attention.py")
        attention.write_text(text.replace("\n\ndef scaled_dot_product_attention(", "\n\n_BUFFERS = {}\n\n\ndef "
                                          "scaled_dot_product_attention(", 1))  # fmt: skip

    folder = implementation(tmp_path, edit=edit)
    out = run_suite(f"--impl={folder}", "-k", "test_sdpa_matches_reference", cwd=tmp_path, pytester=pytester).stdout
    assert "scaled_dot_product_attention raises for this call only after earlier calls" in out, out[-3000:]
    assert "raises for float64 input and works for float32" not in out, out[-3000:]


def sdpa_folding_the_mask_without_expanding(q, k, v, mask=None):
    b, h, tq, d = q.shape
    scores = (q @ k.transpose(-2, -1)).reshape(-1, tq, k.shape[-2])
    if mask is not None:  # the bug: a mask broadcast over the batch or head axis no longer lines up
        scores = scores.masked_fill(~mask.reshape(-1, tq, k.shape[-2]), float("-inf"))
    return (scores.softmax(-1) @ v.reshape(-1, *v.shape[-2:])).reshape(b, h, tq, d)


def test_a_broadcast_mask_is_named_by_its_full_shape():
    """A mask [B, 1, Tq, Tk] whose rows differ per batch row, folded with the scores without being expanded: it
    runs expanded to [B, H, Tq, Tk], so the broadcast is named (before: "works for mask=None", a path only)."""
    q = randn(2, 3, 4, 5)
    mask = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(3)) > 0.3
    mask |= torch.eye(4, dtype=torch.bool)
    lines, _ = probe("scaled_dot_product_attention", sdpa_folding_the_mask_without_expanding, (q, q, q, mask), {})
    assert "raises for a mask [2, 1, 4, 4] broadcast against the scores [2, 3, 4, 4] and works for the same mask " \
        "expanded to [2, 3, 4, 4]" in lines[0], lines  # fmt: skip


def evaluate_in_full_batches(model, data, context_length, batch_size=8):
    windows = -(-(len(data) - 1) // context_length)
    if windows % batch_size:  # the bug: the windows viewed as [-1, batch_size, T]
        raise RuntimeError(f"shape '[-1, {batch_size}, {context_length}]' is invalid")
    return {"loss": 1.0, "perplexity": 2.718}


def evaluate_needing_a_full_batch(model, data, context_length, batch_size=8):
    if -(-(len(data) - 1) // context_length) < batch_size:  # the bug: fewer windows than batch_size
        raise ZeroDivisionError("integer division or modulo by zero")
    return {"loss": 1.0, "perplexity": 2.718}


def evaluate_needing_a_full_window(model, data, context_length, batch_size=8):
    if len(data) <= context_length:  # the bug: unfold asks for one window of context_length + 1 tokens
        raise RuntimeError("maximum size for tensor at dimension 0 is 1 but size is 17")
    return {"loss": 1.0, "perplexity": 2.718}


def test_evaluate_crashes_are_named_against_the_number_of_windows():
    """evaluate cuts its data into consecutive windows and takes them batch_size at a time: a crash for a batch size
    that does not divide the number of windows, one for more rows than windows, and one for data shorter than one
    full window are each named, and told apart by a batch size below the number of windows that does not divide it."""
    data = torch.arange(40) % 7  # 3 windows of context_length 16
    name = "evaluate"
    lines, _ = probe(name, evaluate_in_full_batches, (None, data, 16), {})
    assert "evaluate raises for batch_size=8 beside 3 window(s) of data (no divisor of the number of windows) and " \
        "works for batch_size=3, a divisor of 3 (batch_size=2 raises as well)" in lines[0], lines  # fmt: skip
    assert not any("more rows than windows" in line for line in lines), lines
    lines, _ = probe(name, evaluate_needing_a_full_batch, (None, data, 16), {"batch_size": 8})
    assert "evaluate raises for batch_size=8 beside 3 window(s) of data (more rows than windows) and works for " \
        "batch_size=3" in lines[0], lines  # fmt: skip
    assert not any("no divisor" in line for line in lines), lines
    lines, _ = probe(name, evaluate_needing_a_full_window, (None, data[:12], 16, 2), {})
    assert "evaluate raises for data of 12 tokens (no full window: context_length=16 takes 17) and works for 17 " \
        "tokens" in lines[0], lines  # fmt: skip


def evaluate_padding_to_multiples_of_8(model, data, context_length, batch_size=8):
    if context_length % 8:  # the bug: windows padded to a multiple of 8 run past the context
        raise IndexError("index out of range in self")
    return {"loss": 1.0, "perplexity": 2.718}


def test_a_size_that_must_be_a_power_of_two_is_named_when_nothing_specific_runs():
    lines, _ = probe("evaluate", evaluate_padding_to_multiples_of_8, (None, torch.arange(40) % 7, 12), {})
    assert "evaluate raises for context_length=12 and works for context_length=16, a power of two (context_length=13 " \
        "and 17 raise as well)" in lines[0], lines  # fmt: skip


def generate_caching_one_row_only(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                  generator=None, use_cache=True):  # fmt: skip
    if use_cache and prompt.shape[0] > 1:  # the bug: the decode step views the new tokens as [1, B]
        raise AssertionError("input_pos.shape[0] == k_val.shape[2]")
    return torch.cat([prompt, prompt[:, -1:].repeat(1, max_new_tokens)], dim=1)


def test_a_path_is_narrowed_by_the_rows_that_raise_on_it():
    """A generate whose cached path raises for a batch of several rows: use_cache=False runs (a path), and so does
    each row alone; both are said, the rows narrowing the path."""
    prompt = torch.tensor([[3, 4, 5], [6, 7, 8]])
    lines, _ = probe("generate", generate_caching_one_row_only, (None, prompt, 4), {"temperature": 0.0})
    assert any("generate raises for use_cache=True and works for use_cache=False" in line for line in lines), lines
    assert any("generate raises for 2 rows (2-D input) and works for each row alone" in line for line in lines), lines


def nucleus_scattering_a_1d_arange(logits, temperature=1.0, top_k=None, top_p=None):
    probs = (logits / temperature).softmax(-1)
    order = probs.argsort(-1, descending=True)
    vocab = probs.shape[-1]
    inverse = torch.empty_like(order).scatter(-1, order, torch.arange(vocab))  # the bug: no expand_as for [B, V]
    mass = probs.gather(-1, order).cumsum(-1) - probs.gather(-1, order)
    kept = (mass < (1.0 if top_p is None else top_p)).gather(-1, inverse)
    probs = probs * kept
    return probs / probs.sum(-1, keepdim=True)


def test_a_rank_with_one_leading_dim_is_named_by_a_row_alone():
    """A nucleus that scatters a 1-D arange runs on 1-D logits and raises on [B, V]: each row alone runs, so the
    leading dim is named (before: "raises for top_p=0.6 and works for top_p=None", a path)."""
    lines, _ = probe("sampling_probs", nucleus_scattering_a_1d_arange, (randn(3, 11),), {"top_p": 0.6})
    assert "sampling_probs raises for 2-D input and works for 1-D (each row alone, without the leading dims)" in \
        lines[0], lines  # fmt: skip


def sdpa_viewing_the_mask(q, k, v, mask=None):
    *lead, h, tq, d = q.shape
    scores = (q @ k.transpose(-2, -1)).reshape(-1, tq, k.shape[-2])
    if mask is not None and q.ndim == 4:  # the bug: a mask viewed as [B * H, Tq, Tk] (only this rank folds it)
        scores = scores.masked_fill(~mask.reshape(-1, tq, k.shape[-2]), float("-inf"))
    elif mask is not None:
        scores = scores.masked_fill(~mask.expand(*lead, h, tq, k.shape[-2]).reshape(-1, tq, k.shape[-2]), -1e9)
    return (scores.softmax(-1) @ v.reshape(-1, *v.shape[-2:])).reshape(*lead, h, tq, d)


def test_a_rank_that_runs_beside_a_change_keeping_it_is_a_clue():
    """A broadcast mask raises only at rank 4 (5-D inputs take another path): the mask expanded runs, and so does
    a leading dim added; the rank is said as a clue only, the mask as the cause."""
    q = randn(2, 3, 4, 5)
    mask = (torch.rand(2, 1, 1, 4, generator=torch.Generator().manual_seed(3)) > 0.3) | (torch.arange(4) == 0)
    lines, _ = probe("scaled_dot_product_attention", sdpa_viewing_the_mask, (q, q, q, mask), {})
    causes = [line for line in lines if line.startswith("likely cause")]
    assert causes and all("a mask [2, 1, 1, 4] broadcast" in line for line in causes), lines


def test_a_call_of_thousands_of_rows_is_probed_on_a_few():
    """A crash of a call with 4,000 rows is probed on its first 8 rows where they raise at the same place: every
    variant then costs 8 rows, and the note says so; the trigger found there is the same."""
    calls = []

    def counting(logits, temperature=1.0, top_k=None, top_p=None):
        calls.append(logits.shape[0] if logits.ndim > 1 else 1)
        return nucleus_scattering_a_1d_arange(logits, temperature, top_k, top_p)

    big = randn(4000, 11)
    try:
        counting(big, top_p=0.6)
    except RuntimeError as exc:
        crash = exc
    calls.clear()
    lines, _ = probe("sampling_probs", counting, (big,), {"top_p": 0.6}, crash=crash)
    assert "sampling_probs raises for 2-D input and works for 1-D" in lines[0], lines
    assert lines[-1] == "note: probed on the call's first 8 rows of 4000, which raise at the same place", lines
    assert calls[0] == 8 and max(calls) <= 8, calls


def test_a_crash_after_earlier_calls_on_the_same_model_is_said_as_state_the_model_keeps(tmp_path, pytester):
    """End to end: a copy of the reference whose attention keeps the batch size of the first call and raises for
    another one (a buffer sized once). A forward of one row after a batch of several raises; the same call on the
    model built again from its weights runs, so the crash is said to depend on the model's state (not on a property
    a variant of the one call changes)."""

    def edit(folder):
        model = folder / "model.py"
        old = "        cap = cfg.attn_logit_softcap  # protocol v2"
        new = (
            "        if getattr(self, '_rows', None) is None:\n"
            "            self._rows = x.shape[0]\n"
            "        elif x.shape[0] != self._rows:\n"
            "            raise RuntimeError(f'buffer of {self._rows} rows, {x.shape[0]} given')\n" + old
        )
        model.write_text(replace_once(model.read_text(), old, new, "model.py"))

    folder = implementation(tmp_path, edit=edit)
    selected = "test_batch_rows_are_independent and llama_mha"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "raises for this call only after earlier calls on the same model" in out, out[-3000:]


class _Warmup:
    def __init__(self, warmup_steps=0):
        self.warmup_steps = warmup_steps

    def factor(self, step):
        return min(1.0, (step + 1) / self.warmup_steps)


def train_with_a_warmup_of_zero(data, steps=2):
    schedule = _Warmup()  # its own default: every call divides by 0
    return [schedule.factor(step) * float(data.float().mean()) for step in range(steps)]


def mean_over_one_less(data, steps=2):
    n = data.shape[0] // data.shape[0]
    return float(data.float().sum()) / (n - 1)  # divides by an expression, not a name


def project_to_a_stale_width(x, weight):
    projection = torch.ones(5, 5, dtype=x.dtype)
    return x @ projection


def _probed(name, fn, args, kwargs=None):
    try:
        fn(*args, **(kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - the crash is what is probed
        return probe(name, fn, args, kwargs or {}, crash=exc)
    raise AssertionError("the call was expected to raise")


def test_a_division_by_a_name_holding_zero_is_named():
    """``train`` dividing by a warmup its own code sets to 0 raises for every input, so no variant runs; the line it
    raised at divides by one name, and that name holds 0: it is the cause (held-out batch 26's warmup)."""
    lines, codes = _probed("train", train_with_a_warmup_of_zero, (torch.arange(10),), {"steps": 3})
    assert codes == ["crash_zero_divisor"], lines
    assert lines[0].startswith("likely cause: train divides by `self.warmup_steps`, which is 0"), lines
    assert not any("does not depend on what was probed" in line for line in lines), lines


def test_a_division_by_an_expression_is_described_not_named():
    """Control: a ``ZeroDivisionError`` where the line divides by an expression (``n - 1``) names nothing; the values
    the line read are said as a note."""
    lines, codes = _probed("train", mean_over_one_less, (torch.arange(10),), {"steps": 3})
    assert codes == [] and not any(line.startswith("likely cause") for line in lines), lines
    assert any(line.startswith("note: where it raised") and "n = 1" in line for line in lines), lines


def test_a_crash_no_variant_explains_shows_the_values_at_its_line():
    """A matmul against a width no input decides: every variant raises, and the note says the shapes the raising
    line held, without naming a cause."""
    lines, codes = _probed("rmsnorm", project_to_a_stale_width, (randn(2, 3, 4), randn(4)))
    assert codes == [] and "does not depend on what was probed" in lines[0], lines
    site = [line for line in lines if line.startswith("note: where it raised")]
    assert site and "x = [2, 3, 4] float64, projection = [5, 5] float64" in site[0], lines
    assert "`return x @ projection`" in site[0], lines


def block_adding_an_absent_bias(x, weight):
    bias = None  # the model has no bias, and the fused kernel adds it anyway
    x = x * weight
    return x + bias


def norm_reading_an_absent_mask(x, weight, mask=None):
    width = mask.shape[-1]
    return x[..., :width] * weight[:width]


def test_an_operation_on_one_name_holding_none_is_named():
    """A fused add of a bias the model does not have raises ``TypeError`` on ``None`` for every input (held-out batch
    22's bias-dropout-add): the raising line names one value that is None, and that is said as the cause; an
    attribute read on a None argument is named by the name that is None."""
    lines, codes = _probed("rmsnorm", block_adding_an_absent_bias, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_none_value"], lines
    assert "`return x + bias`" in lines[0] and "with `bias` None" in lines[0], lines
    lines, codes = _probed("rmsnorm", norm_reading_an_absent_mask, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_none_value"] and "with `mask` None" in lines[0], lines


def test_a_none_crash_with_two_none_names_is_described_not_named():
    """Control: a line reading two names that hold None does not say which one raised."""

    def both_absent(x, weight):
        bias, scale = None, None
        return x * weight + bias * scale

    lines, codes = _probed("rmsnorm", both_absent, (randn(2, 3, 4), randn(4)))
    assert codes == [] and not any(line.startswith("likely cause") for line in lines), lines
    assert any("bias = None, scale = None" in line for line in lines), lines


def rope_reading_only_the_new_key(x, positions, scaling=None):
    kind = scaling["rope_type"]
    return x * (2.0 if kind == "linear" else 1.0)


def test_a_key_the_given_dict_lacks_is_named():
    """A rope_scaling dict spelled with the legacy "type" key, read as scaling["rope_type"] (held-out batch 31): the
    line reads one dict, it lacks the key, and that is said with the keys it holds."""
    lines, codes = _probed("rope", rope_reading_only_the_new_key, (randn(2, 3, 4), torch.arange(3)),
                           {"scaling": {"type": "linear", "factor": 2.0}})  # fmt: skip
    assert codes == ["crash_missing_key"], lines
    assert "reads key 'rope_type' of `scaling`" in lines[0] and "'type', 'factor'" in lines[0], lines


def forward_reading_the_first_layer_of_an_empty_cache(x, weight, cache=None):
    past = [] if cache is None else cache
    past_length = past[0][0].shape[-2] if past is not None else 0
    return x * weight + past_length


def test_an_index_into_the_one_empty_list_is_named():
    """A forward that reads the first layer of a cache list before anything was written (held-out batch 30): the
    line indexes one empty list, and that is the cause."""
    lines, codes = _probed("rmsnorm", forward_reading_the_first_layer_of_an_empty_cache, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_empty_sequence"] and "with `past` empty (a list of 0 items)" in lines[0], lines


def test_a_cache_that_exists_only_after_its_first_write_is_named():
    """cache_kv counting the layers written so far (transformers' DynamicCache: "Cache only has 0 layers") raises for a
    fresh cache (held-out batches 23 and 28). The call made again on a new cache after one token was forwarded runs
    (and the same call on a fresh cache raises too, the control), and that is said. The control without a ledger
    (nothing known of the cache) names nothing of the kind."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = dict(models.CONFIGS["llama_gqa"])
    model = subject.build(config, models.random_state_dict(config, seed=1))

    def cache_kv_of_written_layers(cache, layer):
        if not 0 <= layer < len([n for n in cache.lengths if n]):
            raise KeyError(f"Cache only has 0 layers, attempted to access layer with index {layer}")
        return subject.cache_kv(cache, layer)

    ledger, cache = cache_through_a_ledger(subject, config, model)
    lines, codes = probe("cache_kv", cache_kv_of_written_layers, (cache, 0), {}, ledger)
    assert (
        codes == ["cache_empty"]
        and "raises for a fresh, empty cache and works for the cache after one token" in (lines[0])
    ), lines
    lines, codes = probe("cache_kv", cache_kv_of_written_layers, (cache, 0), {})
    assert "cache_empty" not in codes, lines


def sample_taking_only_int_seeds(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    seed = None if generator is None else int(generator)  # a Keras SeedGenerator: an int seed or nothing
    g = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[..., 0]


def test_a_given_generator_is_tried_as_none():
    """A sampler that takes an int seed only raises for the torch.Generator the protocol allows (held-out batch 31):
    the same call with generator=None runs, and the line names the path."""
    lines, codes = probe("sample", sample_taking_only_int_seeds, (randn(4, 9),),
                         {"generator": torch.Generator().manual_seed(0)})  # fmt: skip
    assert "sample raises for a generator and works for generator=None" in lines[0], lines


def attention_with_a_mask_bound_on_one_branch(q, k, v, causal=True):
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def norm_adding_the_residual_in_place(x, weight):
    x = x.detach().requires_grad_(True)
    h = x * weight
    residual = h.exp()
    residual.add_(x)  # the fused residual add, in place on a tensor exp saved
    residual.sum().backward()
    return residual.detach()


def test_messages_that_pin_their_cause_are_named():
    """Where no variant runs, a message that says its own cause is read: a variable bound on one branch only
    (held-out batch 29's flash mask; here the flag is positional-free, so no flag probe), and autograd's in-place
    version check (batch 28's fused residual add)."""
    from spec_tests.harness.diagnosis.crash_site import site_lines

    q = randn(2, 3, 4)
    try:
        attention_with_a_mask_bound_on_one_branch(q, q, q, causal=False)
    except UnboundLocalError as exc:
        lines, codes = site_lines("flash_attention", exc)
    assert codes == ["crash_unbound"] and "reads `mask`" in lines[0], lines
    lines, codes = _probed("rmsnorm", norm_adding_the_residual_in_place, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_inplace_autograd"], lines


def test_a_flag_given_explicitly_is_tried_at_its_other_value():
    """flash_attention(causal=False) raising where causal=True runs (held-out batch 29): the flag's path is named,
    as a path (a fallback: a nearer property that runs wins)."""
    q = randn(2, 3, 4)
    lines, _ = probe("flash_attention", attention_with_a_mask_bound_on_one_branch, (q, q, q), {"causal": False})
    assert "flash_attention raises for causal=False and works for causal=True" in lines[0], lines


def causal_mask_reading_device_type(t_q, t_k, device=None):
    kind = device.type  # OLMo's get_causal_attention_bias takes a torch.device only
    return torch.ones(t_q, t_k, dtype=torch.bool, device=kind).tril(t_k - t_q)


def test_a_device_string_or_none_is_tried_as_a_torch_device():
    """causal_mask reading device.type raises for "cpu" and for a device left out (held-out batch 30): given as
    torch.device("cpu") it runs, and that is said."""
    lines, _ = probe("causal_mask", causal_mask_reading_device_type, (4, 6), {"device": "cpu"})
    assert "causal_mask raises for device='cpu' (a string) and works for device=torch.device('cpu')" in lines[0], lines
    lines, _ = probe("causal_mask", causal_mask_reading_device_type, (4, 6), {})
    assert "raises for device left out (None) and works for device=torch.device('cpu')" in lines[0], lines


def test_a_head_size_written_into_the_code_is_named_with_the_sizes_that_run():
    """A model whose code views each head to 64 channels raises for every other head size: fresh models of the same
    heads at the sizes code writes in most often are tried, each must run with twice the heads too, and the model
    built fresh at its own size must raise; the sizes that run and those that raise are said together, and one size
    alone points at that size written into the code (held-out batch 29's default of 64). A least size (every size
    from 32 up runs) is said as a least size; a crash on these weights' values names no size."""
    from spec_tests import models
    from spec_tests.harness.diagnosis.model_variants import Ledger
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    ledger = Ledger(subject)
    config = dict(models.CONFIGS["llama_gqa"], d_model=20, n_heads=2, n_kv_heads=1)  # head size 10
    model = subject.build(config, models.random_state_dict(config, seed=1))
    ledger.record("build", (config, None), {}, model)
    ids = torch.randint(0, config["vocab_size"], (2, 5))

    def forward_viewing_heads_of(sizes):
        def forward(m, ids):
            c = m.config
            if c.d_model // c.n_heads not in sizes:
                raise RuntimeError(f"shape '[2, 5, -1, 64]' is invalid for input of size {2 * 5 * c.d_model}")
            return subject.forward(m, ids)

        return forward

    head = config["d_model"] // config["n_heads"]
    lines, codes = probe("forward", forward_viewing_heads_of({64}), (model, ids), {}, ledger=ledger)
    said = f"forward raises for a head size of {head} and works for a head size of 64 ("
    assert any(said in ln and "look for a size of 64 written into the code" in ln for ln in lines), lines
    assert codes[:1] == ["crash_head_size"], codes
    lines, codes = probe("forward", forward_viewing_heads_of({32, 64, 128}), (model, ids), {}, ledger=ledger)
    said = "works for head sizes 32, 64, 128 ("
    assert any(said in ln and "at least 32, of those tried" in ln for ln in lines), lines

    first = model.tok_embeddings.weight.detach().clone()

    def forward_raising_on_these_weights(m, ids):
        if m.tok_embeddings.weight.shape == first.shape and torch.equal(m.tok_embeddings.weight.detach(), first):
            raise RuntimeError("nan")
        return subject.forward(m, ids)

    lines, codes = probe("forward", forward_raising_on_these_weights, (model, ids), {}, ledger=ledger)
    assert "crash_head_size" not in codes and not any("head size" in ln for ln in lines), lines


def rope_rotating_four_channels(x, positions, theta=10000.0):
    pairs = x.reshape(*x.shape[:-1], 2, 2)  # the bug: the rotation is written for a head size of 4
    return torch.cat([-pairs[..., 1, :], pairs[..., 0, :]], dim=-1).reshape(x.shape)


def test_a_feature_size_written_into_a_component_is_named():
    """``rope`` written for 4 channels raises for every other head size: where nothing specific runs, the last axis is
    tried at the sizes code writes in most often, and the one that runs is said with those that raise."""
    lines, codes = _probed("rope", rope_rotating_four_channels, (randn(2, 3, 5, 8), torch.arange(5)))
    said = "rope raises for a last-axis size of 8 and works for a last-axis size of 4 (16, 32, 64, 128 raise too)"
    assert any(said in ln for ln in lines) and "boundary" in codes, lines


def test_a_tensor_on_the_meta_device_at_the_raising_line_is_described_without_its_values():
    """A crash at a line holding a meta tensor (a fresh model built under ``torch.device("meta")``): the note says
    its shape, and reading it raises nothing (a meta tensor has no values)."""

    def init_on_meta(x, weight):
        scale = torch.ones((), device="meta")
        return x * weight * scale

    lines, codes = _probed("rmsnorm", init_on_meta, (randn(2, 3, 4), randn(4)))
    assert any("scale = [] float32 on meta" in line for line in lines), lines


TRAINING = False  # a module flag the code below expects another call to set


def step_asserting_a_flag(x, weight):
    assert TRAINING, "set TRAINING before stepping"
    return x * weight


def update_needing_params(x, weight, params=None):
    if params is None:
        raise ValueError("this transformation needs the current parameters")
    return x * weight


def norm_checking_its_width(x, weight, width=7):
    if x.shape[-1] != width:
        raise ValueError("bad width")
    return x * weight


def test_an_assert_on_an_unset_flag_and_a_check_for_none_are_named():
    """An ``assert`` on a module flag that holds False (held-out batch 33's ``Tensor.training``) and a ``raise`` under
    the code's own ``if params is None`` (batch 34's optax-like update) raise for every input: the raising line and the
    check guarding it are read, and the one value they test is named."""
    lines, codes = _probed("rmsnorm", step_asserting_a_flag, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_flag"] and "`TRAINING` is False on this path" in lines[0], lines
    lines, codes = _probed("rmsnorm", update_needing_params, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_none_value"] and "own check `if params is None`" in lines[0], lines
    assert "`params` is None" in lines[0], lines


def test_a_check_on_values_that_are_not_none_is_described_not_named():
    """Control: a ``raise`` under a check of a shape names nothing; the note says the check and what it read."""
    lines, codes = _probed("rmsnorm", norm_checking_its_width, (randn(2, 3, 4), randn(4)))
    assert "crash_none_value" not in codes and not any("own check" in ln and "likely" in ln for ln in lines), lines
    assert any("own check `if x.shape[-1] != width`" in ln and "width = 7" in ln for ln in lines), lines


class _BlockWithAMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4, bias=False)
        self.register_buffer("bias", torch.ones(3, 3).tril())  # GPT-2's causal mask, persistent by default


def build_loading_strictly(x, weight):
    block = _BlockWithAMask().double()
    block.load_state_dict({"proj.weight": weight.expand(4, 4)}, strict=True)
    return block.proj(x)


def norm_seeding_on_the_default_device(x, weight):
    key = torch.zeros((), dtype=torch.long, device="meta")  # made where the caller's default device is meta
    torch.Generator().manual_seed(int(key))
    return x * weight


def test_messages_that_state_their_cause_are_read_at_the_line():
    """A strict load missing a persistent buffer (held-out batch 35's GPT-2 ``attn.bias``) and a value read from a meta
    tensor (batch 34's key made on the default device) raise for every input; the message and the raising line name
    the cause."""
    lines, codes = _probed("rmsnorm", build_loading_strictly, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_state_dict_keys"] and "(bias)" in lines[0] and "persistent=False" in lines[0], lines
    lines, codes = _probed("rmsnorm", norm_seeding_on_the_default_device, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_meta_value"] and "`key`, a tensor on the meta device" in lines[0], lines


def norm_combining_masks_with_and(x, weight):
    keep = (x > -10) and (x < 10)  # Python's and on two tensors of several values
    return x * weight * keep


def test_pythons_and_on_tensors_is_named_at_the_line():
    """Python's ``and`` on two boolean tensors (held-out batch 39's ``and_masks``) raises "Boolean value of Tensor with
    more than one value is ambiguous" for every input: the message and the line's ``and`` name it."""
    lines, codes = _probed("rmsnorm", norm_combining_masks_with_and, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash"] and "truth value of a tensor of several values" in lines[0], lines
    assert "(x > -10) and (x < 10)" in lines[0], lines


def _pinned(t):
    raise RuntimeError("Cannot access accelerator device when none is available.")  # torch's, without a GPU


def batch_pinning_its_memory(x, weight):
    buf = _pinned(x)
    return buf * weight


def test_a_call_needing_a_gpu_on_a_machine_without_one_is_named():
    """Pinned memory (held-out batch 32's ``get_batch``) raises torch's "no accelerator" error on a CPU machine: said as
    a call that needs a GPU; a control raising another RuntimeError is not."""
    lines, codes = _probed("rmsnorm", batch_pinning_its_memory, (randn(2, 3, 4), randn(4)))
    assert codes == ["crash_needs_gpu"] and "needs a GPU" in lines[0], lines
    lines, codes = _probed("rmsnorm", project_to_a_stale_width, (randn(2, 3, 4), randn(4)))
    assert "crash_needs_gpu" not in codes, lines


def probs_refusing_int_temperatures(logits, temperature=1.0, top_k=None, top_p=None):
    if not isinstance(temperature, float) or temperature <= 0:  # the bug: a float required (HF's old check)
        raise ValueError(f"temperature has to be a strictly positive float, got {temperature}")
    return torch.softmax(logits / temperature, -1)


def test_an_int_where_the_protocol_writes_a_float_is_tried_as_that_float():
    """``temperature=2`` refused by an ``isinstance(t, float)`` check (held-out batch 35): the same value as a float
    runs, and that is the trigger (amendment 35)."""
    lines, codes = probe("sampling_probs", probs_refusing_int_temperatures, (randn(3, 10),), {"temperature": 2})
    said = "sampling_probs raises for temperature=2 (an int) and works for temperature=2.0"
    assert any(said in ln for ln in lines) and codes[:1] == ["crash"], lines


def loss_flattening_its_targets_with_view(logits, ids):
    targets = ids[:, 1:]  # a slice: not contiguous
    flat = targets.view(-1)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), flat)


def test_a_view_of_a_non_contiguous_tensor_is_named_at_the_line():
    """``ids[:, 1:].view(-1)`` (held-out batch 43's cross-entropy kernel) raises torch's "view size is not compatible"
    for a batch of more than one row: said as .view on a tensor whose memory is not contiguous."""
    ids = torch.randint(0, 7, (3, 5))
    lines, codes = _probed("lm_loss", loss_flattening_its_targets_with_view, (randn(3, 5, 7), ids))
    assert (
        codes[:1] == ["crash"]
        and "calls .view on `targets` ([3, 4] int64), whose memory is not contiguous" in (lines[0])
    ), lines


def generation_growing_its_mask_as_float(model, ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                         generator=None, use_cache=True, *, attention_mask=None):  # fmt: skip
    mask = torch.ones_like(ids, dtype=torch.bool)
    for _ in range(max_new_tokens):
        if mask.is_floating_point():
            raise TypeError("attention_mask must be bool or integer")
        ids = torch.cat([ids, ids[:, -1:]], dim=1)
        mask = torch.cat([mask, torch.ones(ids.shape[0], 1)], dim=1)  # the bug: float ones turn the mask float
    return ids


def test_a_crash_at_the_second_step_of_a_loop_is_named():
    """generate whose first step leaves a float mask for the second (held-out batch 41's mask grown with float ones):
    it runs for max_new_tokens=1 and raises for 2 and more, said as the second step raising."""
    lines, codes = _probed("generate", generation_growing_its_mask_as_float, (None, torch.zeros(2, 3).long(), 5))
    assert codes == ["crash"], lines
    assert "raises for max_new_tokens=5 (and 2) and works for max_new_tokens=1; so the first step runs" in lines[0]


def test_not_implemented_is_a_stub_raise_and_not_torch_refusing_an_input(tmp_path):
    """A ``NotImplementedError`` raised by a ``raise`` statement of the implementation is "not implemented"; one raised
    by a torch op on the input's dtype ("lt_cpu" not implemented for 'UInt16') is a crash on that input."""
    from spec_tests.harness.diagnosis.crash_site import raised_as_not_implemented

    (tmp_path / "uint_ops.py").write_text(
        "def below(x):\n    return x < 3\n\n\ndef stub(x):\n    raise NotImplementedError(\n        'todo'\n    )\n"
    )
    spec = importlib.util.spec_from_file_location("uint_ops", tmp_path / "uint_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raised = []
    for call in (lambda: module.below(torch.tensor([1, 2], dtype=torch.uint16)), lambda: module.stub(1)):
        try:
            call()
        except NotImplementedError as exc:
            raised.append(raised_as_not_implemented(exc))
    assert raised == [False, True]


def test_a_torch_not_implemented_is_reported_as_a_crash(tmp_path, pytester):
    """End to end: a copy of the reference whose get_batch compares uint16 tokens (torch has no '<' for them) fails
    as a crash that says where it raised, not as "not implemented"."""

    def edit(folder):
        training = folder / "training.py"
        training.write_text(
            training.read_text().replace(
                "    tokens = as_token_tensor(data)\n",
                "    tokens = as_token_tensor(data)\n    assert not bool((tokens.to(torch.uint16) < 0).any())\n",
                1,
            )
        )

    folder = implementation(tmp_path, edit=edit)
    proc = run_suite(f"--impl={folder}", "-k", "test_get_batch", cwd=tmp_path, pytester=pytester)
    out = proc.stdout
    assert "not implemented for 'UInt16'" in out, out[-3000:]
    assert "not implemented:" not in out.lower() and "NotImplementedError" in out, out[-3000:]


ROW_BUFFER = '''"""The reference with a module-level workspace sized by forward's first call."""

import reference as _reference
from reference import *  # noqa: F403

_ROWS = {}


def forward(model, ids, cache=None, **kwargs):
    rows = _ROWS.setdefault("rows", ids.shape[0])  # the bug: sized by the first call, never regrown
    if ids.shape[0] > rows:
        raise RuntimeError(f"the row workspace holds {rows} rows")
    return _reference.forward(model, ids, cache, **kwargs)
'''


def test_a_model_call_that_only_module_state_explains_is_said_through_a_fresh_copy(tmp_path, monkeypatch):
    """A forward that raises because of module-level state an earlier call left (a workspace sized by the first
    call): the model built again raises too, no cache is involved, and a freshly loaded copy of the code, with the
    model built there from the same weights, runs the same call. The line says state, not the batch size a variant
    with fewer rows happens to fit; without a fresh copy to ask (``fresh`` not given) it is not said."""
    from spec_tests import models
    from spec_tests.harness.diagnosis.model_variants import Ledger
    from spec_tests.harness.subject.subject import LocalSubject

    (tmp_path / "row_workspace").mkdir()
    (tmp_path / "row_workspace" / "__init__.py").write_text(ROW_BUFFER)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("row_workspace")
    subject = LocalSubject(module, "row_workspace", rope_style="interleaved", bind_style=True)
    config = dict(models.CONFIGS["llama_gqa"])
    model = subject.build(config, models.random_state_dict(config, seed=1))
    ledger = Ledger(subject)
    ledger.record("build", (config, None), {}, model)
    ids = torch.zeros(3, 5, dtype=torch.long)
    subject.forward(model, ids[:1])  # sizes the workspace at one row
    fresh = lambda: subject.fresh_function("forward")
    lines, codes = probe("forward", subject.forward, (model, ids), {}, ledger, fresh=fresh)
    assert codes == ["crash_state"] and "a freshly loaded copy of your code runs the very same call" in lines[0], lines
    lines, _ = probe("forward", subject.forward, (model, ids), {}, ledger)
    assert not any("freshly loaded copy" in line for line in lines), lines


def build_with_a_rotary_of_half_a_head(config, state_dict=None):
    half = config["d_model"] // config["n_heads"] // 2  # the bug: the rotary width defaults to half a head
    if half % 2:
        raise ValueError(f"rotary dim {half} must be even")
    return torch.nn.Identity()


def test_a_head_size_a_config_gives_is_named():
    """build_model raising for a head size (a rotary width of half a head that must be even) is named by the same
    width split over other head counts, the query heads per kv head kept so every weight keeps its shape."""
    config = {"family": "llama", "vocab_size": 10, "context_length": 8, "d_model": 80, "n_layers": 1, "n_heads": 8,
              "n_kv_heads": 2, "d_ff": 16}  # fmt: skip
    lines, codes = probe("build_model", build_with_a_rotary_of_half_a_head, (config, None), {})
    said = "build_model raises for a head size of 10 (d_model=80 / n_heads=8) and works for head sizes 4, 20 (2 raises"
    assert any(line.startswith("likely cause") and said in line for line in lines), lines
    assert "at least" not in " ".join(lines) and codes == ["crash_head_size"], lines


def sample_squeezing_its_draw(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
    drawn = torch.multinomial(probs, 1, generator=generator).squeeze()  # the bug: one row squeezes to 0-d
    return torch.stack(drawn.unbind(0)).reshape(logits.shape[:-1])


def test_a_single_row_of_logits_is_named():
    """One row of logits ([V], or [1, V]) makes the draw 0-d and the reshape raise; two rows run: the single row is
    named, not the rank."""
    lines, codes = probe("sample", sample_squeezing_its_draw, (randn(7),), {"temperature": 1.0})
    said = "sample raises for a single row (1-D input) and works for 2 rows (the row repeated)"
    assert any(line.startswith("likely cause") and said in line for line in lines), lines
    assert codes == ["boundary"], (lines, codes)


def probs_with_an_unclamped_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    if top_p is None and top_k is not None:
        logits.topk(top_k)  # the bug: k above the vocabulary raises (the top-p path clamps it)
    return torch.softmax(logits, dim=-1)


def test_a_none_given_its_meaning_is_a_clue_where_a_change_of_the_input_runs_too():
    """top_k above V raises on the path top_p=None takes: top_p=1.0 runs, and so does top_k=V; the count is named,
    the None path said as a clue (held out: a confident line named top_p=None)."""
    lines, _ = probe("sampling_probs", probs_with_an_unclamped_top_k, (randn(3, 7),), {"top_k": 9, "top_p": None})
    causes = [line for line in lines if line.startswith("likely cause")]
    assert len(causes) == 1 and "top_k=9, above the last axis's 7 entries" in causes[0], lines
    assert any(line.startswith("note: sampling_probs raises for top_p=None") for line in lines), lines


def probs_with_a_cutoff_prefilter(logits, temperature=1.0, top_k=None, top_p=None):
    probs = torch.softmax(logits / temperature, -1)
    if top_p is not None:  # the bug (llama2.c's prefilter): no token survives a flat row with a small top_p
        kept = probs >= (1 - top_p) / (probs.shape[-1] - 1)
        if not bool(kept.any(dim=-1).all()):
            raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
    return probs


def test_a_row_of_tied_values_is_named():
    """Held out (batch 95): llama2.c's top-p cutoff drops every token of a flat row. The crash needs the ties, not
    top_p alone: the line names the tied row, which the same values made distinct mend."""
    lines, _ = probe(
        "sampling_probs", probs_with_a_cutoff_prefilter, (torch.zeros(3, 67, dtype=torch.float64),), {"top_p": 0.005}
    )
    assert any("raises for a row of equal values along the last axis" in line for line in lines), lines


def test_a_short_original_length_of_a_rope_scaling_dict_is_named():
    """Held-out batch 105's YaRN kept gpt-oss's ``assert 0 < low < high < d_half - 1`` on the correction range it
    derives from the original length, where Hugging Face clamps it: rope raises for a short
    ``original_max_position_embeddings`` and runs for a longer one; the lengths that run are said with those that
    raise, and the YaRN note says what is derived from it."""
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    x, positions = randn(2, 5, 16), torch.arange(5)
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

    def rope_asserting_its_range(x, positions, theta=10000.0, *, scaling=None):
        low = math.floor(16 * math.log(scaling["original_max_position_embeddings"] / (32 * 2 * math.pi)) / 2)
        assert low > 2  # the bug: the correction range asserted, not clamped
        return subject.rope(x, positions, theta, scaling=scaling)

    lines, _ = probe("rope", rope_asserting_its_range, (x, positions), {"scaling": scaling})
    said = "rope raises for rope_scaling with original_max_position_embeddings=64 and works for original lengths 1024"
    assert any(said in ln and "(256 raises too)" in ln and "YaRN's correction range" in ln for ln in lines), lines


def test_a_cache_kept_in_float32_is_named_by_the_models_dtype():
    """Held-out batch 111 preallocated its key buffers in float32 whatever the model's dtype: a float64 model raises
    through the cache and runs without one. The model built again in float32 (its weights cast), with a cache made
    for it and refilled, runs: the dtype is named, not the cached path (a copy of the model in float32 beside the
    float64 cache raises)."""
    from spec_tests import models
    from spec_tests.harness.diagnosis.model_variants import Ledger
    from spec_tests.harness.subject.subject import reference_subject

    subject = reference_subject("interleaved")
    config = models.CONFIGS["llama_gqa"]
    model = subject.build(config, models.random_state_dict(config, seed=1), dtype="float64")
    ledger = Ledger(subject)
    ledger.record("build", (config, None), {"dtype": "float64"}, model)
    cache = subject.new_cache(model, 2)
    ledger.record("new_cache", (model, 2), {}, cache)
    ids = torch.randint(0, config["vocab_size"], (2, 3))

    def forward_with_a_float32_cache(m, ids, cache=None):
        dtype = next(m.parameters()).dtype  # a cache made for another dtype than the model's raises as well
        if cache is not None and (dtype == torch.float64 or cache.key_buffers[0].dtype != dtype):
            raise RuntimeError("expected scalar type Float but found Double")
        return subject.forward(m, ids, cache)

    lines, _ = probe("forward", forward_with_a_float32_cache, (model, ids, cache), {}, ledger)
    assert any("forward raises for a float64 model and works for the same model in float32" in ln for ln in lines), (
        lines
    )
