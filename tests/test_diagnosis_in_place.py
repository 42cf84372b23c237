"""diagnosis/in_place.py: what an in-place edit did to an input, read from its values before and after the call."""

import torch

from spec_tests.harness.diagnosis.in_place import in_place_edit

X = torch.randn(3, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_a_division_in_place_is_read_as_a_scale():
    assert "divided by 0.7" in in_place_edit(X, X / 0.7)


def test_a_max_subtracted_in_place_is_read_as_a_shift_per_row():
    assert "shifted in place" in in_place_edit(X, X - X.max(-1, keepdim=True).values)


def test_entries_masked_in_place_are_counted():
    masked = X.masked_fill(X < 0, float("-inf"))
    assert f"{int((X < 0).sum())} of its 21 entries were set to -inf" in in_place_edit(X, masked)


def test_a_sort_into_the_input_is_read_as_a_reordering():
    assert "reordered in place" in in_place_edit(X, X.sort(-1).values)


def test_an_input_zeroed_in_place_is_read_as_zeroed():
    assert "set to zero in place" in in_place_edit(X, torch.zeros_like(X))


def test_an_edit_no_simple_operation_explains_names_none():
    assert in_place_edit(X, X.exp()) is None
    assert in_place_edit(X, X[:, :3]) is None
