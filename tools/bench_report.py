#!/usr/bin/env python3
"""Plots and a Markdown report from a pytest-benchmark JSON file written by ``pytest benchmarks``.

    python tools/bench_report.py benchmarks/results/cpu.json [--out DIR] [--prefix NAME]

Writes into ``DIR`` (default: the JSON file's folder), each name starting with ``NAME``
(default: the JSON file's stem):

- ``NAME_decode.png``: per-token decode latency against context length, with and without the
  KV cache, per contender (the headline plot);
- ``NAME_attention.png``: attention time against sequence length per kernel, MHA and GQA;
- ``NAME_throughput.png``: tokens/s of forward, training step and prefill per contender;
- ``NAME.md``: the machine, every measurement as tables with ratios, and the issue's goals
  (with the interleaved goal measurement of ``python -m benchmarks.goals --json
  NAME_goals.json`` when that file is next to the input, or given with ``--goals``).

Needs matplotlib for the plots (``pip install matplotlib``); without it only the Markdown is
written. Exit status 0 on success, 2 on a missing or unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

CONTENDER_ORDER = ("impl", "reference", "hf")
KERNEL_ORDER = ("naive", "flash", "sdpa")
GOAL_DECODE_CONTEXTS = (64, 896)  # the issue's goal: cached decode growth from 64 to 896 at most 1.5x
GOAL_DECODE_GROWTH = 1.5


# ---------------------------------------------------------------------------------------------
# reading


def load(path: Path) -> dict:
    data = json.loads(path.read_text())
    if "benchmarks" not in data:
        raise ValueError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' key)")
    return data


def rows(data: dict, bench: str) -> list[dict]:
    """The measurements of one kind, flattened: extra_info plus ``median``/``iqr``/``rounds`` (seconds)."""
    out = []
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if info.get("bench") == bench:
            out.append(
                {
                    **info,
                    "median": b["stats"]["median"],
                    "min": b["stats"].get("min", b["stats"]["median"]),
                    "iqr": b["stats"]["iqr"],
                    "rounds": b["stats"]["rounds"],
                    "name": b["name"],
                }
            )
    return out


def contenders_in(items: list[dict]) -> list[str]:
    present = {r["contender"] for r in items}
    return [c for c in CONTENDER_ORDER if c in present]


def labels(items: list[dict]) -> dict[str, str]:
    return {r["contender"]: r.get("label", r["contender"]) for r in items}


def machine_summary(data: dict) -> dict:
    m = data.get("machine_info", {})
    bench = m.get("transformer_bench", {})
    return {
        "cpu": (m.get("cpu") or {}).get("brand_raw", m.get("processor", "?")),
        "system": f"{m.get('system', '?')} {m.get('release', '')}".strip(),
        "python": m.get("python_version", bench.get("python", "?")),
        **bench,
        "datetime": data.get("datetime", "?"),
        "commit": (data.get("commit_info") or {}).get("id", "?"),
    }


# ---------------------------------------------------------------------------------------------
# formatting


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# ---------------------------------------------------------------------------------------------
# sections


def attention_section(data: dict) -> tuple[str, dict]:
    items = rows(data, "attention")
    if not items:
        return "", {}
    by = {(r["heads"], r["T"], r["kernel"]): r for r in items}
    out = []
    for heads in sorted({r["heads"] for r in items}):
        some = next(r for r in items if r["heads"] == heads)
        lengths = sorted({r["T"] for r in items if r["heads"] == heads})
        kernels = [k for k in KERNEL_ORDER if any(r["kernel"] == k and r["heads"] == heads for r in items)]
        body = []
        for t in lengths:
            times = {k: by[(heads, t, k)]["median"] if (heads, t, k) in by else None for k in kernels}
            body.append(
                [
                    t,
                    *(fmt_time(times[k]) for k in kernels),
                    fmt_ratio(ratio(times.get("flash"), times.get("naive"))),
                    fmt_ratio(ratio(times.get("naive"), times.get("sdpa"))),
                ]
            )
        out.append(
            f"**{heads.upper()}** ({some['n_heads']} query heads, {some['n_kv_heads']} KV heads, d_head "
            f"{some['d_head']}, batch {some['batch']}, {some['dtype']}, causal)\n\n"
            + table(["T", *kernels, "flash / naive", "naive / sdpa"], body)
        )
    return "## Attention\n\nMedian time per call.\n\n" + "\n\n".join(out), by


def model_section(data: dict) -> str:
    parts = []
    for bench, title in (("forward", "Forward"), ("train_step", "Training step"), ("prefill", "Prefill")):
        items = rows(data, bench)
        if not items:
            continue
        for family in sorted({r.get("family", "llama") for r in items}):
            fam = [r for r in items if r.get("family", "llama") == family]
            names = contenders_in(fam)
            lab = labels(fam)
            med = {r["contender"]: r["median"] for r in fam}
            some = fam[0]
            body = []
            baselines = [b for b in ("reference", "hf") if b in med]  # ratio columns for who ran
            for c in names:
                r = next(x for x in fam if x["contender"] == c)
                row = [
                    lab[c],
                    fmt_time(r["median"]),
                    f"{r['tokens'] / r['median']:,.0f}",
                    *(fmt_ratio(ratio(r["median"], med[b])) for b in baselines),
                    fmt_bytes(r.get("peak_memory_bytes")),
                ]
                if r.get("mfu") is not None:
                    row.append(f"{100 * r['mfu']:.1f}%")
                body.append(row)
            header = [
                "contender",
                "median",
                "tokens/s",
                *(f"time / {'HF' if b == 'hf' else b}" for b in baselines),
                "peak memory",
            ]
            if any(r.get("mfu") is not None for r in fam):
                header.append("MFU")
            suffix = f" ({family})" if bench == "train_step" else ""
            parts.append(
                f"### {title}{suffix}\n\nbatch {some['batch']} x T {some['T']}, {some['dtype']}.\n\n"
                + table(header, body)
            )
        if bench == "prefill":
            kv = [
                [
                    lab[r["contender"]],
                    fmt_bytes(r.get("kv_logical_bytes")),
                    fmt_bytes(r.get("kv_storage_bytes")),
                    fmt_bytes(r.get("kv_cache_bytes")),
                ]
                for r in sorted(items, key=lambda r: CONTENDER_ORDER.index(r["contender"]))
                if r.get("kv_cache_bytes") is not None
            ]
            if kv:
                parts.append(
                    "### KV cache memory after prefill\n\nViews = bytes of the cached K/V tensors; storage = "
                    "bytes allocated behind them (a preallocated cache holds spare capacity).\n\n"
                    + table(["contender", "K/V views", "storage", "kv_cache_bytes"], kv)
                )
    return "## Model\n\n" + "\n\n".join(parts) if parts else ""


def decode_table(data: dict, stat: str = "median") -> dict:
    """``{contender: {cached: {context: seconds}}}``, the ``stat`` (median or min) of each."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r in rows(data, "decode"):
        out[r["contender"]][bool(r["cached"])][r["context"]] = r[stat]
    return out


