"""The KV cache: cached decoding equals the implementation's own full forward for any chunking,
positions continue from the cache, the cache holds rotated keys and plain values on the time axis,
and it refuses to grow past the context.

Every check here relates the cached path to the implementation's own uncached forward (whose logits
``test_model.py`` compares with the reference), so a mistake in the model costs in the model only; where the
uncached forward is the wrong one (the cached path computes the reference's logits), the difference is forward's.
"""

import contextlib
import functools
import math

import pytest
import torch
from einops import rearrange
from hypothesis import given

from . import models
from .harness.diagnosis.model_variants import shares_a_position
from .harness.diagnosis.variant import Variant
from .harness.judging.compare import mismatch
from .harness.judging.spec import SpecFailure
from .harness.judging.tolerances import tolerance
from .harness.plugin.markers import judges
from .harness.subject.subject import NotImplementedInImpl
from .models import CONFIGS
from .strategies import chunkings

pytestmark = pytest.mark.component("kv_cache")

T = 17


@pytest.fixture(params=list(CONFIGS))
def config(request, impl):
    return models.supported(impl, CONFIGS[request.param], need=("gqa",) if request.param == "llama_gqa" else ())


def cached_logits(m, model, ids, chunks, keep=None):
    """Feed ``ids`` through a fresh cache in consecutive chunks; concatenate the logits. ``keep``: a list the cache
    is appended to."""
    cache = m.new_cache(model, ids.shape[0])
    if keep is not None:
        keep.append(cache)
    out, start = [], 0
    for n in chunks:
        out.append(m.forward(model, ids[:, start : start + n], cache))
        start += n
    return torch.cat(out, dim=1)


def check_chunks(spec, config, chunks, *, seed):
    sd = models.random_state_dict(config, seed=seed, device=spec.device)
    ids = spec.inputs.token_ids(2, sum(chunks), vocab=config["vocab_size"], seed=seed + 1)
    model = models.build(spec.impl, config, sd)
    full = spec.impl.forward(model, ids)
    kept = []
    cached = cached_logits(spec.impl, model, ids, chunks, keep=kept)
    behaviour = f"cached forward in chunks {chunks} equals the uncached forward of the same model"
    tol = tolerance("model", device=spec.device)
    roots = own_components(spec, config, sd, ids, chunks, cached, tol) if mismatch(cached, full, tol) else []
    if roots:
        names = ", ".join(roots)
        raise spec.defer(
            roots,
            behaviour,
            f"consequence of failing {names}: your cached chunks equal what a correct model and cache compute with "
            f"your own {names} (called on the correct intermediate values), so the cache hands on what {names} "
            f"computes on each chunk. Fix {names} first.",
        )
    if mismatch(cached, full, tol) is not None and spec.failing(("forward",)):
        # a model mistake only a multi-token forward shows (heads merged without a transpose is invisible at T = 1)
        # makes the uncached forward and every multi-token chunk wrong, the cache itself right: where decoding token
        # by token through the cache computes the specified logits, the cache holds and hands on the right keys and
        # values, and the difference is forward's, whose own tests report it
        right = spec.expected(lambda m, sd, ids: models.logits(m, config, sd, ids), sd, ids, label="reference")
        stepwise = cached if chunks == [1] * len(chunks) else cached_logits(spec.impl, model, ids, [1] * sum(chunks))
        if mismatch(stepwise, right, tol) is None:
            raise spec.defer(
                ["forward"],
                behaviour,
                "consequence of failing forward: decoding token by token through your cache computes the specified "
                "logits, so the cache holds and hands on the right keys and values; your forward computes several "
                "tokens at once otherwise (test_model.py reports it). Fix forward first.",
            )
        mistake = model_mistake(spec, config, sd, ids, chunks, full, cached, tol)
        if mistake is not None:
            raise spec.defer(
                ["forward"],
                behaviour,
                f"consequence of failing forward: one mistake in the model, {mistake.summary}, reproduces both your "
                "uncached forward and your cached chunks, so the cache hands on what that model computes; "
                "test_model.py reports it. Fix forward first.",
            )
    if mismatch(cached, full, tol) is not None and (found := attention_wrong_past_zero(spec, config)):
        raise spec.defer(["multihead_self_attention"], behaviour, found)
    hint, hint_code = chunk_hint(cached, full, chunks)
    read = None  # the cache itself read: a cause there is direct evidence, a variant of the logits fitting is not
    if mismatch(cached, full, tol) is not None:
        first, second = ids[:, : chunks[0]], ids[:, chunks[0] : sum(chunks[:2])]
        # a sliding layer's cache may hold only its last positions (amendment 27): what it holds says nothing here
        full_cache = config.get("sliding_window") is None
        read = (
            (cache_reading(spec, config, sd, first) if full_cache else None)
            or (
                cache_length_reading(spec, config, sd, first, second)
                if len(chunks) > 1 and held_otherwise(spec, kept[0], ids.shape[1])
                else None
            )
            or (slot_rule_reading(chunks, _steps_held(spec, kept[0])) if len(chunks) > 2 and full_cache else None)
            or write_slot_reading(spec, config, sd, ids, chunks, kept[0])
            or rows_apart(spec, model, ids, chunks, full, tol)
        )
        hint, hint_code = read or (hint, hint_code)
    alone = Variant(
        "knob:cache_contents",
        "the cache is not used: each chunk is computed as if it were the whole sequence",
        "attend to the cached keys and values of the earlier chunks",
        lambda: torch.cat([spec.impl.forward(model, c) for c in ids.split(chunks, dim=1)], dim=1),
    )
    spec.close(
        cached,
        full,
        kind="model",
        axes="b t v",
        variants=[] if read and read[1] else [alone, *position_variants(spec, config, sd, ids, chunks, cached)],
        hint=hint,
        hint_code=hint_code,
        structural=hint is None,  # a chunk boundary is where the hint looks; "wrong from t = k" adds nothing
        behaviour=behaviour,
    )


_FORWARD_FITS: dict = {}


