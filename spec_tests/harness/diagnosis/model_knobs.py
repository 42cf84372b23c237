"""Knob search inside the model: is a failing model output the reference model's with one knob of one
of its components changed (the RoPE exponent base, where eps sits, the attention scale, ...)?

The reference model calls its component functions through module-level names, so a component can be
swapped for one of its knob variants (``knobs.variants``) for one forward pass (``Subject.substituted``).
A model that inlines its own attention or norm with such a mistake is then named at the model level,
where the component's own tests (which call its function, not the model's copy) pass. Mistakes in how
the model connects its parts (residuals, norms, parallel branches, embedding scale, weight layout at load)
are ``wiring.py``'s, offered in the same search.
"""

from __future__ import annotations

import torch

from .knobs import variants
from .variant import Variant
from .wiring import WIRINGS, run_wired

PARTS = ("rmsnorm", "layernorm", "rope", "scaled_dot_product_attention", "swiglu", "gelu_mlp")
_REFERENCE_ONLY = ("style", "table_size", "fused", "rope_style")


def _protocol_arguments(name: str, args, kwargs) -> tuple[tuple, dict]:
    """The call as protocol v1 states it (the reference model's fast-path options turned back)."""
    kwargs = {k: v for k, v in kwargs.items() if k not in _REFERENCE_ONLY}
    if name == "scaled_dot_product_attention" and kwargs.pop("causal", False):
        q, k = args[0], args[1]
        t_q, t_k = q.shape[-2], k.shape[-2]
        mask = torch.arange(t_k, device=q.device)[None, :] <= torch.arange(t_q, device=q.device)[:, None] + (t_k - t_q)
        args = (*args[:3], mask)
    return tuple(args), kwargs


def _variant_fn(name: str, index: int, rope_style: str, first: tuple):
    """``name`` with the ``index``-th knob of its family turned, on whatever it is called with. ``first``: that knob's
    ``(code, summary, how many of its family before it share both, size of its family)`` at the first call; a later
    call whose family differs (a cached path calls attention with one query, then with several) turns the knob of the
    same code, summary and rank among those sharing them, else the one at the same index in a family of the same size,
    else none (the specified computation)."""

    def call(*args, **kwargs):
        a, k = _protocol_arguments(name, args, kwargs)
        specified, family = variants(name, a, k, rope_style=rope_style)
        code, summary, rank, size = first
        same = [v for v in family if (v.code, v.summary) == (code, summary)]
        chosen = same[rank] if rank < len(same) else family[index] if len(family) == size else None
        out = (chosen.compute if chosen is not None else specified)()
        return out.to(dtype=args[0].dtype, device=args[0].device)

    return call


def _family(name: str, compute, reference, args) -> list:
    """The knob variants of ``name`` at its first call in ``compute(reference, *args)`` (none if not called)."""
    seen: list = []
    original = getattr(reference.obj, name)

    def probe(*a, **k):
        if not seen:
            pa, pk = _protocol_arguments(name, a, k)
            seen.append(variants(name, pa, pk, rope_style=reference.rope_style)[1])
        return original(*a, **k)

    with torch.no_grad(), reference.substituted({name: probe}):
        compute(reference, *args)
    return seen[0] if seen else []


# A full search runs the model about 50 times: once per test function (and implementation); the cases
# of the same function then try only the knobs that fitted the first.
_SEARCHED: dict[str, list[tuple[str, int]] | None] = {}


def model_variants(compute, reference, args, *, memo: str | None = None) -> list:
    """``Variant``s with their ``knob``: the reference computation with one component's knob turned, or
    with one wiring choice of the model changed (``wiring.WIRINGS``).

    ``memo``: a key (test function and implementation); after the first search under a key, only the
    knobs that fitted then are offered again.
    """
    known = _SEARCHED.get(memo) if memo else None
    found = []
    for name in PARTS:
        try:
            family = _family(name, compute, reference, args)
        except Exception:  # noqa: BLE001 - a family that cannot bind these calls says nothing
            continue
        for i, v in enumerate(family):
            if memo in _SEARCHED and (known is None or (name, i) not in known):
                continue

            rank = sum((u.code, u.summary) == (v.code, v.summary) for u in family[:i])

            def run(ref, *a, name=name, i=i, first=(v.code, v.summary, rank, len(family))):
                with torch.no_grad(), ref.substituted({name: _variant_fn(name, i, ref.rope_style, first)}):
                    return compute(ref, *a)

            summary = f"{v.summary} (in the model's {name.replace('_', ' ')})"
            found.append(Variant(v.code, summary, v.fix, run, knob=(name, i)))
    fitted_groups = {w.group for w in WIRINGS if w.group and ("wiring", w.name) in (known or ())}
    for w in WIRINGS:  # how the parts are connected and the weights laid out (wiring.py)
        if memo in _SEARCHED and (known is None or ("wiring", w.name) not in known) and w.group not in fitted_groups:
            continue

        def run_wiring(ref, *a, w=w):
            return run_wired(compute, ref, a, w)

        found.append(Variant(w.code, w.summary, w.fix, run_wiring, knob=("wiring", w.name)))
    return found


def remember(memo: str | None, fitting) -> None:
    """Record which model knobs fitted the first search under ``memo`` (None: none did)."""
    if memo and memo not in _SEARCHED:
        _SEARCHED[memo] = [v.knob for v in fitting] or None
