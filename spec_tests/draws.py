"""Which distribution seeded draws follow: the causes a frequency test can name (``sample``'s and ``generate``'s).

Draws that miss the protocol's distribution are compared with the distributions the classic mistakes draw from,
each computed by the reference's ``sampling_probs`` with the mistake's options: the filters skipped, one filter
skipped, the temperature skipped, and a second softmax over the probabilities (a categorical that takes logits
given probabilities). A cause is named only where exactly one of them fits the frequencies (within 5.5 standard
errors, nothing drawn where it gives 0); where several fit, the difference is described, weakly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def follows(counts: torch.Tensor, p: torch.Tensor, n_draws: int, slack: float = 1e-3) -> bool:
    """Draw frequencies ``counts`` follow ``p``: nothing drawn where p is 0, each within 5.5 standard errors, and the
    tokens never drawn, among those ``p`` gives 8 expected draws or more, together expected fewer than 40 times.

    A filter the options do not ask for (a default top-k of 50 over 67 tokens) leaves out many tokens whose frequencies
    each stay within their bounds. A set S of tokens goes undrawn with probability (1 - p(S))^n <= e^-40 where its
    expected draws reach 40; a smallest such set of tokens of 8 or more holds at most 5, so over every set of up to 5
    of 100 tokens a correct sampler fails this below 1e-9."""
    p = p.detach().double().cpu()
    bound = 5.5 * (p * (1 - p) / n_draws).sqrt() + slack
    within = bool(((counts - p).abs() <= bound).all())
    return not bool(((counts > 0) & (p == 0)).any()) and within and missed(counts, p, n_draws)[0] < MISSED


MISSED = 40  # expected draws of the tokens never drawn (each expected 8 times or more) that fail ``follows``


def missed(counts: torch.Tensor, p: torch.Tensor, n_draws: int) -> tuple[float, list[int]]:
    """The tokens never drawn (``counts`` 0) that ``p`` expects 8 times or more in ``n_draws``, and their expected
    draws together (``follows`` fails at ``MISSED``)."""
    expected = p.detach().double().cpu() * n_draws
    never = (counts.cpu() == 0) & (expected >= 8)
    return float(expected[never].sum()), torch.nonzero(never).flatten().tolist()


def candidates(kw: dict, probs_with: Callable[[dict], torch.Tensor]) -> list[tuple[str, str, torch.Tensor]]:
    """``(code, reading, distribution)`` of each classic mistake for options ``kw``; ``probs_with(options)`` is the
    reference's ``sampling_probs`` of the same logits with other options."""
    t = kw.get("temperature", 1.0)
    filters = [k for k in ("top_k", "top_p") if kw.get(k) is not None]
    found = []
    if filters:
        found.append(("knob:sampling_order", "the unfiltered temperature-scaled distribution (no top-k/top-p)",
                      probs_with({"temperature": t})))  # fmt: skip
        if t != 1.0:
            found.append(("knob:sampling_order", "the raw logits' distribution (no temperature, no filter)",
                          probs_with({"temperature": 1.0})))  # fmt: skip
    if len(filters) == 2:
        for skipped in filters:
            found.append(("knob:sampling_order", f"the distribution with {skipped} skipped (only the other filter)",
                          probs_with({k: v for k, v in kw.items() if k != skipped})))  # fmt: skip
    if t not in (0, 1.0) and filters:
        found.append(("knob:temperature", "the filtered distribution without the temperature",
                      probs_with({**kw, "temperature": 1.0})))  # fmt: skip
    if kw.get("top_k") is None and t != 0:  # a library's default top_k kept where none was given (Hugging Face's
        # generation config: 50; llama.cpp: 40)
        vocab = probs_with(kw).shape[-1]
        for k in (k for k in (40, 50) if k < vocab):
            found.append(("knob:top_k", f"a default top-k of {k} kept where no top_k was given",
                          probs_with({**kw, "top_k": k})))  # fmt: skip
    if t != 0:
        found.append(("knob:draw", "a second softmax over the probabilities (a categorical that takes logits given "
                      "probabilities)", probs_with(kw).double().softmax(-1)))  # fmt: skip
    return found


def draw_causes(who: str, counts: torch.Tensor, n_draws: int, kw: dict, probs_with: Callable) -> tuple[tuple, tuple]:
    """``(causes, codes)``: the one classic mistake (``candidates``) whose distribution the draws follow, named; where
    none or several fit, nothing."""
    try:
        found = candidates(kw, probs_with)
    except Exception:  # noqa: BLE001 - a recording without these values (replayed expectations) names nothing
        return (), ()
    fitting = [(code, reading) for code, reading, p in found if follows(counts, p, n_draws)]
    if len(fitting) != 1:
        return (), ()
    ((code, reading),) = fitting
    return (
        f"likely cause: {who} draws from {reading}: its frequencies follow it within 5.5 standard errors, and not "
        f"sampling_probs(logits, **{kw}). Fix: draw from sampling_probs with every option given",
    ), (code,)


def one_draw_causes(counts: torch.Tensor, probs: torch.Tensor, n_draws: int) -> tuple[tuple, tuple]:
    """``(causes, codes)`` where every one of ``n_draws`` rows with the same probabilities drew the same token, though
    no token has half the probability: one draw (or one row of noise) shared by the batch's rows; where that token is
    the argmax, greedy picking fits as well and is said beside it. Nothing otherwise."""
    if float(counts.max()) != 1.0 or float(probs.max()) >= 0.5:
        return (), ()
    token = int(counts.argmax())
    argmax = token == int(probs.argmax())
    return (
        f"likely cause: all {n_draws} rows (the same probabilities) drew the same token, {token}"
        + (" (the argmax: greedy picking, or" if argmax else " (not the argmax:")
        + " one draw or one row of noise shared by every row of the batch). Fix: draw each row on its own "
        "(torch.multinomial(probs, 1) over [B, V]; an exponential-noise race with noise of shape [B, V])",
    ), ("knob:draw",)