def attention_wrong_past_zero(spec, config) -> str | None:
    """Why the cached chunks cannot judge the cache, where the implementation's multihead_self_attention (with the
    config's RoPE) gives the reference's output at positions arange(T) and not at the same tokens' positions moved
    on by 7: every chunk after the first reaches attention at such positions through the cache, and the uncached
    forward never does. None where it is right at both (or cannot be asked)."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: attention's own tests report its crashes
    if config.get("rope_theta") is None or config["family"] == "gpt2" or not raw.provides("multihead_self_attention"):
        return None
    h, h_kv = config["n_heads"], config.get("n_kv_heads") or config["n_heads"]
    d, dh = config["d_model"], config["d_model"] // config["n_heads"]
    x = spec.inputs.randn(2, 6, d, seed=611)
    weights = tuple(
        spec.inputs.fan_in_weight(rows, cols, seed=612 + i)
        for i, (rows, cols) in enumerate([(h * dh, d), (h_kv * dh, d), (h_kv * dh, d), (d, h * dh)])
    )
    theta = float(config["rope_theta"])
    tol = tolerance("attention", device=spec.device)

    def right_at(start: int) -> bool:
        positions = torch.arange(start, start + 6, device=x.device)
        call = lambda m, x, *w: m.multihead_self_attention(x, *w, h, h_kv, theta, positions)
        actual = raw.multihead_self_attention(x, *weights, h, h_kv, theta, positions)
        return mismatch(actual, spec.expected(call, x, *weights, label=f"attention_at_{start}"), tol) is None

    try:
        if not right_at(0) or right_at(7):
            return None
    except Exception:  # noqa: BLE001 - what cannot be asked explains nothing
        return None
    return (
        "consequence of failing multihead_self_attention: your attention gives the specified output at positions "
        "0..5 and another at the same tokens' positions 7..12, and every chunk after the first reaches attention at "
        "positions past 0 through the cache (the uncached forward never does), so these chunks cannot judge the "
        "cache (test_attention.py reports how attention differs). Fix multihead_self_attention first."
    )


def own_components(spec, config, sd, ids, chunks, cached, tol) -> list[str]:
    """The failing component names the model calls (a minimal set) whose own functions, composed with the reference's
    model and cache, give the implementation's cached chunks (``consequences.explain``): a component that computes a
    chunk otherwise than the whole sequence (a router's softmax over the tokens) shows through the cache. ``[]``
    where none does, or outside pytest's judgement."""
    from .harness.judging.consequences import explain
    from .harness.judging.treemap import to_float64

    reference = getattr(spec.expectations, "reference", None)
    names = [n for n in spec.upstream("forward") if n not in ("forward", "new_cache")] if reference is not None else []
    if not names:
        return []
    args64 = to_float64((sd, ids))
    compute = lambda m, sd, ids: cached_logits(m, models.build(m, config, sd), ids, chunks)
    return explain(compute, args64, cached, tol, reference, spec.impl._subject, names)


def model_mistake(spec, config, sd, ids, chunks, full, cached, tol) -> Variant | None:
    """The mistake inside the model (``model_knobs``: a component's knob or a wiring choice, by its cause code) that
    reproduces both the failing uncached forward and the cached chunks, if any: then the cache carries the model's own
    mistake (a softmax over the heads is wrong at one token too, so decoding token by token does not show the cache
    right; held out, the two paths masked the scores in two ways before it). The uncached forward's fits are searched
    once per implementation, config and inputs."""
    from .harness.diagnosis.model_knobs import model_variants
    from .harness.diagnosis.variant import fitting_variants
    from .harness.judging.treemap import to_float64

    reference = getattr(spec.expectations, "reference", None)
    if reference is None:
        return None
    args64 = to_float64((sd, ids))
    key = (spec.impl.label, repr(sorted(config.items())), tuple(ids.flatten().tolist()))  # the ids follow the seed
    if key not in _FORWARD_FITS:
        whole = lambda m, sd, ids: models.logits(m, config, sd, ids)
        fits = fitting_variants(model_variants(whole, reference, args64), full, tol, reference, *args64)
        _FORWARD_FITS[key] = {v.code for v in fits if not v.weak}
    codes = _FORWARD_FITS[key]
    if not codes:
        return None
    chunked = lambda m, sd, ids: cached_logits(m, models.build(m, config, sd), ids, chunks)
    for v in model_variants(chunked, reference, args64):
        if v.code in codes and fitting_variants([v], cached, tol, reference, *args64):
            return v
    return None


def position_variants(spec, config, sd, ids, chunks, actual) -> list[Variant]:
    """The reference's cached forward with one thing of its cached path changed:

    - each chunk's positions starting elsewhere than at the cache length (at a constant: 0, restarted, or a size
      read from the wrong axis; at the cache length plus an offset; at the number of earlier calls, a counter
      advanced once per call, which also offsets the mask's rows);
    - the causal mask of a call through the cache aligned top-left (query i sees keys j <= i, whatever the cache
      holds), or missing (the cached path hides only the keys not yet written);
    - the keys read back unrotated (the cache holds keys before RoPE);
    - under GQA, query heads reading the kv heads tiled (h % n_kv_heads);
    - with a sliding window, the window left out of cached calls.

    Everything else is the reference's. A variant stops at the first chunk that differs from ``actual`` (it cannot
    fit), so a failing run pays for few chunks."""
    ref = getattr(spec.expectations, "reference", None)
    if ref is None:
        return []
    tol = tolerance("model", device=spec.device)
    offset = [0]  # the mask offset of the chunk being computed (None: no causal mask)

    @functools.cache
    def reference_model(window=True):  # built once, when a variant is first tried (a cached forward leaves it as it is)
        return models.build(ref, config if window else models.without_window(config), sd)

    def chunks_at(start_of, mask_offset_of=None, replacements=None, window=True):
        if mask_offset_of is not None:
            replacements = {"scaled_dot_product_attention": masked_at_offset}

        def compute():
            model = reference_model(window)
            cache, out, cached = ref.new_cache(model, ids.shape[0]), [], 0
            rotated[0] = 0
            with ref.substituted(replacements) if replacements else contextlib.nullcontext():
                for k, n in enumerate(chunks):
                    s = start_of(k, cached)
                    offset[0] = mask_offset_of(k, cached) if mask_offset_of else cached
                    positions = torch.arange(s, s + n, device=ids.device) if isinstance(s, int) else s.to(ids.device)
                    out.append(ref.forward(model, ids[:, cached : cached + n], cache, positions=positions))
                    if mismatch(actual[:, cached : cached + n], out[-1], tol) is not None:
                        raise ValueError("this variant differs from the cached logits")  # fitting_variants skips it
                    cached += n
            return torch.cat(out, dim=1)

        return compute

    attention, rope = ref.obj.scaled_dot_product_attention, getattr(ref.obj, "rope", None)

    def masked_at_offset(q, k, v, mask=None, *args, causal=False, **kwargs):
        """Query i sees key j iff j <= i + offset (no causal mask for an offset of None), with any given mask."""
        if offset[0] is not None:
            i, j = torch.arange(q.shape[-2], device=q.device), torch.arange(k.shape[-2], device=q.device)
            shifted = j[None, :] <= i[:, None] + offset[0]
            mask = shifted if mask is None else mask.to(torch.bool) & shifted
        return attention(q, k, v, mask, *args, **kwargs)

    rotated = [0]

    def queries_only(x, *args, **kwargs):  # the reference rotates q, then k, in every layer
        rotated[0] += 1
        return rope(x, *args, **kwargs) if rotated[0] % 2 else x

    def values_rotated(q, k, v, *args, **kwargs):  # the keys' rotation undone, each value rotated at its key's
        # position (the cache starts at 0): what a cache holding unrotated keys and rotated values hands attention
        at, theta = torch.arange(k.shape[-2], device=k.device), float(config["rope_theta"])
        plain = rope(k, -at, theta, style=ref.rope_style)
        return attention(q, plain, rope(v, at, theta, style=ref.rope_style), *args, **kwargs)

    def keys_from_zero(x, positions, *args, **kwargs):  # q at its positions, k at arange(T) of the call
        rotated[0] += 1
        at = positions if rotated[0] % 2 else torch.arange(x.shape[-2], device=x.device)
        return rope(x, at, *args, **kwargs)

    fix = "positions = arange(cached, cached + T): each chunk continues from the number of tokens the cache holds"
    if config["family"] == "gpt2":  # learned positions: each constant is another model
        rules = [
            (f"every chunk's positions start at {c}, whatever the cache holds", lambda k, n, c=c: c) for c in range(9)
        ]
    else:  # RoPE sees only differences of positions: every constant start is the same model
        rules = [("every chunk's positions start at the same number (0, or any constant: RoPE sees only differences), "
                  "whatever the cache holds", lambda k, n: 0)]  # fmt: skip
    rules += [
        (f"positions continue from the cache length {c:+d} (off by {abs(c)})", lambda k, n, c=c: n + c)
        for c in (-1, 1, 2)
    ]
    rules.append(("positions count the earlier calls (one per call), not the cached tokens", lambda k, n: k))
    if config["family"] != "gpt2" and max(chunks) > 1:  # a table's last row taken for every token of a chunk
        rules.append(
            (
                "every token of a chunk is rotated at the chunk's last position (the position table sliced at its "
                "last row, as for one new token)",
                lambda k, c: torch.full((chunks[k],), c + chunks[k] - 1),
            )
        )
    sizes = {}  # the cache tensors' other axes, whose size a slip reads as the cached length (k.shape[1])
    for size, label in (
        (ids.shape[0], "the batch size"),
        (models.n_kv(config), "n_kv_heads"),
        (config["n_heads"], "n_heads"),
        (models.d_head(config), "d_head"),
    ):
        if size not in chunks[:1]:
            sizes.setdefault(size, []).append(label)
    for size, labels in sizes.items():
        axis = " and ".join(labels)
        rules.append(
            (
                f"a cached call's positions start at {size} ({axis}, another axis of the cache's [B, H, T, d] "
                "tensors read as its length: k.shape[1] for k.shape[2]), not at the cache length",
                lambda k, n, size=size: 0 if k == 0 else size,
            )
        )
    found = [Variant("knob:position_offset", summary, fix, chunks_at(rule)) for summary, rule in rules]
    found.append(
        Variant(
            "knob:position_offset",
            "the cache counts its calls, not its tokens (a pointer advanced by one per call): each chunk's positions "
            "and its mask's rows start at the number of earlier calls",
            "advance the cache's length by the number of new tokens T; take positions and the mask's offset from it",
            chunks_at(lambda k, n: k, lambda k, n: k),
        )
    )
    mask_fix = "mask key j for query i unless j <= i + (T_k - T_q), over the cached and the new keys, in every call "
    found.append(
        Variant(
            "knob:mask_alignment",
            "on the cached path the causal mask is aligned top-left (its rows sliced from 0, not from the cache "
            "length): new query i sees only keys j <= i, so the newest cached keys are hidden",
            mask_fix + "through the cache (the rows of a causal mask start at the cache length)",
            chunks_at(lambda k, n: n, lambda k, n: 0),
        )
    )
    if any(n > 1 for n in chunks[1:]) and any(n == 1 for n in chunks[1:]):  # else the one above says it
        found.append(
            Variant(
                "knob:mask_alignment",
                "several new tokens after cached ones get a causal mask aligned top-left (is_causal=True in "
                "scaled_dot_product_attention is top-left when T_q != T_k): query i sees only keys j <= i; one new "
                "token is right",
                mask_fix + "through the cache (is_causal=True only when T_q == T_k)",
                chunks_at(lambda k, c: c, lambda k, c: 0 if chunks[k] > 1 else c),
            )
        )
    if any(n > 1 for n in chunks[1:]):  # a chunk's mask built new-tokens-first: its triangle over the oldest keys

        def past_after(q, k, v, mask=None, *args, causal=False, **kwargs):
            t_q, t_k = q.shape[-2], k.shape[-2]
            if not causal or t_q == 1 or t_k == t_q:
                return attention(q, k, v, mask, *args, causal=causal, **kwargs)
            tri = torch.ones(t_q, t_q, dtype=torch.bool, device=q.device).tril()
            laid = torch.cat([tri, torch.ones(t_q, t_k - t_q, dtype=torch.bool, device=q.device)], dim=-1)
            return attention(q, k, v, laid if mask is None else mask.to(torch.bool) & laid, *args, **kwargs)

        found.append(
            Variant(
                "knob:mask_alignment",
                "a chunk of several new tokens after cached ones gets its causal mask laid out new-tokens-first (the "
                "chunk's triangle, then the cached keys' all-visible columns appended after it) while the keys are "
                "cached-first: the triangle falls on the oldest cached keys and every new token sees the later ones",
                "put the cached keys' columns first: mask = cat([ones(T_q, cached), tril(T_q, T_q)], dim=-1), the "
                "order the keys are in",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": past_after}),
            )
        )
    if 1 in chunks[1:]:  # a decode step's own key left out: the key count taken before the step's write
        found.append(
            Variant(
                "knob:mask_alignment",
                "one new token through the cache (the decode step) does not attend to its own key: it sees the "
                "cached keys only (the number of keys read taken before the new token is written: context_lens "
                "for seq_lens)",
                "a new token attends the cached keys and itself: keys [:cached + 1] for one new token, its own "
                "key written before attention reads the cache",
                chunks_at(lambda k, c: c, lambda k, c: c - 1 if k and chunks[k] == 1 else c),
            )
        )
    if max(chunks) > 1:  # a one-token chunk has no later new token to hide
        found.append(
            Variant(
                "knob:mask_missing",
                "on the cached path the causal mask is missing: each new token of a chunk sees the later tokens of "
                "its own chunk (only keys not yet written are hidden)",
                mask_fix + "through the cache",
                chunks_at(lambda k, n: n, lambda k, n: None),
            )
        )
    if config.get("sliding_window") is not None:
        found.append(
            Variant(
                "knob:sliding_window",
                "the window is not applied on the cached path: a cached call attends every earlier key",
                "in a sliding layer query i attends the keys j with i - W < j <= i, through the cache as without it",
                chunks_at(lambda k, n: n, window=False),
            )
        )
        w = int(config["sliding_window"])

        def slot_order(q, k, v, mask=None, *args, **kwargs):  # a rotating buffer of w slots read in slot order
            cached = k.shape[-2] - q.shape[-2]
            if mask is None or cached <= w:  # a layer without the window, or a buffer not yet wrapped
                return attention(q, k, v, mask, *args, **kwargs)
            held = list(range(cached - w, cached))  # the w positions the buffer holds, position p in slot p % w
            new = list(range(cached, k.shape[-2]))
            order = torch.tensor(sorted(held, key=lambda p: p % w) + new, device=k.device)
            times = torch.tensor(held + new, device=k.device)  # the positions the mask's columns are built for
            mask = mask.to(torch.bool)[..., times]
            return attention(q, k[..., order, :], v[..., order, :], mask, *args, **kwargs)

        found.append(
            Variant(
                "knob:sliding_window",
                f"once more than sliding_window ({w}) positions are cached, the rotating buffer is read in slot order "
                f"(position p at slot p % {w}) instead of time order, while the mask is built for time order: the "
                "cached keys and values are unrotated the wrong way",
                "read a wrapped buffer back in time order (the oldest slot first: slots (next .. w) then (0 .. next)) "
                "before attention and cache_kv",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": slot_order}),
            )
        )
    if 1 < models.n_kv(config) < config["n_heads"]:

        def tiled(q, k, v, *args, **kwargs):  # query head h reads kv head h % n_kv_heads
            rep = q.shape[-3] // k.shape[-3]
            return attention(q, torch.cat([k] * rep, dim=-3), torch.cat([v] * rep, dim=-3), *args, **kwargs)

        found.append(
            Variant(
                "knob:gqa_mapping",
                "on the cached path query head h reads kv head h % n_kv_heads (tiled), not h // (n_heads / n_kv_heads)",
                "on every path query head h reads kv head h // (n_heads / n_kv_heads) (repeat_interleave)",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": tiled}),
            )
        )

        def grid_transposed(q, k, v, *args, **kwargs):  # the query heads grouped as [group, n_kv], not [n_kv, group]
            rep = q.shape[-3] // k.shape[-3]
            q = rearrange(q, "... (g kv) t d -> ... (kv g) t d", kv=k.shape[-3], g=rep)
            return attention(q, k, v, *args, **kwargs)

        if 1 in chunks[1:] and max(chunks) > 1:  # a decode kernel of its own for one new token
            for how, mistake in (
                ("query head h reads kv head h % n_kv_heads (tiled), not h // (n_heads / n_kv_heads)", tiled),
                (
                    "the query heads are grouped as [group, n_kv_heads] instead of [n_kv_heads, group] (a reshape of "
                    "the head axis the other way round), so each output head holds another head's query",
                    grid_transposed,
                ),
            ):

                def decoding(q, k, v, *args, mistake=mistake, **kwargs):
                    return (mistake if q.shape[-2] == 1 else attention)(q, k, v, *args, **kwargs)

                found.append(
                    Variant(
                        "knob:gqa_mapping",
                        f"one new token at a time through the cache (the decode path), {how}; several new tokens "
                        "are right",
                        "in the decode path too, query head h reads kv head h // (n_heads / n_kv_heads) "
                        "(repeat_interleave), its output in head h's place",
                        chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": decoding}),
                    )
                )

    def unwritten_slots_seen(step):  # a preallocated buffer read whole: context_length slots, or grown in steps
        def attend(q, k, v, mask=None, *args, causal=False, **kwargs):
            t_q = q.shape[-2]
            capacity = config["context_length"] if step is None else step * -(-k.shape[-2] // step)
            if mask is not None or k.shape[-2] > capacity:
                raise ValueError("not this variant's call")  # fitting_variants skips it
            pad = capacity - k.shape[-2]
            k = torch.cat([k, k.new_zeros(*k.shape[:-2], pad, k.shape[-1])], dim=-2)
            v = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], dim=-2)
            i, j = torch.arange(t_q, device=q.device), torch.arange(capacity, device=q.device)
            return attention(q, k, v, j[None, :] <= i[:, None] + (capacity - t_q), *args, **kwargs)

        return attend

    buffers = {
        None: f"of context_length ({config['context_length']}) slots",
        256: "grown in steps of 256 slots (as mlx-lm's KVCache grows its buffers)",
    }
    for step, sized in buffers.items():
        found.append(
            Variant(
                "knob:cache_contents",
                f"calls through the cache attend the whole preallocated buffer {sized}, the unwritten ones too (zero "
                "keys and values), its causal mask aligned to the buffer's end instead of to the tokens written so "
                "far (the write offset left out of it)",
                "attend only the slots written so far: keys [:cached + T], the mask's rows offset by the number cached",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": unwritten_slots_seen(step)}),
            )
        )
    if rope is not None and config["family"] != "gpt2" and len(chunks) > 1:

        def other_pairing_when_cached(x, *args, **kwargs):  # a decode kernel's rotary with its own default pairing
            if offset[0]:  # the cache holds tokens: a call after the first
                kwargs = {
                    **kwargs,
                    "style": "half" if kwargs.get("style", "interleaved") == "interleaved" else "interleaved",
                }
            return rope(x, *args, **kwargs)

        found.append(
            Variant(
                "knob:rope_style",
                "calls through a cache that already holds tokens rotate the new queries and keys with the other RoPE "
                "pairing (interleaved for half, or the reverse: a decode kernel's own default, its pairing argument "
                "not passed on); the first call is right",
                "rotate with the declared pairing on every path: pass the style (interleaved=...) to the cached "
                "path's rotary too",
                chunks_at(lambda k, n: n, replacements={"rope": other_pairing_when_cached}),
            )
        )
    for read, said in (
        ("k", "the keys are written in place of the values too (values read back are the keys)"),
        ("v", "the values are written in place of the keys too (keys read back are the values)"),
    ):

        def swapped(q, k, v, *args, read=read, **kwargs):  # one of the two stored twice
            return attention(q, *((k, k) if read == "k" else (v, v)), *args, **kwargs)

        found.append(
            Variant(
                "knob:cache_contents",
                f"on the cached path {said}: a slip in the cache update (k_cache[...] = k; v_cache[...] = k)",
                "write the new keys to the key cache and the new values to the value cache",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": swapped}),
            )
        )
    for narrow in (torch.bfloat16, torch.float16):

        def rounded(q, k, v, *args, narrow=narrow, **kwargs):  # what attention reads back from a narrower cache
            return attention(q, k.to(narrow).to(k.dtype), v.to(narrow).to(v.dtype), *args, **kwargs)

        found.append(
            Variant(
                "knob:cache_contents",
                f"the cache stores its keys and values in {str(narrow).removeprefix('torch.')} whatever the model's "
                "dtype: every cached key and value is rounded to it (the uncached forward is exact)",
                "allocate the cache's buffers in the model's dtype (new_cache: dtype=the model's parameters' dtype)",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": rounded}),
            )
        )
    if rope is not None and config["family"] != "gpt2":
        found.append(
            Variant(
                "knob:cache_contents",
                "on the cached path the keys are read back unrotated: the cache holds the keys before RoPE (and "
                "attention reads them from it)",
                "rotate the new keys at their positions, then append them: the cache stores keys after RoPE",
                chunks_at(lambda k, n: n, replacements={"rope": queries_only}),
            )
        )
        found.append(
            Variant(
                "knob:cache_contents",
                "on the cached path RoPE rotates the values instead of the keys: the cache holds unrotated keys and "
                "rotated values",
                "rotate the keys (never the values) at their positions before they are cached",
                chunks_at(lambda k, n: n, replacements={"scaled_dot_product_attention": values_rotated}),
            )
        )
        found.append(  # with one token per call the same as unrotated keys: said together there (one code)
            Variant(
                "knob:cache_contents",
                "the keys are rotated at positions counted from 0 in each call (the queries at their own): the "
                "positions never reach the keys' RoPE",
                "rotate the keys at the same positions as the queries (those continuing from the cache length)",
                chunks_at(lambda k, n: n, replacements={"rope": keys_from_zero}),
            )
        )
    return found


