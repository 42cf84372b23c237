"""Sliding-window attention (protocol v2, capability ``sliding_window``, amendment 27; Mistral, Gemma 2, Qwen2).

Config key ``sliding_window`` (W) and, with the capability ``layer_types`` too, ``layer_types`` (per layer
``"sliding_attention"`` or ``"full_attention"``; every layer sliding by default, as Mistral). In a sliding layer
the query at position i attends the keys at positions j with ``i - W < j <= i``: exactly W keys, itself included,
counted from the query's own position (bottom-right aligned, as the causal mask, when new queries follow cached
keys). A full layer is v1's causal attention. The cache of a sliding layer may keep only its last W - 1 entries or
more; what is judged is that cached logits, in any chunking, and greedy generation equal the uncached model's past
the window.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from . import models, oracles
from .harness.diagnosis.variant import Variant
from .harness.judging.tolerances import tolerance
from .harness.plugin.markers import judges
from .harness.subject.subject import ImplementationError
from .inputs import S
from .test_generation import cache_consistent, check_tokens
from .test_kv_cache import CACHED_KEYS_CANNOT_MATCH, CONTENTS_ON_A_RIGHT_MODEL, check_chunks
from .test_kv_cache import T as CHUNKED_T

pytestmark = pytest.mark.component("model")

W = 5  # the models' window: the suite's 17-token sequences pass it three times
PATTERN = ["full_attention", "sliding_attention"]  # a full layer first (Qwen2's max_window_layers = 1)
FIX = "query i attends the keys j with i - W < j <= i (W keys, itself included) in sliding layers only"
MASK_FIX = "allow key j for query i iff j <= i + (t_k - t_q) and i + (t_k - t_q) - j < W"


def sliding_config(impl, pattern=None, **changes) -> dict:
    """The richest llama config the implementation supports, with ``sliding_window = W``: every layer sliding, or
    the ``layer_types`` ``pattern`` (capability ``layer_types``; ``"if supported"``: ``PATTERN`` where it is)."""
    impl.require_capability("sliding_window")
    if pattern == "if supported":
        pattern = PATTERN if "layer_types" in impl.capabilities else None
    if pattern is not None:
        impl.require_capability("layer_types")
        changes["layer_types"] = pattern
    return models.family_config(impl, "llama", **{"sliding_window": W, **changes})


# ------------------------------------------------------------------------------------------------- the mask


def top_left(t_q: int, t_k: int, w: int, device) -> torch.Tensor:
    """The window measured from the query's row instead of its position after the cached keys."""
    causal = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + (t_k - t_q)
    return (causal & (torch.arange(t_q)[:, None] - torch.arange(t_k)[None, :] < w)).to(device)


def mask_variants(spec, t_q: int, t_k: int, w: int) -> list[Variant]:
    dev = spec.device
    found = [
        Variant(
            "knob:sliding_window",
            "the window is one key too wide (i - j <= W: W + 1 keys)",
            MASK_FIX,
            lambda ref: ref.causal_mask(t_q, t_k, device=dev, window=w + 1),
        ),
        Variant(
            "knob:mask_alignment",
            "the window is measured from the query's row i, not from its position i + (t_k - t_q) after the "
            "cached keys (top-left: right only when t_q == t_k)",
            MASK_FIX,
            lambda ref: top_left(t_q, t_k, w, dev),
        ),
        Variant(
            "knob:sliding_window",
            "the window is ignored: the plain causal mask",
            MASK_FIX,
            lambda ref: ref.causal_mask(t_q, t_k, device=dev),
        ),
    ]
    if w > 1:
        found.append(
            Variant(
                "knob:sliding_window",
                "the window is one key too narrow (i - j < W - 1: the query itself not counted among its W keys)",
                MASK_FIX,
                lambda ref: ref.causal_mask(t_q, t_k, device=dev, window=w - 1),
            )
        )
    return found


