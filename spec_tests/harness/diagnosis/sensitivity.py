"""Which weights a failing model ignores: each canonical weight changed alone, the model run again.

A model wired wrongly often leaves a weight it loads unused: the MLP normalised with the attention's norm
(``mlp_norm.weight`` unused), the final norm skipped, a bias loaded and never added. Changing that weight alone
changes the specified model's output and leaves the implementation's exactly as it was, which names the weight
whatever the code looks like. The evidence is the implementation's own behaviour, measured, so the line is
confident; it runs only for a failing model-level check (``Spec.check(model_knobs=True)``) where no wiring or
knob variant fits, at two model runs per weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..judging.compare import mismatch

SHOWN = 4  # weights named in the line; the rest are counted
REFERENCE_CHANGE = 100.0  # the specified output must move this many tolerances for a weight to count as used


def _state_dict_at(args) -> int | None:
    for i, a in enumerate(args):
        if isinstance(a, dict) and a and all(isinstance(v, torch.Tensor) for v in a.values()):
            return i
    return None


def state_dict_position(args: tuple, args64: tuple) -> int | None:
    """Where the canonical state dict sits among a check's arguments, the same in the implementation's and the
    float64 ones (None where there is none)."""
    at = _state_dict_at(args)
    return at if at is not None and _state_dict_at(args64) == at else None


def _changed(t: torch.Tensor, seed: int) -> torch.Tensor:
    """``t`` plus noise of its own size (at least 0.1): a change no used weight hides."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(t.shape, generator=g, dtype=torch.float64).to(device=t.device, dtype=t.dtype)
    return t + (t.double().abs().mean().item() + 0.1) * noise


def ignored_weights(
    compute: Callable, impl, reference, args: tuple, args64: tuple, actual, expected, tol
) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: the canonical weights whose change leaves ``compute(impl, ...)`` as it was while
    ``compute(reference, ...)`` moves; nothing where none is, or where every one is (then nothing is used)."""
    at = state_dict_position(args, args64)
    if at is None:
        return [], []
    used, ignored = 0, []
    for seed, key in enumerate(sorted(args[at])):
        if not args[at][key].is_floating_point():
            continue
        mine = {**args[at], key: _changed(args[at][key], seed)}
        specified = {**args64[at], key: _changed(args64[at][key], seed)}
        moved = mismatch(compute(reference, *args64[:at], specified, *args64[at + 1 :]), expected, tol)
        if moved is None or (moved.ratio or 0) < REFERENCE_CHANGE:
            continue  # the specified model barely uses it here: it says nothing
        used += 1
        try:
            out = compute(impl, *args[:at], mine, *args[at + 1 :])
        except Exception:  # noqa: BLE001 - a crash is the check's to report, not this probe's
            return [], []
        if isinstance(out, torch.Tensor) and out.shape == actual.shape and torch.equal(out, actual):
            ignored.append(key)
    if not ignored or len(ignored) == used:
        return [], []
    shown = ", ".join(ignored[:SHOWN]) + (f" and {len(ignored) - SHOWN} more" if len(ignored) > SHOWN else "")
    it = "it" if len(ignored) == 1 else "each"
    return [
        f"likely cause: your model's output does not depend on {shown}: changed alone, {it} leaves your output "
        f"exactly as it was, while the specified model's output changes. Loaded but not used where {it} should be: "
        f"look for a sublayer given another's weight (a norm, a projection), a module skipped, or a weight stored "
        f"under another name (evidence: each weight changed alone)"
    ], ["ignored_weight"]


def swapped_weights(compute: Callable, reference, args64: tuple, actual, tol) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: two canonical weights (or two modules' weights, weight and bias together) of one shape
    whose places exchanged, in every layer at once (or outside the layers), make the specified model compute
    ``actual``: a loader whose name map swaps them (``attn_norm`` for ``mlp_norm``, ``wq`` for ``wk``). At one
    reference run per pair."""
    at = _state_dict_at(args64)
    if at is None or not isinstance(actual, torch.Tensor):
        return [], []
    sd = args64[at]
    for x, y, swap in _swaps(sd):
        try:
            out = compute(reference, *args64[:at], {**sd, **swap}, *args64[at + 1 :])
        except Exception:  # noqa: BLE001 - a swap the specified model cannot run says nothing
            continue
        if isinstance(out, torch.Tensor) and out.shape == actual.shape and mismatch(actual, out, tol) is None:
            where = " in every layer" if x.startswith("layers.") else ""
            x, y = (r.removeprefix("layers.*.") for r in (x, y))
            return [
                f"likely cause: your model computes the specified output with {x} and {y} exchanged{where}: each is "
                f"used where the other belongs, as a loader whose name map swaps them does (or a module built with "
                f"the other's weight). Fix: load each canonical weight into its own place (evidence: the specified "
                f"model with the two exchanged gives your output)"
            ], ["knob:weight_names"]
    return [], []


def _swaps(sd: dict) -> list[tuple[str, str, dict]]:
    """``(x, y, entries)``: each pair of units of the same shapes (a weight, or a module's weights together, named
    with the layer index as ``*``) and the state dict entries that exchange them in every layer."""
    units: dict[str, dict[str, list[str]]] = {}  # unit -> member suffix -> keys
    for key, value in sd.items():
        if not value.is_floating_point():
            continue
        role = _role(key)
        units.setdefault(role, {}).setdefault("", []).append(key)
        module, _, leaf = role.rpartition(".")
        units.setdefault(module + ".*", {}).setdefault(leaf, []).append(key)

    def signature(unit):
        return sorted((m, tuple(tuple(sd[k].shape) for k in ks)) for m, ks in units[unit].items())

    found, seen = [], set()
    names = sorted(units)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if signature(a) != signature(b) or a.startswith("layers.") != b.startswith("layers."):
                continue
            swap = {}
            for member, keys in units[a].items():
                for key, other in zip(sorted(keys), sorted(units[b][member]), strict=False):
                    swap[key], swap[other] = sd[other], sd[key]
            frozen = frozenset(swap)
            if swap and frozen not in seen:
                seen.add(frozen)
                found.append((a.removesuffix(".*"), b.removesuffix(".*"), swap))
    return found


def _role(key: str) -> str:
    """A canonical weight's name with its layer index as ``*``: ``layers.*.attn_norm.weight``."""
    parts = key.split(".")
    return ".".join("*" if i == 1 and parts[0] == "layers" else p for i, p in enumerate(parts))
