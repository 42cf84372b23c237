"""Generation: greedy decoding follows the model's own forward pass token for token (with and without
the cache), long prompts are cropped and generation slides past the context, dropout never applies
and the mode is restored, and the tokens are drawn from the filtered distribution.

Generation is judged against the implementation's own forward pass (``oracles.greedy_teacher``),
which ``test_model.py`` compares with the reference: a wrong model costs in the model only.
"""

import functools

import pytest
import torch

from . import draws, filters, models, observed, oracles
from .harness.judging.compare import mismatch
from .harness.judging.tolerances import tolerance
from .harness.plugin.markers import judges
from .harness.subject.subject import ImplementationError
from .test_kv_cache import carried_over

pytestmark = pytest.mark.component("generation")

PROMPT_T = 6
CROP_SEEDS = (47, 48)  # (weights, prompt); tests/test_suite_inputs.py checks they expose a missing crop
SLIDE_SEEDS = (49, 50)  # likewise for a missing slide


def slide_steps(cfg) -> int:
    """New tokens that take a PROMPT_T-token prompt 8 tokens past the context."""
    return cfg["context_length"] + 8 - PROMPT_T


@pytest.fixture
def config(impl, family):
    """The richest config of each family the implementation supports: the generation loop does not
    depend on the attention's head layout (the model and cache tests vary that)."""
    return models.family_config(impl, family)


def prompt_for(spec, cfg, t=PROMPT_T, seed=41, b=2):
    return spec.inputs.token_ids(b, t, vocab=cfg["vocab_size"], seed=seed)


def check_tokens(spec, actual, expected, *, behaviour: str, causes=(), codes=(), rebase=None) -> None:
    """``actual`` tokens equal ``expected``. ``rebase = (names, own)``: where they differ while some of the
    model-bound ``names`` fail their own tests, ``own()`` gives the tokens a correct generate picks with the
    implementation's own (failing) upstream; the same tokens make the difference a consequence of those names."""
    spec.require(
        tuple(actual.shape) == tuple(expected.shape),
        behaviour=behaviour,
        found=f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}",
    )
    diff = torch.nonzero(actual.cpu() != expected.cpu())
    if len(diff) and rebase is not None:
        failing = spec.failing(rebase[0])
        if failing and torch.equal(actual.cpu(), rebase[1]().cpu()):
            names = ", ".join(failing)
            raise spec.defer(
                failing,
                behaviour,
                f"consequence of failing {names}: {len(diff)} tokens differ, and they are the tokens a correct "
                f"generate picks with your own {names}. Fix {names} first.",
            )
    if len(diff):
        b, t = diff[0].tolist()
        stop = stop_token(actual.cpu(), expected.cpu())
        spec.require(
            False,
            behaviour=behaviour,
            causes=causes or stop[:1],
            codes=codes or stop[1:],
            found=f"first difference at sequence {b}, position {t}: expected token {int(expected[b, t])}, "
            f"got {int(actual[b, t])} ({len(diff)} tokens differ)",
        )


def stop_token(actual: torch.Tensor, expected: torch.Tensor) -> tuple[str, ...]:
    """``(cause, code)`` where every row that differs does so only by repeating, from its first difference to its
    end, the token it generated (right) just before: generation stopped at that token and padded the row with it (an
    end-of-sequence rule the protocol does not have); ``()`` otherwise."""
    rows = sorted({int(b) for b in torch.nonzero(actual != expected)[:, 0]})
    stops = set()
    for b in rows:
        t = int(torch.nonzero(actual[b] != expected[b])[0])
        if t == 0 or actual.shape[-1] - t < 2 or not bool((actual[b, t - 1 :] == actual[b, t - 1]).all()):
            return ()  # a stop shows as a run: the right token, then at least two copies of it where others belong
        stops.add(int(actual[b, t - 1]))
    if not rows or len(stops) != 1:
        return ()
    (token,) = stops
    return (
        f"likely cause: each row that differs repeats token {token} from the point it generated it (as the model's "
        f"logits give it) to the end: generation stops at token {token} and pads with it (an end-of-sequence rule, "
        f"eos_token_id = {token}, on by default). The protocol generates max_new_tokens tokens from the model's "
        "logits, with no stop token. Fix: no stopping (or only when asked for, off by default)",
        "knob:step_count",
    )


def greedy_tokens(spec, behaviour, model, prompt, n, *, teacher=None, **kw):
    """``generate(model, prompt, n, temperature=0, **kw)`` (the cache by default); where it raises through the cache,
    runs without it, and new_cache fails its own tests, the crash is new_cache's consequence. ``teacher()``: a
    correct greedy generate with the implementation's own cached forward; where given, the crash is the cache's only
    if that raises the same crash at the same place (a generate that raises on its own with the cache stays
    charged)."""
    try:
        return spec.impl.generate(model, prompt, n, temperature=0.0, **kw)
    except ImplementationError as exc:
        failing = spec.failing(("new_cache",)) if kw.get("use_cache", True) else []
        if not failing:
            raise
        try:
            spec.impl.generate(model, prompt, n, temperature=0.0, **{**kw, "use_cache": False})
        except ImplementationError:
            raise  # it raises without the cache as well: generate's own
        if teacher is not None and not _raises_alike(teacher, exc):
            raise  # a correct generate through the same cache does not raise this: the crash is generate's own
        raise spec.defer(
            failing,
            behaviour,
            f"consequence of failing {', '.join(failing)}: generation through your cache raises, and without it "
            "runs. Fix the cache first.",
        ) from None


def _raises_alike(compute, exc: ImplementationError) -> bool:
    """Whether ``compute()`` raises ``exc``'s crash: its type and message at the same place in the code."""
    from .harness.judging.rootcause import crash_signature

    try:
        compute()
    except ImplementationError as again:
        return crash_signature(again) is not None and crash_signature(again) == crash_signature(exc)
    return False


