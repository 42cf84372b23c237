"""One bug costs once, decided from behaviour: when a failing check is a consequence of failing
upstream names, and which names are the roots.

- **Composition** (``explain``): a failing check's expected value is computed again by the
  *reference* composed with the implementation's own upstream functions: the reference's module
  globals for the failing upstream names are rebound to bridges that call the implementation's
  protocol function (``impl.<name>``, a remote call in grading) on the reference's intermediate
  values. Nothing inside the implementation changes, so this works when its code calls its own
  classes, behind an adapter, and in grading. If the implementation's actual output equals that
  composition at the check's tolerance, the failure is a consequence of those names; otherwise it is
  charged. The answers the bridges got are asked again, in reverse order, as plain calls: a function
  that answers differently when called this way explains nothing.
- **Which failures can explain** (``rootcause.failure_kind``): a precision (float64 exactness),
  validation (error type) or convention (initialisation, memory accounting) failure cannot explain a
  check at math tolerance; only math failures and crashes can.
- **Carried rounding** (``explain_rounding``): a check to float64 rounding whose error is the float32 rounding
  of an upstream failing for that alone, though not bit for bit (the same float32 arithmetic rounds differently on
  another layout), is that upstream's consequence where the composition equals it to float32 rounding and lies
  nearer to it than the float64 result does.
- **Dependency order** (``dependency_order``) and **settling** (``settle``: the one decision both
  pytest's summary and the grade read) live in ``settling.py`` (no torch: the grader imports it).
  A consequence holds only while each of its roots is charged with a real failure (failed or error;
  a root that is only not implemented or not provided pays for nothing).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import torch

from ...protocol import FIXED_RANK, MAY_CALL, SUBSTITUTABLE
from .settling import dependency_order
from .treemap import tree_leaves

# Names the reference's computations call by module-level name and that can be asked of the
# implementation as black boxes: deterministic functions of tensors (not sample's random draw).
COMPOSABLE = frozenset(SUBSTITUTABLE - {"sample", "get_batch", "kv_cache_bytes"})


# ------------------------------------------------------------------------------------------------
# dependency order
# ------------------------------------------------------------------------------------------------


def upstream_closure(names) -> set[str]:
    """Every protocol name the given names may call, directly or not."""
    seen, todo = set(), list(names)
    while todo:
        for callee in MAY_CALL.get(todo.pop(), ()):
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen


# ------------------------------------------------------------------------------------------------
# the reference composed with the implementation's upstream
# ------------------------------------------------------------------------------------------------


class NotComposable(Exception):
    """The reference calls a name with arguments the protocol does not give it (a cache)."""


def _refusals() -> tuple:
    from ..subject.subject import NotImplementedInImpl

    return (Exception, NotImplementedInImpl)  # not KeyboardInterrupt, not pytest's outcomes


_REFUSALS = _refusals()


def _causal(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    t_q, t_k = q.shape[-2], k.shape[-2]
    return torch.arange(t_k, device=q.device)[None, :] <= torch.arange(t_q, device=q.device)[:, None] + (t_k - t_q)


def protocol_call(name: str, args: tuple, kwargs: dict):
    """``(args, kwargs, post)``: the reference's call as protocol v1 states it, and what to apply to
    the implementation's answer (a folded output bias). Raises ``NotComposable``."""
    kwargs = dict(kwargs)
    for option in ("style", "table_size", "fused", "rope_style", "rope_table_size", "attention"):
        kwargs.pop(option, None)
    for option in ("scaling", "rope_scaling"):  # protocol v2 keywords: passed only when in use
        if kwargs.get(option, 0) is None:
            del kwargs[option]
    post = None
    if isinstance(kwargs.get("device"), torch.device):
        kwargs["device"] = str(kwargs["device"])  # plain data, as the wire carries it
    if name == "scaled_dot_product_attention" and kwargs.pop("causal", False):
        q, k = args[0], args[1]
        mask = args[3] if len(args) > 3 else kwargs.pop("mask", None)
        causal = _causal(q, k)
        args = (*args[:3], causal if mask is None else mask.to(torch.bool) & causal)
    if name == "multihead_self_attention":
        if kwargs.pop("cache", None) is not None:
            raise NotComposable("multihead_self_attention with a cache")
        kwargs.pop("layer", None)
        biases = {b: kwargs.pop(b, None) for b in ("bq", "bk", "bv", "bo")}
        if any(v is not None for v in biases.values()):
            args, post = _fold_biases(args, biases)
    rank = FIXED_RANK.get(name)
    if rank and args and isinstance(args[0], torch.Tensor) and rank - 1 <= args[0].dim() != rank:
        args, post = _to_rank(args, rank)
    return tuple(args), kwargs, post