@judges("causal_mask")
@pytest.mark.component("attention")
@pytest.mark.bug_class("sliding_window")
@pytest.mark.parametrize(
    "t_q,t_k,w",
    [(S.T, S.T, W), (4, S.T, W), (1, S.T, 3), (S.T, S.T + 6, 3), (6, 9, 1), (5, 7, S.T)],
    ids=["square", "chunk-after-cache", "decode", "long-chunk-after-cache", "window-1", "window-past-keys"],
)
def test_window_mask(spec, t_q, t_k, w):
    """causal_mask(t_q, t_k, window=W) is bool [t_q, t_k], True iff j <= i + (t_k - t_q) and i + (t_k - t_q) - j < W:
    each query sees the W keys up to its own position, itself included, bottom-right aligned as the causal mask
    (protocol: amendment 27)."""
    spec.impl.require_capability("sliding_window")
    mask = spec.impl.causal_mask(t_q, t_k, device=spec.device, window=w)
    spec.require(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
        behaviour="causal_mask(..., window=W) returns a bool tensor (True = may attend)",
        found=f"got {getattr(mask, 'dtype', type(mask).__name__)}",
    )
    spec.check(
        lambda m: m.causal_mask(t_q, t_k, device=spec.device, window=w),
        subject="causal_mask",
        axes="q k",
        variants=mask_variants(spec, t_q, t_k, w),
        behaviour=f"causal_mask({t_q}, {t_k}, window={w}): query i sees key j iff {t_k - t_q} + i - {w} < j <= "
        f"i + {t_k - t_q}",
    )


@judges("multihead_self_attention")
@pytest.mark.component("attention")
@pytest.mark.bug_class("sliding_window")
def test_multihead_attention_with_window(spec):
    """multihead_self_attention(..., window=W) attends only the last W keys up to each query (protocol: amendment
    27)."""
    spec.impl.require_capability("sliding_window")
    h_kv = S.H_KV if "gqa" in spec.impl.capabilities else S.H
    theta = 10000.0 if "llama" in spec.impl.families else None  # the window does not depend on RoPE
    x = spec.inputs.randn(S.B, S.T, S.d_model, seed=271)
    weights = (
        spec.inputs.fan_in_weight(S.H * S.D_HEAD, S.d_model, seed=272),
        spec.inputs.fan_in_weight(h_kv * S.D_HEAD, S.d_model, seed=273),
        spec.inputs.fan_in_weight(h_kv * S.D_HEAD, S.d_model, seed=274),
        spec.inputs.fan_in_weight(S.d_model, S.H * S.D_HEAD, seed=275),
    )
    spec.call(
        "multihead_self_attention",
        x,
        *weights,
        S.H,
        h_kv,
        theta,
        window=W,
        kind="attention",
        axes="b t d",
        behaviour=f"self-attention over {S.T} tokens, {h_kv} kv heads, window {W}",
    )


# ----------------------------------------------------------------------------------------------- the model


def model_variants(config: dict, call) -> list[Variant]:
    """The classic mistakes, as the reference computes them: ``call(ref, config, *args)``."""
    every = {k: v for k, v in config.items() if k != "layer_types"}
    found = [
        Variant("knob:sliding_window", "the window is ignored: every layer attends every earlier key", FIX,
                lambda ref, *a: call(ref, {k: v for k, v in every.items() if k != "sliding_window"}, *a)),
        Variant("knob:sliding_window", "the window is one key too wide (i - j <= W: W + 1 keys)", FIX,
                lambda ref, *a: call(ref, dict(config, sliding_window=W + 1), *a)),
        Variant("knob:sliding_window", "the window is one key too narrow (W - 1 keys)", FIX,
                lambda ref, *a: call(ref, dict(config, sliding_window=W - 1), *a)),
    ]  # fmt: skip
    if "layer_types" in config:
        found.append(
            Variant(
                "knob:sliding_window",
                f"layer_types {config['layer_types']} is ignored: every layer is windowed, the full ones too",
                FIX + "; a 'full_attention' layer is plain causal attention",
                lambda ref, *a: call(ref, every, *a),
            )
        )
    return found


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("sliding_window")
@pytest.mark.parametrize("pattern", [None, PATTERN], ids=["every-layer", "layer-types"])
def test_logits_match_reference_with_sliding_window(spec, pattern):
    """A model with sliding_window W (every layer, as Mistral; or a layer_types pattern with a full layer) gives the
    reference's logits for a sequence more than three windows long (protocol: amendment 27)."""
    config = sliding_config(spec.impl, pattern)
    sd = models.random_state_dict(config, seed=276, device=spec.device)
    ids = spec.inputs.token_ids(2, CHUNKED_T, vocab=config["vocab_size"], seed=277)
    models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        variants=model_variants(config, lambda ref, cfg, sd, ids: models.logits(ref, cfg, sd, ids)),
        behaviour=f"logits of a llama model with sliding_window={W}"
        + ("" if pattern is None else f", layer_types={pattern}")
        + f" for ids [2, {CHUNKED_T}]",
    )


