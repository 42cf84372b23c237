"""diagnosis/steps.py: one step from the same weights names the weights whose step alone differs."""

import torch

from spec_tests.harness.diagnosis.steps import step_lines
from spec_tests.harness.judging.tolerances import tolerance

TOL = tolerance("training")


def weights():
    w = {f"layers.{i}.{n}": torch.full((3,), float(i)) for i in range(2) for n in ("wq", "wk", "norm")}
    w["final_norm.weight"] = torch.ones(3)
    return w


def run(loss, w):
    return lambda: {"loss": loss, "weights": w}


def test_the_weights_whose_step_differs_are_named_by_layer():
    wrong = weights()
    for i in range(2):
        wrong[f"layers.{i}.wk"] = wrong[f"layers.{i}.wk"] + 0.1
    lines, codes = step_lines("after one SGD step", run(2.5, wrong), run(2.5, weights()), TOL)
    assert codes == ["partial_update"], lines
    assert "layers.*.wk (every layer) (2 of 7 tensors)" in lines[0] and "the other 5 are right" in lines[0], lines


def test_one_layer_is_named_alone():
    wrong = weights()
    wrong["layers.1.norm"] = wrong["layers.1.norm"] * 0
    lines, _ = step_lines("after one SGD step", run(2.5, wrong), run(2.5, weights()), TOL)
    assert "and layers.1.norm (1 of 7 tensors)" in lines[0], lines


def test_nothing_where_every_weight_or_the_loss_differs():
    shifted = {k: v + 1 for k, v in weights().items()}
    partly = weights()
    partly["layers.0.wq"] = partly["layers.0.wq"] + 1
    assert step_lines("x", run(2.5, shifted), run(2.5, weights()), TOL) == ([], [])  # a learning rate, a loss scale
    assert step_lines("x", run(2.9, partly), run(2.5, weights()), TOL) == ([], [])  # the forward differs already
    assert step_lines("x", run(2.5, weights()), run(2.5, weights()), TOL) == ([], [])


def test_nothing_where_the_step_raises():
    def broken():
        raise RuntimeError("train_step failed")

    assert step_lines("x", broken, run(2.5, weights()), TOL) == ([], [])


def test_clipping_is_named_where_losses_agree_without_it():
    from spec_tests.harness.diagnosis.steps import unclipped_lines

    lines, codes = unclipped_lines(lambda: [2.5, 2.4], lambda: [2.5, 2.4], TOL, 1.0)
    assert codes == ["knob:clipping"] and "max_grad_norm=1.0" in lines[0], lines
    assert unclipped_lines(lambda: [2.5, 2.3], lambda: [2.5, 2.4], TOL, 1.0) == ([], [])  # wrong without it too


def test_clipping_says_nothing_where_the_rerun_raises():
    from spec_tests.harness.diagnosis.steps import unclipped_lines

    def refuses():
        raise TypeError("train() got an unexpected keyword argument 'max_grad_norm'")

    assert unclipped_lines(refuses, lambda: [2.5], TOL, 1.0) == ([], [])


def test_a_gradient_wrong_from_a_point_on_the_way_back_is_said_as_that_point():
    """Every tensor before layers.1.attn's keys and values differs, everything after them is right: the step is
    said as right near the output and first wrong at those keys and values."""
    order = ["tok_embeddings.weight"] + [
        f"layers.{i}.{n}.weight" for i in range(2) for n in ("attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo")
    ]
    order += ["final_norm.weight", "lm_head.weight"]
    want = {k: torch.ones(2) for k in order}
    got = dict(want)
    for k in order[: order.index("layers.1.attn.wv.weight") + 1]:
        if k != "layers.1.attn.wq.weight":
            got[k] = torch.full((2,), 2.0)
    lines, codes = step_lines("after one SGD step", run(2.5, got), run(2.5, want), TOL)
    assert codes == ["partial_update"], lines
    assert (
        "right for the 3 tensors nearest the output (lm_head.weight, final_norm.weight, layers.1.attn.wo.weight)"
        in (lines[0])
    ), lines
    assert (
        "first differs at layers.1.attn.wk.weight, layers.1.attn.wv.weight, and 7 of the 7 tensors before" in (lines[0])
    ), lines


def test_weights_wrong_up_to_the_output_are_listed():
    """Where the tensor nearest the output differs too, there is no right part near the output to say: the wrong
    ones are listed."""
    want = {k: torch.ones(2) for k in ("tok_embeddings.weight", "layers.0.attn.wq.weight", "final_norm.weight")}
    got = {**want, "tok_embeddings.weight": torch.zeros(2), "final_norm.weight": torch.zeros(2)}
    lines, codes = step_lines("after one SGD step", run(2.5, got), run(2.5, want), TOL)
    assert codes == ["partial_update"] and "tok_embeddings.weight, final_norm.weight (2 of 3 tensors)" in lines[0]


def test_the_learning_rate_the_steps_took_is_fitted():
    """Losses that fall as the rate grows: the rate that gives the implementation's losses is named."""
    from spec_tests.harness.diagnosis.steps import fitted_lr_lines

    correct = lambda rate: [3.0, 3.0 - 50 * rate, 3.0 - 90 * rate]
    lines, codes = fitted_lr_lines(correct(6e-4), correct, 4e-3, TOL)
    assert codes == ["knob:learning_rate"] and "learning rate 0.0006, not 0.004" in lines[0], lines
    assert fitted_lr_lines(correct(4e-3), correct, 4e-3, TOL) == ([], [])  # the given rate itself
    assert fitted_lr_lines([3.0, 2.9, 2.0], correct, 4e-3, TOL) == ([], [])  # no one rate gives every loss
    assert fitted_lr_lines([3.5, 2.9, 2.5], correct, 4e-3, TOL) == ([], [])  # the first loss differs already
    assert fitted_lr_lines(correct(6e-4)[:2], correct, 4e-3, TOL) == ([], [])  # two losses: any rate fits the second


def test_a_step_scaled_alike_in_every_weight_is_named_with_its_factor():
    """Held out (batch 101): gradients scaled by B / T (a batch size read from the time axis): every weight's step is
    the specified one times 0.25, the loss agrees. Named with the factor; a step scaled in some weights only is not."""
    start = weights()
    step = {k: torch.linspace(-1, 1, 3) * (1 + i) for i, k in enumerate(start)}
    theirs = {k: start[k] + step[k] for k in start}
    mine = {k: start[k] + 0.25 * step[k] for k in start}
    lines, codes = step_lines("after one SGD step", run(2.5, mine), lambda: {**run(2.5, theirs)(), "start": start}, TOL)
    assert codes == ["knob:loss_reduction"] and "every weight's step is 0.25 times the specified one" in lines[0]
    mine["layers.0.wq"] = theirs["layers.0.wq"]  # one weight stepped as specified: no common factor
    lines, codes = step_lines("after one SGD step", run(2.5, mine), lambda: {**run(2.5, theirs)(), "start": start}, TOL)
    assert codes == ["partial_update"], lines
