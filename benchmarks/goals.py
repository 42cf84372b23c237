"""The issue's CPU goals for the reference, measured with interleaved timing.

    python -m benchmarks.goals [--impl reference] [--impl path/to/another_pkg] [--json out.json]

Goals (CPU, float32, d_model 256, 4 layers, 8 heads, 2 KV heads, T 256, batch 8):
- the training step at least as fast as Hugging Face ``LlamaForCausalLM`` with SDPA;
- the cached per-token decode cost growing at most 1.5x from context 64 to 896;
- the cached decode step no slower than Hugging Face's (at 64 and at 896).

pytest-benchmark times one test after another, so on a shared machine a burst of load can
fall on one contender and not the other. Here every round takes each contender (and each
context) in turn, so the ratios compare like with like; medians and minima over the rounds
are both reported. One torch thread, process CPU time (see ``timing.clock_name``).

Several ``--impl`` are compared in the same rounds (e.g. the reference and a patched copy of
it; give the copy's folder a name other than ``reference``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from . import configs, contenders, timing

CONTEXTS = (64, 896)
GROWTH_LIMIT = 1.5


def machine() -> dict:
    """Where the numbers come from: CPU model, OS, Python, load when measured."""
    import os
    import platform

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "rounds": len(times)}


def measure_goals(impls: dict[str, object], *, train_rounds: int = 10, decode_rounds: int = 60) -> dict:
    """Interleaved training-step and cached-decode timings of each implementation and Hugging Face."""
    sizes = configs.sizes_for("cpu")
    config, device, dtype = sizes.model, "cpu", sizes.dtype
    weights = contenders.canonical_weights(config)
    models = {}
    for label, impl in impls.items():
        model = contenders.build_contender("impl", impl, config, weights, device, dtype)
        model.label = label
        models[label] = model
    hf = contenders.build_contender("hf", impls[next(iter(impls))], config, weights, device, dtype)
    models["hf"] = hf
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (sizes.batch, sizes.seq_len + 1), generator=generator)
    x, y = ids[:, :-1], ids[:, 1:]
    optimizers = {name: m.optimizer() for name, m in models.items()}
    train = timing.interleaved_times(
        {name: (lambda m=m, o=optimizers[name]: m.train_step(o, x, y)) for name, m in models.items()},
        device,
        rounds=train_rounds,
        warmup=1,
        max_seconds=600,
    )
    decode_ids = torch.randint(0, config["vocab_size"], (sizes.decode_batch, max(CONTEXTS) + 1), generator=generator)
    prefilled = {(name, c): m.prefill(decode_ids[:, :c]) for name, m in models.items() for c in CONTEXTS}
    fns, setups = {}, {}
    for (name, c), cache in prefilled.items():
        fns[f"{name}@{c}"] = lambda cache, token, m=models[name]: m.decode(cache, token)
        setups[f"{name}@{c}"] = lambda cache=cache, c=c: (copy.deepcopy(cache), decode_ids[:, c : c + 1])
    decode = timing.interleaved_times(fns, device, setups=setups, rounds=decode_rounds, warmup=2, max_seconds=600)
    result = {
        "config": config,
        "batch": sizes.batch,
        "T": sizes.seq_len,
        "decode_batch": sizes.decode_batch,
        "threads": torch.get_num_threads(),
        "clock": timing.clock_name(device),
        "torch": torch.__version__,
        "train_step": {name: summary(t) for name, t in train.items()},
        "decode": {name: summary(t) for name, t in decode.items()},
        "hf_label": hf.label,
        "machine": machine(),
        "goals": {},
    }
    lo, hi = CONTEXTS
    for label in impls:
        goals = {}
        for stat in ("median_s", "min_s"):
            train_ratio = result["train_step"][label][stat] / result["train_step"]["hf"][stat]
            d = {c: result["decode"][f"{label}@{c}"][stat] for c in CONTEXTS}
            d_hf = {c: result["decode"][f"hf@{c}"][stat] for c in CONTEXTS}
            goals[stat.removesuffix("_s")] = {
                "train_step_vs_hf": train_ratio,
                "train_step_goal_met": train_ratio <= 1.0,
                "decode_growth": d[hi] / d[lo],
                "decode_growth_goal_met": d[hi] / d[lo] <= GROWTH_LIMIT,
                "hf_decode_growth": d_hf[hi] / d_hf[lo],
                "decode_vs_hf": {c: d[c] / d_hf[c] for c in CONTEXTS},
                "decode_vs_hf_goal_met": all(d[c] <= d_hf[c] for c in CONTEXTS),
            }
        result["goals"][label] = goals
    return result


def format_goals(result: dict) -> str:
    lo, hi = CONTEXTS
    lines = []
    for label, goals in result["goals"].items():
        lines.append(f"{label} (vs {result['hf_label']}), median [min] over interleaved rounds:")
        med, mn = goals["median"], goals["min"]
        verdict = lambda key, med=med: "met" if med[key] else "not met"
        lines.append(
            f"  training step / HF          {med['train_step_vs_hf']:.2f} [{mn['train_step_vs_hf']:.2f}]"
            f"   goal <= 1: {verdict('train_step_goal_met')}"
        )
        lines.append(
            f"  cached decode {hi} / {lo}      {med['decode_growth']:.2f} [{mn['decode_growth']:.2f}]"
            f"   goal <= {GROWTH_LIMIT}: {verdict('decode_growth_goal_met')}"
            f"   (HF: {med['hf_decode_growth']:.2f} [{mn['hf_decode_growth']:.2f}])"
        )
        lines.append(
            "  cached decode / HF          "
            + ", ".join(f"ctx {c}: {med['decode_vs_hf'][c]:.2f} [{mn['decode_vs_hf'][c]:.2f}]" for c in CONTEXTS)
            + f"   goal <= 1: {verdict('decode_vs_hf_goal_met')}"
        )
    for name, s in result["train_step"].items():
        lines.append(f"  train_step {name:<14} {1e3 * s['median_s']:8.1f} ms [{1e3 * s['min_s']:.1f}]")
    for name, s in result["decode"].items():
        lines.append(f"  decode     {name:<14} {1e3 * s['median_s']:8.2f} ms [{1e3 * s['min_s']:.2f}]")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The issue's CPU goals, measured with interleaved timing.")
    parser.add_argument("--impl", action="append", help="implementation(s) (default: reference)")
    parser.add_argument("--train-rounds", type=int, default=10)
    parser.add_argument("--decode-rounds", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from spec_tests.harness.subject.loading import load_implementation

    torch.set_num_threads(args.threads)
    impls = {}
    for spec in args.impl or ["reference"]:
        obj, label = load_implementation(spec)
        impls[label] = obj
    result = measure_goals(impls, train_rounds=args.train_rounds, decode_rounds=args.decode_rounds)
    print(format_goals(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
