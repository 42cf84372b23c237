"""Explaining a failed check: which catalogued bug it matches, which single knob of the specified
function reproduces it, and what the output's structure shows.

- ``structural_causes(expected, actual, axes=..., inputs=..., atol=..., rtol=...)``: detectors that
  relate the output to the expected one (layout, scale, shift, no-op, mask, boundary, precision, ...);
- ``knob_causes(name, args, kwargs, actual, rope_style=..., atol=..., rtol=...)``: the specified
  function with one knob changed;
- ``rank`` / ``describe``: order the causes and write the ``likely cause:`` lines;
- ``diagnose(...)``: all of these for one failed check (``judging.spec.Spec`` calls it on demand).

Every line starts ``likely cause`` or ``matches known bug``; several fitting causes are ranked, and
ambiguous evidence is said to be ambiguous rather than named with confidence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

import torch

from .bookkeeping import argument_ratio_causes
from .catalog import CLASS_CODES, known_bug_lines
from .cause import EXACT_SHARED, WEAK, Cause
from .codes import PREFIX_KNOB
from .crashes import argument_keys
from .heads import head_pairing_causes
from .knobs import knob_causes
from .norm_stats import norm_statistics_causes
from .order import item_order_causes
from .ranking import describe, is_ambiguous, rank
from .structural import argument_size_causes, structural_causes

__all__ = [
    "Cause",
    "describe",
    "diagnose",
    "knob_causes",
    "rank",
    "structural_causes",
]

PREFIX_KNOWN = "known_bug:"
CONFIDENT = 0.9


def _tensor_inputs(args, kwargs) -> dict:
    found = {f"arg{i}": a for i, a in enumerate(args or ()) if isinstance(a, torch.Tensor)}
    found.update({k: v for k, v in (kwargs or {}).items() if isinstance(v, torch.Tensor)})
    return found


def _leaves(tree, keys: tuple = ()):
    """``(path, keys, tensor)`` for every tensor of nested mappings and sequences; ``path`` reads ``['a'][0]``."""
    items = tree.items() if isinstance(tree, Mapping) else enumerate(tree)
    for key, value in items:
        if isinstance(value, Mapping | list | tuple):
            yield from _leaves(value, (*keys, key))
        elif isinstance(value, torch.Tensor):
            yield "".join(f"[{k!r}]" for k in (*keys, key)), (*keys, key), value


def _at(tree, keys: tuple):
    """The value under ``keys`` of nested mappings and sequences, or None where it has none."""
    for key in keys:
        if isinstance(tree, Mapping):
            tree = tree.get(key)
        elif isinstance(tree, list | tuple) and isinstance(key, int) and key < len(tree):
            tree = tree[key]
        else:
            return None
    return tree


def _first_differing_leaf(expected, actual, tol):
    """``(path, expected, actual)`` of the first tensor of nested mappings or sequences that differs at ``tol``, or
    None."""
    from ..judging.compare import mismatch

    for path, keys, e in _leaves(expected):
        a = _at(actual, keys)
        if isinstance(a, torch.Tensor) and mismatch(a, e, tol) is not None:
            return path, e, a
    return None


_LAYER = re.compile(r"\.\d+\.")


def _named_elsewhere(expected, path: str, actual, tol, actual_tree=None) -> list[Cause]:
    """The weight given back under ``path`` equals the one expected under another name of the same mapping: weights
    loaded or given back under each other's names (wq where wk belongs)."""
    from ..judging.compare import mismatch

    others = [
        p for p, _, e in _leaves(expected) if p != path and e.shape == actual.shape and mismatch(actual, e, tol) is None
    ]
    if len(others) != 1:
        return []
    source = dict((p, e) for p, _, e in _leaves(expected))[others[0]]
    sharing = [
        p
        for p, keys, _ in _leaves(expected)
        if isinstance(a := _at(actual_tree, keys), torch.Tensor) and a.shape == source.shape
        and mismatch(a, source, tol) is None
    ] if actual_tree is not None else []  # fmt: skip
    if others[0] in sharing and len(sharing) >= 2:  # the source itself comes back right, and others with it
        shown = ", ".join(sharing[:4]) + (f" and {len(sharing) - 4} more" if len(sharing) > 4 else "")
        return [
            Cause(
                "layout",
                f"{len(sharing)} canonical weights give back one tensor, the weight given as {others[0]} (the last "
                f"loaded of them): {shown}. The model holds one module where the config asks for several (the same "
                "instance put in each place: [module] * n, a clones() without deepcopy, one norm shared by both "
                "branches), so each load writes over the others",
                "where the model's layers and projections are created",
                "create a new module for each place (copy.deepcopy, or construct each one), so every canonical "
                "weight has its own parameter",
                f"{shown} all equal the expected {others[0]} within tolerance",
                0.95,
            )
        ]
    return [
        Cause(
            "layout",
            f"{path} gives back the weight given as {others[0]}: weights loaded or given back under each other's names",
            "where each canonical weight is read into the model and written back",
            "load and give back each weight under its own canonical name",
            f"{path} equals the expected {others[0]} within tolerance",
            0.95,
        )
    ]