def rows_apart(spec, model, ids, chunks, full, tol) -> tuple[str, str] | None:
    """``(cause, code)`` where the cached path gives each row of the batch alone (a cache made for one row) its
    uncached logits and the rows together not: through the cache a row sees the others'. None otherwise."""
    if ids.shape[0] < 2:
        return None
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    try:
        alone = torch.cat([cached_logits(impl, model, ids[b : b + 1], chunks) for b in range(ids.shape[0])])
    except Exception:  # noqa: BLE001 - a cache of one row that raises says nothing here
        return None
    if alone.shape != full.shape or mismatch(alone, full, tol) is not None:
        return None
    return (
        f"likely cause: through the cache each row alone (a cache made for one row) gives its uncached logits, and "
        f"the {ids.shape[0]} rows together do not: on the cached path a row sees the other rows' keys and values (a "
        "mask or cache that keeps one sequence for the whole batch, rows attending every row's cached keys). Fix: "
        "keep each row's cache apart and mask each query to its own row's keys"
    ), "batch_mixing"


SLOT_RULES = {
    "set to the call's length": lambda slot, n: n,
    "advanced by one per call": lambda slot, n: slot + 1,
    "never advanced after the first call": lambda slot, n: slot if slot else n,
    "reset to 0 after each call": lambda slot, n: 0,
}


