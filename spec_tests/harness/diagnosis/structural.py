"""Structural diagnosis: explain a mismatch from the tensors themselves.

``structural_causes(expected, actual, ...)`` runs a set of detectors, each of which looks for one
kind of relation between the implementation's output and the reference's (a permutation of axes, a
factor, a shift, an input passed through, errors confined to masked positions or to a tail, ...).
A detector states what it measured; one that does not fit returns nothing. Detectors that reproduce
``actual`` from ``expected`` by a transform, everywhere within tolerance, report confidence >= 0.9;
those that only localise the error report at most 0.8.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from . import cause as cause_module
from .cause import (
    AMBIGUOUS,
    EXACT,
    EXACT_SHARED,
    LOCAL,
    WEAK,
    Cause,
    as_array,
    as_float,
    close,
    fits,
    fmt_indices,
    nice_number,
)

TIME_NAMES = {"t", "q", "tq", "t_q", "i", "query", "queries", "seq", "s_q", "pos", "p", "position", "positions"}
QUERY_NAMES = {"q", "tq", "t_q", "i", "query", "queries"}
KEY_NAMES = {"k", "tk", "t_k", "j", "key", "keys", "s", "s_k"}
CHANNEL_NAMES = {"d", "dh", "d_head", "c", "channel", "channels", "hd", "e"}
HEAD_NAMES = {"h", "head", "heads", "hq", "h_q", "hkv", "h_kv"}
LARGE = 250_000  # above this many entries, only the detectors linear in the size run


# ---------------------------------------------------------------------------------------------
# the case being diagnosed


@dataclass
class _Case:
    e: np.ndarray  # expected, float64
    a: np.ndarray  # actual, float64
    names: list[str]
    groups: list[list[tuple[str, int | None]] | None]
    named: bool
    atol: float
    rtol: float
    care: np.ndarray  # entries the comparison cares about (expected is not NaN: unspecified)
    bad: np.ndarray  # entries outside tolerance
    inputs: dict[str, np.ndarray]
    is_bool: bool
    masked: bool = False  # an input masks entries: a boolean tensor, or one holding -inf

    def fits(self, candidate: np.ndarray, care: np.ndarray | None = None) -> bool:
        return fits(candidate, self.a, self.atol, self.rtol, self.care if care is None else care)

    def axis_name(self, k: int) -> str:
        return self.names[k] if self.named else f"dim {k}"

    def find(self, names: set[str]) -> int | None:
        if not self.named:
            return None
        hits = [k for k, n in enumerate(self.names) if n.lower() in names]
        return hits[0] if len(hits) == 1 else None


def _parse_axes(axes, shape: tuple[int, ...]):
    ndim = len(shape)
    default = ([f"dim{k}" for k in range(ndim)], [None] * ndim, False)
    if axes is None:
        return default
    tokens = re.findall(r"\([^)]*\)|\S+", axes) if isinstance(axes, str) else list(axes)
    if len(tokens) != ndim:
        return default
    names, groups = [], []
    for tok in tokens:
        tok = str(tok)
        if tok.startswith("("):
            parts = []
            for part in tok[1:-1].split():
                name, _, size = part.partition("=")
                parts.append((name, int(size) if size.isdigit() else None))
            names.append("(" + " ".join(p[0] for p in parts) + ")")
            groups.append(parts)
        else:
            names.append(tok)
            groups.append(None)
    return names, groups, True


def _tensor_facts(x) -> tuple[str | None, str | None]:
    """(dtype, device) of a torch tensor, as strings; (None, None) for anything else."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None, None
    if isinstance(x, torch.Tensor):
        return str(x.dtype).replace("torch.", ""), str(x.device)
    return None, None


# ---------------------------------------------------------------------------------------------
# entry point


def structural_causes(expected, actual, *, axes=None, inputs: Mapping | None = None, atol: float, rtol: float):
    """Causes explaining how ``actual`` differs from ``expected`` (float64), found from the tensors.

    ``axes`` names the output's axes ("b h t d", "b t v", "q k", or with a merged axis "b t (h d)");
    ``inputs`` maps argument names to the input tensors (used for no-op and dtype/device checks).
    """
    causes: list[Cause] = []
    e_raw, a_raw = as_array(expected), as_array(actual)
    if e_raw is None or a_raw is None:
        return causes
    input_arrays, masked = {}, False
    for name, value in (inputs or {}).items():
        arr = as_array(value)
        if arr is not None and arr.dtype == np.float64:
            input_arrays[name] = arr
        masked = masked or (
            arr is not None and arr.size > 0 and (arr.dtype == np.bool_ or bool(np.isneginf(arr).any()))
        )
    causes += _guarded(_dtype_causes, expected, actual, e_raw, a_raw, inputs or {})
    if e_raw.dtype == np.bool_ and a_raw.dtype != np.bool_ and e_raw.shape == a_raw.shape:
        return causes  # a float/int mask: the dtype cause says how its values relate
    if e_raw.shape != a_raw.shape:
        e_f, a_f = as_float(e_raw), as_float(a_raw)
        causes += _guarded(_shape_causes, e_f, a_f, atol, rtol, _parse_axes(axes, e_raw.shape))
        causes += _guarded(_noop_causes, a_f, input_arrays, atol, rtol, e_raw.shape)
        return causes

    names, groups, named = _parse_axes(axes, e_raw.shape)
    is_bool = e_raw.dtype == np.bool_
    e, a = as_float(e_raw), as_float(a_raw)
    if is_bool:
        atol = rtol = 0.0
    care = ~np.isnan(e)
    bad = ~close(e, a, atol, rtol) & care
    if not bad.any():
        return causes
    case = _Case(e, a, names, groups, named, atol, rtol, care, bad, input_arrays, is_bool, masked)

    if not is_bool:
        detectors = [_nonfinite_causes, _sign_causes, _scale_causes, _offset_causes]
    else:  # a 2-D bool tensor is read as a [t_q, t_k] mask, whose inversion the mask detector names
        detectors = [_bool_inversion] if e.ndim != 2 else []
    if e.size <= LARGE:  # the rearrangement searches cost O(size) per candidate
        detectors += [_layout_causes, _slice_permutation_causes, _shift_causes, _reshape_for_transpose_causes]
    detectors += [lambda c: _noop_causes(c.a, c.inputs, c.atol, c.rtol)]
    detectors += [_mask_causes, _boundary_causes, _rope_pairing_causes]
    for detect in detectors:
        causes += _guarded(detect, case)
    if not is_bool:
        causes += _guarded(lambda c: _precision_causes(c, actual, causes), case)
    return causes


def _guarded(detect, *args) -> list[Cause]:
    try:
        return detect(*args)
    except Exception:
        if cause_module.STRICT:
            raise
        return []


# ---------------------------------------------------------------------------------------------
# dtype, device and shape


def _within(e_raw, a_raw, relative: float) -> bool:
    """Whether every finite entry of ``a_raw`` is within ``relative * (1 + |e|)`` of ``e_raw``'s."""
    e, a = np.asarray(e_raw, dtype=np.float64), np.asarray(a_raw, dtype=np.float64)
    ok = np.isfinite(e) & np.isfinite(a)
    return bool((np.abs(a - e)[ok] <= relative * (1 + np.abs(e[ok]))).all())


