"""Benchmark-backed performance checks a grader can award points for.

    from benchmarks.perf_checks import run_perf_checks, leaderboard_entries
    checks = run_perf_checks(impl, device="cpu")          # list of dicts, see PerfCheck
    entries = leaderboard_entries(checks)                  # Gradescope "leaderboard" entries

or from the shell (writes what ``spec-grade --leaderboard FILE`` reads):

    python -m benchmarks.perf_checks --impl student --device cpu --json checks.json --leaderboard board.json

The checks, each a ratio of two timings taken in the same process, interleaved, median of
several calls after warm-up; on CUDA with a synchronising wall-clock timer, on CPU (one torch
thread by default) in process CPU time, which stays comparable on a loaded machine:

``decode_cache_speedup``  uncached / cached per-token decode time at context 512 (batch 1):
                          passes at >= 5 (CPU and CUDA).
``train_step_vs_reference`` implementation / reference training step time (batch 4, T 128):
                          passes at <= 3.
``flash_vs_naive``        ``flash_attention`` / naive ``scaled_dot_product_attention`` time at
                          long T (CPU: T 1024, passes at <= 2; CUDA: T 4096 bf16, passes at < 1).

A check that cannot run (a name not provided, not implemented, an exception) is reported with
``passed: False``, ``value: None`` and the reason in ``error``; the others still run.
The model is the issue's CPU configuration (Llama family, d_model 256, 4 layers, 8 heads,
2 KV heads, vocabulary 8192, context 1024) in float32 on CPU and bf16 on CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

if __package__ in (None, ""):  # python benchmarks/perf_checks.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from . import configs, contenders, timing

DECODE_CONTEXT = 512
TRAIN_BATCH, TRAIN_T = 4, 128
ATTENTION = {
    "cpu": dict(T=1024, batch=1, heads=8, kv_heads=2, d_head=64, block_size=64, dtype=torch.float32),
    "cuda": dict(T=4096, batch=4, heads=16, kv_heads=4, d_head=64, block_size=128, dtype=torch.bfloat16),
}


@dataclass
class PerfCheck:
    """One graded check. ``value`` is the measured ratio; it passes when ``value <comparison> threshold``."""

    name: str
    description: str
    value: float | None
    threshold: float
    comparison: str  # ">=", "<=" or "<"
    passed: bool
    order: str  # Gradescope leaderboard order: "desc" = higher is better, "asc" = lower is better
    device: str
    detail: dict = field(default_factory=dict)  # the timings behind the ratio, in seconds
    error: str | None = None


def _passes(value: float, comparison: str, threshold: float) -> bool:
    return {">=": value >= threshold, "<=": value <= threshold, "<": value < threshold}[comparison]


def interleaved_medians(
    fns: dict[str, Callable],
    device: str,
    *,
    setups: dict | None = None,
    rounds: int = 5,
    warmup: int = 1,
    max_seconds: float = 20.0,
) -> dict[str, float]:
    """Median time of each function, timed in alternation (``timing.interleaved_times``)."""
    times = timing.interleaved_times(fns, device, setups=setups, rounds=rounds, warmup=warmup, max_seconds=max_seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def _ids(batch: int, length: int, vocab: int, device: str) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0)).to(device)


def check_decode_cache_speedup(impl, device: str, dtype: torch.dtype, config: dict) -> PerfCheck:
    weights = contenders.canonical_weights(config)
    model = contenders.build_contender("impl", impl, config, weights, device, dtype)
    ids = _ids(1, DECODE_CONTEXT + 1, config["vocab_size"], device)

    def cached_setup():
        return model.prefill(ids[:, :DECODE_CONTEXT]), ids[:, DECODE_CONTEXT:]

    medians = interleaved_medians(
        {"cached": lambda cache, token: model.decode(cache, token), "uncached": lambda: model.logits(ids)},
        device,
        setups={"cached": cached_setup},
        rounds=7,
    )
    value = medians["uncached"] / medians["cached"]
    return PerfCheck(
        "decode_cache_speedup",
        f"KV-cache decoding speedup at context {DECODE_CONTEXT} (uncached / cached time)",
        value,
        5.0,
        ">=",
        _passes(value, ">=", 5.0),
        "desc",
        device,
        {"cached_s": medians["cached"], "uncached_s": medians["uncached"], "context": DECODE_CONTEXT, "batch": 1},
    )


def check_train_step_vs_reference(impl, device: str, dtype: torch.dtype, config: dict, baseline) -> PerfCheck:
    weights = contenders.canonical_weights(config)
    ours = contenders.build_contender("impl", impl, config, weights, device, dtype)
    theirs = contenders.ProtocolContender("reference", baseline, "reference", baseline.build_model(config, weights))
    theirs.model = theirs.model.to(device=device, dtype=dtype)
    theirs.model_config = config
    ids = _ids(TRAIN_BATCH, TRAIN_T + 1, config["vocab_size"], device)
    x, y = ids[:, :-1], ids[:, 1:]
    opt_ours, opt_theirs = ours.optimizer(), theirs.optimizer()
    medians = interleaved_medians(
        {"impl": lambda: ours.train_step(opt_ours, x, y), "reference": lambda: theirs.train_step(opt_theirs, x, y)},
        device,
        rounds=5,
    )
    value = medians["impl"] / medians["reference"]
    return PerfCheck(
        "train_step_vs_reference",
        f"training step time relative to the reference (batch {TRAIN_BATCH}, T {TRAIN_T})",
        value,
        3.0,
        "<=",
        _passes(value, "<=", 3.0),
        "asc",
        device,
        {"impl_s": medians["impl"], "reference_s": medians["reference"], "batch": TRAIN_BATCH, "T": TRAIN_T},
    )


def check_flash_vs_naive(impl, device: str) -> PerfCheck:
    a = ATTENTION[device]
    g = torch.Generator().manual_seed(0)
    make = lambda h: torch.randn(a["batch"], h, a["T"], a["d_head"], generator=g).to(device=device, dtype=a["dtype"])
    q, k, v = make(a["heads"]), make(a["kv_heads"]), make(a["kv_heads"])
    mask = torch.ones(a["T"], a["T"], dtype=torch.bool, device=device).tril()
    medians = interleaved_medians(
        {
            "flash": lambda: impl.flash_attention(q, k, v, causal=True, block_size=a["block_size"]),
            "naive": lambda: impl.scaled_dot_product_attention(q, k, v, mask),
        },
        device,
        rounds=5,
    )
    value = medians["flash"] / medians["naive"]
    threshold, comparison = (2.0, "<=") if device == "cpu" else (1.0, "<")
    return PerfCheck(
        "flash_vs_naive",
        f"flash_attention time relative to naive attention at T {a['T']} "
        f"({'within 2x' if device == 'cpu' else 'faster'})",
        value,
        threshold,
        comparison,
        _passes(value, comparison, threshold),
        "asc",
        device,
        {
            "flash_s": medians["flash"],
            "naive_s": medians["naive"],
            "T": a["T"],
            "block_size": a["block_size"],
            "heads": a["heads"],
            "kv_heads": a["kv_heads"],
            "dtype": str(a["dtype"]).removeprefix("torch."),
        },
    )


CHECK_NAMES = ("decode_cache_speedup", "train_step_vs_reference", "flash_vs_naive")


def run_perf_checks(
    impl, device: str = "cpu", *, baseline=None, only: tuple[str, ...] = CHECK_NAMES, threads: int | None = 1
) -> list[dict]:
    """Run the graded performance checks on ``impl`` and return one dict per check (``PerfCheck``
    fields: name, description, value, threshold, comparison, passed, order, device, detail, error).

    ``impl``: a protocol v1 implementation (a module, or the ``spec_tests`` ``Implementation``
    proxy). ``baseline``: the implementation the training step is compared with (default: the
    ``reference`` package). ``only``: a subset of ``CHECK_NAMES``. ``threads``: torch CPU threads
    while the checks run (default 1: on a shared or small machine a thread pool's spinning makes
    many small operations erratically slow; None keeps torch's setting); restored afterwards.
    """
    if device not in ATTENTION:
        raise ValueError(f"run_perf_checks: device must be 'cpu' or 'cuda', got {device!r}")
    unknown = set(only) - set(CHECK_NAMES)
    if unknown:
        raise ValueError(f"run_perf_checks: unknown checks {sorted(unknown)}; known: {CHECK_NAMES}")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = configs.LLAMA_SMALL
    runners = {
        "decode_cache_speedup": lambda: check_decode_cache_speedup(impl, device, dtype, config),
        "train_step_vs_reference": lambda: check_train_step_vs_reference(
            impl, device, dtype, config, baseline or _reference()
        ),
        "flash_vs_naive": lambda: check_flash_vs_naive(impl, device),
    }
    results, threads_before = [], torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        for name in only:
            try:
                results.append(asdict(runners[name]()))
            except Exception as exc:  # noqa: BLE001 - a failing check is reported, the others still run
                results.append(asdict(_failed(name, device, exc)))
    finally:
        torch.set_num_threads(threads_before)
    return results


def _reference():
    import reference

    return reference


FAILED_DESCRIPTIONS = {
    "decode_cache_speedup": (5.0, ">=", "desc"),
    "train_step_vs_reference": (3.0, "<=", "asc"),
    "flash_vs_naive": (2.0, "<=", "asc"),
}


def _failed(name: str, device: str, exc: BaseException) -> PerfCheck:
    threshold, comparison, order = FAILED_DESCRIPTIONS[name]
    if name == "flash_vs_naive" and device == "cuda":
        threshold, comparison = 1.0, "<"
    message = str(exc) if isinstance(exc, NotImplementedError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, NotImplementedError):
        message = f"not implemented: {message}"
    return PerfCheck(name, f"{name} could not run", None, threshold, comparison, False, order, device, error=message)


def leaderboard_entries(checks: list[dict]) -> list[dict]:
    """Gradescope leaderboard entries ``{"name", "value", "order"}`` (a check that could not run
    reports ``value`` 0 for ``desc`` order and 1e9 for ``asc``, so it sorts last)."""
    entries = []
    for c in checks:
        value = c["value"] if c["value"] is not None else (0.0 if c["order"] == "desc" else 1e9)
        entries.append({"name": c["name"], "value": round(float(value), 3), "order": c["order"]})
    return entries


def format_checks(checks: list[dict]) -> str:
    lines = []
    for c in checks:
        verdict = "PASS" if c["passed"] else "FAIL"
        value = "n/a" if c["value"] is None else f"{c['value']:.2f}"
        line = f"{verdict}  {c['name']:<24} {value:>7} (needs {c['comparison']} {c['threshold']:g})  {c['description']}"
        lines.append(line + (f"\n      {c['error']}" if c["error"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Graded performance checks of a protocol v1 implementation.")
    parser.add_argument("--impl", default="reference", help="implementation, as pytest spec_tests --impl takes it")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", default=",".join(CHECK_NAMES), help="comma-separated subset of the checks")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads while checking (default 1)")
    parser.add_argument("--json", type=Path, help="write the checks here")
    parser.add_argument("--leaderboard", type=Path, help="write Gradescope leaderboard entries here")
    args = parser.parse_args(argv)
    from spec_tests.harness.subject.loading import ImplImportError, ImplUsageError, load_implementation

    try:
        impl, _label = load_implementation(args.impl)
    except (ImplUsageError, ImplImportError, ValueError) as exc:
        print(f"perf_checks: {exc}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("perf_checks: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    try:
        checks = run_perf_checks(
            impl, args.device, only=tuple(filter(None, args.only.split(","))), threads=args.threads
        )
    except ValueError as exc:
        print(f"perf_checks: {exc}", file=sys.stderr)
        return 2
    print(format_checks(checks))
    if args.json:
        args.json.write_text(json.dumps(checks, indent=2) + "\n")
    if args.leaderboard:
        args.leaderboard.write_text(json.dumps(leaderboard_entries(checks), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
