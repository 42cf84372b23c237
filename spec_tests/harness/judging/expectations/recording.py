"""Recording expected values (``--spec-record DIR``): live values, each kept with the fingerprint of
its inputs, plus the catalogued bugs' outputs for each check, written at the end of the session to
``DIR/expected-<ROPE_STYLE>.pt`` with its SHA-256 beside it (``.sha256``).

Recordings hold plain data only (tensors, numbers, strings, containers) and load with
``torch.load(weights_only=True)``: no code, no reference source.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from ..compare import mismatch
from ..tolerances import EXACT
from .fingerprints import fingerprint, normalize_key
from .live import LiveExpectations

FORMAT = 2
MAX_BUG_BYTES_ENV = "SPEC_RECORD_MAX_BUG_BYTES"  # recorded bug outputs larger than this are dropped


class Unrecordable(TypeError):
    """A value that a recording cannot hold (anything but tensors, numbers, strings, containers)."""


def plain(value):
    """A detached CPU copy of ``value`` made only of types ``torch.load(weights_only=True)`` accepts."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    if isinstance(value, bool | int | float | complex | str | bytes | type(None) | torch.dtype | torch.Size):
        return value
    if isinstance(value, torch.device):
        return torch.device("cpu")
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(plain(v) for v in value)
    raise Unrecordable(f"a {type(value).__qualname__} cannot be recorded")


def nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    return 8


def recording_path(directory, rope_style: str) -> Path:
    """The recording file of one RoPE style inside ``directory``."""
    return Path(directory) / f"expected-{rope_style}.pt"


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_verified(path: Path, data: dict) -> str:
    """Write ``data`` to ``path`` atomically, with its SHA-256 in ``path.sha256``; returns the digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(data, tmp)
    digest = file_digest(tmp)
    os.replace(tmp, path)
    sidecar = path.with_name(path.name + ".sha256")
    sidecar_tmp = sidecar.with_name(sidecar.name + f".tmp{os.getpid()}")
    sidecar_tmp.write_text(digest + "\n")
    os.replace(sidecar_tmp, sidecar)
    return digest


class RecordingExpectations(LiveExpectations):
    """Live values, each also kept (with its inputs' fingerprint) for writing to a recording."""

    def __init__(self, reference, directory, *, profile: str | None = None):
        super().__init__(reference)
        self.rope_style, self.directory, self.profile = reference.rope_style, Path(directory), profile
        self.entries: dict[str, dict] = {}
        self.catalog: dict[str, dict] = {}
        self.unrecordable: dict[str, str] = {}

    def value(self, key: str, compute, inputs=()):
        key = normalize_key(key)
        result = compute(self.reference)
        try:
            self.entries[key] = {"fingerprint": fingerprint(inputs), "value": plain(result), "bugs": {}}
        except Unrecordable as exc:
            self.unrecordable[key] = str(exc)
        return result

    def observe_check(self, key: str, subject: str, compute_on) -> None:
        """Keep the outputs of ``subject``'s catalogued bugs for this check (those that differ)."""
        entry = self.entries.get(normalize_key(key))
        if entry is None:
            return
        from ...diagnosis.catalog import bug_subjects

        limit = int(os.environ.get(MAX_BUG_BYTES_ENV, "-1"))
        for bug, bug_subject in bug_subjects(subject, self.rope_style):
            try:
                out = compute_on(bug_subject)
                if mismatch(out, entry["value"], EXACT) is None:
                    continue
                out = plain(out)
            except Exception:  # noqa: BLE001 - a bug that cannot run on these inputs cannot be the one
                continue
            if 0 <= limit < nbytes(out):
                continue
            entry["bugs"][bug.name] = out
            self.catalog[bug.name] = {
                "explanation": str(bug.explanation),
                "fix": str(bug.fix),
                "bug_class": bug.bug_class,
            }

    def save(self) -> Path:
        from .... import inputs

        path = recording_path(self.directory, self.rope_style)
        write_verified(
            path,
            {
                "format": FORMAT,
                "rope_style": self.rope_style,
                "torch": str(torch.__version__),
                "profile": self.profile,
                "seed": inputs.spec_seed(),  # the spec seed its inputs were drawn from
                "entries": self.entries,
                "catalog": self.catalog,
                "unrecordable": self.unrecordable,
            },
        )
        return path
