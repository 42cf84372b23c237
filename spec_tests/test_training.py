"""Training and evaluation: batches, one optimisation step, the tiny training loop, and
token-weighted evaluation."""

import math

import numpy as np
import pytest
import torch

from . import inputs, models
from .assertions import assert_close, require, require_value_error
from .tolerances import EXACT

pytestmark = pytest.mark.component("training")

CFG = models.LLAMA_GQA


@pytest.fixture
def llama(impl):
    """Tests that build a model use the llama GQA config: skipped for implementations without llama."""
    impl.require_family("llama")


@pytest.mark.bug_class("unshifted_labels", "get_batch")
@pytest.mark.parametrize("as_numpy", [True, False], ids=["numpy", "tensor"])
def test_get_batch_windows_and_shift(spec, as_numpy):
    """get_batch returns windows x of the data and y = the same windows one token ahead (course notes: loss on unshifted labels)."""
    data = np.arange(100, 160) if as_numpy else torch.arange(100, 160)
    x, y = spec.impl.get_batch(data, 5, 8, generator=torch.Generator().manual_seed(0), device=spec.device)
    require(
        tuple(x.shape) == (5, 8) and tuple(y.shape) == (5, 8),
        component="training",
        behaviour="x and y are [batch_size, context_length]",
        found=f"x {tuple(x.shape)}, y {tuple(y.shape)}",
    )
    require(
        x.dtype == torch.long and y.dtype == torch.long,
        component="training",
        behaviour="batches are long tensors",
        found=f"x {x.dtype}, y {y.dtype}",
    )
    require(
        x.device.type == spec.device,
        component="training",
        behaviour="batches are on the requested device",
        found=f"on {x.device}",
    )
    consecutive = bool(((x[:, 1:] - x[:, :-1]) == 1).all())
    require(
        consecutive,
        component="training",
        behaviour="each row of x is a contiguous window of the data",
        found=f"x[0] = {x[0].tolist()}",
    )
    require(
        torch.equal(y, x + 1),
        component="training",
        behaviour="y is x shifted one token ahead",
        found=f"x[0] = {x[0].tolist()}, y[0] = {y[0].tolist()}",
    )


@pytest.mark.bug_class("get_batch")
def test_get_batch_reaches_every_start(spec):
    """Every start in [0, len - context_length - 1] is drawn and none beyond (protocol: get_batch)."""
    data, ctx = torch.arange(20), 6  # 14 possible starts
    gen = torch.Generator().manual_seed(1)
    starts = set()
    for _ in range(60):  # 600 draws; each start is missed with probability (13/14)**600 < 1e-19
        x, _ = spec.impl.get_batch(data, 10, ctx, generator=gen)
        starts.update(x[:, 0].tolist())
    want = set(range(len(data) - ctx))
    require(
        starts == want,
        component="training",
        behaviour=f"starts cover exactly 0..{len(data) - ctx - 1}",
        found=f"never drawn {sorted(want - starts)}, out of range {sorted(starts - want)}",
    )


@pytest.mark.bug_class("get_batch")
def test_get_batch_with_exactly_enough_data(spec):
    """With exactly context_length + 1 tokens the only window is the whole data (protocol: get_batch)."""
    x, y = spec.impl.get_batch(torch.arange(10, 19), 1, 8, generator=torch.Generator().manual_seed(0))
    require(
        x.tolist() == [list(range(10, 18))] and y.tolist() == [list(range(11, 19))],
        component="training",
        behaviour="get_batch(9 tokens, batch 1, context 8) returns the one window there is",
        found=f"x {x.tolist()}, y {y.tolist()}",
    )


@pytest.mark.bug_class("validation")
def test_get_batch_rejects_too_little_data(spec):
    """get_batch with fewer than context_length + 1 tokens raises ValueError (protocol: get_batch)."""
    require_value_error(
        lambda: spec.impl.get_batch(torch.arange(8), 2, 8),
        component="training",
        behaviour="get_batch of 8 tokens for context_length 8 raises ValueError",
    )


def two_steps(m, sd, x, y, optimizer_name, max_grad_norm):
    """Losses and weights after two train_steps from ``sd`` with one fresh optimizer.

    Two steps, because gradients left over from the first show up only in the second.
    """
    model = models.build(m, CFG, sd)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.5) if optimizer_name == "sgd" else torch.optim.AdamW(params, lr=1e-2)
    losses = [float(m.train_step(model, opt, x, y, max_grad_norm)) for _ in range(2)]
    return {"losses": losses, "weights": {k: v.detach().clone() for k, v in m.canonical_state_dict(model).items()}}


@pytest.mark.bug_class("unshifted_labels", "clipping", "train_step")
@pytest.mark.parametrize("optimizer_name", ["sgd", "adamw"])
@pytest.mark.parametrize("max_grad_norm", [None, 0.5], ids=["no-clip", "clip0.5"])
def test_train_step_matches_reference(spec, llama, optimizer_name, max_grad_norm):
    """train_step's losses and updated weights over two steps equal the reference's with the same optimizer, clipping by global norm when asked (protocol: train_step)."""
    sd = models.random_state_dict(CFG, seed=61, device=spec.device)
    ids = inputs.token_ids(3, 12, vocab=CFG["vocab_size"], seed=62, device=spec.device)
    x, y = ids[:, :-1], ids[:, 1:]
    spec.check(
        lambda m, sd, x, y: two_steps(m, sd, x, y, optimizer_name, max_grad_norm),
        sd,
        x,
        y,
        kind="training",
        component="train_step",
        behaviour=f"two train_steps with {optimizer_name} (max_grad_norm={max_grad_norm}): returned losses and new weights",
    )


