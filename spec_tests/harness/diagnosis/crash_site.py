"""Where an implementation's call raised, and what was there: the innermost frame in its own files, the line it
raised at, and the values that line names.

- ``own_frame(exc)``: ``file:line in function`` of that frame (not the adapter's, the suite's, torch's or Python's);
- ``site_lines(name, exc)``: for a crash no probe explains, what the raising line read (``note: at train.py:37
  ... warmup_steps = 0, step = 0``); and where the line pins the cause, that cause: a ``ZeroDivisionError`` at a
  line dividing by exactly one name that holds 0, a ``KeyError`` reading the one dict at the line that lacks the
  key, an ``IndexError`` at a line reading exactly one empty list or tuple, a variable unbound on the path taken,
  autograd's in-place version check, a ``TypeError`` or ``AttributeError``
  on ``None`` at a line reading exactly one name that holds None.

Values are read from the frame's own locals (and attributes of them, looked up without running the code's
properties); a tensor is said as its shape and dtype, a number as itself. Nothing is evaluated: a name the frame
does not hold is left out.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import keyword
import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Callable
from types import FrameType

import torch

MAX_VALUES = 8  # names said per line: a line with more is described by its first ones


_SUITE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep  # spec_tests/


def _foreign_roots(*, installed: bool) -> tuple[str, ...]:
    """The suite, torch and Python's standard library; with ``installed``, the adapters, the grader, the tools and
    every installed package too."""
    here = _SUITE.rstrip(os.sep)
    roots = [_SUITE, os.path.dirname(os.path.realpath(torch.__file__)) + os.sep]
    keys = ("stdlib", "platstdlib", "purelib", "platlib") if installed else ("stdlib", "platstdlib")
    roots += [os.path.realpath(path) + os.sep for key in keys if (path := sysconfig.get_paths().get(key))]
    if installed:
        roots += [
            os.path.join(os.path.dirname(here), name) + os.sep for name in ("tools", "spec_adapters", "spec_grading")
        ]
        roots.append(os.path.realpath(sys.prefix) + os.sep)
    return tuple(roots)


def _own_frames(exc: BaseException, *, libraries: bool) -> list[tuple[str, int, str, FrameType]]:
    """``(real path, line, function, frame)`` of every traceback frame in the implementation's own files, outermost
    first."""
    foreign = _foreign_roots(installed=not libraries)
    frames, tb = [], exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        real = os.path.realpath(code.co_filename)
        if not code.co_filename.startswith("<") and not any(real.startswith(r) for r in foreign):
            frames.append((real, tb.tb_lineno, code.co_name, tb.tb_frame))
        tb = tb.tb_next
    return frames


def raised_as_not_implemented(exc: BaseException) -> bool:
    """Whether a ``NotImplementedError`` says "not implemented": raised by a ``raise`` statement of code outside torch
    and the standard library (a stub, or a library declining a feature), not by a compiled torch op (``"index_select"
    not implemented for 'UInt16'``) nor by torch's Python code refusing the input, which are crashes on that input."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return True
    code = tb.tb_frame.f_code
    if code.co_filename.startswith("<"):
        return True
    real = os.path.realpath(code.co_filename)
    torch_or_stdlib = tuple(r for r in _foreign_roots(installed=False) if not r.startswith(_SUITE))
    if any(real.startswith(r) for r in torch_or_stdlib):
        return False
    line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return line == "" or line.startswith("raise")


def _shown(real: str) -> str:
    shown = os.path.relpath(real)
    return real if shown.startswith("..") else shown


def own_frame(exc: BaseException | None, *, libraries: bool = False) -> str:
    """``file:line in function`` of the innermost frame outside the suite, the adapters, torch and Python;
    ``libraries``: a library's own frames count too (code behind an adapter raising in the library it wraps)."""
    if exc is None or exc.__traceback__ is None:
        return ""
    frames = _own_frames(exc, libraries=libraries)
    if not frames:
        return ""
    real, line, function, _ = frames[-1]
    return f"{_shown(real)}:{line} in {function}"


