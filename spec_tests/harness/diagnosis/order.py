"""Sequence outputs that hold the right items in another order: ``(values, keys)`` where ``(keys, values)`` is
specified, at every layer alike."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from .cause import EXACT, Cause, as_array, fits

MAX_ITEMS = 4  # permutations of at most 4! orders


def _items(x) -> list | None:
    """``x`` as a list of tensors (a tuple of tensors), else None."""
    if isinstance(x, Sequence) and not isinstance(x, str) and all(isinstance(t, torch.Tensor) for t in x):
        return list(x)
    return None


def _groups(expected, actual) -> list[tuple[list, list]] | None:
    """The ``(expected, actual)`` item lists to reorder alike: the sequence itself (of tensors), or each of its
    entries (a list of per-layer tuples); None where the two are not shaped alike."""
    e, a = _items(expected), _items(actual)
    if e is not None:
        return [(e, a)] if a is not None and len(a) == len(e) else None
    if not isinstance(expected, Sequence) or not isinstance(actual, Sequence) or len(expected) != len(actual):
        return None
    groups = [(_items(x), _items(y)) for x, y in zip(expected, actual, strict=True)]
    ok = all(x is not None and y is not None and len(x) == len(y) for x, y in groups)
    return groups if ok and groups else None


def item_order_causes(expected, actual, *, atol: float, rtol: float) -> list[Cause]:
    """One cause where a non-identity order of the items, the same in every group, makes every item fit."""
    groups = _groups(expected, actual)
    if not groups or not 2 <= len(groups[0][0]) <= MAX_ITEMS:
        return []
    n = len(groups[0][0])

    def item_fits(e: torch.Tensor, a: torch.Tensor) -> bool:
        return fits(as_array(e), as_array(a), atol, rtol)

    for order in itertools.permutations(range(n)):
        if order == tuple(range(n)):
            continue
        if all(item_fits(e[j], a[i]) for e, a in groups for i, j in enumerate(order)):
            moved = ", ".join(f"item {i} holds item {j}'s" for i, j in enumerate(order) if i != j)
            where = "each entry's items" if len(groups) > 1 else "the items"
            return [
                Cause(
                    "item_order",
                    f"the right values in another order: {moved}",
                    "the order of the returned tuple",
                    "return the items in the order the protocol states",
                    f"{where} equal the expected ones reordered, within tolerance",
                    EXACT,
                )
            ]
    return []