def _to_rank(args: tuple, rank: int):
    """The first argument with its leading dims merged into one (or one added) to the protocol's ``rank``, and the
    answer's leading dims put back: the reference's per-head tensors may have any leading dims (amendment 30's
    ``[..., H, T, d]``), where ``repeat_kv`` is stated for ``[B, Hkv, T, d]``."""
    x, *rest = args
    core = rank - 1
    lead = x.shape[: x.dim() - core]
    return (x.reshape(-1, *x.shape[x.dim() - core :]), *rest), (lambda out: out.reshape(*lead, *out.shape[-core:]))


def _fold_biases(args: tuple, biases: dict):
    """Projection biases folded into the weights (``x`` gets a column of ones; each weight its bias
    as a last column), the output bias added afterwards: the protocol's attention has no biases.
    Where the rows of ``[x, 1]`` span at most ``C`` dimensions (fewer tokens than ``C``), both are
    written in a basis of that span, so ``x`` keeps its width ``C``: code that reads its head width from
    ``x`` (``C // n_heads``) gets the shapes it was written for."""
    x, wq, wk, wv, wo, *rest = args
    ones = torch.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)

    def fold(w, b):
        column = torch.zeros(w.shape[0], 1, dtype=w.dtype, device=w.device) if b is None else b[:, None]
        return torch.cat([w, column.to(w.dtype)], dim=1)

    xs, ws = torch.cat([x, ones], dim=-1), [fold(wq, biases["bq"]), fold(wk, biases["bk"]), fold(wv, biases["bv"])]
    basis = _span(xs, x.shape[-1])
    if basis is not None:
        width = x.shape[-1] - basis.shape[1]
        xs, *ws = (torch.nn.functional.pad((m.to(basis.dtype) @ basis).to(m.dtype), (0, width)) for m in (xs, *ws))
    bo = biases["bo"]
    return (xs, *ws, wo, *rest), (None if bo is None else (lambda out: out + bo))


def _span(rows: torch.Tensor, most: int) -> torch.Tensor | None:
    """An orthonormal basis ``[C + 1, r]`` (float64) of the span of ``rows``' last dim, when ``r <= most``."""
    flat = rows.reshape(-1, rows.shape[-1]).to(torch.float64)
    if flat.shape[0] == 0:
        return None
    _, s, vh = torch.linalg.svd(flat, full_matrices=False)
    r = int((s > s[0] * flat.shape[-1] * torch.finfo(torch.float64).eps).sum())
    return vh[:r].T if r <= most else None


def _cast_like(out, like):
    if isinstance(out, torch.Tensor) and isinstance(like, torch.Tensor):
        dtype = like.dtype if (out.is_floating_point() and like.is_floating_point()) else out.dtype
        return out.to(dtype=dtype, device=like.device)
    return out


@dataclass
class Composition:
    """The bridges' log: every call answered by the implementation, in order."""

    impl: object
    names: tuple[str, ...]
    calls: list[tuple[str, tuple, dict, object]] = field(default_factory=list)
    raised: str | None = None  # the name whose implementation raised inside a bridge
    # ``{name: sites}``: the places in the reference's code (file, line) where ``name`` is answered by the
    # implementation; elsewhere the reference's own function answers (a model whose own token embedding is the
    # failing function, its position embedding another path). None: everywhere
    only: dict | None = None
    sites: dict = field(default_factory=dict)  # name -> the places it was called from, in order of first call

    def bridge(self, name: str, own=None):
        def call(*args, **kwargs):
            caller = sys._getframe(1)
            site = (caller.f_code.co_filename, caller.f_lineno)
            self.sites.setdefault(name, {})[site] = None
            if own is not None and self.only is not None and name in self.only and site not in self.only[name]:
                return own(*args, **kwargs)
            a, k, post = protocol_call(name, args, kwargs)
            # inside a computation autograd records (a training step's loss), the answer carries the gradient back;
            # code that cannot run with gradients (an in-place op on its input) is asked without, as before
            for grad in dict.fromkeys((_differentiated(a, k), False)):
                with torch.set_grad_enabled(grad):
                    try:
                        out = getattr(self.impl, name)(*a, **k)
                        break
                    except _REFUSALS:
                        if grad:
                            continue
                        self.raised = name  # the implementation's own function raised, not the reference around it
                        raise
            self.calls.append((name, a, k, out))
            out = out if post is None else post(out)
            return _cast_like(out, args[0] if args else None)

        return call

    @property
    def called(self) -> list[str]:
        return dependency_order(name for name, *_ in self.calls)

    def consistent(self, tol) -> bool:
        """The same calls asked again, last first, as plain calls, give the same answers."""
        from .compare import mismatch

        for name, a, k, out in reversed(self.calls):
            try:
                with torch.no_grad():
                    again = getattr(self.impl, name)(*a, **k)
            except _REFUSALS:  # answered once, refused now: not a function of its inputs
                return False
            if mismatch(again, out, tol) is not None:
                return False
        return True


