"""What a layer's function computes on the weights as the implementation's own loading round trip gives them back.

Code whose component functions convert the weights they are given with the loader that converts a model's (an
adapter's glue) makes a loading mistake in both places: held out, a fused qkv layout, a q/k permutation, an output
kernel reshaped without its transpose, gate and up halves swapped. ``rebase`` gives the spec check that relation:
where build_model or canonical_state_dict fail their own tests and the component's output is the reference's on the
weights a one-layer model built from them gives back (``canonical_state_dict(build_model(sd))``), the failure is a
consequence of the loading, charged once.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from . import models
from .harness.subject.subject import reference_subject
from .protocol import ENTRY

LOADING = ("build_model", "canonical_state_dict")


def rebase(spec, family: str, changes: dict, given: dict, compute: Callable, like: torch.Tensor):
    """``(names, own)`` for ``spec.check``'s ``rebase``: ``own()`` builds a one-layer ``family`` model (``changes`` to
    its config) whose layer-0 weights are ``given`` (canonical names without the ``layers.0.`` prefix), gives its
    weights back, and returns ``compute(reference, back)`` (``back``: those weights as given back, by the same
    names). Where that cannot be made, a NaN of ``like``'s shape, which explains nothing."""

    nothing = lambda: torch.full(like.shape, float("nan"), dtype=torch.float64)

    def own():
        raw = spec.impl._subject  # a side computation: no crash probing
        if not all(raw.provides(n) for n in LOADING) or family not in spec.impl.families:
            return nothing()  # what is not provided explains nothing (and must not skip the test)
        try:
            config = dict(models.family_config(spec.impl, family, **changes), n_layers=1)
            sd = models.random_state_dict(config, seed=0, device=spec.device)
            sd.update({f"layers.0.{n}": w.to(torch.float64) for n, w in given.items()})
            back = raw.canonical_state_dict(models.build(raw, config, sd))
            return compute(reference_subject(spec.impl.rope_style), {n: back[f"layers.0.{n}"] for n in given})
        except (Exception, pytest.skip.Exception):  # noqa: BLE001 - a round trip that cannot be made explains nothing
            return nothing()

    return LOADING, own


def for_call(spec, name: str, args: tuple, kwargs: dict):
    """``rebase`` for a call of ``name`` whose entry says which of its arguments are a model's weights
    (``Entry.loaded_as``); None for other names. The model's sizes are read from the call: d_model from the first
    input's last axis, d_ff from the first weight's rows."""
    loaded = ENTRY[name].loaded_as
    if loaded is None:
        return None
    family, names = loaded
    given = {n: a for n, a in zip(names, args, strict=False) if n is not None}
    first = next(iter(given.values()))
    x = args[0]

    def compute(ref, back):
        weights = iter(back[n] for n in given)
        call = [a.to(torch.float64) if n is None and isinstance(a, torch.Tensor) else a for n, a in zip(names, args)]
        call = [next(weights) if n is not None else a for n, a in zip(names, call, strict=True)]
        return getattr(ref, name)(*call, **kwargs)

    return rebase(spec, family, {"d_model": x.shape[-1], "d_ff": first.shape[0]}, given, compute, x)
