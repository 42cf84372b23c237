"""From logits to tokens: temperature, top-k, top-p (in that order), and drawing samples."""

import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from . import filters
from .draws import draw_causes, follows, one_draw_causes
from .harness.judging.compare import mismatch
from .harness.judging.spec import inplace_consequence
from .harness.judging.tolerances import tolerance
from .harness.plugin.markers import judges
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
    dict(top_k=1, top_p=0.5),
]


def kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs > 0).flatten().tolist()


def batch_logits(spec, seed: int, rows: int = 4) -> torch.Tensor:
    """Rows with different spreads (scale 0.3 to 5): each row keeps a different number of tokens."""
    scales = torch.tensor([0.3, 1.0, 2.5, 5.0][:rows], dtype=torch.float64)[:, None].to(spec.device)
    return spec.inputs.randn(rows, S.V, seed=seed) * scales


@judges("sampling_probs")
@pytest.mark.bug_class("sampling_order", "top_k", "top_p")
@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_sampling_probs_match_reference(spec, kw):
    """sampling_probs divides by temperature, keeps the top-k logits, keeps the top-p nucleus of that distribution and
    renormalises (protocol: sampling_probs)."""
    filters.require(spec.impl, kw)
    spec.call(
        "sampling_probs",
        batch_logits(spec, 31),
        **kw,
        axes="b v",
        behaviour=f"sampling_probs(logits [4, V], {kw}) for rows of different spread",
    )


@judges("sampling_probs", "sample")
@pytest.mark.bug_class("stability")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_logits_past_the_range_of_exp(spec, dtype):
    """sampling_probs of logits whose scaled values lie far past exp's range (up to ~10^4 after a temperature of 0.3;
    exp overflows past 88.7 in float32 and 709.8 in float64) is the specified finite distribution, and sample draws
    valid ids from them (protocol: sampling_probs, sample; course notes: subtract the max before exp). Large logits
    are ordinary: a confident model, a low temperature."""
    logits = (batch_logits(spec, 33) * 600).to(dtype)
    spec.call(
        "sampling_probs",
        logits,
        temperature=0.3,
        axes="b v",
        behaviour=f"sampling_probs(logits [4, V] up to ~{float(logits.abs().max()):.0f}, temperature 0.3) in {dtype}",
    )
    ids = spec.impl.sample(logits, temperature=0.3, generator=spec.inputs.generator(3))
    spec.require(
        tuple(ids.shape) == (logits.shape[0],) and bool(((ids >= 0) & (ids < S.V)).all()),
        behaviour="sample draws one valid id per row from such logits",
        found=f"ids {ids.tolist()}",
    )


def rows_reordered(ids: torch.Tensor, argmax: torch.Tensor) -> str | None:
    """A cause where ``ids`` hold every row's argmax, at other rows: the leading axes flattened and restored in
    different orders (folded back column-major: a Julia-order [T, B] reshape of rows flattened as [B, T]); None
    where they hold other values, or the right ones."""
    if ids.shape != argmax.shape or ids.dim() < 2 or torch.equal(ids, argmax):
        return None
    if not torch.equal(ids.flatten().sort().values, argmax.flatten().sort().values):
        return None
    folded = argmax.flatten().reshape(*reversed(argmax.shape)).permute(*reversed(range(argmax.dim())))
    if torch.equal(ids, folded):
        return (
            f"likely cause: every row's argmax is there, at another row: the rows of logits {list(argmax.shape)} are "
            "flattened in one order and the ids folded back in the other (row-major [B, T] flattened, read back "
            "column-major as [T, B] and transposed: a Julia- or Fortran-order reshape). Fix: flatten and restore "
            "the leading axes in one order: logits.reshape(-1, V), then ids.reshape(logits.shape[:-1])"
        )
    return (
        "likely cause (weak evidence): every row's argmax is there, at another row: the leading axes are flattened "
        "and restored in different orders. Fix: flatten and restore the leading axes in one order"
    )