def decode_section(data: dict) -> str:
    items = rows(data, "decode")
    if not items:
        return ""
    table_ = decode_table(data)
    names, lab = contenders_in(items), labels(items)
    contexts = sorted({r["context"] for r in items})
    body = []
    for ctx in contexts:
        row = [ctx]
        for c in names:
            cached, uncached = table_[c][True].get(ctx), table_[c][False].get(ctx)
            row += [fmt_time(cached), fmt_time(uncached), fmt_ratio(ratio(uncached, cached))]
        body.append(row)
    header = ["context"] + [f"{lab[c]} {h}" for c in names for h in ("cached", "uncached", "speedup")]
    growth = []
    for c in names:
        cached = table_[c][True]
        if cached:
            lo, hi = min(cached), max(cached)
            growth.append(
                f"- {lab[c]}: cached step {fmt_time(cached[lo])} at context {lo} -> "
                f"{fmt_time(cached[hi])} at {hi} ({fmt_ratio(ratio(cached[hi], cached[lo]))})"
            )
    some = items[0]
    return (
        f"## Decoding\n\nLatency of one more token (batch {some['batch']}, {some['dtype']}): one cached "
        "step, or without the cache a forward over the whole context.\n\n"
        + table(header, body)
        + "\n\nGrowth of the cached step with context:\n\n"
        + "\n".join(growth)
    )


