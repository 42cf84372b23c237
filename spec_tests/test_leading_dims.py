"""Any leading dims: the names whose protocol shapes are ``[..., d]`` give the same result with one leading dim
fewer, one more or none at all, not only on the [B, T, d] or [B, H, T, d] inputs a model hands them.

One generic test over the protocol entries that say so (``any_leading_dims``), on each one's float64 inputs
(``precision_sample``), as ``@ops(op_db)`` reads OpInfos; judged at the name's math tolerance.
"""

import pytest
import torch

from . import filters, inputs, round_trip
from .attention_inputs import qkv
from .harness.plugin.markers import judges
from .inputs import S
from .protocol import ANY_LEADING, COMPONENT_OF, ENTRY, PRECISION_FUNCTIONS

NAMES = [n for n in PRECISION_FUNCTIONS if n in ANY_LEADING]
WHAT = {
    "fewer": "one leading dim fewer",
    "more": "two leading dims more",
    "none": "no leading dims",
    "strided": "a non-contiguous view, stored column-major",
    "strided-as-given": "a non-contiguous view, stored column-major, of its own rank",
}


def _case(name: str, how: str):
    loading = round_trip.LOADING if ENTRY[name].loaded_as else ()
    marks = [
        pytest.mark.component(COMPONENT_OF[name]),
        judges(name, explained_by=loading),
        pytest.mark.bug_class("leading_dims"),
    ]
    return pytest.param(name, how, marks=marks, id=f"{name}-{how}")


def _sharing(x: torch.Tensor, t: torch.Tensor, dims: int) -> bool:
    """``t`` is ``x`` or has ``x``'s first ``dims`` sizes (cross_entropy's targets beside its logits)."""
    return t is x or (t.ndim >= dims and t.ndim <= x.ndim and t.shape[:dims] == x.shape[:dims])


def reshaped(args: tuple, kwargs: dict, how: str) -> tuple[tuple, dict]:
    """The inputs with one leading dim fewer (the first tensor's two leading dims merged, or its only one
    dropped: row 0) or two more (``more``), every tensor that shares those leading dims changed alike."""
    x = next(a for a in args if isinstance(a, torch.Tensor))

    def change(v):
        if not isinstance(v, torch.Tensor):
            return v
        if how == "fewer" and x.ndim >= 3 and _sharing(x, v, 2):
            return v.reshape(-1, *v.shape[2:])
        if how == "fewer" and x.ndim == 2 and _sharing(x, v, 1):
            return v[0]
        if how == "more" and _sharing(x, v, 1):  # two more: [2, 1, ...], the second copy's rows rolled (code
            # written for one fixed rank more, candle's match on [b1, b2, _, _], meets a rank it does not handle)
            return torch.stack([v, v.roll(1, dims=0)]).unsqueeze(1)
        return v

    return tuple(change(a) for a in args), {k: change(v) for k, v in kwargs.items()}


def strided(args: tuple, kwargs: dict, core: int, *, add: bool = True) -> tuple[tuple, dict]:
    """The inputs with the first tensor, and every tensor that shares its leading dims, as a non-contiguous view of
    the same values: stored in column-major order (its axes reversed, then reversed back), so neither can its
    leading dims be flattened by a view (``logits.view(-1, V)`` on ``[2, B, V]``) nor is its last axis unit-stride
    (``torch.view_as_complex``, which RoPE by complex numbers calls, raises on that: held-out batch 64). An input
    with one leading dim gets a second one first (two copies, the second with its rows rolled); ``add=False``: not
    (code that merges the added dims by a reshape copies them into a contiguous tensor, and a view it takes later of
    the transposed per-head tensors is never met: held out, Megatron's key.view after a permute)."""
    x = next(a for a in args if isinstance(a, torch.Tensor))
    second = add and x.ndim - core == 1

    def change(v):
        if not (isinstance(v, torch.Tensor) and _sharing(x, v, 1)):
            return v
        if second:
            v = torch.stack([v, v.roll(1, dims=0)])
        reverse = tuple(reversed(range(v.ndim)))
        return v.permute(reverse).contiguous().permute(reverse) if v.ndim >= 2 else v

    return tuple(change(a) for a in args), {k: change(v) for k, v in kwargs.items()}


