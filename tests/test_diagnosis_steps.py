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
