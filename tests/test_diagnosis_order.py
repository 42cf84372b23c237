"""Sequence outputs in another order (spec_tests/harness/diagnosis/order.py): a cache read back as (values, keys)
is named, at every layer alike; items that are wrong, or reordered differently per layer, are not."""

from __future__ import annotations

import torch

from spec_tests.harness.diagnosis.order import item_order_causes


def _layers(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 2, 5, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g)) for _ in range(n)]


def test_values_returned_before_keys_are_named():
    expected = _layers()
    actual = [(v, k) for k, v in expected]
    (cause,) = item_order_causes(expected, actual, atol=1e-8, rtol=1e-8)
    assert cause.code == "item_order" and "item 0 holds item 1's" in cause.summary


def test_a_flat_pair_is_named():
    k, v = _layers(1)[0]
    (cause,) = item_order_causes((k, v), (v, k), atol=1e-8, rtol=1e-8)
    assert "item 1 holds item 0's" in cause.summary


def test_wrong_values_or_an_order_that_differs_by_layer_are_not_named():
    expected = _layers()
    wrong = [(v * 1.5, k) for k, v in expected]
    assert item_order_causes(expected, wrong, atol=1e-8, rtol=1e-8) == []
    mixed = [(v, k) if i else (k, v) for i, (k, v) in enumerate(expected)]
    assert item_order_causes(expected, mixed, atol=1e-8, rtol=1e-8) == []
    assert item_order_causes(expected, expected, atol=1e-8, rtol=1e-8) == []
