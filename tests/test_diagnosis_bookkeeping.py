"""Bookkeeping diagnosis (spec_tests/harness/diagnosis/bookkeeping.py): AdamW's update rule, how data is cut into
windows, what a parameter count includes. Each mistake is written here independently (a hand-written optimizer,
a batch of windows, a count) and must be named by its own variant or rule alone; evidence that more than one
mechanism explains is described, never named."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from spec_tests import models
from spec_tests.harness.diagnosis import codes
from spec_tests.harness.diagnosis.bookkeeping import (
    ADAMW_RULES,
    AdamWRule,
    argument_ratio_causes,
    count_variants,
    start_range,
    target_shift,
)
from spec_tests.harness.diagnosis.variant import fitting_variants
from spec_tests.harness.judging.compare import mismatch
from spec_tests.harness.judging.tolerances import EXACT

# ----------------------------------------------------------------------------------------- AdamW


def hand_adamw(params, grads_at, steps, slip=None, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, wd=0.1):
    """AdamW as its paper writes it, with one ``slip``; ``grads_at(params)`` gives the gradients at each step."""
    params = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2 = betas
    counts, shared = [0 for _ in params], 0  # each parameter's count; one count for the optimizer (two slips)
    for _ in range(steps):
        step_t = shared + 1  # step_count_by_parameter_count: the corrections' count, read before the loop
        for i, g in enumerate(grads_at(params)):
            for _ in range(2 if slip == "stepped_twice" else 1):  # a parameter listed twice: two updates, one g
                counts[i] += 1
                shared += 1
                t = 1 if slip == "step_count_stuck" else counts[i]  # the count computed, never stored
                t = shared if slip == "step_count_per_parameter" else t
                t = step_t if slip == "step_count_by_parameter_count" else t
                if slip == "coupled_decay":
                    g = g + wd * params[i]
                if slip == "moments_not_stored":  # the updated moments never stored: every step's start from zero
                    m[i], v[i] = torch.zeros_like(g), torch.zeros_like(g)
                before = {"m": m[i], "v": v[i]}  # the moments' states before this step
                m[i] = (1 - b1) * m[i] + b1 * g if slip == "moment_weights_swapped" else b1 * m[i] + (1 - b1) * g
                if slip == "first_moment_from_the_second":  # the second moment's state read for the first's
                    m[i] = b1 * before["v"] + (1 - b1) * g
                if slip == "undamped_first_moment":  # classical momentum: the new gradient not damped by 1 - beta1
                    m[i] = m[i] - (1 - b1) * g + g
                if slip == "shared_moments":  # one tensor for both moments: v's update starts from the new m
                    v[i] = m[i]
                v[i] = b2 * v[i] + (1 - (b1 if slip == "v_weight_beta1" else b2)) * g**2
                if slip == "second_moment_from_the_first":  # the first moment's state read for the second's
                    v[i] = b2 * before["m"] + (1 - b2) * g**2
                if slip == "shared_moments":
                    m[i] = v[i]
                mh, vh = (m[i], v[i]) if slip == "no_bias_correction" else (m[i] / (1 - b1**t), v[i] / (1 - b2**t))
                vh = v[i] / (1 - b1**t) if slip == "v_hat_beta1" else vh
                step = lr * mh / (torch.sqrt(vh + eps) if slip == "eps_inside_sqrt" else torch.sqrt(vh) + eps)
                if slip == "no_sqrt_in_step_size":  # fairseq's fused step size, its square root left out
                    step = lr * (1 - b2**t) / (1 - b1**t) * m[i] / (torch.sqrt(v[i]) + eps)
                if slip == "trust_ratio":  # LAMB (tinygrad's LAMB(adam=False)): the step scaled per tensor
                    update = mh / (torch.sqrt(vh) + eps) + wd * params[i]
                    params[i] = params[i] - lr * (params[i].norm() / update.norm()) * update
                    continue
                decay = 0.0 if slip == "coupled_decay" else (wd if slip == "unscaled_decay" else lr * wd)
                decay = -wd if slip == "decay_after_lr_scale" else decay  # optax: + wd * p after scale(-lr)
                params[i] = params[i] * (1 - decay) - step
    return params


def _problem():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    targets = [torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    scales = [1e-6, 1.0]  # a tiny gradient (where eps matters) and a unit one

    def grads_at(ps):
        return [s * (p - t) for p, t, s in zip(ps, targets, scales)]

    return params, grads_at


def rule_adamw(params, grads_at, steps, rule, lr=1e-2, wd=0.1):
    leaves = [p.clone().requires_grad_(True) for p in params]
    opt = AdamWRule(leaves, lr=lr, weight_decay=wd, rule=rule)
    for _ in range(steps):
        for p, g in zip(leaves, grads_at([q.detach() for q in leaves])):
            p.grad = g
        opt.step()
    return [p.detach() for p in leaves]


def test_the_correct_rule_is_torchs_adamw():
    params, grads_at = _problem()
    leaves = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(leaves, lr=1e-2, weight_decay=0.1)
    for _ in range(4):
        for p, g in zip(leaves, grads_at([q.detach() for q in leaves])):
            p.grad = g
        opt.step()
    ours = rule_adamw(params, grads_at, 4, "adamw")
    assert all(mismatch(a, b.detach(), EXACT) is None for a, b in zip(ours, leaves))
    assert all(mismatch(a, b, EXACT) is None for a, b in zip(ours, hand_adamw(params, grads_at, 4)))


@pytest.mark.parametrize("slip", list(ADAMW_RULES))
def test_each_adamw_slip_is_reproduced_by_its_rule_alone(slip):
    params, grads_at = _problem()
    actual = hand_adamw(params, grads_at, 4, slip)
    fitting = [
        rule
        for rule in ["adamw", *ADAMW_RULES]
        if all(mismatch(a, b, EXACT) is None for a, b in zip(actual, rule_adamw(params, grads_at, 4, rule)))
    ]
    assert fitting == [slip]


@pytest.mark.parametrize("slip", ["step_count_per_parameter", "step_count_by_parameter_count"])
def test_a_count_advanced_per_parameter_counts_a_fused_parameter_once(slip):
    """The two slips whose count advances per parameter follow the model's own parameters: a fused matrix the
    canonical names split in three (wq, wk, wv) advances the count once (``together``), as code stepping the fused
    tensor does; counted per canonical weight, the rule gives other steps."""
    params, grads_at = _problem()
    fused = params[0]  # one parameter of the model's: canonically three weights (rows 0-1, 2-3, 4)
    actual = hand_adamw(params, grads_at, 4, slip)

    def split_grads(ps):
        g_fused, g_bias = grads_at([torch.cat(ps[:3]), ps[3]])
        return [g_fused[:2], g_fused[2:4], g_fused[4:], g_bias]

    def split_rule(together):
        leaves = [p.clone().requires_grad_(True) for p in (fused[:2], fused[2:4], fused[4:], params[1])]
        opt = AdamWRule(
            leaves, lr=1e-2, weight_decay=0.1, rule=slip, together=[leaves[1], leaves[2]] if together else ()
        )
        for _ in range(4):
            for p, g in zip(leaves, split_grads([q.detach() for q in leaves])):
                p.grad = g
            opt.step()
        return [torch.cat([p.detach() for p in leaves[:3]]), leaves[3].detach()]

    assert all(mismatch(a, b, EXACT) is None for a, b in zip(actual, split_rule(True)))
    assert any(mismatch(a, b, EXACT) is not None for a, b in zip(actual, split_rule(False)))


def test_adamw_rule_codes_are_known():
    assert codes.is_valid("knob:adamw_rule") and codes.is_valid("knob:data_windows")


# ----------------------------------------------------------------------------------------- windows


def _batch(starts, ctx=8, shift=1, data=None):
    data = torch.arange(100, 160) if data is None else data
    x = torch.stack([data[s : s + ctx] for s in starts])
    y = torch.stack([data[s + shift : s + shift + ctx] for s in starts])
    return x, y


@pytest.mark.parametrize("shift", [0, 2, -1])
def test_targets_shifted_by_another_constant_are_named(shift):
    x, y = _batch([3, 10, 20], shift=shift)
    said, causes, cause_codes = target_shift(x, y)
    assert cause_codes == ("knob:label_shift",) and len(causes) == 1, said


def test_right_targets_and_unrelated_targets_name_nothing():
    x, y = _batch([3, 10, 20])
    assert target_shift(x, y)[1:] == ((), ())
    noise = torch.randint(100, 160, y.shape, generator=torch.Generator().manual_seed(1))
    said, causes, cause_codes = target_shift(x, noise)
    assert (causes, cause_codes) == ((), ()) and "not one shifted copy" in said
    rows_differ = y.clone()
    rows_differ[0] += 1  # one row shifted by two, the others right: two shifts, no one mechanism
    assert target_shift(x, rows_differ)[1:] == ((), ())


WANT = set(range(14))  # 20 tokens, context 6


@pytest.mark.parametrize(
    "seen,code",
    [
        (set(range(13)), "boundary"),  # the last start never drawn
        (set(range(15)), "boundary"),  # one past the last drawn
        ({0, 6, 12}, "knob:data_windows"),  # non-overlapping chunks
    ],
    ids=["last-missing", "one-past", "chunks"],
)
def test_start_ranges_of_one_mechanism_are_named(seen, code):
    assert start_range(seen, WANT, 6)[2] == (code,)


@pytest.mark.parametrize(
    "seen",
    [set(range(12)), set(range(2, 14)), {0, 3, 5, 9}, set(range(16)), {0, 6, 12, 13}, set(range(14)) | {20}],
    ids=["two-missing", "first-missing", "scattered", "two-past", "chunks-and-last", "far-out"],
)
def test_other_start_ranges_are_described_not_named(seen):
    said, causes, cause_codes = start_range(seen, WANT, 6)
    assert (causes, cause_codes) == ((), ()) and said.startswith("never drawn")


# ----------------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("config", ["gpt2", "llama_gqa", "llama_mha"])
def test_counts_off_by_one_group_are_named_by_that_group(config):
    cfg = models.CONFIGS[config]
    sizes = {k: math.prod(s) for k, s in models.canonical_shapes(cfg).items()}
    want = sum(sizes.values())
    variants = count_variants(sizes, want)
    mistakes = {
        "the norm weights": want - sum(n for k, n in sizes.items() if "norm." in k),
        "the token embedding": want - sizes["tok_embeddings.weight"],
    }
    if cfg["family"] == "gpt2":
        mistakes["the biases"] = want - sum(n for k, n in sizes.items() if k.endswith(".bias"))
        mistakes["the vectors"] = want - sum(n for k, n in sizes.items() if k.endswith(".bias") or "norm." in k)
        mistakes["the position embeddings"] = want - sizes["pos_embeddings.weight"]
    if "lm_head.weight" not in sizes:
        mistakes["counted twice"] = want + sizes["tok_embeddings.weight"]
    for label, got in mistakes.items():
        fit = fitting_variants(variants, got, EXACT)
        assert [label in v.summary for v in fit] == [True], (label, [v.summary for v in fit])
    assert fitting_variants(variants, want + 1, EXACT) == []


# ------------------------------------------------------------------------------------- a scalar's divisor


def test_a_loss_divided_by_an_integer_argument_is_named():
    """A load-balancing loss divided by its top_k (a uniform router gives 1, not top_k) is named by the argument."""
    e, a = torch.tensor(2.00125, dtype=torch.float64), torch.tensor(2.00125 / 2, dtype=torch.float64)
    (cause,) = argument_ratio_causes({"router_logits": torch.zeros(3), "top_k": 2}, e, a, 1e-6, 1e-6)
    assert cause.summary == "the result is the expected one divided by top_k=2" and cause.code == "scale"


def test_a_ratio_two_arguments_explain_is_not_named():
    """Where two integer arguments hold the same value, the factor names neither; a ratio no argument gives, and a
    right result, name nothing."""
    e = torch.tensor(3.0, dtype=torch.float64)
    assert argument_ratio_causes({"batch_size": 4, "context_length": 4}, e, e * 4, 1e-6, 1e-6) == []
    assert argument_ratio_causes({"top_k": 2}, e, e * 3, 1e-6, 1e-6) == []
    assert argument_ratio_causes({"top_k": 2}, e, e, 1e-6, 1e-6) == []
    assert argument_ratio_causes({"flag": True}, e, e * 2, 1e-6, 1e-6) == []


def test_per_tensor_clipping_is_taken_on_the_implementation_s_own_parameters():
    """Clipping each parameter tensor alone depends on how the code splits its parameters (a fused qkv is one
    tensor), so the variant steps the implementation's own model: a model whose q, k and v are one fused parameter
    clipped per tensor is reproduced by it, and not by per-tensor clipping of the reference's separate ones."""
    from spec_tests.harness.subject.model_ops import correct_steps

    class Fused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.qkv = torch.nn.Parameter(torch.randn(6, 4, generator=g, dtype=torch.float64))
            self.head = torch.nn.Parameter(torch.randn(5, 2, generator=g, dtype=torch.float64))

        def forward(self, ids):
            h = torch.nn.functional.one_hot(ids, 4).double() @ self.qkv.T
            return h[..., :2] @ self.head.T

    class Impl:
        forward = staticmethod(lambda model, ids: model(ids))

    x, y = torch.tensor([[0, 1, 2], [3, 2, 1]]), torch.tensor([[1, 2, 3], [2, 1, 0]])

    def steps(clip_each):
        model = Fused()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 5), y.reshape(-1))
            loss.backward()
            for group in [[p] for p in model.parameters()] if clip_each else [list(model.parameters())]:
                torch.nn.utils.clip_grad_norm_(group, 0.1)
            opt.step()
            losses.append(loss.item())
        return losses, model.qkv.detach()

    def own(clip_each):
        model = Fused()
        import spec_tests.harness.subject.model_ops as ops

        made = lambda impl, m, kind, lr, eps: torch.optim.SGD(m.parameters(), lr=lr)
        original, ops.make_optimizer = ops.make_optimizer, made
        try:
            losses = correct_steps(Impl(), model, "sgd", 0.5, 1e-8, x, y, 0.1, 2, clip_each=clip_each)
        finally:
            ops.make_optimizer = original
        return losses, model.qkv.detach()

    each, whole = steps(True), steps(False)
    assert not torch.allclose(each[1], whole[1])  # the control: the two clippings differ here
    for clip_each, want in ((True, each), (False, whole)):
        got = own(clip_each)
        assert got[0] == pytest.approx(want[0]) and torch.allclose(got[1], want[1]), clip_each