def goals_section(data: dict) -> str:
    """The issue's goals for the reference, where this file has the measurements for them.

    Verdicts use medians; the same ratio from the fastest round (min) follows in brackets, since
    on a loaded machine the minimum is the least disturbed estimate of the cost.
    """
    bench = data.get("machine_info", {}).get("transformer_bench", {})
    lines = []
    ref = "impl" if bench.get("impl") == "reference" else "reference"  # the reference runs as the impl there
    train = {
        stat: {r["contender"]: r[stat] for r in rows(data, "train_step") if r.get("family", "llama") == "llama"}
        for stat in ("median", "min")
    }
    decode = {stat: decode_table(data, stat) for stat in ("median", "min")}
    if bench.get("device") == "cpu":
        if ref in train["median"] and "hf" in train["median"]:
            r, r_min = (train[s][ref] / train[s]["hf"] for s in ("median", "min"))
            lines.append(
                f"- reference training step at least as fast as Hugging Face Llama (SDPA): "
                f"{fmt_time(train['median'][ref])} vs {fmt_time(train['median']['hf'])}, ratio {r:.2f} "
                f"(min {r_min:.2f}) -> **{'met' if r <= 1 else 'not met'}**"
            )
        cached = {s: decode[s].get(ref, {}).get(True, {}) for s in ("median", "min")}
        lo, hi = GOAL_DECODE_CONTEXTS
        if lo in cached["median"] and hi in cached["median"]:
            g, g_min = (cached[s][hi] / cached[s][lo] for s in ("median", "min"))
            lines.append(
                f"- cached per-token decode cost growing at most {GOAL_DECODE_GROWTH}x from context {lo} "
                f"to {hi}: {fmt_time(cached['median'][lo])} -> {fmt_time(cached['median'][hi])}, {g:.2f}x "
                f"(min {g_min:.2f}x) -> **{'met' if g <= GOAL_DECODE_GROWTH else 'not met'}**"
            )
        hf_cached = {s: decode[s].get("hf", {}).get(True, {}) for s in ("median", "min")}
        shared = sorted(set(cached["median"]) & set(hf_cached["median"]))
        if shared:
            ratios = {s: {c: cached[s][c] / hf_cached[s][c] for c in shared} for s in ("median", "min")}
            worst = max(ratios["median"].values())
            lines.append(
                "- cached decode no slower than Hugging Face's: reference / HF per context "
                + ", ".join(f"{c}: {ratios['median'][c]:.2f} (min {ratios['min'][c]:.2f})" for c in shared)
                + f" -> **{'met' if worst <= 1 else 'not met'}**"
            )
    mfu = [r for r in rows(data, "train_step") if r.get("mfu") is not None and r.get("family") == "gpt2"]
    for r in mfu:
        lines.append(
            f"- {r['label']}: GPT-2 small training step at {100 * r['mfu']:.1f}% model FLOPs utilisation "
            f"(goal 40%) -> **{'met' if r['mfu'] >= 0.4 else 'not met'}**"
        )
    if not lines:
        return ""
    return (
        "## Goals\n\nVerdicts from medians; in brackets the same ratio from each run's fastest "
        "round.\n\n" + "\n".join(lines)
    )


