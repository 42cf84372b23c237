"""Cross-entropy and the next-token language-model loss."""

import pytest
import torch

from .harness.diagnosis.variant import Variant
from .harness.plugin.markers import judges
from .inputs import S

pytestmark = pytest.mark.component("losses")

N = S.B * S.T


@judges("cross_entropy")
def test_cross_entropy_mean_nll(spec, dtype):
    """cross_entropy is the mean negative log-likelihood of the targets, for logits [N, V] and [B, T, V] (protocol:
    cross_entropy, amendment 3)."""
    logits = spec.inputs.randn(N, S.V, seed=31, scale=3.0, dtype=dtype)
    targets = spec.inputs.token_ids(N, seed=32)
    spec.call("cross_entropy", logits, targets, behaviour="cross_entropy(logits [N, V], targets [N])", kind="loss")
    spec.call(
        "cross_entropy",
        logits.reshape(S.B, S.T, S.V),
        targets.reshape(S.B, S.T),
        kind="loss",
        label="3d",
        behaviour="cross_entropy(logits [B, T, V], targets [B, T]), as lm_loss calls it",
    )


@judges("cross_entropy")
@pytest.mark.bug_class("ignore_index")
def test_cross_entropy_ignores_ignore_index(spec):
    """Targets equal to ignore_index neither add loss nor count in the mean, also when rows of a batch hold different
    numbers of them (protocol: cross_entropy)."""
    logits = spec.inputs.randn(N, S.V, seed=33, scale=3.0)
    targets = spec.inputs.token_ids(N, seed=34)
    targets[::3] = -100
    spec.call(
        "cross_entropy",
        logits,
        targets,
        kind="loss",
        behaviour="mean over the non-ignored targets only (default ignore_index=-100)",
    )
    custom = targets.clone()
    custom[custom == -100] = 7
    custom[1::4] = 7
    spec.call(
        "cross_entropy",
        logits,
        custom,
        ignore_index=7,
        kind="loss",
        label="custom",
        behaviour="cross_entropy honours a custom ignore_index",
    )
    negative = targets.clone()
    negative[negative == -100] = -1
    spec.call(
        "cross_entropy",
        logits,
        negative,
        ignore_index=-1,
        kind="loss",
        label="minus-one",
        behaviour="cross_entropy honours ignore_index=-1 (a negative ignored id other than the default)",
    )
    padded = spec.inputs.token_ids(S.B, S.T, seed=39)
    padded[0, 9:], padded[1, 4:] = -100, -100  # the rows keep 9, 4 and all 13 targets
    spec.call(
        "cross_entropy",
        logits.reshape(S.B, S.T, S.V),
        padded,
        kind="loss",
        label="padded",
        behaviour="a padded batch [B, T]: rows with 9, 4 and 13 counted targets weigh by their targets",
    )


@judges("cross_entropy")
@pytest.mark.bug_class("ignore_index")
def test_cross_entropy_gradient_matches_reference(spec):
    """The gradient of cross_entropy with respect to its logits is the reference's: (softmax - one-hot) / the number of
    counted targets on counted rows, and zero on rows whose target is ignore_index (protocol: cross_entropy, which
    train_step differentiates). Code with a backward pass of its own (a fused kernel's autograd.Function) must give
    it; held out: a hand-written backward that stopped zeroing the ignored rows, the loss itself unchanged."""
    logits = spec.inputs.randn(N, S.V, seed=35, scale=3.0)
    targets = spec.inputs.token_ids(N, seed=36)
    targets[1::4] = -100
    spec.check(
        lambda m, logits, targets: m.input_grads("cross_entropy", [logits, targets])[0],
        logits,
        targets,
        kind="loss",
        subject="cross_entropy",
        axes="n v",
        behaviour="d cross_entropy(logits [N, V], targets with every fourth -100) / d logits",
        variants=[
            Variant(
                "knob:ignore_index",
                "the rows whose target is ignore_index get a gradient in the backward pass (softmax minus the one-hot "
                "of class 0, their target read as 0), though the loss leaves them out: the backward does not zero them",
                "zero the gradient of every row whose target is ignore_index (the loss's mask, applied in the "
                "backward pass too)",
                lambda m, logits, targets: ignored_rows_in_backward(logits, targets),
            )
        ],
    )


def ignored_rows_in_backward(logits, targets, ignore_index=-100):
    """d/d logits of the counted rows' mean NLL, plus each ignored row's (softmax - one-hot of class 0) over the same
    count: a backward pass that does not zero the rows the loss leaves out."""
    counted = (targets != ignore_index).sum()
    leaf = logits.detach().clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(leaf, targets.clamp(min=0), reduction="sum") / counted
    return torch.autograd.grad(loss, leaf)[0]


@judges("cross_entropy")
@pytest.mark.bug_class("stability")
def test_cross_entropy_stable_for_large_logits(spec, dtype):
    """cross_entropy is finite and right for logits near ±1e4 (symptoms table: exp of a large number).

    Two inputs first tell the two classic mistakes apart: logits near 1000 with a small spread overflow exp without
    the max subtracted, and nothing else; logits spread over 1e4 below a row max of 0 never overflow, but their
    probabilities underflow, so log(softmax(x)) gives -inf where log_softmax does not."""
    logits = spec.inputs.randn(N, S.V, seed=35, dtype=dtype) * 1e4
    targets = spec.inputs.token_ids(N, seed=36)
    near = spec.inputs.randn(N, S.V, seed=37, dtype=dtype) * 3.0 + 1000.0
    spec.call(
        "cross_entropy", near, targets, behaviour="cross_entropy with logits near 1000", kind="loss", label="near"
    )
    spread = -logits.abs()
    spread = spread - spread.max(-1, keepdim=True).values
    spec.call(
        "cross_entropy",
        spread,
        targets,
        behaviour="cross_entropy with logits spread over 1e4 below a row max of 0",
        kind="loss",
        label="spread",
    )
    spec.call("cross_entropy", logits, targets, behaviour="cross_entropy with logits near ±1e4", kind="loss")


@judges("lm_loss")
@pytest.mark.bug_class("unshifted_labels")
def test_lm_loss_predicts_the_next_token(spec, dtype):
    """lm_loss scores logits at t against ids at t+1 (course notes: loss computed on unshifted labels)."""
    logits = spec.inputs.randn(S.B, S.T, S.V, seed=37, scale=3.0, dtype=dtype)
    ids = spec.inputs.token_ids(S.B, S.T, seed=38)
    spec.call(
        "lm_loss",
        logits,
        ids,
        kind="loss",
        axes="b t v",
        behaviour="lm_loss(logits, ids) = cross_entropy(logits[:, :-1], ids[:, 1:])",
    )


@judges("lm_loss")
@pytest.mark.bug_class("ignore_index", "unshifted_labels")
def test_lm_loss_ignores_padding(spec):
    """lm_loss is cross_entropy(logits[:, :-1], ids[:, 1:]) with cross_entropy's default ignore_index: padding ids
    of -100 are not predicted, and rows holding different numbers of real tokens weigh by their tokens
    (protocol: lm_loss, cross_entropy)."""
    logits = spec.inputs.randn(S.B, S.T, S.V, seed=40, scale=3.0)
    ids = spec.inputs.token_ids(S.B, S.T, seed=41)
    ids[0, 9:], ids[1, 4:] = -100, -100  # the rows predict 8, 3 and 12 real tokens
    spec.call(
        "lm_loss",
        logits,
        ids,
        kind="loss",
        axes="b t v",
        behaviour="lm_loss of a padded batch: rows with 8, 3 and 12 predicted tokens, -100 padding not predicted",
    )
