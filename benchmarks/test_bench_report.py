"""``tools/bench_report.py`` on a small synthetic pytest-benchmark file: the tables, ratios and
goal verdicts it writes follow from the numbers it is given."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "tools" / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry(median: float, **info) -> dict:
    stats = {"median": median, "min": median, "iqr": 0.0, "rounds": 3}
    return {"name": "x", "group": "g", "stats": stats, "extra_info": info}


def synthetic(decode_ref: dict, decode_hf: dict, train: dict) -> dict:
    benchmarks = []
    for contender, times in (("impl", decode_ref), ("hf", decode_hf)):
        for ctx, seconds in times.items():
            common = dict(
                bench="decode", contender=contender, label=contender, context=ctx, batch=8, tokens=8, dtype="float32"
            )
            benchmarks.append(entry(seconds, cached=True, **common))
            benchmarks.append(entry(seconds * 20, cached=False, **common))
    for contender, seconds in train.items():
        benchmarks.append(
            entry(
                seconds,
                bench="train_step",
                contender=contender,
                label=contender,
                batch=8,
                T=256,
                tokens=2048,
                dtype="float32",
                family="llama",
            )
        )
    for kernel, seconds in (("naive", 0.04), ("flash", 0.06), ("sdpa", 0.01)):
        benchmarks.append(
            entry(
                seconds,
                bench="attention",
                kernel=kernel,
                heads="gqa",
                T=1024,
                batch=1,
                n_heads=8,
                n_kv_heads=2,
                d_head=64,
                dtype="float32",
            )
        )
    machine = {"transformer_bench": {"device": "cpu", "impl": "reference", "dtype": "float32", "sizes": "full"}}
    return {"benchmarks": benchmarks, "machine_info": machine, "datetime": "now", "commit_info": {"id": "abc"}}


@pytest.mark.parametrize("slower", [False, True])
def test_report_states_goals_from_the_numbers(tmp_path, slower):
    tool = load_tool()
    growth = 1.7 if slower else 1.2
    data = synthetic({64: 0.010, 896: 0.010 * growth}, {64: 0.011, 896: 0.020}, {"impl": 0.9, "hf": 1.0})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    assert tool.main([str(path), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "run.md").read_text()
    verdict = "not met" if slower else "met"
    assert f"{growth:.2f}x (min {growth:.2f}x) -> **{verdict}**" in report
    assert "ratio 0.90 (min 0.90) -> **met**" in report  # training step 0.9 s against Hugging Face's 1.0 s
    assert "| 1024 | 40 ms | 60 ms | 10 ms | 1.50x | 4.00x |" in report  # flash / naive, naive / sdpa
    assert "20.00x" in report  # uncached / cached speedup


def test_report_rejects_a_file_that_is_not_benchmark_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"tests": []}))
    assert load_tool().main([str(path)]) == 2


def test_report_includes_the_interleaved_goal_measurement(tmp_path):
    tool = load_tool()
    data = synthetic({64: 0.010, 896: 0.014}, {64: 0.011, 896: 0.020}, {"impl": 1.2, "hf": 1.0})
    (tmp_path / "run.json").write_text(json.dumps(data))
    stats = {
        "median": {
            "train_step_vs_hf": 1.2,
            "train_step_goal_met": False,
            "decode_growth": 1.4,
            "decode_growth_goal_met": True,
            "hf_decode_growth": 1.8,
            "decode_vs_hf": {"64": 0.9, "896": 0.7},
            "decode_vs_hf_goal_met": True,
        }
    }
    stats["min"] = stats["median"]
    goals = {
        "goals": {"reference": stats},
        "train_step": {"hf": {"rounds": 10}},
        "decode": {"hf@64": {"rounds": 60}},
        "clock": "process_time",
        "threads": 1,
        "machine": {"load_average": [1.0, 2.0, 3.0]},
    }
    (tmp_path / "run_goals.json").write_text(json.dumps(goals))
    assert tool.main([str(tmp_path / "run.json")]) == 0
    report = (tmp_path / "run.md").read_text()
    assert "reference: training step / HF 1.20 (min 1.20) -> **not met**" in report
    assert "1.40x (min 1.40x; Hugging Face 1.80x) -> **met**" in report
    assert "context 64: 0.90 (min 0.90), context 896: 0.70 (min 0.70) -> **met**" in report