# ---------------------------------------------------------------------------------------------
# the values at the raising line

_NAME = re.compile(r"(?<![\w.'\"])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_SKIP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "torch", "F", "nn", "np", "math"}
_MISSING = object()
_TENSOR_FACTS = ("shape", "dtype", "device", "ndim")


def _attribute(obj, name: str):
    """``obj.name`` without running a property or ``__getattr__`` of the implementation's (an ``nn.Module``'s
    parameters, buffers and submodules are read from its own dicts)."""
    if isinstance(obj, torch.Tensor) and name in _TENSOR_FACTS:  # a tensor's own facts, read without its values
        return getattr(obj, name)
    for store in ("_parameters", "_buffers", "_modules"):
        held = getattr(obj, "__dict__", {}).get(store)
        if isinstance(held, dict) and name in held:
            return held[name]
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        return _MISSING
    return _MISSING if isinstance(value, property | staticmethod | classmethod) or callable(value) else value


def _lookup(frame: FrameType, dotted: str):
    head, *rest = dotted.split(".")
    value = frame.f_locals.get(head, frame.f_globals.get(head, _MISSING))
    for part in rest:
        if value is _MISSING:
            break
        value = _attribute(value, part)
    return value


def _prefixes(dotted: str) -> list[str]:
    """``a``, ``a.b``, ``a.b.c`` of ``a.b.c``: an attribute read on None raises at the prefix that is None."""
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _described(value) -> str | None:
    """A value as a line shows it: a tensor's shape and dtype, a number, a short string, a sequence's length."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if value.device.type == "meta":  # no values to read
            return f"{list(value.shape)} {dtype} on meta"
        return f"{value.item()!r} (0-d {dtype})" if value.ndim == 0 else f"{list(value.shape)} {dtype}"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 30 else None
    if isinstance(value, torch.Size):
        return repr(tuple(value))
    if isinstance(value, list | tuple) and len(value) <= 6 and all(isinstance(v, bool | int | float) for v in value):
        return repr(value)
    if isinstance(value, list | tuple | dict):
        return f"{type(value).__name__} of {len(value)}"
    return None


def _names(line: str) -> list[str]:
    """The dotted names a line of source reads, in order, without keywords, builtins or call targets."""
    text = re.sub(r"(['\"]).*?\1", "", line)  # string literals say nothing about values
    names = []
    for match in _NAME.finditer(text):
        name = match.group(1)
        after = text[match.end() :].lstrip()
        if after.startswith("(") and "." in name:  # a method call: the object it is called on is read
            name = name.rsplit(".", 1)[0]
            after = ""
        if name.split(".")[0] in _SKIP and "." not in name or after.startswith("(") or name in names:
            continue
        if after.startswith("=") and not after.startswith("=="):  # the name it assigns, not one it reads
            continue
        names.append(name)
    return names


def _divisors(line: str) -> list[str]:
    """The dotted names the line divides by (``a / n``, ``a // n``, ``a % n``, ``a /= n``)."""
    source = line.strip().rstrip(":")
    for text in (source, source.split("=", 1)[-1] if "=" in source else source):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found = []
        for node in ast.walk(tree):
            right = None
            if isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
                right = node.right if isinstance(node, ast.BinOp) else node.value
            if isinstance(right, ast.Name | ast.Attribute):
                found.append(ast.unparse(right))
        return found
    return []


SITE_NAMES = 16  # names a site record holds (with their prefixes)
SITE_KEYS = 8  # keys of a dict a record lists


def read_site(
    exc: BaseException | None, *, inside: Callable[[str], bool] | None = None, shown: Callable[[str], str] | None = None
) -> dict | None:
    """The raising line of ``exc``'s innermost own frame as plain data (the worker sends it with the error, so the
    judge reads a remote crash as it reads a local one): ``where``, ``function``, ``source``, ``types`` (the
    exception's class names), ``message``, ``key`` (a ``KeyError``'s key, as ``repr``) and ``names``: per dotted
    name the line reads (and each prefix of it), its ``text`` (``_described``), whether it is ``none``, ``zero``,
    an ``empty`` list or tuple (its type's name), and for a dict its first ``keys`` and whether it ``lacks`` the
    missing key. ``inside(path)``: which files are the implementation's (default: not the suite, torch, Python);
    ``shown(path)``: how a file is named in ``where`` (default: relative to the working directory)."""
    if exc is None or exc.__traceback__ is None:
        return None
    frames = _own_frames(exc, libraries=True)
    if inside is not None:
        frames = [f for f in frames if inside(f[0])]
    if not frames:
        return None
    real, lineno, function, frame = frames[-1]
    source = _code(linecache.getline(real, lineno))
    if not source:
        return None
    missing = exc.args[0] if isinstance(exc, KeyError) and exc.args else _MISSING
    guard = _guard(real, lineno, source)
    names = []
    read = [*_names(source), *(_names(guard) if guard else [])]
    for dotted in dict.fromkeys(p for n in read for p in _prefixes(n)):
        value = _lookup(frame, dotted)
        if value is _MISSING:
            continue
        entry = {"name": dotted, "text": _described(value), "none": value is None, "zero": _is_zero(value)}
        entry["false"] = value is False
        entry["empty"] = type(value).__name__ if isinstance(value, list | tuple) and not value else None
        if isinstance(value, dict):
            entry["keys"] = [repr(k)[:60] for k in list(value)[:SITE_KEYS]]
            entry["lacks"] = missing is not _MISSING and missing not in value
        names.append(entry)
        if len(names) == SITE_NAMES:
            break
    return {
        "where": f"{(shown or _shown)(real)}:{lineno}",
        "function": function,
        "source": source[:300],
        "types": [c.__name__ for c in type(exc).__mro__ if c is not object][:16],
        "message": str(exc)[:300],
        "key": None if missing is _MISSING else repr(missing)[:60],
        "guard": guard,
        "names": names,
    }


_NO_GPU = ("Cannot access accelerator device", "Torch not compiled with CUDA", "Found no NVIDIA driver",
           "no CUDA GPUs are available", "CUDA driver initialization failed")  # fmt: skip
_BUFFER_NAMES = re.compile(r"(attn\.bias|masked_bias|mask|inv_freq|rotary|cos_cached|sin_cached|freqs)")


def _message_reading(name: str, site: dict, entries: dict, read: list[str]) -> tuple[list[str], list[str]]:
    """Causes the exception's message states itself, where the raising line agrees: a call that needs a GPU on a
    machine without one; a strict ``load_state_dict`` missing keys (buffers registered persistent, or weights the
    loading does not fill); a value read from a tensor on the meta device."""
    message, where, source = site["message"], site["where"], site["source"]
    if any(text in message for text in _NO_GPU):
        return [
            f"likely cause: {name} runs something that needs a GPU (`{source}` at {where}), and this machine has "
            f"none: the protocol's calls run where their inputs and device argument say (the CPU here); fix: pin "
            f"memory, move or allocate on CUDA only when the device asked for is CUDA (evidence: the message)"
        ], ["crash_needs_gpu"]
    missing = re.search(r"Missing key\(s\) in state_dict: (.+?)\.(?:\s|$)", message)
    if missing and "load_state_dict" in source:
        keys = re.findall(r'"([^"]+)"', missing.group(1))
        buffers = bool(keys) and all(_BUFFER_NAMES.search(k) for k in keys)
        what = (
            "buffers the model registers as persistent (a causal mask, a rotary table), which the canonical weights "
            "do not carry; fix: register them with persistent=False, or load with strict=False and check that every "
            "weight was filled"
            if buffers
            else "entries the loading does not fill from the canonical weights; fix: convert every canonical weight "
            "to the model's name for it, and keep buffers out of the state dict (persistent=False)"
        )
        shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
        return [
            f"likely cause: {name} loads the weights strictly (`{source}` at {where}) and the model expects keys the "
            f"weights lack ({shown}): {what} (evidence: the message lists the missing keys)"
        ], ["crash_state_dict_keys"]
    ambiguous = "Boolean value of Tensor with more than one value is ambiguous" in message
    truth = re.search(r"\b(and|or|not)\b|^(?:el)?if\b|^while\b|\bif\b.+\belse\b", source)
    if ambiguous and truth:
        return [
            f"likely cause: {name} takes the truth value of a tensor of several values in Python (`{source}` at "
            f"{where}): Python's and / or / not, an if or a while on a tensor need one True or False; fix: combine "
            "tensors elementwise (&, |, ~, torch.logical_and) and branch with torch.where, or reduce first (.any(), "
            ".all()) where one answer is meant (evidence: the message, at a line that takes a truth value)"
        ], ["crash"]
    view = re.search(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\.view\(", source)
    if view and "view size is not compatible with input tensor's size and stride" in message:
        text = entries.get(view.group(1), {}).get("text")
        held = f" ({text})" if text else ""
        return [
            f"likely cause: {name} calls .view on `{view.group(1)}`{held}, whose memory is not contiguous (`{source}` "
            f"at {where}): a slice or transpose, such as ids[:, 1:], cannot be flattened by a view; inputs and "
            "intermediates of any memory layout are allowed (amendment 30); fix: reshape instead of view (or "
            ".contiguous() first) (evidence: the message, at a line that calls .view)"
        ], ["crash"]
    if "meta tensors" in message or "on meta" in message:
        meta = [n for n in read if n in entries and "on meta" in (entries[n].get("text") or "")]
        if len(meta) == 1:
            return [
                f"likely cause: {name} reads the value of `{meta[0]}`, a tensor on the meta device (`{source}` at "
                f"{where}): a tensor made on the default device (meta, under torch.device('meta')) where a real value "
                f"is needed; fix: make such tensors on the CPU explicitly (a seed, a count), or keep values in Python "
                f"numbers (evidence: the message, and `{meta[0]}` is on meta)"
            ], ["crash_meta_value"]
    return [], []


def _guard(path: str, lineno: int, source: str) -> str | None:
    """The condition of the ``if`` that guards a ``raise`` at ``lineno`` (the nearest line above it, indented less,
    that opens an ``if`` or ``elif`` on one line), without its colon; None for any other line."""
    if not source.startswith("raise"):
        return None
    indent = len(linecache.getline(path, lineno)) - len(linecache.getline(path, lineno).lstrip())
    for above in range(lineno - 1, max(lineno - 12, 0), -1):
        line = linecache.getline(path, above)
        text = _code(line)
        if not text:
            continue
        if len(line) - len(line.lstrip()) < indent:
            match = re.match(r"(?:el)?if (.+):$", text)
            return match.group(1)[:200] if match else None
    return None


_SITE_FIELDS = {"where": str, "function": str, "source": str, "message": str}
_NAME_FIELDS = {"name": str, "none": bool, "zero": bool}
_NAME_OPTIONAL = ("text", "empty", "keys", "lacks", "false")


def checked_site(data) -> dict | None:
    """A site record received from a worker, checked field by field and its text made plain (``plain_text``); None
    where it is None. Raises ``ValueError`` naming the first field out of shape."""
    from ..text import plain_text

    if data is None:
        return None
    if type(data) is not dict or set(data) != {*_SITE_FIELDS, "types", "key", "guard", "names"}:
        raise ValueError("a site record needs exactly where, function, source, types, message, key, guard, names")
    for field, kind in _SITE_FIELDS.items():
        if type(data[field]) is not kind:
            raise ValueError(f"a site record's {field} must be a {kind.__name__}")
    types, key, names = data["types"], data["key"], data["names"]
    if type(types) is not list or len(types) > 16 or not all(type(t) is str for t in types):
        raise ValueError("a site record's types must be a list of at most 16 strings")
    if key is not None and type(key) is not str:
        raise ValueError("a site record's key must be a string or null")
    if data["guard"] is not None and type(data["guard"]) is not str:
        raise ValueError("a site record's guard must be a string or null")
    if type(names) is not list or len(names) > SITE_NAMES * 4:
        raise ValueError(f"a site record's names must be a list of at most {SITE_NAMES * 4}")
    out = []
    for entry in names:
        if type(entry) is not dict or not set(_NAME_FIELDS) <= set(entry) <= {*_NAME_FIELDS, *_NAME_OPTIONAL}:
            raise ValueError("a site record's name entry has unknown or missing fields")
        if any(type(entry[f]) is not kind for f, kind in _NAME_FIELDS.items()):
            raise ValueError("a site record's name entry has fields of the wrong type")
        for f in ("text", "empty"):
            if entry.get(f) is not None and type(entry[f]) is not str:
                raise ValueError(f"a site record's name entry's {f} must be a string or null")
        keys = entry.get("keys")
        if keys is not None and (type(keys) is not list or len(keys) > SITE_KEYS or {type(k) for k in keys} - {str}):
            raise ValueError(f"a site record's keys must be a list of at most {SITE_KEYS} strings")
        if any(f in entry and type(entry[f]) is not bool for f in ("lacks", "false")):
            raise ValueError("a site record's lacks and false must be bools")
        clean = {f: entry[f] for f in _NAME_FIELDS}
        clean["name"] = plain_text(entry["name"], 120)
        clean.update({f: plain_text(entry[f], 120) for f in ("text", "empty") if entry.get(f) is not None})
        if keys is not None:
            clean["keys"], clean["lacks"] = [plain_text(k, 60) for k in keys], entry.get("lacks", False)
        clean["false"] = entry.get("false", False)
        out.append(clean)
    return {
        **{f: plain_text(data[f], 300) for f in _SITE_FIELDS},
        "types": [plain_text(t, 100) for t in types],
        "key": None if key is None else plain_text(key, 60),
        "guard": None if data["guard"] is None else plain_text(data["guard"], 200),
        "names": out,
    }


def site_lines(name: str, exc: BaseException | None) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: what the line ``name``'s call raised at read (``read_site``, or the record a worker sent
    with the error, ``exc.site``). Where the line pins the cause (the readings of the module's docstring, each
    naming exactly one value or a message that says its own cause), that cause with its code; else a note with the
    values the line names. Nothing where no own frame or no value is known."""
    site = exc.site if hasattr(exc, "site") else read_site(exc)
    if not site:
        return [], []
    source, where, types, message = site["source"], site["where"], set(site["types"]), site["message"]
    entries = {e["name"]: e for e in site["names"]}
    read = [n for n in _names(source) if n in entries]
    if "ZeroDivisionError" in types:
        zeros = [d for d in _divisors(source) if d in entries and entries[d]["zero"]]
        if len(zeros) == 1:
            return [
                f"likely cause: {name} divides by `{zeros[0]}`, which is 0 for this call, at {where} (`{source}`); "
                f"fix: give it a value that cannot be 0 for any input the protocol allows, or guard the division "
                f"(evidence: the division by it raised)"
            ], ["crash_zero_divisor"]
    if "UnboundLocalError" in types and (m := re.search(r"local variable '(\w+)'", message)):
        return [
            f"likely cause: {name} reads `{m.group(1)}` at {where} (`{source}`) on a path where nothing assigned it: "
            f"it is assigned only under some condition (an option's branch, a flag). Fix: give it a value on every "
            f"path (None where the branch does not apply) (evidence: UnboundLocalError)"
        ], ["crash_unbound"]
    if "RuntimeError" in types and "modified by an inplace operation" in message:
        return [
            f"likely cause: {name}'s backward pass raises because the forward pass changed in place a tensor "
            f"autograd saved for it (x += y, x.add_(y), an in-place activation or norm on a residual): the forward "
            f"alone runs, every gradient through it raises. Fix: compute out of place (x = x + y) on tensors the "
            f"graph still needs (evidence: autograd's version check)"
        ], ["crash_inplace_autograd"]
    if "KeyError" in types and site["key"] is not None:
        lacking = [n for n in read if entries[n].get("lacks")]
        if len(lacking) == 1:
            held = ", ".join(entries[lacking[0]]["keys"])
            return [
                f"likely cause: {name} reads key {site['key']} of `{lacking[0]}` at {where} (`{source}`), and the dict "
                f"it was given has no such key (it holds {held or 'nothing'}): a key the protocol leaves optional or "
                f"spells another way; fix: read it with a default, or accept every spelling the protocol allows "
                f"(evidence: the lookup raised KeyError)"
            ], ["crash_missing_key"]
    if "IndexError" in types and "index out of range" in message:
        empty = [n for n in read if entries[n].get("empty")]
        if len(empty) == 1:
            return [
                f"likely cause: {name} reaches `{source}` at {where} with `{empty[0]}` empty (a "
                f"{entries[empty[0]]['empty']} of 0 items) and indexes it: a structure that only an "
                f"earlier call or a first write fills (a cache's layers before any forward); fix: handle it empty "
                f"(evidence: the index into the empty sequence raised)"
            ], ["crash_empty_sequence"]
    if types & {"TypeError", "AttributeError"} and "NoneType" in message:
        nones = list(dict.fromkeys(p for n in _names(source) for p in _prefixes(n) if entries.get(p, {}).get("none")))
        if len(nones) == 1:
            return [
                f"likely cause: {name} reaches `{source}` at {where} with `{nones[0]}` None (an optional argument, "
                f"weight or setting the code assumes is given); fix: handle None there, or give it the value None "
                f"stands for (evidence: the operation on None raised)"
            ], ["crash_none_value"]
    found = _message_reading(name, site, entries, read)
    if found[0]:
        return found
    guard = site.get("guard")
    if guard:
        guarded = [n for n in _names(guard) if n in entries]
        nones = [n for n in guarded if entries[n]["none"] and re.search(rf"\b{re.escape(n)} is None\b", guard)]
        if len(nones) == 1:
            return [
                f"likely cause: {name} raises at its own check `if {guard}` ({where}): `{nones[0]}` is None for this "
                f"call (an optional argument or setting the caller leaves out, or a path that never sets it); fix: "
                f"pass it where it is needed, or give None a meaning there (evidence: the check that raised tests "
                f"for None, and `{nones[0]}` holds None)"
            ], ["crash_none_value"]
        held = [f"{n} = {entries[n]['text']}" for n in guarded if entries[n].get("text") is not None][:MAX_VALUES]
        if held:
            return [
                f"note: {name} raised at its own check `if {guard}` ({where} in {site['function']}), with "
                f"{', '.join(held)}: see whether the check or its caller is wrong for this input"
            ], []
    if source.startswith("assert ") and "AssertionError" in types:
        condition = source[len("assert ") :].split(",")[0].strip()
        flag = condition.removeprefix("not ").strip()
        if flag in entries and (entries[flag]["false"] or entries[flag]["none"]) == (flag == condition):
            held = entries[flag]["text"]
            return [
                f"likely cause: {name} stops at `assert {condition}` ({where}): `{flag}` is {held} on this path (a "
                f"flag or state the code expects an earlier call to set: a training mode, an init step); fix: set it "
                f"on every path that reaches the assert, or drop the assert where the protocol allows the call "
                f"(evidence: the asserted value)"
            ], ["crash_flag"]
    values = [f"{n} = {entries[n]['text']}" for n in read if entries[n].get("text") is not None][:MAX_VALUES]
    if not values:
        return [], []
    return [f"note: where it raised, {where} in {site['function']} (`{source}`), held {', '.join(values)}"], []


def _code(line: str) -> str:
    """A line of source without its trailing comment (a ``#`` outside string literals)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:i].strip()
    return line.strip()


def _is_zero(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.device.type != "meta" and value.item() == 0
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0