def _differentiated(args: tuple, kwargs: dict) -> bool:
    """Whether a bridged call is part of a computation autograd records (a training step's loss): then the
    implementation's answer must carry the gradient back to the reference's weights; else no graph is built."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*args, *kwargs.values()))


def _unfused(fn):
    """The reference's function on its written-out path (its fast paths skip its own callees)."""

    def call(*args, **kwargs):
        kwargs.pop("fused", None)
        return fn(*args, **kwargs)

    return call


UNFUSE = ("scaled_dot_product_attention", "swiglu", "silu", "cross_entropy")


@contextlib.contextmanager
def composed(reference, impl, names, only=None):
    """The reference with each of ``names`` answered by the implementation (``only``: at those call sites alone);
    yields the ``Composition``."""
    comp = Composition(impl, tuple(names), only=only)
    replacements = {n: _unfused(getattr(reference.obj, n)) for n in UNFUSE if hasattr(reference.obj, n)}
    replacements.update({n: comp.bridge(n, replacements.get(n, getattr(reference.obj, n, None))) for n in names})
    with reference.substituted(replacements):
        yield comp


def _matches(compute, reference, impl, names, args64, actual, tol, only=None):
    """The composition over ``names`` (or None when it cannot run), and whether it equals ``actual``."""
    from .compare import mismatch

    try:
        with composed(reference, impl, names, only) as comp:
            out = compute(reference, *args64)
    except _REFUSALS:  # a composition that cannot run explains nothing
        return None, False
    return comp, mismatch(actual, out, tol) is None or _matches_where_defined(actual, out, tol)


def _matches_where_defined(actual, out, tol) -> bool:
    """Whether ``actual`` equals the composition ``out`` (one tensor) outside its undefined rows: whole rows along the
    last axis that are NaN because the implementation's upstream left a query no key to attend (a causal mask
    without its diagonal), rows the protocol leaves unspecified. Some rows must be defined and equal."""
    from .compare import mismatch

    if not isinstance(actual, torch.Tensor) or not isinstance(out, torch.Tensor) or actual.shape != out.shape:
        return False
    if out.ndim < 2 or not out.is_floating_point():
        return False
    undefined = torch.isnan(out).all(dim=-1)
    if not bool(undefined.any()) or bool(undefined.all()) or bool((torch.isnan(out) & ~undefined[..., None]).any()):
        return False
    return mismatch(actual[~undefined], out[~undefined], tol) is None


MAX_SITES = 3  # a name called from more places than this is composed everywhere or not at all


def _matches_at_sites(compute, reference, impl, names, args64, actual, tol, tried):
    """Where the composition everywhere (``tried``) differs from ``actual``: each name the reference calls from two
    or three places composed at one place alone (the others everywhere), the first that equals ``actual``."""
    if tried is None:
        return None, False
    for name in names:
        sites = list(tried.sites.get(name, ()))
        if not 2 <= len(sites) <= MAX_SITES:
            continue
        for site in sites:
            comp, ok = _matches(compute, reference, impl, names, args64, actual, tol, only={name: {site}})
            if ok:
                return comp, ok
    return None, False


