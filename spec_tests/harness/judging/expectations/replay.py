"""Replaying recorded expected values (``--spec-replay DIR``, or the suite's own
``spec_tests/recorded/`` when it ships one, as a student handout does).

A recording is used only after its SHA-256 matches the digest written beside it. An input whose
fingerprint was not recorded is a one-line failure saying so, never a silently wrong comparison.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path

import torch

from ..compare import mismatch
from ..spec import SpecFailure
from .fingerprints import fingerprint, key_prefix, normalize_key
from .recording import FORMAT, file_digest, recording_path

_LOADED: dict[str, dict] = {}


class RecordingMiss(SpecFailure):
    """A check whose inputs the recording does not hold."""


def load_recording(path) -> dict:
    """Read a recording file after verifying its digest (plain data only: ``weights_only=True``)."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".sha256")
    try:
        want = sidecar.read_text().strip()
    except OSError as exc:
        raise ValueError(f"recorded expected values {path}: no digest to verify it against ({exc})") from None
    try:
        got = file_digest(path)
        if got != want:
            raise ValueError(
                f"recorded expected values {path}: its SHA-256 {got[:16]}... does not match the recorded "
                f"{want[:16]}...: the file was modified; record it again"
            )
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise ValueError(f"recorded expected values {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"recorded expected values {path}: not a format-{FORMAT} recording")
    return data


def loaded(path: Path) -> dict:
    """A recording read once per process."""
    key = str(path.resolve())
    if key not in _LOADED:
        _LOADED[key] = load_recording(path)
    return _LOADED[key]


def to_device(value, device: str):
    """A fresh copy of a recorded value, tensors on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.clone().to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return copy.copy(value)


class ReplayExpectations:
    """Expected values read back from a recording; no reference (and no bug catalog) needed."""

    live = False

    def __init__(self, data: dict, device: str, source: str):
        self.data, self.device, self.source = data, device, source
        self.entries: dict[str, dict] = data["entries"]
        self.by_fingerprint: dict[tuple[str, str], str] = {}
        self.prefixes: set[str] = set()
        for key, entry in self.entries.items():
            self.by_fingerprint.setdefault((key_prefix(key), entry["fingerprint"]), key)
            self.prefixes.add(key_prefix(key))
        self.served: dict[str, str] = {}  # the key asked for -> the recorded entry that answered it

    def value(self, key: str, compute, inputs=()):
        key = normalize_key(key)
        fp = fingerprint(inputs)
        found = key
        entry = self.entries.get(key)
        if entry is None or entry["fingerprint"] != fp:
            found = self.by_fingerprint.get((key_prefix(key), fp))
            entry = self.entries.get(found) if found else None
        if entry is None:
            self._miss(key)
        self.served[key] = found
        return to_device(entry["value"], self.device)

    def observe_check(self, key: str, subject: str, compute_on) -> None:
        pass

    def known_bugs(self, key: str, subject: str, compute_on, actual, tol) -> list:
        """Recorded bug outputs for this check's inputs that match ``actual``."""
        entry = self.entries.get(self.served.get(normalize_key(key), ""), {})
        catalog = self.data.get("catalog", {})
        return [
            types.SimpleNamespace(name=name, **catalog[name])
            for name, out in entry.get("bugs", {}).items()
            if name in catalog and mismatch(actual, to_device(out, self.device), tol) is None
        ]

    def _miss(self, key: str):
        reason = self.data.get("unrecordable", {}).get(key)
        if reason is None and key_prefix(key) in self.prefixes:
            try:  # a shrinking Hypothesis example the recording never saw: not a valid example
                from hypothesis import reject
                from hypothesis.control import currently_in_test_context

                if currently_in_test_context():
                    reject()
            except ImportError:
                pass
        why = (
            f"its expected value could not be recorded ({reason})"
            if reason
            else f"the recording ({self.source}, torch {self.data.get('torch')}) holds no expected value for these "
            "inputs; they differ from the ones recorded (another torch version may draw other random inputs)"
        )
        raise RecordingMiss(f"cannot check {key}: {why}. This check needs the live reference.")


def replay_for(directory: Path, rope_style: str, device: str) -> ReplayExpectations:
    path = recording_path(directory, rope_style)
    if not path.exists():
        found = sorted(p.name for p in directory.glob("expected-*.pt")) if directory.is_dir() else []
        raise ValueError(
            f"no recorded expected values for ROPE_STYLE={rope_style!r}: {path} does not exist"
            f" (found: {', '.join(found) or 'none'})"
        )
    from .... import inputs

    data = loaded(path)
    recorded_seed = data.get("seed", inputs.DEFAULT_SEED)
    if recorded_seed != inputs.spec_seed():
        raise ValueError(
            f"{path.name} holds expected values for the inputs of spec seed {recorded_seed}, but this run draws its "
            f"inputs from --spec-seed {inputs.spec_seed()}: replay with --spec-seed {recorded_seed}, or check "
            "against the live reference"
        )
    return ReplayExpectations(data, device, source=path.name)
