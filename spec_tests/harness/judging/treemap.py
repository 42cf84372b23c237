"""One walker for the nested values the suite passes around: tensors inside dicts, lists and tuples."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch


def tree_map(fn: Callable, value, *, leaf: type | tuple = torch.Tensor):
    """``value`` with ``fn`` applied to every ``leaf`` (tensors by default) inside dicts, lists and tuples.

    Containers are rebuilt with their own type; every other value is returned as it is.
    """
    if isinstance(value, leaf):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: tree_map(fn, v, leaf=leaf) for k, v in value.items()}
    if isinstance(value, list | tuple) and not isinstance(value, torch.Size):
        items = [tree_map(fn, v, leaf=leaf) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else type(value)(*items)
    return value


def tree_leaves(value, path: str = "", *, leaf: type | tuple = torch.Tensor) -> Iterator[tuple[str, object]]:
    """``(path, leaf)`` for every ``leaf`` inside ``value``, depth first; paths read like ``[0]['k']``."""
    if isinstance(value, leaf):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from tree_leaves(v, f"{path}[{k!r}]", leaf=leaf)
    elif isinstance(value, list | tuple) and not isinstance(value, torch.Size):
        for i, v in enumerate(value):
            yield from tree_leaves(v, f"{path}[{i}]", leaf=leaf)


def copy_laid_out(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A detached copy of ``t`` (in ``dtype``) with ``t``'s strides: a slice stays non-contiguous, so a composition
    or a rerun on the copy meets what the call met (``clone`` makes a slice with gaps contiguous). A tensor whose
    entries share memory (an expanded one) is copied contiguous."""
    dtype = t.dtype if dtype is None else dtype
    if t.layout != torch.strided or any(s == 0 for s, n in zip(t.stride(), t.shape) if n > 1) or t.is_contiguous():
        return t.detach().to(dtype=dtype, copy=True)
    out = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device=t.device)
    return out.copy_(t.detach())


def to_float64(value):
    """Floating tensors inside ``value`` as float64 (laid out as they are); everything else as it is."""

    def widen(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or t.requires_grad or t.dtype == torch.float64:  # float64: the tensor itself
            return t.to(torch.float64) if t.is_floating_point() else t
        return copy_laid_out(t, torch.float64)

    return tree_map(widen, value)


def clone_tensors(value):
    """A copy of ``value`` with every tensor detached and copied, laid out as it is."""
    return tree_map(copy_laid_out, value)


def floating_dtype(value) -> torch.dtype | None:
    """The dtype of the first floating tensor inside ``value`` (depth first), or None."""
    return next((t.dtype for _, t in tree_leaves(value) if t.is_floating_point()), None)


def modified_inputs(pristine, args) -> list[str]:
    """Paths where the tensors of ``args`` no longer equal their copies in ``pristine``."""
    now = dict(tree_leaves(args, "args"))
    return [
        path
        for path, before in tree_leaves(pristine, "args")
        if path in now
        and not (before.shape == now[path].shape and torch.equal(before, now[path].detach().cpu().to(before.device)))
    ]


def in_place_reading(pristine, args, path: str) -> str | None:
    """What the call did to the input at ``path`` (``diagnosis/in_place.py``), from its copy in ``pristine``."""
    from ..diagnosis.in_place import in_place_edit

    before, now = dict(tree_leaves(pristine, "args")).get(path), dict(tree_leaves(args, "args")).get(path)
    return None if before is None or now is None else in_place_edit(before, now)