def slot_rule_reading(chunks, held: int) -> tuple[str, str] | None:
    """``(cause, code)`` where the positions a cache holds after calls of ``chunks`` tokens (``held``, its extent)
    are what one wrong write-position rule gives (``SLOT_RULES``: each call writes at the write position, which is
    then set to the call's length, advanced by one, ...): a bookkeeping mistake named by the count it leaves,
    whatever the cache's layout (the rules that fit said together). None where the count is right or fits none."""
    if held == sum(chunks) or not isinstance(held, int):
        return None

    def extent(rule):
        slot = top = 0
        for n in chunks:
            top = max(top, slot + n)
            slot = rule(slot, n)
        return top

    fits = [name for name, rule in SLOT_RULES.items() if extent(rule) == held]
    if not fits or len(fits) == len(SLOT_RULES):
        return None
    return (
        f"likely cause: after calls of {chunks} tokens cache_kv holds {held} positions ({sum(chunks)} written), which "
        f"is what a cache whose write position is {' or '.join(fits)} (instead of advanced by the tokens each call "
        "writes) holds: later calls write over earlier positions. Fix: advance the cache's write position (its "
        "head, length or offset) by the number of tokens each call writes"
    ), "knob:position_offset"


# where each call's keys and values land, for the contents reading (the count reading's rules give wrong counts)
WRITE_RULES = {
    "whose write position is 0 at every call (a write index that is never advanced, e.g. a copy of the shared index "
    "kept per layer)": lambda starts, chunks: [0] * len(starts),
    "whose write position is the previous call's length (set to each call's length, not advanced)": (
        lambda starts, chunks: [0] + [b - a for a, b in zip(starts, starts[1:])]
    ),
    "whose write position is advanced by one per call": lambda starts, chunks: list(range(len(starts))),
    "that puts each call's keys and values before the cached ones (torch.cat((new, cached)) where (cached, new) "
    "belongs: the positions out of time order)": lambda starts, chunks: [
        sum(chunks) - s - n for s, n in zip(starts, chunks)
    ],
}


def write_slot_reading(spec, config, sd, ids, chunks, cache) -> tuple[str, str] | None:
    """``(cause, code)`` where layer 0 of the implementation's ``cache``, after the test's calls of ``chunks`` tokens,
    holds the right number of positions but the keys and values a buffer written by one wrong rule holds
    (``WRITE_RULES``): each call's keys and values written at that slot, over what was there, the slots never written
    zeros. Layer 0's keys and values depend on the tokens and their positions alone, so they are the reference's
    whatever the cache did to the attention. None where the rule fits none, or the cache cannot be read."""
    ref = getattr(spec.expectations, "reference", None)
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    total = sum(chunks)
    if ref is None or len(chunks) < 2 or not impl.provides("cache_kv") or config.get("sliding_window"):
        return None
    try:
        own = [t.double() for t in impl.cache_kv(cache, 0)]
        twin = models.build(ref, config, sd)
        ref_cache = ref.new_cache(twin, ids.shape[0])
        ref.forward(twin, ids, ref_cache)
        want = [t.double() for t in ref.cache_kv(ref_cache, 0)]
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return None
    if any(o.shape != w.shape for o, w in zip(own, want)) or own[0].shape[2] != total:
        return None
    tol = tolerance("model", device=spec.device)
    starts = [sum(chunks[:i]) for i in range(len(chunks))]

    def written(w, slots):
        buffer = torch.zeros(*w.shape[:2], total + max(chunks), w.shape[3], dtype=w.dtype, device=w.device)
        for start, n, slot in zip(starts, chunks, slots):
            buffer[:, :, slot : slot + n] = w[:, :, start : start + n]
        return buffer[:, :, :total]

    if all(mismatch(o.to(w.device), w, tol) is None for o, w in zip(own, want)):
        return None
    fits = []
    for said, rule in WRITE_RULES.items():
        slots = rule(starts, chunks)
        if slots == starts:
            continue
        if all(mismatch(o.to(w.device), written(w, slots), tol) is None for o, w in zip(own, want)):
            fits.append(said)
    if len(fits) != 1:
        return None
    return (
        f"likely cause: after calls of {chunks} tokens, layer 0 of your cache holds {total} positions, as it should, "
        f"but they are what a cache {fits[0]} holds (slots never written hold zeros), where the k-th call writes "
        "at the number of positions cached before it, after them. Fix: write each call's keys and values at the "
        "cached length, after the cached ones, and advance it by the call's tokens, in every layer alike"
    ), "knob:position_offset"


BY_ROWS = (  # a cache length advanced by the batch size: what it is, and the fix
    "a size read from the batch axis (ids.shape[0], or size(ids, 2) of a features-first [T, B] layout). Fix: advance "
    "it by the number of new tokens, ids.shape[1]"
)

ONE_PER_CALL = (
    "the cache grows by one position per call instead of by the call's number of tokens (its length advanced by 1, "
    "or only each call's first position written), so a multi-token call leaves it short and the next call writes over "
    "its positions. Fix: write every new token's keys and values, and advance the cached length by their count"
)


def cache_reading(spec, config, sd, ids) -> tuple[str, str] | None:
    """``(cause, code)`` read from the implementation's own cache after one prefill of ``ids`` (the failing run's
    first chunk), against the reference's cache after the same prefill: every entry zero (the writes are lost); each
    layer holding other layers' keys and values (its positions, in blocks of the prefill's length, each another layer's:
    the layers' entries in another order, or one written into another's); keys and values in each other's place; the
    first position alone (the cache grown by one per call); else,
    where the layers hold other numbers of positions, a note saying how many. None where it holds what it should, or
    cannot be read (cache_kv is optional; its own tests judge its layout)."""
    ref = getattr(spec.expectations, "reference", None)
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    if ref is None or not impl.provides("cache_kv"):
        return None

    def contents(m):
        model = models.build(m, config, sd)
        cache = m.new_cache(model, ids.shape[0])
        m.forward(model, ids, cache)
        held = [m.cache_kv(cache, layer) for layer in range(config["n_layers"])]
        return [tuple(t if t is None else t.double() for t in o) for o in held]

    def empty(o) -> bool:  # (None, None), or keys and values of no positions: a layer that holds nothing
        return len(o) == 2 and (
            all(t is None for t in o) or all(isinstance(t, torch.Tensor) and t.dim() == 4 and not t.shape[2] for t in o)
        )

    try:
        own = contents(impl)
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return None
    want = contents(ref)
    n, tol = ids.shape[1], tolerance("model", device=spec.device)
    prefill = f"after a prefill of {n} token{'s' if n > 1 else ''}"
    held_some = [o for o in own if not empty(o)]
    if any(len(o) != 2 or any(not isinstance(t, torch.Tensor) or t.dim() != 4 for t in o) for o in held_some):
        return None
    if any(t.shape[:2] != want[0][0].shape[:2] or t.shape[3] != want[0][0].shape[3] for o in held_some for t in o):
        heads = _head_count_causes(held_some[0][0].shape, tuple(want[0][0].shape), config)
        return (heads[0], "knob:cache_contents") if heads else None  # another layout: the layout test says so

    def same(a, b) -> bool:
        return a.shape == b.shape and mismatch(a.to(b.device), b, tol) is None

    def blocks(o):  # the layer's positions in blocks of n, each matched to the reference layer that holds it
        if empty(o):
            return []
        k, v = o
        if k.shape[2] != v.shape[2] or k.shape[2] % n or not k.shape[2]:
            return None
        return [
            next((j for j, w in enumerate(want) if same(kb, w[0]) and same(vb, w[1])), None)
            for kb, vb in zip(k.split(n, dim=2), v.split(n, dim=2))
        ]

    fix = "Fix: write each layer's new keys and values into that layer's own cache entry, and keep the result"
    stride = _row_stride(own, want, same)
    if stride is not None:
        steps = want[0][0].shape[2]
        apart = (
            "every row's writes land in the same slots"
            if stride == 0
            else (f"each row's writes start {stride} slot{'s' if stride > 1 else ''} after the previous row's")
        )
        return (
            f"likely cause: {prefill} the cache's rows hold other rows' keys and values: read as one buffer of slots, "
            f"{apart} instead of {steps} slot{'s' if steps > 1 else ''} apart (the slots a row holds), so the rows "
            "are written to one place, a later "
            f"row's write over an earlier's (a slot index batch_idx * {stride} + position, the row's stride wrong). "
            "Fix: give each row of the batch its own slots in the cache (batch_idx * slots_per_row + position)"
        ), "knob:cache_slots"
    held = [blocks(o) for o in own]
    if held == [[i] for i in range(len(own))]:
        return None
    for d in (1, -1):  # layer i holds layer i - d's entry, and the layer at the end holds nothing
        if len(own) > 1 and held == [[i - d] if 0 <= i - d < len(own) else [] for i in range(len(own))]:
            none = 0 if d == 1 else len(own) - 1
            return (
                f"likely cause: {prefill} cache_kv(cache, i) holds layer i {'-' if d == 1 else '+'} 1's keys and "
                f"values, and layer {none} holds none: the layer index is off by one between the entry forward "
                f"writes and the one cache_kv reads (a 1-based layer number, layer_number = i + 1, on one side "
                f"only). Fix: read layer i's entry from where layer i writes it"
            ), "knob:cache_contents"
    if len(held_some) < len(own):
        nothing = [i for i, o in enumerate(own) if empty(o)]
        return (
            f"note: {prefill} cache_kv gives no positions for layer{'s' if len(nothing) > 1 else ''} "
            f"{', '.join(map(str, nothing))} (None, or none held) and some for the others: every layer's entry should "
            f"hold the {n} positions written to it"
        ), ""
    if all(not t.any() for o in own for t in o):
        return (
            f"likely cause: {prefill} every key and value your cache holds is 0 (cache_kv): the writes do not land "
            "where the cache is read, e.g. an out-of-place update whose result is dropped (index_copy, slice_scatter "
            "or torch.cat not assigned back), or a write index other than the read's (a paged cache's slot computed "
            f"without the block stride, block * block_size + offset), and attention reads the zeros. {fix}"
        ), "knob:cache_contents"
    if all(h is not None and None not in h for h in held):
        whose = [" then ".join(f"layer {j}'s" for j in h) for h in held]
        said = "; ".join(f"layer {i} holds {w}" for i, (w, h) in enumerate(zip(whose, held)) if h != [i])
        reversed_order = held == [[j] for j in range(len(own))][::-1]
        how = "stored in reverse order" if reversed_order else "mixed up (a layer's keys written into another's entry)"
        return (
            f"likely cause: {prefill} cache_kv(cache, i) holds other layers' keys and values ({said}): the layers' "
            f"cache entries are {how}, so each layer attends another layer's keys and values. {fix}"
        ), "knob:cache_contents"
    if all(same(o[0], w[1]) and same(o[1], w[0]) for o, w in zip(own, want)):
        return (
            f"likely cause: {prefill} your cache holds the values where the keys belong and the keys where the "
            "values belong (cache_kv). Fix: store and read back (keys, values) in one order"
        ), "knob:cache_contents"
    shifted = _keys_rotated_further(ref, own, want, config, same)
    if shifted:
        said = "; ".join(f"layer {i}'s by {d:+d}" for i, d in shifted.items())
        return (
            f"likely cause: {prefill} the cached values are right and the cached keys are the specified ones rotated "
            f"to other positions ({said}): those layers take their RoPE positions from a count that is off by that "
            "much, e.g. the cache's length read after another layer already advanced it. Fix: every layer rotates "
            "its new keys at positions cached .. cached + T - 1, the count taken before any layer writes"
        ), "knob:position_offset"
    sizes = [o[0].shape[2] for o in own]
    if n > 1 and all(o[0].shape[2] == o[1].shape[2] == 1 for o in own):
        first = all(same(o[0], w[0][:, :, :1]) and same(o[1], w[1][:, :, :1]) for o, w in zip(own, want))
        if first:
            return (
                f"likely cause: {prefill} cache_kv holds 1 position in every layer, the first token's keys and values: "
                f"{ONE_PER_CALL}"
            ), "knob:position_offset"
    _, carried = (
        carried_over(spec, config, models.build(impl, config, sd), ids.shape[0]) if max(sizes) > n else (None, ())
    )
    if carried:
        return carried[0], "knob:cache_contents"
    layers, rows = len(own), ids.shape[0]
    if rows > 1 and rows != n and n * layers != rows and all(o[0].shape[2] == o[1].shape[2] == rows for o in own):
        return (
            f"likely cause: {prefill} cache_kv holds {rows} positions in every layer, the batch's {rows} rows: the "
            f"cache's length advances by the batch size instead of the tokens written: {BY_ROWS}"
        ), "knob:position_offset"
    if layers > 1 and n * layers != rows and all(s == n * layers for s in sizes):
        heads_right = all(
            same(o[0][:, :, :n], w[0]) and same(o[1][:, :, :n], w[1]) for o, w in zip(own, want, strict=True)
        )
        if heads_right:
            return (
                f"likely cause: {prefill} every layer's entry holds {n * layers} positions, {layers} (the layers) "
                f"times the {n} written, and its first {n} are the specified keys and values: the cache's length is "
                "advanced by every layer that writes (once per layer, not once per call), so the next call's "
                "positions and slots start too far on. Fix: advance the length once per call (or keep one per layer "
                "and read layer 0's)"
            ), "knob:position_offset"
    if any(s != n for s in sizes):
        return (
            f"note: {prefill} cache_kv holds {', '.join(map(str, sizes))} positions in layers 0 to {len(own) - 1} "
            f"({n} in each expected): each layer's entry should hold exactly the positions written to it"
        ), ""
    return None