@judges("build_model", uses=("forward",))
@pytest.mark.bug_class("sliding_window")
@pytest.mark.parametrize("wider", [0, 3], ids=["as-wide", "wider"])
def test_a_window_as_wide_as_the_context_is_allowed(spec, wider):
    """Any int W >= 1 is a window, one as wide as the context or wider too: no query can then see past it, so the
    model is v1's causal model (protocol: amendment 27). A check written 1 <= W < context_length rejects it."""
    ctx = models.family_config(spec.impl, "llama")["context_length"]
    config = sliding_config(spec.impl, sliding_window=ctx + wider)
    sd = models.random_state_dict(config, seed=278, device=spec.device)
    ids = spec.inputs.token_ids(2, CHUNKED_T, vocab=config["vocab_size"], seed=279)
    models.check_option_logits(
        spec,
        config,
        sd,
        ids,
        behaviour=f"logits of a llama model with sliding_window={ctx + wider}, context_length={ctx}, for ids "
        f"[2, {CHUNKED_T}]",
    )


def one_layer(spec, w: int, seed: int):
    """A one-layer sliding model (its logits at i see exactly the tokens its window holds) and its config."""
    config = sliding_config(spec.impl, sliding_window=w, n_layers=1)
    return models.build(spec.impl, config, models.random_state_dict(config, seed=seed, device=spec.device)), config


def with_token_changed(ids: torch.Tensor, p: int, vocab: int) -> torch.Tensor:
    changed = ids.clone()
    changed[:, p] = (ids[:, p] + 1 + p % 5) % vocab
    return changed


@judges("build_model", uses=("forward",))  # the window is the config's: judged as its logits test judges it
@pytest.mark.bug_class("sliding_window")
def test_window_holds_exactly_w_tokens(spec):
    """In a one-layer sliding model the logits at position i depend on the tokens i - W + 1 .. i and on no earlier
    one: changing token i - W leaves them unchanged, changing token i - W + 1 changes them (protocol: amendment
    27, W keys including the query's own)."""
    model, config = one_layer(spec, W, seed=278)
    ids = spec.inputs.token_ids(2, 12, vocab=config["vocab_size"], seed=279)
    i = 11
    base = spec.impl.forward(model, ids)[:, i]
    outside = spec.impl.forward(model, with_token_changed(ids, i - W, config["vocab_size"]))[:, i]
    spec.close(
        outside,
        base,
        kind="model",
        axes="b v",
        behaviour=f"logits at position {i} ignore the token at {i - W}, W = {W} positions back",
        hint=f"likely cause: the window holds W + 1 keys (i - j <= W). Fix: {FIX}",
        hint_code="knob:sliding_window",
    )
    inside = spec.impl.forward(model, with_token_changed(ids, i - W + 1, config["vocab_size"]))[:, i]
    tol = tolerance("model", device=spec.device)
    spec.require(
        not torch.allclose(inside.to(base.dtype), base, rtol=tol.rtol, atol=tol.atol),  # outside the tolerance
        behaviour=f"logits at position {i} depend on the token at {i - W + 1}, the oldest of the W = {W} keys",
        found=f"changing the token at {i - W + 1} leaves them unchanged (within {tol.describe()})",
        causes=(f"likely cause: the window holds W - 1 keys (the query itself not counted among them). Fix: {FIX}",),
        codes=("knob:sliding_window",),
    )


@judges("build_model", uses=("forward",))  # the window is the config's: judged as its logits test judges it
@pytest.mark.bug_class("sliding_window")
@given(data=st.data())
def test_tokens_before_the_window_never_matter(spec, data):
    """For any window W and query i, a one-layer sliding model's logits at i do not change when any token more than
    W - 1 positions before i changes (protocol: amendment 27)."""
    w = data.draw(st.integers(1, 6), label="W")
    i = data.draw(st.integers(w, 12), label="query")
    p = data.draw(st.integers(0, i - w), label="changed position")
    model, config = one_layer(spec, w, seed=280 + w)
    ids = spec.inputs.token_ids(2, 13, vocab=config["vocab_size"], seed=281)
    spec.close(
        spec.impl.forward(model, with_token_changed(ids, p, config["vocab_size"]))[:, i],
        spec.impl.forward(model, ids)[:, i],
        kind="model",
        axes="b v",
        behaviour=f"window {w}: logits at position {i} ignore the token at {p} ({i - p} positions back)",
        hint=f"likely cause: the window is too wide, or not applied. Fix: {FIX}",
        hint_code="knob:sliding_window",
    )