def greedy_case(
    spec, config, seeds, t, n, *, use_cache, behaviour, causes=(), codes=(), within=None, prompt_causes=False, b=2
):
    """Greedy generation of ``n`` tokens from a ``t``-token prompt against the model's own greedy teacher.

    ``within``: where ``causes`` name a mistake past the context (cropping, sliding), ``(t, n)`` of a case that
    stays within it on the same weights. The causes are confident only when that case is right: otherwise the
    generation is wrong whatever the length, and they are shown as weak evidence. ``prompt_causes``: the causes are
    about what the prompt conditions (its cropping), which the first new token already shows: where it is right in
    every row, they are replaced by what differs. ``b``: the prompt's rows."""
    sd = models.random_state_dict(config, seed=seeds[0], device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt = prompt_for(spec, config, t=t, seed=seeds[1], b=b)
    ctx = config["context_length"]
    teacher = lambda: oracles.greedy_teacher(spec.impl, model, prompt, n, ctx, use_cache=True)
    out = greedy_tokens(spec, behaviour, model, prompt, n, use_cache=use_cache, teacher=teacher)
    check_tokens(spec, out[:, :t], prompt, behaviour="generate returns the whole prompt, then the new tokens")
    want = oracles.greedy_teacher(spec.impl, model, prompt, n, ctx, use_cache=use_cache)
    if not torch.equal(out.cpu(), want.cpu()):
        own_sampler_consequence(spec, model, prompt, n, ctx, out, use_cache=use_cache, behaviour=behaviour)
    if use_cache and not torch.equal(out.cpu(), want.cpu()):
        causes, codes = cache_consistent(spec, model, prompt, n, config, want, out, behaviour, causes, codes, sd=sd)
    right_within = True  # generation within the context is right: what differs past it is the window's
    if within is not None and causes and not torch.equal(out.cpu(), want.cpu()):
        short = prompt_for(spec, config, t=within[0], seed=seeds[1])
        right = torch.equal(
            spec.impl.generate(model, short, within[1], temperature=0.0, use_cache=use_cache).cpu(),
            oracles.greedy_teacher(
                spec.impl, model, short, within[1], config["context_length"], use_cache=use_cache
            ).cpu(),
        )
        right_within = right
        if not right:  # wrong within the context too: the long case shows nothing of its own
            causes = tuple(c.replace("likely cause:", "likely cause (weak evidence):", 1) for c in causes)
            causes += (f"note: generation within the context ({within[0]}-token prompt, {within[1]} new tokens) "
                       "is wrong as well: test_greedy_generation_follows_the_model comes first",)  # fmt: skip
            codes = tuple(c if c.startswith("~") else "~" + c for c in codes)
    wrong = not torch.equal(out.cpu(), want.cpu())
    reads = wrong and within is not None and right_within
    right_uncached = reads and use_cache and uncached_right(spec, model, prompt, n, ctx)
    window = rolled_cache_reading(spec, config, sd, prompt, n, out) if right_uncached else None
    if window is None:
        window = window_reading(spec, model, prompt, n, ctx, out) if reads else None
        if window is not None and right_uncached:
            window = cached_window(window)
    if window is not None:
        causes, codes = window
    elif reads:  # wrong past the context only, and no other window fits: the cropping is wrong somehow, which the
        # causes name as one guess among several
        causes = tuple(c.replace("likely cause:", "likely cause (weak evidence):", 1) for c in causes)
        codes = tuple(c if c.startswith("~") else "~" + c for c in codes)
    first_right = out.shape == want.shape and torch.equal(out[:, t].cpu(), want[:, t].cpu())
    if wrong and within is None and first_right and not causes:
        causes, codes = newest_token_reading(spec, model, config, sd, prompt, n, out) or (causes, codes)
    if wrong and out.shape == want.shape and not first_right and not causes and t <= ctx:
        causes, codes = (
            prefixed_reading(spec, model, prompt, n, ctx, out, use_cache)
            or first_token_rows_reading(spec, model, config, t, seeds[1], use_cache)
            or first_token_position_reading(spec, model, prompt, out)
            or (
                (  # generate's first pick from the whole prompt, which forward takes as it is
                    "likely cause: generate's first new token is not the argmax of your own forward(model, prompt)'s "
                    "last logits (the prompt fits the context, so nothing is cropped): generate computes its logits "
                    "another way than forward (a mask, positions or a model path of its own) or does not pick the "
                    "argmax at temperature 0. Fix: the first token is argmax(forward(model, prompt)[:, -1])",
                ),
                ("knob:generate_path",),
            )
        )
    if prompt_causes and wrong and window is None and first_right:
        causes = (
            "note: the first new token is right in every row, so the prompt was cropped; a later token differs, once "
            "the sequence has passed context_length (how generation slides: test_generation_slides_past_the_context)",
        )
        codes = ()
    check_tokens(spec, out, want, behaviour=behaviour, causes=causes, codes=codes)


def prefixed_reading(spec, model, prompt, n: int, ctx: int, out, use_cache: bool):
    """``(causes, codes)`` where every new token of ``out`` is the model's own greedy continuation of the prompt with
    a token 0 put in front of it (a start token: Trax's ``start_id``, a ``decoder_start_token_id``), the prompt
    returned without it. None where that does not give every new token, or where the prompt starts with 0."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    t = prompt.shape[1]
    if bool((prompt[:, 0] == 0).any()) or t + 1 > ctx:
        return None
    started = torch.cat((torch.zeros_like(prompt[:, :1]), prompt), dim=1)
    try:
        want = oracles.greedy_teacher(raw, model, started, n, ctx, use_cache=use_cache)
    except Exception:  # noqa: BLE001 - a side reading; the test's own calls report crashes
        return None
    if not torch.equal(want[:, t + 1 :].cpu(), out[:, t:].to(want.device).cpu()):
        return None
    return (
        (
            "likely cause: generate puts a token 0 in front of the prompt (a start token, as Trax's start_id or a "
            "decoder_start_token_id does) and decodes from that sequence: every new token, in every row, is your "
            "model's greedy continuation of [0] + prompt. Fix: decode from the prompt as given; a decoder-only "
            "model's prompt is its own start",
        ),
        ("knob:generate_path",),
    )


def first_token_position_reading(spec, model, prompt, out):
    """``(causes, codes)`` where every row's first new token is the argmax of the implementation's own logits at one
    other position of the prompt than its last, the same position in every row (its first: the sequences' starts
    gathered where their ends belong). None where no position, or more than one, gives them all, or with one row."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    b, t = prompt.shape
    if b < 2 or t < 2 or out.shape[0] != b or out.shape[1] <= t:
        return None
    try:
        picks = raw.forward(model, prompt).argmax(dim=-1).cpu()  # [B, T]
    except Exception:  # noqa: BLE001 - a side reading; the test's own calls report crashes
        return None
    first = out[:, t].cpu()
    fits = [p for p in range(t) if torch.equal(picks[:, p], first)]
    if len(fits) != 1 or fits[0] == t - 1:
        return None
    where = "its first position (0)" if fits[0] == 0 else f"position {fits[0]}"
    return (
        f"likely cause: every row's first new token is the argmax of your own logits at {where} of the "
        f"{t}-token prompt, not at its last: the next-token logits are gathered at the wrong index (each "
        "sequence's start, cu_seqlens[:-1], where its end, cu_seqlens[1:] - 1, belongs; or logits[:, 0] for "
        "logits[:, -1]). Fix: pick from forward(model, prompt)[:, -1]",
    ), ("knob:generate_path",)


def first_token_rows_reading(spec, model, config, t: int, seed: int, use_cache: bool):
    """``(causes, codes)`` where each row's first new token is the argmax of another row's last logits: a three-row
    prompt whose rows' own argmaxes differ, one token generated. Every row taking row 0's pick is an index into the
    batch (or the flattened tokens) not advanced per sequence; any other one-to-one map says which row took which.
    None where a row's token is no row's argmax, or the rows are right."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    ctx = config["context_length"]
    for attempt in range(4):  # prompts until the rows' own picks differ, so each pick names one row
        prompt = prompt_for(spec, config, t=t, seed=seed + 1000 + attempt, b=3)
        try:
            own = oracles.greedy_teacher(raw, model, prompt, 1, ctx, use_cache=use_cache)[:, t].cpu().tolist()
            got = raw.generate(model, prompt, 1, temperature=0.0, use_cache=use_cache)[:, t].cpu().tolist()
        except Exception:  # noqa: BLE001 - a side reading; the test's own calls report crashes
            return None
        if len(set(own)) == 3:
            break
    else:
        return None
    if got == own or any(g not in own for g in got):
        return None
    taken = [own.index(g) for g in got]
    if taken == [0, 0, 0]:
        how = "every row's first new token is row 0's (the argmax of row 0's last logits), not its own"
        why = "the index of each sequence's last token in the batch (or the flattened tokens) is not advanced per row"
    else:
        how = ", ".join(f"row {b} takes row {r}'s" for b, r in enumerate(taken) if b != r) + " first new token"
        why = "each row's next-token logits are read from another row's position in the batch"
    return (
        f"likely cause: on a three-row prompt, {how}: {why}. Fix: row b's first new token is the argmax of "
        "forward(model, prompt)[b, -1]",
    ), ("knob:generate_path",)


def uncached_right(spec, model, prompt, n: int, ctx: int) -> bool:
    """Whether generate without the cache gives the model's own greedy tokens on ``prompt`` (a side reading)."""
    raw = getattr(spec.impl, "_subject", spec.impl)
    try:
        got = raw.generate(model, prompt, n, temperature=0.0, use_cache=False)
        return torch.equal(got.cpu(), oracles.greedy_teacher(raw, model, prompt, n, ctx, use_cache=False).cpu())
    except Exception:  # noqa: BLE001 - a side reading; the tests without the cache report its crashes
        return False


def cached_window(window):
    """A window reading of a cached generate that is right without the cache, made weak: a cache that, once full,
    drops its oldest entries and keeps the others (computed at their old positions) gives tokens like a shorter
    window's, so the window's size is one explanation among two."""
    causes, codes = window
    causes = tuple(
        c.replace("likely cause:", "likely cause (weak evidence):", 1).replace(
            "where it crops or re-encodes the window:",
            "where its cached path crops or re-encodes the window (without the cache it is right), or, once the "
            "window is full, the cache drops its oldest entries and keeps the others, computed at their old "
            "positions, instead of starting afresh:",
            1,
        )
        for c in causes
    )
    return causes, tuple(c if c.startswith("~") else "~" + c for c in codes)


@torch.no_grad()
def rolled_cache_reading(spec, config, sd, prompt, n: int, out) -> tuple[tuple[str, ...], tuple[str]] | None:
    """``(causes, codes)`` where ``out`` is, token for token, the greedy continuation of a cache that, once it holds
    context_length positions, drops one entry in every layer (its oldest, rolled; or its newest, cropped to its first
    context_length - 1 as Hugging Face's DynamicCache.crop does) and keeps the others as they were computed (at their
    old positions, over their old windows) instead of re-encoding the window, the new token placed at the cache's
    length (context_length - 1). Decoded by the reference on the same weights, its cache cut through its own
    ``update``. None where neither gives every token of every row."""
    ref = getattr(spec.expectations, "reference", None)
    b, t = prompt.shape
    ctx = config["context_length"]
    if ref is None or out.shape != (b, t + n):
        return None
    twin = models.build(ref, config, sd).eval()
    for keep in ("newest", "oldest"):
        ids = prompt[:, -ctx:]
        cache = ref.new_cache(twin, b)
        logits = ref.forward(twin, ids, cache)
        for _ in range(n):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            ids = torch.cat((ids, token), dim=1)
            if cache.length == ctx:
                cache = _cut(ref, twin, cache, keep)
            logits = ref.forward(twin, token, cache)  # at the cache's length
        if torch.equal(ids[:, -n:].cpu(), out[:, t:].cpu()):
            break
    else:
        return None
    how = (
        "drops its oldest entry and keeps the others"
        if keep == "newest"
        else "is cropped to its first context_length - 1 entries (the newest dropped: DynamicCache.crop keeps the "
        "oldest), the others kept"
    )
    return (
        (
            f"likely cause: once the window is full, generate's cache {how} as they were computed (at their old "
            f"positions, over their old windows) instead of re-encoding the last {ctx} tokens, each new token placed "
            "at the cache's length (context_length - 1). Fix: when the sequence passes context_length, start a fresh "
            f"cache and feed it the last context_length tokens: every position shifts (evidence: a cache cut that way "
            f"gives every one of your {n} new tokens in every row, and without the cache generate is right)",
        ),
        ("knob:window",),
    )


def _cut(ref, twin, cache, keep: str):
    """A reference cache holding ``cache``'s keys and values without one position in every layer: ``keep`` "newest"
    drops the oldest, "oldest" the newest."""
    cut = ref.new_cache(twin, cache.batch_size)
    for layer in range(len(cache.lengths)):
        k, v = ref.cache_kv(cache, layer)
        kept = slice(1, None) if keep == "newest" else slice(None, -1)
        cut.update(layer, k[..., kept, :], v[..., kept, :])
    return cut


def window_reading(spec, model, prompt, n: int, ctx: int, out) -> tuple[tuple[str, ...], tuple[str]] | None:
    """``(causes, codes)`` where every token of ``out`` that is not the argmax of the implementation's own logits
    over the last ``ctx`` tokens before it (teacher-forced on ``out`` itself) is the argmax over another window: one
    or two tokens fewer, one more, or every token so far (never cropped; a forward that takes more than ``ctx``). One
    window must explain every such token, in every row; a cache that re-encodes the window only now and then gives
    that window at those steps alone. None where none, or more than one, does."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    t = prompt.shape[1]
    if out.shape != (prompt.shape[0], t + n):
        return None
    out = out.to(prompt.device)

    def picks(prefix, w):  # the greedy token over the last w tokens of prefix, per row
        return raw.forward(model, prefix if w is None else prefix[:, -w:])[:, -1].argmax(dim=-1)

    candidates = [ctx - 1, ctx - 2, ctx + 1, None]
    fits, wrong = set(candidates), 0
    try:
        for step in range(n):
            prefix, token = out[:, : t + step], out[:, t + step]
            bad = picks(prefix, ctx) != token
            if not bool(bad.any()):
                continue
            wrong += 1
            for w in list(fits):
                try:
                    if not torch.equal(picks(prefix, w)[bad], token[bad]):
                        fits.discard(w)
                except Exception:  # noqa: BLE001 - a window the implementation's forward refuses explains nothing
                    fits.discard(w)
            if not fits:
                return None
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return None
    short = fits <= {ctx - 1, ctx - 2}  # one or two tokens short: the same mistake, its size not pinned
    if not wrong or not fits or (len(fits) != 1 and not short):
        return None
    steps = f"at the {wrong} step{'s' * (wrong > 1)} where your tokens differ, they are the argmax of your logits"
    if fits == {None}:
        cause = (
            f"likely cause: generate feeds the whole sequence, never cropped to its last {ctx} tokens "
            "(context_length), and your forward takes more than context_length tokens. Fix: ids[:, -context_length:] "
            f"at every step (evidence: {steps} over every token so far)"
        )
    else:
        last = " or ".join(str(w) for w in sorted(fits, reverse=True))
        w = max(fits)  # the one window, or the longer of two short ones
        size = f"{abs(ctx - w)} token{'s' * (abs(ctx - w) > 1)} " if len(fits) == 1 else ""
        off = f"{size}{'short' if w < ctx else 'too long'}"
        crop = "ids[:, -(context_length - 1):]" if w < ctx else "ids[:, -(context_length + 1):]"
        cause = (
            f"likely cause: generate conditions on the last {last} tokens, not the last {ctx} (context_length), where "
            f"it crops or re-encodes the window: the window is {off} (an off-by-one such as {crop}). Fix: "
            f"ids[:, -context_length:] (evidence: {steps} over the last {last} tokens)"
        )
    return (cause,), ("knob:window",)


def newest_token_reading(spec, model, config, sd, prompt, n: int, out) -> tuple[tuple[str, ...], tuple[str]] | None:
    """``(causes, codes)`` where every token of ``out`` after the first new one is the argmax of the logits of the
    token before it alone: at position 0 (the implementation's own forward on that one token) or, for gpt2's learned
    positions, at its own position (the reference's, on the same weights; with RoPE one token alone is the same at any
    position). Each step then fed only the newest token, with no cache holding the others. None where no rule
    explains every such token, or where one is right already."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    ref = getattr(spec.expectations, "reference", None)
    t, ctx = prompt.shape[1], config["context_length"]
    if out.shape != (prompt.shape[0], t + n) or n < 2:
        return None
    out = out.to(prompt.device)
    alone = "at position 0" if config["family"] == "gpt2" else "at any position: with RoPE one token alone is the same"
    rules = {alone: lambda prefix: raw.forward(model, prefix[:, -1:])[:, -1].argmax(dim=-1)}
    if ref is not None and config["family"] == "gpt2":
        twin = models.build(ref, config, sd)
        at = lambda prefix: torch.tensor([prefix.shape[1] - 1], device=prefix.device)
        rules["at its own position"] = lambda prefix: ref.forward(twin, prefix[:, -1:], positions=at(prefix))[
            :, -1
        ].argmax(dim=-1)
    fits, wrong = set(rules), 0
    try:
        for step in range(1, n):
            prefix, token = out[:, : t + step], out[:, t + step]
            wrong += int(bool((raw.forward(model, prefix[:, -ctx:])[:, -1].argmax(dim=-1) != token).any()))
            fits = {r for r in fits if torch.equal(rules[r](prefix), token)}
            if not fits:
                return None
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return None
    if not wrong:
        return None
    where = " or ".join(sorted(fits))
    return (
        (
            f"likely cause: after the first new token, each step feeds only the newest token ({where}), with no "
            "cache holding the tokens before it: every later token is the argmax of the logits of one token alone "
            "(an uncached path slicing ids[:, -1:] as the cached one does, or advancing a start position it never "
            "fills). Fix: without a cache, feed the sequence's last context_length tokens at every step (evidence: "
            f"each of the {n - 1} later tokens, in every row, is the argmax of your logits for the token before it "
            "alone)",
        ),
        ("knob:window",),
    )


def own_sampler_consequence(
    spec,
    model,
    prompt,
    n,
    ctx,
    out,
    *,
    use_cache,
    behaviour,
    pickers=None,
    call="temperature=0",
    kind="greedy generate",
):
    """Where greedy generation differs from the model's argmax: a consequence of the implementation's own failing
    sample (or sampling_probs) where its tokens are those of a correct greedy generate picking each token with that
    function (``oracles.greedy_pickers``; or ``pickers``, ``(name, pick)`` pairs, each called as ``call`` says)."""
    raw = getattr(spec.impl, "_subject", spec.impl)
    for name, pick in oracles.greedy_pickers(spec) if pickers is None else pickers:
        try:
            own = oracles.greedy_teacher(raw, model, prompt, n, ctx, use_cache=use_cache, pick=pick)
        except Exception:  # noqa: BLE001 - what does not run explains no tokens
            continue
        if own.shape == out.shape and torch.equal(own.cpu(), out.cpu()):
            raise spec.defer(
                [name],
                behaviour,
                f"consequence of failing {name}: your generate's tokens are those of a correct {kind} that picks each "
                f"token with your own {name}(logits [B, V], {call}). Fix {name} first.",
            )


def cache_consistent(spec, model, prompt, n, config, want, out, behaviour, causes, codes, *, sd=None):
    """Where cached generation differs from the model's own cached greedy teacher: a consequence of new_cache where
    generation without the cache is right and new_cache fails its own tests; else whether the model's cached
    forward picks the tokens its uncached forward picks on this very prompt. Where it does not, the tokens depend
    on how generate feeds the cache (every way is right for a consistent cache), so this check cannot judge
    generate: a consequence of new_cache or forward where they fail their own tests, else ``causes`` are weak.
    ``out``: generate's own cached greedy tokens, which differ from ``want``; ``sd``: the model's canonical weights,
    for the readings that decode them with the reference."""
    plain = oracles.greedy_teacher(spec.impl, model, prompt, n, config["context_length"], use_cache=False)
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    uncached = functools.cache(lambda: raw.generate(model, prompt, n, temperature=0.0, use_cache=False))
    failing = spec.failing(("new_cache",))
    if failing:  # generate right without the cache, and the cache wrong in its own tests: the cache explains it
        if torch.equal(uncached().cpu(), plain.cpu()):
            raise spec.defer(
                failing,
                behaviour,
                "consequence of failing new_cache: generate(use_cache=False) gives your model's own greedy tokens "
                "here, and your cache fails its own tests (test_kv_cache). Fix new_cache first.",
            )
    if torch.equal(plain.cpu(), want.cpu()):
        masked_mistake(spec, model, prompt, n, config, out, behaviour)
        try:
            right_without = torch.equal(uncached().cpu(), plain.cpu())
        except Exception:  # noqa: BLE001 - what does not run reads nothing
            return causes, codes
        if right_without:  # right without the cache, the cache right when fed as specified
            fed_twice = last_token_fed_twice(raw, model, prompt, n, config["context_length"], out)
            if fed_twice is not None:
                return fed_twice
            shifted = None if sd is None else decode_positions_reading(spec, config, sd, prompt, n, out)
            if shifted is not None:
                return shifted
            cut = prompt_cut_reading(raw, model, prompt, n, out)
            if cut is not None:
                return cut
            return (
                "likely cause: generate's own cached path feeds its cache otherwise than the protocol's loop: without "
                "the cache it picks your model's greedy tokens, and so does your forward through a new cache fed the "
                "prompt, then each new token. Look at what generate feeds through the cache (which tokens, at which "
                "positions, a slot not yet written, a cache not started afresh when the window slides). Fix: feed the "
                "prompt, then each new token",
            ), ("knob:cache_feeding",)
        return causes, codes
    failing = spec.failing(("new_cache", "forward"))
    if failing:
        names = ", ".join(failing)
        raise spec.defer(
            failing,
            behaviour,
            f"consequence of failing {names}: your model's cached forward picks other tokens than its uncached "
            f"forward on this prompt, so the tokens depend on how generate feeds the cache. Fix {names} first.",
        )
    causes = tuple(c.replace("likely cause:", "likely cause (weak evidence):", 1) for c in causes)
    codes = tuple(c if c.startswith("~") else "~" + c for c in codes)
    return causes + (
        "note: your model's cached forward picks other tokens than its uncached forward on this prompt "
        "(test_kv_cache judges the cache), so the tokens also depend on how generate feeds the cache",
    ), codes


@torch.no_grad()
def last_token_fed_twice(raw, model, prompt, n: int, ctx: int, out):
    """``(causes, codes)`` where ``out``'s new tokens are those of the implementation's own cached forward fed the
    prompt, then the prompt's last token again (a sampler that starts its loop from the last input token, as
    GluonNLP's does), then each new token; None where that does not give them all, or would pass the context."""
    t = prompt.shape[1]
    if t + n + 1 > ctx or not own_cached_picks(raw, model, [prompt, prompt[:, -1:]], n, out[:, t:]):
        return None
    return (
        "likely cause: generate's cached path feeds the prompt's last token again after the prompt (a decoding loop "
        "started from the last input token), so that token is cached twice and every later position is one further "
        "on: your model's forward through a cache fed the prompt, then its last token again, then each new token, "
        "gives every one of your new tokens. Fix: after the prompt, feed only each newly picked token",
    ), ("knob:cache_feeding",)


@torch.no_grad()
def own_cached_picks(raw, model, fed: list, n: int, new_tokens) -> bool:
    """Whether ``new_tokens`` ``[B, n]`` are the greedy picks of the implementation's own cached forward fed the chunks
    ``fed`` one after another into a fresh cache, then each picked token: generate's cached path replayed as a
    mistaken loop feeds it. False where a call raises (the test's own calls report crashes)."""
    try:
        cache = raw.new_cache(model, fed[0].shape[0])
        for chunk in fed[:-1]:
            raw.forward(model, chunk, cache)
        step, picked = fed[-1], []
        for _ in range(n):
            step = raw.forward(model, step, cache)[:, -1].argmax(dim=-1, keepdim=True).to(fed[-1].dtype)
            picked.append(step)
    except Exception:  # noqa: BLE001 - a side reading
        return False
    return torch.equal(torch.cat(picked, dim=1).cpu(), new_tokens.cpu())


@torch.no_grad()
def prompt_cut_reading(raw, model, prompt, n: int, out):
    """``(causes, codes)`` where ``out``'s new tokens are those of the implementation's own cached forward fed only
    the prompt's last token (or last two) into the fresh cache, then each new token: a cached path that slices
    ids[:, -1:] from the first step on, the prompt never encoded. None where that does not give them all."""
    t = prompt.shape[1]
    for kept in (1, 2):
        if kept >= t:
            return None
        if own_cached_picks(raw, model, [prompt[:, -kept:]], n, out[:, t:]):
            which = "last token" if kept == 1 else f"last {kept} tokens"
            return (
                f"likely cause: generate's cached path feeds only the prompt's {which} into the fresh cache (the "
                "decoding step's ids[:, -1:] taken from the first step on, while the cache is still empty), so the "
                f"rest of the prompt is never encoded: your model's forward through a new cache fed the {which}, "
                "then each new token, gives every one of your new tokens. Fix: feed the whole prompt first, then one "
                "token per step",
            ), ("knob:cache_feeding",)
    return None


@torch.no_grad()
def decode_positions_reading(spec, config, sd, prompt, n: int, out):
    """``(causes, codes)`` where ``out``'s new tokens are those of the reference on the same weights, the prompt cached
    at its positions 0..t-1 and the k-th token fed after it at another position than t + k: a step counter advanced
    by 1 (or not at all) after the prompt, started at 0, one off, or the front of the position ids at every step. One
    such rule must give every new token of every row; None where none does, or where the tokens would pass the
    context."""
    ref = getattr(spec.expectations, "reference", None)
    b, t = prompt.shape
    ctx = config["context_length"]
    if ref is None or out.shape != (b, t + n) or t + n > ctx:
        return None
    twin = models.build(ref, config, sd).eval()
    rules = (
        (lambda k: 1 + k, "1, 2, 3, ...: a step counter advanced by one after the prompt instead of by its length"),
        (lambda k: k, "0, 1, 2, ...: a step counter that starts at 0 after the prompt"),
        (lambda k: t - 1 + k, f"{t - 1}, {t}, ...: one position early (the prompt's last position reused)"),
        (lambda k: t + 1 + k, f"{t + 1}, {t + 2}, ...: one position late (a counter advanced twice)"),
        (lambda k: t, f"{t} at every step: a position that never advances after the prompt"),
        (
            lambda k: 0,
            "0 at every step: the new token's position taken from the front of the position ids "
            "(positions[:, :T_new] where positions[:, -T_new:] belongs)",
        ),
    )
    found = []
    for rule, said in rules:
        cache = ref.new_cache(twin, b)
        token, picked = ref.forward(twin, prompt, cache)[:, -1].argmax(dim=-1, keepdim=True), []
        for k in range(n):
            picked.append(token)
            if k < n - 1:
                at = torch.tensor([rule(k)], device=prompt.device)
                token = ref.forward(twin, token, cache, positions=at)[:, -1].argmax(dim=-1, keepdim=True)
        if torch.equal(torch.cat(picked, dim=1).cpu(), out[:, t:].cpu()):
            found.append(said)
    if len(found) != 1:
        return None
    return (
        "likely cause: generate's cached path gives the tokens it feeds after the prompt the wrong positions: "
        f"{found[0]}, where the k-th token after a {t}-token prompt is at position {t} + k (the reference on your "
        f"weights, the prompt cached at 0..{t - 1} and the new tokens fed at those positions, gives every one of "
        f"your {n} new tokens in every row; without the cache generate is right). Fix: advance the position by the "
        "number of tokens fed (the cache's length), the prompt's included",
    ), ("knob:cache_feeding",)


def masked_mistake(spec, model, prompt, n, config, out, behaviour) -> None:
    """Where forward fails its own tests and takes an ``attention_mask``: a consequence of forward when a correct
    generate that hands every cached call the whole mask (ones, the prompt unpadded) picks the tokens generate picked
    (``out``, its cached greedy tokens).
    Generate may always pass its mask; a forward whose masked cached path is wrong then makes it wrong (held out:
    positions counted from the new tokens' part of the mask)."""
    failing = spec.failing(("forward",))
    if not failing or "attention_mask" not in spec.impl.capabilities:
        return
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    try:
        own = oracles.greedy_teacher(raw, model, prompt, n, config["context_length"], use_cache=True, masked=True)
    except Exception:  # noqa: BLE001 - what does not run explains no tokens
        return
    if own.shape == out.shape and torch.equal(own.cpu(), out.cpu()):
        raise spec.defer(
            failing,
            behaviour,
            "consequence of failing forward: your generate's tokens are those of a correct greedy generate that hands "
            "your cached forward the whole attention_mask (ones) at every step; your forward with a mask and a cache "
            "fails its own tests (test_batched_generation). Fix forward first.",
        )


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("kv_cache", "sampling_order")
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_greedy_generation_follows_the_model(spec, config, use_cache):
    """Greedy generation (temperature 0) picks the argmax of the model's own next-token logits, token for token, with
    and without the cache (protocol: generate; course notes: generation)."""
    greedy_case(
        spec,
        config,
        (42, 41),
        PROMPT_T,
        12,
        use_cache=use_cache,
        behaviour=f"greedy generate(use_cache={use_cache}) of 12 tokens follows the model's own logits",
    )


@judges("generate", uses=("build_model", "forward", "new_cache"))
def test_generation_from_a_single_token(spec, config):
    """A prompt of one row and one token is extended like any other: a batch of one is a batch (protocol: generate,
    prompt [B, T])."""
    greedy_case(
        spec,
        config,
        (55, 56),
        1,
        6,
        use_cache=True,
        behaviour="greedy generation of 6 tokens from a [1, 1] prompt (one row, one token) follows the model",
        b=1,
    )


@judges("generate", uses=("build_model",))
def test_zero_new_tokens_return_the_prompt(spec, config):
    """generate(model, prompt, 0) returns the prompt unchanged, [B, T + 0] (protocol: generate)."""
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=43, device=spec.device))
    prompt = prompt_for(spec, config, seed=44)
    for kw in (dict(temperature=0.0), dict(generator=spec.inputs.generator(0))):
        check_tokens(
            spec,
            spec.impl.generate(model, prompt, 0, **kw),
            prompt,
            behaviour=f"generate(prompt [2, {PROMPT_T}], max_new_tokens=0, {kw}) is the prompt",
        )