def _row_stride(own, want, same) -> int | None:
    """The row stride ``s`` of a slot index ``row * s + position`` that gives ``own`` (every layer's keys and values
    ``[B, H, S, d]``, row ``b`` read from slots ``b * C ..`` of one buffer) from the reference's ``want``: the rows
    written one after the other, a later row's write over an earlier's, slots never written zeros. ``s`` from 0
    (every row in one place) to ``S - 1``; ``C`` the ``S`` positions read, or a row's region larger than every write
    (a buffer of context_length slots a row). None where none fits, or where the reference's rows are alike."""
    rows, steps = want[0][0].shape[0], want[0][0].shape[2]
    if rows < 2 or any(
        not isinstance(t, torch.Tensor) or t.shape != r.shape for o, w in zip(own, want) for t, r in zip(o, w)
    ):  # a layer holding nothing (None), or another layout: other readings say so
        return None
    if same(want[0][0][0], want[0][0][1]):  # the reference's rows alike: nothing to tell apart
        return None

    def written(w, stride, region):  # what each row reads back: [B, H, S, d]
        buffer = torch.zeros(rows * region, w.shape[1], w.shape[3], dtype=w.dtype, device=w.device)
        for r in range(rows):
            buffer[r * stride : r * stride + steps] = w[r].transpose(0, 1)
        return torch.stack([buffer[b * region : b * region + steps].transpose(0, 1) for b in range(rows)])

    for region in (steps, rows * steps):
        for stride in range(steps):
            if all(same(o[i], written(w[i], stride, region)) for o, w in zip(own, want) for i in (0, 1)):
                return stride
    return None


def held_otherwise(spec, cache, n: int) -> bool:
    """Whether the implementation's ``cache`` (after the test's own run of ``n`` tokens) holds another number of
    positions than ``n`` in its first layer, or cannot be read: the cheap check before ``cache_length_reading``."""
    impl = getattr(spec.impl, "_subject", spec.impl)
    try:
        return impl.cache_kv(cache, 0)[0].shape[-2] != n
    except Exception:  # noqa: BLE001 - unreadable here: the reading decides
        return True


def _keys_rotated_further(ref, own, want, config, same) -> dict[int, int]:
    """``{layer: offset}`` where every layer's cached values equal the reference's and some layers' keys equal the
    reference's keys rotated by a constant number of positions more (RoPE composes: rope(k at p, d) is k at p + d);
    empty otherwise (no RoPE, other differences, or an offset that fits no layer)."""
    if config.get("family", "llama") != "llama" or not all(same(o[1], w[1]) for o, w in zip(own, want)):
        return {}
    theta = float(config.get("rope_theta", 10000.0))

    def turned(k, d):  # the reference's rope of k by d positions more (the subject is in the declared style)
        try:
            return ref.rope(k, torch.full((k.shape[2],), d, dtype=torch.long, device=k.device), theta)
        except Exception:  # noqa: BLE001 - a reading never breaks the check it annotates
            return None

    found = {}
    for layer, (o, w) in enumerate(zip(own, want)):
        if same(o[0], w[0]):
            continue
        n = w[0].shape[2]
        offset = next((d for d in range(-2 * n, 2 * n + 1) if d and _same_or_none(same, o[0], turned(w[0], d))), None)
        if offset is None:
            return {}
        found[layer] = offset
    return found


def _same_or_none(same, a, b) -> bool:
    return b is not None and same(a, b)


def cache_length_reading(spec, config, sd, first, second) -> tuple[str, str] | None:
    """``(cause, code)`` from how many positions the implementation's cache holds after two calls (``first``, then
    ``second``), where the reference's holds both: exactly the second call's length (the cached length set to the
    new chunk's length instead of advanced by it), the first's (not advanced by the second call), two (advanced by
    one per call, not by the call's tokens) or the first's plus one (the first call counted, later ones by one).
    None otherwise, where the count fits two of these, where cache_kv cannot be read, or with a sliding window
    (whose layers may keep fewer positions: amendment 27)."""
    ref = getattr(spec.expectations, "reference", None)
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    if ref is None or not impl.provides("cache_kv") or config.get("sliding_window"):
        return None

    def shapes(m):  # each layer's keys' and values' shapes after the two calls
        model = models.build(m, config, sd)
        cache = m.new_cache(model, first.shape[0])
        m.forward(model, first, cache)
        m.forward(model, second, cache)
        return {tuple(tuple(t.shape) for t in m.cache_kv(cache, layer)) for layer in range(config["n_layers"])}

    try:
        own = shapes(impl)
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return None
    n1, n2 = first.shape[1], second.shape[1]
    (want,) = shapes(ref)
    if len(own) != 1:
        return None
    (held_shapes,) = own
    # the same layout but for the time axis: its length is what differs (a cache grown along another axis is not)
    if len(held_shapes) != 2 or any(len(h) != 4 or h[:2] + h[3:] != w[:2] + w[3:] for h, w in zip(held_shapes, want)):
        return None
    held = held_shapes[0][2]
    if held_shapes[1][2] != held or held == n1 + n2:
        return None
    said = (
        f"after a prefill of {n1} token{'s' * (n1 != 1)} and a call with {n2} more, cache_kv holds {held} "
        f"position{'s' * (held != 1)} ({n1 + n2} written)"
    )
    if held == 2 and 2 in (n1, n2):
        return None  # one position per call, or one call's length: the count cannot tell which
    if held == 2:
        return f"likely cause: {said}: {ONE_PER_CALL}", "knob:position_offset"
    if held == n2 == n1:
        return (
            f"likely cause: {said}: the cached length is not advanced by the second call (or is set to each call's "
            "length), so later calls write over earlier positions and take positions from the wrong offset. Fix: "
            "cached length += the new tokens' count at every call"
        ), "knob:position_offset"
    if held == n2:
        return (
            f"likely cause: {said}: the cached length is set to the new call's length instead of advanced by it, so "
            "later calls write over earlier positions and take positions from the wrong offset. Fix: cached length "
            "+= the new tokens' count"
        ), "knob:position_offset"
    if held == n1 + 1 and n2 > 1:  # a prefill path of its own, then a decode index (held out 83)
        return (
            f"likely cause: {said}: the first call is counted in full and the second advances the cached length by "
            "one instead of by its tokens (a decoding index that assumes one token per step), so the next call writes "
            "over its positions. Fix: advance the cached length by the number of tokens each call writes"
        ), "knob:position_offset"
    if held == n1:
        return (
            f"likely cause: {said}: the cached length is not advanced by the second call, so its keys and values are "
            "not attended (or are overwritten by the next). Fix: cached length += the new tokens' count at every call"
        ), "knob:position_offset"
    return None