@judges("sampling_probs", "sample")
@pytest.mark.parametrize("shape", [(S.V,), (2, 3, S.V)], ids=["[V]", "[B,T,V]"])
def test_sampling_probs_any_leading_shape(spec, shape):
    """sampling_probs and sample work on logits [..., V] of any leading shape, filtering each row on its own, with the
    filters the implementation has (protocol: sampling_probs; amendment 19)."""
    logits = spec.inputs.randn(*shape, seed=37, scale=2.0)
    spec.call(
        "sampling_probs",
        logits,
        **filters.supported(spec.impl, dict(temperature=0.8, top_k=9, top_p=0.7)),
        behaviour=f"sampling_probs of logits shaped {list(shape)}",
    )
    spec.call(
        "sampling_probs",
        logits,
        temperature=0.0,
        label="greedy",
        behaviour=f"sampling_probs(temperature=0) of logits shaped {list(shape)}: one-hot at each row's argmax",
    )
    for kw in (k for k in (dict(top_k=1), dict(temperature=0.0)) if filters.provided(spec.impl, k)):
        ids = spec.impl.sample(logits, **kw)
        behaviour = f"sample({kw}) of logits {list(shape)} is the argmax, shaped {list(shape[:-1])}"
        argmax = logits.argmax(-1).cpu()
        if tuple(ids.shape) == shape[:-1] and not torch.equal(ids.cpu(), argmax):
            own = spec.impl.sampling_probs(logits, **kw).cpu()  # what sample draws from (protocol: sample)
            one_hot = torch.equal(own.argmax(-1), argmax) and bool((own.amax(-1) == 1).all())
            if not one_hot and bool((own.gather(-1, ids.cpu()[..., None].long()) > 0).all()):
                raise spec.defer(
                    ["sampling_probs"],
                    behaviour,
                    f"consequence of failing sampling_probs: your sampling_probs({kw}) keeps more than each row's "
                    "argmax, and sample draws tokens it keeps (sampling_probs' own tests report it). Fix "
                    "sampling_probs first.",
                    subject="sample",
                )
        causes, codes = ids_shape_causes(ids.shape, shape[:-1]), ("shape",)
        order = rows_reordered(ids.cpu(), argmax) if not causes else None
        if order:
            causes, codes = (order,), ("~layout",) if "(weak" in order else ("layout",)
        elif not causes:
            causes, codes = argmax_axis_causes(ids.reshape(-1), logits.reshape(-1, shape[-1]))
        spec.require(
            tuple(ids.shape) == shape[:-1] and torch.equal(ids.cpu(), argmax),
            subject="sample",
            behaviour=behaviour,
            found=f"shape {tuple(ids.shape)}, values {ids.flatten().tolist()[:6]} (the argmax: "
            f"{argmax.flatten().tolist()[:6]})",
            causes=causes,
            codes=codes if causes else (),
        )
    # a draw at temperature > 0 takes the sampling path (torch.multinomial accepts 1-D or 2-D probabilities only; held
    # out: a sampler handing it [B, T, V] as they came), and gives one id of the row's support per row
    ids = spec.impl.sample(logits, temperature=0.8, generator=spec.inputs.generator(5))
    support = spec.impl.sampling_probs(logits, temperature=0.8).cpu() > 0
    spec.require(
        tuple(ids.shape) == shape[:-1]
        and bool(((ids >= 0) & (ids < shape[-1])).all())
        and bool(support.gather(-1, ids.cpu()[..., None].long()).all()),
        subject="sample",
        behaviour=f"sample(temperature=0.8) of logits {list(shape)} draws one id per row, shaped {list(shape[:-1])}",
        found=f"shape {tuple(ids.shape)}, values {ids.flatten().tolist()[:6]}",
        causes=ids_shape_causes(ids.shape, shape[:-1]),
        codes=("shape",) if ids_shape_causes(ids.shape, shape[:-1]) else (),
    )


@judges("sampling_probs")
@pytest.mark.bug_class("sampling_order")
def test_top_p_uses_temperature_scaled_distribution(spec):
    """The nucleus is taken from the temperature-scaled distribution: at temperature 2 more tokens are needed to reach
    top_p (course notes: sampling before the temperature/top-p transforms)."""
    spec.impl.require_capability("top_p")
    logits = spec.inputs.probs_to_logits([0.6, 0.25, 0.1, 0.05])
    probs = spec.impl.sampling_probs(logits, temperature=2.0, top_p=0.75)
    # At T=1 the top two tokens hold 0.85 >= 0.75; at T=2 the probabilities become
    # [0.427, 0.276, 0.174, 0.123], the top two hold 0.70 < 0.75, so a third token is needed.
    spec.require(
        kept(probs) == [0, 1, 2],
        found=f"kept {kept(probs)}",
        behaviour="temperature 2 then top_p 0.75 keeps tokens [0, 1, 2] of [0.6, 0.25, 0.1, 0.05]",
    )
    spec.call(
        "sampling_probs",
        logits,
        temperature=2.0,
        top_p=0.75,
        behaviour="sampling_probs(temperature=2, top_p=0.75) on [0.6, 0.25, 0.1, 0.05]",
    )


@judges("sampling_probs")
@pytest.mark.bug_class("top_k")
@pytest.mark.parametrize("k", [1, 3, S.V, S.V + 5])
def test_top_k_keeps_exactly_k(spec, k):
    """top_k keeps exactly the k largest logits per row (all of them when k >= V) (protocol: sampling_probs)."""
    spec.impl.require_capability("top_k")
    logits = batch_logits(spec, 32)
    probs = spec.impl.sampling_probs(logits, top_k=k)
    for row in range(logits.shape[0]):
        want = sorted(logits[row].topk(min(k, S.V)).indices.tolist())
        got = kept(probs[row])
        first = k < S.V and all(kept(r) == list(range(k)) for r in probs)  # the same first k ids in every row
        spec.require(
            got == want,
            behaviour=f"top_k={k} keeps the {min(k, S.V)} largest logits",
            found=f"row {row} keeps {len(got)} tokens: {got[:10]}...",
            causes=(
                f"likely cause: every row keeps ids 0 to {k - 1}, the first {k} of the vocabulary, whatever its "
                "logits: the filter takes the first k entries of an array it takes for sorted (a sort skipped, or a "
                "sorted array's values put back without their permutation). Fix: keep the k largest logits "
                "(logits.topk(k)), on the ids they belong to",
            )
            if first
            else (),
            codes=("knob:top_k",) if first else (),
        )


BOUNDARY_CASES = [(0.8 - 1e-4, 2), (0.8 + 1e-4, 3), (0.5 - 1e-4, 1), (0.5 + 1e-4, 2), (1.0, 4)]


def counts_follow(seen: dict, rule, probs_in) -> bool:
    """Whether the implementation kept ``rule(top_p)`` tokens (``seen``: top_p -> tokens kept) for every top_p that is
    no mass of ``probs_in`` (where rounding decides, amendment 2): a cause read from one count is named only where it
    predicts the counts at the other boundaries too (a threshold taken as ``1 - top_p`` keeps one token fewer at one
    boundary and one more at another)."""
    mass = torch.tensor(probs_in, dtype=torch.float64).cumsum(0)
    return all(n == rule(p) for p, n in seen.items() if bool(((mass - p).abs() > 1e-6).all()))


def boundary_rules(probs_in) -> dict[str, object]:
    """top_p -> tokens kept, for the boundary mistakes: the crossing token dropped (mass with its own <= top_p), one
    token past the nucleus (mass before it <= top_p), the nucleus of 1 - top_p (an ascending sort's threshold)."""
    mass = torch.tensor(probs_in, dtype=torch.float64).cumsum(0)
    before = mass - torch.tensor(probs_in, dtype=torch.float64)
    return {
        "drops": lambda p: int((mass <= p).sum()),
        "past": lambda p: int((before <= p).sum()),
        "complement": lambda p: max(int((before < 1 - p).sum()), 1),
    }