@judges("generate", uses=("build_model",))
@pytest.mark.bug_class("validation")
def test_generate_rejects_an_empty_prompt(spec, family):
    """A prompt with no tokens raises ValueError: there is nothing to condition on (protocol: generate, amendment 9)."""
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=57, device=spec.device))
    empty = torch.zeros(2, 0, dtype=torch.long, device=spec.device)
    spec.raises(
        ValueError,
        lambda: spec.impl.generate(model, empty, 3, temperature=0.0),
        behaviour="generate from a [2, 0] prompt raises ValueError",
    )


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("prompt_cropping")
def test_long_prompt_is_cropped(spec, config):
    """A prompt longer than context_length conditions on its last context_length tokens (symptoms table: crop to the
    last context_length tokens)."""
    ctx = config["context_length"]
    greedy_case(
        spec,
        config,
        CROP_SEEDS,
        ctx + 7,
        5,
        use_cache=True,
        behaviour=f"a {ctx + 7}-token prompt, context {ctx}: each token follows the last {ctx} tokens",
        causes=(
            f"likely cause: the prompt is not cropped to its last {ctx} tokens before the forward pass "
            "(or the first ones are kept). Fix: ids[:, -context_length:]",
        ),
        codes=("knob:window",),
        within=(PROMPT_T, ctx - PROMPT_T),
        prompt_causes=True,
    )


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("prompt_cropping", "kv_cache")
def test_generation_slides_past_the_context(spec, config):
    """Generating beyond context_length keeps going on the last context_length tokens, with and without the
    cache (protocol: generate)."""
    n = slide_steps(config)
    for use_cache in (True, False):
        greedy_case(
            spec,
            config,
            SLIDE_SEEDS,
            PROMPT_T,
            n,
            use_cache=use_cache,
            behaviour=f"generating {n} tokens from {PROMPT_T} slides past context {config['context_length']} "
            f"(use_cache={use_cache})",
            causes=(
                "likely cause: once the sequence is longer than context_length, the window is not slid "
                "(or a full cache keeps growing). Fix: feed the last context_length tokens (and start a "
                "fresh cache, since every position shifts)",
            ),
            codes=("knob:window",),
            within=(PROMPT_T, config["context_length"] - PROMPT_T),
        )


