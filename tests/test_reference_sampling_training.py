"""Sampling, batching, evaluation and training of the reference against hand computations and plain torch."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import reference as R

F64 = torch.float64


def log_probs(p, dtype=F64):
    return torch.tensor(p, dtype=F64).log().to(dtype)


# ----------------------------------------------------------------------------- sampling_probs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_top_p_keeps_exactly_two(dtype):
    """top_p=0.8 on probabilities [0.5, 0.3, 0.1, 0.1] keeps exactly the first two: [0.625, 0.375, 0, 0]."""
    probs = R.sampling_probs(log_probs([0.5, 0.3, 0.1, 0.1], dtype), top_p=0.8)
    assert probs.dtype == dtype
    assert (probs > 0).tolist() == [True, True, False, False]
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0], dtype=dtype))


@pytest.mark.parametrize("p,kept", [(1.0, 4), (0.81, 3), (0.5, 1), (0.51, 2), (1e-9, 1)])
def test_top_p_nucleus_sizes(p, kept):
    """The nucleus is the smallest top set whose mass reaches p (the crossing token kept; at least one token)."""
    probs = R.sampling_probs(log_probs([0.5, 0.3, 0.1, 0.1]), top_p=p)
    assert int((probs > 0).sum()) == kept
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0, dtype=F64))


def test_top_p_in_shuffled_order_and_batches():
    """top_p works per row and on unsorted vocabularies: the kept set is the most probable tokens of each row."""
    logits = torch.stack([log_probs([0.1, 0.3, 0.1, 0.5]), log_probs([0.05, 0.15, 0.6, 0.2])])
    probs = R.sampling_probs(logits, top_p=0.8)
    want = torch.tensor([[0, 0.375, 0, 0.625], [0, 0, 0.6 / 0.8, 0.2 / 0.8]], dtype=F64)
    torch.testing.assert_close(probs, want)


def test_top_k_by_hand():
    """top_k=2 keeps the two largest logits and renormalises them; top_k >= V changes nothing."""
    logits = torch.tensor([0.3, 2.0, -1.0, 1.5, 0.0], dtype=F64)
    probs = R.sampling_probs(logits, top_k=2)
    e1, e3 = math.exp(2.0), math.exp(1.5)
    want = torch.tensor([0, e1 / (e1 + e3), 0, e3 / (e1 + e3), 0], dtype=F64)
    torch.testing.assert_close(probs, want, atol=1e-15, rtol=0)
    torch.testing.assert_close(R.sampling_probs(logits, top_k=50), F.softmax(logits, -1), atol=1e-15, rtol=0)


def test_temperature_then_top_p_of_scaled_distribution():
    """Temperature is applied before the nucleus: at T=2 the flatter distribution needs three tokens for p=0.8."""
    base = [0.5, 0.3, 0.15, 0.05]
    logits = log_probs(base)
    scaled = np.sqrt(base) / np.sqrt(base).sum()  # softmax(log p / 2) by hand
    want = np.where(np.arange(4) < 3, scaled, 0.0)
    want = want / want.sum()
    torch.testing.assert_close(
        R.sampling_probs(logits, temperature=2.0, top_p=0.8), torch.tensor(want), atol=1e-14, rtol=0
    )
    assert int((R.sampling_probs(logits, temperature=1.0, top_p=0.8) > 0).sum()) == 2


def test_temperature_scales_logits():
    """sampling_probs(logits, temperature=t) equals F.softmax(logits / t)."""
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.0]], dtype=F64)
    torch.testing.assert_close(
        R.sampling_probs(logits, temperature=0.7), F.softmax(logits / 0.7, -1), atol=1e-15, rtol=0
    )


def test_top_k_before_top_p():
    """top-k is applied first: the nucleus is taken from the top-k renormalised distribution."""
    logits = log_probs([0.4, 0.3, 0.2, 0.1])
    # top_k=2 leaves [4/7, 3/7]; the nucleus for p=0.5 is then the first token alone
    probs = R.sampling_probs(logits, top_k=2, top_p=0.5)
    torch.testing.assert_close(probs, torch.tensor([1.0, 0, 0, 0], dtype=F64))
    # top_k=3 leaves [4/9, 3/9, 2/9]; p=0.5 now needs two tokens
    torch.testing.assert_close(
        R.sampling_probs(logits, top_k=3, top_p=0.5), torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=F64)
    )


def test_temperature_zero_is_one_hot_argmax():
    """temperature=0 gives a one-hot at the argmax of each row; sample returns it without drawing from the generator."""
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, -1.0, 0.0, 4.0]], dtype=F64)
    probs = R.sampling_probs(logits, temperature=0.0)
    assert torch.equal(probs, torch.tensor([[0, 1.0, 0, 0], [1.0, 0, 0, 0]], dtype=F64))
    g = torch.Generator().manual_seed(4)
    state = g.get_state()
    assert R.sample(logits, temperature=0.0, generator=g).tolist() == [1, 0]
    assert torch.equal(g.get_state(), state)  # greedy does not consume the generator (protocol amendment 4)


@pytest.mark.parametrize(
    "kwargs,shown",
    [
        (dict(temperature=-0.5), "-0.5"),
        (dict(top_k=0), "0"),
        (dict(top_p=0.0), "0.0"),
        (dict(top_p=1.5), "1.5"),
        (dict(top_p=-0.25), "-0.25"),
    ],
)
def test_invalid_sampling_args_raise_naming_value(kwargs, shown):
    """Invalid temperature/top_k/top_p raise ValueError whose message names the value given."""
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"{name}.*{shown.replace('.', '[.]')}(?!\d)"):
        R.sampling_probs(torch.zeros(4, dtype=F64), **kwargs)
    with pytest.raises(ValueError):
        R.sample(torch.zeros(4, dtype=F64), **kwargs)


def test_sample_frequencies_and_reproducibility():
    """sample draws from sampling_probs: empirical frequencies match within 4 sigma; a seeded generator repeats."""
    logits = torch.tensor([0.3, 2.0, -1.0, 1.5, 0.0], dtype=F64).expand(20000, 5)
    draws = R.sample(logits, temperature=1.3, top_k=4, generator=torch.Generator().manual_seed(0))
    assert draws.shape == (20000,)
    freq = torch.bincount(draws, minlength=5).double() / 20000
    p = R.sampling_probs(logits[0], temperature=1.3, top_k=4)
    assert p[2] == 0 and freq[2] == 0
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / 20000).sqrt() + 1e-12).all(), (freq, p)
    again = R.sample(logits, temperature=1.3, top_k=4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)
    batch = R.sample(torch.zeros(3, 2, 7), generator=torch.Generator().manual_seed(1))
    assert batch.shape == (3, 2)


# ----------------------------------------------------------------------------- get_batch


@pytest.mark.parametrize("kind", ["tensor", "uint16", "int32"])
def test_get_batch_shift_and_coverage(kind):
    """get_batch windows are data[s:s+T] and data[s+1:s+T+1], and every start in [0, N-T-1] occurs (none beyond)."""
    N, T = 12, 4
    raw = np.arange(100, 100 + N)
    data = {"tensor": torch.from_numpy(raw), "uint16": raw.astype(np.uint16), "int32": raw.astype(np.int32)}[kind]
    x, y = R.get_batch(data, 400, T, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (400, T) and x.dtype == torch.long
    starts = x[:, 0] - 100
    assert torch.equal(x, (starts[:, None] + torch.arange(T) + 100))
    assert torch.equal(y, x + 1)
    assert set(starts.tolist()) == set(range(N - T))


def test_get_batch_reproducible_and_too_little_data():
    """get_batch repeats for the same generator seed, and raises ValueError naming the sizes when data is too short."""
    data = np.arange(50)
    a = R.get_batch(data, 6, 5, generator=torch.Generator().manual_seed(3))
    b = R.get_batch(data, 6, 5, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    R.get_batch(np.arange(6), 2, 5)  # exactly context_length + 1 tokens is enough
    with pytest.raises(ValueError, match="5"):
        R.get_batch(np.arange(5), 2, 5)


# ----------------------------------------------------------------------------- evaluate


def test_evaluate_token_weighted_by_hand(oracles):
    """evaluate = total NLL / (N-1) over windows at 0, ctx, 2ctx, ... with a short last one, by F.cross_entropy."""
    cfg = oracles.config("llama", dropout=0.5)
    model = oracles.model(cfg)
    data = torch.randint(0, 37, (23,), generator=torch.Generator().manual_seed(0))
    ctx, n_pred = 5, 22  # windows of 5, 5, 5, 5 and a last one of 2 predicted tokens
    total, window_means = 0.0, []
    with torch.no_grad():
        for s in range(0, n_pred, ctx):
            n = min(ctx, n_pred - s)
            nll = F.cross_entropy(model(data[None, s : s + n])[0], data[s + 1 : s + n + 1], reduction="sum").item()
            total += nll
            window_means.append(nll / n)
    want = total / n_pred
    model.train()
    got = R.evaluate(model, data.numpy(), ctx, batch_size=2)
    assert model.training and all(m.training for m in model.modules())  # mode restored
    assert abs(got["loss"] - want) < 1e-12
    assert abs(got["perplexity"] - math.exp(want)) < 1e-9
    assert abs(np.mean(window_means) - want) > 1e-4  # a per-window average would be caught
    assert abs(R.evaluate(model, data, ctx, batch_size=8)["loss"] - want) < 1e-12  # batching does not matter


# ----------------------------------------------------------------------------- training


def hand_step(model, opt, x, y, max_grad_norm):
    """The protocol's train_step written out with F.cross_entropy, clip_grad_norm_ and the optimizer."""
    model.train()
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm) if max_grad_norm else None
    opt.step()
    return loss.item(), norm


