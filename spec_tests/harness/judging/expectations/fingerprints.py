"""Digests of the inputs an expected value was computed from, so a recording can stand in for the
reference only where the inputs are the same."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

import torch


def _feed(h, value) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, Mapping):
        h.update(f"D{len(value)}".encode())
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
    elif isinstance(value, list | tuple):
        h.update(f"L{len(value)}".encode())
        for v in value:
            _feed(h, v)
    elif isinstance(value, float):
        h.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, bool | int | str | bytes | type(None) | torch.dtype):
        h.update(f"S{value!r}".encode())
    elif isinstance(value, torch.device):
        h.update(b"device")  # the same inputs on another device are the same inputs
    elif isinstance(value, torch.Generator):
        h.update(b"G" + value.get_state().numpy().tobytes())
    else:
        h.update(f"O{type(value).__qualname__}".encode())


def fingerprint(args) -> str:
    """A digest of the values of ``args`` (tensors by dtype, shape and bytes; device ignored)."""
    h = hashlib.sha256()
    _feed(h, args)
    return h.hexdigest()[:32]


def normalize_key(key: str) -> str:
    """A key independent of where pytest's rootdir is: the part after ``spec_tests/``."""
    return key.split("spec_tests/", 1)[-1]


def key_prefix(key: str) -> str:
    """The key without its ``#n`` counter (same test and label, any occurrence)."""
    return key.rsplit("#", 1)[0]