@judges("sampling_probs")
@pytest.mark.bug_class("top_p")
@pytest.mark.parametrize("top_p,n_kept", BOUNDARY_CASES)
def test_top_p_keeps_the_crossing_token(spec, dtype, top_p, n_kept):
    """Nucleus = smallest top set whose mass reaches top_p; the token that crosses top_p is kept (protocol:
    sampling_probs).

    On [0.5, 0.3, 0.12, 0.08] the masses 0.5 and 0.8 are boundaries; p is set 1e-4 either side, far
    outside float32 rounding (~1e-7), so the answer does not depend on how sums are rounded (amendment 2).
    """
    spec.impl.require_capability("top_p")
    probs_in = [0.5, 0.3, 0.12, 0.08]
    logits = spec.inputs.probs_to_logits(probs_in, dtype=dtype)
    probs = spec.impl.sampling_probs(logits, top_p=top_p)
    causes = {
        n_kept - 1: "likely cause: the nucleus drops the token that crosses top_p (it keeps tokens while the "
        "cumulative mass, their own included, is <= top_p). Fix: keep a token while the mass before it is < top_p",
        n_kept + 1: "likely cause: the nucleus keeps one token past the smallest set reaching top_p (the mass "
        "before a token compared with <= instead of <, or the cut shifted by one). Fix: keep a token while the "
        "mass before it is < top_p",
    }
    got = kept(probs)
    cause = causes.get(len(got)) if got == list(range(len(got))) else None
    code = ("knob:top_p_boundary",) if cause else ()
    if got and got == list(range(len(got))) and len(got) != n_kept:
        seen = {p: len(kept(spec.impl.sampling_probs(logits, top_p=p))) for p, _ in BOUNDARY_CASES}
        rules = boundary_rules(probs_in)
        if cause and counts_follow(seen, rules["drops" if len(got) < n_kept else "past"], probs_in):
            pass  # the boundary line predicts every count
        elif counts_follow(seen, rules["complement"], probs_in):
            cause = (
                "likely cause: the nucleus is cut at 1 - top_p: an ascending sort's threshold (remove the tokens whose "
                "cumulative mass is <= 1 - top_p) written as top_p. Fix: keep the smallest set of most probable tokens "
                "whose mass reaches top_p"
            )
            code = ("knob:top_p_complement",)
        else:
            counts = {f"{p:.4f}": n for p, n in seen.items()}
            cause = f"note: tokens kept per top_p {counts}, the nucleus keeping {[n for _, n in BOUNDARY_CASES]}"
            code = ()
    spec.require(
        got == list(range(n_kept)),
        behaviour=f"top_p={top_p:.4f} on {probs_in} keeps the top {n_kept}",
        found=f"kept {got} with probabilities {[round(p, 4) for p in probs.tolist()]}",
        causes=(cause,) if cause else (),
        codes=code,
    )
    spec.call(
        "sampling_probs",
        logits,
        top_p=top_p,
        behaviour=f"kept tokens renormalised to sum 1 (each divided by {sum(probs_in[:n_kept])})",
    )


TIED = [0.1, 0.3, 0.3, 0.3]  # three tied top tokens, after a smaller one

TIED_CASES = [(0.25, 1), (0.5, 2), (0.85, 3), (0.95, 4)]


def ties_come_along(top_p: float) -> int:
    """Tokens kept on ``TIED`` where every token as probable as the crossing one is kept too."""
    ordered = sorted(TIED, reverse=True)
    mass, crossing = 0.0, ordered[-1]
    for p in ordered:
        mass += p
        if mass >= top_p:
            crossing = p
            break
    return sum(p >= crossing for p in ordered)


@judges("sampling_probs")
@pytest.mark.bug_class("top_p")
@pytest.mark.parametrize("top_p,n_kept", TIED_CASES)
def test_top_p_with_tied_probabilities(spec, top_p, n_kept):
    """Tied probabilities do not enlarge the nucleus: it is still the smallest set whose mass reaches top_p,
    so of three tokens tied at 0.3, top_p 0.5 keeps two of them, which two being unspecified (protocol: sampling_probs).

    The masses 0.3, 0.6, 0.9 and 1.0 are each at least 0.05 from top_p, far outside rounding.
    """
    spec.impl.require_capability("top_p")
    rows = (TIED, TIED[::-1])  # the ties at the end of one row, at the start of the other
    logits = torch.stack([spec.inputs.probs_to_logits(r) for r in rows])
    probs = spec.impl.sampling_probs(logits, top_p=top_p)
    counts = [len(kept(probs[row])) for row in range(len(rows))]
    for row, probs_in in enumerate(rows):
        got = kept(probs[row])
        tied = [t for t, p in enumerate(probs_in) if p == 0.3]
        others = [c for r, c in enumerate(counts) if r != row]
        if len(set(counts)) > 1:  # the rows differ: a per-row mistake, not the tie rule (one description, no cause)
            causes = (f"note: row {row} keeps {len(got)} tokens, the other row{'s' * (len(others) > 1)} {others}",)
        elif len(got) > n_kept:
            seen = {p: len(kept(spec.impl.sampling_probs(logits, top_p=p)[row])) for p, _ in TIED_CASES}
            if all(n == ties_come_along(p) for p, n in seen.items()):
                causes = (
                    "likely cause: the nucleus keeps every token whose probability is at least that of the crossing "
                    "token, so ties with it come along. Fix: cut the sorted list at the crossing position",
                )
            else:  # the tie rule does not predict the other top_p's counts: what differs, no cause
                causes = (f"note: tokens kept per top_p {seen}, the nucleus keeping {[n for _, n in TIED_CASES]}",)
        else:
            causes = ()
        spec.require(
            len(got) == n_kept and len([t for t in got if t in tied]) == min(n_kept, 3),
            behaviour=f"top_p={top_p} on {probs_in} keeps {n_kept} token(s), {min(n_kept, 3)} of the tied top three",
            found=f"row {row} keeps {got}",
            causes=causes,
        )
        want = torch.tensor(probs_in, dtype=probs.dtype)[got]
        spec.close(
            probs[row][got].cpu(),
            want / want.sum(),
            kind="pointwise",
            behaviour=f"the {n_kept} kept token(s) of row {row} renormalised to sum 1",
        )