def _dtype_causes(expected, actual, e_raw, a_raw, inputs) -> list[Cause]:
    out = []
    a_dtype, a_device = _tensor_facts(actual)
    in_facts = [_tensor_facts(v) for v in inputs.values()]
    in_float = [d for d, _ in in_facts if d in ("float64", "float32", "float16", "bfloat16")]
    devices = {dev for _, dev in in_facts if dev is not None}
    if e_raw.dtype == np.bool_ and a_raw.dtype != np.bool_:
        text = f"the output is {a_dtype or a_raw.dtype} where a bool mask (True = may attend) is expected"
        conf, how = 0.8, "its values do not line up with the expected mask either"
        if a_raw.shape == e_raw.shape:
            av = as_float(a_raw)
            if np.array_equal(av != 0, e_raw) and np.isin(av, (0.0, 1.0)).all():
                conf, how = EXACT, "its nonzero entries are exactly the expected True entries (a 0/1 mask)"
            elif np.array_equal(av == 0, e_raw) and np.isneginf(av[~e_raw]).all():
                conf, how = EXACT, "it is 0 where the expected mask is True and -inf elsewhere (an additive mask)"
            elif np.array_equal(av == 0, e_raw):
                conf, how = EXACT_SHARED, "it is 0 exactly where the expected mask is True (an additive mask)"
        out.append(
            Cause(
                "dtype",
                text,
                "the dtype of the returned mask",
                "return a torch.bool tensor (e.g. build it with a comparison, or .bool())",
                how,
                conf,
            )
        )
        return out
    if e_raw.dtype == np.float64 and a_raw.dtype != np.float64:
        out.append(
            Cause(
                "dtype",
                f"the output is {a_dtype or a_raw.dtype} where floating-point values are expected",
                "the dtype of the returned tensor (an integer or bool result, e.g. from argmax or a comparison)",
                "return the floating-point values (in the inputs' dtype)",
                f"actual dtype {a_dtype or a_raw.dtype}, expected a floating dtype",
                EXACT,
            )
        )
    if a_dtype in ("float16", "bfloat16", "float32") and in_float and a_dtype not in in_float:
        widest = "float64" if "float64" in in_float else "float32"
        # the dtype explains a difference of its rounding, not more: a float32 loss 0.009 off is wrong in float64 too
        rounding = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 5e-3}[a_dtype]
        explains = e_raw.shape == a_raw.shape and _within(e_raw, a_raw, rounding)
        if (a_dtype != "float32" or widest == "float64") and explains:
            out.append(
                Cause(
                    "dtype",
                    f"the output is {a_dtype} while the inputs are {widest}: the computation was done, or its result "
                    f"cast, in {a_dtype}",
                    "hard-coded dtypes (.float(), .half(), dtype=torch.float32) and the final cast",
                    "compute in (at least) the inputs' dtype and return that dtype",
                    f"actual dtype {a_dtype}; input dtypes {sorted(set(in_float))}",
                    EXACT_SHARED,
                )
            )
    if a_device is not None and len(devices) == 1 and a_device not in devices:
        out.append(
            Cause(
                "dtype",
                f"the output is on {a_device} while the inputs are on {next(iter(devices))}",
                "tensors created without device= (torch.arange, torch.ones, masks) or an explicit .to()/.cpu()",
                "create new tensors on the inputs' device (device=x.device)",
                f"actual device {a_device}; input devices {sorted(devices)}",
                EXACT,
            )
        )
    return out


def argument_size_causes(named: Mapping, expected, actual) -> list[Cause]:
    """Where the output differs from the expected shape along one axis, and the size it has is one integer argument's
    value while the size expected is another's: the axis is sized by the wrong argument (a mask of [t_q, t_q] where
    [t_q, t_k] belongs: the keys before the new queries forgotten)."""
    e_shape, a_shape = tuple(getattr(expected, "shape", ())), tuple(getattr(actual, "shape", ()))
    if not e_shape or len(e_shape) != len(a_shape):
        return []
    diff = [k for k in range(len(e_shape)) if e_shape[k] != a_shape[k]]
    ints = {k: v for k, v in named.items() if type(v) is int}
    if len(diff) != 1 or len(ints) < 2:
        return []
    k = diff[0]
    got, want = a_shape[k], e_shape[k]
    by = [n for n, v in ints.items() if v == got]
    belongs = [n for n, v in ints.items() if v == want]
    if len(by) != 1 or len(belongs) != 1 or by == belongs:
        return []
    return [
        Cause(
            "shape",
            f"axis {k} of the output has {by[0]} = {got} entries where {belongs[0]} = {want} belong: that axis is "
            f"sized by {by[0]}, not {belongs[0]}",
            f"what sizes axis {k} (the argument its range, zeros or ones are made from)",
            f"make axis {k} of size {belongs[0]}",
            f"actual shape {list(a_shape)}, expected {list(e_shape)}; {by[0]} = {got}, {belongs[0]} = {want}",
            EXACT,
        )
    ]


def _reductions(x: np.ndarray, axis: int):
    n = x.shape[axis]
    yield "the mean over", np.mean(x, axis=axis)
    yield "the sum over", np.sum(x, axis=axis)
    yield "the first entry along", np.take(x, 0, axis=axis)
    yield "the last entry along", np.take(x, n - 1, axis=axis)


def _shape_causes(e, a, atol, rtol, axes) -> list[Cause]:
    names, _, named = axes
    es, as_ = e.shape, a.shape
    name = lambda k: names[k] if named else f"dim {k}"
    where = "the reshape/transpose/reduction that produces the output"

    def cause(code, summary, fix, evidence, conf):
        return [Cause(code, summary, where, fix, evidence, conf)]

    shape_text = f"actual shape {list(as_)}, expected {list(es)}"
    if e.size == a.size and e.size > 1:
        if len(es) == len(as_) and sorted(es) == sorted(as_):
            for perm in itertools.permutations(range(len(es))):
                if tuple(es[p] for p in perm) != as_:
                    continue
                moved = [name(p) for p in perm]
                if fits(np.transpose(e, perm), a, atol, rtol, ~np.isnan(np.transpose(e, perm))):
                    return cause(
                        "layout",
                        f"the output's axes are in the order [{', '.join(moved)}] instead of "
                        f"[{', '.join(name(k) for k in range(len(es)))}]",
                        f"permute the axes back (permute{tuple(int(np.argsort(perm)[k]) for k in range(len(perm)))})",
                        f"{shape_text}; actual == expected.permute{tuple(perm)} within tolerance everywhere",
                        EXACT,
                    )
            return cause(
                "shape",
                "the output's sizes are the expected ones in another order: two axes are swapped",
                "transpose the swapped axes (check which axis is which before reshaping)",
                f"{shape_text}; the values do not match a plain transpose either",
                LOCAL,
            )
        for perm in itertools.permutations(range(a.ndim)):
            if perm != tuple(range(a.ndim)) and not all(as_[p] > 1 for p in perm):
                continue
            cand = np.transpose(a, perm).reshape(es)
            if fits(e, cand, atol, rtol, ~np.isnan(e)):
                order = "" if perm == tuple(range(a.ndim)) else f"permuted {tuple(perm)} and "
                return cause(
                    "shape",
                    f"the output holds the expected values but is shaped {list(as_)}: axes are not merged/split as "
                    "expected" + (" (and a transpose is missing)" if order else ""),
                    f"return the tensor {order}reshaped to {list(es)}",
                    f"{shape_text}; actual {order}reshaped to {list(es)} == expected within tolerance everywhere",
                    EXACT,
                )
    if a.ndim == e.ndim + 1:
        for k in range(a.ndim):
            for label, red in _reductions(a, k):
                if red.shape == es and fits(red, e, atol, rtol, ~np.isnan(e)):
                    return cause(
                        "shape",
                        f"the output keeps an extra axis {k} (size {as_[k]}) that should be reduced: the expected "
                        f"value is {label} axis {k} of actual",
                        f"reduce over axis {k} ({label.split()[1]}) before returning",
                        f"{shape_text}; {label} axis {k} of actual == expected within tolerance",
                        EXACT,
                    )
    if a.ndim + 1 == e.ndim:
        for k in range(e.ndim):
            for label, red in _reductions(e, k):
                if red.shape == as_ and fits(red, a, atol, rtol, ~np.isnan(red)):
                    return cause(
                        "shape",
                        f"axis {name(k)} (size {es[k]}) is missing: actual is {label} that axis of expected",
                        f"keep axis {name(k)}: do not reduce or index it",
                        f"{shape_text}; {label} axis {k} of expected == actual within tolerance",
                        EXACT,
                    )
    if a.ndim == e.ndim:
        diff = [k for k in range(e.ndim) if es[k] != as_[k]]
        if len(diff) == 1:
            k = diff[0]
            d = as_[k] - es[k]
            n_common = min(as_[k], es[k])
            part = "drops" if d < 0 else "adds"
            for start_a, start_e, label in ((0, 0, "at the end"), (max(d, 0), max(-d, 0), "at the start")):
                sa = np.take(a, range(start_a, start_a + n_common), axis=k)
                se = np.take(e, range(start_e, start_e + n_common), axis=k)
                if fits(se, sa, atol, rtol, ~np.isnan(se)):
                    extra = np.take(a, range(n_common, as_[k]), axis=k) if d > 0 and start_a == 0 else None
                    if extra is not None and extra.size and not extra.any() and d > 1:
                        return cause(
                            "shape",
                            f"axis {name(k)} has {as_[k]} entries instead of {es[k]}: the {es[k]} expected ones, then "
                            f"{d} zeros: a preallocated buffer handed back whole instead of the part written to it",
                            f"return the filled part only (buffer[..., :filled] along {name(k)})",
                            f"{shape_text}; the first {n_common} entries along {name(k)} match expected, the {d} after "
                            "them are all 0",
                            EXACT,
                        )
                    return cause(
                        "shape",
                        f"axis {name(k)} has {as_[k]} entries instead of {es[k]}: the output {part} {abs(d)} "
                        f"{label}, the others are right (a range or slice off by {abs(d)})",
                        f"check the slice/range bounds along {name(k)}",
                        f"{shape_text}; the {n_common} common entries along {name(k)} match expected",
                        EXACT,
                    )
            return cause(
                "shape",
                f"axis {name(k)} has {as_[k]} entries instead of {es[k]} (off by {d:+d})",
                f"check the size of axis {name(k)} (slice bounds, a range, a split size)",
                shape_text,
                LOCAL if abs(d) <= 2 else WEAK,
            )
    return cause(
        "shape", f"the output has shape {list(as_)} instead of {list(es)}", "check the shape", shape_text, WEAK
    )