def without_leading_dims(args: tuple, kwargs: dict, core: int) -> tuple[tuple, dict]:
    """The inputs with no leading dim at all: the first tensor's row 0 of every leading dim, down to its ``core``
    dims, and every tensor that shares those leading dims alike."""
    x = next(a for a in args if isinstance(a, torch.Tensor))
    lead = x.ndim - core

    def change(v):
        return v[(0,) * lead] if isinstance(v, torch.Tensor) and _sharing(x, v, lead) else v

    return tuple(change(a) for a in args), {k: change(v) for k, v in kwargs.items()}


def _first_rank(name: str) -> int:
    args, _ = ENTRY[name].precision_sample(inputs, S, "cpu")
    return next(a for a in args if isinstance(a, torch.Tensor)).ndim


# "none" only where it differs from "fewer" (a first input with more than one leading dim)
CASES = [
    *[(n, how) for n in NAMES for how in ("fewer", "more", "strided")],
    *[(n, "none") for n in NAMES if _first_rank(n) > ENTRY[n].core_rank + 1],
    *[(n, "strided-as-given") for n in NAMES if _first_rank(n) == ENTRY[n].core_rank + 1],
]


@pytest.mark.parametrize("name,how", [_case(n, how) for n, how in CASES])
def test_any_leading_dims(spec, name, how):
    """A [..., d] name computes on inputs with one leading dim fewer (two merged, or a 2-D input's only one
    dropped), two more, or none (a single row ``[d]``; rope's ``[T, d_head]``): its protocol shapes allow any
    leading dims (protocol: linear, softmax, silu, rmsnorm, layernorm, swiglu, gelu_mlp, rope,
    scaled_dot_product_attention, sampling_probs, amendment 3); and on a non-contiguous view of the same values
    (amendment 30: a view that cannot be flattened without a copy, HF's Conv1D ``x.view(-1, d)``)."""
    args, kwargs = ENTRY[name].precision_sample(spec.inputs, S, spec.device)
    kwargs = filters.supported(spec.impl, kwargs)
    if how == "none":
        args, kwargs = without_leading_dims(args, kwargs, ENTRY[name].core_rank)
    elif how.startswith("strided"):
        args, kwargs = strided(args, kwargs, ENTRY[name].core_rank, add=how == "strided")
    else:
        args, kwargs = reshaped(args, kwargs, how)
    shape = list(next(a for a in args if isinstance(a, torch.Tensor)).shape)
    spec.call(
        name,
        *args,
        kind=ENTRY[name].tolerance,
        label=how,
        behaviour=f"{name} of a {len(shape)}-D input {shape} ({WHAT[how]}): "
        + ("any memory layout is allowed" if how.startswith("strided") else "any leading dims are allowed"),
        rebase=round_trip.for_call(spec, name, args, kwargs),
        **kwargs,
    )


@judges("scaled_dot_product_attention")
@pytest.mark.component("attention")
@pytest.mark.bug_class("leading_dims", "gqa")
@pytest.mark.parametrize("lead", [(), (2, S.B)], ids=["3-D", "5-D"])
def test_any_leading_dims_with_gqa(spec, lead):
    """GQA attention on per-head tensors with no batch axis [H, T, d] or two leading dims [2, B, H, T, d]: the heads
    are the third axis from the end whatever comes before (protocol: scaled_dot_product_attention; Conventions,
    GQA)."""
    spec.impl.require_capability("gqa")
    q, k, v = qkv(spec, 2 * S.B, S.H, S.H_KV, 6, S.T, S.D_HEAD, seed=59)
    q, k, v = (t.reshape(*lead, *t.shape[-3:]) if lead else t[0] for t in (q, k, v))
    spec.call(
        "scaled_dot_product_attention",
        q,
        k,
        v,
        kind="attention",
        label="x".join(map(str, q.shape)),
        behaviour=f"GQA attention ({S.H} query heads over {S.H_KV} kv heads) on q of shape {list(q.shape)}",
    )