# ------------------------------------------------------------------------------------- the cache and generate


@judges("new_cache", uses=("build_model", "forward"))
@pytest.mark.component("kv_cache")
@pytest.mark.bug_class("sliding_window")
@pytest.mark.parametrize(
    "chunks,pattern",
    [([1] * CHUNKED_T, None), ([6, 1, 1, 9], None), ([4, 3, 5, 5], None), ([3, 8, 6], None), ([3, 8, 6], PATTERN)],
    ids=[
        "token-by-token",
        "prefill+decode+chunk",
        "chunks-within-the-window",
        "chunks-longer-than-the-window",
        "layer-types",
    ],
)
def test_cache_equals_no_cache_past_the_window(spec, chunks, pattern):
    """With a sliding window, logits fed chunk by chunk through the cache equal one uncached forward past the window:
    each new query's window ends at its own position after the cached tokens, on the cached path as on the
    uncached one, and the cache keeps (at least) every key a window still reaches (protocol: amendment 27)."""
    check_chunks(spec, sliding_config(spec.impl, pattern), chunks, seed=282)


def layer_types(config: dict) -> list[str]:
    return config.get("layer_types") or ["sliding_attention"] * config["n_layers"]  # Mistral's default


def held(config: dict, t_cached: int) -> list[int]:
    """Per layer, how many of the last cached entries the protocol requires: W - 1 in a sliding layer, all in a
    full one."""
    return [min(t_cached, W - 1) if t == "sliding_attention" else t_cached for t in layer_types(config)]


@judges("cache_kv", uses=("build_model", "forward", "new_cache"))
@pytest.mark.component("kv_cache")
@pytest.mark.bug_class("sliding_window")
def test_sliding_cache_holds_the_last_keys_and_values(spec):
    """Past the window, cache_kv of a sliding layer holds the last n cached positions in time order for some
    W - 1 <= n <= T_cached (a rolling cache may drop older keys), equal to the reference's; a full layer holds
    every position (protocol: amendment 27; KV cache). With the capability layer_types its model has a full layer."""
    config = sliding_config(spec.impl, "if supported")
    sd = models.random_state_dict(config, seed=283, device=spec.device)
    ids = spec.inputs.token_ids(2, 13, vocab=config["vocab_size"], seed=284)
    need = held(config, 13)

    def contents(m, sd, ids):
        model = models.build(m, config, sd)
        cache = m.new_cache(model, 2)
        m.forward(model, ids[:, :9], cache)
        m.forward(model, ids[:, 9:], cache)
        return [tuple(m.cache_kv(cache, layer)) for layer in range(config["n_layers"])]

    # chunks: the cached logits must be right too
    with spec.unless_failing(
        ("forward", "build_model", "new_cache"), CONTENTS_ON_A_RIGHT_MODEL, CACHED_KEYS_CANNOT_MATCH
    ):
        got = contents(spec.impl, sd, ids)
        for layer, ((k, v), n) in enumerate(zip(got, need)):
            sizes = {k.shape[-2], v.shape[-2]}
            spec.require(
                k.dim() == 4 and tuple(k.shape) == tuple(v.shape) and n <= k.shape[-2] <= 13,
                behaviour=f"layer {layer} ({layer_types(config)[layer]}) caches between {n} and 13 of the 13 positions",
                found=f"k {tuple(k.shape)}, v {tuple(v.shape)}"
                + (" (the cache drops a key the next query's window still reaches)" if max(sizes) < n else ""),
                causes=(
                    (
                        f"likely cause: a rolling cache of fewer than W - 1 = {W - 1} entries (or one on a full "
                        "layer). Fix: keep at least the last W - 1 keys and values of a sliding layer, every one of a "
                        "full layer",
                    )
                    if max(sizes) < n
                    else ()
                ),
                codes=("knob:sliding_window",) if max(sizes) < n else ("shape",),
            )
        spec.check(
            lambda m, sd, ids: [(k[..., -n:, :], v[..., -n:, :]) for (k, v), n in zip(contents(m, sd, ids), need)],
            sd,
            ids,
            kind="model",
            axes="b h t d",
            behaviour=f"the last {need} cached positions per layer (keys after RoPE, values as projected) after chunks "
            "[9, 4]; [i] is layer i, [i][0] keys, [i][1] values",
        )


