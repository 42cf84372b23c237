"""Explaining a crash: which property of the input makes the implementation's call raise.

When a checked call raises (anything but ``NotImplementedError``), ``probe`` retries it on a few
variants of its input, each one property changed and each as cheap as the original call:

- rank, for names whose protocol shapes are ``[..., d]`` (``ANY_LEADING``): the first tensor argument
  with one more leading dim (alone, and with every tensor sharing its leading dim, as ``cross_entropy``'s
  targets share its logits'), or with its two leading dims merged;
- an optional argument left ``None``, passed or omitted, given the value ``None`` means instead
  (``mask=None`` as an all-True mask, ``positions=None`` as ``arange(T)``, ``bias=None`` as zeros,
  ``max_grad_norm=None`` as ``inf``, ``generator=None`` as a generator, ``top_k=None`` as ``V``,
  ``top_p=None`` as 1.0, ``device=None`` as the CPU, ``dtype=None`` as torch's default, ``n_kv_heads=None`` as
  ``n_heads``: the protocol's own meanings, ``Entry.none_means``);
- a size at a boundary: a 1-D token stream one token longer, a length-1 time axis of two, a ``[B, T]``
  id input one token shorter, half as long and one token long (a context length crossed, a cached chunk);
  a count of the last axis's entries above its size (``top_k > V``) given that size; an odd integer size
  (``d_model``) given as the next even one; an integer count of 1 given as 2, and one of 2 to 9 given ten times
  larger (``batch_size=1``, ``steps=3``; never an axis such as ``dim``); an odd batch of ``[B, T]`` ids given one
  more row; k and v with more positions than q given as many as q has (their last); a float input of B >= 2 rows
  (a batch axis before time) given as one row, where the second row alone runs too (the number of rows, not a
  row's values);
- a config that leaves optional keys out given with the protocol's defaults written out;
- GQA: k and v with fewer heads than q given repeated to q's heads, and attention weights with fewer key/value
  heads given with their key and value rows repeated to ``n_heads``; several kv heads (k and v, or
  ``repeat_kv``'s input with ``n_rep > 1``) given as one (MQA); a GQA config given to ``build_model`` as
  ``n_kv_heads = n_heads`` with its canonical k and v weights repeated alike;
- the dtype: float64 inputs as float32 (and float32 as float64, bfloat16 and float16 as float32), a model among
  them copied in that dtype; a ``torch.dtype`` argument (``bfloat16``) as float32;
  integer data of a narrow dtype (numpy uint16, int32) as int64;
- a broadcastable shape: 1-D positions ``[T]`` given in full, ``x.shape[:-1]``, and fuller positions
  given as one row ``[T]``.
- far positions: positions reaching 2048 or further given modulo 1024 (a table built for a fixed number of
  positions);
- a 0-d input of an elementwise name (``silu``) as the same value in 1-D;
- a mask with leading dims holding one ``[Tq, Tk]`` matrix given as that matrix;
- a built model among the arguments (or its optimizer or cache) built again with one config property changed
  that keeps every value it computes: GQA as MHA (its kv weights repeated), a tied head as an untied copy
  (``model_variants.py``); and, with a control that the original raises again, properties that change values: a
  dropout rate as 0 (another rate raises), a protocol v2 option left at its default (a fresh model with it raises);
  a call through a cache of several rows made again through a cache of one row;
- a config given to the call: a protocol v2 option at its default (the weights it adds left out), an int option
  one smaller and below the context (a limit where one larger raises), an untied head tied;
- token ids holding 0 inside a sequence with 0 replaced by 1 (a pad id read as padding; 2 must run too); a bool
  ``attention_mask`` as int64; ``generate``'s ``use_cache`` at its other value, any other bool flag given
  explicitly at its other value (``causal=False``), and a given ``generator`` as None (paths: said only where
  nothing nearer is); an expanded (stride 0) input as a contiguous copy; a ``device`` given as a string or left out
  as a ``torch.device``;
- through a cache: a fresh cache after one token went in (``cache_empty``, where the shorter call through an
  empty cache raises too); every variant on a recorded cache runs on that cache made again and refilled as it was
  (``Ledger.fresh_caches``: the failing call may have left it half written), the call's length tried first.

A cut ``[B, T]`` id input names a length only where the kept tokens repeated to ``T`` raise too (else the ids
cut away were the trigger). A variant whose model cannot be built (``model_variants.NotBuilt``) is not tried.

Where no variant above runs, sizes are tried (``_multiple_probes``, ``_axis_size_probes``, ``_int_size_probes``):
a tensor axis whose size is no multiple of an integer argument (``block_size``) grown to the next multiple; each
size of the first tensor argument's leading axes grown to the next power of two on every axis of that size, every
entry kept (a cause: a tile, a squeezed axis), or cut to a prefix (a clue only: what was cut may be what it raises
on); an integer size given as a smaller size of the same call (``causal_mask(16, 13)``; a clue only: a held-out
``evaluate`` that needs ``(n - 1) % context_length == 0`` ran with ``context_length`` set to its ``batch_size``).

A limit, a parity or a multiple is named only where a control agrees (``Probe.controls``): 36 entries that run
where 35 raise name a minimum length only if 37 run too; an odd size only if the next odd size raises and the even
one after it runs; a multiple only if one past the multiple raises; a size above another (a clue only) only if one
past the other and one below the original raise and one below the other runs; a count too small (1 -> 2, 7 ->
70) only if one more than the larger count runs too.

Probing stops at a variant that times out, takes the worker's process down or runs out of memory (``_ProcessLost``,
``out_of_memory``: a limit that raises on one machine kills on another), and a timeout or
a lost process is not probed at all (``Spec._crashed``): in grading each would cost a restart, and they are limited.

A variant that runs names the property: "rmsnorm raises for 4-D input and works for 3-D". Only what
the probes showed is said; when every variant raises too, the line says which ones were tried, and what the
line it raised at read (``crash_site.site_lines``: the values it names; a division by one name holding 0 is named).
``own_frame`` (``crash_site.py``) finds the innermost traceback frame in the implementation's own files (not the
adapter's, the suite's, torch's or Python's).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ...protocol import (
    ANY_LEADING,
    ENTRY,
    NONE_MEANS,
    SPEED_ONLY,
    V2_CONFIG_DEFAULTS,
    V2_OPTIONS_KEPT,
    WINDOWED,
    config_defaults,
)
from .crash_site import own_frame, site_lines
from .model_variants import (
    HEAD_SIZES,
    Ledger,
    NotBuilt,
    heads_repeated,
    option_off,
    options_set,
    other_float,
    shares_a_position,
    without,
)

NOTHING_RAN = "note: the crash does not depend on what was probed"
BESIDE_CACHE = "the same ids run through a cache holding fewer positions, so their length matters only beside them"

# ANY_LEADING (imported): functions whose protocol shapes are ``[..., d]``: any number of leading dims
MAX_TRIES = 14


@dataclass(frozen=True)
class Probe:
    """One input variant: ``failing`` names the property of the original input, ``working`` the variant's."""

    failing: str
    working: str
    args: tuple
    kwargs: dict
    note: str = ""
    code: str = "crash"  # the cause code a running variant stands for ("boundary": a size)
    weak: bool = False  # a clue, not a cause: said as a note
    clue: str = "a wrong shape may broadcast by chance there"  # why it is only a clue
    make: Callable | None = None  # builds ``(args, kwargs)`` when tried (a model built again), else args, kwargs
    # ``(args, kwargs, runs)`` or ``(make, runs)``: further variants that must run (``runs``) or raise as the
    # original does for the property to be the trigger (13 entries raising like 11 where 12 runs: a multiple)
    controls: tuple = ()
    # the one cause where it runs: a contiguous copy changes only the layout, so another variant that runs as well
    # (a 2-D input, on which a view to [N, d] is no change) is no evidence of its own
    exclusive: bool = False
    # a size of the call's new tokens: beside a filled cache that fewer positions mend (``refills``), the size
    # matters only with the cached positions (a mask sliced from row 0 broadcasts for one more token by chance)
    beside_cache: bool = False
    refills: bool = False  # the call made again with its cache filled with fewer positions (``model_variants``)
    # ``((args, kwargs), note)``: a nearer variant tried once this one runs; where it raises, ``note`` is said too
    # (a leading dim added to every input sharing it runs, to the first alone raises: the others' rank is the trigger)
    contrast: tuple = ()
    # a path, not a property: said only where no other variant that runs names the trigger (top_k=None runs where
    # top_k above V raises, and the size is what it raises on)
    fallback: bool = False
    # a rank (a leading dim added, merged or taken away): where another variant that keeps the rank runs too, the rank
    # is not what it raises on alone (a 5-D input may run by chance where a broadcast mask is the trigger)
    rank: bool = False
    # "handles one new token only": no claim where a shorter chunk of several tokens (``chunk`` >= 2) runs as well
    single_token: bool = False
    chunk: int = 0  # the new tokens of a [B, T] id input cut shorter
    # an optional argument's None given what it means: a path as much as a property, so said as a clue where another
    # change (not a rank, not a path) runs as well (top_p=1.0 ran where top_p=None raised, and top_k above V was it)
    meaning: bool = False
    # ``(kind, value)`` or ``(kind, value, given)``: one of several values of one property tried alike (a head size;
    # ``given``, the value the call raised for); every value is tried, and those that run are said together with those
    # that raise (``_grouped``)
    group: tuple = ()

    def arguments(self) -> tuple[tuple, dict]:
        return self.make() if self.make is not None else (_clone(self.args), _clone(self.kwargs))


def _tensors(args, kwargs):
    yield from (a for a in args if isinstance(a, torch.Tensor))
    yield from (v for v in kwargs.values() if isinstance(v, torch.Tensor))