@judges("sampling_probs")
@pytest.mark.bug_class("top_p")
@given(seed=seeds, top_p=st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3]), float32=st.booleans())
@example(seed=0, top_p=1e-12, float32=True).via("the corner: 1 - top_p rounds to 1 in float32")
@example(seed=0, top_p=1e-12, float32=False).via("the same in float64")
def test_at_least_one_token_kept(spec, seed, top_p, float32):
    """However small top_p (below float32 rounding too), the most probable token is kept (protocol: at least one
    token always kept). The smallest top_p is always tried in both dtypes: where 1 - top_p rounds to 1, a filter
    that does not force-keep the top token removes every token, and the drawn examples (derandomised from the test's
    own source) need not reach that corner."""
    spec.impl.require_capability("top_p")
    logits = batch_logits(spec, seed % 1000).to(torch.float32 if float32 else torch.float64)
    probs = spec.impl.sampling_probs(logits, top_p=top_p)
    top = logits.argmax(dim=-1)
    at_top = probs.gather(-1, top[:, None]).flatten()
    ok = bool((at_top == 1).all())
    alone = None if ok else [spec.impl.sampling_probs(row[None], top_p=top_p)[0] for row in logits]
    spec.require(
        ok,
        behaviour=f"top_p={top_p:.2g} keeps exactly the argmax",
        found=f"probabilities at argmax {at_top.tolist()}",
        **tiny_top_p_cause(probs, at_top, alone, top),
    )


@judges("sampling_probs")
@pytest.mark.bug_class("top_p")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_top_p_on_a_flat_distribution_keeps_one_token(spec, dtype):
    """Every logit equal (an untrained model's flat distribution) and top_p below 1 / V: the nucleus is one token,
    which one being unspecified, kept with probability 1 (protocol: sampling_probs, the smallest set whose mass reaches
    top_p; at least one token always kept). A prefilter that drops every token below a cutoff such as
    (1 - top_p) / (V - 1) (llama2.c's) drops them all here."""
    spec.impl.require_capability("top_p")
    top_p = 0.5 / S.V
    logits = torch.zeros(3, S.V, dtype=dtype, device=spec.device)
    probs = spec.impl.sampling_probs(logits, top_p=top_p)
    ones = [int((row == 1).sum()) for row in probs]
    spec.require(
        ones == [1, 1, 1] and bool(((probs == 0) | (probs == 1)).all()),
        behaviour=f"top_p={top_p:.3g} on {S.V} equal logits keeps one token per row, with probability 1",
        found=f"tokens at probability 1 per row: {ones}; probabilities other than 0 and 1: "
        f"{int(((probs != 0) & (probs != 1)).sum())}",
    )


def tiny_top_p_cause(probs, at_top, alone=None, top=None) -> dict:
    """What a tiny top_p's wrong output shows: rows that keep their argmax alone and not together (``alone``: each
    row's output computed by itself), every token dropped (NaN), the top token dropped (0 at the argmax), or the
    argmax kept alone at its own probability (not renormalised); else only what differs."""
    keep_top = "never drop the most probable token (keep it whatever the cumulative mass)"

    def likely(why: str, fix: str, code: str) -> dict:  # a "~" code is weak evidence
        weak = " (weak evidence)" if code.startswith("~") else ""
        return {"causes": (f"likely cause{weak}: {why}. Fix: {fix}",), "codes": (code,)}

    if alone is not None and all(bool(row[int(t)] == 1) for row, t in zip(alone, top, strict=True)):
        why = (
            "each row given alone keeps exactly its argmax, and the rows given together do not: a row's filter "
            "depends on the other rows (indices gathered, flattened or scattered across the batch, or a sort or "
            "cumulative sum over another axis than the last)"
        )
        fix = "filter every row on its own: sort, cumsum, mask and scatter along the last axis only"
        return likely(why, fix, "batch_mixing")
    if bool(probs.isnan().any()):
        why = "every token is dropped (all -inf, then NaN): the top token must always stay"
        return likely(why, keep_top, "nan_rows")
    one_elsewhere = ((probs > 0).sum(-1) == 1) & (probs.max(-1).values == 1) & (at_top == 0)
    if bool(one_elsewhere.any()):
        why = (
            "one token is kept at probability 1, but not the most probable one: the filtered values land on other "
            "token ids than they came from (a sort's permutation applied again instead of inverted), or the least "
            "probable end of the sort is kept"
        )
        fix = "put the filtered values back with the inverse permutation (scatter to the sorted indices)"
        return likely(why, fix, "~knob:unsort")
    if bool((at_top == 0).any()):
        return likely("the nucleus drops the top token for a tiny top_p", keep_top, "knob:top_p_boundary")
    if bool(((probs > 0).sum(-1) == 1).all()):
        why = "the argmax is kept alone but keeps its own probability: the kept mass is not renormalised to 1"
        return likely(why, "divide the kept probabilities by their sum", "knob:renormalisation")
    kept = (probs > 0).sum(-1).tolist()
    return {"causes": (f"note: tokens kept per row {kept}; only the argmax should be, at probability 1",)}