@judges("generate", uses=("build_model", "forward", "new_cache"))
@pytest.mark.component("generation")
@pytest.mark.bug_class("sliding_window")
def test_greedy_generation_past_the_window(spec):
    """Greedy generation with the cache, 14 tokens past a 6-token prompt (four windows), picks the argmax of the
    model's own uncached logits token for token: the cache changes speed, never the result (protocol: generate;
    amendment 27). With the capability layer_types its model has a full layer."""
    config = sliding_config(spec.impl, "if supported")
    sd = models.random_state_dict(config, seed=285, device=spec.device)
    model = models.build(spec.impl, config, sd)
    prompt = spec.inputs.token_ids(2, 6, vocab=config["vocab_size"], seed=286)
    out = spec.impl.generate(model, prompt, 14, temperature=0.0, use_cache=True)
    want = oracles.greedy_teacher(spec.impl, model, prompt, 14, config["context_length"], use_cache=False)
    behaviour = f"greedy generate(use_cache=True) of 14 tokens with sliding_window={W} follows the uncached model"
    causes, codes = (
        (
            "likely cause: the window is not applied (or applied differently) on the cached path: each new token's "
            f"query must see only the last W keys up to its own position. Fix: {FIX}",
        ),
        ("knob:sliding_window",),
    )

    def own_cached():  # the tokens of the model's own cached forward: then the cache's tests are where it is wrong
        return oracles.greedy_teacher(spec.impl, model, prompt, 14, config["context_length"], use_cache=True)

    if not torch.equal(out.cpu(), want.cpu()):
        if not window_to_blame(spec, config, sd, prompt):
            causes, codes = (
                (
                    "note: greedy generation through the cache differs from the uncached model without a window "
                    "too, so the window is not what the cached path gets wrong: test_generation.py tells more",
                ),
                (),
            )
        cached = own_cached()
        if not torch.equal(out.cpu(), cached.cpu()):  # generate feeds the cache its own way
            causes, codes = cache_consistent(spec, model, prompt, 14, config, cached, out, behaviour, causes, codes)
    check_tokens(spec, out, want, behaviour=behaviour, rebase=(("new_cache",), own_cached), causes=causes, codes=codes)


def window_to_blame(spec, config, sd, prompt) -> bool:
    """Whether the same model without its window generates through the cache what it generates without it: only
    then can a cached generation that differs be the window's (positions or masks of the cached path that are wrong
    whatever the window fail there too)."""
    try:
        model = models.build(spec.impl, models.without_window(config), sd)
        out = spec.impl.generate(model, prompt, 14, temperature=0.0, use_cache=True)
    except ImplementationError:
        return False
    want = oracles.greedy_teacher(spec.impl, model, prompt, 14, config["context_length"], use_cache=False)
    return torch.equal(out.cpu(), want.cpu())


# ------------------------------------------------------------------------------------------------ validation

# case -> (the configs' changes, what a good message names, the layer_types pattern it needs)
BAD = {
    "window-below-1": ([{"sliding_window": 0}, {"sliding_window": -3}], "sliding_window", None),
    "layer-types-length": ([{}], "layer_types", ["sliding_attention"] * 3),
    "layer-types-unknown": ([{}], "local_attention", ["sliding_attention", "local_attention"]),
    "sliding-without-window": ([{"sliding_window": None}], "sliding_window", PATTERN),
}


@judges("build_model")
@pytest.mark.bug_class("validation")
@pytest.mark.parametrize("case", list(BAD))
def test_bad_sliding_window_raises(spec, case):
    """A window below 1 (0 and -3), and with the capability layer_types a pattern of the wrong length, with an
    unknown entry, or with sliding layers but no window, raise ValueError naming the value (protocol: amendment
    27)."""
    all_changes, word, pattern = BAD[case]
    for changes in all_changes:
        config = sliding_config(spec.impl, pattern, **changes)
        shown = dict(changes, **({} if pattern is None else {"layer_types": pattern}))
        spec.raises(
            ValueError,
            lambda config=config: spec.impl.build(config, None, seed=0),
            behaviour=f"build_model with {shown} raises ValueError",
            mention=(word,),
        )