def _map(args, kwargs, fn, *, layout=True):
    """``(args, kwargs)`` with ``fn`` applied to every tensor (``fn`` returns the tensor or a new one). A new tensor
    made from a non-contiguous one is made non-contiguous too (``layout``), so a variant changes only what it says
    (a reshape's copy would also mend a crash on a view)."""

    def apply(t):
        new = fn(t)
        if layout and new is not t and not t.is_contiguous() and new.is_contiguous() and new.ndim >= 2:
            new = new.transpose(0, 1).contiguous().transpose(0, 1)
        return new

    return (
        tuple(apply(a) if isinstance(a, torch.Tensor) else a for a in args),
        {k: apply(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
    )


def _layout_probes(name, args, kwargs) -> list[Probe]:
    """Every non-contiguous tensor argument (a transposed or sliced view) given as a contiguous copy."""
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    views = [k for k, v in zip(keys, values, strict=True) if isinstance(v, torch.Tensor) and not v.is_contiguous()]
    if not views:
        return []
    variant = _map(args, kwargs, lambda t: t.contiguous(), layout=False)
    expanded = [k for k, v in zip(keys, values, strict=True) if isinstance(v, torch.Tensor) and 0 in v.stride()]
    if expanded:  # entries sharing memory: what raises on them is a write, not a view
        note = "; any memory layout is allowed, an expanded one too (an in-place edit of the input raises on it, and "
        note += "so can x.view; x.reshape does not)"
        failing = f"an expanded (stride 0) {', '.join(expanded)}"
    else:
        note = "; any memory layout is allowed (x.view raises on such a view, x.reshape does not)"
        if any(v.ndim and v.stride(-1) != 1 for v in values if isinstance(v, torch.Tensor) and not v.is_contiguous()):
            note = (
                "; any memory layout is allowed (x.view raises on such a view, and torch.view_as_complex where the "
                "last axis is not unit-stride; x.reshape and x.contiguous() do not)"
            )
        failing = f"a non-contiguous {', '.join(views)}"
    working = "a contiguous copy of the same values"
    return [Probe(failing, working, *variant, note, exclusive=True)]


def _with(args, kwargs, where, value):
    """``(args, kwargs)`` with the argument at ``where`` (a position or a keyword) replaced by ``value``."""
    if isinstance(where, int):
        return (*args[:where], value, *args[where + 1 :]), kwargs
    return args, {**kwargs, where: value}


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _primary(args, kwargs) -> torch.Tensor | None:
    """The call's first tensor argument: the input whose shape the protocol's row describes first."""
    return next(_tensors(args, kwargs), None)


def _rank_probes(name, args, kwargs) -> list[Probe]:
    """One more leading dim on the first tensor argument, alone and with every tensor that shares its leading
    dim or all its leading dims (``cross_entropy``'s targets beside its logits); a 3-D or deeper one with its two
    leading dims merged."""
    x = _primary(args, kwargs)
    if x is None or name not in ANY_LEADING:  # another rank is no input the protocol allows
        return []
    n = x.ndim
    note = "; the protocol allows any leading dims"
    if n == 0:  # an elementwise name's 0-d input (a core rank of 0): the same value as a 1-D one
        variant = _map(args, kwargs, lambda t: t.reshape(1) if t is x else t)
        return [Probe("a 0-d input", "1-D (the same value as [1])", *variant, note)]
    probes = []
    if n >= 3:
        lead = x.shape[:2]

        def merge(t):
            return t.reshape(-1, *t.shape[2:]) if t.ndim >= 2 and t.shape[:2] == lead else t

        probes.append(Probe(f"{n}-D input", f"{n - 1}-D (leading dims merged)", *_map(args, kwargs, merge), note))

    def add_to_first(t):
        return t.unsqueeze(0) if t is x else t

    def shares(t):  # its leading dim, or all of them (a 0-d target beside 1-D logits)
        return (t.ndim >= 1 and t.shape[0] == x.shape[0] and t.ndim <= n) or t.shape == x.shape[:-1]

    def add_to_all(t):
        return t.unsqueeze(0) if t is x or shares(t) else t

    together = [t for t in _tensors(args, kwargs) if t is not x and shares(t)]
    if together:
        keys = argument_keys(name, args, kwargs)
        named = [f"{k} {list(v.shape)}" for k, v in zip(keys, [*args, *kwargs.values()], strict=True)
                 if isinstance(v, torch.Tensor) and any(v is t for t in together)]  # fmt: skip
        alone = (_map(args, kwargs, add_to_first), f"; added to the input alone it raises as well, so the rank of "
                 f"{', '.join(named)} is what it raises on")  # fmt: skip
        probes.append(
            Probe(
                f"{n}-D input",
                f"{n + 1}-D (a leading dim added to it and to the inputs sharing its leading dim)",
                *_map(args, kwargs, add_to_all),
                note,
                contrast=alone,
            )  # fmt: skip
        )
    probes.append(Probe(f"{n}-D input", f"{n + 1}-D (a leading dim added)", *_map(args, kwargs, add_to_first), note))
    same_rank = [t for t in _tensors(args, kwargs) if t is not x and t.ndim == n]
    if same_rank and len(together) < len(same_rank):  # q, k, v of one rank whose first dims differ (GQA heads)
        probes.append(
            Probe(
                f"{n}-D input",
                f"{n + 1}-D (a leading dim added to every {n}-D input)",
                *_map(args, kwargs, lambda t: t.unsqueeze(0) if t.ndim == n else t),
                note,
            )
        )
    core = ENTRY[name].core_rank
    lead = x.shape[: n - core]
    if n > core and 2 <= math.prod(lead) <= 64:  # leading dims: a row alone has none

        def sharing(t):  # a tensor with the first input's leading dims (cross_entropy's targets)
            return t is x or (t.ndim >= len(lead) and t.shape[: len(lead)] == lead)

        def row(i):
            return _map(args, kwargs, lambda t: t.reshape(-1, *t.shape[len(lead) :])[i] if sharing(t) else t)

        def ones(t):  # the first row with a leading dim of 1 for each of its leading dims: [1, 1, V]
            return t.reshape(-1, *t.shape[len(lead) :])[:1].reshape(*[1] * len(lead), *t.shape[len(lead) :])

        # other rows run alone (not its values), and the first keeping its leading dims as ones ([1, V]) raises: a
        # leading dim at all is the trigger, not several rows (where [1, V] runs, the rows are: _rows_alone_probes)
        controls = tuple((*row(i), True) for i in range(1, min(3, math.prod(lead))))
        controls += ((*_map(args, kwargs, lambda t: ones(t) if sharing(t) else t), False),)
        probes.append(Probe(f"{n}-D input", f"{core}-D (each row alone, without the leading dims)", *row(0), note,
                            controls=controls, rank=True))  # fmt: skip
    return [replace(p, rank=True) for p in probes]


def _none_value(key: str, args, kwargs):
    """What ``key=None`` means, as a value (``Entry.none_means``), shaped for this call; None when unknown."""
    floats = [t for t in _tensors(args, kwargs) if t.is_floating_point()]
    q = floats[0] if floats else None
    k = floats[1] if len(floats) > 1 else q
    if key == "mask" and q is not None and q.ndim >= 2:
        return "an all-True mask", torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
    if key == "positions" and q is not None and q.ndim >= 2:
        return "positions=arange(T)", torch.arange(q.shape[-2], device=q.device)
    if key == "max_grad_norm":
        return "max_grad_norm=inf (no clipping)", float("inf")
    if key == "n_kv_heads":  # multihead_self_attention(x, wq, wk, wv, wo, n_heads, n_kv_heads=None, ...)
        n_heads = args[5] if len(args) > 5 else kwargs.get("n_heads")
        return (f"n_kv_heads={n_heads} (n_heads)", n_heads) if type(n_heads) is int else None
    if key == "bias" and len(args) >= 2 and isinstance(args[1], torch.Tensor) and args[1].ndim == 2:
        weight = args[1]
        return "a zero bias", torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
    if key == "generator":
        return "a torch.Generator", torch.Generator().manual_seed(0)
    if key == "top_k" and q is not None:
        return f"top_k={q.shape[-1]} (every token)", q.shape[-1]
    if key == "top_p":
        return "top_p=1.0 (the whole mass)", 1.0
    if key == "device":
        return 'device="cpu" (the default device)', "cpu"
    if key == "dtype":
        default = torch.get_default_dtype()
        return f"dtype={str(default).removeprefix('torch.')} (torch's default dtype)", default
    return None


def _none_probes(name, args, kwargs) -> list[Probe]:
    """An optional argument left ``None`` (passed, or omitted where the protocol gives it a meaning) given the
    value that ``None`` means instead."""
    keys = [key for key, value in kwargs.items() if value is None]
    given = set(_signature_names(name)[: len(args)])  # passed by position: not omitted
    keys += [key for key in NONE_MEANS.get(name, ()) if key not in kwargs and key not in given]
    probes = []
    for key in keys:
        found = _none_value(key, args, kwargs)
        if found is None:
            continue
        working, value = found
        note = "; mask=None means none" if key == "mask" else ""
        probes.append(Probe(f"{key}=None", working, args, {**kwargs, key: value}, note, meaning=True))
    return probes


def _given_none_probes(name, args, kwargs) -> list[Probe]:
    """An optional argument given a value where the protocol lets it be ``None`` (``max_grad_norm=0.5``, ``top_p``,
    a ``mask``) given ``None`` instead: the path that uses the value raises (a clipping norm taken with a call
    that takes only 1-D tensors). Said with what ``None`` means, so the line names the path."""
    keys = argument_keys(name, args, kwargs)
    wheres, values = [*range(len(args)), *kwargs], [*args, *kwargs.values()]
    probes = []
    for key, where, value in zip(keys, wheres, values, strict=True):
        if key not in NONE_MEANS.get(name, ()) or value is None or key in ("device", "dtype"):
            continue
        shown = f"{key}={value!r}" if isinstance(value, int | float) else f"a {key}"
        probes.append(Probe(shown, f"{key}=None", *_with(args, kwargs, where, None),
                            f"; so the path that uses {key} raises", fallback=True))  # fmt: skip
    return probes


def _speed_only_probes(name, args, kwargs) -> list[Probe]:
    """A boolean argument the protocol says changes speed only (``generate``'s ``use_cache``, True by default) given
    its other value: the faster path raises. A path, not a property: said only where nothing nearer is."""
    keys = argument_keys(name, args, kwargs)
    given = dict(zip(keys, [*args, *kwargs.values()], strict=True))
    probes = []
    for key in SPEED_ONLY.get(name, ()):
        value = given.get(key, True)
        if not isinstance(value, bool):
            continue
        new_args, new_kwargs = args, {**kwargs, key: not value}
        if key in keys[: len(args)]:
            new_args, new_kwargs = _with(args, kwargs, keys.index(key), not value)
        probes.append(Probe(f"{key}={value}", f"{key}={not value}", new_args, new_kwargs,
                            f"; so the {key}={value} path raises ({key} changes speed, never the result)",
                            fallback=True))  # fmt: skip
    return probes


LOOP_COUNTS = ("max_new_tokens", "steps")  # how many times a call's loop runs (generate, train)


def _one_step_probes(name, args, kwargs) -> list[Probe]:
    """A loop count of two or more (``max_new_tokens``, ``steps``) given as 1, where 2 raises as well (control): the
    first step runs and the second raises, so what one step leaves for the next is the trigger. A path, not a
    property: said only where nothing nearer is."""
    probes = []
    for label, where, value in _labelled_ints(name, args, kwargs):
        if label in LOOP_COUNTS and value >= 2:
            probes.append(
                Probe(
                    f"{label}={value}" + (" (and 2)" if value > 2 else ""),
                    f"{label}=1",
                    *_with(args, kwargs, where, 1),
                    "; so the first step runs and the second raises: what a step leaves for the next one (a mask, "
                    "cache or positions grown, converted or advanced wrong) breaks it",
                    controls=((*_with(args, kwargs, where, 2), False),) if value > 2 else (),
                    fallback=True,
                )
            )
    return probes


def _device_probes(name, args, kwargs) -> list[Probe]:
    """A ``device`` given as a string ("cpu", as torch's own functions take it) or left None, given as the
    ``torch.device`` it names: code that reads ``device.type`` takes only the latter."""
    if "device" not in _signature_names(name):  # the protocol's own device argument only
        return []
    keys = argument_keys(name, args, kwargs)
    wheres, values = [*range(len(args)), *kwargs], [*args, *kwargs.values()]
    for key, where, value in zip(keys, wheres, values, strict=True):
        if key == "device" and (value is None or isinstance(value, str)):
            device = torch.device(value or "cpu")
            shown = f"device={value!r}" + (" (a string)" if isinstance(value, str) else "")
            return [Probe(shown, f"device=torch.device({str(device)!r})", *_with(args, kwargs, where, device))]
    if "device" in _signature_names(name) and "device" not in keys:  # omitted: None, the default device
        return [Probe("device left out (None)", "device=torch.device('cpu')", args,
                      {**kwargs, "device": torch.device("cpu")})]  # fmt: skip
    return []


# where the protocol writes a float, an int of the same value is that float (amendment 35)
FLOAT_ARGUMENTS = ("temperature", "top_p", "lr", "theta", "max_grad_norm", "softcap", "norm_eps")
FLOAT_CONFIG_KEYS = ("attn_logit_softcap", "final_logit_softcap", "rope_theta", "norm_eps")


def _int_as_float_probes(name, args, kwargs) -> list[Probe]:
    """An int given where the protocol writes a float (``temperature=2``, a config's ``final_logit_softcap=30``)
    given as that float: code that checks ``isinstance(x, float)`` refuses a number the protocol allows."""
    keys = argument_keys(name, args, kwargs)
    probes = []
    for key, where, value in zip(keys, [*range(len(args)), *kwargs], [*args, *kwargs.values()], strict=True):
        if key in FLOAT_ARGUMENTS and type(value) is int:
            probes.append(Probe(f"{key}={value} (an int)", f"{key}={float(value)}", *_with(args, kwargs, where,
                                float(value)), "; an int is the float of the same value (amendment 35)"))  # fmt: skip
        if isinstance(value, dict):
            ints = [k for k in FLOAT_CONFIG_KEYS if type(value.get(k)) is int]
            if ints:
                floats = {**value, **{k: float(value[k]) for k in ints}}
                shown = ", ".join(f"{k}={value[k]}" for k in ints)
                probes.append(Probe(f"a config with {shown} (ints)", "the same values as floats",
                                    *_with(args, kwargs, where, floats),
                                    "; an int is the float of the same value (amendment 35)"))  # fmt: skip
    return probes


def _flag_probes(name, args, kwargs) -> list[Probe]:
    """A boolean argument given explicitly (``flash_attention``'s ``causal=False``), other than the speed-only ones,
    given its other value: the path of that value raises. A path, not a property: said only where nothing nearer is."""
    keys = argument_keys(name, args, kwargs)
    probes = []
    for where, (key, value) in enumerate(zip(keys, [*args, *kwargs.values()], strict=True)):
        if not isinstance(value, bool) or key in SPEED_ONLY.get(name, ()):
            continue
        at = where if where < len(args) else key
        probes.append(Probe(f"{key}={value}", f"{key}={not value}", *_with(args, kwargs, at, not value),
                            f"; so the {key}={value} path raises", fallback=True))  # fmt: skip
    return probes


def _empty_probes(name, args, kwargs) -> list[Probe]:
    """Every empty axis (size 0: a fresh cache's keys, no tokens yet) given one entry (zeros)."""
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    where = [f"{key}'s axis {axis}" for key, value in zip(keys, values, strict=True) if isinstance(value, torch.Tensor)
             for axis, size in enumerate(value.shape) if size == 0]  # fmt: skip
    if not where:
        return []

    def one_entry(t):
        return torch.zeros([max(s, 1) for s in t.shape], dtype=t.dtype, device=t.device) if t.numel() == 0 else t

    failing = f"an empty axis ({', '.join(where)} of size 0)"
    return [Probe(failing, "one entry there (zeros)", *_map(args, kwargs, one_entry), "", "boundary")]


def _zero_float_probes(name, args, kwargs) -> list[Probe]:
    """A float argument of exactly 0 (a temperature, a rate) given as 0.001: a division by it, or a 0 that means
    something (greedy decoding) handled after a computation that cannot take it; one of exactly 1 (``top_p=1.0``,
    the whole distribution) given as 0.999: a range checked as open, (0, 1), where the protocol closes it."""
    wheres, values = [*range(len(args)), *kwargs], [*args, *kwargs.values()]
    return [
        Probe(f"{label}={value:g}", f"{label}={nudged:g}", *_with(args, kwargs, where, nudged), "", "boundary")
        for label, where, value in zip(argument_keys(name, args, kwargs), wheres, values, strict=True)
        if type(value) is float and value in (0.0, 1.0)
        for nudged in [0.001 if value == 0.0 else 0.999]
    ]


def _tie_probes(name, args, kwargs) -> list[Probe]:
    """A floating input with a row whose entries along the last axis are all equal (a flat distribution: every logit
    tied) given with those entries made distinct by a small ramp: a filter that drops every entry below a cutoff, or
    picks by a strict comparison, finds none where all are tied."""
    first = _primary(args, kwargs)
    if first is None or not first.is_floating_point() or first.dim() < 1 or first.shape[-1] < 2:
        return []
    rows = first.detach().reshape(-1, first.shape[-1])
    if not bool((rows == rows[:, :1]).all(dim=-1).any()):
        return []
    ramp = torch.linspace(0, 0.5, first.shape[-1], dtype=first.dtype, device=first.device)
    return [
        Probe(
            f"a row of equal values along the last axis ({first.shape[-1]} entries tied)",
            "the same values made distinct (a ramp of up to 0.5 added along the last axis)",
            *_map(args, kwargs, lambda t: t + ramp if t is first else t),
            "",
            "boundary",
        )
    ]


def _filled(name, args, kwargs, n: int) -> str:
    """How a stream of ``n`` entries meets a ``context_length`` argument: its ``n - 1`` predictions (or its ``n``
    entries) an exact number of windows, or ``""``."""
    for label, _, value in _labelled_ints(name, args, kwargs):
        if label != "context_length" or value < 1:
            continue
        if (n - 1) % value == 0:
            k = (n - 1) // value
            return f" ({n} - 1 = {k} x context_length: its predictions fill {k} whole window{'s' * (k != 1)})"
        if n % value == 0:
            return f" ({n} = {n // value} x context_length)"
    return ""


def _boundary_probes(name, args, kwargs, context: int | None = None) -> list[Probe]:
    """A 1-D token stream one token longer; a [B, 1] id input with two tokens; a [B, T] one shorter, half as long
    and one token long (a size past a limit, such as the context length, is often further than one token; a
    cached step of one token is the common case). ``context``: the model's context_length, said where the length
    that raises is past it and the one that runs within it (a prompt the protocol crops)."""
    probes = []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or a.is_floating_point() or a.dtype == torch.bool:
            continue
        if a.ndim == 1 and a.numel() > 0:
            longer = torch.cat([a, a[:1]])
            new = (*args[:i], longer, *args[i + 1 :])
            # a limit: two longer runs as well (where it raises, the length is a multiple or a parity, no limit)
            control = (*args[:i], torch.cat([a, a[:2]]), *args[i + 1 :])
            probes.append(
                Probe(
                    f"a 1-D input of exactly {a.numel()} entries{_filled(name, args, kwargs, a.numel())}",
                    f"{a.numel() + 1} entries",
                    new,
                    kwargs,
                    "",
                    "boundary",
                    controls=((control, kwargs, True),) if a.numel() >= 2 else (),
                )
            )
            break
        if a.ndim == 2 and a.shape[1] == 1:
            new = (*args[:i], a.repeat(1, 2), *args[i + 1 :])
            probes.append(Probe("a sequence of length 1 (T=1)", "T=2", new, kwargs, "", "boundary", beside_cache=True))
            break
        if a.ndim == 2 and a.shape[1] >= 2:
            t = a.shape[1]
            for shorter in dict.fromkeys((t - 1, t // 2, 1)):
                new = (*args[:i], a[:, :shorter].contiguous(), *args[i + 1 :])
                # the kept tokens repeated to T tokens must raise as well: the length, not the ids cut away (a token
                # id that the code reads as padding), is what it raises on
                kept = a[:, :shorter].repeat(1, -(-t // shorter))[:, :t].contiguous()
                control = ((*args[:i], kept, *args[i + 1 :]), kwargs, False)
                # one token runs where a wrong shape broadcasts by chance: a clue, never a cause
                past = context is not None and shorter <= context < t
                failing = f"a [B, T] id input of T={t} tokens" + (
                    f" (more than the context_length, {context})" if past else ""
                )
                probes.append(
                    Probe(failing, f"T={shorter}" + (" (within it)" if past else ""), new, kwargs, "", "boundary",
                          weak=shorter == 1 and t > 2, beside_cache=True, controls=(control,), chunk=shorter)
                )  # fmt: skip
            break
    return probes


def _modules(args, kwargs):
    yield from (a for a in (*args, *kwargs.values()) if isinstance(a, torch.nn.Module))


def _dtype_probes(args, kwargs) -> list[Probe]:
    """Float inputs in the other float dtype (16-bit ones as float32); a model among them (a local module) copied in
    that dtype too."""
    dtypes = {t.dtype for t in _tensors(args, kwargs) if t.is_floating_point()}
    modules = list(_modules(args, kwargs))
    dtypes |= {p.dtype for m in modules for p in m.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        return []
    (dtype,) = dtypes
    other = other_float(dtype)
    if other is None:
        return []
    name = {t: str(t).removeprefix("torch.") for t in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
    try:  # the model is copied, never changed: a module that cannot be copied is not probed
        copies = {id(m): copy.deepcopy(m).to(other) for m in modules}
    except Exception:  # noqa: BLE001 - whatever its own copy raises
        return []

    def cast(v):
        if isinstance(v, torch.Tensor):
            return v.to(other) if v.is_floating_point() else v
        return copies.get(id(v), v)

    new_args = tuple(cast(a) for a in args)
    new_kwargs = {k: cast(v) for k, v in kwargs.items()}
    failing = f"a {name[dtype]} model" if modules else f"{name[dtype]} input"
    working = f"the same model in {name[other]}" if modules else name[other]
    return [Probe(failing, working, new_args, new_kwargs)]


def _integer_dtype_probes(args, kwargs) -> list[Probe]:
    """Integer data of a narrow dtype (numpy uint16, as nanoGPT stores tokens; int32) given as int64."""
    narrow = [
        v
        for v in (*args, *kwargs.values())
        if (isinstance(v, torch.Tensor) and not v.is_floating_point() and v.dtype not in (torch.int64, torch.bool))
        or (
            type(v).__module__ == "numpy"
            and getattr(v, "dtype", None) is not None
            and v.dtype.kind in "iu"
            and v.dtype.itemsize < 8
        )  # fmt: skip
    ]
    if not narrow:
        return []
    kinds = sorted({str(v.dtype).removeprefix("torch.") for v in narrow})

    def widen(v):
        if any(v is n for n in narrow):
            return v.long() if isinstance(v, torch.Tensor) else v.astype("int64")
        return v

    new_args, new_kwargs = tuple(widen(a) for a in args), {k: widen(v) for k, v in kwargs.items()}
    return [Probe(f"integer data of dtype {', '.join(kinds)}", "the same values as int64", new_args, new_kwargs)]


def _int32_probes(name, args, kwargs) -> list[Probe]:
    """int64 integer tensors (ids, positions: the protocol's integer dtype) given as the same values in int32: code
    written for a 32-bit index type (ggml's I32 positions, an int32 table) raises on torch's default int64."""
    wide = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dtype == torch.int64]
    if not wide or any(v.numel() and int(v.abs().max()) >= 2**31 for v in wide):
        return []
    narrowed = _map(args, kwargs, lambda t: t.int() if any(t is w for w in wide) else t)
    note = "; the protocol's ids and positions are int64 (torch's default integer dtype)"
    return [Probe("int64 integer tensors", "the same values as int32", *narrowed, note)]


def _bool_mask_probes(name, args, kwargs) -> list[Probe]:
    """A bool ``attention_mask`` given as the same 0/1 values in int64, and an integer one as bool: the protocol takes
    any integer or bool dtype (amendment 23); arithmetic such as a subtraction raises on bool tensors, and a
    ``masked_fill`` or ``~`` needs a bool one."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.is_floating_point():
        return []
    note = "; the protocol takes a mask of any integer or bool dtype (amendment 23)"
    if mask.dtype == torch.bool:
        as_int = {**kwargs, "attention_mask": mask.long()}
        return [Probe("a bool attention_mask", "the same 0/1 values as int64", args, as_int, note)]
    kind = str(mask.dtype).removeprefix("torch.")
    as_bool = {**kwargs, "attention_mask": mask.bool()}
    return [Probe(f"an {kind} attention_mask", "the same 0/1 values as bool", args, as_bool, note)]


def _numpy_probes(args, kwargs) -> list[Probe]:
    """A numpy array argument (token data, amendment 29) given as a torch tensor of the same values: code that
    slices it and calls torch on the slices (``torch.stack``) raises for numpy data only."""
    arrays = [v for v in (*args, *kwargs.values()) if type(v).__module__ == "numpy" and hasattr(v, "dtype")]
    if not arrays or any(v.dtype.kind not in "iub" for v in arrays):
        return []
    native = ("int64", "int32", "int16", "uint8", "bool")  # dtypes torch computes with, kept as they are

    def tensor(v):
        if any(v is a for a in arrays):
            return torch.as_tensor(v if str(v.dtype) in native else v.astype("int64"))
        return v

    changed = any(str(v.dtype) not in native for v in arrays)
    working = "the same values as a torch tensor" + (" (int64)" if changed else "")
    new_args, new_kwargs = tuple(tensor(a) for a in args), {k: tensor(v) for k, v in kwargs.items()}
    kinds = ", ".join(sorted({str(v.dtype) for v in arrays}))
    return [Probe(f"data given as a numpy array ({kinds})", working, new_args, new_kwargs)]


TOKEN_DATA = ("get_batch", "train", "evaluate")  # names whose ``data`` may be a numpy array or a tensor (amendment 29)


def _tensor_data_probes(name, args, kwargs) -> list[Probe]:
    """Token data given as a 1-D integer torch tensor, given as a numpy array of the same values: code written for
    nanoGPT's numpy tokens (``data.astype``, ``np.random``'s indexing) raises on a tensor."""
    if name not in TOKEN_DATA:
        return []
    wheres, values = [*range(len(args)), *kwargs], [*args, *kwargs.values()]
    for label, where, value in zip(argument_keys(name, args, kwargs), wheres, values, strict=True):
        if label == "data" and isinstance(value, torch.Tensor) and value.ndim == 1 and not value.is_floating_point():
            kind = str(value.dtype).removeprefix("torch.")
            array = value.detach().cpu().numpy()
            return [Probe(f"data given as a torch tensor ({kind})", "the same values as a numpy array",
                          *_with(args, kwargs, where, array), "; the protocol allows either")]  # fmt: skip
    return []


def _gqa_probes(args, kwargs) -> list[Probe]:
    """Per-head q, k, v with fewer key/value heads than query heads (GQA) given with k and v repeated to the
    query heads (repeat_interleave, the protocol's GQA mapping)."""
    floats = [t for t in args[:3] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if len(floats) < 3:
        return []
    q, k, v = floats
    if q.ndim < 3 or k.shape != v.shape or k.ndim != q.ndim or q.shape[-1] != k.shape[-1]:
        return []
    hq, hkv = q.shape[-3], k.shape[-3]
    if hkv >= hq or hq % hkv:
        return []
    full = (q, k.repeat_interleave(hq // hkv, dim=-3), v.repeat_interleave(hq // hkv, dim=-3))
    return [
        Probe(
            f"k and v with {hkv} heads beside {hq} query heads (GQA)",
            f"k and v repeated to {hq} heads",
            (*full, *args[3:]),
            kwargs,
            "; the protocol's attention shares each kv head among its group of query heads",
        )
    ]


def _gqa_state_dict_probes(args, kwargs) -> list[Probe]:
    """A config with fewer key/value heads than query heads (GQA) and its canonical weights given as the same model
    with ``n_kv_heads = n_heads``: each ``layers.{i}.attn.wk``/``wv`` weight and bias repeated head by head (the
    protocol's GQA mapping), so the variant computes what the original does."""
    config = args[0] if args else kwargs.get("config")
    state = args[1] if len(args) > 1 else kwargs.get("state_dict")
    if not isinstance(config, dict) or not {"n_heads", "n_kv_heads"} <= set(config):
        return []
    h, h_kv = config["n_heads"], config["n_kv_heads"]
    if type(h) is not int or type(h_kv) is not int or not 0 < h_kv < h or h % h_kv:
        return []
    repeated_state = state
    if isinstance(state, dict):
        repeated_state = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key.endswith(
                ("attn.wk.weight", "attn.wv.weight", "attn.wk.bias", "attn.wv.bias")
            ):
                value = heads_repeated(value, h_kv, h)
            repeated_state[key] = value
    changed = {"config": {**config, "n_kv_heads": h}, "state_dict": repeated_state}
    new_args = tuple(changed[("config", "state_dict")[i]] if i < 2 else a for i, a in enumerate(args))
    new_kwargs = {key: changed.get(key, value) for key, value in kwargs.items()}
    working = f"n_kv_heads={h}" + (" with the key and value weights repeated to it" if state is not None else "")
    return [
        Probe(
            f"a GQA config (n_kv_heads={h_kv} beside n_heads={h})",
            working,
            new_args,
            new_kwargs,
            "; the protocol's models share each kv head among its group of query heads",
        )
    ]


def _one_kv_head_probes(name, args, kwargs) -> list[Probe]:
    """Several key/value heads shared by groups of query heads given as one kv head (MQA), everything else the
    same: per-head k and v with 1 < Hkv < Hq heads, or the ``[..., Hkv, T, d]`` input of a name that takes
    ``n_rep`` with Hkv > 1 and n_rep > 1 (a group mapping that only works for one group, or for none)."""
    note = "; the protocol's GQA maps query head h to kv head h // (Hq / Hkv) for any number of kv heads"
    names = _signature_names(name)
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    n_rep, x = values.get("n_rep"), args[0] if args else None
    if type(n_rep) is int and n_rep > 1 and isinstance(x, torch.Tensor) and x.ndim >= 3 and x.shape[-3] > 1:
        failing, working = f"{x.shape[-3]} kv heads repeated {n_rep} times", f"one kv head repeated {n_rep} times"
        return [Probe(failing, working, (x[..., :1, :, :].contiguous(), *args[1:]), kwargs, note)]
    floats = [t for t in args[:3] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if len(floats) < 3:
        return []
    q, k, v = floats
    if q.ndim < 3 or k.shape != v.shape or k.ndim != q.ndim:
        return []
    hq, hkv = q.shape[-3], k.shape[-3]
    if not 1 < hkv < hq or hq % hkv:
        return []
    one = (q, k[..., :1, :, :].contiguous(), v[..., :1, :, :].contiguous())
    failing = f"k and v with {hkv} heads beside {hq} query heads (GQA)"  # as _gqa_probes says it: one line
    return [Probe(failing, "one kv head (MQA)", (*one, *args[3:]), kwargs, note)]


def _signature_names(name: str) -> list[str]:
    """The parameter names of ``name`` in the reference's signature ([] where there is no reference: a handout)."""
    try:
        import inspect

        from ..subject.subject import reference_module

        return list(inspect.signature(getattr(reference_module(), name)).parameters)
    except Exception:  # noqa: BLE001 - no reference, or no such name
        return []


def _gqa_weight_probes(name, args, kwargs) -> list[Probe]:
    """Attention weights with fewer key/value heads than query heads (``n_kv_heads < n_heads``) given with the
    key and value weights' rows repeated head by head to ``n_heads`` (the protocol's GQA mapping), and
    ``n_kv_heads = n_heads``."""
    names = _signature_names(name)
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    if not {"wk", "wv", "n_heads", "n_kv_heads"} <= set(values):
        return []
    wk, wv, h, h_kv = values["wk"], values["wv"], values["n_heads"], values["n_kv_heads"]
    if not isinstance(wk, torch.Tensor) or type(h) is not int or type(h_kv) is not int or not 0 < h_kv < h or h % h_kv:
        return []
    changed = {"wk": heads_repeated(wk, h_kv, h), "wv": heads_repeated(wv, h_kv, h), "n_kv_heads": h}
    new_args = tuple(changed.get(n, a) for n, a in zip(names, args, strict=False)) + args[len(names) :]
    new_kwargs = {key: changed.get(key, value) for key, value in kwargs.items()}
    return [
        Probe(
            f"n_kv_heads={h_kv} beside n_heads={h} (GQA)",
            f"the key and value weights repeated to {h} heads",
            new_args,
            new_kwargs,
            "; the protocol's attention shares each kv head among its group of query heads",
        )
    ]


COUNTS_OF_THE_LAST_AXIS = ("top_k",)  # keywords that count entries of the first tensor's last axis


def _count_probes(name, args, kwargs) -> list[Probe]:
    """A count of the last axis's entries (``top_k``) above that axis's size given that size."""
    x = _primary(args, kwargs)
    if x is None or x.ndim == 0:
        return []
    size = x.shape[-1]
    return [
        Probe(
            f"{key}={value}, above the last axis's {size} entries",
            f"{key}={size}",
            args,
            {**kwargs, key: size},
            "",
            "boundary",
        )
        for key, value in kwargs.items()
        if key in COUNTS_OF_THE_LAST_AXIS and type(value) is int and value > size
    ]


def _config_probes(args, kwargs) -> list[Probe]:
    """A config (a dict with ``n_heads``) that leaves optional keys out, or sets them to None, given with the
    protocol's defaults written out (``config_defaults``: n_kv_heads = n_heads, ...): each missing key alone,
    ``n_kv_heads`` first, then all of them; the first that runs says it."""
    for key, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, dict) or "n_heads" not in value:
            continue
        defaults = config_defaults(value)
        missing = sorted((k for k in defaults if value.get(k) is None), key=lambda k: k != "n_kv_heads")
        groups = [[k] for k in missing] + ([missing] if len(missing) > 1 else [])
        probes = []
        for group in groups:
            written = {**value, **{k: defaults[k] for k in group}}
            shown = ", ".join(f"{k}={defaults[k]!r}" for k in group)
            new_args, new_kwargs = _with(args, kwargs, key, written)
            probes.append(
                Probe(
                    "a config that leaves optional keys out",
                    f"{shown} written out",
                    new_args,
                    new_kwargs,
                    "; an omitted config key takes the protocol's default",
                )
            )
        return probes
    return []


# a rope_scaling dict's original length (YaRN, llama3, dynamic) tried longer: values derived from it (YaRN's correction
# range from beta_fast and beta_slow) leave their range at a short length
SCALING_LENGTHS = (4, 16, 64)


def _scaling_length_probes(args, kwargs) -> list[Probe]:
    """A rope_scaling dict (rope's ``scaling``, or a config's ``rope_scaling``) given with its
    ``original_max_position_embeddings`` longer (``SCALING_LENGTHS`` times), each length one value of a group: code
    that asserts what it derives from that length (YaRN's correction range inside ``(0, d_head/2 - 1)``, where Hugging
    Face clamps it) raises at a short original length and runs at a long one."""
    key_name = "original_max_position_embeddings"
    for key, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, dict):
            continue
        scaling, nested = (value.get("rope_scaling"), True) if "n_heads" in value else (value, False)
        if not isinstance(scaling, dict) or type(scaling.get(key_name)) is not int or scaling[key_name] < 1:
            continue
        length, kind = scaling[key_name], scaling.get("rope_type", scaling.get("type"))
        note = (
            "; a short original length is allowed: what is derived from it (YaRN's correction range from beta_fast "
            "and beta_slow) is clamped to the rotary pairs, never asserted in range"
            if kind == "yarn"
            else "; a short original length is allowed"
        )
        probes = []
        for times in SCALING_LENGTHS:
            longer = {**scaling, key_name: length * times}
            new_value = {**value, "rope_scaling": longer} if nested else longer
            probes.append(Probe(f"rope_scaling with {key_name}={length}", f"{key_name}={length * times}",
                                *_with(args, kwargs, key, new_value), note, "crash",
                                group=("original length", length * times, length)))  # fmt: skip
        return probes
    return []


def _option_probes(args, kwargs) -> list[Probe]:
    """A config that sets protocol v2 options: an int option (``sliding_window``) given one smaller, and where it is
    the context length or more, one below the context length, each said as a limit only where one larger raises
    too; then each option at its default, the weights it adds left out of a state dict among the arguments
    (``V2_OPTION_WEIGHTS``; of v1's options, an untied head tied: ``V1_OPTIONS``): code that rejects a window as
    wide as the context, or builds a q/k norm of the wrong width, raises for the option and runs without it."""
    configs = [(k, v) for k, v in [*enumerate(args), *kwargs.items()] if isinstance(v, dict) and "n_heads" in v]
    if len(configs) != 1:
        return []
    key, config = configs[0]
    probes = []
    for option, default, dropped in options_set(config, kept=V2_OPTIONS_KEPT, v1=True):
        value = config[option]
        if type(value) is int and value > 1:
            probes += _limit_probes(args, kwargs, key, config, option)
        new_args, new_kwargs = _with(args, kwargs, key, option_off(config, option, default))
        for where, value_given in [*enumerate(new_args), *new_kwargs.items()]:
            if dropped and _is_state_dict(value_given):
                new_args, new_kwargs = _with(new_args, new_kwargs, where, without(dropped)(value_given))
        working = f"the same config with {option}={default!r}" + (" (its weights left out)" if dropped else "")
        note = f"; so look at how {option} is validated, built and applied"
        probes.append(Probe(f"a config with {option}={value!r}", working, new_args, new_kwargs, note))
    return probes


def _is_state_dict(value) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(w, torch.Tensor) for w in value.values())


def _limit_probes(args, kwargs, key, config, option) -> list[Probe]:
    """An int option given one smaller, and one below the context length where it is that or more; a limit only
    where one larger raises too (the control)."""
    value, context = config[option], config.get("context_length")

    def at(n):
        return _with(args, kwargs, key, {**config, option: n})

    tries = [(value - 1, "")]
    if type(context) is int and 1 < context <= value - 1:
        tries.append((context - 1, f" (below context_length={context})"))
    note = f" (and {option}={value + 1} raises too); the protocol allows any {option} >= 1"
    return [
        Probe(f"a config with {option}={value}", f"{option}={n}{said}", *at(n), note, code="boundary",
              controls=((*at(value + 1), False),))
        for n, said in tries
    ]  # fmt: skip


def _written_default_probes(args, kwargs) -> list[Probe]:
    """A config that writes protocol v2 keys at their defaults (``"sliding_window": None``) given without them:
    code that asks whether a key is present reads a written default as set (amendment 31)."""
    for key, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, dict) or "n_heads" not in value:
            continue
        written = [k for k, (_, default, _) in V2_CONFIG_DEFAULTS.items() if k in value and value[k] == default]
        written = [k for k in written if type(value[k]) is type(V2_CONFIG_DEFAULTS[k][1])]  # 0 is no False
        if not written:
            return []
        shown = ", ".join(f"{k}={value[k]!r}" for k in written)
        new_args, new_kwargs = _with(args, kwargs, key, {k: v for k, v in value.items() if k not in written})
        return [Probe(f"a config that writes {shown} (the default)", "the same config without", new_args, new_kwargs,
                      "; a key written at its default means what leaving it out means (amendment 31)")]  # fmt: skip
    return []


def _d_ff_probes(args, kwargs) -> list[Probe]:
    """A config whose ``d_ff`` is not ``4 * d_model`` given with ``d_ff = 4 * d_model``, the state dict's MLP weights
    cut or padded with zeros along their ``d_ff`` axis to it: code that fixes the MLP's width (GPT-2's 4x) raises on
    any other (capability ``free_d_ff``)."""
    configs = [(k, v) for k, v in [*enumerate(args), *kwargs.items()] if isinstance(v, dict) and "n_heads" in v]
    if len(configs) != 1:
        return []
    key, config = configs[0]
    d, d_ff = config.get("d_model"), config.get("d_ff")
    if type(d) is not int or type(d_ff) is not int or d_ff == 4 * d or d_ff in (d, config.get("vocab_size")):
        return []
    wide = 4 * d

    def resized(name, t, width):
        if ".mlp." not in name or not isinstance(t, torch.Tensor):
            return t
        for axis in range(t.ndim):
            if t.shape[axis] == d_ff:
                kept = t.narrow(axis, 0, min(d_ff, width))
                pad = [*t.shape[:axis], width - kept.shape[axis], *t.shape[axis + 1 :]]
                t = torch.cat([kept, kept.new_zeros(pad)], dim=axis) if width > d_ff else kept
        return t

    def with_width(width):
        new_args, new_kwargs = _with(args, kwargs, key, {**config, "d_ff": width})
        for where, value in [*enumerate(new_args), *new_kwargs.items()]:
            if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
                weights = {n: resized(n, t, width) for n, t in value.items()}
                new_args, new_kwargs = _with(new_args, new_kwargs, where, weights)
        return new_args, new_kwargs

    failing = f"a config with d_ff={d_ff} (not 4 × d_model = {wide})"
    working = f"d_ff={wide} (the MLP weights cut or padded with zeros to it)"
    note = "; a declared free_d_ff means the config's d_ff is honoured"
    # another width resized alike must raise: the width, not the weights' new values (zeros), is what runs
    return [Probe(failing, working, *with_width(wide), note, controls=((*with_width(wide + 2), False),))]


def _head_size_probes(args, kwargs) -> list[Probe]:
    """A gpt2 config (MHA) whose head size ``d_model / n_heads`` is odd given with the nearest head count that makes
    it even, every weight's shape unchanged; said only where another head count with an odd head size raises too (a
    control: the parity, not the count). Only RoPE needs an even head size, and gpt2 has none."""
    for key, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, dict) or value.get("family") != "gpt2":
            continue
        d, h = value.get("d_model"), value.get("n_heads")
        if type(d) is not int or type(h) is not int or value.get("n_kv_heads") not in (None, h) or h < 1 or d % h:
            return []
        even = [n for n in range(1, d + 1) if d % n == 0 and (d // n) % 2 == 0]
        odd = [n for n in range(1, d + 1) if d % n == 0 and (d // n) % 2 and n != h]
        if (d // h) % 2 == 0 or not even or not odd:
            return []

        def with_heads(n, key=key, value=value):
            heads = {"n_heads": n, **({"n_kv_heads": n} if "n_kv_heads" in value else {})}
            return _with(args, kwargs, key, {**value, **heads})

        near = min(even, key=lambda n: (abs(n - h), n))
        new_args, new_kwargs = with_heads(near)
        failing = f"a gpt2 config with an odd head size (d_model={d} / n_heads={h} = {d // h})"
        working = f"n_heads={near} (head size {d // near}; every weight's shape the same)"
        note = "; only RoPE needs an even head size, and gpt2 has none"
        return [Probe(failing, working, new_args, new_kwargs, note, controls=((*with_heads(odd[0]), False),))]
    return []


def _config_head_size_probes(args, kwargs) -> list[Probe]:
    """A fallback for a call given a config (build_model): the same width split over another number of heads, the
    query heads per kv head kept, so every weight keeps its shape (``wq`` ``[d_model, d_model]``, ``wk``
    ``[d_model / n_rep, d_model]``); each other head size (even for llama: RoPE needs it) tried as one group, the
    sizes that run said with those that raise (``_grouped``): a head size the code cannot take (a rotary width of half
    a head that must be even, a view to a fixed size) runs at other sizes."""
    configs = [(k, v) for k, v in [*enumerate(args), *kwargs.items()] if isinstance(v, dict) and "n_heads" in v]
    if len(configs) != 1:
        return []
    key, config = configs[0]
    d, h = config.get("d_model"), config.get("n_heads")
    kv = config.get("n_kv_heads") or h
    if type(d) is not int or type(h) is not int or type(kv) is not int or "head_dim" in config or config.get("qk_norm"):
        return []
    if h < 1 or kv < 1 or d % h or h % kv:
        return []
    rep, llama = h // kv, config.get("family", "llama") == "llama"
    probes = []
    for n in range(rep, d + 1, rep):
        size = d // n if d % n == 0 else 0
        if n == h or not size or (llama and size % 2):
            continue
        heads = {"n_heads": n, **({"n_kv_heads": n // rep} if "n_kv_heads" in config else {})}
        probes.append(Probe(f"a head size of {d // h} (d_model={d} / n_heads={h})", f"a head size of {size}",
                            *_with(args, kwargs, key, {**config, **heads}), "; every weight's shape the same",
                            "crash_head_size", group=("head size", size, d // h)))  # fmt: skip
    return probes


def _odd_size_probes(args, kwargs) -> list[Probe]:
    """Each odd integer size among the positional arguments (an odd ``d_model``) given as the next even one; the
    next odd one must raise as well and the even ones after it, before it and at twice it run (controls), or oddness
    is not what it raises on (held out: an evaluate whose short last window crashes only beside a full one in its
    batch raised for context lengths 7 and 9 and ran for 6, 8 and 10, and raised for 14)."""
    return [
        Probe(
            f"an odd size {value} (argument {i + 1})",
            f"{value + 1}",
            *_with(args, kwargs, i, value + 1),
            controls=(
                (*_with(args, kwargs, i, value + 2), False),
                (*_with(args, kwargs, i, value + 3), True),
                (*_with(args, kwargs, i, value - 1), True),
                (*_with(args, kwargs, i, 2 * value), True),
            ),
        )
        for i, value in enumerate(args)
        if type(value) is int and value >= 3 and value % 2
    ]


def argument_keys(name, args, kwargs) -> list[str]:
    """Each argument's label: positional ones named by the reference's signature where it can be read (else
    "argument N"), keyword ones by their keyword."""
    names = _signature_names(name)
    return [*(names[i] if i < len(names) else f"argument {i + 1}" for i in range(len(args))), *kwargs]


def _labelled_ints(name, args, kwargs):
    """``(label, where, value)`` for each plain int argument (``where``: its position or keyword)."""
    wheres, values = [*range(len(args)), *kwargs], [*args, *kwargs.values()]
    for label, where, value in zip(argument_keys(name, args, kwargs), wheres, values, strict=True):
        if type(value) is int:
            yield label, where, value


AXES = ("dim", "axis")


def _count_size_probes(name, args, kwargs) -> list[Probe]:
    """An integer count of 0 given as 1, of 1 (a batch of one, one step) as 2, and a small count (2 to 9: a few steps)
    given ten times larger: a size-1 axis squeezed away, or an interval ``count // 10`` that is 0. Never ten
    times a count of an axis's entries (``top_k``): past the axis's size it turns the filter off, so anything
    in the filter would "run"."""
    probes = []
    for label, where, value in _labelled_ints(name, args, kwargs):
        if label in AXES:  # which axis, not how many: another axis is another computation
            continue
        # a count too small: one more than the larger count runs as well (where it raises, a parity is the trigger)
        if value == 0:  # none at all (zero new tokens, zero steps): an empty loop or a check that says <= 0
            controls = ((*_with(args, kwargs, where, 2), True),)
            probes.append(
                Probe(f"{label}=0", f"{label}=1", *_with(args, kwargs, where, 1), "", "boundary", controls=controls)
            )
        elif value == 1:
            controls = ((*_with(args, kwargs, where, 3), True),)
            probes.append(
                Probe(f"{label}=1", f"{label}=2", *_with(args, kwargs, where, 2), "", "boundary", controls=controls)
            )
        elif 2 <= value <= 9 and label not in COUNTS_OF_THE_LAST_AXIS:  # top_k >= V turns its filter off
            more = value * 10
            variant = _with(args, kwargs, where, more)
            controls = ((*_with(args, kwargs, where, more + 1), True),)
            probes.append(Probe(f"{label}={value}", f"{label}={more}", *variant, "", "boundary", controls=controls))
    return probes


def _rows_alone_probes(name, args, kwargs) -> list[Probe]:
    """A first tensor of several rows (``[N, ...]``, N <= 8, of a name with any leading dims, or ``[B, T]`` token ids
    of any name) given as its first row alone, every tensor sharing its N rows alike; each other row alone must run
    too (controls), so no row's values are what it raises on: a batch of rows is the trigger (a per-row threshold
    that does not broadcast against its rows, a batch of one assumed)."""
    x = _primary(args, kwargs)
    ids = x is not None and x.ndim == 2 and not (x.is_floating_point() or x.dtype == torch.bool)  # [B, T] token ids
    if x is None or x.ndim < 2 or not 2 <= x.shape[0] <= 8 or (name not in ANY_LEADING and not ids):
        return []
    n = x.shape[0]

    def row(i):
        return _map(args, kwargs, lambda t: t[i : i + 1] if t.ndim >= 1 and t.shape[0] == n else t)

    controls = tuple((*row(i), True) for i in range(1, n))
    return [Probe(f"{n} rows ({x.ndim}-D input)", "each row alone ([1, ...])", *row(0), "", "boundary",
                  controls=controls)]  # fmt: skip


def _negative_id_probes(name, args, kwargs) -> list[Probe]:
    """An integer tensor holding negative entries (targets marked ignore_index, -100 by default) given with those
    entries set to 0: an index taken before the ignored targets are masked out."""
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    for key, value in zip(keys, values, strict=True):
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool:
            negative = sorted({int(v) for v in value[value < 0].unique()})
            if negative:
                variant = _map(args, kwargs, lambda t, v=value: t.clamp(min=0) if t is v else t)
                shown = ", ".join(map(str, negative[:3]))
                note = "; the protocol marks ignored targets with ignore_index"
                return [Probe(f"{key} holding {shown}", "those entries set to 0", *variant, note)]
    return []


def _zero_id_probes(name, args, kwargs) -> list[Probe]:
    """A ``[B, T]`` id input holding token 0 after another token given with every 0 replaced by 1, said only where a 2
    replacing it runs too: code that takes id 0 for padding (a mask inferred from a pad id) raises on a real token 0
    inside a sequence."""
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    for key, value in zip(keys, values, strict=True):
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
            continue
        if value.ndim != 2 or value.shape[1] < 2 or not bool((value[:, 1:] == 0).any()) or int(value.max()) < 2:
            continue
        one = _map(args, kwargs, lambda t, v=value: t.masked_fill(t == 0, 1) if t is v else t)
        two = _map(args, kwargs, lambda t, v=value: t.masked_fill(t == 0, 2) if t is v else t)
        note = "; token 0 is a token like any other (the protocol pads with an attention_mask, never with an id)"
        return [Probe(f"{key} holding token id 0 inside a sequence", "every 0 replaced by 1", *one, note,
                      controls=((*two, True),))]  # fmt: skip
    return []


def _top_id_probes(name, args, kwargs) -> list[Probe]:
    """A ``[B, T]`` id input given with every copy of its largest id M replaced by M - 1, said only where M - 2 in its
    place runs too: a vocabulary check off by one at the top (``>= vocab_size - 1`` where ``> vocab_size - 1``
    belongs) rejects the last id, where M is vocab_size - 1."""
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    for key, value in zip(keys, values, strict=True):
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
            continue
        if value.ndim != 2 or value.numel() < 2 or int(value.max()) < 3:
            continue
        top = int(value.max())
        lower = _map(args, kwargs, lambda t, v=value, m=top: t.masked_fill(t == m, m - 1) if t is v else t)
        lower2 = _map(args, kwargs, lambda t, v=value, m=top: t.masked_fill(t == m, m - 2) if t is v else t)
        note = (
            "; ids are in [0, vocab_size): where this is vocab_size - 1, look for a check or a table one short at the "
            "top (>= where > belongs, an embedding of vocab_size - 1 rows)"
        )
        return [Probe(f"{key} holding id {top} (its largest)", f"every {top} replaced by {top - 1}", *lower, note,
                      controls=((*lower2, True),))]  # fmt: skip
    return []


def _odd_batch_probes(args, kwargs) -> list[Probe]:
    """A ``[B, T]`` id input with an odd number of rows B given one more row (a copy of its first), every tensor
    sharing its B rows alike: a batch of one squeezed away (B = 1), a batch split in two equal halves, or pairs of
    rows (B >= 3). A 1-D float first argument (one row of logits) given as two rows, where one row with a leading dim
    added raises too (the control): a sampled ``[1]`` squeezed to a 0-d tensor raises on either."""
    first = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if first is not None and first.ndim == 1 and first.is_floating_point() and first.numel() > 1:
        two = (torch.stack([first, first]), *args[1:])
        note = " (one row with a leading dim added raises too: the single row, not the rank)"
        return [Probe("a single row (1-D input)", "2 rows (the row repeated)", two, dict(kwargs), note, "boundary",
                      controls=(((first[None], *args[1:]), dict(kwargs), False),))]  # fmt: skip
    ids = next((a for a in args if isinstance(a, torch.Tensor) and a.ndim == 2 and not a.is_floating_point()), None)
    if ids is None or ids.dtype == torch.bool or ids.shape[0] % 2 == 0:
        return []
    b = ids.shape[0]

    def grow(t):
        if isinstance(t, torch.Tensor) and t.ndim >= 1 and t.shape[0] == b:
            return torch.cat([t, t[:1]]).contiguous()
        return t

    new_args, new_kwargs = _map(args, kwargs, grow)
    if b == 1:
        return [Probe("a batch of one row", "2 rows (the row repeated)", new_args, new_kwargs, "", "boundary")]
    return [Probe(f"a batch of {b} rows (odd)", f"{b + 1} rows", new_args, new_kwargs, "", "boundary")]


def _batch_row_probes(args, kwargs) -> list[Probe]:
    """A float first argument of B >= 2 rows with a batch axis before time (``[B, T, d]``, ``[B, H, T, d]``) given as
    its first row alone, every input sharing its B rows alike (integer and bool tensors, and floats of 3-D or more:
    never a 2-D weight). Controls: the second row alone runs too, and, with B >= 3, the first two rows raise, so what
    it raises on is the number of rows, not one row's values."""
    first = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if first is None or not first.is_floating_point() or first.ndim < 3 or first.shape[0] < 2:
        return []
    b = first.shape[0]

    def rows(part: slice):
        def cut(t):
            batched = t.ndim >= 3 or not t.is_floating_point()
            return t[part] if batched and t.ndim >= 1 and t.shape[0] == b else t

        return _map(args, kwargs, cut)

    controls = ((*rows(slice(1, 2)), True), *(((*rows(slice(0, 2)), False),) if b >= 3 else ()))
    return [Probe(f"a batch of {b} rows", "one row alone (row 0; row 1 alone runs as well)", *rows(slice(0, 1)), "",
                  "boundary", controls=controls)]  # fmt: skip


def _key_length_probes(args, kwargs) -> list[Probe]:
    """Per-head q ``[..., Tq, d]`` beside k and v of more positions ``[..., Tk, d]`` (a chunk after a cached
    prefix) given k and v cut to their last Tq positions, a mask's key axis alike: as many keys as queries."""
    floats = [t for t in args[:3] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if len(floats) < 3:
        return []
    q, k, v = floats
    if q.ndim < 2 or k.ndim != q.ndim or k.shape[-2:] != v.shape[-2:] or k.shape[-2] <= q.shape[-2]:
        return []
    tq, tk = q.shape[-2], k.shape[-2]

    def crop(t):
        if isinstance(t, torch.Tensor) and t.ndim >= 2 and t.shape[-1] == tk and t is not q and t.shape[-2] in (1, tq):
            return t[..., tk - tq :].contiguous()  # a mask [..., Tq, Tk]
        return t

    new_args = (q, k[..., tk - tq :, :].contiguous(), v[..., tk - tq :, :].contiguous(), *(crop(a) for a in args[3:]))
    new_kwargs = {key: crop(value) for key, value in kwargs.items()}
    failing = f"{tk} keys beside {tq} queries"
    return [Probe(failing, f"as many keys as queries ({tq})", new_args, new_kwargs, "", "boundary")]


def _dtype_argument_probes(args, kwargs) -> list[Probe]:
    """A ``torch.dtype`` argument other than float32 (``torch.bfloat16``) given as float32."""
    for key, value in [*enumerate(args), *kwargs.items()]:
        if isinstance(value, torch.dtype) and value != torch.float32:
            shown = str(value).removeprefix("torch.")
            return [Probe(f"dtype {shown}", "float32", *_with(args, kwargs, key, torch.float32))]
    return []


def _broadcast_probes(args, kwargs) -> list[Probe]:
    """Integer positions against a [..., T, d] input: 1-D ``[T]`` given in full (``x.shape[:-1]``), and positions
    of a fuller shape given as one row ``[T]``; 1-D positions also as one row ``[1, T]`` (code that takes only 2-D
    positions, Hugging Face's position_ids). All are the protocol's."""
    floats = [t for t in _tensors(args, kwargs) if t.is_floating_point()]
    if not floats or floats[0].ndim < 3:
        return []
    x = floats[0]
    note = "; the protocol's positions broadcast against the leading dims"
    for key, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
            continue
        if value.ndim == 0 or value.shape[-1] != x.shape[-2]:
            continue
        if value.ndim == 1:
            other, failing, working = value.expand(*x.shape[:-1]).contiguous(), "1-D", "of the full shape"
        else:
            other, failing, working = value.reshape(-1, value.shape[-1])[0].contiguous(), f"{value.ndim}-D", "1-D"
        failing = f"{failing} positions {_shape(value)} with a {_shape(x)} input"
        probes = [Probe(failing, f"positions {working} {_shape(other)}", *_with(args, kwargs, key, other), note)]
        if value.ndim == 1:  # code written for 2-D positions (Hugging Face's position_ids [B, T])
            row = value[None].contiguous()
            working = f"2-D positions {_shape(row)} (the same row with a leading axis)"
            probes.append(Probe(failing, working, *_with(args, kwargs, key, row), note))
        return probes
    return []


def _mask_probes(args, kwargs) -> list[Probe]:
    """A boolean mask with leading dims (``[B, 1, Tq, Tk]``, broadcastable against the scores) that holds the same
    ``[Tq, Tk]`` matrix in every leading slice given as that matrix: the same mask, two dims only. A mask that
    broadcasts against the scores ``[..., Hq, Tq, Tk]`` (of the first two float tensors, q and k) given expanded to
    their full shape: the same entries, no axis left to broadcast."""
    floats = [t for t in _tensors(args, kwargs) if t.is_floating_point()]
    note = "; the protocol's masks broadcast against the scores [..., Hq, Tq, Tk]"
    for key, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.ndim < 2:
            continue
        probes = []
        if len(floats) >= 2 and floats[0].ndim >= 3:
            try:
                full = torch.broadcast_shapes(value.shape, (*floats[0].shape[:-1], floats[1].shape[-2]))
            except RuntimeError:
                full = value.shape
            if full != value.shape:
                expanded = value.expand(full).contiguous()
                failing = f"a mask {_shape(value)} broadcast against the scores {_shape(expanded)}"
                working = f"the same mask expanded to {_shape(expanded)}"
                probes.append(Probe(failing, working, *_with(args, kwargs, key, expanded), note))
        flat = value.reshape(-1, *value.shape[-2:])
        if value.ndim >= 3 and bool((flat == flat[:1]).all()):
            matrix = flat[0].contiguous()
            failing, working = f"a {value.ndim}-D mask {_shape(value)}", f"the same mask as {_shape(matrix)}"
            probes.append(Probe(failing, working, *_with(args, kwargs, key, matrix), note))
        return probes
    return []


FAR_POSITION = 2048  # positions from here on are "far": past a table built for a typical context length


def _far_position_probes(name, args, kwargs) -> list[Probe]:
    """Integer ``positions`` reaching ``FAR_POSITION`` or further given as the same positions taken modulo 1024
    (same shape, dtype and pattern): a table of cos/sin (or of anything per position) built for a fixed number of
    positions runs out past it."""
    names = _signature_names(name)
    where = next((i for i, n in enumerate(names[: len(args)]) if n == "positions"), "positions")
    value = args[where] if isinstance(where, int) else kwargs.get("positions")
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
        return []
    if value.numel() == 0 or int(value.max()) < FAR_POSITION:
        return []
    failing = f"positions up to {int(value.max())}"
    note = "; the protocol defines positions without an upper bound"
    variant = _with(args, kwargs, where, value % 1024)
    return [Probe(failing, "the same positions modulo 1024", *variant, note, "boundary", exclusive=True)]


def _positions_past_the_length_probes(name, args, kwargs) -> list[Probe]:
    """Integer ``positions`` at or past the number of tokens T (x's axis -2) given as the same pattern within
    ``[0, T)`` (shifted down where its span fits, else taken modulo T): a table of cos/sin cut to the sequence length
    (``cos[:T]``) before it is indexed by position runs out there."""
    names = _signature_names(name)
    where = next((i for i, n in enumerate(names[: len(args)]) if n == "positions"), "positions")
    value = args[where] if isinstance(where, int) else kwargs.get("positions")
    x = _primary(args, kwargs)
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype == torch.bool:
        return []
    if x is None or x.ndim < 2 or not x.is_floating_point() or value.numel() == 0:
        return []
    t, low, high = x.shape[-2], int(value.min()), int(value.max())
    if high < t or high >= FAR_POSITION:
        return []
    within = value - low if high - low < t else value % t
    failing = f"positions up to {high} with {t} tokens"
    working = f"the same positions moved below {t} (max {int(within.max())})"
    note = "; positions are not bounded by the number of tokens (a table indexed by position must cover them)"
    # only the values change: where it runs, a shape variant that also runs (a rank that moves T) is no evidence
    return [Probe(failing, working, *_with(args, kwargs, where, within), note, "boundary", exclusive=True)]


def _feature_size_probes(name, args, kwargs) -> list[Probe]:
    """A fallback: the first float tensor argument's last (feature) axis at each other size of ``HEAD_SIZES``,
    on every float tensor whose last axis has that size alike (entries repeated, then cut): a head size written
    into the code (a view to 64, a rotation of 4 channels) runs at that size alone, a least width from it up."""
    x = _primary(args, kwargs)
    if x is None or x.ndim < 2 or not x.is_floating_point():
        return []
    d = x.shape[-1]

    def resized(t, size):
        if not t.is_floating_point() or t.ndim == 0 or t.shape[-1] != d:
            return t
        return t.repeat_interleave(-(-size // d), dim=-1).narrow(-1, 0, size).contiguous()

    probes = []
    for s in HEAD_SIZES:
        if s != d:
            variant = _map(args, kwargs, lambda t, s=s: resized(t, s))
            probes.append(Probe(f"a last-axis size of {d}", f"a last-axis size of {s}", *variant, "", "boundary",
                                group=("last-axis size", s, d)))  # fmt: skip
    return probes


def _axis_size_probes(name, args, kwargs) -> list[Probe]:
    """A fallback when no property above explains a crash: each size n of the first tensor argument's leading axes
    (its last, the feature size, stays) changed on every tensor axis of that size alike. First grown to the next
    power of two with every entry kept (repeated): a crash that depends on the values (a NaN row) still raises, so a
    variant that runs names the size (a tile, an axis squeezed away). Then cut, keeping a prefix (to the power of
    two below n and to half): a limit; only a clue, since what was cut away may be what it raises on."""
    x = _primary(args, kwargs)
    if x is None or x.ndim < 2:
        return []
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    feature = x.shape[-1]
    probes = []
    for n in sorted({s for s in x.shape[:-1] if s != feature and s >= 1}, reverse=True):
        failing = f"a size of {n} ({', '.join(_axes_of_size(keys, values, n))})"
        grown = 1 << n.bit_length()  # the next power of two above n
        variant = _map(args, kwargs, _grown(n, grown))
        probes.append(Probe(failing, f"{grown} (every entry kept, repeated)", *variant, "", "boundary"))
        for m in dict.fromkeys((1 << (n - 1).bit_length() - 1, n // 2)) if n > 2 else ():

            def cut(t, n=n, m=m):
                for axis, size in enumerate(t.shape):
                    if size == n:
                        t = t.narrow(axis, 0, m)
                return t.contiguous()

            def tiled(t, n=n, m=m):  # n entries again, each a copy of one of the first m
                for axis, size in enumerate(t.shape):
                    if size == n:
                        t = t.index_select(axis, torch.arange(n, device=t.device) % m)
                return t

            working = f"{m} (its first {m})"
            # the first m entries, which run alone, tiled back to n: raising as well, the size is what it raises on
            control = (*_map(args, kwargs, tiled), False)
            copied = f"; {n} entries copied from those raise as well"
            # a size cut to 1 broadcasts where a wrong shape meets it (one kv head against several): a clue only
            one = dict(weak=True, clue="an axis of size 1 broadcasts where a wrong shape meets it") if m == 1 else {}
            probes.append(
                Probe(failing, working, *_map(args, kwargs, cut), copied, "boundary", controls=(control,), **one)
            )
            probes.append(
                Probe(failing, working, *_map(args, kwargs, cut), "", "boundary", weak=True,
                      clue="the entries cut away may be what it raises on")
            )  # fmt: skip
    return probes


def _tiled(data, n: int):
    """The first ``n`` entries of 1-D ``data`` (a tensor or a numpy array) with its entries repeated from the start."""
    if isinstance(data, torch.Tensor):
        return data.repeat(-(-n // data.shape[0]))[:n].contiguous()
    import numpy as np

    return np.resize(data, n).astype(data.dtype)


DEFAULT_BATCH_SIZE = 8  # evaluate's, where a call leaves it out


def _window_probes(name, args, kwargs) -> list[Probe]:
    """For a name that cuts ``data`` into the protocol's windows (``WINDOWED``: evaluate): data too short for one
    full window given a full one (every token kept, repeated); a ``batch_size`` against the number W of windows:
    larger than W (W runs and W + 1 raises) or no divisor of W (a divisor runs). A batch size below W that does not
    divide it tells the two apart (it runs where only a larger batch size raises, and raises where a divisor is
    needed); where W has none, "larger than W" is only a clue and "no divisor" is not said."""
    if name not in WINDOWED:
        return []
    keys = argument_keys(name, args, kwargs)
    values = dict(zip(keys, [*args, *kwargs.values()], strict=True))
    wheres = dict(zip(keys, [*range(len(args)), *kwargs], strict=True))
    data, ctx = values.get("data"), values.get("context_length")
    if type(ctx) is not int or ctx < 1 or len(getattr(data, "shape", ())) != 1 or "data" not in wheres:
        return []
    n, probes = int(data.shape[0]), []
    if 2 <= n <= ctx:

        def longer(m):
            return _with(args, kwargs, wheres["data"], _tiled(data, m))

        failing = f"data of {n} tokens (no full window: context_length={ctx} takes {ctx + 1})"
        probes.append(Probe(failing, f"{ctx + 1} tokens (every token kept, repeated)", *longer(ctx + 1), "",
                            "boundary", controls=((*longer(2 * ctx + 1), True),)))  # fmt: skip
        # the nearest that runs is said: where one window raises too, two (a minimum of two contexts of data)
        probes.append(Probe(failing, f"{2 * ctx + 1} tokens (two full windows; every token kept, repeated)",
                            *longer(2 * ctx + 1), "; the protocol's evaluate takes any data of 2 tokens or more",
                            "boundary", controls=((*longer(4 * ctx + 1), True),)))  # fmt: skip
    batch, windows = values.get("batch_size", DEFAULT_BATCH_SIZE), -(-(n - 1) // ctx) if n >= 2 else 0
    if type(batch) is not int or batch < 2 or windows < 1:
        return probes

    def size(b):
        return _with(args, kwargs, wheres.get("batch_size", "batch_size"), b)

    # a batch size below W that does not divide W, other than the one given
    odd = next((d for d in range(2, windows) if windows % d and d != batch), None)
    beside = f"batch_size={batch} beside {windows} window(s) of data"
    if batch > windows:
        controls = ((*size(windows + 1), False),) + (((*size(odd), True),) if odd else ())
        probes.append(Probe(f"{beside} (more rows than windows)", f"batch_size={windows}", *size(windows), "",
                            "boundary", controls=controls, weak=odd is None,
                            clue=f"a batch size of {windows} divides {windows} as well"))  # fmt: skip
    if windows % batch and odd:
        divisor = max(d for d in range(1, min(batch, windows) + 1) if windows % d == 0)
        controls = ((*size(odd), False),)
        probes.append(Probe(f"{beside} (no divisor of the number of windows)", f"batch_size={divisor}, a divisor "
                            f"of {windows} (batch_size={odd} raises as well)", *size(divisor), "", "boundary",
                            controls=controls))  # fmt: skip
    return probes


def _power_of_two_probes(name, args, kwargs) -> list[Probe]:
    """A fallback: an integer size (not an axis, not a count of the last axis's entries) that is no power of two
    given as the next one; one more than it and one more than the power raise as well (controls), so it is not
    just a larger size that runs."""
    skip = AXES + COUNTS_OF_THE_LAST_AXIS
    probes = []
    for label, where, value in _labelled_ints(name, args, kwargs):
        if label in skip or value < 3 or value & (value - 1) == 0:
            continue
        power = 1 << value.bit_length()
        if value + 1 == power:  # no size between: one that runs is just the next size
            continue
        # one more than the value and one more than the power raise: the power, not a larger size, runs
        controls = ((*_with(args, kwargs, where, value + 1), False), (*_with(args, kwargs, where, power + 1), False))
        working = f"{label}={power}, a power of two ({label}={value + 1} and {power + 1} raise as well)"
        probes.append(Probe(f"{label}={value}", working, *_with(args, kwargs, where, power), "", "boundary",
                            controls=controls))  # fmt: skip
    return probes


def _int_size_probes(name, args, kwargs) -> list[Probe]:
    """A fallback beside ``_axis_size_probes``: each integer size given as the value of a smaller integer size of the
    same call (``causal_mask(16, 13)`` as ``causal_mask(13, 13)``): a size that may not exceed another one."""
    skip = AXES + COUNTS_OF_THE_LAST_AXIS  # another axis is another computation; a smaller top_k another filter
    sizes = [(label, where, value) for label, where, value in _labelled_ints(name, args, kwargs) if label not in skip]
    probes = []
    for label, where, value in sizes:
        for other, _, smaller in sizes:
            if other != label and 1 <= smaller < value:
                variant = _with(args, kwargs, where, smaller)
                # a limit: one past the other size and one below the original raise as the original does, one
                # below the other size runs
                above = dict.fromkeys(v for v in (smaller + 1, value - 1) if smaller < v < value)
                controls = tuple((*_with(args, kwargs, where, v), False) for v in above)
                controls += ((*_with(args, kwargs, where, smaller - 1), True),) if smaller > 1 else ()
                probes.append(
                    Probe(f"{label}={value}", f"{label}={smaller} (as {other})", *variant, "", "boundary",
                          controls=controls, weak=True, clue="a smaller value may run for another reason, such as a "
                          "divisor of a length")
                )  # fmt: skip
    return probes


def _multiple_probes(name, args, kwargs) -> list[Probe]:
    """A fallback: a tensor axis (not a float tensor's last, its features) whose size is no multiple of an integer
    argument (a block size), or not one more than a multiple (token data cut into windows of ``context_length + 1``
    that share an entry), grown to the next such size, every entry kept (repeated); one more than that must raise
    (control), so the variant names a size that must fit (a partial last block or window), not any larger size."""
    skip = AXES + COUNTS_OF_THE_LAST_AXIS
    ints = [(label, value) for label, _, value in _labelled_ints(name, args, kwargs) if label not in skip]
    keys, values = argument_keys(name, args, kwargs), [*args, *kwargs.values()]
    sizes = sorted({s for t in _tensors(args, kwargs) for s in _size_axes(t) if s > 1}, reverse=True)
    probes = []
    for offset, fits in ((0, "a multiple of"), (1, "one more than a multiple of")):
        for label, block in ints:
            for n in (n for n in sizes if block >= 2 and (n - offset) % block):
                m = -(-(n - offset) // block) * block + offset
                where = _axes_of_size(keys, values, n)
                failing = f"a size of {n} ({', '.join(where)}) with {label}={block}"
                # one past it raises and the next such size runs: a size that must fit, not one that happens to
                past, next_fit = _map(args, kwargs, _grown(n, m + 1)), _map(args, kwargs, _grown(n, m + block))
                controls = ((*past, False), (*next_fit, True))
                working = f"{m}, {fits} {label} (every entry kept, repeated)"
                variant = _map(args, kwargs, _grown(n, m))
                probes.append(Probe(failing, working, *variant, "", "boundary", controls=controls))
    return probes


def _size_axes(t: torch.Tensor) -> torch.Size:
    """The sizes of ``t``'s axes that count items: all of an integer tensor's (token ids), a float tensor's but its
    last (the features)."""
    return t.shape if not (t.is_floating_point() or t.is_complex()) else t.shape[:-1]


def _axes_of_size(keys, values, n) -> list[str]:
    return [
        f"{key}'s axis {axis}"
        for key, value in zip(keys, values, strict=True)
        if isinstance(value, torch.Tensor)
        for axis, size in enumerate(value.shape)
        if size == n
    ]


def _grown(n: int, m: int) -> Callable:
    """Every axis of size ``n`` grown to ``m`` with every entry kept (repeated in place)."""

    def grow(t):
        for axis, size in enumerate(t.shape):
            if size == n:
                t = t.repeat_interleave(-(-m // n), dim=axis).narrow(axis, 0, m)
        return t.contiguous()

    return grow


def probes_for(name: str, args: tuple, kwargs: dict, ledger=None) -> list[Probe]:
    """The input variants worth trying for a call of ``name`` that raised (at most ``MAX_TRIES``); with a
    ``model_variants.Ledger``, a model among the arguments built again with one config property changed."""
    # through a cache the call's length comes before the model's variants (a block count one off at a length); else
    # after the ranks, where it was (a model's own variants first)
    cached = ledger is not None and any(id(v) in ledger.caches for v in (*args, *kwargs.values()))
    boundary = _boundary_probes(name, args, kwargs, ledger.context_length(args, kwargs) if ledger else None)
    found = (
        _layout_probes(name, args, kwargs)
        + _tie_probes(name, args, kwargs)
        + _none_probes(name, args, kwargs)
        + _given_none_probes(name, args, kwargs)
        + _speed_only_probes(name, args, kwargs)
        + _flag_probes(name, args, kwargs)
        + _int_as_float_probes(name, args, kwargs)
        + _bool_mask_probes(name, args, kwargs)
        + _int32_probes(name, args, kwargs)
        + _one_step_probes(name, args, kwargs)
        + (boundary if cached else [])
        + _gqa_probes(args, kwargs)
        + (ledger.probes(name, args, kwargs, Probe) if ledger is not None else [])
        + _gqa_weight_probes(name, args, kwargs)
        + (_gqa_state_dict_probes(args, kwargs) if name == "build_model" else [])
        + _one_kv_head_probes(name, args, kwargs)
        + _broadcast_probes(args, kwargs)
        + _mask_probes(args, kwargs)
        + _far_position_probes(name, args, kwargs)
        + _positions_past_the_length_probes(name, args, kwargs)
        + _empty_probes(name, args, kwargs)
        + _zero_float_probes(name, args, kwargs)
        + _rank_probes(name, args, kwargs)
        + _batch_row_probes(args, kwargs)
        + ([] if cached else boundary)
        + _key_length_probes(args, kwargs)
        + _odd_batch_probes(args, kwargs)
        + _negative_id_probes(name, args, kwargs)
        + _zero_id_probes(name, args, kwargs)
        + _top_id_probes(name, args, kwargs)
        + _count_probes(name, args, kwargs)
        + _window_probes(name, args, kwargs)
        + _count_size_probes(name, args, kwargs)
        + _option_probes(args, kwargs)
        + _scaling_length_probes(args, kwargs)
        + _config_probes(args, kwargs)
        + _written_default_probes(args, kwargs)
        + _d_ff_probes(args, kwargs)
        + _head_size_probes(args, kwargs)
        + _odd_size_probes(args, kwargs)
        + _dtype_argument_probes(args, kwargs)
        + _device_probes(name, args, kwargs)
        + _dtype_probes(args, kwargs)
        + _numpy_probes(args, kwargs)
        + _tensor_data_probes(name, args, kwargs)
        + _integer_dtype_probes(args, kwargs)
    )
    return found[:MAX_TRIES]


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


class _ProcessLost(Exception):
    """A variant timed out or took down the process running the code: probing stops there."""


def _on_a_fresh_model(run: Callable, p: Probe, ledger) -> bool:
    """Whether the variant runs on the model built again as well (``Ledger.rebuilt``), where it keeps the call's
    model: one that runs only on the model the failing call left behind (a mask it cached, grown by the steps run
    before it raised) shows that state, not the property changed."""
    again = ledger.rebuilt(*p.arguments()) if ledger is not None and p.make is None else None
    return again is None or _runs(run, again) is not False


def _try(probes: list[Probe], run: Callable, tried: list[Probe], working: list[Probe], ledger=None) -> None:
    """Run each probe's variant; a variant that runs goes to ``working``, one that raises to ``tried``. A variant
    that times out or takes the process down ends probing (``_ProcessLost``): in grading each one would cost a
    restart of the worker, and the restarts a submission gets are limited."""
    for p in probes:
        if not p.group and any(w.failing == p.failing and not w.weak for w in working):  # the nearest variant
            # that runs said it
            continue
        outcome = _runs(run, _on_fresh_caches(p.arguments, p.args, p.kwargs, p.make, ledger))
        if outcome is None:  # the variant could not be built: it says nothing
            continue
        if not outcome or not _on_a_fresh_model(run, p, ledger):  # the variant raises too: not the trigger
            tried.append(p)
        elif all(_runs(run, _control_arguments(c, ledger)) == c[-1] for c in p.controls):
            (variant, note) = p.contrast or ((None, None), "")
            if p.contrast and _runs(run, lambda v=variant: (_clone(v[0]), _clone(v[1]))) is False:
                p = replace(p, note=note + p.note)
            working.append(p)
        else:  # a control contradicts it: the change ran for another reason
            tried.append(p)


def _control_arguments(control: tuple, ledger=None) -> Callable:
    """A control's ``(args, kwargs)``, given as ``(args, kwargs, runs)`` or built when tried, ``(make, runs)``."""
    if len(control) == 2:
        return control[0]
    args, kwargs, _ = control
    return _on_fresh_caches(lambda: (_clone(args), _clone(kwargs)), args, kwargs, None, ledger)


def _on_fresh_caches(arguments: Callable, args: tuple, kwargs: dict, make, ledger) -> Callable:
    """``arguments``, or where the variant's own arguments hold a cache the ledger recorded, the same with that cache
    made again and filled as it was before the failing call (which may have left it half written)."""
    if ledger is None or make is not None:
        return arguments

    def fresh():
        found = ledger.fresh_caches(args, kwargs, _clone)
        return found if found is not None else arguments()

    return fresh


def _runs(run: Callable, arguments: Callable) -> bool | None:
    """Whether ``run`` returns on ``arguments()`` (``(args, kwargs)``: a variant built when tried, which may raise
    too); ``None`` where the variant's model cannot be built (``NotBuilt``: rebuilt from weights the implementation
    gives back in another shape): it was not tried. ``_ProcessLost`` where it times out or takes the process down."""
    try:
        args, kwargs = arguments()
        run(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except NotBuilt:
        return None
    except BaseException as exc:  # noqa: BLE001 - whatever the implementation raises
        if getattr(exc, "process", False) or out_of_memory(exc):
            raise _ProcessLost from None
        return False
    return True


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (the implementation's own, or the suite's ``ImplementationError`` for it) is memory running
    out: ``MemoryError``, torch's allocator failing. A variant that runs out of memory says nothing about the
    input property, and the same runaway is a raise under an address-space limit and a kill under a memory cgroup or
    the machine's OOM killer: it ends probing either way, so that the lines do not depend on the machine."""
    names = getattr(exc, "type_names", None) or tuple(k.__name__ for k in type(exc).__mro__)
    text = str(getattr(exc, "message", exc))
    return bool({"MemoryError", "OutOfMemoryError"} & set(names)) or any(t in text for t in OUT_OF_MEMORY)


OUT_OF_MEMORY = ("can't allocate memory", "CUDA out of memory", "std::bad_alloc")


def plain(value) -> bool:
    """Whether a call's argument holds only values a fresh copy of the implementation can take as they are
    (tensors, numbers, strings, dtypes), not objects the running copy made (a model, a cache)."""
    if isinstance(value, tuple | list):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(plain(v) for v in value.values())
    kinds = torch.Tensor | int | float | str | torch.dtype | torch.device | torch.Generator
    return value is None or isinstance(value, kinds)


def _state_lines(name: str, args: tuple, kwargs: dict, fresh: Callable | None) -> list[str]:
    """The cause where the call runs in a copy of the implementation loaded again (``fresh()`` gives its
    ``name``): the crash depends on what earlier calls left behind, which no variant of this one call can show
    (a variant of another dtype or size may run only because it meets state of its own)."""
    if fresh is None or not plain((args, kwargs)):
        return []
    try:
        again = fresh()
    except Exception:  # noqa: BLE001 - a copy that cannot be had shows nothing
        return []
    if again is None or _runs(again, lambda: (_clone(args), _clone(kwargs))) is not True:
        return []
    return [
        f"likely cause: {name} raises for this call only after earlier calls: a freshly loaded copy of your code "
        f"runs the very same call. Look for state {name} keeps between calls (a buffer, table or cache sized by "
        f"the first call, a counter); fix: size or rebuild it for each call's input (evidence: the same call "
        f"runs in a fresh copy)"
    ]


def _model_state_lines(name: str, run: Callable, args: tuple, kwargs: dict, ledger, own: bool = False) -> list[str]:
    """The cause where the call runs on the model built again from its current weights (``Ledger.rebuilt``): the
    crash depends on what earlier calls left in the model (a mask or table it caches, sized by the first call).
    Else, where it runs in a freshly loaded copy of the implementation on the same model and cache made there again
    (``_fresh_copy_lines``; only where ``own``: ``run`` calls the subject's own ``name``, as the copy's does), on
    what earlier calls left in the code's own module state."""
    again = ledger.rebuilt(args, kwargs) if ledger is not None else None
    if again is None:
        return []
    try:
        if _runs(run, again) is not True:
            carried = _carried_cache_lines(name, args, kwargs, ledger)
            return carried or (_fresh_copy_lines(name, args, kwargs, ledger) if own else [])
    except _ProcessLost:
        return []
    return [
        f"likely cause: {name} raises for this call only after earlier calls on the same model: the very same call "
        f"on the model built again from its weights runs. Look for state the model keeps between calls (a mask, "
        f"table or buffer it caches at one call and reuses, sized by that call); fix: size or rebuild it for each "
        f"call's input (evidence: the same call runs on a freshly built model with the same weights)"
    ]


def _carried_cache_lines(name: str, args: tuple, kwargs: dict, ledger) -> list[str]:
    """The cause where a cache among the call's arguments is one the test made (``new_cache``) and a new cache of
    the same model and batch size already holds keys before anything is forwarded into it, some of them those the
    call's cache holds (``model_variants.shares_a_position``: not zeros or uninitialised memory): a call through a
    cache holding what earlier caches wrote raises, and a variant that gets a cache of its own (another config,
    another batch size) runs only because of that, so no property of the call is said."""
    subject = ledger.subject
    if not subject.provides("cache_kv"):
        return []
    for value in (*args, *kwargs.values()):
        entry = ledger.caches.get(id(value))
        if entry is None:
            continue
        _, model, batch_size, _ = entry
        try:
            filled = subject.cache_kv(value, 0)[0]
            k = subject.cache_kv(subject.new_cache(model, batch_size), 0)[0]
            held = int(k.shape[-2]) if shares_a_position(k, filled) else 0
        except Exception:  # noqa: BLE001 - unreadable: nothing is said
            continue
        if held:
            return [
                f"likely cause: {name} raises through a cache that holds what earlier caches wrote: a new cache of the "
                f"same model already holds {held} positions before anything is forwarded into it, keys the call's "
                f"cache holds too (cache_kv), so new_cache hands on an earlier cache's state (a singleton or "
                f"module-level workspace reused without its length reset), and a call fills it past its room. Fix: "
                f"each new cache starts empty, with storage or a length of its own (evidence: a new cache holds those "
                f"keys)"
            ]
    return []


def _fresh_copy_lines(name: str, args: tuple, kwargs: dict, ledger) -> list[str]:
    """The cause where a freshly loaded copy of the implementation (``fresh_subject``: an in-process subject only)
    runs the call on the call's model built there from its current weights, with its cache made there and refilled
    with the same tokens, while the same rebuilt here raises: the crash depends on state the code keeps outside the
    model and cache, across calls (a module-level workspace, buffer or counter that earlier calls left behind)."""
    fresh_subject = getattr(ledger.subject, "fresh_subject", None)
    found = {id(m): m for m in map(ledger._model_of, (*args, *kwargs.values())) if m is not None}
    if fresh_subject is None or len(found) != 1:
        return []
    (model,) = found.values()
    try:
        weights = ledger.subject.canonical_state_dict(model)
        again = fresh_subject()
        if again is None:
            return []
        there = copy.copy(ledger)
        there.subject = again
        _, config, _, options = ledger.models[id(model)]
        make = there._maker(model, config, weights, dict, options, args, kwargs)
        if _runs(getattr(again, name), make) is not True:
            return []
    except Exception:  # noqa: BLE001 - a copy that cannot be had or built shows nothing
        return []
    return [
        f"likely cause: {name} raises for this call only after earlier calls, and not because of the model or "
        f"cache it is given: a freshly loaded copy of your code runs the very same call on the same weights with a "
        f"cache refilled with the same tokens, while the model and cache built again here raise. Look for state your "
        f"code keeps outside the model between calls (a module-level or singleton workspace, buffer or counter that "
        f"a new model or cache reuses); fix: give each model and cache its own state, or reset it when one is made "
        f"(evidence: the same call runs in a fresh copy)"
    ]


def probe(
    name: str, run: Callable, args: tuple, kwargs: dict, ledger=None, fresh: Callable | None = None, crash=None
) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: which input property the crash of ``run(*args, **kwargs)`` depends on.

    ``run`` calls the implementation; it is retried once per variant (``probes_for``), on copies; where no variant
    runs but a weak one, the sizes of the first tensor's axes are tried (``_axis_size_probes``). ``ledger``
    (``model_variants.Ledger``) builds a model among the arguments again with one config property changed.
    ``fresh()`` gives ``name`` of a copy of the implementation loaded again: where the same call runs there, the
    crash depends on state earlier calls left, and that is said instead of any property. ``crash``: the exception
    the call raised (a call of thousands of rows is probed on a few that raise the same: ``_few_rows``).
    """
    args, kwargs, shrunk = _few_rows(run, args, kwargs, crash)
    # a fresh copy's name stands for run only where run calls the subject's own name (``fresh`` given)
    state = _state_lines(name, args, kwargs, fresh) or _model_state_lines(
        name, run, args, kwargs, ledger, own=fresh is not None
    )
    if state:
        return state + shrunk, ["crash_state"]
    lines, codes, path_only = _probe(name, run, args, kwargs, ledger)
    if not codes:  # no variant runs: what the raising line read
        site, codes = site_lines(name, getattr(crash, "original", None) or crash)
        if codes:  # it pins the cause, and what was tried says nothing more
            lines = [line for line in lines if not line.startswith(NOTHING_RAN)]
        lines = site + lines if codes else lines + site
    elif path_only or any(text in str(crash) for text in SELF_EXPLAINING):  # only a path runs (cache=None, a flag's
        # other value), or the message says what the line did wrong: the raising line may say more than any probe
        site, site_codes = site_lines(name, getattr(crash, "original", None) or crash)
        if site_codes:
            lines, codes = site + lines, site_codes + codes
    return (lines + shrunk if lines else lines), codes


# messages that say the raising line's own mistake whatever the input: a view of a non-contiguous tensor (a smaller
# input runs only because a view of it happens to be possible)
SELF_EXPLAINING = ("view size is not compatible with input tensor's size and stride",)

MANY_ROWS, FEW_ROWS = 64, 8


def _message_shape(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, re.sub(r"\d+", "#", str(exc).split("\n")[0])


def _few_rows(run: Callable, args: tuple, kwargs: dict, crash: BaseException | None):
    """``(args, kwargs, note)``: a call whose first tensor has more than ``MANY_ROWS`` rows (4,000 copies of a prompt)
    cut to its first ``FEW_ROWS`` (every tensor of that many rows alike), where that smaller call raises the same
    exception with the same message (numbers aside), or raises at the same line of the implementation's code; each
    variant then costs a few rows, not thousands. Else the call as it is and no note."""
    x = _primary(args, kwargs)
    if crash is None or x is None or x.ndim < 2 or x.shape[0] <= MANY_ROWS:  # rows of a batch, not a token stream
        return args, kwargs, []
    n = x.shape[0]
    few = _map(args, kwargs, lambda t: t[:FEW_ROWS].contiguous() if t.ndim >= 1 and t.shape[0] == n else t)
    original = getattr(crash, "original", None) or crash
    try:
        run(*_clone(few[0]), **_clone(few[1]))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the same crash on fewer rows, or another one
        again = getattr(exc, "original", None) or exc
        same = _message_shape(again) == _message_shape(original) or own_frame(again) == own_frame(original) != ""
        if not getattr(exc, "process", False) and same:
            note = f"note: probed on the call's first {FEW_ROWS} rows of {n}, which raise at the same place"
            return *few, [note]
    return args, kwargs, []


def _common_multiple(runs: list[int], raises: list[int]) -> int | None:
    """The largest of 4, 8, 16, 32, 64 that divides every size that runs and no size that raises, given at least
    two of each kind of size; None otherwise."""
    if len(runs) < 2 or not raises:
        return None
    return next((m for m in (64, 32, 16, 8, 4) if all(r % m == 0 for r in runs) and all(r % m for r in raises)), None)


def _grouped(working: list[Probe], tried: list[Probe], kwargs: dict | None = None) -> list[Probe]:
    """``working`` with the probes of one group (several head sizes) said as one: the values that run, those tried
    that raise, and what the pattern points at (one value alone: that value written into the code; every value from
    some size up: a least size assumed, or, where a whole-number keyword of the call lies between the sizes that raise
    and those that run, the size against that keyword: held out, a top_k checked against the vocabulary)."""
    counts = {k: v for k, v in (kwargs or {}).items() if isinstance(v, int) and not isinstance(v, bool)}
    kinds = dict.fromkeys(p.group[0] for p in working if p.group)
    for kind in kinds:
        runs = sorted(p.group[1] for p in working if p.group and p.group[0] == kind)
        raises = sorted({p.group[1] for p in tried if p.group and p.group[0] == kind})
        first = next(p for p in working if p.group and p.group[0] == kind)
        given = first.group[2] if len(first.group) > 2 else None  # the size the call raised for
        said = ", ".join(map(str, runs))
        working_text = f"{kind}s {said}" if len(runs) > 1 else f"a {kind} of {said}"
        if raises:
            working_text += f" ({', '.join(map(str, raises))} raise{'s' if len(raises) == 1 else ''} too)"
        top = max([*raises, *([] if given is None else [given])], default=None)
        against = [k for k, v in counts.items() if top is not None and top <= v < min(runs)]
        covered = [k for k, v in counts.items() if top is not None and max(runs) <= v < min(raises, default=top)]
        weak, clue = first.weak, first.clue
        if raises and max(runs) < min(raises) and covered and (given is None or given > counts[covered[0]]):
            k = covered[0]  # the sizes that run are those the keyword covers: its path has nothing to do there
            note = f"; the sizes that run are those {k}={counts[k]} covers, where the path {k} takes has nothing to do"
            weak, clue = True, f"the crash is on {k}'s path, not about the size"
        elif raises and min(runs) > max(raises) and against:
            k = against[0]
            note = (
                f"; so the size matters against {k}={counts[k]}: the call raises where the size is at most {k} and "
                f"runs where it exceeds it (look at how {k} is checked or clamped against that size)"
            )
        elif raises and min(runs) > max(raises) and (given is None or given < min(runs)):
            note = f"; so the code assumes a size of at least {min(runs)}, of those tried (a fixed width or table)"
        elif raises and (m := _common_multiple(runs, [*raises, *([] if given is None else [given])])):
            note = (
                f"; so the code needs a {kind} that is a multiple of {m} (a buffer rounded up beside one that is not)"
            )
        elif len(runs) == 1 and raises and max(raises) > runs[0]:
            note = f"; so look for a size of {runs[0]} written into the code (a view, slice or table of that width)"
        else:
            note = ""
        merged = replace(first, working=working_text, note=note + first.note, weak=weak, clue=clue)
        working = [p for p in working if not (p.group and p.group[0] == kind)] + [merged]
    return working


def _probe(name: str, run: Callable, args: tuple, kwargs: dict, ledger) -> tuple[list[str], list[str], bool]:
    """``probe`` past the state checks: the variants, the fallbacks, the lines they give and their codes, and whether
    every cause said is only a path (``Probe.fallback``: cache=None, a flag's other value)."""
    tried, working, path = [], [], False
    try:
        _try(probes_for(name, args, kwargs, ledger), run, tried, working, ledger)
        # a path (use_cache=True raises) is narrowed by what raises on it (a batch of several rows), if anything
        path = all(p.weak or p.fallback for p in working) and any(not p.weak for p in working)
        if all(p.weak or p.fallback for p in working):  # nothing specific runs: does the size of an axis matter?
            fallback = (
                _rows_alone_probes(name, args, kwargs)
                + _multiple_probes(name, args, kwargs)
                + _axis_size_probes(name, args, kwargs)
                + _power_of_two_probes(name, args, kwargs)
                + _int_size_probes(name, args, kwargs)
            )[:MAX_TRIES]
            # sizes tried as a group, each one said with the others: a component's last axis, a model's head size
            fallback += _feature_size_probes(name, args, kwargs) + _config_head_size_probes(args, kwargs)
            fallback += ledger.sized_probes(name, args, kwargs, Probe) if ledger is not None else []
            _try(fallback, run, tried, working, ledger)
    except _ProcessLost:
        pass  # what ran before it still says what it says
    working = _grouped(working, tried, kwargs)
    if any(p.chunk >= 2 for p in working):  # a shorter chunk of several tokens runs: not "one new token only"
        several = "a shorter chunk of several tokens runs as well, so the cached path takes more than one new token"
        working = [replace(p, weak=True, clue=several) if p.single_token else p for p in working]
    if any(p.refills for p in working):  # the same ids run through a cache holding fewer positions
        working = [replace(p, weak=True, clue=BESIDE_CACHE) if p.beside_cache else p for p in working]
    causes = [p for p in working if not p.weak]
    if any(not p.fallback for p in causes) and not path:
        causes = [p for p in causes if not p.fallback]
    if any(p.exclusive for p in causes):
        causes, working = [p for p in causes if p.exclusive], [p for p in working if p.exclusive]
    if any(p.meaning for p in causes) and any(not (p.meaning or p.rank or p.fallback) for p in causes):
        other = "another change of the input runs as well and names what it raises on"
        working = [replace(p, weak=True, clue=other) if p.meaning and not p.weak else p for p in working]
        causes = [p for p in causes if not p.meaning]
    if any(p.rank for p in causes) and any(not (p.rank or p.fallback) for p in causes):
        # each change alone runs, another rank and another property at this rank: the crash needs both together
        r = next(p for p in causes if p.rank)
        both = [
            replace(p, failing=f"{p.failing} with {r.failing}", working=f"{p.working}, and for {r.working}",
                    note=f" (each change alone runs, so it raises on the two together){p.note}{r.note}")
            if not (p.rank or p.fallback) else p
            for p in causes
        ]  # fmt: skip
        working = [p for p in working if not any(p is c for c in causes)] + [p for p in both if not p.rank]
        causes = [p for p in both if not p.rank]
    clues = [
        f"note: {name} raises for {p.failing} and works for {p.working}{p.note} (a clue, not a cause: {p.clue})"
        for p in working
        if p.weak
    ]
    if causes:
        lines = [
            f"likely cause: {name} raises for {p.failing} and works for {p.working}{p.note}. Look at the shape, "
            f"size and dtype assumptions in {name}; fix: accept every input the protocol allows (evidence: the "
            f"same call with only this changed runs)"
            for p in causes
        ]
        return lines + clues, list(dict.fromkeys(p.code for p in causes)), all(p.fallback for p in causes)
    if clues:
        return clues, [], False
    if tried:
        names = "; ".join(f"{p.working} instead of {p.failing}" for p in tried)
        return [f"{NOTHING_RAN}: {name} raises as well with {names}"], [], False
    return [], [], False


# ---------------------------------------------------------------------------------------------
# where the implementation's own code raised


# ---------------------------------------------------------------------------------------------
# the subject as tests call it: every protocol call that raises is probed


# Subject operations whose first arguments are a protocol name's: ``build(config, state_dict, ...)`` calls
# ``build_model(config, state_dict)`` (``harness/subject/model_ops.py``).
_OPS_CALLING = {"build": "build_model"}


class Probing:
    """A subject whose protocol functions report a crash to ``on_crash(name, run, args, kwargs, exc)``
    before it propagates; everything else is the subject's own (``spec.impl`` in tests). What a test builds
    through it (models, optimizers, caches) is recorded in ``ledger`` (``model_variants.Ledger``), so that a crash
    can be retried on a model built again with one config property changed."""

    def __init__(self, subject, on_crash: Callable):
        self._subject, self._on_crash = subject, on_crash
        self.ledger = Ledger(subject)

    def __getattr__(self, name: str):
        value = getattr(self._subject, name)
        called = _OPS_CALLING.get(name, name)  # the subject's own operation that calls a protocol name
        recorded = name in _RECORDED
        if name.startswith("_") or not callable(value) or (called not in _protocol_names() and not recorded):
            return value
        from ..subject.subject import ImplementationError

        def call(*args, **kwargs):
            try:
                result = value(*args, **kwargs)
            except ImplementationError as exc:
                if called in _protocol_names():
                    self._on_crash(
                        called, value, args, kwargs, exc, fresh=self.fresh_for(called) if name == called else None
                    )
                raise
            if recorded:
                self.ledger.record(name, args, kwargs, result)
            return result

        return call

    def fresh_for(self, name: str) -> Callable | None:
        """How to get protocol name ``name`` from a fresh copy of the implementation (only an in-process subject loads
        one); its callers give it only a protocol call's own arguments (an operation's are not the name's)."""
        fresh = getattr(self._subject, "fresh_function", None)
        return (lambda: fresh(name)) if fresh is not None else None

    def __repr__(self) -> str:
        return repr(self._subject)


_RECORDED = ("build", "make_optimizer", "new_cache", "forward", "set_training")  # what model_variants.Ledger keeps


def _protocol_names() -> tuple[str, ...]:
    from ...protocol import PROTOCOL_NAMES

    return PROTOCOL_NAMES
