"""Extra loss terms: is a loss that differs from the plain cross-entropy the cross-entropy plus a known term?

Training code often carries a term the protocol's loss does not have, left on from a config: PaLM's and MaxText's
z-loss (``c * logsumexp(logits) ** 2`` per token) or label smoothing (``(1 - eps) * NLL + eps * mean over the
vocabulary of -log p``). Given the logits the implementation's own forward gives and the loss it reported, each
term is fitted with one coefficient; a fit is said only where the coefficient is a round number (1, 2, 3 or 5
times a power of ten), as a config value is, and the rest of the difference is within the tolerance.
"""

from __future__ import annotations

import math

import torch

ROUND = tuple(m * 10.0**e for e in range(-6, 1) for m in (1, 2, 3, 5))


def _round(c: float) -> float | None:
    return next((r for r in ROUND if math.isclose(c, r, rel_tol=2e-3)), None)


def _terms(logits: torch.Tensor, targets: torch.Tensor) -> list[tuple[str, str, torch.Tensor]]:
    """(name, how it enters, per-token value of the term the coefficient multiplies)."""
    logp = torch.log_softmax(logits, dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    nll = -logp.gather(-1, targets[..., None])[..., 0]
    return [
        ("a z-loss", "c * logsumexp(logits)**2 per token", lse**2),
        ("label smoothing", "(1 - c) * NLL + c * mean over the vocabulary of -log p", -logp.mean(-1) - nll),
    ]


def extra_term(loss: float, logits: torch.Tensor, targets: torch.Tensor, atol: float) -> str | None:
    """The description of the term with a round coefficient that turns the mean cross-entropy of ``logits`` [..., V]
    against ``targets`` [...] into ``loss``; ``None`` when none does."""
    logits, targets = logits.detach().double().cpu(), targets.detach().long().cpu()
    nll = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))
    gap = loss - nll
    if not math.isfinite(gap) or abs(gap) <= atol:
        return None
    for name, how, term in _terms(logits, targets):
        mean = float(term.mean())
        if abs(mean) < 1e-12:
            continue
        c = _round(gap / mean)
        if c is not None and abs(nll + c * mean - loss) <= max(atol, 1e-9 * abs(loss)):
            return (
                f"loss is the cross-entropy ({nll:.6g}) plus {name} with coefficient {c:g} ({how}; "
                f"{c:g} * {mean:.6g} = {c * mean:.6g}): a term the protocol's loss does not have, left on from a config"
            )
    return None