# ---------------------------------------------------------------------------------------------
# values


def _nonfinite_causes(c: _Case) -> list[Cause]:
    wrong = c.care & np.isfinite(c.e) & ~np.isfinite(c.a)
    if not wrong.any():
        return []
    out = []
    a, e = c.a, c.e
    rest_ok = bool((~c.bad | wrong).all())
    nan_rows = np.isnan(a).all(axis=-1) if a.ndim >= 1 else np.isnan(a)
    row_finite_expected = np.isfinite(e).all(axis=-1) if a.ndim >= 1 else np.isfinite(e)
    rows = nan_rows & row_finite_expected
    covered = wrong & (np.broadcast_to(rows[..., None], a.shape) if a.ndim >= 1 else rows)
    if a.ndim >= 2 and rows.any() and not (wrong & ~covered).any():
        n_rows = int(rows.sum())
        idx_text, hint = _describe_rows(c, rows)
        if c.inputs and not c.masked:  # nothing was masked: every exp in those rows underflowed (or a sum was 0)
            out.append(
                Cause(
                    "nan_rows",
                    f"{n_rows} whole row(s) are NaN where the expected values are finite{idx_text}, and no input is "
                    "masked: the row's normaliser was 0 (0/0): every exp in the row underflowed, or every entry "
                    "was filtered out",
                    "the max subtracted before exp (each row's own max over the normalised axis, keepdim, not the "
                    "whole tensor's), or a filter that removes every entry of a row (a mask computed in another "
                    "order than the values it is applied to)",
                    "subtract x.max(dim, keepdim=True).values with the same dim as the sum; keep at least one entry "
                    "per row, in the values' own order",
                    f"{n_rows} of {rows.size} rows (last axis) entirely NaN; no -inf or boolean mask among the inputs",
                    LOCAL,
                )
            )
            return out
        if not c.inputs and rows.all() and a.shape[-2] > 1:  # nothing recorded to read a mask from, and no row spared
            out.append(
                Cause(
                    "nan_rows",
                    f"every row ({n_rows}) is NaN where the expected values are finite{idx_text}: a NaN reached "
                    "every position, from a weight that holds NaN (memory never filled: torch.empty neither loaded "
                    "nor initialised), an overflow or 0/0 upstream, or a mask that leaves no query a key",
                    "the parameters (is every one loaded or initialised? any NaN in them?) and the first computation "
                    "that makes a NaN (check isnan after each layer)",
                    "fill every parameter (load or initialise it); keep at least one allowed key per query",
                    f"{n_rows} of {rows.size} rows (last axis) entirely NaN, none spared; no inputs recorded",
                    AMBIGUOUS,
                )
            )
            return out
        out.append(
            Cause(
                "nan_rows",
                f"{n_rows} whole row(s) are NaN where the expected values are finite{idx_text}: a row with every "
                f"key masked (softmax of all -inf){hint}",
                "the mask for those rows (is the diagonal allowed? is the mask aligned and not inverted?), or a "
                "division by zero in those rows",
                "make sure every query row keeps at least one allowed key (j <= i + t_k - t_q); do not exclude the "
                "diagonal",
                f"{n_rows} of {rows.size} rows (last axis) entirely NaN; "
                + ("every other entry matches" if rest_ok else "other entries also differ"),
                EXACT_SHARED if rest_ok else LOCAL - 0.05,
            )
        )
        return out
    n = int(wrong.sum())
    big = max([float(np.nanmax(np.abs(v))) for v in c.inputs.values() if v.size] + [0.0])
    hint = ""
    if big > 80:
        hint = f"; the inputs reach |x| = {big:.3g} (exp overflows above 88.7 in float32, 709.8 in float64)"
    kinds = sorted({"inf" if np.isinf(v) else "NaN" for v in a[wrong].ravel()[:1000]})
    out.append(
        Cause(
            "overflow",
            f"{n} entries are {'/'.join(kinds)} where the expected values are finite: an intermediate overflowed",
            "exponentials and squares of large values (softmax/log-sum-exp without subtracting the max, "
            "statistics computed in float16)",
            "subtract the row max before exp (or use torch.logsumexp / torch.softmax); accumulate in float32",
            f"{n} of {a.size} entries non-finite, expected finite{hint}; "
            + ("the finite entries match" if rest_ok else "finite entries differ as well"),
            # a symptom with several causes (no max subtracted, log of an underflowed softmax, float16 squares,
            # a division by zero): weak evidence, never a confident name; the knob search names the mechanism
            0.75 if rest_ok else 0.65,
        )
    )
    return out


def _describe_rows(c: _Case, rows: np.ndarray) -> tuple[str, str]:
    """Where NaN rows sit along the query/time axis (the second-to-last axis unless named)."""
    t_axis = c.find(TIME_NAMES | QUERY_NAMES)
    if t_axis is None or t_axis == c.a.ndim - 1:
        t_axis = c.a.ndim - 2
    other = tuple(k for k in range(rows.ndim) if k != t_axis)
    along = rows.any(axis=other) if other else rows
    idx = np.nonzero(along)[0]
    text = f" (at {c.axis_name(t_axis)} = {fmt_indices(idx)})"
    hint = ""
    if list(idx) == [0]:
        hint = "; only the first query row: its one allowed key (the diagonal) was masked"
    return text, hint


def _sign_causes(c: _Case) -> list[Cause]:
    if not np.any(np.abs(c.e[c.care & np.isfinite(c.e)]) > c.atol):
        return []
    if not c.fits(-c.e):
        return []
    return [
        Cause(
            "sign",
            "the output is the expected one negated",
            "a subtraction written the wrong way round, a sign in a formula, or a rotation by -angle",
            "flip the sign where the result is formed",
            "actual == -expected within tolerance everywhere",
            EXACT,
        )
    ]