@judges("sampling_probs")
@pytest.mark.bug_class("validation")
def test_a_whole_number_temperature_is_that_float(spec):
    """A temperature given as a Python int (2) is the float of the same value: sampling_probs(logits, temperature=2)
    equals the reference's (protocol: sampling_probs; amendment 35: a number where the protocol writes a float)."""
    logits = batch_logits(spec, 37)
    spec.call(
        "sampling_probs",
        logits,
        temperature=2,
        kind="pointwise",
        behaviour="sampling_probs(logits, temperature=2), an int, is sampling_probs at temperature 2.0",
    )


@judges("sampling_probs", "sample")
def test_temperature_zero_is_argmax(spec):
    """temperature 0 gives a one-hot distribution at the argmax, and sample returns the argmax (protocol:
    sampling_probs; amendment 4)."""
    logits = batch_logits(spec, 33)
    probs = spec.impl.sampling_probs(logits, temperature=0.0)
    want = torch.nn.functional.one_hot(logits.argmax(-1), S.V).to(probs.dtype)
    spec.require(
        torch.equal(probs, want),
        behaviour="temperature 0 -> one-hot at argmax",
        found=f"kept {[kept(r) for r in probs]}",
    )
    ids = spec.impl.sample(logits, temperature=0.0)
    causes, codes = argmax_axis_causes(ids, logits)
    spec.require(
        torch.equal(ids.cpu(), logits.argmax(-1).cpu()),
        subject="sample",
        behaviour="sample(temperature=0) returns the argmax",
        found=f"{ids.tolist()} vs {logits.argmax(-1).tolist()}",
        causes=causes,
        codes=codes,
    )


@judges("sampling_probs", "sample")
@pytest.mark.parametrize("kw", [dict(top_k=5), dict(top_p=0.9), dict(top_k=5, top_p=0.5)], ids=str)
def test_temperature_zero_with_filters_is_argmax(spec, kw):
    """temperature 0 with top_k or top_p given is still the one-hot argmax, and sample returns the argmax: the filters
    come after the temperature and always keep the most probable token, so they change nothing (protocol:
    sampling_probs, "temperature == 0 -> one-hot at argmax"; amendment 4). Code that refuses filters at temperature
    0, or sends them down a sampling path that divides by it, fails only here."""
    filters.require(spec.impl, kw)
    logits = batch_logits(spec, 34)
    probs = spec.impl.sampling_probs(logits, temperature=0.0, **kw)
    want = torch.nn.functional.one_hot(logits.argmax(-1), S.V).to(probs.dtype)
    nan = bool(torch.isnan(probs).any())
    spec.require(
        torch.equal(probs, want),
        behaviour=f"sampling_probs(temperature=0, {kw}) -> one-hot at argmax",
        found=f"NaN in rows {torch.isnan(probs).any(-1).nonzero().flatten().tolist()}"
        if nan
        else f"kept {[kept(r) for r in probs]}",
        causes=(
            f"likely cause (weak evidence): with {kw} at temperature 0 the result is NaN: most often the logits reach "
            "a division by the temperature (the filtered path taken instead of the greedy one: 0/0 or inf - inf), or a "
            "filter removes every token (test_top_k_keeps_exactly_k and the top-p tests judge the filters). Fix: at "
            "temperature 0 return the one-hot argmax before any filter",
        )
        if nan
        else (),
        codes=("~knob:temperature",) if nan else (),
    )
    ids = spec.impl.sample(logits, temperature=0.0, **kw)
    causes, codes = argmax_axis_causes(ids, logits)
    spec.require(
        torch.equal(ids.cpu(), logits.argmax(-1).cpu()),
        subject="sample",
        behaviour=f"sample(temperature=0, {kw}) returns the argmax",
        found=f"{ids.tolist()} vs {logits.argmax(-1).tolist()}",
        causes=causes,
        codes=codes,
    )