def _rows_from_elsewhere(expected, path: str, actual, tol) -> list[Cause]:
    """Every row of the 2-D weight given back under ``path`` is a row of some weight given (exactly, within ``tol``),
    and some come from other weights: the rows were split from a fused matrix (q, k and v stacked, per head or per
    group) in another layout than the one they were fused in. Said with where the first foreign rows come from."""
    from ..judging.compare import mismatch

    if actual.ndim not in (1, 2) or actual.shape[0] < 2:
        return []
    ndim = actual.ndim
    actual = actual.reshape(actual.shape[0], -1)  # a bias's entries are its rows
    rows = [
        (p, i, e.reshape(e.shape[0], -1)[i])
        for p, _, e in _leaves(expected)
        if e.ndim == ndim and e.reshape(e.shape[0], -1).shape[1] == actual.shape[1]
        for i in range(e.shape[0])
    ]
    if len(rows) > 4096:  # a large model: not this check's size
        return []
    sources = []
    for r in range(actual.shape[0]):
        match = next(((p, i) for p, i, e in rows if mismatch(actual[r], e, tol) is None), None)
        if match is None:
            return []
        sources.append(match)
    foreign = [(r, src) for r, src in enumerate(sources) if src != (path, r)]
    names = {p for p, _ in sources}
    if not foreign or names == {path}:  # rows of its own weight only: a reordering, which the structure says
        return []
    r, (p, i) = next(((r, src) for r, src in foreign if src[0] != path), foreign[0])
    others = sorted(names - {path})
    if len({_LAYER.sub(".#.", n) for n in names | {path}}) == 1:  # the same weight of other layers
        return [
            Cause(
                "knob:layer_weights",
                f"{path} gives back rows of the same weight of other layers ({', '.join(others)}; its row {r} is "
                f"{p}'s row {i}): the layers' weights were stacked (or split) along another axis than the layer axis, "
                "so each layer holds parts of its neighbours'",
                "how the per-layer weights are stacked into one tensor (a scan over layers) and split back: a reshape "
                "where a transpose or moveaxis belongs",
                "stack the layers on their own axis (torch.stack(ws, dim=axis)), and index that axis to split them",
                f"every row of the given-back {path} is a row of a given weight, {len(foreign)} of them another "
                "layer's",
                0.9,
            )
        ]
    return [
        Cause(
            "knob:qkv_layout",
            f"{path} gives back rows of {', '.join(others)} (its row {r} is {p}'s row {i}): rows split from a fused "
            "matrix (q, k and v stacked, per head or per group) in another layout than the one they were fused in",
            "how the fused q/k/v weight is assembled at load and split at export (its grouping of heads)",
            "fuse and split q, k and v in one layout (canonical: wq, wk, wv, each [heads * d_head, d_model])",
            f"every row of the given-back {path} is a row of a given weight, {len(foreign)} of them not its own",
            0.9,
        )
    ]


def bug_code(bug) -> str | None:
    """The cause code a catalogued bug stands for: its own, or its class's."""
    return getattr(bug, "code", None) or CLASS_CODES.get(getattr(bug, "bug_class", None))


