"""Knob search: for every protocol function with a family, each bug (written with torch.nn.functional or a
plain formula in tests/diagnosis_knob_cases.py, not with the library's variants) is named with confidence
>= 0.9; the correct output, random noise, and a bug outside the family are not."""

import pytest
import torch
from diagnosis_cases import EXACT, assert_names, noise_like, randn
from diagnosis_knob_cases import CASES, POSITIVE

from spec_tests.harness.diagnosis import knob_causes


@pytest.mark.parametrize("case,label", POSITIVE, ids=[f"{c.name}-{label}" for c, label in POSITIVE])
def test_bug_is_named(case, label):
    make, code = case.bugs[label]
    with torch.no_grad():
        actual = make()
    causes = case.diagnose(actual)
    cause = assert_names(causes, code, 0.9)
    assert [c for c in causes if c.confidence >= 0.9] == [cause], "one confident cause only"


def case_id(c):
    return f"{c.name}-{'_'.join(f'{k}={v}' for k, v in c.kwargs.items()) or 'defaults'}-{c.style}-{c.tol['atol']:g}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_correct_output_is_silent(case):
    """The independently computed specified output matches the family's own specified computation."""
    assert case.diagnose(case.correct) == []


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_noise_names_nothing(case):
    correct = case.correct
    if correct.dtype == torch.bool:
        actual = torch.rand(correct.shape, generator=torch.Generator().manual_seed(1)) > 0.5
    else:
        actual = noise_like(correct.double(), 99)
    assert [c for c in case.diagnose(actual) if c.confidence >= 0.9] == []


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_bug_outside_the_family_names_nothing(case):
    with torch.no_grad():
        actual = case.other(case.correct)
    assert [c for c in case.diagnose(actual) if c.confidence >= 0.9] == []


def test_unknown_function_and_unbindable_arguments_give_nothing():
    x = randn(3, 4, seed=0)
    assert knob_causes("not_a_protocol_name", (x,), {}, x, rope_style="interleaved", **EXACT) == []
    assert knob_causes("rmsnorm", (x, x, x, x, x), {}, x, rope_style="interleaved", **EXACT) == []


def test_underflowing_log_of_softmax_is_not_called_a_missing_max_subtraction():
    """log(softmax(x)) subtracts the max and still gives -inf where a probability underflows: a mistake of its own,
    never named "no max subtraction" with confidence (both give an infinite loss on these logits)."""
    from spec_tests.harness.diagnosis import describe

    logits = randn(6, 16, seed=3) * 200.0
    targets = torch.arange(6) % 16
    actual = torch.nn.functional.nll_loss(torch.log(torch.softmax(logits, -1)), targets)
    causes = knob_causes("cross_entropy", (logits, targets), {}, actual, rope_style="interleaved", **EXACT)
    assert "knob:log_of_softmax" in {c.code for c in causes}
    first = describe(causes)[0]
    assert first.startswith("likely cause (ambiguous") or "log(softmax" in first.split("(evidence")[0], first


def test_two_rope_scaling_parameters_read_in_each_other_s_place_are_named():
    """Every two numeric parameters of a rope_scaling dict exchanged is a variant (YaRN's beta_fast and beta_slow, a
    held-out bug no listed variant named): the exchange fits alone; the right scaling fits none."""
    import reference
    from spec_tests.harness.diagnosis.variant import fitting_variants
    from spec_tests.harness.judging.tolerances import tolerance
    from spec_tests.test_rope_scaling import SCALINGS, variants

    x = torch.randn(2, 3, 12, 10, dtype=torch.float64)
    pos = torch.arange(60, 72)
    call = lambda ref, s, x: ref.rope(x, pos, scaling=s)
    swapped = {**SCALINGS["yarn"], "beta_fast": 1, "beta_slow": 32}
    tol = tolerance("positions")
    found = fitting_variants(variants("yarn", call), call(reference, swapped, x), tol, reference, x)
    assert [v.summary for v in found] == ["the yarn scaling reads beta_fast and beta_slow in each other's place "
                                          "(exchanged)"]  # fmt: skip
    assert fitting_variants(variants("yarn", call), call(reference, SCALINGS["yarn"], x), tol, reference, x) == []


def test_a_second_observation_parts_mistakes_that_fit_the_first_alike():
    """Where several mistakes fit, one whose ``confirm`` says it does not explain a second observation is dropped;
    one that cannot tell (None, or a raising confirm) is kept; where every one is ruled out all are kept (a second
    observation that explains nothing decides nothing)."""
    from spec_tests.harness.diagnosis.variant import Variant, confirmed, fitting_variants, variant_lines
    from spec_tests.harness.judging.tolerances import tolerance

    def raises():
        raise RuntimeError("cannot run")

    make = lambda name, confirm: Variant("knob:adamw_rule", name, f"fix {name}", lambda: torch.ones(3), confirm=confirm)
    right, wrong, unsure, broken = make("a", lambda: True), make("b", lambda: False), make("c", None), make("d", raises)
    tol = tolerance("training")
    assert fitting_variants([right, wrong], torch.ones(3), tol) == [right]
    assert variant_lines(fitting_variants([right, wrong], torch.ones(3), tol))[0][0].startswith("likely cause: a.")
    assert confirmed([right, wrong, unsure, broken]) == [right, unsure, broken]
    also_wrong = make("e", lambda: False)
    assert confirmed([wrong, also_wrong]) == [wrong, also_wrong]
    calls = []
    alone = make("f", lambda: calls.append(1) or False)
    assert confirmed([alone]) == [alone] and calls == []  # one mistake fits: nothing to part, no second run