def interleaved_goals_section(goals: dict) -> str:
    """The verdicts of ``python -m benchmarks.goals`` (interleaved rounds), when given."""
    lines = []
    for label, g in goals.get("goals", {}).items():
        med, mn = g["median"], g["min"]
        verdict = lambda key, med=med: "met" if med[key] else "not met"
        ctx = sorted(med["decode_vs_hf"], key=int)
        lines += [
            f"- {label}: training step / HF {med['train_step_vs_hf']:.2f} (min {mn['train_step_vs_hf']:.2f}) -> "
            f"**{verdict('train_step_goal_met')}**",
            f"- {label}: cached decode growth context {ctx[0]} -> {ctx[-1]} {med['decode_growth']:.2f}x (min "
            f"{mn['decode_growth']:.2f}x; Hugging Face {med['hf_decode_growth']:.2f}x) -> "
            f"**{verdict('decode_growth_goal_met')}**",
            f"- {label}: cached decode / HF "
            + ", ".join(f"context {c}: {med['decode_vs_hf'][c]:.2f} (min {mn['decode_vs_hf'][c]:.2f})" for c in ctx)
            + f" -> **{verdict('decode_vs_hf_goal_met')}**",
        ]
    if not lines:
        return ""
    load = goals.get("machine", {}).get("load_average")
    load = ", ".join(f"{x:.2f}" for x in load) if load else "unknown"
    return (
        "### Goals measured with interleaved rounds (`python -m benchmarks.goals`)\n\n"
        f"Every round takes each contender and context in turn "
        f"({goals['train_step'][next(iter(goals['train_step']))]['rounds']} "
        f"training rounds, {next(iter(goals['decode'].values()))['rounds']} decode rounds, {goals.get('clock')}, "
        f"{goals.get('threads')} thread, load average {load}), so a burst of load on a shared "
        "machine falls on all of them alike; where these verdicts differ from the ones above, these are the "
        "better measurement.\n\n" + "\n".join(lines)
    )


def add_mfu(data: dict) -> None:
    """Model FLOPs utilisation of the training steps, where the GPU's peak is known."""
    peak = data.get("machine_info", {}).get("transformer_bench", {}).get("peak_bf16_flops")
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if peak and info.get("bench") == "train_step" and info.get("flops") and info.get("dtype") == "bfloat16":
            info["mfu"] = info["flops"] / b["stats"]["median"] / peak


