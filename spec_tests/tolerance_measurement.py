"""Measuring the float32 error behind the tolerance table.

With ``SPEC_MEASURE_TOLERANCES=out.json`` set, every float32 ``spec.check`` records, per
tolerance kind, the metric ``max |actual - expected| / (1 + |expected|)`` and where it was seen.
Run on the reference, this is the reference's own float32 error on the suite's inputs.
"""

from __future__ import annotations

import json
import os

import torch

ENV = "SPEC_MEASURE_TOLERANCES"
_worst: dict[str, tuple[float, str]] = {}


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def metric(actual, expected) -> float:
    """``max |a - e| / (1 + |e|)`` over every tensor in the (possibly nested) values."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        if not expected.is_floating_point() or actual.shape != expected.shape or not expected.numel():
            return 0.0
        a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
        ok = torch.isfinite(a) & torch.isfinite(e)
        return float(((a - e).abs() / (1 + e.abs()))[ok].max()) if ok.any() else 0.0
    if isinstance(expected, dict) and isinstance(actual, dict):
        return max((metric(actual.get(k), v) for k, v in expected.items()), default=0.0)
    if isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        return max((metric(a, e) for a, e in zip(actual, expected)), default=0.0)
    if isinstance(expected, float):
        return abs(float(actual) - expected) / (1 + abs(expected))
    return 0.0


def record(kind: str, where: str, actual, expected) -> None:
    value = metric(actual, expected)
    if value > _worst.get(kind, (-1.0, ""))[0]:
        _worst[kind] = (value, where)


def dump() -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "w") as f:
            json.dump({k: {"measured": v, "where": w} for k, (v, w) in sorted(_worst.items())}, f, indent=2)
