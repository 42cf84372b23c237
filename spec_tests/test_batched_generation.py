"""Batched generation with left padding (protocol v2, capability ``attention_mask``, amendment 23).

``forward`` and ``generate`` take ``attention_mask=[B, T]`` of 0/1, zeros before each row's prompt. Every check
relates the batch to the implementation's own unpadded calls, row by row: a left-padded row computes exactly
what it computes alone (its first real token at position 0, no padding key attended, in the cached path as in
the uncached one), whatever the padding and whatever token ids fill it.
"""

import functools
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import models
from .harness.diagnosis.variant import Variant
from .harness.judging.compare import mismatch
from .harness.judging.tolerances import tolerance
from .harness.plugin.markers import judges
from .harness.subject.subject import ImplementationError, reference_subject
from .test_generation import greedy_tokens

pytestmark = pytest.mark.component("generation")

T = 9
PADS = (0, 2, 5)  # one unpadded row, so a mistake that shows only with padding is told from a wrong model
PADS_AGAIN = (2, 2, 5)  # confirms a variant: the first row padded, no row with real tokens where it has padding
NEW = 5


@pytest.fixture
def config(impl, family):
    return models.family_config(impl, family)


def left_padded(spec, cfg, pads, t=T, *, seed, fill=None):
    """``(ids [B, t], mask [B, t])``: row b's first ``pads[b]`` tokens are padding (id ``fill`` or random)."""
    ids = spec.inputs.token_ids(len(pads), t, vocab=cfg["vocab_size"], seed=seed)
    mask = torch.ones(len(pads), t, dtype=torch.long, device=spec.device)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
        if fill is not None:
            ids[b, :p] = fill
    return ids, mask


def real_parts(x, pads):
    """Row b of ``x [B, T, ...]`` from ``pads[b]`` on, concatenated along time: ``[sum(T - pads), ...]``."""
    return torch.cat([x[b, p:] for b, p in enumerate(pads)], dim=0)


