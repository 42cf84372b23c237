"""Crash probes for calls on a built model: the same call on the model built again with one config property changed.

A call such as ``train_step(model, optimizer, x, y)`` or ``generate(model, prompt, ...)`` can raise because of how the
model was configured (several kv heads shared by groups of query heads, a tied head) rather than because of its
other arguments. The ``Ledger`` keeps what a test built through its subject (each
model's config, weights and build options; each optimizer's model and options; each cache's model, batch size
and the tokens forwarded into it), so a crash can be retried on a model built again with one property changed,
its optimizer made again over it and its cache refilled with the same tokens. A variant that runs names the
property: "train_step raises for a GQA model (n_kv_heads=2 beside n_heads=8) and works for the model built with
n_kv_heads=8". Every variant is built through the subject's own operations (``build``, ``make_optimizer``,
``new_cache``, ``forward``), so the same probes run in grading, where the model is a handle in the worker.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...protocol import V1_OPTIONS, V2_CONFIG_DEFAULTS, V2_OPTION_WEIGHTS


class NotBuilt(Exception):
    """A variant's model could not be built (its weights given back in another shape, a config the code rejects):
    the variant was not tried, and says nothing about the crash."""


class Ledger:
    """What a test built through its subject, by object identity (the objects are held, so no identity is reused
    while the test runs)."""

    def __init__(self, subject):
        self.subject = subject
        self.models: dict[int, tuple] = {}  # id -> (model, config, state_dict, build options)
        self.optimizers: dict[int, tuple] = {}  # id -> (optimizer, model, further args, kwargs)
        self.caches: dict[int, tuple] = {}  # id -> (cache, model, batch_size, [ids forwarded into it])
        self.modes: dict[int, bool] = {}  # id(model) -> the training mode a test set

    def record(self, op: str, args: tuple, kwargs: dict, result) -> None:
        """After ``op(*args, **kwargs)`` returned ``result`` on the subject."""
        if op == "build":
            values = dict(zip(("config", "state_dict"), args, strict=False)) | kwargs
            options = {k: v for k, v in values.items() if k not in ("config", "state_dict")}
            if isinstance(values.get("config"), dict):
                self.models[id(result)] = (result, values["config"], values.get("state_dict"), options)
        elif op == "make_optimizer" and args and id(args[0]) in self.models:
            self.optimizers[id(result)] = (result, args[0], args[1:], kwargs)
        elif op == "new_cache" and args and id(args[0]) in self.models:
            batch_size = args[1] if len(args) > 1 else kwargs.get("batch_size")
            self.caches[id(result)] = (result, args[0], batch_size, [])
        elif op == "forward":
            cache = args[2] if len(args) > 2 else kwargs.get("cache")
            if cache is not None and id(cache) in self.caches and len(args) > 1:
                self.caches[id(cache)][3].append(args[1].detach().clone())
        elif op == "set_training" and len(args) > 1:
            self.modes[id(args[0])] = bool(args[1])

    def fresh_caches(self, args: tuple, kwargs: dict, clone: Callable) -> tuple[tuple, dict] | None:
        """``(args, kwargs)`` with every recorded cache among them made again (``new_cache``) and filled with what
        was forwarded into it before, the rest ``clone``d; None where none is recorded. A failing call may have left
        its cache half written, and a variant tried on that cache says nothing about the variant."""
        if not any(id(v) in self.caches for v in (*args, *kwargs.values())):
            return None

        def fresh(value):
            entry = self.caches.get(id(value))
            if entry is None:
                return clone(value)
            _, model, batch_size, forwarded = entry
            cache = self.subject.new_cache(model, batch_size)
            for earlier in forwarded:
                self.subject.forward(model, earlier.clone(), cache)
            return cache

        return tuple(fresh(a) for a in args), {k: fresh(v) for k, v in kwargs.items()}

    def _model_of(self, value):
        """The recorded model ``value`` is, or the one its optimizer or cache belongs to."""
        for table, at in ((self.models, None), (self.optimizers, 1), (self.caches, 1)):
            entry = table.get(id(value))
            if entry is not None:
                return entry[0] if at is None else entry[at]
        return None

    def context_length(self, args: tuple, kwargs: dict) -> int | None:
        """The context_length of the one recorded model among the call's arguments (or its cache's, its
        optimizer's); None where there is none, or several."""
        found = {id(m): m for m in map(self._model_of, (*args, *kwargs.values())) if m is not None}
        if len(found) != 1:
            return None
        config = self.models[id(next(iter(found.values())))][1]
        value = config.get("context_length") if isinstance(config, dict) else None
        return value if type(value) is int else None

    def probes(self, name: str, args: tuple, kwargs: dict, probe_type) -> list:
        """One ``probe_type`` (``crashes.Probe``) per config change that applies to the one model among the call's
        arguments (the model itself, its optimizer or its cache), and for a cache that earlier calls filled, the
        same call on that cache filled with fewer positions (``_cache_fill_probes``)."""
        found = {id(m): m for m in map(self._model_of, (*args, *kwargs.values())) if m is not None}
        if len(found) != 1:
            return []
        fill = (
            self._cache_fill_probes(args, kwargs, probe_type)
            + self._empty_cache_probes(args, kwargs, probe_type)
            + self._one_at_a_time_probes(args, kwargs, probe_type)
            + self._one_row_probes(args, kwargs, probe_type)
        )
        (model,) = found.values()
        _, config, state, options = self.models[id(model)]
        probes = []
        room = self._room(config, args, kwargs)
        for change in CHANGES:
            made = change(config)
            if made is None:
                continue
            failing, working, new_config, transform = made
            make = self._maker(model, new_config, state, transform, options, args, kwargs)
            # through a filled cache the variant must run with the cache filled to the context too: a size that
            # the change moved (a length compared with n_kv_heads) is no property of the model
            fuller = self._maker(model, new_config, state, transform, options, args, kwargs, fill=room)
            controls = ((fuller, True),) if room else ()
            probes.append(probe_type(failing, working, args, kwargs, "", "crash", make=make, controls=controls))
        probes += self._dtype_probes(model, config, state, options, args, kwargs, probe_type)
        dropout = config.get("dropout")
        if isinstance(dropout, float) and 0 < dropout < 1:  # values change: another rate must raise as well
            other_rate = 0.25 if dropout != 0.25 else 0.5
            make = self._maker(model, {**config, "dropout": 0.0}, state, dict, options, args, kwargs)
            control = self._maker(model, {**config, "dropout": other_rate}, state, dict, options, args, kwargs)
            note = f" (and dropout={other_rate} raises too); so look at the dropout path (training mode only)"
            probes.append(probe_type(f"a model with dropout={dropout}", "the same model with dropout=0.0", args, kwargs,
                                     note, "crash", make=make, controls=((control, False),)))  # fmt: skip
        # values change: fresh weights must raise as well
        for option, default, dropped in options_set(config, kept=("n_experts",)):
            off = option_off(config, option, default)
            make = self._maker(model, off, state, without(dropped), options, args, kwargs)
            control = self._maker(model, config, None, None, {**options, "seed": 1}, args, kwargs)
            note = f" (and a fresh model with it raises too); so look at how {option} is built and applied"
            probes.append(probe_type(f"a model with {option}={config[option]!r}",
                                     f"the same model with {option}={default!r}", args, kwargs, note, "crash",
                                     make=make, controls=((control, False),)))  # fmt: skip
        if state is None:  # a fresh model: built again from canonical weights (the reference's initialisation)
            loaded = self._loaded_maker(model, config, options, args, kwargs)
            if loaded is not None:
                note = (
                    "; so look at how build_model initialises a model when no state_dict is given (a weight made in "
                    "another shape or dtype, or one left unset)"
                )
                probes.append(probe_type("a freshly initialised model (build_model without a state_dict)",
                                         "the same config built from canonical weights", args, kwargs, note, "crash",
                                         make=loaded))  # fmt: skip
        other = _other_family(config, getattr(self.subject, "families", ()))
        if other is not None:
            failing, working, new_config, same = other
            fresh = {**options, "seed": 0}
            make = self._maker(model, new_config, None, None, fresh, args, kwargs)
            # the same family built fresh raises too: the family, not these weights' values (nor a head count)
            controls = tuple((self._maker(model, c, None, None, fresh, args, kwargs), False) for c in same)
            probes.append(probe_type(failing, working, args, kwargs, "", "crash", make=make, controls=controls))
        return fill + probes

    def _dtype_probes(self, model, config, state, options, args, kwargs, probe_type) -> list:
        """The model built again in the other float dtype (16-bit ones as float32), its weights cast, any cache
        among the call's arguments made for it and refilled: where the model is not a torch module (crashes' own
        dtype probe copies modules) or a cache goes with it (a copy would meet the cache made for the original)."""
        dtype = str(options.get("dtype") or "").removeprefix("torch.")
        to = other_float(getattr(torch, dtype, None))
        cached = any(id(v) in self.caches for v in (*args, *kwargs.values()))
        if to is None or (isinstance(model, torch.nn.Module) and not cached):
            return []
        other = str(to).removeprefix("torch.")

        def cast(weights: dict) -> dict:
            return {k: v.to(to) if v.is_floating_point() else v for k, v in weights.items()}

        make = self._maker(model, config, state, cast, {**options, "dtype": other}, args, kwargs)
        return [probe_type(f"a {dtype} model", f"the same model in {other}", args, kwargs, "", "crash", make=make)]

    def _loaded_maker(self, model, config, options, args, kwargs) -> Callable | None:
        """A maker of the call's arguments with ``model`` (freshly initialised) replaced by the same config built from
        the reference's canonical weights for it, made with the same build options; None where the reference cannot
        build the config."""
        from ..subject.subject import reference_subject

        try:
            ref = reference_subject("interleaved")
            weights = ref.canonical_state_dict(ref.build(config, None, **{**options, "seed": 0}))
        except Exception:  # noqa: BLE001 - a config the reference rejects: nothing to load
            return None
        return self._maker(model, config, weights, dict, options, args, kwargs)

    def sized_probes(self, name: str, args: tuple, kwargs: dict, probe_type) -> list:
        """A fallback where nothing specific runs: the one model among the call's arguments built fresh at each other
        head size of ``HEAD_SIZES`` (``_head_sizes``), the sizes that run said together (``crashes._grouped``)."""
        found = {id(m): m for m in map(self._model_of, (*args, *kwargs.values())) if m is not None}
        if len(found) != 1:
            return []
        (model,) = found.values()
        _, config, _, options = self.models[id(model)]
        probes = []
        for size, failing, working, sized, wider in _head_sizes(config):
            make = self._maker(model, sized, None, None, {**options, "seed": 0}, args, kwargs)
            # the same model built fresh raises too (not these weights' values), and the working head size runs with
            # twice the heads too (the head size, not the width d_model, is what it runs on)
            controls = (
                (self._maker(model, config, None, None, {**options, "seed": 0}, args, kwargs), False),
                (self._maker(model, wider, None, None, {**options, "seed": 0}, args, kwargs), True),
            )
            probes.append(probe_type(failing, working, args, kwargs, " (fresh weights)", "crash_head_size",
                                     make=make, controls=controls,
                                     group=("head size", size, config["d_model"] // config["n_heads"])))  # fmt: skip
        ctx = config.get("context_length")
        if type(ctx) is int and ctx > 1:  # a context the code rounds one buffer of up, and another not
            up = -(-ctx // 8) * 8
            for length in dict.fromkeys(n for n in (ctx + 1, up, up + 1, up + 8) if n != ctx):
                sized = {**config, "context_length": length}
                make = self._maker(model, sized, None, None, {**options, "seed": 0}, args, kwargs)
                probes.append(probe_type(f"a context_length of {ctx}", f"a context_length of {length}", args, kwargs,
                                         " (fresh weights)", "boundary", make=make,
                                         group=("context_length", length, ctx)))  # fmt: skip
        return probes

    def rebuilt(self, args: tuple, kwargs: dict) -> Callable | None:
        """The call's arguments with the one model among them built again from its current weights (an optimizer
        made again over it, a cache made for it and refilled with the tokens fed into it), or ``None`` where no one
        recorded model is among them: what the call meets on a model that no earlier call has touched."""
        found = {id(m): m for m in map(self._model_of, (*args, *kwargs.values())) if m is not None}
        if len(found) != 1:
            return None
        (model,) = found.values()
        _, config, _, options = self.models[id(model)]
        return self._maker(model, config, None, dict, options, args, kwargs)

    def _cache_fill_probes(self, args: tuple, kwargs: dict, probe_type) -> list:
        """A call on a cache that earlier calls filled (N positions), made again on a new cache of the same model
        filled with all but the last of those calls, and on an empty one: a crash that appears only once the cache
        holds enough positions (a buffer sized to a window) runs there. The fewer positions are said as a clue: the
        same positions fed in one call must behave alike (N raising, the fewer running), and even so, where each call
        was one token, a cache appending on the head axis fails by its number of appends and passes those controls.
        The empty cache names the trigger (``cache_fill``), not a mechanism: any cached path that raises only on what
        it reads back runs there; beside either a size of the new tokens is only a clue (``crashes.BESIDE_CACHE``)."""
        subject, probes = self.subject, []
        for value in (*args, *kwargs.values()):
            entry = self.caches.get(id(value))
            if entry is None or not entry[3]:
                continue
            _, model, batch_size, forwarded = entry
            held = sum(int(ids.shape[-1]) for ids in forwarded)

            def make(keep: int, value=value, model=model, batch_size=batch_size, forwarded=forwarded, merged=False):
                def build():
                    fresh = subject.new_cache(model, batch_size)
                    chunks = [torch.cat(forwarded[:keep], dim=-1)] if merged and keep else forwarded[:keep]
                    for ids in chunks:
                        subject.forward(model, ids.clone(), fresh)
                    swap = lambda v: fresh if v is value else v
                    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

                return build

            failing = f"a cache already holding {held} position{'s' * (held != 1)}"
            if len(forwarded) > 1:
                fewer = held - int(forwarded[-1].shape[-1])
                # the count of positions, not how the calls cut them: the same positions fed in one call raise as
                # well, and the fewer ones fed in one call run. Even then a clue: where each call was one token, the
                # count of positions is the count of appends (a cache appending on the head axis passes both)
                same_in_one = (
                    (make(len(forwarded), merged=True), False),
                    (make(len(forwarded) - 1, merged=True), True),
                )
                probes.append(probe_type(failing, f"the same cache holding {fewer}", args, kwargs, "", "boundary",
                                         make=make(len(forwarded) - 1), controls=same_in_one, weak=True, refills=True,
                                         clue="the number of calls that filled it may matter instead"))  # fmt: skip
            # the trigger, not a mechanism: whatever the cached path reads back or offsets by the cached length
            note = (
                "; so look at how the cached path appends to and reads back what it holds (the axis it grows, the "
                "offsets of the mask's rows and positions by the cached length)"
            )
            probes.append(probe_type(failing, "a new, empty cache", args, kwargs, note, "cache_fill", make=make(0),
                                     refills=True))  # fmt: skip
            break
        return probes

    def _room(self, config, args, kwargs) -> int:
        """For a call through a cache that earlier calls filled: how many more positions fit beside the call's own
        tokens within the context (0 where there is no such cache)."""
        caches = [self.caches[id(v)] for v in (*args, *kwargs.values()) if id(v) in self.caches]
        ids = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.ndim == 2), None)
        context = config.get("context_length")
        if len(caches) != 1 or not caches[0][3] or ids is None or type(context) is not int:
            return 0
        held = sum(int(t.shape[-1]) for t in caches[0][3])
        return max(0, context - held - int(ids.shape[-1]))

    def _empty_cache_probes(self, args: tuple, kwargs: dict, probe_type) -> list:
        """A call on a fresh cache nothing was forwarded into, made again on a new cache of the same model after one
        token went in (the first of the call's ids, which then go on from the second; for a call without ids, token
        0, as for a call of one token, which then follows it): a cache whose per-layer entries or block tables exist
        only after a first write raises empty and runs then."""
        subject = self.subject
        for value in (*args, *kwargs.values()):
            entry = self.caches.get(id(value))
            if entry is None or entry[3]:
                continue
            _, model, batch_size, _ = entry
            ids = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].ndim == 2 else None
            split = ids is not None and ids.shape[-1] >= 2

            def make(value=value, model=model, batch_size=batch_size, ids=ids, split=split):
                fresh = subject.new_cache(model, batch_size)
                first = ids[:, :1].clone() if split else torch.zeros(batch_size, 1, dtype=torch.long)
                subject.forward(model, first, fresh)
                rest = ids[:, 1:].clone() if split else ids
                swap = lambda v: fresh if v is value else (rest if v is ids else v)
                return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

            def alone(value=value, model=model, batch_size=batch_size, ids=ids, split=split):
                fresh = subject.new_cache(model, batch_size)
                rest = ids[:, 1:].clone() if split else ids
                swap = lambda v: fresh if v is value else (rest if v is ids else v)
                return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

            # the same (shorter) call through an empty cache must raise too: else the length, not the emptiness, was it
            return [probe_type("a fresh, empty cache", "the cache after one token was forwarded into it", args, kwargs,
                               "; so look at what the cache reads or builds before its first write", "cache_empty",
                               make=make, controls=((alone, False),))]  # fmt: skip
        return []

    def _one_at_a_time_probes(self, args: tuple, kwargs: dict, probe_type) -> list:
        """A chunk of several tokens through a cache (empty or filled), given as the same tokens fed one at a time:
        a cached path that reserves one slot per call, or builds a mask only a single token fits, raises for a chunk
        and runs token by token (the last token is the call, the others fed before it)."""
        subject = self.subject
        for value in (*args, *kwargs.values()):
            entry = self.caches.get(id(value))
            ids = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
            if entry is None or ids is None or ids.ndim != 2 or ids.shape[-1] < 2:
                continue
            _, model, batch_size, forwarded = entry

            def stepped(last: int, value=value, model=model, batch_size=batch_size, forwarded=forwarded, ids=ids):
                """The call on a new cache fed the earlier chunks, then all but the last ``last`` tokens one at a
                time; the call itself gives those ``last`` tokens."""
                fresh = subject.new_cache(model, batch_size)
                for earlier in [*forwarded, *ids[:, :-last].split(1, dim=-1)]:
                    subject.forward(model, earlier.clone(), fresh)
                swap = lambda v: fresh if v is value else (ids[:, -last:].clone() if v is ids else v)
                return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

            make, pair = (lambda: stepped(1)), (lambda: stepped(2))
            failing = f"a chunk of {ids.shape[-1]} tokens through the cache"
            # "one new token only" holds where the last two tokens as a chunk raise as well
            return [probe_type(failing, "the same tokens fed one at a time", args, kwargs,
                               "; so the cached path handles one new token only", "crash", make=make,
                               single_token=True, controls=((pair, False),))]  # fmt: skip
        return []

    def _one_row_probes(self, args: tuple, kwargs: dict, probe_type) -> list:
        """A call through a cache of several rows, made again through a cache of the first row alone (filled with the
        first row of what filled it), with the first row of the call's ids: a cache that holds one sequence whatever
        batch size it was made for raises for several rows and runs for one."""
        subject = self.subject
        for value in (*args, *kwargs.values()):
            entry = self.caches.get(id(value))
            ids = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
            if entry is None or ids is None or ids.ndim != 2 or ids.shape[0] < 2 or entry[2] != ids.shape[0]:
                continue
            _, model, batch_size, forwarded = entry

            def make(value=value, model=model, forwarded=forwarded, ids=ids):
                fresh = subject.new_cache(model, 1)
                for earlier in forwarded:
                    subject.forward(model, earlier[:1].clone(), fresh)
                swap = lambda v: fresh if v is value else (ids[:1].clone() if v is ids else v)
                return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

            failing = f"a batch of {ids.shape[0]} rows through a cache made for {batch_size}"
            return [probe_type(failing, "one row through a cache made for one", args, kwargs,
                               "; so the number of rows matters on the cached path (a cache holding one sequence "
                               "whatever batch size it was made for, a squeezed batch axis, or a length or offset "
                               "read from the batch axis)", "crash",
                               make=make)]  # fmt: skip
        return []

    def _maker(self, model, config, state, transform, options, args, kwargs, fill: int = 0) -> Callable:
        """A function building the variant from the model's weights (those it was built from, else its
        ``canonical_state_dict``) passed through ``transform``, and returning the call's arguments with it in place
        of the model (an optimizer made again over it, a cache made for it and refilled with the same tokens, and
        ``fill`` more: the same tokens again, cut to that many); ``transform=None``: freshly initialised weights."""
        subject = self.subject

        def make():
            try:
                if transform is None:  # fresh weights
                    variant = subject.build(config, None, **options)
                else:
                    weights = state if isinstance(state, dict) else subject.canonical_state_dict(model)
                    variant = subject.build(config, transform(dict(weights)), **options)
            except Exception as exc:  # a variant that cannot be built is not tried
                if getattr(exc, "process", False):
                    raise
                raise NotBuilt from exc
            if id(model) in self.modes:
                subject.set_training(variant, self.modes[id(model)])

            def swap(value):
                if value is model:
                    return variant
                if id(value) in self.optimizers:
                    _, _, rest, opt_kwargs = self.optimizers[id(value)]
                    return subject.make_optimizer(variant, *rest, **opt_kwargs)
                if id(value) in self.caches:
                    _, _, batch_size, forwarded = self.caches[id(value)]
                    cache = subject.new_cache(variant, batch_size)
                    for ids in forwarded:
                        subject.forward(variant, ids.clone(), cache)
                    if fill:
                        tokens = torch.cat(forwarded, dim=-1)
                        more = tokens.repeat(1, fill // tokens.shape[-1] + 1)[:, :fill]
                        subject.forward(variant, more.clone(), cache)
                    return cache
                return value

            return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

        return make


def other_float(dtype) -> torch.dtype | None:
    """The float dtype a crash is tried in instead of ``dtype``: float64 and float32 each other's, 16-bit ones float32
    (code that mixes a float32 table or weight into a bfloat16 model raises only there); None for any other."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return {torch.float64: torch.float32, torch.float32: torch.float64}.get(dtype)


def shares_a_position(held: torch.Tensor, filled: torch.Tensor) -> int:
    """How many positions (axis -2) of ``held`` (a new cache's keys) equal, exactly and not all zero, a position of
    ``filled`` (keys a call wrote into another cache): keys handed on from that cache, where uninitialised memory or
    a zero buffer never matches."""
    if held.dim() != filled.dim() or held.shape[:-2] != filled.shape[:-2] or held.shape[-1] != filled.shape[-1]:
        return 0
    rows = [filled[..., s, :] for s in range(filled.shape[-2]) if bool(filled[..., s, :].abs().sum() > 0)]
    return sum(any(torch.equal(held[..., t, :], r) for r in rows) for t in range(held.shape[-2]))


def heads_repeated(w: torch.Tensor, h_kv: int, h: int) -> torch.Tensor:
    """A key or value weight (or bias) of ``h_kv`` heads, rows grouped by head, with each head's rows repeated
    to ``h`` heads: kv head ``j`` serves query heads ``j * h // h_kv`` on (the protocol's GQA mapping)."""
    rows = w.reshape(h_kv, w.shape[0] // h_kv, *w.shape[1:]).repeat_interleave(h // h_kv, dim=0)
    return rows.reshape(-1, *w.shape[1:])


def _ints(config, *keys) -> bool:
    return all(type(config.get(k)) is int for k in keys)


def _as_mha(config):
    """GQA as MHA: ``n_kv_heads = n_heads``, each kv head's rows repeated to its group (the same model)."""
    if not _ints(config, "n_heads", "n_kv_heads"):
        return None
    h, h_kv = config["n_heads"], config["n_kv_heads"]
    if not 0 < h_kv < h or h % h_kv:
        return None
    kv = ("attn.wk.weight", "attn.wv.weight", "attn.wk.bias", "attn.wv.bias")

    def transform(state):
        return {k: heads_repeated(v, h_kv, h) if k.endswith(kv) else v for k, v in state.items()}

    failing = f"a GQA model (n_kv_heads={h_kv} beside n_heads={h})"
    return (
        failing,
        f"the same model with n_kv_heads={h} (its key and value weights repeated)",
        {**config, "n_kv_heads": h},
        transform,
    )


def _untied(config):
    """A tied head (the default) as a separate head holding a copy of the embedding (the same logits)."""
    if config.get("tie_embeddings", True) is not True:
        return None

    def transform(state):
        return {**state, "lm_head.weight": state["tok_embeddings.weight"].clone()}

    working = "the same weights with tie_embeddings=False (the head a copy of the embedding)"
    return "a model with a tied head", working, {**config, "tie_embeddings": False}, transform


V1_CONFIG_KEYS = frozenset(
    ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "family", "norm_eps",
     "tie_embeddings", "dropout", "rope_theta")
)  # fmt: skip


def options_set(config, *, kept, v1: bool = False) -> list[tuple[str, object, tuple[str, ...]]]:
    """``(option, default, the weights it adds)`` for every protocol v2 option the config sets, and with ``v1`` the v1
    options too (``V1_OPTIONS``: an untied head); options named in ``kept`` are never turned off alone (the MoE's:
    its weights are another MLP's)."""
    defaults = {k: (d, V2_OPTION_WEIGHTS.get(k, ())) for k, (_, d, _) in V2_CONFIG_DEFAULTS.items()}
    if v1:
        defaults |= V1_OPTIONS
    return [
        (key, default, added)
        for key, (default, added) in defaults.items()
        if key not in kept and config.get(key, default) != default
    ]


def option_off(config: dict, option: str, default) -> dict:
    """``config`` with ``option`` at its default (a sliding window's ``layer_types`` pattern leaves with it)."""
    off = {k: v for k, v in config.items() if k != option} | {option: default}
    if option == "sliding_window":  # a layer_types pattern needs its window
        off.pop("layer_types", None)
    return off


def without(suffixes: tuple[str, ...]) -> Callable:
    """A state-dict transform leaving out the weights whose names end with ``suffixes``."""
    return lambda state: {k: v for k, v in state.items() if not (suffixes and k.endswith(suffixes))}


HEAD_SIZES = (64, 128, 32, 16, 8, 4)  # the sizes code writes in most often first
MAX_WIDTH = 512  # a variant (twice the heads, for its control) no wider: each is run whole, a train call too


def _head_sizes(config) -> list[tuple[int, str, str, dict, dict]]:
    """``(size, failing, working, config, wider)`` per other head size of ``HEAD_SIZES``: the same heads at that
    size (``d_model = n_heads * size``), and ``wider`` twice the heads (and kv heads) at that size. A config that
    sets a head size of its own (``head_dim``) or a width not split evenly over its heads gets none."""
    if not _ints(config, "d_model", "n_heads") or "head_dim" in config or config["d_model"] % config["n_heads"]:
        return []
    h, d = config["n_heads"], config["d_model"]
    kv = config.get("n_kv_heads")
    found = []
    for size in HEAD_SIZES:
        if size == d // h or 2 * h * size > MAX_WIDTH:
            continue
        sized = {**config, "d_model": h * size}
        wider = {**sized, "n_heads": 2 * h, "d_model": 2 * h * size}
        if type(kv) is int:
            wider["n_kv_heads"] = 2 * kv
        found.append((size, f"a head size of {d // h}", f"a head size of {size}", sized, wider))
    return found


def _other_family(config, families):
    """``(failing, working, config, controls)``: the model's sizes in the other family (a v1 config only, MHA where
    it is gpt2), for a crash only one family's models meet (a head size read from the rotary tables). Its weights
    have other names, so it is built fresh, and it is said only where the same family built fresh raises too
    (``controls``: configs that must raise). RoPE needs an even head size: an odd one takes the nearest head count
    that gives an even one, and the same family with that head count is a control too."""
    family = config.get("family", "llama")
    other = {"llama": "gpt2", "gpt2": "llama"}.get(family)
    if other not in families or set(config) - V1_CONFIG_KEYS or not _ints(config, "d_model", "n_heads"):
        return None
    d, h = config["d_model"], config["n_heads"]
    if other == "gpt2" and config.get("n_kv_heads") not in (None, h):
        return None
    new = {k: v for k, v in config.items() if k != "rope_theta"} | {"family": other}
    controls, working = [config], f"a {other} model of the same sizes (fresh weights)"
    if other == "llama" and (d // h) % 2:
        even = [n for n in range(1, d + 1) if d % n == 0 and (d // n) % 2 == 0]
        if not even:
            return None
        h = min(even, key=lambda n: (abs(n - h), n))
        new |= {"n_heads": h, "n_kv_heads": h}
        controls.append({**config, "n_heads": h, "n_kv_heads": h})
        working = f"a {other} model of the same sizes with n_heads={h} (RoPE needs an even head size; fresh weights)"
    return f"a {family} model", working, new, controls


# Only changes that keep every value the model computes: a crash that depends on values (a NaN that one layer
# fewer would not spread, say) then raises in the variant too, and no property is wrongly named. (The family,
# which changes the values, has a control instead: _other_family.)
CHANGES = (_as_mha, _untied)
