"""The graded performance checks' plumbing (no timing): failures are reported, not raised, and
leaderboard entries sort a check that could not run last."""

from __future__ import annotations

import types

import pytest

from benchmarks import perf_checks


def not_implemented(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(name)

    return fn


def test_checks_of_an_unimplemented_skeleton_fail_with_the_reason():
    skeleton = types.SimpleNamespace(
        **{n: not_implemented(n) for n in ("build_model", "flash_attention", "scaled_dot_product_attention")}
    )
    checks = perf_checks.run_perf_checks(skeleton, "cpu", threads=None)
    assert [c["name"] for c in checks] == list(perf_checks.CHECK_NAMES)
    for c in checks:
        assert c["passed"] is False and c["value"] is None, c
        assert c["error"].startswith("not implemented: "), c["error"]
    assert "build_model" in checks[0]["error"] and "flash_attention" in checks[2]["error"]


def test_unknown_check_or_device_is_a_value_error():
    with pytest.raises(ValueError, match="tpu"):
        perf_checks.run_perf_checks(object(), "tpu")
    with pytest.raises(ValueError, match="fastest"):
        perf_checks.run_perf_checks(object(), "cpu", only=("fastest",))


def test_leaderboard_entries_keep_order_and_sort_failures_last():
    checks = [
        dict(name="decode_cache_speedup", value=12.3456, order="desc"),
        dict(name="train_step_vs_reference", value=None, order="asc"),
        dict(name="flash_vs_naive", value=None, order="desc"),
    ]
    entries = perf_checks.leaderboard_entries(checks)
    assert entries[0] == {"name": "decode_cache_speedup", "value": round(12.3456, 3), "order": "desc"}
    worst_asc, worst_desc = entries[1]["value"], entries[2]["value"]
    assert worst_asc > 1e6 and worst_desc == 0.0