def padded_positions(mask):
    """What the protocol specifies: each row's real tokens counted from 0 (padding: 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def padded_rows_hint(actual, expected, pads, t=T) -> tuple[str | None, str]:
    """``(hint, code)`` when only the padded rows of ``real_parts`` are wrong: the unpadded row is right."""
    if actual.shape != expected.shape or 0 not in pads:
        return None, ""
    wrong, start = [], 0
    for b, p in enumerate(pads):
        n = t - p
        if not torch.allclose(actual[start : start + n], expected[start : start + n], rtol=1e-4, atol=1e-6):
            wrong.append(b)
        start += n
    if not wrong or any(pads[b] == 0 for b in wrong):
        return None, ""
    if actual.isnan().any() and not expected.isnan().any():
        return (
            f"likely cause: the padded rows ({wrong}) hold NaN at their real tokens, the unpadded row is right: a "
            "padding query with every key masked gives NaN (a softmax of -inf only: a padding query that may not "
            "see even itself, or the mask applied to the queries' rows), and the next layer spreads it, since a "
            "masked key's weight 0 times its NaN value is NaN. Fix: mask the keys (columns) whose attention_mask is "
            "0, and let each padding query attend at least one key (itself), or zero its output"
        ), "nan_rows"
    return (
        f"likely cause (weak evidence): only the padded rows ({wrong}) differ from the row alone; the unpadded row is "
        "right, so the "
        "model is right and the padding is not handled: positions counted from the padded start, or padding keys "
        "not masked. Fix: positions = cumsum(attention_mask) - 1 per row; mask every key whose attention_mask is 0"
    ), "~knob:position_offset"


def reference_variants(spec, cfg, sd, ids, mask, pads, pick, again=None):
    """The specified batch with one knob turned, computed by the reference: ``pick(ref, model, ids, **kw)``.

    ``again = (ids2, mask2, pads2, actual2)``: a second batch padded otherwise and ``actual2()``, the implementation's
    real parts on it; a variant is then said only where it gives those too (with an unpadded first row, padding keys
    left unmasked and every row masked as the first coincide: the second batch's first row is padded)."""
    ref = reference_subject(spec.impl.rope_style)
    model = models.build(ref, cfg, sd)

    def knobs(ids, mask, pads):
        start = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)
        return [
            Variant(
                "knob:position_offset",
                "positions are counted from the padded start (column index), not from each row's first real token",
                "positions = cumsum(attention_mask) - 1 per row (HF: position_ids from the mask)",
                lambda: real_parts(pick(ref, model, ids, attention_mask=mask, positions=start), pads),
            ),
            Variant(
                "knob:position_offset",
                "positions count each row's real tokens from 1 (cumsum(attention_mask) without the - 1)",
                "positions = cumsum(attention_mask) - 1 per row: a row's first real token is at position 0",
                lambda: real_parts(pick(ref, model, ids, attention_mask=mask, positions=mask.cumsum(-1)), pads),
            ),
            Variant(
                "mask",
                "padding keys are not masked: real tokens attend the padding (or the mask is applied to the queries, "
                "rows of the scores, instead of the keys)",
                "mask every key whose attention_mask is 0, for every query (the mask is over keys: columns)",
                lambda: real_parts(pick(ref, model, ids, positions=padded_positions(mask)), pads),
            ),
            Variant(
                "batch_mixing",
                "every row is masked with the first row's attention_mask (a mask built from row 0, or broadcast from "
                "a batch of one), while positions follow each row's own",
                "mask each row's keys by its own attention_mask row: [B, T] -> [B, 1, 1, T]",
                lambda: real_parts(
                    pick(ref, model, ids, attention_mask=mask[:1].expand_as(mask), positions=padded_positions(mask)),
                    pads,
                ),
            ),
        ]

    found = knobs(ids, mask, pads)
    if again is None:
        return found
    ids2, mask2, pads2, actual2 = again
    tol = tolerance("model", device=spec.device)

    def confirmed(first, second):
        def compute():
            out = first.compute()
            if mismatch(actual2(), second.compute(), tol) is not None:
                raise ValueError("it does not give the second batch")  # fitting_variants skips it
            return out

        return replace(first, compute=compute)

    return [confirmed(a, b) for a, b in zip(found, knobs(ids2, mask2, pads2), strict=True)]


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("padding")
def test_padded_forward_rows_equal_each_row_alone(spec, config):
    """Each row of a left-padded batched forward equals that row alone at its real tokens: positions count from the
    row's first real token and no query attends a padding key (protocol: amendment 23)."""
    spec.impl.require_capability("attention_mask")
    sd = models.random_state_dict(config, seed=251, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids, mask = left_padded(spec, config, PADS, seed=252)
    batched = spec.impl.forward(model, ids, attention_mask=mask)
    alone = [spec.impl.forward(model, ids[b : b + 1, p:])[0] for b, p in enumerate(PADS)]
    actual, expected = real_parts(batched, PADS), torch.cat(alone, dim=0)
    hint, hint_code = padded_rows_hint(actual, expected, PADS)
    ids2, mask2 = left_padded(spec, config, PADS_AGAIN, seed=252)
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    actual2 = functools.cache(lambda: real_parts(raw.forward(model, ids2, attention_mask=mask2), PADS_AGAIN))
    spec.close(
        actual,
        expected,
        hint=hint,
        hint_code=hint_code,
        structural=False,  # row boundaries, not a block or a channel pattern, are the evidence here
        kind="model",
        axes="t v",
        variants=reference_variants(
            spec,
            config,
            sd,
            ids,
            mask,
            PADS,
            lambda m, model, ids, **kw: m.forward(model, ids, **kw),
            again=(ids2, mask2, PADS_AGAIN, actual2),
        ),
        behaviour=f"forward(attention_mask) with left padding {PADS}: each row's real-token logits equal the row alone",
    )


@judges("forward", uses=("build_model", "new_cache", "cache_kv"))
@pytest.mark.bug_class("padding")
def test_padded_cache_holds_each_row_alone(spec, config):
    """The cache of a left-padded prefill holds, at each row's real tokens, the keys and values of the row alone: keys
    rotated at positions counted from the row's first real token (RoPE is relative, so logits alone cannot see a
    shifted start; the cached keys can) (protocol: amendment 23; KV cache)."""
    spec.impl.require_capability("attention_mask")
    sd = models.random_state_dict(config, seed=253, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids, mask = left_padded(spec, config, PADS, seed=254)
    last = config["n_layers"] - 1

    def cached(m, model, ids, **kw):
        cache = m.new_cache(model, ids.shape[0])
        m.forward(model, ids, cache, **kw)
        return torch.cat([torch.cat(m.cache_kv(cache, layer), dim=-1) for layer in (0, last)], dim=-1)

    def time_first(kv):  # [B, Hkv, T, 4 d_head] -> [B, T, Hkv, 4 d_head]
        return kv.transpose(1, 2)

    batched = time_first(cached(spec.impl, model, ids, attention_mask=mask))
    alone = [time_first(cached(spec.impl, model, ids[b : b + 1, p:]))[0] for b, p in enumerate(PADS)]
    actual, expected = real_parts(batched, PADS), torch.cat(alone, dim=0)
    hint, hint_code = padded_rows_hint(actual, expected, PADS)
    behaviour = (
        f"cache_kv after a prefill with left padding {PADS}: keys and values of each row's real tokens (layers 0 and "
        "last) equal those of the row alone"
    )
    # what a cache that fails its own tests holds after a prefill (held out 79: one time step per call) says nothing of
    # forward's padding
    why = "fails its own tests, so what it holds after a padded prefill cannot judge forward's padding"
    with spec.unless_failing(("new_cache", "cache_kv"), behaviour, why):
        spec.close(
            actual,
            expected,
            hint=hint,
            hint_code=hint_code,
            structural=False,  # row boundaries, not a block or a channel pattern, are the evidence here
            kind="model",
            axes="t h d",
            variants=reference_variants(
                spec, config, sd, ids, mask, PADS, lambda m, model, ids, **kw: time_first(cached(m, model, ids, **kw))
            ),
            behaviour=behaviour,
        )


@judges("forward", uses=("build_model", "new_cache"))
@pytest.mark.bug_class("padding")
def test_padded_cached_forward_equals_uncached(spec, config):
    """A left-padded prompt fed through the cache, then two tokens one at a time, each call passing the whole mask
    (cached + new), gives the logits of one uncached forward with that mask at every real token (protocol: amendment
    25; forward with cache)."""
    spec.impl.require_capability("attention_mask")
    sd = models.random_state_dict(config, seed=262, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids, mask = left_padded(spec, config, PADS, T + 2, seed=263)
    full = spec.impl.forward(model, ids, attention_mask=mask)
    behaviour = (
        f"forward through the cache (prefill, then 1 + 1 tokens) with left padding {PADS} and the whole mask at each "
        "call equals one uncached forward, at every real token"
    )
    tol = tolerance("model", device=spec.device)

    def cache_wrong_without_padding() -> list[str]:
        """The failing ``new_cache`` where the same chunks without padding go wrong too (padding shows nothing)."""
        failing = spec.failing(("new_cache",))
        if not failing:
            return []
        try:
            plain = [spec.impl.forward(model, ids[:, :T], cache := spec.impl.new_cache(model, ids.shape[0]))]
            plain += [spec.impl.forward(model, ids[:, t : t + 1], cache) for t in (T, T + 1)]
        except ImplementationError:
            return failing
        return failing if mismatch(torch.cat(plain, dim=1), spec.impl.forward(model, ids), tol) is not None else []

    def defer(failing):
        return spec.defer(
            failing,
            behaviour,
            f"consequence of failing {', '.join(failing)}: without padding too, the same chunks through your cache "
            "give other logits than your uncached forward, or raise (test_cached_logits_equal_full_forward).",
        )

    try:
        cache = spec.impl.new_cache(model, ids.shape[0])
        steps = [spec.impl.forward(model, ids[:, :T], cache, attention_mask=mask[:, :T])]
        for t in (T, T + 1):
            steps.append(spec.impl.forward(model, ids[:, t : t + 1], cache, attention_mask=mask[:, : t + 1]))
    except ImplementationError:
        failing = cache_wrong_without_padding()
        if failing:
            raise defer(failing) from None
        raise
    cached = torch.cat(steps, dim=1)
    if mismatch(real_parts(cached, PADS), real_parts(full, PADS), tol) is not None:
        failing = cache_wrong_without_padding()
        if failing:
            raise defer(failing)
    prefill_right = torch.allclose(real_parts(cached[:, :T], PADS), real_parts(full[:, :T], PADS), atol=1e-6)
    hint = None
    if prefill_right:
        hint = (
            "likely cause (weak evidence): the padded prefill is right and the tokens fed after it through the cache "
            "are not: a "
            "cached forward drops the mask for the cached keys, or counts its positions from the cache length "
            "(padding included). Fix: mask the cached padding keys as given by the whole mask, and continue each "
            "row's positions from its real-token count"
        )
    spec.close(
        real_parts(cached, PADS),
        real_parts(full, PADS),
        kind="model",
        axes="t v",
        hint=hint,
        hint_code="~knob:cache_contents",
        structural=False,
        variants=cached_step_variants(spec, config, sd, ids, mask),
        behaviour=behaviour,
    )


def cached_step_variants(spec, config, sd, ids, mask) -> list[Variant]:
    """The reference's prefill and two cached steps with one thing of the steps changed: their positions read from
    the mask's first columns (a slice of cumsum(mask) - 1 from the front, not its last T), counted from the cache
    length (padding included), or the cached padding keys left unmasked."""
    ref = reference_subject(spec.impl.rope_style)
    whole = padded_positions(mask)

    @functools.cache
    def reference_model():  # built once, when a variant is first tried (a passing test builds none)
        return models.build(ref, config, sd)

    def steps(positions_of, masked=True):
        def compute():
            model = reference_model()
            cache = ref.new_cache(model, ids.shape[0])
            out = [ref.forward(model, ids[:, :T], cache, attention_mask=mask[:, :T])]
            for t in (T, T + 1):
                given = {"attention_mask": mask[:, : t + 1]} if masked else {}
                out.append(ref.forward(model, ids[:, t : t + 1], cache, positions=positions_of(t), **given))
            return real_parts(torch.cat(out, dim=1), PADS)

        return compute

    fix = "a cached step's positions are the last T of cumsum(mask) - 1 over cached and new tokens, its keys masked by "
    fix += "the whole mask"
    hf = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # Hugging Face's position ids: padding at 1
    front = "a cached step's positions are read from the mask's first columns (cumsum(mask) - 1 sliced from the front, "
    front += "not its last T)"
    return [
        *(
            Variant("knob:position_offset", front, fix, steps(lambda t, p=p: p[:, :1]))
            for p in (whole, hf)  # padding at 0 or at 1: the first column of a padded row is padding
        ),
        Variant(
            "knob:position_offset",
            "a cached step's positions continue from the cache length (padding included), not from each row's real "
            "tokens",
            fix,
            steps(lambda t: torch.full((ids.shape[0], 1), t, device=ids.device)),
        ),
        Variant(
            "mask",
            "the cached steps drop the mask: a new token attends the cached padding keys",
            fix,
            steps(lambda t: whole[:, t : t + 1], masked=False),
        ),
    ]


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("padding")
@pytest.mark.parametrize("dtype", ["bool", "int32"])
def test_attention_mask_of_any_integer_or_bool_dtype(spec, config, dtype):
    """A mask of 0/1 in any integer or bool dtype means the same: bool and int32 masks give the logits of the int64
    mask (protocol: amendment 23)."""
    spec.impl.require_capability("attention_mask")
    sd = models.random_state_dict(config, seed=257, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids, mask = left_padded(spec, config, PADS, seed=258)
    want = real_parts(spec.impl.forward(model, ids, attention_mask=mask.long()), PADS)
    spec.close(
        real_parts(spec.impl.forward(model, ids, attention_mask=mask.to(getattr(torch, dtype))), PADS),
        want,
        kind="model",
        axes="t v",
        structural=False,
        behaviour=f"forward with a {dtype} attention_mask equals forward with the same mask in int64",
    )


@judges("forward", uses=("build_model",))
@pytest.mark.bug_class("padding")
def test_padding_token_ids_do_not_matter(spec, config):
    """What fills the padding changes nothing at the real tokens: padding ids 0, V - 1 and random give the same logits
    (protocol: amendment 23)."""
    spec.impl.require_capability("attention_mask")
    sd = models.random_state_dict(config, seed=255, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ids, mask = left_padded(spec, config, PADS, seed=256)
    want = real_parts(spec.impl.forward(model, ids, attention_mask=mask), PADS)
    for fill in (0, config["vocab_size"] - 1):
        other, _ = left_padded(spec, config, PADS, seed=256, fill=fill)
        spec.close(
            real_parts(spec.impl.forward(model, other, attention_mask=mask), PADS),
            want,
            kind="model",
            axes="t v",
            hint="likely cause (weak evidence): the padding tokens reach the real ones (most often padding keys not "
            "masked, or the mask read from a pad token id instead of attention_mask; or another row's mask used: "
            "test_padded_forward_rows_equal_each_row_alone tells these apart). Fix: mask every key whose "
            "attention_mask is 0 in its own row",
            hint_code="~mask",
            structural=False,
            behaviour=f"real-token logits with the padding filled by id {fill} equal those with random padding ids",
        )


def generation_causes(out, alone, pads) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A cause when the evidence pins it: only padded rows wrong (the unpadded row is right)."""
    wrong = [b for b, a in enumerate(alone) if not torch.equal(out[b, pads[b] :].cpu(), a.cpu())]
    if wrong and all(pads[b] > 0 for b in wrong) and any(p == 0 for p in pads):
        return (
            f"likely cause (weak evidence): only the padded rows ({wrong}) differ from their generation alone, the "
            "unpadded row is "
            "right: padding changes what a row sees, through positions counted from the padded start or padding "
            "keys left unmasked (test_padded_forward_rows_equal_each_row_alone tells which), in the prefill or in "
            "the cached steps. Fix: positions = cumsum(mask) - 1, mask padding keys, and extend the mask by a 1 "
            "per new token",
        ), ("~knob:position_offset",)
    return (), ()


def cached_generation(spec, behaviour, model, prompt, **kw):
    """``generate(model, prompt, NEW, temperature=0, **kw)`` (the cache by default), a crash through a failing cache
    left to it (``test_generation.greedy_tokens``)."""
    return greedy_tokens(spec, behaviour, model, prompt, NEW, **kw)


def own_padded_greedy(spec, model, prompt, mask, n=NEW, *, use_cache=False):
    """The tokens a correct greedy generate(attention_mask) picks with the implementation's own forward: uncached
    (the mask grown by a 1 per new token), or through its own cache (a prefill, then one token at a time with the
    whole mask)."""
    ids, cache = prompt, spec.impl.new_cache(model, prompt.shape[0]) if use_cache else None
    logits = spec.impl.forward(model, ids, cache, attention_mask=mask) if use_cache else None
    for _ in range(n):
        if not use_cache:
            logits = spec.impl.forward(model, ids, attention_mask=mask)
        nxt = logits[:, -1].argmax(-1, keepdim=True).to(ids.dtype)
        ids, mask = torch.cat([ids, nxt], dim=1), torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if use_cache and ids.shape[1] < prompt.shape[1] + n:
            logits = spec.impl.forward(model, nxt, cache, attention_mask=mask)
    return ids


def own_tokens(spec, model, prompt, mask, *, cached=True):
    """``check_rows``' ``own``: greedy decoding with the implementation's own uncached forward, and, for a generation
    through the cache, with its own cached forward."""
    pairs = [(("forward",), lambda: own_padded_greedy(spec, model, prompt, mask))]
    if cached:
        pairs.append((("forward", "new_cache"), lambda: own_padded_greedy(spec, model, prompt, mask, use_cache=True)))
    return pairs


def check_rows(spec, out, prompt, alone, pads, *, behaviour, causes=(), codes=(), own=()):
    """Each row of ``out`` is ``prompt`` then the row's generation alone. ``own``: ``(names, tokens)`` pairs,
    ``tokens()`` the tokens a correct generate picks with the implementation's own ``names``; where some of them fail
    their own tests and those tokens are ``out``, a difference is theirs."""
    spec.require(
        tuple(out.shape) == (prompt.shape[0], prompt.shape[1] + NEW),
        behaviour=behaviour,
        found=f"shape {tuple(out.shape)}, expected {(prompt.shape[0], prompt.shape[1] + NEW)}",
    )
    spec.require(
        torch.equal(out[:, : prompt.shape[1]].cpu(), prompt.cpu()),
        behaviour="generate(attention_mask) returns the prompt as given, padding kept, then the new tokens",
        found="the returned ids do not start with the padded prompt",
    )
    wrong = any(not torch.equal(out[b, pads[b] :].cpu(), a.cpu()) for b, a in enumerate(alone))
    for names, tokens in own or ():
        failing = spec.failing(names) if wrong else []
        if failing and torch.equal(out.cpu(), tokens().cpu()):
            raise spec.defer(
                failing,
                behaviour,
                f"consequence of failing {', '.join(failing)}: the rows differ from their generation alone, and they "
                f"are the tokens a correct generate picks with your own {' and '.join(names)}. Fix "
                f"{', '.join(failing)} first.",
            )
    for b, a in enumerate(alone):
        got = out[b, pads[b] :].cpu()
        diff = torch.nonzero(got != a.cpu())
        if len(diff):
            t = int(diff[0])
            spec.require(
                False,
                behaviour=behaviour,
                causes=causes,
                codes=codes,
                found=f"row {b} (padding {pads[b]}): first difference at new token {t - (got.shape[0] - NEW)}: "
                f"expected {int(a[t])} (the row generated alone), got {int(got[t])}",
            )


@st.composite
def paddings(draw):
    """``(T, pads)``: left paddings of 1 to 3 rows padded to T tokens, real lengths 1..6, at least one row padded."""
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    total = max(lengths) + draw(st.integers(0 if len(set(lengths)) > 1 else 1, 2))
    return total, tuple(total - n for n in lengths)


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("padding")
@given(padding=paddings(), seed=st.integers(0, 2**16))
def test_padded_greedy_generation_equals_each_row_alone(spec, config, padding, seed):
    """Greedy generate(attention_mask) of a left-padded batch returns the prompt as given, then for every row the
    tokens that row gets generated alone, for any padding (protocol: amendment 23; generate)."""
    spec.impl.require_capability("attention_mask")
    t, pads = padding
    sd = models.random_state_dict(config, seed=257, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt, mask = left_padded(spec, config, pads, t, seed=seed)
    behaviour = f"greedy generate(attention_mask) with left padding {pads}: each row equals its generation alone"
    out = cached_generation(spec, behaviour, model, prompt, attention_mask=mask)
    alone = [spec.impl.generate(model, prompt[b : b + 1, p:], NEW, temperature=0.0)[0] for b, p in enumerate(pads)]
    causes, codes = generation_causes(out, alone, pads)
    check_rows(
        spec,
        out,
        prompt,
        alone,
        pads,
        behaviour=behaviour,
        causes=causes,
        codes=codes,
        own=own_tokens(spec, model, prompt, mask),
    )


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("padding")
def test_padded_cached_generation_equals_uncached(spec, config):
    """With left padding, greedy generation through the cache equals generation without it, and each row equals its
    generation alone: the mask (grown by a 1 per new token) and the per-row positions hold in the cached steps too
    (protocol: amendment 23; generate)."""
    spec.impl.require_capability("attention_mask")
    sd = models.random_state_dict(config, seed=258, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt, mask = left_padded(spec, config, PADS, seed=259)
    behaviour = f"greedy generate(attention_mask, use_cache=True) with left padding {PADS}: each row equals its "
    cached = cached_generation(spec, behaviour + "generation alone", model, prompt, attention_mask=mask, use_cache=True)
    uncached = spec.impl.generate(model, prompt, NEW, temperature=0.0, attention_mask=mask, use_cache=False)
    alone = [spec.impl.generate(model, prompt[b : b + 1, p:], NEW, temperature=0.0)[0] for b, p in enumerate(PADS)]
    uncached_right = all(torch.equal(uncached[b, p:].cpu(), a.cpu()) for b, (p, a) in enumerate(zip(PADS, alone)))
    causes, codes = (), ()
    if uncached_right and not torch.equal(cached.cpu(), uncached.cpu()):
        causes = (
            "likely cause (weak evidence): without the cache every row equals its generation alone, through the cache "
            "the padded "
            "rows do not: the cached steps drop the mask (the new token attends the cached padding keys) or count "
            "positions from the cache length. Fix: pass the whole mask (cached + new, grown by a 1 per step) to "
            "every cached forward, and continue each row's positions from its real-token count",
        )
        codes = ("~knob:cache_contents",)  # two mechanisms fit (the mask dropped, positions from the cache length)
    check_rows(
        spec,
        cached,
        prompt,
        alone,
        PADS,
        behaviour=behaviour + "generation alone (and generation without the cache)",
        causes=causes,
        codes=codes,
        own=own_tokens(spec, model, prompt, mask),
    )
    check_rows(
        spec,
        uncached,
        prompt,
        alone,
        PADS,
        behaviour=f"greedy generate(attention_mask, use_cache=False) with left padding {PADS}: each row equals its "
        "generation alone",
        own=own_tokens(spec, model, prompt, mask, cached=False),
    )


@judges("forward", "generate", uses=("build_model",))
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize(
    "kind,row,value",
    [("right_padding", [1, 1, 1, 1, 0, 0], "0"), ("hole", [0, 1, 1, 0, 1, 1], "0"), ("all_zero", [0] * 6, "row")],
)
def test_attention_mask_rejects_what_is_not_left_padding(spec, family, kind, row, value):
    """A row with a 0 after a 1 (right padding, a hole) or with no real token, and a mask of the wrong shape, raise
    ValueError in forward and generate (protocol: amendment 23)."""
    spec.impl.require_capability("attention_mask")
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=260, device=spec.device))
    ids = spec.inputs.token_ids(2, 6, vocab=config["vocab_size"], seed=261)
    bad = torch.tensor([[1] * 6, row], device=spec.device)
    for name, call in (
        ("forward", lambda mask: spec.impl.forward(model, ids, attention_mask=mask)),
        ("generate", lambda mask: spec.impl.generate(model, ids, 2, temperature=0.0, attention_mask=mask)),
    ):
        spec.raises(
            ValueError,
            lambda call=call: call(bad),
            subject=name,
            behaviour=f"{name}(attention_mask) with a {kind.replace('_', ' ')} row {row} raises ValueError",
            mention=(value,),
        )
        spec.raises(
            ValueError,
            lambda call=call: call(bad[:, 1:]),
            subject=name,
            behaviour=f"{name}(attention_mask) of shape [2, 5] for ids [2, 6] raises ValueError",
            mention=("5",),
        )
