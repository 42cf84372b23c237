"""Cross-entropy and the next-token language-model loss."""

import pytest
import torch

from . import inputs
from .assertions import require
from .inputs import S

pytestmark = pytest.mark.component("losses")

DTYPES = [torch.float64, torch.float32]
N = S.B * S.T


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_cross_entropy_mean_nll(spec, dtype):
    """cross_entropy is the mean negative log-likelihood of the targets (protocol: cross_entropy)."""
    logits = inputs.randn(N, S.V, seed=31, scale=3.0, dtype=dtype, device=spec.device)
    targets = inputs.token_ids(N, seed=32, device=spec.device)
    spec.check(
        lambda m, lg, t: m.cross_entropy(lg, t),
        logits,
        targets,
        behaviour="cross_entropy(logits [N, V], targets [N])",
        component="cross_entropy",
        kind="loss",
    )
    spec.check(
        lambda m, lg, t: m.cross_entropy(lg, t),
        logits.reshape(S.B, S.T, S.V),
        targets.reshape(S.B, S.T),
        behaviour="cross_entropy(logits [B, T, V], targets [B, T]), as lm_loss calls it",
        component="cross_entropy",
        kind="loss",
        label="3d",
    )


@pytest.mark.bug_class("ignore_index")
def test_cross_entropy_ignores_ignore_index(spec):
    """Targets equal to ignore_index neither add loss nor count in the mean (protocol: cross_entropy)."""
    logits = inputs.randn(N, S.V, seed=33, scale=3.0, device=spec.device)
    targets = inputs.token_ids(N, seed=34, device=spec.device)
    targets[::3] = -100
    spec.check(
        lambda m, lg, t: m.cross_entropy(lg, t),
        logits,
        targets,
        behaviour="mean over the non-ignored targets only (default ignore_index=-100)",
        component="cross_entropy",
        kind="loss",
    )
    custom = targets.clone()
    custom[custom == -100] = 7
    custom[1::4] = 7
    spec.check(
        lambda m, lg, t: m.cross_entropy(lg, t, ignore_index=7),
        logits,
        custom,
        behaviour="cross_entropy honours a custom ignore_index",
        component="cross_entropy",
        kind="loss",
        label="custom",
    )


@pytest.mark.bug_class("stability")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_cross_entropy_stable_for_large_logits(spec, dtype):
    """cross_entropy is finite and exact for logits near ±1e4 (symptoms table: exp of a large number)."""
    logits = inputs.randn(N, S.V, seed=35, dtype=dtype, device=spec.device) * 1e4
    targets = inputs.token_ids(N, seed=36, device=spec.device)
    loss = spec.check(
        lambda m, lg, t: m.cross_entropy(lg, t),
        logits,
        targets,
        behaviour="cross_entropy with logits near ±1e4",
        component="cross_entropy",
        kind="loss",
    )
    require(
        bool(torch.isfinite(torch.as_tensor(loss))),
        behaviour="cross_entropy is finite for logits near ±1e4",
        found=f"loss = {loss}",
        component="cross_entropy",
    )


@pytest.mark.bug_class("unshifted_labels")
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_lm_loss_predicts_the_next_token(spec, dtype):
    """lm_loss scores logits at t against ids at t+1 (course notes: loss computed on unshifted labels)."""
    logits = inputs.randn(S.B, S.T, S.V, seed=37, scale=3.0, dtype=dtype, device=spec.device)
    ids = inputs.token_ids(S.B, S.T, seed=38, device=spec.device)
    spec.check(
        lambda m, lg, i: m.lm_loss(lg, i),
        logits,
        ids,
        behaviour="lm_loss(logits, ids) = cross_entropy(logits[:, :-1], ids[:, 1:])",
        component="lm_loss",
        kind="loss",
    )