def diagnose(
    *,
    subject,
    call,
    args64,
    actual,
    expected,
    tol,
    axes,
    rope_style,
    known_bugs,
    input_dtype=None,
    structural=True,
    second=None,
    reduced=None,
) -> tuple[list, list]:
    """``(lines, codes)`` for a failed check: the diagnosis lines, and the code of each cause named,
    best first (``~code`` where the evidence is weak: shown, but not a confident name).

    ``call``: ``(protocol name, kwargs)`` when the check is one protocol call (knob search applies);
    ``known_bugs()``: the catalogued bugs whose output matches (live catalog or recorded outputs);
    ``input_dtype``: the dtype the implementation was given (a float32 result of float32 inputs is
    compared as float64, not taken for a dtype mistake);
    ``second()``: ``(args64, actual)`` of the same call on a second input (``knobs.mixed_input``), or ``None``: a knob
    setting that reproduces the output is named only where it reproduces the second output too (``knob_causes``);
    ``reduced()``: ``(kwargs, actual)`` of the same call with one of its options dropped, each: a knob setting is
    named only where it explains those outputs too (a filter-order knob that fits a call with two filters by
    coincidence, where one filter alone is already wrong, is no cause).
    """
    bugs = known_bugs()
    lines = known_bug_lines(bugs)
    codes = [PREFIX_KNOWN + b.name for b in bugs] + [c for c in map(bug_code, bugs) if c]

    def compared(out):
        return out.double() if isinstance(out, torch.Tensor) and out.dtype == input_dtype == torch.float32 else out

    actual = compared(actual)
    causes: list[Cause] = []
    if call is not None and args64 is not None:
        name, kwargs = call

        def again():
            got = second()
            return None if got is None else (got[0], compared(got[1]))

        causes += knob_causes(
            name,
            args64,
            kwargs,
            actual,
            rope_style=rope_style,
            atol=tol.atol,
            rtol=tol.rtol,
            second=None if second is None else again,
            reduced=None if reduced is None else lambda: [(kw, compared(out)) for kw, out in reduced()],
        )
    if call is not None:
        named = {**dict(zip(argument_keys(call[0], args64 or (), {}), args64 or (), strict=True)), **call[1]}
        causes += argument_ratio_causes(named, expected, actual, tol.atol, tol.rtol)
        causes += argument_size_causes(named, expected, actual)
        causes += norm_statistics_causes(call[0], named, actual)
        causes += head_pairing_causes(call[0], args64, call[1], actual, tol.atol, tol.rtol)
    if structural and isinstance(expected, torch.Tensor):
        inputs = _tensor_inputs(args64, call[1] if call else None)
        causes += structural_causes(expected, actual, axes=axes, inputs=inputs, atol=tol.atol, rtol=tol.rtol)
    if structural and isinstance(expected, list | tuple):
        causes += item_order_causes(expected, actual, atol=tol.atol, rtol=tol.rtol)
        leaf = None if causes else _first_differing_leaf(expected, actual, tol)
        if leaf is not None:  # nested tensors (a cache's layers of keys and values): the first that differs
            path, e, a = leaf
            found = structural_causes(e, a, axes=None, inputs={}, atol=tol.atol, rtol=tol.rtol)
            causes += [replace(c, summary=f"{path}: {c.summary}") for c in found]
    if structural and isinstance(expected, Mapping):  # a state dict: the first entry that differs, described
        leaf = _first_differing_leaf(expected, actual, tol)
        if leaf is not None:
            path, e, a = leaf
            named = _named_elsewhere(expected, path, a, tol, actual) or _rows_from_elsewhere(expected, path, a, tol)
            found = [] if named else structural_causes(e, a, axes=None, inputs={}, atol=tol.atol, rtol=tol.rtol)
            causes += named
            weights = {
                "where": "how this weight is laid out when loaded or exported (a permutation at load undone at export)",
                "fix": "give each weight back in the canonical layout, exactly as it was loaded",
            }
            causes += [
                replace(c, summary=f"{path}: {c.summary}", **(weights if c.code == "layout" else {})) for c in found
            ]
    known_codes = {c for c in map(bug_code, bugs) if c}
    if any(c.code in known_codes for c in causes):  # the knob search found the matched bug again: keep
        # that knob's own line (where to look, the fix), drop rival and ambiguous knob settings
        causes = [
            c for c in causes if not c.code.startswith(PREFIX_KNOB) or (c.code in known_codes and not is_ambiguous(c))
        ]
    if bugs:  # a catalogued bug reproduces the output exactly: what else the structure shows is its symptom
        causes = [c for c in causes if c.code.startswith(PREFIX_KNOB) or c.code in known_codes]
    if any(c.code == "precision" and c.source == "structural" for c in causes):  # an error of float32 rounding
        # everywhere: where it happens to be zero (a first RoPE pair of frequency 1, exactly representable) is the
        # pattern of the rounding, not a boundary or a mask of its own
        causes = [c for c in causes if c.source != "structural" or c.code == "precision"]
    exact_knobs = {c.code for c in causes if c.source == "knob" and c.confidence >= EXACT_SHARED}
    if len(exact_knobs) == 1:  # one knob of the specified function reproduces the output: the same, the structure
        # shows its symptom (a top-p filter left unnormalised read as a RoPE pairing, a boundary, a scale)
        causes = [c for c in causes if c.source != "structural"]
    described = describe(rank(causes)) if causes else []
    lines += described
    if described and not bugs and not described[0].startswith("likely cause (ambiguous"):
        top = next(c for c in rank(causes) if c.confidence >= WEAK)
        codes.append(top.code if top.confidence >= CONFIDENT else "~" + top.code)
    return lines, codes
