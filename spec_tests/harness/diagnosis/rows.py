"""Whether a failing output's rows depend on each other: the implementation's own call made on each row alone.

For a name whose protocol shapes are ``[..., d]`` (``Entry.any_leading_dims``), or whose dim 0 is the batch
(``Entry.batch_rows``), every row along the leading dims is computed on its own: ``f(x)[i] == f(x[i])``. Where the
implementation gives the specified output for each row of dim 0 alone and another for the rows together, something
in it reduces over dim 0 (a cumsum, sort or max over ``dim=0`` where the last axis belongs: the same axis for a 1-D
input, the batch axis for a batched one), or, for a batch, lets a row reach the others' values (attention over keys
of other rows). The evidence is the implementation's own calls, and it explains every row, so the line is
confident; and whatever a knob search fits to the batched output is then a coincidence of this input
(``Spec.check`` says this line alone).

Where each row alone keeps its leading dim (``x[i:i+1]``) and is still wrong but each row as a 1-D input (``x[i]``,
for a name whose core is 1-D) is right, the reduction runs over axis 0 itself: the last axis only for a 1-D input.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...protocol import ANY_LEADING, BATCH_ROWS, ENTRY
from ..judging.compare import mismatch


def _each_row(run: Callable, args: tuple, keep_dim: bool, shape: torch.Size):
    """The call on each row of dim 0 alone (``keep_dim``: ``x[i:i+1]``), or on each 1-D row with every leading dim
    merged (``x.reshape(-1, d)[j]``), the outputs put back together in ``shape``."""
    x = args[0]
    pieces = [x[i : i + 1] for i in range(x.shape[0])] if keep_dim else list(x.reshape(-1, x.shape[-1]))
    rows = [run(p, *args[1:]) for p in pieces]
    if not all(isinstance(r, torch.Tensor) for r in rows):
        return None
    out = (
        torch.cat([r.detach().double() for r in rows], dim=0)
        if keep_dim
        else torch.stack([r.detach().double() for r in rows])
    )
    return out.reshape(shape) if out.numel() == shape.numel() else None


def rows_alone(name: str, run: Callable, args: tuple, kwargs: dict, actual, expected, tol) -> tuple[list, list]:
    """``(lines, codes)``: "each row alone is right, together they are not", measured by ``run(*args)`` (the
    implementation's call of ``name``) on each row of ``args[0]``'s dim 0; ``([], [])`` where that is not so."""
    if (name not in ANY_LEADING and name not in BATCH_ROWS) or not args or not isinstance(actual, torch.Tensor):
        return [], []
    x = args[0]
    core = ENTRY[name].core_rank if name in ANY_LEADING else x.dim() - 1
    if not isinstance(x, torch.Tensor) or x.dim() <= core or x.shape[0] < 2 or actual.dim() < 1:
        return [], []
    if actual.shape[0] != x.shape[0] or not isinstance(expected, torch.Tensor) or expected.shape != actual.shape:
        return [], []
    dim = kwargs.get("dim")
    if isinstance(dim, int) and dim % x.dim() == 0:  # the call's own axis is dim 0: rows are not independent
        return [], []
    together = actual.detach().double()
    want = expected.detach().double().to(together.device)
    fix = (
        f"reduce over the protocol's axis (the last, dim=-1), never over dim 0: {name} takes any leading dims, and "
        "each row along them is computed alone"
    )
    for keep_dim in (True, False) if core == 1 else (True,):
        try:
            alone = _each_row(run, args, keep_dim, together.shape)
        except Exception:  # noqa: BLE001 - a row the implementation cannot take alone says nothing here
            continue
        if alone is None or alone.shape != together.shape:
            continue
        alone = alone.to(together.device)
        if mismatch(alone, want, tol) is not None or mismatch(together, want, tol) is None:
            continue
        if keep_dim and name in BATCH_ROWS:  # no reduction axis of its own: the rows reach each other's values
            return [
                f"likely cause: {name} gives the specified output for each row of the batch alone ([1, ...]) and "
                f"another for the {x.shape[0]} rows together: a row's result depends on the other rows (queries "
                "attending keys of other rows: a packed layout whose per-sequence key range starts at the pack's "
                "start, a mask or softmax over the flattened batch, a view that mixes the batch and head axes). Fix: "
                f"compute each row of the batch on its own values (evidence: your own {name} on each row alone gives "
                "the specified output)"
            ], ["batch_mixing"]
        if keep_dim:
            return [
                f"likely cause: {name} gives the specified output for each row of dim 0 alone ([1, ...]) and another "
                f"for the {x.shape[0]} rows together: a row's result depends on the other rows, so something reduces "
                "over dim 0, the batch axis (a cumsum, sort, max or sum over dim=0 where the last axis belongs). "
                f"Fix: {fix} (evidence: your own {name} on each row alone gives the specified output)"
            ], ["batch_mixing"]
        return [
            f"likely cause: {name} gives the specified output for each row as a 1-D input and another for the same "
            "rows with their leading dim (even [1, ...]): it reduces over axis 0, which is the last axis only for a "
            f"1-D input (dim=0 where dim=-1 belongs). Fix: {fix} (evidence: your own {name} on each row as a 1-D "
            "input gives the specified output)"
        ], ["batch_mixing"]
    return [], []