def test_train_step_equals_hand_written_step(oracles):
    """train_step (train mode, dropout 0.1, clipping 0.05, AdamW) equals the hand-written step: loss and new weights."""
    cfg = oracles.config("gpt2", dropout=0.1)
    model = oracles.model(cfg)  # starts in eval mode: train_step must switch to training mode
    twin = copy.deepcopy(model)
    opt, opt_twin = (torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (model, twin))
    x, y = R.get_batch(
        torch.randint(0, 37, (80,), generator=torch.Generator().manual_seed(1)),
        3,
        9,
        generator=torch.Generator().manual_seed(2),
    )
    for step in range(2):
        torch.manual_seed(10 + step)
        got = R.train_step(model, opt, x, y, max_grad_norm=0.05)
        torch.manual_seed(10 + step)
        want, norm = hand_step(twin, opt_twin, x, y, 0.05)
        assert norm > 0.05  # clipping is active
        assert abs(got - want) < 1e-12
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, atol=1e-12, rtol=0, msg=name)
    # without clipping the result differs, so the comparison above does see clipping
    plain = copy.deepcopy(twin)
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    R.train_step(plain, opt_plain, x, y)
    assert max((p - q).abs().max().item() for p, q in zip(plain.parameters(), twin.parameters())) > 1e-6


def test_train_deterministic_and_learns(oracles):
    """train is deterministic for a seed (losses and weights), depends on it, and lowers the loss on a tiny corpus."""
    cfg = oracles.config("llama", vocab_size=11, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, dropout=0.1)
    torch.manual_seed(0)
    base = R.build_model(cfg)
    data = np.tile(np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3]), 30)
    models = [copy.deepcopy(base) for _ in range(3)]
    runs = [R.train(m, data, 40, 8, 8, lr=1e-2, seed=s) for m, s in zip(models, (7, 7, 8))]
    assert runs[0] == runs[1]
    assert all(torch.equal(p, q) for p, q in zip(models[0].parameters(), models[1].parameters()))
    assert runs[0] != runs[2]
    assert len(runs[0]) == 40
    assert np.mean(runs[0][-5:]) < 0.5 * runs[0][0], runs[0]
