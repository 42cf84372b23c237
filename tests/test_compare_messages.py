"""Mismatch messages say exactly what is true: the error shown is the error at the place shown, and a
tolerance that allows no error is said in words (never "infx the tolerance")."""

import torch

from spec_tests.harness.judging.compare import mismatch, tensor_mismatch
from spec_tests.harness.judging.tolerances import BIT_IDENTICAL, Tolerance

LOOSE = Tolerance(1e-3, 1e-3, "test", "test")


def test_one_place_carries_both_the_largest_error_and_the_worst_ratio():
    expected = torch.tensor([[-0.0303, 1.0, 2.0]], dtype=torch.float64)
    actual = torch.tensor([[-0.0303, 3.09, 2.0]], dtype=torch.float64)
    found = tensor_mismatch(actual, expected, LOOSE).found
    assert found.startswith("max abs error 2.09, 1.04e+03x the tolerance, at [0, 1]: expected 1, got 3.09;"), found


def test_zero_tolerance_shows_the_largest_error_where_it_is():
    """Every entry a zero tolerance rejects is infinitely over it: the one shown is the largest error."""
    expected = torch.tensor([[-0.0303, 1.0, 2.0]], dtype=torch.float64)
    actual = torch.tensor([[-0.0293, 3.09, 2.0]], dtype=torch.float64)
    found = tensor_mismatch(actual, expected, BIT_IDENTICAL).found
    assert found.startswith("max abs error 2.09 at [0, 1]: expected 1, got 3.09 (no error allowed there);"), found
    assert "inf" not in found and "2 of 3 entries outside" in found


def test_largest_error_and_worst_ratio_at_different_places_are_both_shown():
    expected = torch.tensor([0.0, 100.0], dtype=torch.float64)
    actual = torch.tensor([0.5, 103.0], dtype=torch.float64)
    found = tensor_mismatch(actual, expected, LOOSE)
    assert found.found.startswith(
        "max abs error 3 at [1]: expected 100, got 103; worst against its tolerance: 500x at [0] "
        "(error 0.5: expected 0, got 0.5)"
    ), found.found
    assert found.where == "[0]" and found.ratio == 500.0


def test_numbers_against_a_zero_tolerance():
    found = mismatch(1.5, 1.0, BIT_IDENTICAL).found
    assert found.startswith("expected 1, got 1.5 (error 0.5, no error allowed there;"), found
    assert "inf" not in found