@pytest.mark.bug_class("validation")
@pytest.mark.parametrize(
    "kw",
    [dict(temperature=-0.5), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(top_p=-0.1)],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
@pytest.mark.parametrize("fn", [pytest.param(f, marks=judges(f), id=f) for f in ("sampling_probs", "sample")])
def test_invalid_arguments_raise(spec, kw, fn):
    """temperature < 0, top_k < 1 and top_p outside (0, 1] raise ValueError (protocol: sampling_probs)."""
    filters.require(spec.impl, kw)
    logits = batch_logits(spec, 34)
    value = str(next(iter(kw.values())))
    spec.raises(
        ValueError,
        lambda: getattr(spec.impl, fn)(logits, **kw),
        subject=fn,
        mention=(value,),
        behaviour=f"{fn}({kw}) raises ValueError",
    )


@judges("sample")
def test_greedy_sample_leaves_the_generator_alone(spec):
    """sample at temperature 0 returns the argmax without consuming the generator (protocol: amendment 4)."""
    logits = batch_logits(spec, 38)
    gen = spec.inputs.generator(11)
    before = gen.get_state().clone()
    ids = spec.impl.sample(logits, temperature=0.0, generator=gen)
    causes, codes = argmax_axis_causes(ids, logits)
    spec.require(
        torch.equal(ids.cpu(), logits.argmax(-1).cpu()),
        behaviour="sample(temperature=0) is the argmax",
        found=f"{ids.tolist()} vs {logits.argmax(-1).tolist()}",
        causes=causes,
        codes=codes,
    )
    spec.require(
        torch.equal(gen.get_state(), before),
        behaviour="sample(temperature=0) draws nothing from the generator",
        found="the generator's state moved: a random draw was made",
        causes=(
            "likely cause: temperature 0 still samples (from a one-hot distribution). Fix: return the argmax directly",
        ),
        codes=("knob:temperature",),
    )


def argmax_axis_causes(ids, logits) -> tuple[tuple, tuple]:
    """Where greedy ids ``ids`` are the argmax of ``logits [B, V]`` over another axis than the vocabulary: over the
    flattened logits (``argmax(x)`` without ``dim``: one index for all B * V entries) or over the batch axis."""
    ids = ids.cpu() if isinstance(ids, torch.Tensor) else None
    if ids is None or ids.is_floating_point():
        return (), ()
    rows, values = logits.shape[0], logits.cpu()
    one_hot = torch.zeros_like(values).scatter(-1, values.argmax(-1, keepdim=True), 1.0)  # sampling_probs' answer
    for of in (values, one_hot):  # the argmax of the logits, or of the one-hot distribution taken from them
        readings = (
            ("the flattened logits (argmax without dim: one index into all B * V entries)", of.reshape(-1).argmax()),
            ("the batch axis (dim=0 where the vocabulary is dim=-1)", of.argmax(0)),
        )
        for said, value in readings:
            if rows > 1 and ids.shape == value.shape and torch.equal(ids, value):
                return (f"likely cause: the argmax is taken over {said}. Fix: argmax(dim=-1)",), ("knob:reduction_dim",)
    argmax = values.argmax(-1)
    for d in (-1, 1):  # two or more rows, each one off the same way
        if ids.numel() > 1 and ids.shape == argmax.shape and torch.equal(ids.long(), argmax + d):
            return (
                f"likely cause: every id is its row's argmax {'minus' if d < 0 else 'plus'} 1: a token index converted "
                "between 1-based and 0-based on one side only (a 1-based language's argmax kept, or an id shifted for "
                "a reserved token). Fix: return argmax(dim=-1) as it is",
            ), ("offset",)
    return (), ()


@judges("sample")
@pytest.mark.parametrize(
    "kw",
    [dict(temperature=1.3, top_p=0.95), dict(temperature=0.8, top_k=10), dict(top_k=20, top_p=0.9), {}],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain",
)
def test_sample_is_reproducible_per_generator(spec, kw):
    """sample with generators seeded alike draws the same tokens, whichever filters are on, whatever the global RNG
    holds; shape is logits.shape[:-1] (protocol: sample)."""
    filters.require(spec.impl, kw)
    logits = batch_logits(spec, 35)

    def draw(seed, global_seed=0):
        spec.impl.manual_seed(
            spec.inputs.torch_seed(global_seed)
        )  # a sampler drawing from the global RNG would follow this instead
        gen = spec.inputs.generator(seed)
        return spec.impl.sample(logits.clone(), generator=gen, **kw)  # an in-place edit is judged on its own

    first, again = draw(7, global_seed=100), draw(7, global_seed=200)
    causes = ids_shape_causes(first.shape, logits.shape[:-1])
    spec.require(
        tuple(first.shape) == (logits.shape[0],),
        behaviour="sample returns ids shaped logits.shape[:-1]",
        found=f"shape {tuple(first.shape)}",
        causes=causes,
        codes=("shape",) if causes else (),
    )
    spec.require(
        torch.equal(first, again),
        behaviour="the same generator seed gives the same draw",
        found=f"{first.tolist()} then {again.tolist()} (the global RNG seeded differently before each)",
        causes=(
            "likely cause: this path draws from the global RNG, not from the generator. Fix: pass generator= "
            "to torch.multinomial (or whatever draws) on every path",
        ),
        codes=("knob:generator",),
    )
    others = [draw(s) for s in range(8, 16)]
    spec.require(
        any(not torch.equal(first, o) for o in others),
        behaviour="different generator seeds give different draws",
        found="eight other seeds drew the same tokens",
    )


@judges("sample")
def test_sample_leaves_its_logits_unchanged(spec):
    """sample never modifies the logits it is given, whatever the temperature and filters it has (protocol:
    Conventions, inputs are never modified in place; amendment 19)."""
    logits = batch_logits(spec, 39)
    before = logits.clone()
    for kw in (filters.supported(spec.impl, dict(temperature=0.6, top_k=9, top_p=0.8)), dict(temperature=0.0), {}):
        spec.impl.sample(logits, generator=spec.inputs.generator(2), **kw)
        if not torch.equal(logits, before):  # a correct sample calling the implementation's own sampling_probs?
            draw = lambda m, lg, kw=kw: m.sample(lg, generator=spec.inputs.generator(2), **kw)
            roots = spec.inplace_upstream("sample", draw, (before,), (logits,))
            if roots:
                raise spec.defer(
                    roots, f"sample(logits, {kw}) leaves logits unchanged", inplace_consequence("sample", roots)
                )
        spec.require(
            torch.equal(logits, before),
            behaviour=f"sample(logits, {kw}) leaves logits unchanged",
            found=f"{int((logits != before).sum())} of {logits.numel()} logits changed during the call",
            causes=("likely cause: an in-place edit (logits /= temperature, masked_fill_). Fix: logits = logits / t",),
        )


N_DRAWS = 40_000


def ids_shape_causes(got, want) -> tuple[str, ...]:
    """A cause for ids of the wrong shape only where the shape pins it: the right number of ids in one flat axis
    (leading axes flattened), or a trailing axis of 1 (multinomial's [N, 1] not squeezed)."""
    got, want = tuple(got), tuple(want)
    if got == want:
        return ()
    if len(got) == 1 and len(want) > 1 and got[0] == math.prod(want):
        return ("likely cause: the leading axes of logits are flattened and not restored. Fix: reshape the ids to "
                "logits.shape[:-1]",)  # fmt: skip
    if got == (*want, 1):
        return ("likely cause: the ids keep a trailing axis of 1 (torch.multinomial returns [N, 1]). Fix: squeeze it, "
                "ids shaped logits.shape[:-1]",)  # fmt: skip
    return ()


def unfiltered_draw_causes(counts, logits, kw, probs=None, probs_with=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Why filtered-out tokens were drawn, named only where the draw frequencies pin it: they follow the unfiltered
    distribution (softmax of logits / temperature, or of the raw logits), or (given ``probs``, the protocol's
    distribution) they are the draws' ranks in the sorted order, 0 the most probable, instead of their ids, or (given
    ``probs_with(options)``, the reference's sampling_probs of the logits with other options) the one classic
    mistake's distribution of ``draws.draw_causes`` (one filter skipped, a second softmax). Drawing outside the kept
    set has other causes too (a filter keeping one token too many, a nucleus cut at the wrong place), which the
    sampling_probs tests name: then the difference is described, weakly."""
    if probs is not None:
        ranked = probs.double().cpu().sort(descending=True).values
        if _within(counts, ranked):
            return (
                "likely cause: sample returns each drawn token's rank in the sorted order (0 for the most probable) "
                "instead of its token id: the draws of ids 0, 1, 2, ... follow the sorted probabilities. Fix: map "
                "the drawn position back through the sort's indices (sorted_indices.gather(-1, drawn))",
            ), ("knob:unsort",)
    if probs_with is not None:
        found = draw_causes("sample", counts, N_DRAWS, kw, probs_with)
        if found[0]:
            return found
    t = kw.get("temperature", 1.0)
    for label, p in (("temperature-scaled", (logits.double() / t).softmax(-1)), ("raw", logits.double().softmax(-1))):
        if _within(counts, p.cpu()):
            return (
                f"likely cause: sample draws from the unfiltered {label} distribution (no top-k/top-p): its "
                "frequencies follow softmax(logits"
                + (" / temperature" if label != "raw" else "")
                + ") within 5.5 standard errors. Fix: draw from sampling_probs(logits, temperature, top_k, top_p)",
            ), ("knob:sampling_order",)
    return (
        "likely cause (weak evidence): the filter lets tokens through that it should remove (a filter skipped, "
        "applied in another order, or keeping too many); the sampling_probs tests tell which. Fix: draw from "
        "sampling_probs(logits, temperature, top_k, top_p)",
    ), ("~knob:sampling_order",)


def _within(counts: torch.Tensor, p: torch.Tensor) -> bool:
    """Draw frequencies ``counts`` of ``N_DRAWS`` draws follow ``p`` (``draws.follows``)."""
    return follows(counts, p, N_DRAWS)


def follows_own_sampling_probs(spec, logits, kw, counts, probs) -> None:
    """Where the draws miss the protocol's distribution but follow the implementation's own
    ``sampling_probs`` (which differs from the protocol's), sample does what the protocol says of it (it
    draws from sampling_probs): the failure is the sampling_probs tests' to report (observed draws, not a
    rerun), so one sampling_probs bug costs once."""
    if _within(counts, probs.cpu()) or not spec.impl.provides("sampling_probs"):
        return
    own = spec.impl.sampling_probs(logits, **kw).double().cpu()
    if mismatch(own, probs.cpu(), tolerance("pointwise", own.dtype)) is None or not _within(counts, own):
        return
    raise spec.defer(
        ["sampling_probs"],
        f"sample({kw}) draws from the protocol's sampling_probs",
        "the draws follow this implementation's own sampling_probs, which differs from the protocol's "
        "(the sampling_probs tests report how)",
    )


@judges("sample")
@pytest.mark.bug_class("sampling_order", "top_k", "top_p")
@pytest.mark.parametrize(
    "kw", [dict(temperature=0.8, top_k=6), dict(temperature=1.5, top_p=0.8)], ids=["t0.8,top_k6", "t1.5,top_p0.8"]
)
def test_sample_frequencies_follow_sampling_probs(spec, kw):
    """Token frequencies of 40,000 seeded draws match the protocol's distribution, and no token outside the kept set is
    ever drawn (protocol: sample).

    Each frequency has standard error sqrt(p(1-p)/N) <= 0.0025; the test allows 5.5 standard
    errors per token (plus 1e-3), so a correct implementation fails with probability below 1e-6
    over the (at most 67) tokens by a union bound; the generator seed is fixed, so it is
    deterministic for a given implementation.
    """
    filters.require(spec.impl, kw)
    logits = batch_logits(spec, 36, rows=3)[2]  # a peaked row
    probs = spec.expected(lambda m, lg: m.sampling_probs(lg, **kw), logits)
    before = logits.clone()
    draws = spec.impl.sample(logits.expand(N_DRAWS, -1), generator=spec.inputs.generator(0), **kw)
    counts = torch.bincount(draws.flatten().cpu(), minlength=S.V).double() / N_DRAWS
    edited = not torch.equal(logits, before)  # the caller's logits changed: the draws read them while they changed
    if edited and spec.failing(("sampling_probs",)):
        raise spec.defer(
            ["sampling_probs"],
            f"sample({kw}) frequencies match the distribution",
            "consequence of failing sampling_probs: sample changed the logits it was given in place, as your "
            "sampling_probs does (its own tests report it), so its draws (one expanded row read 40,000 times) came "
            "from logits that changed while it drew. Fix sampling_probs first.",
        )
    spec.require(
        not edited,
        behaviour=f"sample({kw}) leaves the logits it is given as they are (protocol v1, Conventions)",
        found="the logits given to sample changed during the call",
        causes=(
            "likely cause: sample edits its logits in place (x /= temperature, a softmax or a filter written into "
            "the caller's tensor). Fix: compute on a copy",
        ),
        codes=("knob:in_place",),
    )
    outside = [t for t in torch.nonzero(counts > 0).flatten().tolist() if probs[t] == 0]
    follows_own_sampling_probs(spec, logits, kw, counts, probs)

    def probs_with(options):
        label = "draws:" + ",".join(f"{k}={v}" for k, v in sorted(options.items()))
        return spec.expected(lambda m, lg: m.sampling_probs(lg, **options), logits, label=label).double().cpu()

    causes, codes = unfiltered_draw_causes(counts, logits, kw, probs, probs_with) if outside else ((), ())
    spec.require(
        not outside,
        behaviour=f"sample({kw}) draws only tokens sampling_probs keeps",
        causes=causes,
        codes=codes,
        found=f"drew filtered-out tokens {outside[:10]} ({len(outside)} of the {int((probs == 0).sum())} filtered out)",
    )
    p = probs.cpu()
    bound = 5.5 * (p * (1 - p) / N_DRAWS).sqrt() + 1e-3
    worst = int(torch.argmax((counts - p).abs() - bound))
    within = bool(((counts - p).abs() <= bound).all())
    causes, codes = ((), ()) if within else sharpness_causes(counts, p, kw.get("temperature", 1.0))
    if not within and not causes:  # every row the same token: one draw shared by the rows
        causes, codes = one_draw_causes(counts, p, N_DRAWS)
    spec.require(
        within,
        behaviour=f"sample({kw}) frequencies match the distribution within 5.5 standard errors",
        found=f"token {worst}: frequency {counts[worst]:.4f}, probability {p[worst]:.4f} (allowed ±{bound[worst]:.4f})",
        causes=causes,
        codes=codes,
    )


def uniform_race(p: torch.Tensor, grid: int = 4000) -> torch.Tensor:
    """The distribution of argmax(p / U) with U uniform on (0, 1) (the exponential race run with uniform noise):
    P(i wins) = integral over u in (0, 1) of prod_{j != i} max(0, 1 - p_j u / p_i), by the midpoint rule."""
    p = p.double()
    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    kept = p > 0
    out = torch.zeros_like(p)
    for i in torch.nonzero(kept).flatten().tolist():
        others = torch.cat([p[:i], p[i + 1 :]])
        terms = (1 - others[None, :] * u[:, None] / p[i]).clamp(min=0)  # [grid, V - 1]
        out[i] = terms.prod(dim=1).mean()
    return out / out.sum()


def negated_gumbel_race(p: torch.Tensor, grid: int = 6000) -> torch.Tensor:
    """The distribution of argmax(log p - G) with G ~ Gumbel(0, 1) (the Gumbel-max trick with the noise's sign
    flipped): P(i wins) = integral over y of f(y - a_i) prod_{j != i} F(y - a_j), a = log p, where -G has
    cdf F(z) = 1 - exp(-exp(z)) and density f(z) = exp(z - exp(z)); the midpoint rule on a grid of y."""
    kept = p > 0
    a = torch.where(kept, p.double(), 1.0).log()
    lo, hi = float(a[kept].min()) - 12.0, float(a[kept].max()) + 4.0
    y = lo + (torch.arange(grid, dtype=torch.float64) + 0.5) * (hi - lo) / grid
    z = y[:, None] - a[None, :]  # [grid, V]
    log_cdf = torch.log1p(-torch.exp(-torch.exp(z)).clamp(max=1 - 1e-300))
    log_cdf = torch.where(kept[None, :], log_cdf, 0.0)
    total = log_cdf.sum(-1, keepdim=True)
    density = torch.exp(z - torch.exp(z) + total - log_cdf)  # f(y - a_i) * prod_{j != i} F(y - a_j)
    out = torch.where(kept, density.sum(0) * (hi - lo) / grid, 0.0)
    return out / out.sum()


def sharpness_causes(counts, p, t: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where the draws keep the right tokens but follow another distribution than ``p`` (the kept set of
    sampling_probs at temperature ``t``): the temperature applied twice draws from p ** (1 / t) renormalised
    (softmax of the kept logits / t**2), and left out of the draw (applied to the filter only) from p ** t; the
    exponential race run with uniform noise (argmax(p / U)) from ``uniform_race(p)``; the Gumbel-max trick with the
    noise's sign flipped from ``negated_gumbel_race(p)``; a second softmax over the
    probabilities (or Gumbel noise added to them, not to their logs) from softmax(p) over the kept tokens; the kept
    tokens drawn alike from 1 / k. Named only where exactly one of them fits the frequencies."""
    kept = p > 0
    readings = [
        ("the exponential race runs with uniform noise: argmax(p / U) does not pick token i with probability p_i",
         "argmax(p / E) with E ~ Exponential(1) (torch.empty_like(p).exponential_(1)), or torch.multinomial(p)",
         uniform_race(p), "knob:draw"),
        ("the probabilities go through a second softmax (or Gumbel noise is added to them, not to their logs): the "
         "draws follow softmax(p) over the kept tokens",
         "draw from p itself: torch.multinomial(p), or argmax(log p + Gumbel)",
         torch.where(kept, p.exp(), 0.0), "knob:draw"),
        ("the Gumbel noise has the wrong sign: argmax(log p - G) does not draw token i with probability p_i",
         "add the noise: argmax(log p + G) with G = -log(-log(U)), U uniform on (0, 1)",
         negated_gumbel_race(p), "knob:draw"),
        ("every kept token is drawn alike: the draw ignores the probabilities (a mask drawn from, not p)",
         "draw from the kept probabilities: torch.multinomial(p)", kept.double(), "knob:draw"),
    ]  # fmt: skip
    if t not in (0, 1):
        readings += [
            ("the temperature is applied twice: the draws follow the kept logits divided by temperature**2",
             "divide the logits by the temperature once, before the filters; draw from that distribution",
             p ** (1 / t), "knob:temperature"),
            ("the temperature shapes the filters only: the draws follow the kept logits without it",
             "draw from the temperature-scaled distribution the filters kept", p**t, "knob:temperature"),
        ]  # fmt: skip
    fits = [(said, fix, code) for said, fix, q, code in readings if not torch.allclose(q / q.sum(), p)
            and _within(counts, q / q.sum())]  # fmt: skip
    if len(fits) != 1:
        return (), ()
    said, fix, code = fits[0]
    return (f"likely cause: {said} (the frequencies follow it within 5.5 standard errors). Fix: {fix}",), (code,)