def explain(compute, args64, actual, tol, reference, impl, candidates) -> list[str]:
    """The failing upstream names (a minimal set, dependency order) whose own behaviour, composed with
    the reference, gives ``actual``; ``[]`` when none does."""
    names = dependency_order(n for n in candidates if n in COMPOSABLE and impl.provides(n))
    if not names or reference is None:
        return []
    comp, ok = _matches(compute, reference, impl, names, args64, actual, tol)
    if not ok:
        comp, ok = _matches_at_sites(compute, reference, impl, names, args64, actual, tol, comp)
    if not ok:
        return []
    needed, only = comp.called, comp.only
    for name in list(reversed(needed)):  # drop names the match does not need, downstream first
        if len(needed) == 1:
            break
        trial = [n for n in needed if n != name]
        smaller, still = _matches(compute, reference, impl, trial, args64, actual, tol, only)
        if still:
            needed, comp = trial, smaller
    if not needed or not comp.consistent(tol):
        return []
    return needed


def _distance(a, b) -> float | None:
    """The L2 distance between two results of one shape (their floating tensors); None where they differ in
    shape."""

    def leaves(x):  # floating tensors and float scalars, flat, in float64
        return [
            torch.as_tensor(t, dtype=torch.float64).detach().reshape(-1).cpu()
            for _, t in tree_leaves(x, leaf=(torch.Tensor, float))
            if not isinstance(t, torch.Tensor) or t.is_floating_point()
        ]

    xs, ys = leaves(a), leaves(b)
    if len(xs) != len(ys) or any(x.shape != y.shape for x, y in zip(xs, ys)):
        return None
    return sum(float((x - y).square().sum()) for x, y in zip(xs, ys)) ** 0.5


def explain_rounding(compute, args64, actual, expected, loose, reference, impl, candidates) -> list[str]:
    """For a check to float64 rounding: the failing upstream names, each failing for float32 rounding alone, whose
    rounding ``actual`` carries; ``[]`` when it does not. The reference composed with them must differ from
    ``expected`` (their rounding reaches this result), equal ``actual`` at ``loose`` (float32 rounding) and lie
    nearer to ``actual`` than ``expected`` does (in L2): ``actual``'s error is theirs, not a rounding of its own
    that only resembles it in size. Exact equality is not asked: the same float32 arithmetic rounds differently
    on another layout (a complex product broadcast another way), so code rounding in the same place as its own
    upstream function need not match the composition bit for bit."""
    from .compare import mismatch
    from .tolerances import EXACT

    names = dependency_order(n for n in candidates if n in COMPOSABLE and impl.provides(n))
    if not names or reference is None:
        return []
    try:
        with composed(reference, impl, names) as comp:
            out = compute(reference, *args64)
    except _REFUSALS:  # a composition that cannot run explains nothing
        return []
    if not comp.called or mismatch(actual, out, loose) is not None or mismatch(out, expected, EXACT) is None:
        return []
    near, far = _distance(actual, out), _distance(actual, expected)
    if near is None or far is None or not near < far or not comp.consistent(loose):
        return []
    return comp.called


def explain_crash(compute, args64, exc, reference, impl, candidates) -> list[str]:
    """The failing upstream name whose own function, called by the reference composed with it, raises what
    the implementation's computation raised (``exc``: same exception type and message, at the same place in
    the implementation's code); ``[]`` when none does.

    One name at a time, upstream first: a crash has one place, and the first name that reproduces it is it.
    The composition runs on the float64 inputs; a crash that only the implementation's own routing or dtype
    triggers is not reproduced, and stays charged."""
    names = dependency_order(n for n in candidates if n in COMPOSABLE and impl.provides(n))
    if reference is None:
        return []
    for name in names:
        comp = Composition(impl, (name,))
        try:
            with composed(reference, impl, [name]) as comp:
                compute(reference, *args64)
        except _REFUSALS as raised:
            if same_crash(raised, exc) and comp.raised == name:
                return [name]
    return []


def same_crash(raised, exc) -> bool:
    """The same exception (type and message) raised at the same place in the implementation's code."""
    if isinstance(raised, BaseExceptionGroup) and raised.exceptions:
        raised = raised.exceptions[0]
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    from ..diagnosis.crashes import own_frame

    def place(e):  # the innermost frame outside the suite, torch and Python (a library's behind an adapter), else
        # the implementation's own innermost one: two names of an adapter reach one library line from two lines
        original = getattr(e, "original", None)
        return (own_frame(original) if isinstance(original, BaseException) else "") or getattr(e, "where", None)

    mine, theirs = ((getattr(e, "type_names", None), getattr(e, "message", None), place(e)) for e in (raised, exc))
    return None not in mine and bool(mine[2]) and mine == theirs
