"""Measuring the error behind the tolerance table.

With ``SPEC_MEASURE_TOLERANCES=out.json`` set, every check with a math tolerance records, per kind,
the metric ``max |actual - expected| / (1 + |expected|)`` and where it was seen. Run on a
float32-internal computation (the reference on float32 inputs, or an implementation that computes
in float32 whatever the input dtype), this is the error the math tolerances must admit.
"""

from __future__ import annotations

import json
import os

import torch

from .treemap import tree_leaves

ENV = "SPEC_MEASURE_TOLERANCES"
_worst: dict[str, tuple[float, str]] = {}


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def metric(actual, expected) -> float:
    """``max |a - e| / (1 + |e|)`` over every tensor and float in the (possibly nested) values."""
    found = 0.0
    got = dict(tree_leaves(actual, leaf=(torch.Tensor, float)))
    for path, e in tree_leaves(expected, leaf=(torch.Tensor, float)):
        a = got.get(path)
        if isinstance(e, float) and isinstance(a, float | int | torch.Tensor):
            found = max(found, abs(float(a) - e) / (1 + abs(e)))
        elif isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.is_floating_point():
            if a.shape != e.shape or not e.numel():
                continue
            a64, e64 = a.detach().double().cpu(), e.detach().double().cpu()
            ok = torch.isfinite(a64) & torch.isfinite(e64)
            if ok.any():
                found = max(found, float(((a64 - e64).abs() / (1 + e64.abs()))[ok].max()))
    return found


def record(kind: str, where: str, actual, expected, dtype=None) -> None:
    value = metric(actual, expected)
    if value > _worst.get(kind, (-1.0, ""))[0]:
        _worst[kind] = (value, where)


def dump() -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "w") as f:
            json.dump({k: {"measured": v, "where": w} for k, (v, w) in sorted(_worst.items())}, f, indent=2)