def markdown(data: dict, source: Path, plots: list[Path], goals: dict | None = None) -> str:
    m = machine_summary(data)
    gpu = f", GPU {m['gpu']} (compute {m.get('gpu_capability')}, {m.get('gpu_memory_gib')} GiB)" if m.get("gpu") else ""
    head = (
        f"# Benchmark report: `{source.name}`\n\n"
        f"Implementation `{m.get('impl', '?')}` on {m.get('device', '?')}, {m.get('dtype', '?')}, sizes "
        f"`{m.get('sizes', '?')}`. Machine: {m['cpu']}, {m['system']}{gpu}; torch {m.get('torch')} (CUDA "
        f"{m.get('cuda')}), {m.get('threads')} CPU threads, transformers {m.get('transformers')}, Python "
        f"{m['python']}. Run {m['datetime']} at commit `{str(m['commit'])[:10]}`.\n\n"
        "Times are medians; on a shared CPU compare ratios, not absolute times.\n\n"
        f"Model config: `{json.dumps(m.get('model_config'))}`"
    )
    sections = [
        head,
        goals_section(data),
        interleaved_goals_section(goals or {}),
        *(f"![{p.stem}]({p.name})" for p in plots),
        decode_section(data),
        model_section(data),
        attention_section(data)[0],
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


# ---------------------------------------------------------------------------------------------
# plots


def plot_all(data: dict, out: Path, prefix: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): writing the Markdown only", file=sys.stderr)
        return []
    written = []
    for name, draw in (("decode", plot_decode), ("attention", plot_attention), ("throughput", plot_throughput)):
        fig = draw(data, plt)
        if fig is not None:
            path = out / f"{prefix}_{name}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written


COLORS = {
    "impl": "tab:blue",
    "reference": "tab:green",
    "hf": "tab:orange",
    "naive": "tab:red",
    "flash": "tab:purple",
    "sdpa": "tab:gray",
}


def plot_decode(data, plt):
    """Left: cached and uncached latency (log scale); right: the cached step alone (linear)."""
    items = rows(data, "decode")
    if not items:
        return None
    table_, lab = decode_table(data), labels(items)
    fig, (both, cached_only) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in contenders_in(items):
        for cached, style in ((True, "-o"), (False, "--s")):
            points = sorted(table_[c][cached].items())
            if not points:
                continue
            xs, ys = [p[0] for p in points], [1e3 * p[1] for p in points]
            both.plot(
                xs, ys, style, color=COLORS[c], markersize=4, label=f"{lab[c]}, {'KV cache' if cached else 'no cache'}"
            )
            if cached:
                cached_only.plot(xs, ys, style, color=COLORS[c], markersize=4, label=lab[c])
    some = items[0]
    both.set_yscale("log")
    both.set_title(f"Per-token decode latency, batch {some['batch']}, {some['dtype']}")
    cached_only.set_ylim(bottom=0)
    cached_only.set_title("With the KV cache only")
    for ax in (both, cached_only):
        ax.set_xlabel("context length (tokens already seen)")
        ax.set_ylabel("latency of one more token (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_attention(data, plt):
    items = rows(data, "attention")
    if not items:
        return None
    heads = sorted({r["heads"] for r in items})
    fig, axes = plt.subplots(1, len(heads), figsize=(5 * len(heads), 4), squeeze=False)
    for ax, h in zip(axes[0], heads):
        for k in KERNEL_ORDER:
            points = sorted((r["T"], r["median"]) for r in items if r["heads"] == h and r["kernel"] == k)
            if points:
                ax.plot(
                    [p[0] for p in points], [1e3 * p[1] for p in points], "-o", color=COLORS[k], label=k, markersize=4
                )
        some = next(r for r in items if r["heads"] == h)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(f"{h.upper()}: {some['n_heads']} q / {some['n_kv_heads']} kv heads, {some['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_throughput(data, plt):
    benches = [b for b in ("forward", "train_step", "prefill") if rows(data, b)]
    if not benches:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    everyone = [c for c in CONTENDER_ORDER if any(r["contender"] == c for b in benches for r in rows(data, b))]
    width = 0.8 / max(1, len(everyone))
    for i, c in enumerate(everyone):
        values, lab = [], None
        for b in benches:
            match = [r for r in rows(data, b) if r["contender"] == c and r.get("family", "llama") == "llama"]
            values.append(match[0]["tokens"] / match[0]["median"] if match else 0)
            lab = lab or (match[0]["label"] if match else c)
        ax.bar([j + i * width for j in range(len(benches))], values, width, label=lab, color=COLORS[c])
    ax.set_xticks([j + width * (len(everyone) - 1) / 2 for j in range(len(benches))], benches)
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput (higher is better)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="pytest-benchmark JSON (pytest benchmarks --benchmark-json=FILE)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the JSON file's folder)")
    parser.add_argument("--prefix", default=None, help="file name prefix (default: the JSON file's stem)")
    parser.add_argument(
        "--goals",
        type=Path,
        default=None,
        help="JSON of python -m benchmarks.goals to include (default: PREFIX_goals.json beside the input, if any)",
    )
    args = parser.parse_args(argv)
    try:
        data = load(args.json)
    except (OSError, ValueError) as exc:
        print(f"bench_report: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.json.parent
    out.mkdir(parents=True, exist_ok=True)
    prefix = args.prefix or args.json.stem
    goals_path = args.goals or args.json.with_name(f"{args.json.stem}_goals.json")
    try:
        goals = json.loads(goals_path.read_text()) if goals_path.exists() else None
    except (OSError, ValueError) as exc:
        print(f"bench_report: {goals_path}: {exc}", file=sys.stderr)
        return 2
    add_mfu(data)
    plots = plot_all(data, out, prefix)
    report = out / f"{prefix}.md"
    report.write_text(markdown(data, args.json, plots, goals))
    for path in [report, *plots]:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
