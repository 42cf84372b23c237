"""Model FLOPs utilisation of one training step, optionally under ``torch.compile``.

    python -m benchmarks.mfu --impl reference --device cuda [--compile] [--json out.json]

GPT-2 small (protocol v1's, 124M parameters) in bf16, batch 16 x T 1024 by default, AdamW.
MFU = (6 N + 12 L T d) FLOPs per token x tokens per step / step time / the GPU's dense bf16
peak (``configs.PEAK_BF16_FLOPS`` by GPU name, or ``$BENCH_PEAK_FLOPS``). The pytest
benchmarks measure the eager step; this adds the compiled one, which is what a training run
would use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from . import configs, contenders, timing


def measure_mfu(
    impl,
    device: str = "cuda",
    *,
    config: dict = configs.GPT2_SMALL,
    batch: int = 16,
    seq_len: int = 1024,
    compile_model: bool = False,
    repeats: int = 10,
) -> dict:
    """Step time, tokens/s and MFU of ``impl``'s ``train_step`` at ``config`` in bf16 (float32 on CPU)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    contender = contenders.build_contender("impl", impl, config, contenders.canonical_weights(config), device, dtype)
    if compile_model:
        contender.model = torch.compile(contender.model)
    ids = torch.randint(0, config["vocab_size"], (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    x, y = ids[:, :-1].to(device), ids[:, 1:].to(device)
    optimizer = contender.optimizer()
    step = lambda: contender.train_step(optimizer, x, y)
    seconds = timing.median_seconds(step, device, warmup=3, repeats=repeats, max_seconds=60)
    flops = configs.train_flops_per_token(config, seq_len) * batch * seq_len
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = configs.peak_bf16_flops(name) if device == "cuda" else None
    return {
        "impl": contender.label,
        "device": name,
        "dtype": str(dtype).removeprefix("torch."),
        "compiled": compile_model,
        "batch": batch,
        "T": seq_len,
        "step_s": seconds,
        "tokens_per_s": batch * seq_len / seconds,
        "flops_per_step": flops,
        "achieved_flops": flops / seconds,
        "peak_flops": peak,
        "mfu": flops / seconds / peak if peak else None,
        "clock": timing.clock_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


CONFIGS = {"gpt2-small": configs.GPT2_SMALL, "gpt2-tiny": configs.GPT2_TINY}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Training-step model FLOPs utilisation (GPT-2 small, bf16).")
    parser.add_argument("--impl", default="reference")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model first")
    parser.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="gpt2-small",
        help="gpt2-tiny: a plumbing check that runs in seconds on a CPU",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from spec_tests.harness.subject.loading import load_implementation

    impl, _ = load_implementation(args.impl)
    result = measure_mfu(
        impl,
        args.device,
        config=CONFIGS[args.config],
        batch=args.batch,
        seq_len=args.seq_len,
        compile_model=args.compile,
    )
    mfu = "n/a" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
    print(
        f"{result['impl']} on {result['device']} ({'compiled' if args.compile else 'eager'}): "
        f"{1e3 * result['step_s']:.1f} ms/step, {result['tokens_per_s']:,.0f} tokens/s, "
        f"{result['achieved_flops'] / 1e12:.1f} TFLOP/s, MFU {mfu}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
