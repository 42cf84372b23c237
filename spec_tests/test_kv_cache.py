"""The KV cache: cached decoding equals the full forward for any chunking, positions continue
from the cache, the cache holds rotated keys and plain values on the time axis, and it refuses
to grow past the context."""

import pytest
import torch
from hypothesis import given

from . import inputs, models
from .assertions import assert_close, require, require_value_error
from .models import CONFIGS
from .strategies import chunkings
from .tolerances import EXACT

pytestmark = pytest.mark.component("kv_cache")

T = 17


@pytest.fixture(params=list(CONFIGS))
def config(request, impl):
    cfg = CONFIGS[request.param]
    impl.require_family(cfg["family"])
    return cfg


def cached_logits(m, cfg, sd, ids, chunks):
    """Feed ``ids`` through a fresh cache in consecutive chunks; concatenate the logits."""
    model = models.build(m, cfg, sd)
    cache = m.new_cache(model, ids.shape[0])
    out, start = [], 0
    for n in chunks:
        out.append(m.forward(model, ids[:, start : start + n], cache))
        start += n
    return torch.cat(out, dim=1)


@pytest.mark.bug_class("kv_cache", "positions")
@pytest.mark.parametrize(
    "chunks",
    [[1] * T, [T], [6, 1, 1, 9], [4, 7, 6], [1, 16]],
    ids=["token-by-token", "one-prefill", "prefill+decode+chunk", "chunked-prefill", "1+rest"],
)
def test_cached_logits_match_reference(spec, config, chunks):
    """Logits computed chunk by chunk through the cache equal the reference's full forward (course notes: KV cache; symptom: positions do not continue)."""
    sd = models.random_state_dict(config, seed=21, device=spec.device)
    ids = inputs.token_ids(2, T, vocab=config["vocab_size"], seed=22, device=spec.device)
    spec.check(
        lambda m, sd, ids: cached_logits(m, config, sd, ids, chunks),
        sd,
        ids,
        kind="model",
        component="kv_cache",
        behaviour=f"cached forward in chunks {chunks} equals the full forward",
    )


@pytest.mark.bug_class("kv_cache", "positions", "causal_mask")
@given(chunks=chunkings(T))
def test_cache_equals_no_cache_for_any_chunking(spec, config, chunks):
    """For every split of a sequence into chunks, cached logits equal the implementation's own uncached logits (course notes: KV cache)."""
    sd = models.random_state_dict(config, seed=23, device=spec.device)
    ids = inputs.token_ids(2, T, vocab=config["vocab_size"], seed=24, device=spec.device)
    full = spec.impl.forward(models.build(spec.impl, config, sd), ids)
    assert_close(
        cached_logits(spec.impl, config, sd, ids, chunks),
        full,
        tol=EXACT,
        component="kv_cache",
        behaviour=f"cached forward in chunks {chunks} equals one uncached forward",
    )


@pytest.mark.bug_class("kv_cache", "rope_on_values")
def test_cache_layout_rotated_keys_plain_values(spec, config):
    """cache_kv(cache, layer) is [B, n_kv_heads, T_cached, d_head]: keys after RoPE, values as projected, appended in time order (course notes: KV cache concatenated along the wrong axis; protocol: KV cache)."""
    sd = models.random_state_dict(config, seed=25, device=spec.device)
    ids = inputs.token_ids(2, 9, vocab=config["vocab_size"], seed=26, device=spec.device)

    def cache_contents(m, sd, ids):
        model = models.build(m, config, sd)
        cache = m.new_cache(model, 2)
        m.forward(model, ids[:, :5], cache)
        m.forward(model, ids[:, 5:], cache)
        return [tuple(m.cache_kv(cache, layer)) for layer in range(config["n_layers"])]

    want_shape = (2, models.n_kv(config), 9, models.d_head(config))
    got = cache_contents(spec.impl, sd, ids)
    for layer, (k, v) in enumerate(got):
        require(
            tuple(k.shape) == want_shape and tuple(v.shape) == want_shape,
            component="kv_cache",
            behaviour=f"layer {layer} cache is [B, n_kv_heads, T_cached, d_head] = {want_shape}",
            found=f"k {tuple(k.shape)}, v {tuple(v.shape)}",
        )
    spec.check(
        cache_contents,
        sd,
        ids,
        kind="model",
        component="kv_cache",
        behaviour="cache_kv(cache, layer) = (keys after RoPE, values as projected), in time order; "
        "[i] is layer i, [i][0] keys, [i][1] values",
    )


@pytest.mark.bug_class("context_overflow")
def test_cache_overflow_raises(spec, config):
    """Feeding tokens past context_length into a cache raises ValueError (protocol: forward)."""
    sd = models.random_state_dict(config, seed=27, device=spec.device)
    model = models.build(spec.impl, config, sd)
    ctx = config["context_length"]
    ids = inputs.token_ids(1, ctx + 1, vocab=config["vocab_size"], seed=28, device=spec.device)
    cache = spec.impl.new_cache(model, 1)
    spec.impl.forward(model, ids[:, : ctx - 2], cache)
    require_value_error(
        lambda: spec.impl.forward(model, ids[:, ctx - 2 :], cache),
        behaviour=f"{ctx - 2} cached + 3 new tokens with context_length={ctx} raise ValueError",
    )