@judges("generate", uses=("build_model",))
@pytest.mark.bug_class("mode_restore")
@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_generate_restores_the_mode(spec, family, mode):
    """generate leaves a model in the mode it found it in, every submodule included, and a model whose modules are in
    both modes with each module's own (protocol: generate)."""
    seen = mode != "mixed" and observed.observable(spec)  # the mode shows in outputs: judged from them, not only flags
    config = models.family_config(spec.impl, family, **({"dropout": observed.DROPOUT} if seen else {}))
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=45, device=spec.device))
    prompt = prompt_for(spec, config, seed=46)
    clean = observed.eval_output(spec, model, prompt) if seen else None
    given = observed.set_mode(spec, model, mode)
    spec.impl.generate(model, prompt, 4, temperature=0.0)
    causes = (
        "likely cause: generate calls model.eval() (or model.train()) without restoring the "
        "modes it found. Fix: remember each module's mode and put it back in a finally block",
    )
    if clean is not None:
        observed.require_mode(spec, model, prompt, clean, mode == "train", after="generate", causes=causes)
    observed.require_flags(
        spec,
        model,
        given,
        after="generate",
        again=lambda: spec.impl.generate(model, prompt, 4, temperature=0.0),
        causes=causes,
        codes=("knob:mode",),
    )


