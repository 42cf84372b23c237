"""From logits to tokens: temperature, top-k, top-p (in that order), and drawing samples."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import inputs
from .assertions import require, require_value_error
from .inputs import S
from .strategies import seeds

pytestmark = pytest.mark.component("sampling")

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.9, top_k=5),
    dict(top_p=0.6),
    dict(temperature=0.5, top_p=0.9),
    dict(temperature=1.3, top_k=7, top_p=0.75),
    dict(top_k=1),
]


def kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs > 0).flatten().tolist()


def batch_logits(seed: int, rows: int = 4, device="cpu") -> torch.Tensor:
    """Rows with different spreads (scale 0.3 to 5): each row keeps a different number of tokens."""
    scales = torch.tensor([0.3, 1.0, 2.5, 5.0][:rows], dtype=torch.float64)[:, None]
    return (inputs.randn(rows, S.V, seed=seed) * scales).to(device)


@pytest.mark.bug_class("sampling_order", "top_k", "top_p")
@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_sampling_probs_match_reference(spec, kw):
    """sampling_probs divides by temperature, keeps the top-k logits, keeps the top-p nucleus of that distribution and renormalises (protocol: sampling_probs)."""
    logits = batch_logits(31, device=spec.device)
    spec.check(
        lambda m, lg: m.sampling_probs(lg, **kw),
        logits,
        component="sampling",
        behaviour=f"sampling_probs(logits [4, V], {kw}) for rows of different spread",
    )


@pytest.mark.parametrize("shape", [(S.V,), (2, 3, S.V)], ids=["[V]", "[B,T,V]"])
def test_sampling_probs_any_leading_shape(spec, shape):
    """sampling_probs and sample work on logits [..., V] of any leading shape, filtering each row on its own (protocol: sampling_probs)."""
    logits = inputs.randn(*shape, seed=37, scale=2.0, device=spec.device)
    spec.check(
        lambda m, lg: m.sampling_probs(lg, temperature=0.8, top_k=9, top_p=0.7),
        logits,
        component="sampling",
        behaviour=f"sampling_probs of logits shaped {list(shape)}",
    )
    spec.check(
        lambda m, lg: m.sampling_probs(lg, temperature=0.0),
        logits,
        component="sampling",
        label="greedy",
        behaviour=f"sampling_probs(temperature=0) of logits shaped {list(shape)}: one-hot at each row's argmax",
    )
    for kw in (dict(top_k=1), dict(temperature=0.0)):
        ids = spec.impl.sample(logits, **kw)
        require(
            tuple(ids.shape) == shape[:-1] and torch.equal(ids.cpu(), logits.argmax(-1).cpu()),
            component="sampling",
            behaviour=f"sample({kw}) of logits {list(shape)} is the argmax, shaped {list(shape[:-1])}",
            found=f"shape {tuple(ids.shape)}, values {ids.flatten().tolist()[:6]}",
        )


@pytest.mark.bug_class("sampling_order")
def test_top_p_uses_temperature_scaled_distribution(spec):
    """The nucleus is taken from the temperature-scaled distribution: at temperature 2 more tokens are needed to reach top_p (course notes: sampling before the temperature/top-p transforms)."""
    logits = inputs.probs_to_logits([0.6, 0.25, 0.1, 0.05], device=spec.device)
    probs = spec.impl.sampling_probs(logits, temperature=2.0, top_p=0.75)
    # At T=1 the top two tokens hold 0.85 >= 0.75; at T=2 the probabilities become
    # [0.427, 0.276, 0.174, 0.123], the top two hold 0.70 < 0.75, so a third token is needed.
    require(
        kept(probs) == [0, 1, 2],
        component="sampling",
        behaviour="temperature 2 then top_p 0.75 keeps tokens [0, 1, 2] of [0.6, 0.25, 0.1, 0.05]",
        found=f"kept {kept(probs)}",
    )
    spec.check(
        lambda m, lg: m.sampling_probs(lg, temperature=2.0, top_p=0.75),
        logits,
        component="sampling",
        behaviour="sampling_probs(temperature=2, top_p=0.75) on [0.6, 0.25, 0.1, 0.05]",
    )


@pytest.mark.bug_class("top_k")
@pytest.mark.parametrize("k", [1, 3, S.V, S.V + 5])
def test_top_k_keeps_exactly_k(spec, k):
    """top_k keeps exactly the k largest logits per row (all of them when k >= V) (protocol: sampling_probs)."""
    logits = batch_logits(32, device=spec.device)
    probs = spec.impl.sampling_probs(logits, top_k=k)
    for row in range(logits.shape[0]):
        want = sorted(logits[row].topk(min(k, S.V)).indices.tolist())
        require(
            kept(probs[row]) == want,
            component="sampling",
            behaviour=f"top_k={k} keeps the {min(k, S.V)} largest logits",
            found=f"row {row} keeps {len(kept(probs[row]))} tokens: {kept(probs[row])[:10]}...",
        )


@pytest.mark.bug_class("top_p")
@pytest.mark.parametrize("top_p,n_kept", [(0.8 - 1e-4, 2), (0.8 + 1e-4, 3), (0.5 - 1e-4, 1), (0.5 + 1e-4, 2), (1.0, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_top_p_keeps_the_crossing_token(spec, top_p, n_kept, dtype):
    """Nucleus = smallest top set whose mass reaches top_p; the token that crosses top_p is kept (protocol: sampling_probs).

    On [0.5, 0.3, 0.12, 0.08] the masses 0.5 and 0.8 are boundaries; p is set 1e-4 either side, far
    outside float32 rounding (~1e-7), so the answer does not depend on how sums are rounded. (No
    ties: with [.., 0.1, 0.1] either tail token could be "the" third.)
    """
    probs_in = [0.5, 0.3, 0.12, 0.08]
    logits = inputs.probs_to_logits(probs_in, dtype=dtype, device=spec.device)
    probs = spec.impl.sampling_probs(logits, top_p=top_p)
    require(
        kept(probs) == list(range(n_kept)),
        component="sampling",
        behaviour=f"top_p={top_p:.4f} on {probs_in} keeps the top {n_kept}",
        found=f"kept {kept(probs)} with probabilities {[round(p, 4) for p in probs.tolist()]}",
    )
    mass = sum(probs_in[:n_kept])
    spec.check(
        lambda m, lg: m.sampling_probs(lg, top_p=top_p),
        logits,
        component="sampling",
        behaviour=f"kept tokens renormalised to sum 1 (each divided by {mass})",
    )


@pytest.mark.bug_class("top_p")
@given(seed=seeds, top_p=st.floats(1e-6, 1e-3))
def test_at_least_one_token_kept(spec, seed, top_p):
    """However small top_p, the most probable token is kept (protocol: at least one token always kept)."""
    logits = batch_logits(seed % 1000, device=spec.device)
    probs = spec.impl.sampling_probs(logits, top_p=top_p)
    top = logits.argmax(dim=-1)
    require(
        bool((probs.gather(-1, top[:, None]) == 1).all()),
        component="sampling",
        behaviour=f"top_p={top_p:.2g} keeps exactly the argmax token",
        found=f"probabilities at argmax {probs.gather(-1, top[:, None]).flatten().tolist()}",
    )


def test_temperature_zero_is_argmax(spec):
    """temperature 0 gives a one-hot distribution at the argmax, and sample returns the argmax (protocol: sampling_probs)."""
    logits = batch_logits(33, device=spec.device)
    probs = spec.impl.sampling_probs(logits, temperature=0.0)
    want = torch.nn.functional.one_hot(logits.argmax(-1), S.V).to(probs.dtype)
    require(
        torch.equal(probs, want),
        component="sampling",
        behaviour="temperature 0 -> one-hot at argmax",
        found=f"kept {[kept(r) for r in probs]}",
    )
    ids = spec.impl.sample(logits, temperature=0.0)
    require(
        torch.equal(ids.cpu(), logits.argmax(-1).cpu()),
        component="sampling",
        behaviour="sample(temperature=0) returns the argmax",
        found=f"{ids.tolist()} vs {logits.argmax(-1).tolist()}",
    )


@pytest.mark.bug_class("validation")
@pytest.mark.parametrize(
    "kw",
    [dict(temperature=-0.5), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(top_p=-0.1)],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
@pytest.mark.parametrize("fn", ["sampling_probs", "sample"])
def test_invalid_arguments_raise(spec, kw, fn):
    """temperature < 0, top_k < 1 and top_p outside (0, 1] raise ValueError naming the value (protocol: sampling_probs)."""
    logits = batch_logits(34, device=spec.device)
    value = str(next(iter(kw.values())))
    require_value_error(
        lambda: getattr(spec.impl, fn)(logits, **kw),
        component="sampling",
        must_mention=(value,),
        behaviour=f"{fn}({kw}) raises ValueError",
    )


def test_sample_is_reproducible_per_generator(spec):
    """sample with generators seeded alike draws the same tokens; shape is logits.shape[:-1] (protocol: sample)."""
    logits = batch_logits(35, device=spec.device)
    draw = lambda seed: spec.impl.sample(
        logits, temperature=1.3, top_p=0.95, generator=torch.Generator(spec.device).manual_seed(seed)
    )  # noqa: E731
    first, again = draw(7), draw(7)
    require(
        tuple(first.shape) == (logits.shape[0],),
        component="sampling",
        behaviour="sample returns ids shaped logits.shape[:-1]",
        found=f"shape {tuple(first.shape)}",
    )
    require(
        torch.equal(first, again),
        component="sampling",
        behaviour="the same generator seed gives the same draw",
        found=f"{first.tolist()} then {again.tolist()}",
    )
    others = [draw(s) for s in range(8, 16)]
    require(
        any(not torch.equal(first, o) for o in others),
        component="sampling",
        behaviour="different generator seeds give different draws",
        found="eight other seeds drew the same tokens",
    )


N_DRAWS = 40_000


@pytest.mark.bug_class("sampling_order", "top_k", "top_p")
@pytest.mark.parametrize(
    "kw", [dict(temperature=0.8, top_k=6), dict(temperature=1.5, top_p=0.8)], ids=["t0.8,top_k6", "t1.5,top_p0.8"]
)
def test_sample_frequencies_follow_sampling_probs(spec, kw):
    """Token frequencies of 40,000 seeded draws match sampling_probs, and no token outside the kept set is ever drawn (protocol: sample).

    Each frequency has standard error sqrt(p(1-p)/N) <= 0.0025; the test allows 5.5 standard
    errors per token (plus 1e-3), so a correct implementation fails with probability below 1e-6
    over the (at most 67) tokens by a union bound; the generator seed is fixed, so it is
    deterministic for a given implementation.
    """
    logits = batch_logits(36, rows=3, device=spec.device)[2]  # a peaked row
    probs = spec.expected(lambda m, lg: m.sampling_probs(lg, **kw), logits)
    draws = spec.impl.sample(logits.expand(N_DRAWS, -1), generator=torch.Generator(spec.device).manual_seed(0), **kw)
    counts = torch.bincount(draws.flatten().cpu(), minlength=S.V).double() / N_DRAWS
    outside = [t for t in torch.nonzero(counts > 0).flatten().tolist() if probs[t] == 0]
    require(
        not outside,
        component="sampling",
        behaviour=f"sample({kw}) draws only tokens kept by sampling_probs",
        found=f"drew filtered-out tokens {outside[:10]}",
    )
    p = probs.cpu()
    bound = 5.5 * (p * (1 - p) / N_DRAWS).sqrt() + 1e-3
    worst = int(torch.argmax((counts - p).abs() - bound))
    require(
        bool(((counts - p).abs() <= bound).all()),
        component="sampling",
        behaviour=f"sample({kw}) frequencies match sampling_probs within 5.5 standard errors",
        found=f"token {worst}: frequency {counts[worst]:.4f}, probability {p[worst]:.4f} (allowed ±{bound[worst]:.4f})",
    )
