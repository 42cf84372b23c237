"""Turning next-token logits into a distribution and drawing a token from it.

The order is fixed (protocol v1): divide by temperature -> keep the top-k logits -> keep the
top-p nucleus of the *temperature-scaled* distribution -> renormalise -> sample.
"""

from __future__ import annotations

import torch


def sampling_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """The distribution actually sampled from.

    Shapes: ``logits [..., V]`` -> probabilities ``[..., V]`` (each row sums to 1; removed tokens
    have probability exactly 0).

    1. ``temperature == 0``: return a one-hot at the argmax (greedy); skip the rest.
    2. ``scaled = logits / temperature``.
    3. ``top_k``: keep the ``top_k`` largest scaled logits per row, set the rest to ``-inf``
       (ties with the k-th value are kept; ``top_k >= V`` keeps everything).
    4. ``top_p``: on ``softmax(scaled)`` (after top-k), sort probabilities descending and keep the
       smallest prefix whose mass reaches ``top_p``: a token is dropped when the mass of the
       tokens ranked above it already reaches ``top_p``. So the token that crosses ``top_p`` is
       kept, and the top token is always kept. Compare with a small tolerance (a few ulps):
       ``[0.5, 0.3, 0.1, 0.1]`` with ``top_p=0.8`` keeps exactly the first two even though
       ``0.5 + 0.3`` may round below 0.8.
    5. Renormalise: softmax of the filtered logits.

    ``temperature < 0``, ``top_k < 1`` or ``top_p`` outside ``(0, 1]`` -> ``ValueError``.

    Protocol v2 (amendments 18-19): ``top_k`` and ``top_p`` are capabilities. A sampler without
    one declares ``PROTOCOL_VERSION = 2`` and leaves it out of ``CAPABILITIES``: only that
    filter's tests are skipped; shapes, temperature and reproducibility are still judged.

    Classic bugs to avoid:
    - apply temperature (and top-k/top-p) before sampling -- filtering the raw logits and then
      dividing, or sampling from the unfiltered distribution, is a listed course bug;
    - keep the token that crosses top_p (dropping it can leave an empty nucleus);
    - the nucleus is of the temperature-scaled (and top-k filtered) distribution, not of the
      original logits;
    - scatter the keep/drop decision back from sorted order to vocabulary order.
    """
    raise NotImplementedError("sampling_probs")


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw token ids from ``sampling_probs(logits, temperature, top_k, top_p)``.

    Shapes: ``logits [..., V]`` -> long ids ``[...]`` (one id per row).
    Reproducible: the same ``generator`` state gives the same ids (pass it to
    ``torch.multinomial``, which wants a 2-D ``[N, V]`` input -- flatten the leading axes and
    reshape back). ``temperature == 0`` is greedy: the argmax, no randomness used.

    Classic bug to avoid: sampling from the logits (or from ``softmax(logits)``) before the
    temperature/top-k/top-p transforms -- always sample from ``sampling_probs``.
    """
    raise NotImplementedError("sample")
