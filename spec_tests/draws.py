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
    """Draw frequencies ``counts`` follow ``p``: nothing drawn where p is 0, each within 5.5 standard errors."""
    p = p.double().cpu()
    bound = 5.5 * (p * (1 - p) / n_draws).sqrt() + slack
    return not bool(((counts > 0) & (p == 0)).any()) and bool(((counts - p).abs() <= bound).all())


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