DROPOUT_BEHAVIOUR = "generation in training mode with dropout 0.5 equals eval-mode generation"


@judges("generate", uses=("build_model",))
@pytest.mark.bug_class("dropout_generation")
def test_generation_ignores_dropout(spec, family):
    """With dropout 0.5 and the model in training mode, generation equals generation in eval mode (course notes:
    dropout accidentally enabled during generation)."""
    config = models.family_config(spec.impl, family, dropout=0.5)
    sd = models.random_state_dict(config, seed=45, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt = prompt_for(spec, config, seed=46)
    want = spec.impl.generate(model, prompt, 10, temperature=0.0)
    spec.impl.set_training(model, True)
    spec.impl.manual_seed(spec.inputs.torch_seed(0))
    got = spec.impl.generate(model, prompt, 10, temperature=0.0)
    causes, codes = (
        (
            "likely cause: generate runs the model in training mode, so dropout is on. Fix: switch "
            "to eval mode (and restore the mode afterwards)",
        ),
        ("knob:mode",),
    )
    if not torch.equal(got.cpu(), want.cpu()):  # is greedy generation in eval mode itself repeatable?
        spec.impl.set_training(model, False)
        spec.impl.manual_seed(spec.inputs.torch_seed(1))
        again = spec.impl.generate(model, prompt, 10, temperature=0.0)
        observed.defer_dropout_in_eval_mode(spec, model, prompt, DROPOUT_BEHAVIOUR)
        spec.impl.set_training(model, True)
        if not torch.equal(again.cpu(), want.cpu()):
            causes = ("note: greedy generation in eval mode differs between two calls too: the difference is not "
                      "dropout's alone (test_generate_keeps_nothing_from_an_earlier_call tells more)",)  # fmt: skip
            codes = ()
    check_tokens(
        spec,
        got,
        want,
        behaviour=DROPOUT_BEHAVIOUR,
        causes=causes,
        codes=codes,
    )


@judges("generate", uses=("build_model",))
@pytest.mark.bug_class("sampling_order", "top_k")
def test_generate_applies_sampling_filters(spec, config):
    """generate samples from the filtered distribution: top_k=1, or a tiny top_p, is greedy whatever the temperature
    (course notes: sampling before the transforms)."""
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=51, device=spec.device))
    prompt = prompt_for(spec, config, seed=52)
    want = spec.impl.generate(model, prompt, 8, temperature=0.0)
    cases = [kw for kw in (dict(top_k=1), dict(top_p=1e-6)) if filters.provided(spec.impl, kw)]
    if not cases:
        spec.impl.require_capability(*filters.FILTERS)
    for kw in cases:
        gen = spec.inputs.generator(3)
        got = spec.impl.generate(model, prompt, 8, temperature=1.7, generator=gen, **kw)
        behaviour = f"generate(temperature=1.7, {kw}) equals greedy decoding"
        if not torch.equal(got.cpu(), want.cpu()):
            defer_to_a_cache_that_carries_over(spec, behaviour, config, model, prompt, 8)
            defer_to_a_failing_filter(spec, behaviour, config, model, prompt, got, kw)
        check_tokens(spec, got, want, behaviour=behaviour)