def _offset_causes(c: _Case) -> list[Cause]:
    """The output is the expected one plus one constant (everywhere, or per row along the last axis): something added
    that a softmax over that axis would not see (a cap written as 2c·sigmoid(2x/c) = c + c·tanh(x/c), a bias added
    to every logit)."""
    use = c.care & np.isfinite(c.e) & np.isfinite(c.a)
    if not use.all() or c.e.ndim < 1 or c.e.shape[-1] < 3:
        return []
    diff = c.a - c.e
    whole = float(diff.mean())
    if abs(whole) > c.atol and c.fits(c.e + whole):
        where, summary = "everywhere", f"the output is the expected one plus {whole:.6g} everywhere"
    else:
        rows = diff.mean(axis=-1, keepdims=True)
        if not (np.abs(rows) > c.atol).any() or not c.fits(c.e + rows) or c.e.size == c.e.shape[-1]:
            return []
        where = "per row"
        summary = (f"each row (along the last axis) is the expected row plus its own constant (from "
                   f"{float(rows.min()):.6g} to {float(rows.max()):.6g})")  # fmt: skip
    return [
        Cause(
            "offset",
            f"{summary}: a constant added {where}, which a softmax over the last axis does not see (a shifted cap "
            "such as 2c·sigmoid(2x/c) = c + c·tanh(x/c), a bias added to every entry)",
            "what is added to the output last (a cap's form, a bias, a normalisation's mean)",
            "compute the specified expression: nothing added after it",
            f"actual - expected is constant {where} within tolerance",
            EXACT if where == "everywhere" else EXACT_SHARED,
        )
    ]


def _scale_causes(c: _Case) -> list[Cause]:
    e, a = c.e, c.a
    use = c.care & np.isfinite(e) & np.isfinite(a)
    big = use & (np.abs(e) > max(c.atol, 1e-300))
    n_big = int(big.sum())
    if n_big < 2:
        return []
    ew, aw = np.where(use, e, 0.0), np.where(use, a, 0.0)
    ee = float(np.sum(ew * ew))
    k = float(np.sum(aw * ew)) / ee
    where = "constants and scale factors (1/sqrt(d), temperature, normalisation divisors, a weight applied twice)"
    if c.fits(k * e):
        if abs(k + 1) < 1e-9 or abs(k - 1) < 1e-12:
            return []
        if abs(k) < 1e-12:
            summary = "the output is zero everywhere"
            fix = "return the computed values (the result is never written, or is multiplied by 0)"
        else:
            summary = f"the output is the expected one times {nice_number(k)} (= {k:.6g}){_size_hint(c, k)}"
            fix = f"remove the extra factor {nice_number(k)} (or add the missing one, {nice_number(1 / k)})"
        return [
            Cause(
                "scale",
                summary,
                where,
                fix,
                f"actual == {k:.6g} * expected within tolerance at every entry ({n_big} nonzero entries)",
                # an all-zero output is a symptom (nothing written, everything dropped), not a factor
                LOCAL - 0.05 if abs(k) < 1e-12 else EXACT if n_big >= 4 else WEAK,
            )
        ]
    out = []
    for axis in sorted(range(e.ndim), key=lambda k: e.shape[k]):
        n = e.shape[axis]
        if n < 2 or n > e.size // 2:
            continue
        other = tuple(k for k in range(e.ndim) if k != axis)
        den = np.sum(ew * ew, axis=other, keepdims=True)
        num = np.sum(aw * ew, axis=other, keepdims=True)
        per_slice = np.sum(big, axis=other)
        if (per_slice < 2).any():
            continue
        f = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
        if (np.abs(f) < 1e-9).any() or not c.fits(f * e):
            continue  # zeroed slices are filtering or masking, not a factor
        fv = f.ravel()
        out.append(_per_axis_cause(c, axis, fv))
        break
    if not out and e.ndim >= 3 and e.shape[-1] >= 3:
        den = np.sum(ew * ew, axis=-1, keepdims=True)
        num = np.sum(aw * ew, axis=-1, keepdims=True)
        if (np.sum(big, axis=-1) >= 2).all():
            f = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
            if not (np.abs(f) < 1e-9).any() and c.fits(f * e):
                fv = f.ravel()
                out.append(
                    Cause(
                        "scale",
                        f"each row (along the last axis) is the expected row times its own factor (from "
                        f"{fv.min():.6g} to {fv.max():.6g}): a per-row normaliser is wrong",
                        "per-row statistics: the denominator of a norm (eps value or placement, variance), a "
                        "softmax or mean divisor",
                        "recompute the per-row divisor as specified",
                        f"actual == f[row] * expected within tolerance everywhere, {fv.size} row factors, "
                        f"{e.shape[-1]} entries per row",
                        EXACT_SHARED,
                    )
                )
    out += _power_causes(c)
    return out


def _size_hint(c: _Case, k: float) -> str:
    """Names a factor that is a size of the inputs' last axis: ``d``, ``sqrt(d)`` or their inverses."""
    sizes = sorted({v.shape[-1] for v in c.inputs.values() if v.ndim >= 1 and v.shape[-1] > 1})
    for n in sizes:
        for value, text in ((math.sqrt(n), "sqrt(d)"), (1 / math.sqrt(n), "1/sqrt(d)"), (n, "d"), (1 / n, "1/d")):
            if abs(k - value) <= 1e-9 * abs(value):
                return f", i.e. {text} for d = {n} (the last axis of the inputs): sqrt(d) and d confused?"
    return ""


def _per_axis_cause(c: _Case, axis: int, fv: np.ndarray) -> Cause:
    name = c.axis_name(axis)
    ones = np.abs(fv - 1) <= 1e-9
    neg = np.abs(fv + 1) <= 1e-9
    if (ones | neg).all():
        return Cause(
            "sign",
            f"the output is negated at {name} = {fmt_indices(np.nonzero(neg)[0])} and right elsewhere",
            f"a sign that depends on {name} (e.g. the sin term of a rotation, one half of a rotate_half)",
            "flip the sign for those entries",
            f"actual == s[{name}] * expected with s in {{+1, -1}} within tolerance everywhere",
            EXACT,
        )
    for key, w in c.inputs.items():
        if w.ndim == 1 and w.shape[0] == fv.shape[0] and not np.allclose(w, 1.0):
            for label, target in (("times", w), ("divided by", 1 / np.where(w == 0, np.nan, w))):
                if np.allclose(fv, target, rtol=1e-6, atol=1e-9):
                    more = "applied twice" if label == "times" else "missing"
                    return Cause(
                        "scale",
                        f"the output is the expected one {label} the input {key!r} along {name}: {key} is {more}",
                        f"where {key} is applied",
                        f"apply {key} exactly once",
                        f"actual == expected * f[{name}] within tolerance everywhere, and f == "
                        + (key if label == "times" else f"1/{key}"),
                        EXACT,
                    )
    if ones.any():
        changed = np.nonzero(~ones)[0]
        text = (
            f"only {name} = {fmt_indices(changed)} are scaled (by {', '.join(nice_number(v) for v in fv[changed][:4])})"
        )
    else:
        first = ", ".join(nice_number(v) for v in fv[:4]) + (", ..." if fv.size > 4 else "")
        text = f"each {name} has its own factor ({first})"
    return Cause(
        "scale",
        f"the output is the expected one times a factor that depends on {name} only: {text}",
        f"a factor indexed by {name} (a per-{name} weight applied twice or missing, a per-{name} divisor)",
        f"remove the per-{name} factor",
        f"actual == f[{name}] * expected within tolerance everywhere ({fv.size} factors)",
        EXACT_SHARED,
    )


