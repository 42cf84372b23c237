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
from types import FrameType

import torch

MAX_VALUES = 8  # names said per line: a line with more is described by its first ones


def _foreign_roots(*, installed: bool) -> tuple[str, ...]:
    """The suite, torch and Python's standard library; with ``installed``, the adapters, the grader, the tools and
    every installed package too."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # spec_tests/
    roots = [here + os.sep, os.path.dirname(os.path.realpath(torch.__file__)) + os.sep]
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


def _attribute(obj, name: str):
    """``obj.name`` without running a property or ``__getattr__`` of the implementation's (an ``nn.Module``'s
    parameters, buffers and submodules are read from its own dicts)."""
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
    value = frame.f_locals.get(head, _MISSING)
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


def site_lines(name: str, exc: BaseException | None) -> tuple[list[str], list[str]]:
    """``(lines, codes)``: what the line ``name``'s call raised at read. Where the line pins the cause (the readings
    of the module's docstring, each naming exactly one value or a message that says its own cause), that cause with
    its code; else a note with the values the line names. Nothing where no own frame or no value is known."""
    if exc is None or exc.__traceback__ is None:
        return [], []
    frames = _own_frames(exc, libraries=True)
    if not frames:
        return [], []
    real, lineno, function, frame = frames[-1]
    source = _code(linecache.getline(real, lineno))
    if not source:
        return [], []
    where = f"{_shown(real)}:{lineno}"
    if isinstance(exc, ZeroDivisionError):
        zeros = [d for d in _divisors(source) if (v := _lookup(frame, d)) is not _MISSING and _is_zero(v)]
        if len(zeros) == 1:
            return [
                f"likely cause: {name} divides by `{zeros[0]}`, which is 0 for this call, at {where} (`{source}`); "
                f"fix: give it a value that cannot be 0 for any input the protocol allows, or guard the division "
                f"(evidence: the division by it raised)"
            ], ["crash_zero_divisor"]
    if isinstance(exc, UnboundLocalError) and (m := re.search(r"local variable '(\w+)'", str(exc))):
        return [
            f"likely cause: {name} reads `{m.group(1)}` at {where} (`{source}`) on a path where nothing assigned it: "
            f"it is assigned only under some condition (an option's branch, a flag). Fix: give it a value on every "
            f"path (None where the branch does not apply) (evidence: UnboundLocalError)"
        ], ["crash_unbound"]
    if isinstance(exc, RuntimeError) and "modified by an inplace operation" in str(exc):
        return [
            f"likely cause: {name}'s backward pass raises because the forward pass changed in place a tensor "
            f"autograd saved for it (x += y, x.add_(y), an in-place activation or norm on a residual): the forward "
            f"alone runs, every gradient through it raises. Fix: compute out of place (x = x + y) on tensors the "
            f"graph still needs (evidence: autograd's version check)"
        ], ["crash_inplace_autograd"]
    if isinstance(exc, KeyError) and exc.args:
        missing = exc.args[0]
        lacking = [n for n in _names(source) if isinstance(v := _lookup(frame, n), dict) and missing not in v]
        if len(lacking) == 1:
            held = ", ".join(repr(k) for k in list(_lookup(frame, lacking[0]))[:8])
            return [
                f"likely cause: {name} reads key {missing!r} of `{lacking[0]}` at {where} (`{source}`), and the dict "
                f"it was given has no such key (it holds {held or 'nothing'}): a key the protocol leaves optional or "
                f"spells another way; fix: read it with a default, or accept every spelling the protocol allows "
                f"(evidence: the lookup raised KeyError)"
            ], ["crash_missing_key"]
    if isinstance(exc, IndexError) and "index out of range" in str(exc):
        empty = [n for n in _names(source) if isinstance(v := _lookup(frame, n), list | tuple) and not v]
        if len(empty) == 1:
            return [
                f"likely cause: {name} reaches `{source}` at {where} with `{empty[0]}` empty (a "
                f"{type(_lookup(frame, empty[0])).__name__} of 0 items) and indexes it: a structure that only an "
                f"earlier call or a first write fills (a cache's layers before any forward); fix: handle it empty "
                f"(evidence: the index into the empty sequence raised)"
            ], ["crash_empty_sequence"]
    if isinstance(exc, TypeError | AttributeError) and "NoneType" in str(exc):
        nones = list(dict.fromkeys(p for n in _names(source) for p in _prefixes(n) if _lookup(frame, p) is None))
        if len(nones) == 1:
            return [
                f"likely cause: {name} reaches `{source}` at {where} with `{nones[0]}` None (an optional argument, "
                f"weight or setting the code assumes is given); fix: handle None there, or give it the value None "
                f"stands for (evidence: the operation on None raised)"
            ], ["crash_none_value"]
    values = []
    for dotted in _names(source):
        value = _lookup(frame, dotted)
        if value is _MISSING or (text := _described(value)) is None:
            continue
        values.append(f"{dotted} = {text}")
        if len(values) == MAX_VALUES:
            break
    if not values:
        return [], []
    return [f"note: where it raised, {where} in {function} (`{source}`), held {', '.join(values)}"], []


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
        return value.numel() == 1 and value.item() == 0
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0