def chunk_hint(cached, full, chunks) -> tuple[str | None, str]:
    """``(hint, code)`` from which chunks are wrong: already the first single token (a decode path of
    its own), only multi-token chunks that follow cached tokens (chunked prefill: the mask), or every
    chunk after the first (what the cache hands on). Later chunks read what earlier ones cached, so
    only the first wrong chunk is clean evidence of its own."""
    if cached.shape != full.shape or len(chunks) < 2:
        return None, ""
    spans, start = [], 0
    for n in chunks:
        right = torch.allclose(cached[:, start : start + n], full[:, start : start + n], rtol=1e-4, atol=1e-6)
        spans.append((start, n, right))
        start += n
    wrong = [(s, n) for s, n, ok in spans if not ok]
    if not wrong:
        return None, ""
    if chunks[0] == 1 and not spans[0][2]:
        return (
            "note: the very first step, one token into an empty cache, already differs from the uncached forward, "
            "so no earlier call's keys and values are to blame: either what this call writes to the cache is read "
            "back wrong (keys and values stored in each other's place, or in another layout), or one token (T = 1) "
            "is computed differently from a whole sequence (the model's own decoding path, or a mistake invisible "
            "at T = 1 such as heads split without a transpose); test_model.py's logits tests tell the second"
        ), ""
    later_multi = [ok for s, n, ok in spans if s > 0 and n > 1]
    later_single = [ok for s, n, ok in spans if s > 0 and n == 1]
    if later_multi and not any(later_multi) and any(later_single) and all(s > 0 and n > 1 for s, n in wrong):
        return (
            "likely cause (weak evidence): only multi-token chunks that follow cached tokens are wrong (T_q > 1 with "
            "T_k > T_q); single new tokens after the cache are right, so positions continue correctly: most often the "
            "causal mask of a chunk is aligned top-left (is_causal=True in scaled_dot_product_attention is top-left "
            "when T_q != T_k), or whatever the cached path does only for several new tokens. Fix: mask key j for "
            "query i unless j <= i + (T_k - T_q)"
        ), "~knob:mask_alignment"
    if spans[0][2] and all(s > 0 for s, _ in wrong):
        return (
            "likely cause (weak evidence): the first chunk is right and the later ones are not, so what the cache "
            "hands on is wrong: positions that do not continue from the cache length (most often), or a causal mask "
            "aligned top-left when new tokens follow cached ones. Fix: positions = arange(cached, cached + T); mask "
            "j <= i + (T_k - T_q)"
        ), "~knob:position_offset"
    return None, ""


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("kv_cache", "cache_positions")
@pytest.mark.parametrize(
    "chunks",
    [[1] * T, [T], [6, 1, 1, 9], [4, 7, 6], [1, 16]],
    ids=["token-by-token", "one-prefill", "prefill+decode+chunk", "chunked-prefill", "1+rest"],
)
def test_cached_logits_equal_full_forward(spec, config, chunks):
    """Logits computed chunk by chunk through the cache equal one uncached forward: ids follow the cached tokens and
    positions continue from the cache length (protocol: forward with cache; course notes: KV cache)."""
    check_chunks(spec, config, chunks, seed=21)


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("kv_cache")
@pytest.mark.parametrize("chunks", [[32], [16, 16], [31, 1]], ids=["one-call", "two-halves", "to-the-last-token"])
def test_a_cache_filled_to_a_context_of_32(spec, family, chunks):
    """A model whose context_length is 32, a multiple of the usual cache block sizes (4, 8, 16, 32), takes its whole
    context through a fresh cache in one call, in two halves and up to its last token, and gives the uncached logits
    (protocol: forward with cache): filling a cache to exactly context_length is accepted. A paged or preallocated
    cache that counts its blocks one off at an exact multiple of its block size fails only at such a length; the
    shared configs' contexts are deliberately not such multiples."""
    check_chunks(spec, models.family_config(spec.impl, family, context_length=32), chunks, seed=25)


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("kv_cache", "cache_positions", "causal_mask")
@given(chunks=chunkings(T))
def test_cache_equals_no_cache_for_any_chunking(spec, config, chunks):
    """For every split of a sequence into chunks, cached logits equal the uncached logits (course notes: KV cache)."""
    check_chunks(spec, config, chunks, seed=23)


def _head_count_causes(shape, want, config) -> tuple[str, ...]:
    """The cause where a cache entry holds ``n_heads`` heads where ``n_kv_heads`` belong, every other size right: it is
    sized by the query heads."""
    if not isinstance(shape, tuple):  # not a tensor's shape (_shape of None): nothing to read
        return ()
    heads = config["n_heads"]
    if len(shape) != 4 or shape[1] == want[1] or shape[1] != heads or (shape[0], shape[3]) != (want[0], want[3]):
        return ()
    return (
        f"likely cause: the cache holds n_heads = {heads} heads per position where n_kv_heads = {want[1]} belong: it "
        f"is sized by the query heads, so with GQA most of it stays zeros, or keys repeated per query head, which "
        f"attention reads. Fix: allocate and fill [B, n_kv_heads, T, d_head], the keys and values before repeat_kv",
    )


def _layout_causes(shape, want) -> tuple[str, ...]:
    """The wrong-axis cause only where the evidence pins it: the right sizes in another order, or the
    right number of elements in another shape (a concatenation on another axis)."""
    if not isinstance(shape, tuple) or shape == want or len(shape) != len(want):
        return ()
    if sorted(shape) == sorted(want) or math.prod(shape) == math.prod(want):
        return (
            "likely cause: the cache is laid out or appended along the wrong axis. Fix: [B, n_kv_heads, "
            "T_cached, d_head], new keys and values concatenated on the time axis (dim -2)",
        )
    return ()


def carried_over(spec, config, model, batch: int) -> tuple[str | None, tuple[str, ...]]:
    """``(subject, causes)`` where a new cache of ``model`` already holds keys another cache holds, before anything
    is forwarded into it (``shares_a_position``: not zeros or uninitialised memory): another new cache made just
    before, or one filled with 5 tokens just before. Where a prefill through a third new cache then gives other
    logits than without a cache (or raises), the caches themselves share it: new_cache is charged; else cache_kv,
    which reads them from elsewhere. ``(None, ())`` where nothing carries over or the caches cannot be read."""
    raw = getattr(spec.impl, "_subject", spec.impl)  # a side reading: no crash probing
    ids = spec.inputs.token_ids(batch, 5, vocab=config["vocab_size"], seed=34)

    def keys(cache):
        return raw.cache_kv(cache, 0)[0]

    def shared_after(fill: bool) -> tuple[torch.Tensor, int]:  # a new cache's keys, and how many another one holds
        first = raw.new_cache(model, batch)
        if fill:
            raw.forward(model, ids, first)
        k = keys(raw.new_cache(model, batch))
        return k, shares_a_position(k, keys(first))

    try:
        k, shared = shared_after(False)  # two new caches holding the same keys (what earlier tests wrote)
        if not shared:
            k, shared = shared_after(True)
    except Exception:  # noqa: BLE001 - whatever the implementation raises: nothing is read
        return None, ()
    if not shared:
        return None, ()
    try:
        through = raw.forward(model, ids, raw.new_cache(model, batch))
        right = mismatch(through, raw.forward(model, ids), tolerance("model", device=spec.device)) is None
    except Exception:  # noqa: BLE001 - a prefill through it raises: the cache carries what it holds
        right = False
    said = f"a new cache already holds {k.shape[2]} positions, {shared} of them keys another cache was given"
    if right:
        return "cache_kv", (
            f"likely cause: {said}, while a prefill through a new cache gives the logits of no cache: cache_kv reads "
            "them from elsewhere than the cache it is given (a module-level or last-used cache). Fix: read the given "
            "cache's own keys and values",
        )
    return "new_cache", (
        f"likely cause: {said}, and a prefill through a new cache gives other logits than without one: new_cache "
        "hands on an earlier cache's state (a singleton or module-level workspace reused without its length reset). "
        "Fix: each new cache starts empty, with storage or a length of its own",
    )


def carried_over_causes(spec, config, model, shape, want) -> tuple[str | None, tuple[str, ...]]:
    """``carried_over`` where the cache holds more time steps than written (the other axes right)."""
    shape = tuple(shape)
    if len(shape) != 4 or shape[:2] != want[:2] or shape[3] != want[3] or shape[2] <= want[2]:
        return None, ()
    return carried_over(spec, config, model, want[0])


def _time_steps_held(shape, want) -> str:
    """A plain description when only the time axis differs: how many steps the cache holds."""
    if not isinstance(shape, tuple):  # not a tensor's shape (_shape of None)
        return ""
    if len(shape) == 4 and shape[:2] == want[:2] and shape[3] == want[3] and shape[2] != want[2]:
        return f": it holds {shape[2]} time steps, {want[2]} expected after chunks of 5 and 4 tokens"
    return ""


