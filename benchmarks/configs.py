"""The sizes every benchmark runs at, per device.

CPU sizes are the issue's goal configuration (fp32): d_model 256, 4 layers, 8 heads, 2 KV heads,
T 256, batch 8. CUDA sizes are GPT-2-small-sized (bf16): the Llama family at d_model 768 with
12 layers for the side-by-side runs, and GPT-2 small itself for model FLOPs utilisation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# The CPU goal configuration; context 1024 so decoding at context 896 fits.
LLAMA_SMALL = dict(
    family="llama",
    vocab_size=8192,
    context_length=1024,
    d_model=256,
    n_layers=4,
    n_heads=8,
    n_kv_heads=2,
    d_ff=704,
    rope_theta=10000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
)

# Llama family at GPT-2-small size (GQA 12/4), for the side-by-side runs on a GPU.
LLAMA_GPT2_SIZE = dict(
    family="llama",
    vocab_size=32000,
    context_length=2048,
    d_model=768,
    n_layers=12,
    n_heads=12,
    n_kv_heads=4,
    d_ff=2048,
    rope_theta=10000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
)

# GPT-2 small as in protocol v1 (124,439,808 parameters), for model FLOPs utilisation.
GPT2_SMALL = dict(
    family="gpt2",
    vocab_size=50257,
    context_length=1024,
    d_model=768,
    n_layers=12,
    n_heads=12,
    n_kv_heads=12,
    d_ff=3072,
    norm_eps=1e-5,
    tie_embeddings=True,
)


@dataclass(frozen=True)
class DeviceSizes:
    """What the benchmarks run at on one device."""

    dtype: torch.dtype
    model: dict  # side-by-side model config (Llama family, so Hugging Face can join)
    batch: int  # training step, forward and prefill batch
    seq_len: int  # training step, forward and prefill length T
    decode_batch: int
    decode_contexts: tuple[int, ...]  # cached tokens before the timed decode step
    attention_batch: int
    attention_heads: dict  # name -> (n_heads, n_kv_heads)
    attention_d_head: int
    attention_lengths: tuple[int, ...]
    flash_block_size: int
    mfu_model: dict | None  # config for the model FLOPs utilisation run (GPU only)
    mfu_batch: int = 0
    mfu_seq_len: int = 0


SIZES = {
    "cpu": DeviceSizes(
        dtype=torch.float32,
        model=LLAMA_SMALL,
        batch=8,
        seq_len=256,
        decode_batch=8,
        decode_contexts=(64, 128, 256, 512, 896),
        attention_batch=1,
        attention_heads={"mha": (8, 8), "gqa": (8, 2)},
        attention_d_head=64,
        attention_lengths=(128, 256, 512, 1024, 2048),
        flash_block_size=64,
        mfu_model=None,
    ),
    "cuda": DeviceSizes(
        dtype=torch.bfloat16,
        model=LLAMA_GPT2_SIZE,
        batch=8,
        seq_len=1024,
        decode_batch=8,
        decode_contexts=(64, 256, 512, 1024, 1792),
        attention_batch=4,
        attention_heads={"mha": (16, 16), "gqa": (16, 4)},
        attention_d_head=64,
        attention_lengths=(512, 1024, 2048, 4096, 8192),
        flash_block_size=128,
        mfu_model=GPT2_SMALL,
        mfu_batch=16,
        mfu_seq_len=1024,
    ),
}


# The smoke run (plain ``pytest benchmarks``) runs every benchmark body once at these sizes.
LLAMA_TINY = dict(
    family="llama",
    vocab_size=512,
    context_length=128,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=160,
    rope_theta=10000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
)
GPT2_TINY = dict(
    family="gpt2",
    vocab_size=512,
    context_length=128,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=4,
    d_ff=256,
    norm_eps=1e-5,
    tie_embeddings=True,
)


def smoke_sizes(device: str) -> DeviceSizes:
    """Every code path of the full sizes, small enough to run each benchmark once in seconds."""
    full = sizes_for(device)
    return replace(
        full,
        model=LLAMA_TINY,
        batch=2,
        seq_len=32,
        decode_batch=2,
        decode_contexts=(16, 48),
        attention_batch=1,
        attention_heads={"mha": (4, 4), "gqa": (4, 2)},
        attention_d_head=16,
        attention_lengths=(64, 128),
        flash_block_size=32,
        mfu_model=GPT2_TINY if full.mfu_model else None,
        mfu_batch=2,
        mfu_seq_len=32,
    )


def sizes_for(device: str, profile: str = "full") -> DeviceSizes:
    """The sizes of ``profile`` (``full`` or ``smoke``) on ``device`` (``cpu`` or ``cuda``)."""
    if device not in SIZES:
        raise ValueError(f"no benchmark sizes for device {device!r}; known: {sorted(SIZES)}")
    if profile not in ("full", "smoke"):
        raise ValueError(f"benchmark size profile must be 'full' or 'smoke', got {profile!r}")
    return SIZES[device] if profile == "full" else smoke_sizes(device)


def matmul_parameters(config: dict) -> int:
    """Weights that take part in a matrix multiply per token: every projection plus the LM head
    (embedding and position lookups are not FLOPs). The ``N`` of the ``6N`` FLOPs-per-token rule."""
    d, layers, v, ff = config["d_model"], config["n_layers"], config["vocab_size"], config["d_ff"]
    d_head = d // config["n_heads"]
    q, kv = config["n_heads"] * d_head, (config.get("n_kv_heads") or config["n_heads"]) * d_head
    mlp = (3 if config.get("family", "llama") == "llama" else 2) * d * ff
    return layers * (d * q + 2 * d * kv + q * d + mlp) + v * d


def train_flops_per_token(config: dict, seq_len: int) -> float:
    """Training FLOPs per token: ``6 N`` for the matmul weights plus ``12 L T d`` for attention
    scores and mixing (forward 4 L T d, backward twice that; PaLM appendix B, no causal discount)."""
    attention = 12 * config["n_layers"] * seq_len * config["n_heads"] * (config["d_model"] // config["n_heads"])
    return 6 * matmul_parameters(config) + attention


# Dense bf16 tensor-core peak, FLOP/s, by GPU name fragment (vendor datasheets, no sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
}


def peak_bf16_flops(gpu_name: str) -> float | None:
    """The datasheet peak for ``gpu_name`` (``$BENCH_PEAK_FLOPS`` overrides), or None if unknown."""
    import os

    if os.environ.get("BENCH_PEAK_FLOPS"):
        return float(os.environ["BENCH_PEAK_FLOPS"])
    for fragment, flops in PEAK_BF16_FLOPS.items():
        if fragment in gpu_name:
            return flops
    return None
