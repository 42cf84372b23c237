"""Head pairing: which query head and which key/value head made each output head of an attention call.

A failing ``scaled_dot_product_attention`` or ``flash_attention`` call is read head by head: every output head
is compared with single-head attention of every query head over every key/value head (under the mask slice of
the output head or of the query head). Where each output head is exactly one such pair and the pairs are not
the protocol's (output head h = query head h over kv head h // (H_q / H_kv)), the line says which pairs the
code made: tiled kv heads, query heads reordered by a group-major reshape, heads given back in another order.
It names the pairing whatever code wrote it, rather than one catalogued way of getting it wrong.
"""

from __future__ import annotations

import math

import torch

from .cause import EXACT, Cause, as_array, fits

NAMES = ("scaled_dot_product_attention", "flash_attention")
MAX_HEADS = 16  # H_q * H_kv single-head attentions per output head: kept small


def _one_head(q, k, v, mask):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ v


def _mask_slice(mask, shape, h):
    """The mask broadcast to ``shape`` ([..., H_q, T_q, T_k]), head ``h``'s slice; None when there is none."""
    if mask is None:
        return None
    return torch.broadcast_to(mask.to(torch.bool), shape)[..., h, :, :]


def _fmt(xs) -> str:
    return "[" + ", ".join(map(str, xs)) + "]"


def head_pairing_causes(name: str, args64, kwargs, actual, atol: float, rtol: float) -> list[Cause]:
    """One exact cause when every output head is one (query head, kv head) pair other than the protocol's."""
    if name not in NAMES or not isinstance(actual, torch.Tensor):
        return []
    bound = dict(zip(("q", "k", "v", "mask"), args64 or (), strict=False))
    bound.update({k: v for k, v in (kwargs or {}).items() if k in ("q", "k", "v", "mask")})
    q, k, v, mask = (bound.get(n) for n in ("q", "k", "v", "mask"))
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (q, k, v)) or q.dim() < 3:
        return []
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool):
        return []
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq < 2 or hkv < 1 or hq % hkv or hq * hkv > MAX_HEADS * MAX_HEADS or actual.shape != q.shape[:-1] + v.shape[-1:]:
        return []
    group = hq // hkv
    full = q.shape[:-3] + (hq, q.shape[-2], k.shape[-2])
    try:
        masks = [_mask_slice(mask, full, h) for h in range(hq)]
    except RuntimeError:
        return []
    got = as_array(actual.detach().cpu().to(torch.float64))
    pairs = {}

    def candidate(i, m, h):
        key = (i, m, h)
        if key not in pairs:
            qi, km, vm = q[..., i, :, :], k[..., m, :, :], v[..., m, :, :]
            pairs[key] = as_array(_one_head(qi, km, vm, masks[h]))
        return pairs[key]

    made = []
    for j in range(hq):
        want = got[..., j, :, :]
        found = [
            (i, m)
            for i in range(hq)
            for m in range(hkv)
            if any(fits(candidate(i, m, h), want, atol, rtol) for h in dict.fromkeys((j, i)))
        ]
        if len(found) != 1:
            return []
        made.append(found[0])
    queries, kvs = [i for i, _ in made], [m for _, m in made]
    if queries == list(range(hq)) and kvs == [j // group for j in range(hq)]:
        return []
    pairing_right = all(m == i // group for i, m in made)
    tiled = all(m == i % hkv for i, m in made)
    in_order = queries == list(range(hq))
    parts = []
    if not pairing_right:
        if tiled and hkv < hq:
            parts.append(f"query head h is paired with kv head h % {hkv} (tiled) instead of h // {group}")
        else:
            by_query = dict(made)
            parts.append(
                f"query heads 0..{hq - 1} are paired with kv heads {_fmt(by_query.get(i, '?') for i in range(hq))} "
                f"instead of h // {group} = {_fmt(i // group for i in range(hq))}"
            )
    if not in_order:
        parts.append(
            f"output heads 0..{hq - 1} hold query heads {_fmt(queries)}: the heads come back in another order "
            "(a reshape into (groups, kv heads) where (kv heads, groups) belongs, or a transpose left out)"
        )
    code = "knob:gqa_mapping" if not pairing_right else "knob:head_layout"
    return [
        Cause(
            code,
            "; ".join(parts),
            f"how {name} splits the query heads into groups and pairs them with the key/value heads",
            f"query head h attends over kv head h // {group} (repeat_interleave k and v {group} times over the head "
            "axis, or reshape q to [..., H_kv, group, T, d]) and comes back as output head h",
            f"each output head equals single-head attention of one query head over one kv head: {_fmt(made)}",
            EXACT,
            source="probe",
        )
    ]