def test_train_is_judged_against_the_nearer_correct_adamw():
    """The protocol names AdamW without its eps or decayed set: losses of Keras' formulation (eps 1e-7 on the
    uncorrected moment, no decay on biases and norm gains; held-out batch 31's base) are judged against that
    formulation, PyTorch's against PyTorch's, and a learning rate off by a factor 2 is far from both."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject
    from spec_tests.test_training import adamw_losses, nearest_adamw

    ref = reference_subject("interleaved")
    cfg = models.family_config(ref, "llama")
    sd = models.random_state_dict(cfg, seed=69)
    x = torch.full((4, 10), 7)
    torch_losses = ref.correct_steps(models.build(ref, cfg, sd), "adamw", 1e-3, 1e-8, x, x, 1.0, 2)
    keras_losses = adamw_losses(ref, cfg, sd, x, 2, keras=True)
    assert abs(keras_losses[1] - torch_losses[1]) > 1e-3  # the test's tolerance would fail a correct Keras AdamW
    spec = SimpleNamespace(impl=ref, failing=lambda names: [])
    assert nearest_adamw(spec, cfg, sd, x, keras_losses, torch_losses, 1e-3, "b") == (keras_losses, "Keras' AdamW")
    assert nearest_adamw(spec, cfg, sd, x, torch_losses, torch_losses, 1e-3, "b")[1] == "PyTorch's AdamW"
    doubled = ref.correct_steps(models.build(ref, cfg, sd), "adamw", 2e-3, 1e-8, x, x, 1.0, 2)
    near, _ = nearest_adamw(spec, cfg, sd, x, doubled, torch_losses, 1e-3, "b")
    assert abs(doubled[1] - near[1]) > 1e-2


def test_losses_far_from_both_adamws_are_left_to_a_failing_export():
    """Keras' formulation is stepped on gradients read under canonical names: where the losses fit neither
    formulation and canonical_state_dict fails its own tests, train's test is its consequence; where the export
    passes, the test stays charged (the nearer formulation is returned)."""
    from spec_tests import models
    from spec_tests.harness.subject.subject import reference_subject
    from spec_tests.test_training import nearest_adamw

    ref = reference_subject("interleaved")
    cfg = models.family_config(ref, "llama")
    sd = models.random_state_dict(cfg, seed=69)
    x = torch.full((4, 10), 7)
    torch_losses = ref.correct_steps(models.build(ref, cfg, sd), "adamw", 1e-3, 1e-8, x, x, 1.0, 2)
    doubled = ref.correct_steps(models.build(ref, cfg, sd), "adamw", 2e-3, 1e-8, x, x, 1.0, 2)

    def defer(failing, behaviour, why):
        return RuntimeError(f"{failing}: {why}")

    failing_export = SimpleNamespace(impl=ref, failing=lambda names: ["canonical_state_dict"], defer=defer)
    with pytest.raises(RuntimeError, match="consequence of failing canonical_state_dict"):
        nearest_adamw(failing_export, cfg, sd, x, doubled, torch_losses, 1e-3, "b")
    assert nearest_adamw(failing_export, cfg, sd, x, torch_losses, torch_losses, 1e-3, "b")[1] == "PyTorch's AdamW"
    passing = SimpleNamespace(impl=ref, failing=lambda names: [], defer=defer)
    _, name = nearest_adamw(passing, cfg, sd, x, doubled, torch_losses, 1e-3, "b")
    assert name in ("PyTorch's AdamW", "Keras' AdamW")


def test_when_train_s_updates_reach_the_model_is_read_from_its_losses():
    """Held out (batch 78), on data of one repeated token (every row the same loss and gradient): a first loss that is
    half the initial model's and half the loss after one step is a step inside the first batch (an accumulation
    boundary off by one); losses that are a correct run's a step earlier are a first step at lr 0 or updates that
    reach the model a step late (master weights copied back before the step). Correct losses say neither."""
    from spec_tests.harness.judging.tolerances import Tolerance
    from spec_tests.test_training import first_step_idle, step_timing

    tol = Tolerance(1e-4, 0.0, "test", "test")
    want = [3.2, 1.9, 1.1]
    lines, codes = step_timing([(3.2 + 1.9) / 2, 1.5, 1.0], want, tol, 4)
    assert codes == ["knob:update_timing"] and "2 of the batch's 4 rows scored by the initial model" in lines[0]
    assert step_timing(want, want, tol, 4) == ([], [])
    lines, codes = first_step_idle([3.2, 3.2, 1.9], want, tol)
    assert "knob:update_timing" in codes and "each loss is a correct run's a step earlier" in lines[0], lines
    lines, codes = first_step_idle([3.2, 3.2, 1.5], want, tol)
    assert codes == ["knob:lr_schedule"] and "a step earlier" not in lines[0], lines
