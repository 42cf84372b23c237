"""Where in the stack a failing model goes wrong: its blocks silenced, all of them or all but one.

A block whose output projections are zero (attention's ``wo``, the MLP's ``w_down`` or ``w_proj``, their biases,
every expert's) adds nothing to the residual stream of a pre-norm model, the specified one included: the stack then
computes as if it held only the other blocks. Run alike on the implementation and on the reference:

- every block silenced and the outputs still differ: the difference is outside the blocks' branches (the
  embeddings, positions, the final norm, the head, or a norm applied to the residual stream itself);
- the first block alone right and a later block alone wrong: the same block computes differently at a later
  index (something depends on the layer's number: a scale by it, a per-layer table, another layer's weights);
- every block alone right and the whole stack wrong: how one block's output reaches the next.

It runs for a failing model-level check (``Spec.check(model_knobs=True)``) where no variant fits, at one model run
per block and one more, on each side.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from ..judging.compare import mismatch
from .sensitivity import state_dict_position

_OUTPUT = re.compile(r"^layers\.(\d+)\..*(attn\.wo|\.w_down|mlp\.w_proj)\.(weight|bias)$")  # experts' w_down too


def _layers(state_dict: dict) -> list[int]:
    return sorted({int(m.group(1)) for k in state_dict if (m := _OUTPUT.match(k))})


def _silenced(state_dict: dict, keep: int | None) -> dict:
    """``state_dict`` with the output projections of every block but ``keep`` zeroed."""
    out = dict(state_dict)
    for key, value in state_dict.items():
        if (m := _OUTPUT.match(key)) and int(m.group(1)) != keep:
            out[key] = torch.zeros_like(value)
    return out


def depth_lines(compute: Callable, impl, reference, args: tuple, args64: tuple, tol) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: which part of the stack the failing ``compute(impl, *args)`` differs in, where silencing
    blocks (``_silenced``) tells it; nothing where the first block alone is wrong too (a component's own tests say
    more) or where a silenced model cannot run."""
    at = state_dict_position(args, args64)
    if at is None:
        return [], []
    layers = _layers(args[at])
    if len(layers) < 2:
        return [], []

    def right(keep: int | None) -> bool | None:
        try:
            mine = compute(impl, *args[:at], _silenced(args[at], keep), *args[at + 1 :])
        except Exception:  # noqa: BLE001 - a crash is the check's to report, not this probe's
            return None
        specified = compute(reference, *args64[:at], _silenced(args64[at], keep), *args64[at + 1 :])
        return mismatch(mine, specified, tol) is None

    empty = right(None)
    if empty is None:
        return [], []
    if not empty:
        return [
            "likely cause (weak evidence): with every block's output projections zeroed (a pre-norm block then adds "
            "nothing), your output still differs from the specified one: the difference is outside the blocks' "
            "branches: the embeddings, positions, the final norm, the head, or a norm applied to the residual stream "
            "itself (evidence: the blocks silenced)"
        ], ["~outside_blocks"]
    alone = {layer: right(layer) for layer in layers}
    if alone[layers[0]] is not True or any(v is None for v in alone.values()):
        return [], []
    wrong = [layer for layer in layers[1:] if not alone[layer]]
    if wrong:
        which = ", ".join(str(layer) for layer in wrong)
        return [
            f"likely cause: block 0 alone (the others' output projections zeroed) gives the specified output, and "
            f"block {which} alone does not: the same block computes differently at a later layer index. Look for "
            f"what depends on the layer's number: a scale by it (query-key layer scaling), a per-layer table or "
            f"setting (layer types, a window), a cache slot or a weight read from another layer (evidence: each block "
            f"alone)"
        ], ["layer_index"]
    return [
        "likely cause (weak evidence): each block alone (the others' output projections zeroed) gives the specified "
        "output, and the whole stack does not: what differs is how one block's output reaches the next (the "
        "residual stream handed on, a block reading the embeddings or an earlier block's input instead) (evidence: "
        "each block alone)"
    ], ["~between_blocks"]