CONTENTS_ON_A_RIGHT_MODEL = "the cache's contents are judged on a model whose logits are right"
CACHED_KEYS_CANNOT_MATCH = "fails its own tests, so the cached keys cannot match"
PREFILL_DIFFERS = (
    "your prefill through the cache gives other logits than your uncached forward "
    "(test_cached_logits_equal_full_forward), or the cache counts one position for the prefill's many: what the cache "
    "holds is new_cache's mistake"
)


WRITTEN_ELSEWHERE = (
    "your cached path writes keys that are right but for where they go (rotated at a count off by a constant in some "
    "layers, one position per call, or every row of the batch to one place): where a call through the cache writes "
    "is new_cache's bookkeeping, which test_cached_logits_equal_full_forward judges; cache_kv reads back what was "
    "written"
)


def written_elsewhere(read) -> bool:
    """Whether ``cache_reading``'s ``read`` says the cached path wrote right values to the wrong place: positions
    off by a constant, or the rows into one another's slots."""
    return read is not None and read[1] in ("knob:position_offset", "knob:cache_slots")


MODEL_KEYS = (
    "your model fails its own tests (forward), and its cache, fed the same tokens in chunks, gives its own uncached "
    "logits: the cache holds the keys its model computes, so a key that is not a rotation of itself is the model's "
    "RoPE (test_logits_match_reference), not what cache_kv reads. Fix forward first"
)


def chunks_read_back(spec, config, sd, ids) -> bool:
    """Whether the implementation's own forward through its cache, fed ``ids`` in chunks [5, 4], gives its own
    uncached logits: every chunk after the first attends keys and values the cache handed on, so the cache holds what
    its attention computes (held out: a model whose complex RoPE table, cast to a real dtype, keeps only the cosine,
    its cache right for it)."""
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side computation: no crash probing
    try:
        model = models.build(impl, config, sd)
        cache = impl.new_cache(model, ids.shape[0])
        chunked = torch.cat([impl.forward(model, ids[:, :5], cache), impl.forward(model, ids[:, 5:], cache)], dim=1)
        return mismatch(chunked, impl.forward(model, ids), tolerance("model", device=spec.device)) is None
    except Exception:  # noqa: BLE001 - what does not run reads nothing back
        return False


def prefill_reads_back(spec, config, sd, ids) -> bool:
    """Whether the implementation's own prefill of ``ids`` through its cache gives its uncached logits, and the cache
    then holds more than one position: what the cache stores is what its attention reads back, and its count of
    positions grows by the prefill's tokens. A cache that stores keys as values fails this, and so does one whose
    length is advanced by one per call (forward's bookkeeping, not cache_kv's reading); RoPE on values, rotated alike
    on both paths, passes (its contents are cache_kv's to answer for)."""
    impl = getattr(spec.impl, "_subject", spec.impl)  # a side computation: no crash probing
    model = models.build(impl, config, sd)
    cache = impl.new_cache(model, ids.shape[0])
    cached = impl.forward(model, ids, cache)
    if mismatch(cached, impl.forward(model, ids), tolerance("model", device=spec.device)) is not None:
        return False
    try:
        held = impl.cache_kv(cache, 0)[0].shape[-2]
    except Exception:  # noqa: BLE001 - unreadable: cache_kv's own tests say so
        return True
    return ids.shape[1] == 1 or held != 1