def _power_causes(c: _Case) -> list[Cause]:
    """Distributions (rows along the last axis summing to 1) that are expected**gamma renormalised."""
    e, a = c.e, c.a
    if e.ndim < 1 or e.shape[-1] < 3 or not (np.isfinite(e).all() and np.isfinite(a).all()):
        return []
    if (e < 0).any() or (a < 0).any():
        return []
    if not (np.abs(e.sum(-1) - 1) < 1e-6).all() or not (np.abs(a.sum(-1) - 1) < 1e-4).all():
        return []
    pos = e > 0
    if not np.array_equal(pos, a > 0):
        return []
    with np.errstate(divide="ignore"):
        le, la = np.where(pos, np.log(np.where(pos, e, 1)), 0.0), np.where(pos, np.log(np.where(pos, a, 1)), 0.0)
    cnt = np.maximum(pos.sum(-1, keepdims=True), 1)
    lec = np.where(pos, le - le.sum(-1, keepdims=True) / cnt, 0.0)
    lac = np.where(pos, la - la.sum(-1, keepdims=True) / cnt, 0.0)
    den = float(np.sum(lec * lec))
    if den <= 0:
        return []
    g = float(np.sum(lac * lec)) / den
    if abs(g - 1) < 1e-9 or g <= 0:
        return []
    z = np.where(pos, g * le, -np.inf)
    z = z - z.max(-1, keepdims=True)
    w = np.exp(z)
    cand = w / w.sum(-1, keepdims=True)
    if not c.fits(cand):
        return []
    return [
        Cause(
            "scale",
            f"the distribution is the expected one raised to the power {nice_number(g)} (= {g:.6g}) and renormalised: "
            f"the scores/logits were multiplied by {nice_number(g)} before the softmax",
            "the factor applied to scores or logits before the softmax (1/sqrt(d_head), 1/temperature)",
            f"scale the scores by the specified factor (the current one is {nice_number(g)} times it)",
            f"actual == softmax({g:.6g} * log(expected)) row by row within tolerance everywhere",
            EXACT,
        )
    ]


def _bool_inversion(c: _Case) -> list[Cause]:
    if not c.fits(1.0 - c.e):
        return []
    return [
        Cause(
            "mask",
            "the mask is inverted: True where the expected mask is False and the other way round",
            "the mask's construction (tril vs triu, a comparison the wrong way, True taken as 'masked')",
            "return True where attending is allowed (j <= i + t_k - t_q)",
            "actual == ~expected at every entry",
            EXACT,
        )
    ]


# ---------------------------------------------------------------------------------------------
# layout: permutations of axes (with a reshape) and of slices along one axis