def defer_to_a_failing_filter(spec, behaviour: str, config, model, prompt, got, kw) -> None:
    """Raise ``spec.defer`` to the implementation's own ``sampling_probs`` (or ``sample``) where it fails its own tests
    and a correct generate that picks each token with it, at temperature 1.7 with the filter ``kw``, gives ``got``: the
    argmax of its probabilities (which a one-token filter makes the only token a draw can give), or its own draw with
    a generator seeded as the test's (``own_sampler_consequence``). Nothing otherwise."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing

    def pick(name):
        if name == "sampling_probs":
            return lambda logits: raw.sampling_probs(logits, temperature=1.7, **kw).argmax(dim=-1)
        gen = spec.inputs.generator(3)
        return lambda logits: raw.sample(logits, temperature=1.7, generator=gen, **kw)

    pickers = [(name, pick(name)) for name in spec.failing(("sampling_probs", "sample")) if raw.provides(name)]
    n, ctx = got.shape[1] - prompt.shape[1], config["context_length"]
    own_sampler_consequence(
        spec, model, prompt, n, ctx, got, use_cache=False, behaviour=behaviour, pickers=pickers,
        call=f"temperature=1.7, {kw}", kind="generate",
    )  # fmt: skip
    if "sample" in spec.failing(("sample",)) and raw.provides("sample"):  # a draw of its own that is not greedy
        try:
            logits = raw.forward(model, prompt)[:, -1].detach()
            rows = logits.repeat_interleave(32, dim=0)
            drawn = raw.sample(rows, temperature=1.7, generator=spec.inputs.generator(4), **kw)
            others = int((drawn.reshape(-1).cpu() != rows.argmax(dim=-1).cpu()).sum())
        except Exception:  # noqa: BLE001 - a sample that raises here explains nothing
            return
        if others:
            raise spec.defer(
                ["sample"],
                behaviour,
                f"consequence of failing sample: your own sample(logits, temperature=1.7, {kw}) on this prompt's last "
                f"logits drew another token than the argmax {others} times in {rows.shape[0]} draws, so a generate "
                "that samples with it cannot be greedy here (sample's own tests report how it draws). Fix sample "
                "first.",
            )


def defer_to_a_cache_that_carries_over(spec, behaviour: str, config, model, prompt, n: int) -> None:
    """Raise ``spec.defer`` to new_cache where it fails its own tests and a correct greedy generation through the
    implementation's own cache (``oracles.greedy_teacher``), run twice on the same model and prompt, gives different
    tokens, or a new cache holds what earlier ones wrote, with other logits through it (``test_kv_cache.carried_over``):
    two generate calls through that cache cannot agree either (a cache that carries state from one use to the next).
    Nothing otherwise."""
    failing = spec.failing(("new_cache",))
    if not failing:
        return
    try:
        ctx = config["context_length"]
        runs = [oracles.greedy_teacher(spec.impl, model, prompt, n, ctx, use_cache=True).cpu() for _ in range(2)]
        differ = not torch.equal(*runs)
    except ImplementationError:
        differ = False
    if differ:
        why = (
            "a correct greedy generation through your own cache, run twice on the same model and prompt, gives "
            "different tokens"
        )
    elif carried_over(spec, config, model, prompt.shape[0])[0] == "new_cache":
        why = "a new cache of yours holds what earlier caches wrote, and a prefill through it gives other logits"
    else:
        return
    raise spec.defer(
        failing,
        behaviour,
        f"consequence of failing {', '.join(failing)}: {why}, so two generate calls through your cache cannot agree "
        "either. Fix the cache first.",
    )


@judges("generate", uses=("build_model",))
@pytest.mark.parametrize("rows", [2, 1], ids=["2-rows", "1-row"])
def test_sampled_generation_is_reproducible(spec, config, rows):
    """generate with generators seeded alike produces the same tokens, for a prompt of one row too: a batch of one is
    a batch, sampled as greedily decoded (protocol: sample, reproducible per generator; generate, prompt [B, T])."""
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=53, device=spec.device))
    prompt = prompt_for(spec, config, seed=54, b=rows)

    def run():
        gen = spec.inputs.generator(5)
        return spec.impl.generate(
            model, prompt, 10, temperature=1.2, generator=gen, **filters.supported(spec.impl, {"top_p": 0.9})
        )

    first, second = run(), run()
    behaviour = "the same generator seed gives the same sampled continuation"
    causes, codes = [], []
    if not torch.equal(first.cpu(), second.cpu()):
        if spec.impl.provides("sample"):
            kw = {"temperature": 1.2, **filters.supported(spec.impl, {"top_p": 0.9})}
            teacher = [
                oracles.sampled_teacher(
                    spec.impl, model, prompt, 10, config["context_length"], spec.inputs.generator(5), **kw
                )
                for _ in range(2)
            ]
            if not torch.equal(teacher[0].cpu(), teacher[1].cpu()):
                raise spec.defer(
                    spec.failing(("sample",)) or ["sample"],  # settling charges it back unless sample fails its own
                    behaviour,
                    "consequence of failing sample: generation that draws every token with your own sample (seeded "
                    "alike) is not reproducible either. Fix sample first.",
                )
        defer_to_a_cache_that_carries_over(spec, behaviour, config, model, prompt, 10)
        causes, codes = global_rng_reading(spec, run, model, prompt)
    check_tokens(spec, first, second, behaviour=behaviour, causes=causes, codes=codes)


STATE_BEHAVIOUR = (
    "greedy generate of a prompt gives the same tokens when called again, and after a generate of another prompt"
)


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("kv_cache")
def test_generate_keeps_nothing_from_an_earlier_call(spec, family):
    """generate is a function of the model and its arguments: greedy generation of a prompt gives the same tokens
    when called again at once, and after a generate of another prompt (as many rows, another length) on the same
    model, nothing of an earlier call carried over (a cache, an offset or a token counter kept beside the model and
    not reset) (protocol: generate)."""
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=72, device=spec.device))
    prompt, other = prompt_for(spec, config, seed=73), prompt_for(spec, config, t=PROMPT_T - 2, seed=74)
    greedy = lambda ids: spec.impl.generate(model, ids, 8, temperature=0.0)
    first, second = greedy(prompt), greedy(prompt)
    greedy(other)
    third = greedy(prompt)
    causes, codes = (), ()
    if not (torch.equal(first.cpu(), second.cpu()) and torch.equal(first.cpu(), third.cpu())):
        observed.defer_dropout_in_eval_mode(spec, model, prompt, STATE_BEHAVIOUR)
        defer_to_a_cache_that_carries_over(spec, STATE_BEHAVIOUR, config, model, prompt, 8)
        causes, codes = state_reading(spec, lambda: greedy(prompt))
    got, want = torch.cat((second, third)), torch.cat((first, first))
    check_tokens(spec, got, want, behaviour=STATE_BEHAVIOUR, causes=causes, codes=codes)


def state_reading(spec, run) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Why greedy calls of ``run`` differ, from four calls with the global RNG seeded A, A, B, A before each: where the
    three under A agree and the one under B differs, greedy decoding draws from the global RNG; where two under A
    differ, it is not the RNG's alone: generate carries state from one call to the next."""
    runs = []
    for seed in (301, 301, 302, 301):
        spec.impl.manual_seed(spec.inputs.torch_seed(seed))
        try:
            runs.append(run().cpu())
        except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
            return (), ()
    alike = torch.equal(runs[0], runs[1]) and torch.equal(runs[1], runs[3])
    if alike and not torch.equal(runs[0], runs[2]):
        return (
            "likely cause: greedy generate (temperature 0) draws from the global RNG: with it seeded alike before "
            "each call, calls agree, and under another seed they differ. Fix: at temperature 0 take the argmax, with "
            "no draw",
        ), ("knob:generator",)
    if alike:
        return (), ()
    return (
        "likely cause: generate keeps state from one call to the next: the same greedy call gives other tokens from "
        "one call to the next under the same global RNG seed (a cache, an offset or a token counter kept beside the "
        "model, or in a workspace shared between calls, and not reset). Fix: start every generate from a fresh cache "
        "and counters",
    ), ("knob:state_carried",)