@judges("cache_kv", "new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("kv_cache", "rope_on_values")
def test_cache_layout_rotated_keys_plain_values(spec, config):
    """cache_kv(cache, layer) is [B, n_kv_heads, T_cached, d_head], appended in time order; keys are stored after RoPE
    and values as projected (course notes: KV cache concatenated along the wrong axis; protocol: KV cache).

    What cache_kv returns is judged on a cache filled by one prefill of 9 tokens: the same token at positions 1 and 6
    of a llama model: at layer 0 its value is the same at both positions (values carry no rotation), and its key
    differs between them while keeping its length (keys are stored rotated). Lengths, not angles, are compared, so a
    wrong RoPE frequency is left to the RoPE and model tests. Then the cache after chunks [5, 4] holds what one
    prefill holds. cache_kv reads both caches alike, so a difference there is in how forward appends to a cache,
    which the logits relations above judge (new_cache): where those fail, this part is left to them.
    """
    sd = models.random_state_dict(config, seed=25, device=spec.device)
    ids = spec.inputs.token_ids(2, 9, vocab=config["vocab_size"], seed=26)
    ids[:, 6] = ids[:, 1]
    failing = spec.failing(("new_cache",))
    if failing and not prefill_reads_back(spec, config, sd, ids):
        raise spec.defer(failing, "cache_kv is judged on a cache whose prefill gives the uncached logits",
                         f"not judged: {PREFILL_DIFFERS}")  # fmt: skip
    model = models.build(spec.impl, config, sd)

    def contents(chunks):
        cache = spec.impl.new_cache(model, 2)
        start = 0
        for n in chunks:
            spec.impl.forward(model, ids[:, start : start + n], cache)
            start += n
        return [tuple(spec.impl.cache_kv(cache, layer)) for layer in range(config["n_layers"])]

    want = (2, models.n_kv(config), 9, models.d_head(config))
    prefill = contents([9])
    for layer, (k, v) in enumerate(prefill):
        right = _shape(k) == want and _shape(v) == want
        tensors = isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        layout = _head_count_causes(_shape(k), want, config) or _layout_causes(_shape(k), want)
        layout = layout or _layout_causes(_shape(v), want)
        subject, carried = (
            (None, ()) if right or layout or not tensors else carried_over_causes(spec, config, model, k.shape, want)
        )
        read = () if right or layout or carried else as_reading(cache_reading(spec, config, sd, ids))[0]
        spec.require(
            right,
            behaviour=f"layer {layer} cache is [B, n_kv_heads, T_cached, d_head] = {want} after a prefill of 9 tokens",
            found=f"k {_shape(k)}, v {_shape(v)}",
            subject=subject,
            causes=layout or carried or read,
            codes=("knob:cache_contents",) if carried or read else ("shape",),
        )
    if config["family"] == "llama":
        k, v = prefill[0]
        try:
            spec.close(
                v[:, :, 6],
                v[:, :, 1],
                kind="model",
                axes="b h d",
                behaviour="layer 0: the same token's value at positions 1 and 6 is the same (no RoPE on values)",
            )
            spec.close(
                k[:, :, 6].norm(dim=-1),
                k[:, :, 1].norm(dim=-1),
                kind="model",
                axes="b h",
                behaviour="layer 0: the same token's key has the same length at positions 1 and 6 (a rotation)",
            )
            moved = (k[:, :, 6] - k[:, :, 1]).abs().max().item()
            spec.require(
                moved > 1e-6,
                behaviour="layer 0: the same token's key differs between positions 1 and 6 (keys are cached after "
                "RoPE)",
                found=f"they differ by at most {moved:.3g}",
                causes=(
                    "likely cause: the cache stores keys before RoPE (rotated later, or not at all). Fix: "
                    "rotate the new keys at their positions, then append them",
                ),
                codes=("knob:cache_contents",),
            )
        except SpecFailure:  # the prefill wrote right keys to the wrong place: new_cache's, while it fails its tests
            failing = spec.failing(("new_cache",))
            if failing and written_elsewhere(cache_reading(spec, config, sd, ids)):
                raise spec.defer(failing, "cache_kv is judged on a cache its prefill wrote in place",
                                 f"not judged: {WRITTEN_ELSEWHERE}") from None  # fmt: skip
            failing = spec.failing(("forward",))
            if failing and chunks_read_back(spec, config, sd, ids):
                raise spec.defer(failing, "cache_kv is judged on keys its model rotates as RoPE does",
                                 f"not judged: {MODEL_KEYS}") from None  # fmt: skip
            raise
    chunked = contents([5, 4])
    appended = "the cache after chunks [5, 4] equals the cache after one prefill of 9 tokens (time order)"
    failing = spec.failing(("new_cache",))
    if failing and (
        any(_shape(k) != want or _shape(v) != want for k, v in chunked)
        or mismatch(chunked, prefill, tolerance("model", device=spec.device)) is not None
    ):
        raise spec.defer(
            failing,
            appended,
            f"not judged here: it differs, and {', '.join(failing)} fails its own tests (forward appends to a cache "
            "wrongly: cache_kv reads both caches alike)",
        )
    for layer, (k, v) in enumerate(chunked):
        spec.require(
            _shape(k) == want and _shape(v) == want,
            behaviour=f"layer {layer} cache is [B, n_kv_heads, T_cached, d_head] = {want} after chunks [5, 4]",
            found=f"k {_shape(k)}, v {_shape(v)}{_time_steps_held(_shape(k), want)}",
            causes=_layout_causes(_shape(k), want) or _layout_causes(_shape(v), want),
            codes=("shape",),
        )
    spec.close(chunked, prefill, kind="model", axes="b h t d", behaviour=appended)


@judges("cache_kv", uses=("build_model", "forward", "new_cache"))
@pytest.mark.bug_class("kv_cache", "rope_on_values")
def test_cache_holds_the_specified_keys_and_values(spec, config):
    """cache_kv holds exactly the reference's keys (after RoPE, at their positions) and values (as projected),
    layer by layer (protocol: KV cache).

    RoPE is relative: keys rotated at shifted positions leave every logit unchanged, so only the cache's
    contents show it. Judged after one prefill of 9 tokens (that chunks append to it as one prefill fills it is
    test_cache_layout_rotated_keys_plain_values's relation), where the model's logits are right; where it fails
    with a failing model, it defers to it (the relations above still judge the cache). These configs have no attention
    window, so every position is held; only a sliding layer's cache may drop old keys (amendment 27, judged in
    test_sliding_window.py::test_sliding_cache_holds_the_last_keys_and_values).
    """
    sd = models.random_state_dict(config, seed=29, device=spec.device)
    ids = spec.inputs.token_ids(2, 9, vocab=config["vocab_size"], seed=30)

    def contents(m, sd, ids):
        model = models.build(m, config, sd)
        cache = m.new_cache(model, 2)
        m.forward(model, ids, cache)
        return [tuple(m.cache_kv(cache, layer)) for layer in range(config["n_layers"])]

    reading = functools.cache(lambda: cache_reading(spec, config, sd, ids))
    with spec.unless_failing(("forward", "build_model"), CONTENTS_ON_A_RIGHT_MODEL, CACHED_KEYS_CANNOT_MATCH):
        spec.check(
            contents,
            sd,
            ids,
            kind="model",
            axes="b h t d",
            given=[
                (("new_cache",), lambda: prefill_reads_back(spec, config, sd, ids), PREFILL_DIFFERS),
                # only while new_cache fails tests of its own: keys one position off leave every logit as it is (RoPE
                # is relative), and then this check is where the mistake shows, said by its reading
                (
                    ("new_cache",),
                    lambda: not (spec.failing(("new_cache",)) and written_elsewhere(reading())),
                    WRITTEN_ELSEWHERE,
                ),
            ],
            behaviour="cache_kv(cache, layer) = (keys after RoPE, values as projected) after one prefill of 9 tokens; "
            "[i] is layer i, [i][0] keys, [i][1] values",
            variants=[
                Variant(
                    "knob:cache_contents",
                    f"cache_kv(cache, i) gives the {which} layer's keys and values for every layer i: the layers share "
                    "one buffer (a list made by repetition, [buffer] * n_layers), so each write lands where every "
                    "layer reads, or every layer is read back from the same place (an index or offset that ignores "
                    "the layer)",
                    "give each layer its own key and value buffers ([make() for _ in range(n_layers)]), and read "
                    "layer i's entry from layer i's place",
                    lambda ref, sd, ids, at=at: [contents(ref, sd, ids)[at]] * config["n_layers"],
                )
                for which, at in (("last", -1), ("first", 0))
            ],
            readings=[lambda tol: as_reading(reading())],
        )


def _shape(t) -> tuple | str:
    """A tensor's shape as a tuple, anything else by its type's name (a cache_kv that gives None for a layer)."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def as_reading(read: tuple[str, str] | None) -> tuple[list[str], list[str]]:
    """A ``(cause, code)`` of ``cache_reading`` as a reading's ``(lines, codes)``."""
    return ([read[0]], [read[1]] if read[1] else []) if read else ([], [])


@judges("cache_kv", "new_cache", uses=("build_model",))
@pytest.mark.bug_class("kv_cache")
def test_a_fresh_cache_holds_no_positions(spec, family):
    """cache_kv of a cache no forward has filled yet holds no positions: keys and values of
    [B, n_kv_heads, 0, d_head], or (None, None); it may also raise, having nothing to give (protocol: new_cache, "an
    empty cache"; amendment 34). A preallocated cache that hands back its whole buffer, zeros included, holds
    positions nothing wrote. Where a new cache holds keys another cache holds (``carried_over``) and a prefill through
    a new cache gives other logits than without one, the caches share state and new_cache is charged (it hands on an
    earlier cache's state); else cache_kv is (it reads them from elsewhere than the cache given)."""
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=33, device=spec.device))
    cache = spec.impl.new_cache(model, 2)
    want = (2, models.n_kv(config), 0, models.d_head(config))
    raw = getattr(spec.impl, "_subject", spec.impl)  # a raise is an answer here, not a crash to report
    shapes = []
    for layer in range(config["n_layers"]):
        try:
            held = raw.cache_kv(cache, layer)
        except Exception:  # noqa: BLE001 - nothing to give: allowed (amendment 34)
            continue
        shapes.append(tuple(None if t is None else tuple(t.shape) for t in held))
    empty = all(shape in ((want, want), (None, None)) for shape in shapes)
    heads = next((c for k, _ in shapes if k is not None for c in _head_count_causes(k, want, config)), None)
    if heads:  # a cache made with the query heads' count is new_cache's: it allocates the cache
        subject, causes = "new_cache", (heads,)
    else:
        subject, causes = (None, ()) if empty else carried_over(spec, config, model, 2)
    spec.require(
        empty,
        behaviour=f"cache_kv of a fresh cache of 2 rows holds no positions ({list(want)}, or None) in any layer",
        found=f"(keys, values) shapes per layer {shapes}",
        subject=subject,
        causes=causes,
        codes=("knob:cache_contents",) if causes else (),
    )


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.bug_class("validation")
def test_cache_overflow_raises(spec, family):
    """Feeding tokens past context_length into a cache raises ValueError; filling it to exactly context_length is
    accepted (protocol: forward)."""
    config = models.family_config(spec.impl, family)
    model = models.build(spec.impl, config, models.random_state_dict(config, seed=27, device=spec.device))
    ctx = config["context_length"]
    ids = spec.inputs.token_ids(1, ctx + 1, vocab=config["vocab_size"], seed=28)
    full = spec.impl.new_cache(model, 1)
    spec.impl.forward(model, ids[:, : ctx - 2], full)
    out = spec.impl.forward(model, ids[:, ctx - 2 : ctx], full)
    spec.require(
        tuple(out.shape) == (1, 2, config["vocab_size"]),
        behaviour=f"{ctx - 2} cached + 2 new tokens (exactly context_length={ctx}) are accepted",
        found=f"logits shape {tuple(out.shape)}",
    )
    cache = spec.impl.new_cache(model, 1)
    spec.impl.forward(model, ids[:, : ctx - 2], cache)
    held = _steps_held(spec, cache)
    causes, codes = (
        (
            "likely cause: the context check ignores the cached tokens (or is off by one). Fix: raise ValueError "
            "when cached + new tokens exceed context_length",
        ),
        ("boundary",),
    )
    if held == 1 and ctx - 2 > 1:  # one call of several tokens, one step held: a count per call, or of the rows
        causes, codes = one_step_held(spec, model, ids[:, : ctx - 2])
    elif held != ctx - 2:  # the check may count right: the cache itself did not take the tokens
        causes = (f"note: after {ctx - 2} tokens the cache holds {held} time steps (cache_kv), so what it counts "
                  "is not what was fed: test_cached_logits_equal_full_forward tells more",)  # fmt: skip
        codes = ()
    elif not _continues(spec, model, ids[:, :ctx], ctx - 2):  # the check may be right on a wrong count
        causes = (f"note: after {ctx - 2} cached tokens the next 2 get other logits than your uncached forward "
                  "gives them, so the count of cached tokens the cache hands on (positions, the mask's offset, this "
                  "check) may be wrong: test_cached_logits_equal_full_forward tells more",)  # fmt: skip
        codes = ()
    spec.raises(
        ValueError,
        lambda: spec.impl.forward(model, ids[:, ctx - 2 :], cache),
        behaviour=f"{ctx - 2} cached + 3 new tokens with context_length={ctx} raise ValueError",
        causes=causes,
        codes=codes,
    )


def _continues(spec, model, ids, cached: int) -> bool:
    """Whether ``ids[:, cached:]`` fed after a prefill of ``ids[:, :cached]`` gets the implementation's own uncached
    logits for them: the cache hands on the right count of cached tokens (a side computation: no crash probing)."""
    raw = spec.impl._subject
    try:
        cache = raw.new_cache(model, ids.shape[0])
        raw.forward(model, ids[:, :cached], cache)
        stepped = raw.forward(model, ids[:, cached:], cache)
        return mismatch(stepped, raw.forward(model, ids)[:, cached:], tolerance("model", device=spec.device)) is None
    except (Exception, NotImplementedInImpl):  # noqa: BLE001 - a cached step that fails hands on nothing right
        return False


def one_step_held(spec, model, ids) -> tuple[tuple[str], tuple[str, ...]]:
    """``(causes, codes)`` where a cache of one row holds 1 time step after one call of ``ids`` (several tokens): a
    new cache of two rows fed the row twice tells a count per call (1 again, or the call raising: held out 79) from a
    count of the rows (2: held out 111)."""
    raw = spec.impl._subject  # unprobed: a side reading
    n = ids.shape[1]
    try:
        cache = raw.new_cache(model, 2)
        raw.forward(model, ids.repeat(2, 1), cache)
        two_rows = _steps_held(spec, cache)
    except Exception:  # noqa: BLE001 - a side reading; the test's own calls report crashes
        two_rows = None
    if two_rows == 2:
        return (f"likely cause: the cache's length advances by the batch size, not by the tokens: after one call of "
                f"{n} tokens a cache of one row holds 1 time step and one of two rows holds 2 (cache_kv): {BY_ROWS}",
                ), ("knob:position_offset",)  # fmt: skip
    if two_rows in (1, None):
        return (f"likely cause: the cache counts calls, not tokens: after one call of {n} tokens it holds 1 time step "
                "(cache_kv), so its length advances by one per call instead of by the tokens written (or it keeps "
                "only the newest position). Fix: advance the cache's length (its index or offset) by the number of "
                "tokens each call writes",), ("knob:cache_contents",)  # fmt: skip
    return (f"note: after one call of {n} tokens a cache of one row holds 1 time step (cache_kv), and one of two rows "
            f"{two_rows}: the cache does not count the tokens written",), ()  # fmt: skip


def _steps_held(spec, cache):
    """The time steps layer 0 of ``cache`` holds (``cache_kv``), or ``"an unknown number of"`` where cache_kv is
    not provided or fails (its own tests report that)."""
    raw = spec.impl._subject  # unprobed: a failing cache_kv is not this test's crash
    if not raw.provides("cache_kv"):
        return "an unknown number of"
    try:
        k = raw.cache_kv(cache, 0)[0]
        return int(k.shape[-2])
    except (Exception, NotImplementedInImpl):  # noqa: BLE001 - any failure of cache_kv leaves the count unknown
        return "an unknown number of"