def _divisor_pairs(n: int):
    return [(f, n // f) for f in range(2, n // 2 + 1) if n % f == 0]


def _fine_layouts(c: _Case):
    """(fine shape, fine names, split axis or None) options: the output's axes, or one axis split in two."""
    shape = c.e.shape
    keep = [k for k in range(len(shape)) if shape[k] > 1]
    base_shape = [shape[k] for k in keep]
    base_names = [c.names[k] if c.named else f"dim{k}" for k in keep]
    yield base_shape, base_names, None
    if len(keep) > 3:
        return
    for pos, k in enumerate(keep):
        group = c.groups[k]
        pairs = _divisor_pairs(shape[k])
        if group and len(group) == 2:
            (n1, s1), (n2, s2) = group
            pairs = [(f, g) for f, g in pairs if (s1 is None or f == s1) and (s2 is None or g == s2)]
            labels = (n1, n2)
        else:
            labels = None
        for f, g in pairs:
            n1, n2 = labels or (f"{base_names[pos]}[{f}]", f"{base_names[pos]}[{g}]")
            fine = base_shape[:pos] + [f, g] + base_shape[pos + 1 :]
            fnames = base_names[:pos] + [n1, n2] + base_names[pos + 1 :]
            yield fine, fnames, k


def _layout_causes(c: _Case) -> list[Cause]:
    n = c.e.size
    if n < 4 or n > 2_000_000:
        return []
    ef, af, care = c.e.ravel(), c.a.ravel(), c.care.ravel()
    rng = np.random.default_rng(0)
    bad_idx = np.flatnonzero(c.bad.ravel())
    # probe positions: some wrong entries and some random ones; a rearrangement must fit there first
    probe = np.unique(np.concatenate([bad_idx[:: max(1, bad_idx.size // 24)][:24], rng.integers(0, n, 40)]))
    a_probe = af[probe]
    seen, matches = set(), []
    for fine, fnames, split in _fine_layouts(c):
        f = len(fine)
        if f < 2 or f > 5:
            continue
        strides = [math.prod(fine[i + 1 :]) for i in range(f)]
        for perm in itertools.permutations(range(f)):
            if perm == tuple(range(f)):
                continue
            # the expected entry that lands at each probe position when expected is laid out as fine[perm]
            coords = np.unravel_index(probe, [fine[p] for p in perm])
            src = sum(coords[i] * strides[perm[i]] for i in range(f))
            key = src.tobytes()
            if key in seen or np.array_equal(src, probe):
                continue
            seen.add(key)
            if not (close(ef[src], a_probe, c.atol, c.rtol) | ~care[src]).all():
                continue
            idx = np.arange(n).reshape(fine).transpose(perm).ravel()
            if (close(ef[idx], af, c.atol, c.rtol) | ~care[idx]).all():
                matches.append((split is not None, perm, fine, fnames, split))
    if not matches:
        return []
    matches.sort(key=lambda m: (m[0], sum(i != p for i, p in enumerate(m[1]))))
    is_split, perm, fine, fnames, split = matches[0]
    src_names = [fnames[p] for p in perm]
    others = f"; {len(matches) - 1} other rearrangement(s) fit too" if len(matches) > 1 else ""
    evidence = (
        f"actual == expected rearranged ({' '.join(fnames)}) -> ({' '.join(src_names)}) and read back as shape "
        f"{list(c.e.shape)}, within tolerance at every entry{others}"
    )
    moved = [i for i, p in enumerate(perm) if i != p]
    if not is_split and len(moved) == 2 and fine[moved[0]] == fine[moved[1]]:
        x, y = fnames[moved[0]], fnames[moved[1]]
        summary = f"axes {x} and {y} are transposed"
        where = f"the order of the {x} and {y} axes (a missing or extra .T / transpose)"
        fix = f"swap {x} and {y} back"
    else:
        merged = ""
        if split is not None:
            k = [i for i, n in enumerate(fnames) if n not in c.names][:2]
            merged = f" (axis {c.axis_name(split)} = {' x '.join(f'{fnames[i]}:{fine[i]}' for i in k)})"
        heads = {n.lower() for n in fnames} & HEAD_NAMES
        summary = (
            f"the data was laid out as [{', '.join(src_names)}] and reshaped (view/reshape without a transpose) to the "
            f"output shape, which expects [{', '.join(fnames)}]{merged}"
        )
        if heads and split is not None:
            summary = "heads merged without transposing back: " + summary
        where = "the reshape/view that forms the output" + (" (the one that merges heads)" if heads else "")
        fix = f"permute to [{', '.join(fnames)}] (e.g. .transpose(...)) before the reshape"
    conf = EXACT if len(matches) == 1 else EXACT_SHARED
    return [Cause("layout", summary, where, fix, evidence, conf)]


def _slice_permutation_causes(c: _Case) -> list[Cause]:
    out = []
    for axis in range(c.e.ndim):
        n = c.e.shape[axis]
        if n < 2:
            continue
        E = np.moveaxis(c.e, axis, 0).reshape(n, -1)
        A = np.moveaxis(c.a, axis, 0).reshape(n, -1)
        C = np.moveaxis(c.care, axis, 0).reshape(n, -1)
        m = E.shape[1]
        if m < 2 or n * n * m > 3_000_000:
            continue
        distinct = ~(close(E[:, None, :], E[None, :, :], c.atol, c.rtol) | ~C[None, :, :]).all(-1)
        if not distinct[~np.eye(n, dtype=bool)].any():
            continue  # every slice looks alike: any reordering would fit
        M = (close(E[None, :, :], A[:, None, :], c.atol, c.rtol) | ~C[None, :, :]).all(-1)  # M[i, j]: A_i == E_j
        if not M.any(1).all() or M.diagonal().all():
            continue
        if _is_shift(M):
            continue  # the shift detector reports it
        sigma = M.argmax(1)  # the first expected slice each actual slice equals
        name = c.axis_name(axis)
        bijective = len(set(sigma.tolist())) == n
        unique = (M.sum(1) == 1).all()
        missing = sorted(set(range(n)) - set(sigma.tolist()))
        sig = ", ".join(str(s) for s in sigma[:16]) + (", ..." if n > 16 else "")
        if bijective:
            summary = (
                f"entries along {name} are reordered: actual[{name}=i] == expected[{name}=sigma(i)], sigma = [{sig}]"
            )
        else:
            summary = (
                f"entries along {name} are routed to the wrong places: actual[{name}=i] == expected[{name}=sigma(i)], "
                f"sigma = [{sig}]"
                + (f"; expected {name} = {fmt_indices(missing)} never appear" if missing and unique else "")
            )
        if name.lower() in HEAD_NAMES:
            summary += (
                " (the heads in another order: repeated k/v heads tiled instead of interleaved, or a grouped head "
                "axis read as (g h) where (h g) is meant)"
            )
        out.append(
            Cause(
                "layout",
                summary,
                f"the indexing, repeat or gather along {name}",
                f"use the specified {name} order (e.g. repeat_interleave, not repeat/tile, for head sharing)",
                f"every slice of actual along {name} equals a slice of expected within tolerance"
                + ("" if unique else " (some expected slices are equal to each other, so sigma is one choice)"),
                EXACT if bijective and unique else EXACT_SHARED,
            )
        )
    return out


def _is_shift(M: np.ndarray) -> bool:
    """True when actual slice i equals expected slice i - s for every i where that exists (|s| <= 3)."""
    n = M.shape[0]
    for s in (1, -1, 2, -2, 3, -3):
        rows = np.arange(max(0, s), min(n, n + s))
        if rows.size >= max(3, math.ceil(0.6 * n)) and M[rows, rows - s].all():  # as the shift detector needs
            return True
    return False


# ---------------------------------------------------------------------------------------------
# shifts


def _shift_causes(c: _Case) -> list[Cause]:
    out = []
    for axis in range(c.e.ndim):
        n = c.e.shape[axis]
        if n < 4:
            continue
        for s in (1, -1, 2, -2, 3, -3):
            overlap = n - abs(s)
            if overlap < max(3, math.ceil(0.6 * n)):
                continue
            src = range(0, n - s) if s > 0 else range(-s, n)  # expected positions
            dst = range(s, n) if s > 0 else range(0, n + s)  # actual positions
            e_reg = np.take(c.e, src, axis=axis)
            a_reg = np.take(c.a, dst, axis=axis)
            care = np.take(c.care, src, axis=axis)
            if not fits(e_reg, a_reg, c.atol, c.rtol, care):
                continue
            e_same = np.take(c.e, dst, axis=axis)
            if fits(e_reg, e_same, c.atol, c.rtol, care):
                continue  # expected is the same shifted: the shift explains nothing
            rolled = np.roll(c.e, s, axis=axis)
            wrapped = c.fits(rolled, np.roll(c.care, s, axis=axis))
            edge = range(0, s) if s > 0 else range(n + s, n)
            a_edge = np.take(c.a, edge, axis=axis)
            e_edge = np.take(c.e, edge, axis=axis)
            if wrapped:
                edge_text = "the entries shifted out wrap around to the other end (a roll)"
            elif np.all(a_edge == 0):
                edge_text = f"the {abs(s)} vacated slice(s) are zero"
            elif fits(e_edge, a_edge, c.atol, c.rtol, np.take(c.care, edge, axis=axis)):
                edge_text = f"the {abs(s)} slice(s) at the edge are right"
            else:
                edge_text = f"the {abs(s)} slice(s) at the edge are something else"
            name = c.axis_name(axis)
            rel = f"{name}-{s}" if s > 0 else f"{name}+{-s}"
            out.append(
                Cause(
                    "shift",
                    f"the output is shifted by {s:+d} along {name}: actual[{name}] == expected[{rel}] (an off-by-"
                    f"{abs(s)} in indices, positions or labels along {name})",
                    f"the indexing along {name}: positions/offsets, label shifting, slice bounds, mask offsets",
                    f"align {name} as specified (remove the {abs(s)}-step offset)",
                    f"{overlap} of {n} slices along {name} equal the expected ones {abs(s)} step(s) "
                    f"{'earlier' if s > 0 else 'later'} within tolerance; {edge_text}",
                    EXACT if wrapped else (EXACT_SHARED if overlap >= 0.75 * n else LOCAL),
                )
            )
            break
        else:
            out += _restart_cause(c, axis)
    return out


def _restart_cause(c: _Case, axis: int) -> list[Cause]:
    """Right up to index m, then the expected values from index 0 again: positions restart at m."""
    n = c.e.shape[axis]
    other = tuple(k for k in range(c.e.ndim) if k != axis)
    rows = c.bad.any(axis=other) if other else c.bad
    if not rows.any():
        return []
    m = int(np.argmax(rows))
    if m < 1 or n - m < 2:
        return []
    src, dst = range(0, n - m), range(m, n)
    e_reg, care = np.take(c.e, src, axis=axis), np.take(c.care, src, axis=axis)
    if not fits(e_reg, np.take(c.a, dst, axis=axis), c.atol, c.rtol, care):
        return []
    name = c.axis_name(axis)
    return [
        Cause(
            "shift",
            f"the output restarts at {name} = {m}: actual[{name} = {m} + i] == expected[{name} = i] (positions or "
            f"offsets restart at 0 instead of continuing from {m})",
            f"the position offset for entries from {name} = {m} on (a cache length or chunk start not added)",
            f"continue positions from {m}",
            f"{name} = 0..{m - 1} match expected; {name} = {m}..{n - 1} equal expected {name} = 0..{n - m - 1} "
            "within tolerance",
            EXACT_SHARED,
        )
    ]


# ---------------------------------------------------------------------------------------------
# no-op: the output is an input, or a simple function of one


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    w = np.exp(z)
    return w / w.sum(axis=axis, keepdims=True)


def _noop_causes(a, inputs, atol, rtol, expected_shape=None) -> list[Cause]:
    out = []
    care = np.ones(a.shape, dtype=bool)
    for name, x in inputs.items():
        if x.shape != a.shape or x.size < 2 or not np.isfinite(x).all():
            continue
        shape_note = f" (so the output also has the input's shape {list(x.shape)})" if expected_shape else ""
        forms = [("unchanged", x, EXACT), ("negated", -x, EXACT)]
        xx = float(np.sum(x * x))
        if xx > 0 and np.isfinite(a).all():
            k = float(np.sum(a * x)) / xx
            if abs(k) > 1e-12 and abs(k - 1) > 1e-9 and abs(k + 1) > 1e-9:
                forms.append((f"times {nice_number(k)}", k * x, EXACT_SHARED))
        for axis in range(x.ndim):
            if x.shape[axis] > 1:
                forms.append((f"with a softmax over axis {axis}", None, EXACT_SHARED))
        for label, cand, conf in forms:
            if cand is None:
                cand = _softmax(x, int(label.rsplit(" ", 1)[1]))
            if fits(cand, a, atol, rtol, care):
                what = "the operation was not applied" if conf == EXACT else "the wrong operation (or axis) was applied"
                out.append(
                    Cause(
                        "noop",
                        f"the output is the input {name!r} {label}: {what}{shape_note}",
                        f"the return value (is the computed result returned, or the input {name}?)",
                        "return the result of the computation",
                        f"actual == input {name!r} {label} within tolerance at every entry",
                        conf,
                    )
                )
                break
    return out


# ---------------------------------------------------------------------------------------------
# masks: errors confined to masked positions, to the diagonal, or to query rows


def _mask_causes(c: _Case) -> list[Cause]:
    out = []
    qa, ka = c.find(QUERY_NAMES), c.find(KEY_NAMES)
    if c.is_bool and c.e.ndim == 2 and (qa is None or ka is None):
        qa, ka = 0, 1
    if qa is not None and ka is not None:
        out += _mask_grid(c, qa, ka)
    elif not c.is_bool:
        masked = np.isneginf(c.e) | (c.e == 0)
        if masked.any() and not masked.all() and not (c.bad & ~masked).any():
            n = int(c.bad.sum())
            out.append(
                Cause(
                    "mask",
                    "wrong only where the expected value is masked (-inf or 0): the mask is not applied there",
                    "where the mask is applied (masked_fill with -inf before the softmax; the mask's alignment)",
                    "apply the mask to every masked position",
                    f"all {n} wrong entries are at positions where expected is -inf or 0; every other entry matches",
                    LOCAL,
                )
            )
    t = c.find(TIME_NAMES) if qa is None else None
    if t is not None and ka is None and c.e.shape[t] >= 3:
        other = tuple(k for k in range(c.e.ndim) if k != t)
        rows = c.bad.any(axis=other)
        n = rows.size
        if rows[:-1].all() and not rows[-1]:
            name = c.axis_name(t)
            out.append(
                Cause(
                    "mask",
                    f"every {name} but the last is wrong and the last one is right: the last position sees every "
                    "token either way, so the earlier positions see other tokens than they should (a causal mask "
                    "missing where one is due, applied where none is asked for, inverted or misaligned)",
                    "the causal mask (is it applied only when asked, bottom-right aligned, True = may attend?)",
                    "mask key j for query i unless j <= i + t_k - t_q where a causal mask is due, and nothing where "
                    "none is",
                    f"{name} = 0..{n - 2} differ, {name} = {n - 1} matches within tolerance",
                    LOCAL,
                )
            )
    return out


def _mask_pattern(allowed: np.ndarray, diag: np.ndarray, top_left: np.ndarray, off: int):
    """(what, formula) when a [t_q, t_k] allowed-grid is a recognisable wrong causal mask, else None."""
    for s in (-1, 1, -2, 2, -3, 3):
        if np.array_equal(allowed, diag <= s):
            what = "the diagonal excluded" if s == -1 else f"shifted by {s:+d} diagonal(s)"
            return f"the mask has {what}: it allows j <= i + (t_k - t_q) {s:+d}", f"j - i - (t_k - t_q) <= {s}"
    if off != 0:
        for s in (0, 1, -1):
            if np.array_equal(allowed, top_left <= s):
                rel = f" {s:+d}" if s else ""
                return f"the mask is aligned top-left (j <= i{rel}) instead of bottom-right (j <= i + {off})", (
                    f"j <= i{rel}"
                )
    if allowed.any() and not allowed.all():  # a causal mask with another offset: name the offset
        for c in range(-allowed.shape[0] - allowed.shape[1], allowed.shape[0] + allowed.shape[1] + 1):
            if c != off and np.array_equal(allowed, top_left <= c):
                if off != 0 and c == -off:
                    return (
                        f"the mask's offset has the wrong sign: it allows j <= i - (t_k - t_q) = i {c:+d} instead of "
                        f"j <= i + (t_k - t_q) = i {off:+d}",
                        f"j <= i {c:+d}",
                    )
                return f"the mask allows j <= i {c:+d} instead of j <= i {off:+d} (a wrong offset)", f"j <= i {c:+d}"
    if allowed.all():
        return "the causal mask is not applied (every key allowed)", "no mask"
    if np.array_equal(allowed, diag > 0):
        return "the mask is inverted (True taken as masked)", "j - i - (t_k - t_q) > 0"
    if off != 0 and np.array_equal(allowed, top_left > 0):
        return "the mask is inverted and aligned top-left", "j > i"
    return None


def _mask_grid(c: _Case, qa: int, ka: int) -> list[Cause]:
    tq, tk = c.e.shape[qa], c.e.shape[ka]
    off = tk - tq
    i = np.arange(tq)[:, None]
    j = np.arange(tk)[None, :]
    diag = j - i - off  # 0 on the bottom-right diagonal, > 0 in the future
    top_left = np.broadcast_to(j - i, diag.shape)
    other = tuple(k for k in range(c.e.ndim) if k not in (qa, ka))
    grid = lambda x: (x.any(axis=other) if other else x) if qa < ka else (x.any(axis=other) if other else x).T
    bad = grid(c.bad)
    qn, kn = c.axis_name(qa), c.axis_name(ka)
    where = "the causal mask: its alignment (bottom-right: j <= i + t_k - t_q), the diagonal, its polarity"
    fix = "allow key j for query i iff j <= i + t_k - t_q (True = may attend)"
    if c.is_bool and c.e.ndim == 2:
        found = _mask_pattern(grid(c.a != 0), diag, top_left, off)
        if found:
            return [Cause("mask", found[0], where, fix, f"actual == ({found[1]}) at every entry", EXACT)]
    elif not c.is_bool:
        masked_e = (c.e == 0) | np.isneginf(c.e)
        masked_a = (c.a == 0) | np.isneginf(c.a)
        allowed_e, allowed_a = grid(~masked_e), grid(~masked_a)
        found = None if np.array_equal(allowed_e, allowed_a) else _mask_pattern(allowed_a, diag, top_left, off)
        if found and not allowed_e.all():
            conf, how = 0.85, "the values are not reproducible from expected (keys allowed that expected masks)"
            if not (allowed_a & ~allowed_e).any():
                keep = allowed_a if qa < ka else allowed_a.T
                shape = [1] * c.e.ndim
                shape[qa], shape[ka] = tq, tk
                keep = keep.reshape(shape)
                fill = -np.inf if np.isneginf(c.e).any() else 0.0
                cand = np.where(keep, c.e, fill)
                sums = np.sum(np.where(np.isfinite(c.e), c.e, 0), axis=ka, keepdims=True)
                if fill == 0.0 and np.allclose(sums, 1.0, atol=1e-6):
                    cand = cand / np.sum(cand, axis=ka, keepdims=True)
                if c.fits(cand):
                    conf, how = EXACT, "expected with those keys masked (and rows renormalised) reproduces actual"
            return [
                Cause(
                    "mask",
                    found[0],
                    where,
                    fix,
                    f"the entries actual masks (0 or -inf) are exactly those of ({found[1]}) over ({qn}, {kn}); {how}",
                    conf,
                )
            ]
    if not bad.any():
        return []
    bd = diag[bad]
    lo, hi = int(bd.min()), int(bd.max())
    n_bad = int(bad.sum())
    regions = [
        (lambda d: d > 0, "only in masked (future) positions: the mask is not applied or lets future keys through"),
        (lambda d: d == 0, "only on the diagonal: each query's own key is handled wrongly (diagonal excluded?)"),
        (lambda d: d >= 0, "only on and above the diagonal: the diagonal and future keys are handled wrongly"),
    ]
    if off > 0:
        regions.insert(
            1,
            (
                lambda d: (d > -off) & (d <= 0),
                f"only between the top-left diagonal (j = i) and the bottom-right one (j = i + {off}): the mask is "
                "aligned top-left",
            ),
        )
    for region, text in regions:
        sel = region(diag)
        if not sel.all() and not (bad & ~sel).any() and bad[sel].mean() >= 0.5:
            return [
                Cause(
                    "mask",
                    f"wrong {text}",
                    where,
                    "allow key j for query i iff j <= i + t_k - t_q, with the diagonal",
                    f"all {n_bad} wrong ({qn}, {kn}) cells lie at j - i - (t_k - t_q) in [{lo}, {hi}]; every other "
                    "cell matches",
                    0.85 if "top-left" in text else LOCAL,
                )
            ]
    return []


# ---------------------------------------------------------------------------------------------
# boundary: wrong only past some index (a tail, the last block)


def _boundary_causes(c: _Case) -> list[Cause]:
    out = []
    t = c.find(TIME_NAMES)
    sequence_like = TIME_NAMES | QUERY_NAMES | KEY_NAMES | {"block", "window", "chunk"}
    for axis in range(c.e.ndim):
        n = c.e.shape[axis]
        if n < 3 or (c.named and c.names[axis].lower() not in sequence_like):
            continue  # boundaries are along sequence axes: not channels (low RoPE pairs), heads or batch rows
        other = tuple(k for k in range(c.e.ndim) if k != axis)
        rows = c.bad.any(axis=other) if other else c.bad
        if rows.all() or not rows.any():
            continue
        idx = np.nonzero(rows)[0]
        name = c.axis_name(axis)
        first, last = int(idx[0]), int(idx[-1])
        contiguous = last - first + 1 == idx.size
        # on a time axis (or one that may be), position 0 (one key, one token) is right under many unrelated bugs
        min_right = 2 if not c.named or axis == t or c.names[axis].lower() in QUERY_NAMES else 1
        if contiguous and last == n - 1 and first >= min_right:
            tail = n - first
            out.append(
                Cause(
                    "boundary",
                    f"wrong only from {name} = {first} on (the last {tail} of {n}); everything before is right: "
                    f"something changes at index {first} (a block, window or chunk that starts there, a partial "
                    "last block, a range that stops early)",
                    f"what changes along {name} at index {first} (a block, window or chunk boundary, a partial last "
                    "block, a range that stops early)",
                    f"handle {name} >= {first} like {name} < {first}",
                    f"slices {name} = {first}..{n - 1} differ, {name} = 0..{first - 1} match within tolerance",
                    LOCAL if c.named else 0.7,
                )
            )
        elif contiguous and first == 0 and not (axis == t and last == n - 2):
            out.append(
                Cause(
                    "boundary",
                    f"wrong only before {name} = {last + 1} (the first {last + 1} of {n}); everything after is right: "
                    f"a boundary problem at index {last + 1}",
                    f"the handling of the first block/window along {name}, or a start offset",
                    f"handle {name} < {last + 1} like the rest",
                    f"slices {name} = 0..{last} differ, {name} = {last + 1}..{n - 1} match within tolerance",
                    0.7 if c.named else 0.65,
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# a matrix reshaped where it should be transposed (or the reverse)


def _reshape_for_transpose_causes(c: _Case) -> list[Cause]:
    """A 2-D ``[r, c]`` output equal to the expected one read through a reshape where a transpose belongs: its
    entries in another order of the same flat buffer, ``e.reshape(c, r).T`` or ``e.T.reshape(r, c)`` (a weight
    ported ``[V, d] -> [d, V]`` by ``reshape`` and brought back by ``.T``)."""
    if c.e.ndim != 2 or c.e.shape[0] == 1 or c.e.shape[1] == 1:
        return []
    r, k = c.e.shape
    for said, candidate in (
        ("reshaped to [{k}, {r}] and then transposed", c.e.reshape(k, r).T),
        ("transposed and then reshaped to [{r}, {k}]", c.e.T.reshape(r, k)),
    ):
        if c.fits(candidate):
            return [
                Cause(
                    "layout",
                    f"the matrix is the expected one {said.format(r=r, k=k)}: a reshape where a transpose belongs "
                    "(or the reverse), the same entries in another order",
                    "where the matrix is converted between [out, in] and [in, out] (at load or at export)",
                    "transpose with .T (or permute), never reshape/view, to swap a matrix's two axes",
                    f"actual == expected.{'reshape(k, r).T' if 'reshaped to' in said else 'T.reshape(r, k)'} at every "
                    "entry",
                    LOCAL,
                )
            ]
    return []


# ---------------------------------------------------------------------------------------------
# RoPE pairing: wrong only in one half, or only in the odd (even) channels


def _rope_pairing_causes(c: _Case) -> list[Cause]:
    if c.e.ndim < 1:
        return []
    d = c.e.shape[-1]
    if d < 4 or d % 2:
        return []
    if not c.named or c.names[-1].lower() not in CHANNEL_NAMES:  # a vocabulary, or an axis nobody named: no pairs
        return []
    chans = c.bad.reshape(-1, d).any(0)
    idx = np.arange(d)
    sets = [
        ("odd", idx % 2 == 1, "interleaved pairs (2i, 2i+1)"),
        ("even", idx % 2 == 0, "interleaved pairs (2i, 2i+1)"),
        ("first-half", idx < d // 2, "half pairs (i, i + d/2)"),
        ("second-half", idx >= d // 2, "half pairs (i, i + d/2)"),
    ]
    for label, sel, pairs in sets:
        if not chans[~sel].any() and chans[sel].sum() >= max(1, sel.sum() // 2):
            exact = bool(chans[sel].all())
            return [
                Cause(
                    "rope_pairing",
                    f"wrong only in the {label} channels of the last axis: one member of each rotated pair is wrong "
                    f"({pairs}): the pairing or the sign of one half of the rotation",
                    "the channel pairing of the rotation (interleaved 2i/2i+1 vs half i/i+d/2) and rotate_half's sign",
                    f"pair and rotate channels in the declared style ({pairs} is where the error sits)",
                    f"{int(chans.sum())} of {d} channels differ, all {label}; the others match within tolerance",
                    LOCAL if exact else 0.7,
                )
            ]
    return []


# ---------------------------------------------------------------------------------------------
# precision: float32 (or half) rounding, not math


def _precision_causes(c: _Case, actual, found: list[Cause]) -> list[Cause]:
    if any(x.confidence >= LOCAL and x.code not in ("dtype",) for x in found):
        return []
    use = c.care & np.isfinite(c.e) & np.isfinite(c.a)
    if not use.all() or use.sum() < 4:
        return []
    err = np.abs(c.a - c.e)[use]
    scale = float(np.max(np.abs(c.e[use])))
    if scale == 0:
        return []
    rel = float(err.max()) / scale
    de, ee = (c.a - c.e)[use], c.e[use]
    corr = abs(float(np.sum(de * ee))) / (float(np.linalg.norm(de)) * float(np.linalg.norm(ee)) + 1e-300)
    a_dtype, _ = _tensor_facts(actual)
    av = c.a[use]
    in32 = np.array_equal(av.astype(np.float32).astype(np.float64), av)
    in16 = np.array_equal(av.astype(np.float16).astype(np.float64), av)
    bf16 = np.array_equal(_round_bf16(av), av)
    if rel <= 3e-5 and corr < 0.5 and rel >= 1e-10:
        fmt = "float32"
        proof = in32 or a_dtype == "float32"
    elif rel <= 3e-2 and (in16 or bf16 or a_dtype in ("float16", "bfloat16")) and corr < 0.5:
        fmt = "float16" if (in16 or a_dtype == "float16") else "bfloat16"
        proof = True
    else:
        return []
    exactness = c.atol <= 1e-9 and fmt == "float32"  # a float64-exactness check: only rounding errs this way
    values = "the actual values are all exactly representable in " + fmt if proof else "no structure in the error"
    if exactness and not proof:
        values += "; this check holds float64 to float64 rounding, and float32 rounding is the error's size"
    return [
        Cause(
            "precision",
            f"the error is at the level of {fmt} rounding (max error {rel:.2g} of the output's scale, uncorrelated "
            f"with the values): precision, not math",
            f"where the computation runs in {fmt} (a .float()/.half(), a {fmt} constant or buffer, an accumulator)",
            "compute in the inputs' dtype (float64 inputs must give float64-exact results)",
            f"max |actual - expected| = {float(err.max()):.3g} = {rel:.2g} x max|expected|; correlation with "
            f"expected {corr:.2f}; {values}",
            EXACT_SHARED if proof or exactness else 0.75,
        )
    ]


def _round_bf16(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)