def test_train_step_runs_in_training_mode(spec, llama):
    """train_step runs the forward pass in training mode, even for a model handed over in eval mode (protocol: train_step)."""
    sd = models.random_state_dict(CFG, seed=63, device=spec.device)
    model = models.build(spec.impl, CFG, sd).eval()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    ids = inputs.token_ids(2, 9, vocab=CFG["vocab_size"], seed=64, device=spec.device)
    spec.impl.train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), ids[:, :-1], ids[:, 1:])
    require(
        seen and all(seen),
        component="training",
        behaviour="the forward pass of train_step sees model.training == True",
        found=f"forward calls saw training={seen}",
    )


CORPUS = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3] * 12)


def test_tiny_model_overfits_tiny_corpus(spec, llama):
    """A small model trained with `train` memorises a repeating 16-token corpus (course notes: tiny training loop)."""
    cfg = dict(CFG, vocab_size=10, dropout=0.0)
    torch.manual_seed(0)
    with models.default_dtype(torch.float32):
        model = spec.impl.build_model(cfg).to(spec.device)
    losses = spec.impl.train(model, CORPUS, steps=80, batch_size=8, context_length=16, lr=3e-3, seed=0)
    require(
        len(losses) == 80,
        component="training",
        behaviour="train returns one loss per step",
        found=f"{len(losses)} losses",
    )
    # Uniform guessing costs ln(10) = 2.30; the corpus is a fixed cycle, so after the first
    # 16-token period every next token is determined and the loss can approach 0.
    final = sum(losses[-5:]) / 5
    require(
        final < 0.5,
        component="training",
        behaviour="the loss falls from ~ln(10) = 2.3 to below 0.5 in 80 steps",
        found=f"first {losses[0]:.3f}, mean of last five {final:.3f}",
    )


def test_train_is_deterministic_for_a_seed(spec, llama):
    """`train` from the same weights with the same seed gives the same losses (protocol: train)."""
    cfg = dict(CFG, dropout=0.1)
    sd = models.random_state_dict(cfg, seed=65, dtype=torch.float32, device=spec.device)
    runs = [
        spec.impl.train(
            models.build(spec.impl, cfg, sd).train(),
            CORPUS % cfg["vocab_size"],
            steps=4,
            batch_size=4,
            context_length=10,
            seed=3,
        )
        for _ in range(2)
    ]
    require(
        runs[0] == runs[1], component="training", behaviour="same seed, same losses", found=f"{runs[0]} vs {runs[1]}"
    )
    default = spec.impl.train(
        models.build(spec.impl, cfg, sd).train(), CORPUS % cfg["vocab_size"], steps=4, batch_size=4, context_length=10
    )
    seed0 = spec.impl.train(
        models.build(spec.impl, cfg, sd).train(),
        CORPUS % cfg["vocab_size"],
        steps=4,
        batch_size=4,
        context_length=10,
        seed=0,
    )
    require(
        default == seed0,
        component="training",
        behaviour="train's default seed is 0 (protocol: train)",
        found=f"{default} without a seed vs {seed0} with seed=0",
    )


EVAL_DATA = inputs.token_ids(61, vocab=CFG["vocab_size"], seed=66)  # 60 predictions: 5 windows of 11 + one of 5


@pytest.mark.bug_class("evaluation")
@pytest.mark.parametrize(
    "n_tokens,context_length,batch_size",
    [(61, 11, 2), (61, 11, 8), (40, 7, 3), (2, 5, 8)],
    ids=["61/11/b2", "61/11/b8", "40/7/b3", "2-tokens"],
)
def test_evaluate_matches_reference(spec, llama, n_tokens, context_length, batch_size):
    """evaluate's loss is total NLL / number of predicted tokens over consecutive windows (a short last one counts by its tokens) and perplexity = exp(loss) (course notes: evaluation loss and perplexity)."""
    sd = models.random_state_dict(CFG, seed=67, device=spec.device)
    data = EVAL_DATA[:n_tokens]
    result = spec.check(
        lambda m, sd: m.evaluate(models.build(m, CFG, sd), data, context_length, batch_size=batch_size),
        sd,
        kind="loss",
        component="evaluate",
        behaviour=f"evaluate(model, {n_tokens} tokens, context_length {context_length}, batch_size {batch_size})",
    )
    require(
        math.isclose(result["perplexity"], math.exp(result["loss"]), rel_tol=1e-12),
        component="evaluate",
        behaviour="perplexity = exp(loss)",
        found=f"perplexity {result['perplexity']}, exp(loss) {math.exp(result['loss'])}",
    )


@pytest.mark.bug_class("evaluation", "dropout_generation")
def test_evaluate_without_dropout_or_grad_and_mode_restored(spec, llama):
    """evaluate uses no dropout and no gradients, and leaves the model in the mode it found (protocol: evaluate)."""
    cfg = dict(CFG, dropout=0.5)
    sd = models.random_state_dict(cfg, seed=68, device=spec.device)
    model = models.build(spec.impl, cfg, sd)
    clean = spec.impl.evaluate(model.eval(), EVAL_DATA, 11)
    model.train()
    torch.manual_seed(1)
    noisy = spec.impl.evaluate(model, EVAL_DATA, 11)
    assert_close(
        noisy["loss"],
        clean["loss"],
        tol=EXACT,
        component="evaluate",
        behaviour="evaluate of a model in training mode with dropout 0.5 equals evaluate in eval mode",
    )
    require(
        all(m.training for m in model.modules()),
        component="evaluate",
        behaviour="evaluate restores training mode",
        found="some modules were left in eval mode",
    )
    grads = [p for p in model.parameters() if p.grad is not None]
    require(
        not grads,
        component="evaluate",
        behaviour="evaluate computes no gradients",
        found=f"{len(grads)} parameters have .grad set",
    )