def global_rng_reading(spec, run, model, prompt) -> tuple[list[str], list[str]]:
    """Where two calls that differ agree once the global RNG is seeded alike before each, the draws follow the global
    RNG instead of the generator given (a loop that does not pass it on to its sampler). Where two greedy calls on
    ``prompt`` differ too, whatever the global RNG, generate carries state between calls (``state_reading``)."""
    try:
        greedy = [spec.impl.generate(model, prompt, 10, temperature=0.0).cpu() for _ in range(2)]
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return [], []
    if not torch.equal(*greedy):
        causes, codes = state_reading(spec, lambda: spec.impl.generate(model, prompt, 10, temperature=0.0))
        return list(causes), list(codes)
    runs = []
    for _ in range(2):
        spec.impl.manual_seed(spec.inputs.torch_seed(300))
        try:
            runs.append(run().cpu())
        except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
            return [], []
    if not torch.equal(*runs):
        return [], []
    return [
        "likely cause: generate's draws follow the global RNG, not the generator it is given: with torch's global "
        "RNG seeded alike before each call the two continuations agree. Fix: pass generator= on to every draw in the "
        "loop (sample, torch.multinomial)"
    ], ["knob:generator"]


N_DRAWS = 4000


@judges("generate", uses=("build_model", "forward", "sampling_probs"))
@pytest.mark.bug_class("sampling_order", "top_p", "top_k")
@pytest.mark.parametrize(
    "kw",
    [dict(temperature=0.7, top_p=0.9), dict(temperature=1.5, top_k=10), dict(temperature=1.3, top_k=7, top_p=0.75), {}],
    ids=["t0.7,top_p0.9", "t1.5,top_k10", "t1.3,top_k7,top_p0.75", "defaults"],
)
def test_generate_samples_from_sampling_probs(spec, kw):
    """The first token generate draws follows sampling_probs of the model's last logits: the distribution generate
    really samples from, not only what sampling_probs returns; with both filters, and with generate's defaults
    (temperature 1, no filter) (protocol: generate, sample).

    4,000 copies of one prompt draw one token each; every frequency must lie within 5.5 standard
    errors (plus 4e-3) of the probability, and no token outside the kept set may appear.
    """
    filters.require(spec.impl, kw)
    config = models.family_config(spec.impl, spec.impl.families[0])
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=58, device=spec.device))
    # two tokens: 4,000 rows of a longer prompt cost time, and the last position still differs from the first
    prompt = prompt_for(spec, config, t=2, seed=59, b=1).expand(N_DRAWS, -1).contiguous()
    one, many = spec.impl.forward(model, prompt[:1]), spec.impl.forward(model, prompt[:8])
    if mismatch(many, one.expand_as(many), tolerance("model", device=spec.device)) is not None:
        raise spec.defer(
            ["forward"],
            "generate's distribution is judged on a model whose rows are independent",
            "not judged: the model's logits for one prompt change with the batch size, which the model "
            "tests report (test_batch_rows_are_independent)",
        )
    probs = spec.impl.sampling_probs(one[0, -1], **{"temperature": 1.0, **kw}).double().cpu()
    bound = 5.5 * (probs * (1 - probs) / N_DRAWS).sqrt() + 4e-3

    def first_tokens(use_cache: bool):
        out = spec.impl.generate(model, prompt, 1, generator=spec.inputs.generator(0), use_cache=use_cache, **kw)
        if tuple(out.shape) != (N_DRAWS, prompt.shape[1] + 1):
            return out, None
        return out, torch.bincount(out[:, -1].cpu(), minlength=config["vocab_size"]).double() / N_DRAWS

    def follows(freq, probs=probs) -> bool:
        return freq is not None and draws.follows(freq, probs, N_DRAWS, slack=4e-3)

    out, freq = first_tokens(True)
    failing = spec.failing(("sampling_probs",))
    if failing and not follows(freq):  # the target is your sampling_probs: a wrong one fails a right generate
        logits = one[0, -1].detach()
        specified = spec.expected(lambda m, x: m.sampling_probs(x, **{"temperature": 1.0, **kw}), logits, label="ref")
        if follows(freq, specified.double().cpu()):
            raise spec.defer(
                failing,
                f"generate({kw}) draws with sampling_probs' probabilities",
                "consequence of failing sampling_probs: generate draws its first token with the specified "
                "probabilities of your model's logits, and your sampling_probs gives others (its own tests report "
                "it). Fix sampling_probs first.",
            )
    if freq is not None and not follows(freq) and spec.failing(("sample",)):  # generate draws with a failing sample?
        own = spec.impl._subject.sample(one[:, -1].expand(N_DRAWS, -1), generator=spec.inputs.generator(0),
                                        **{"temperature": 1.0, **kw})  # fmt: skip
        drawn = torch.bincount(own.reshape(-1).cpu(), minlength=config["vocab_size"]).double() / N_DRAWS
        pooled = (freq + drawn) / 2  # two samples of one distribution: their difference's bound, from their pool
        pair = 5.5 * (2 * pooled * (1 - pooled) / N_DRAWS).sqrt() + 4e-3
        if not follows(drawn) and bool(((freq - drawn).abs() <= pair).all()):
            raise spec.defer(
                ["sample"],
                f"generate({kw}) draws with sampling_probs' probabilities",
                "consequence of failing sample: generate's first tokens follow the draws of your own sample on the "
                "same logits (within 5.5 standard errors of the difference of two samples), and sample draws from "
                "another distribution than sampling_probs (its own tests report how). Fix sample first.",
            )
    if not follows(freq) and follows(first_tokens(False)[1]):
        found = (
            "through the cache generate draws its first token from another distribution than sampling_probs of "
            "forward's logits, and without it (use_cache=False) from that one"
        )
        failing = spec.failing(("new_cache",))
        behaviour = f"generate({kw}) draws with sampling_probs' probabilities"
        if failing:
            raise spec.defer(
                failing, behaviour, f"consequence of failing {', '.join(failing)}: {found}. Fix the cache."
            )
        raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
        try:
            cached = raw.forward(model, prompt[:1], raw.new_cache(model, 1))
            consistent = mismatch(cached, one, tolerance("model", device=spec.device)) is None
        except Exception:  # noqa: BLE001 - a cached forward that raises is no evidence either way
            consistent = None
        cause, code = (  # the cache itself right: what generate feeds through it is not
            ("likely cause: generate's own cached path feeds its cache otherwise than the prompt through a new cache "
             "(forward(model, prompt, new_cache(model, B)) gives forward's logits here): look at what generate "
             "feeds at its first steps (which tokens, at which positions, a slot not yet written). Fix: feed the "
             "prompt, then each new token, as forward through the cache takes them", "knob:cache_feeding")
            if consistent
            else ("likely cause: the cached prompt's logits differ from forward's (test_kv_cache.py tells how). Fix: "
                  "the cached path computes forward's logits", "cache_contents")
        )  # fmt: skip
        spec.require(False, behaviour=behaviour, found=found, causes=(cause,), codes=(code,))
    spec.require(
        freq is not None,
        behaviour=f"generate(prompt [{N_DRAWS}, {prompt.shape[1]}], 1 new token) returns the prompt and one token",
        found=f"the output has shape {list(out.shape)}: {out.shape[-1]} tokens per row, {prompt.shape[1] + 1} expected",
    )
    outside = [t for t in torch.nonzero(freq > 0).flatten().tolist() if probs[t] == 0]
    within = bool(((freq - probs).abs() <= bound).all())
    never, never_drawn = draws.missed(freq, probs, N_DRAWS)
    options = {"temperature": 1.0, **kw}
    causes, codes = ((), ())
    if outside or not within or never >= draws.MISSED:  # which classic mistake's distribution the draws follow
        logits = one[0, -1].detach()

        def probs_with(o):
            label = "draws:" + ",".join(f"{k}={v}" for k, v in sorted(o.items()))
            return spec.expected(lambda m, x: m.sampling_probs(x, **o), logits, label=label).double().cpu()

        causes, codes = draws.draw_causes("generate", freq, N_DRAWS, options, probs_with)
    if not causes:  # every row the same token: one draw shared by the rows
        causes, codes = draws.one_draw_causes(freq, probs, N_DRAWS)
    spec.require(
        not outside,
        behaviour=f"generate({kw}) draws only tokens sampling_probs keeps",
        found=f"drew filtered-out tokens {outside[:10]}",
        causes=causes
        or (  # weak: logits that differ from forward's draw outside the kept set too
            "likely cause (weak evidence): generate samples from the raw (or only temperature-scaled) logits instead "
            "of sampling_probs, or from logits other than forward's for the prompt. Fix: draw from the filtered "
            "distribution of the model's last logits",
        ),
        codes=codes or ("~knob:sampling_order",),
    )
    worst = int(torch.argmax((freq - probs).abs() - bound))
    spec.require(
        within,
        behaviour=f"generate({kw}) draws its first token with sampling_probs' probabilities",
        found=f"token {worst}: frequency {freq[worst]:.4f}, probability {probs[worst]:.4f} "
        f"(allowed ±{bound[worst]:.4f})",
        causes=causes,
        codes=codes,
    )
    spec.require(
        never < draws.MISSED,
        behaviour=f"generate({kw}) draws every token sampling_probs gives a fair chance",
        found=f"{len(never_drawn)} tokens never drawn in {N_DRAWS} draws ({never_drawn[:10]}), though sampling_probs "
        f"expects {never:.0f} draws of them (missing them all by chance: below e^-{draws.MISSED})",
        causes=causes,
        codes=codes,
    )
