"""The whole model side by side (implementation under test, reference, Hugging Face Llama at
the same config and weights): forward, training step, prefill, and per-token decoding with and
without the KV cache against context length; peak memory and KV cache memory."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks import configs, timing


def dtype_name(sizes) -> str:
    return str(sizes.dtype).removeprefix("torch.")


def test_forward(make_contender, measure, sizes, token_ids, contender_name):
    contender = make_contender(contender_name)
    ids = token_ids(sizes.batch, sizes.seq_len)
    logits = measure(
        lambda: contender.logits(ids),
        group="forward",
        bench="forward",
        contender=contender_name,
        label=contender.label,
        batch=sizes.batch,
        T=sizes.seq_len,
        tokens=ids.numel(),
        dtype=dtype_name(sizes),
    )
    assert logits.shape == (*ids.shape, sizes.model["vocab_size"])


def train_step_benchmark(contender, measure, sizes, ids, group: str, device: str):
    x, y = ids[:, :-1], ids[:, 1:]
    optimizer = contender.optimizer()
    config = contender.model_config
    flops = configs.train_flops_per_token(config, x.shape[1]) * x.numel()
    loss = measure(
        lambda: contender.train_step(optimizer, x, y),
        group=group,
        bench="train_step",
        contender=contender.name,
        label=contender.label,
        batch=x.shape[0],
        T=x.shape[1],
        tokens=x.numel(),
        flops=flops,
        dtype=str(next(contender.model.parameters()).dtype).removeprefix("torch."),
        family=config.get("family", "llama"),
    )
    if not measure.smoke:  # after warm-up: the optimizer state already exists
        peak = timing.peak_memory_bytes(lambda: contender.train_step(optimizer, x, y), device)
        measure.benchmark.extra_info["peak_memory_bytes"] = peak
    assert isinstance(loss, float) and loss == loss, f"train_step returned {loss!r}, expected a finite float"


def test_train_step(make_contender, measure, sizes, token_ids, device, contender_name):
    contender = make_contender(contender_name)
    train_step_benchmark(contender, measure, sizes, token_ids(sizes.batch, sizes.seq_len + 1), "train_step", device)


def test_train_step_mfu(make_contender, measure, sizes, token_ids, device, contender_name):
    """GPU only: the training step of GPT-2 small in bf16, for model FLOPs utilisation."""
    if sizes.mfu_model is None:
        pytest.skip("model FLOPs utilisation is measured on CUDA only")
    if contender_name == "hf":
        pytest.skip("the Hugging Face comparison covers the llama family; this is GPT-2")
    contender = make_contender(contender_name, sizes.mfu_model)
    ids = token_ids(sizes.mfu_batch, sizes.mfu_seq_len + 1, vocab=sizes.mfu_model["vocab_size"])
    train_step_benchmark(contender, measure, sizes, ids, "train_step gpt2-small", device)


def kv_memory(contender, cache) -> tuple[int, int]:
    """(bytes of the cached K/V views, bytes of the storage behind them)."""
    tensors = contender.cache_tensors(cache)
    logical = sum(t.numel() * t.element_size() for t in tensors)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return logical, sum(storages.values())


def test_prefill(make_contender, measure, sizes, token_ids, device, impl, contender_name):
    contender = make_contender(contender_name)
    ids = token_ids(sizes.batch, sizes.seq_len)
    cache = measure(
        lambda: contender.prefill(ids),
        group="prefill",
        bench="prefill",
        contender=contender_name,
        label=contender.label,
        batch=sizes.batch,
        T=sizes.seq_len,
        tokens=ids.numel(),
        dtype=dtype_name(sizes),
    )
    if not measure.smoke:
        measure.benchmark.extra_info["peak_memory_bytes"] = timing.peak_memory_bytes(
            lambda: contender.prefill(ids), device
        )
    logical, storage = kv_memory(contender, cache)
    kv_bytes = (impl if contender_name == "impl" else _formula()).kv_cache_bytes(
        sizes.model, sizes.batch, sizes.seq_len, sizes.dtype
    )
    measure.benchmark.extra_info.update(kv_logical_bytes=logical, kv_storage_bytes=storage, kv_cache_bytes=kv_bytes)
    assert logical == kv_bytes, (
        f"{contender.label}: the cache holds {logical} bytes of K/V for {sizes.seq_len} tokens, "
        f"kv_cache_bytes says {kv_bytes}"
    )


def _formula():
    """``kv_cache_bytes`` of the reference (the protocol formula) for contenders other than the impl."""
    import reference

    return reference


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "nocache"])
def test_decode(make_contender, measure, sizes, token_ids, contender_name, decode_context, cached):
    """Latency of producing one more token after ``decode_context`` tokens: one cached step, or
    (without the cache) a forward over the whole ``decode_context + 1`` tokens.

    Every timed cached step starts from a copy of the same prefilled cache (copied untimed), so
    the context is exactly ``decode_context`` and no prefill runs between steps; an
    implementation whose cache cannot be deep-copied is prefilled again before each step.
    """
    contender = make_contender(contender_name)
    ids = token_ids(sizes.decode_batch, decode_context + 1)
    extra = dict(
        bench="decode",
        contender=contender_name,
        label=contender.label,
        context=decode_context,
        cached=cached,
        batch=sizes.decode_batch,
        tokens=sizes.decode_batch,
        dtype=dtype_name(sizes),
    )
    group = f"decode {'cache' if cached else 'no cache'} ctx={decode_context:04d}"
    if not cached:
        logits = measure(lambda: contender.logits(ids)[:, -1], group=group, warmup=1, min_rounds=3, **extra)
        assert logits.shape == (sizes.decode_batch, sizes.model["vocab_size"])
        return
    prefilled = contender.prefill(ids[:, :decode_context])
    token = ids[:, decode_context:]
    try:
        copy.deepcopy(prefilled)
        fresh_cache = lambda: (copy.deepcopy(prefilled), token)
    except Exception:  # noqa: BLE001 - any cache type that cannot be copied
        fresh_cache = lambda: (contender.prefill(ids[:, :decode_context]), token)
    logits = measure(lambda cache, tok: contender.decode(cache, tok)[0], setup=fresh_cache, group=group, **extra)
    assert logits.shape == (sizes.decode_batch, 1, sizes.model["vocab_size"])


def test_hf_matches_reference(sizes):
    """The side-by-side comparison is fair only if Hugging Face computes the same function:
    the same canonical weights give the same logits (float64, both RoPE styles). Hugging Face
    computes RoPE angles in float32, hence a relative tolerance of 1e-5 rather than float64's;
    the wrong RoPE pairing differs by more than the logits' own size."""
    from benchmarks import contenders, hf_llama

    if not hf_llama.available():
        pytest.skip("transformers is not installed")
    import reference

    config = configs.LLAMA_TINY
    weights = {k: w.double() * 10 for k, w in contenders.canonical_weights(config, seed=1).items()}
    ids = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))
    for style in ("interleaved", "half"):
        ours = reference.forward(reference.build_model(config, weights, rope_style=style).double(), ids)
        hf = hf_llama.build_hf_llama(config, weights, style).double().eval()
        theirs = hf_llama.run(hf, ids)[0]
        err, size = (ours - theirs).abs().max().item(), ours.abs().max().item()
        assert err <= 1e-5 * size, (
            f"rope_style={style}: Hugging Face logits differ from the reference by {err:.3g} (logits up to {size:.3g})"
        )
