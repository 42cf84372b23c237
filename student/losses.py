"""Token-level losses: cross-entropy and the next-token language-model loss."""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean negative log-likelihood of ``targets`` under ``softmax(logits)``, as ``F.cross_entropy``.

    Shapes::

        logits:  [N, V]  (or [..., V])
        targets: long [N] (or [...], = logits.shape[:-1]); entries equal to ignore_index are skipped
        return:  0-dim tensor, differentiable w.r.t. logits

    ``loss = sum over kept targets of -log_softmax(logits)[target]  /  number of kept targets``.
    Shapes that disagree -> ``ValueError``. All targets ignored is unspecified (NaN, 0/0, is fine).

    Classic bugs to avoid:
    - must stay finite for logits near +-1e4: compute log-softmax as
      ``x - max - log(sum(exp(x - max)))`` (subtract the row max before exp), never
      ``log(softmax(x))`` (which gives ``log(0) = -inf``);
    - divide by the number of *non-ignored* targets, not by N;
    - do not index the log-probs with an ignored target (-100 is not a valid index).
    """
    raise NotImplementedError("cross_entropy")


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token loss of a language model: position ``t`` predicts token ``t + 1``.

    Shapes::

        logits: [B, T, V]     model output for ids
        ids:    long [B, T]   the input tokens
        return: 0-dim tensor  == cross_entropy(logits[:, :-1], ids[:, 1:]) (B*(T-1) predictions)

    Classic bug to avoid: loss on unshifted labels -- ``cross_entropy(logits, ids)`` asks each
    position to predict the token it can already see; the loss falls to ~0 and the model
    learns nothing useful. Shift: drop the last logit and the first id.
    """
    raise NotImplementedError("lm_loss")
