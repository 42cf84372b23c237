"""Lines that must hold on more than one input (issue 18: a symptom is not a cause).

- A knob setting that reproduces a failing call's output is named only where it reproduces the same call on a
  second input too (``knobs.knob_causes(second=...)``, the second input ``knobs.mixed_input``).
- A top-p line read from one count ("drops the crossing token", "keeps one past") is said only where it predicts
  the counts at the test's other boundaries; otherwise the test says what differs.
Each mistake here is written independently of the catalog."""

from __future__ import annotations

import torch
from suite_subprocess import implementation, run_suite

from spec_tests.harness.diagnosis.knobs import _sampling, knob_causes, mixed_input

PROBS = [0.5, 0.3, 0.12, 0.08]


def logits_of(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()[None]


def complement(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """A nucleus cut at 1 - top_p (an ascending sort's threshold written as top_p)."""
    return _sampling(logits, 1.0, None, 1 - top_p)


def drops_crossing(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    return _sampling(logits, 1.0, None, top_p, crossing="drop")


def causes_for(actual_of, top_p: float, *, confirm: bool):
    logits = logits_of(PROBS)
    second = None
    if confirm:
        (mixed,) = mixed_input((logits,))
        second = lambda: ((mixed,), actual_of(mixed, top_p))
    return knob_causes(
        "sampling_probs", (logits,), {"top_p": top_p}, actual_of(logits, top_p), atol=1e-9, rtol=1e-9, second=second
    )


def test_a_knob_that_fits_one_input_by_coincidence_is_not_said():
    """At top_p 0.7999 a nucleus cut at 1 - top_p and one that drops the crossing token both keep the top token
    alone: on that input alone the search is ambiguous. On a second input only the complement reproduces the
    output, and it is named alone."""
    alone = causes_for(complement, 0.7999, confirm=False)
    assert {c.code for c in alone} == {"knob:top_p_complement", "knob:top_p_boundary"}
    assert all("ambiguous" in c.summary for c in alone)
    confirmed = causes_for(complement, 0.7999, confirm=True)
    assert [c.code for c in confirmed] == ["knob:top_p_complement"]
    assert "ambiguous" not in confirmed[0].summary


def test_control_the_knob_that_holds_on_the_second_input_is_kept():
    """The control: an implementation that drops the crossing token keeps that line on the second input."""
    confirmed = causes_for(drops_crossing, 0.7999, confirm=True)
    assert [c.code for c in confirmed] == ["knob:top_p_boundary"]


def test_a_top_p_threshold_of_one_minus_top_p_is_not_read_as_a_boundary_slip(tmp_path):
    """A threshold written for an ascending sort but used on the descending one keeps one token fewer at one boundary
    and one more at another: the boundary test names the complement, and never "drops the token that crosses
    top_p" nor "keeps one token past"."""
    folder = implementation(
        tmp_path,
        patch=(
            "sampling.py",
            "        scaled = top_p_filter(scaled, top_p)",
            "        scaled = top_p_filter(scaled, 1 - top_p)",
        ),
    )
    proc = run_suite(f"--impl={folder}", "-k", "test_top_p_keeps_the_crossing_token", cwd=tmp_path, forked=True)
    assert "failed" in proc.stdout, proc.stdout[-3000:]
    assert "the nucleus is cut at 1 - top_p" in proc.stdout, proc.stdout[-3000:]
    assert "drops the token that crosses top_p" not in proc.stdout
    assert "keeps one token past" not in proc.stdout
