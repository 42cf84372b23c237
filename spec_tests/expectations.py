"""Where expected values come from: the live reference in float64, or a recording of it.

Every expected value a test needs goes through ``provider.value(key, compute, inputs)``, keyed by
the test id and a per-test label and fingerprinted by its float64 inputs, so that a recording of
them can stand in for the reference where its source is not available (a student handout, or a
grading process that must not see it). Each provider also answers ``diagnose(...)`` for a failed
check (from the live catalog, or from recorded bug outputs) and sees every check through
``observe_check(...)`` (a recording keeps the catalogued bugs' outputs there).

Three providers, chosen by :func:`expectations_for` from the command line:

- ``LiveExpectations``: ``compute(reference)`` on the live (style-bound) reference.
- ``RecordingExpectations`` (``--record-expectations DIR``): live, and every value is kept with a
  fingerprint of the inputs it was computed from, plus, for each ``spec.check``, the outputs of that
  component's catalogued bugs (so that diagnosis works without the catalog). Written at the end of
  the session to ``DIR/expected-<ROPE_STYLE>.pt``.
- ``ReplayExpectations`` (``--replay-expectations DIR``, or the suite's own ``spec_tests/recorded/``
  when it ships one, as a handout does): values come from the recording; an input whose fingerprint
  was not recorded is a one-line failure saying so, never a silently wrong comparison.

Recordings hold plain data only (tensors, numbers, strings, containers) and load with
``torch.load(weights_only=True)``: no code, no reference source.

The reference itself can be run as an implementation in either RoPE style (this is what a
recording pass checks): ``--impl=spec_tests.expectations:reference_interleaved`` or
``...:reference_half``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import re
import struct
import types
from collections.abc import Mapping
from pathlib import Path

import torch

from .assertions import SpecFailure, mismatch
from .protocol import ROPE_STYLES
from .tolerances import EXACT

FORMAT = 1
MAX_BUG_BYTES_ENV = "SPEC_RECORD_MAX_BUG_BYTES"  # recorded bug outputs larger than this are dropped
BUNDLED_DIR = Path(__file__).resolve().parent / "recorded"


def recording_path(directory, rope_style: str) -> Path:
    """The recording file of one RoPE style inside ``directory``."""
    return Path(directory) / f"expected-{rope_style}.pt"


def normalize_key(key: str) -> str:
    """A key independent of where pytest's rootdir is: the part after ``spec_tests/``."""
    return key.split("spec_tests/", 1)[-1]


def _prefix(key: str) -> str:
    """The key without its ``#n`` counter (same test and label, any occurrence)."""
    return key.rsplit("#", 1)[0]


# --------------------------------------------------------------------------------------------
# Fingerprints of inputs
# --------------------------------------------------------------------------------------------


def _feed(h, value) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, torch.nn.Module):
        h.update(f"M{type(value).__name__}".encode())
        _feed(h, dict(value.state_dict()))
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


# --------------------------------------------------------------------------------------------
# Plain data for recordings
# --------------------------------------------------------------------------------------------


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


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 8


def to_device(value, device: str):
    """A fresh copy of a recorded value, tensors on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.clone().to(device)
    if isinstance(value, Mapping):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return copy.copy(value)


# --------------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------------


class LiveExpectations:
    """Computes every expected value from the live (style-bound) reference."""

    def __init__(self, reference):
        self.reference = reference

    def value(self, key: str, compute, inputs=()):
        return compute(self.reference)

    def observe_check(self, key: str, component: str, compute_on) -> None:
        """Called after every ``spec.check``; ``compute_on(module_like)`` recomputes its quantity."""

    def diagnose(self, key: str, component: str, compute_on, actual, tol, rope_style: str) -> str | None:
        from .diagnosis import diagnose

        return diagnose(component, compute_on, actual, tol, rope_style)


class RecordingExpectations(LiveExpectations):
    """Live values, each also kept (with its inputs' fingerprint) for writing to a recording."""

    def __init__(self, reference, rope_style: str, directory, *, profile: str | None = None):
        super().__init__(reference)
        self.rope_style, self.directory, self.profile = rope_style, Path(directory), profile
        self.entries: dict[str, dict] = {}
        self.catalog: dict[str, dict] = {}
        self.unrecordable: dict[str, str] = {}
        self.live_tests: set[str] = set()

    def value(self, key: str, compute, inputs=()):
        key = normalize_key(key)
        result = compute(self.reference)
        try:
            self.entries[key] = {"fingerprint": fingerprint(inputs), "value": plain(result), "bugs": {}}
        except Unrecordable as exc:
            self.unrecordable[key] = str(exc)
        return result

    def observe_check(self, key: str, component: str, compute_on) -> None:
        """Keep the outputs of ``component``'s catalogued bugs for this check.

        ``compute_on(module_like)`` recomputes the check's quantity on the original inputs, exactly as
        ``diagnosis.diagnose`` does. Outputs equal to the reference's (to 1e-10) are not kept, nor
        (for handouts) those larger than ``$SPEC_RECORD_MAX_BUG_BYTES`` bytes.
        """
        entry = self.entries.get(normalize_key(key))
        if entry is None:
            return
        try:
            from .bugs import candidates_for
        except ImportError:
            return
        from .reference_view import StyledReference

        limit = int(os.environ.get(MAX_BUG_BYTES_ENV, "-1"))
        for bug, module in candidates_for(component):
            try:
                out = compute_on(StyledReference(module, self.rope_style, label=f"bug:{bug.name}"))
                if mismatch(out, entry["value"], EXACT) is None:
                    continue
                out = plain(out)
                if 0 <= limit < _nbytes(out):
                    continue
                entry["bugs"][bug.name] = out
            except Exception:  # noqa: BLE001 - a bug that cannot run on these inputs cannot be the one
                continue
            self.catalog[bug.name] = {"explanation": str(bug.explanation), "fix": str(bug.fix)}

    def save(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = recording_path(self.directory, self.rope_style)
        torch.save(
            {
                "format": FORMAT,
                "rope_style": self.rope_style,
                "torch": str(torch.__version__),
                "profile": self.profile,
                "live_tests": sorted(self.live_tests),
                "entries": self.entries,
                "catalog": self.catalog,
                "unrecordable": self.unrecordable,
            },
            path,
        )
        return path


class RecordingMiss(SpecFailure):
    """A check whose inputs the recording does not hold."""


_LOADED: dict[str, dict] = {}


def load_recording(path) -> dict:
    """Read a recording file (plain data only: ``weights_only=True``)."""
    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise ValueError(f"recorded expected values {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"recorded expected values {path}: not a format-{FORMAT} recording")
    return data


def preload(directory) -> list[str]:
    """Read every recording in ``directory`` now (before anything may forbid opening it)."""
    styles = []
    for style in ROPE_STYLES:
        path = recording_path(directory, style)
        if path.exists():
            _LOADED[str(path.resolve())] = load_recording(path)
            styles.append(style)
    return styles


class ReplayExpectations:
    """Expected values read back from a recording; no reference (and no bug catalog) needed."""

    def __init__(self, data: dict, device: str, source: str):
        self.data, self.device, self.source = data, device, source
        self.entries: dict[str, dict] = data["entries"]
        self.by_fingerprint: dict[tuple[str, str], str] = {}
        self.prefixes: set[str] = set()
        for key, entry in self.entries.items():
            self.by_fingerprint.setdefault((_prefix(key), entry["fingerprint"]), key)
            self.prefixes.add(_prefix(key))
        self.served: dict[str, str] = {}  # the key asked for -> the recorded entry that answered it

    def value(self, key: str, compute, inputs=()):
        key = normalize_key(key)
        fp = fingerprint(inputs)
        found = key
        entry = self.entries.get(key)
        if entry is None or entry["fingerprint"] != fp:
            found = self.by_fingerprint.get((_prefix(key), fp))
            entry = self.entries.get(found) if found else None
        if entry is None:
            self._miss(key)
        self.served[key] = found
        return to_device(entry["value"], self.device)

    def observe_check(self, key: str, component: str, compute_on) -> None:
        pass

    def diagnose(self, key: str, component: str, compute_on, actual, tol, rope_style: str) -> str | None:
        """Compare ``actual`` with the bug outputs recorded for this check's inputs."""
        from .diagnosis import describe_matches

        entry = self.entries.get(self.served.get(normalize_key(key), ""), {})
        catalog = self.data.get("catalog", {})
        matches = [
            types.SimpleNamespace(name=name, **catalog[name])
            for name, out in entry.get("bugs", {}).items()
            if name in catalog and mismatch(actual, to_device(out, self.device), tol) is None
        ]
        return describe_matches(matches)

    def _miss(self, key: str):
        reason = self.data.get("unrecordable", {}).get(key)
        if reason is None and _prefix(key) in self.prefixes:
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


# --------------------------------------------------------------------------------------------
# Choosing a provider (called by the plugin)
# --------------------------------------------------------------------------------------------


def reference_available() -> bool:
    try:
        return importlib.util.find_spec("reference") is not None
    except (ImportError, ValueError):
        return False


def replay_directory(config) -> Path | None:
    """The recording directory to replay from, or None to use the live reference.

    ``--replay-expectations`` wins; otherwise a suite that ships recordings (a student handout,
    ``spec_tests/recorded/``) uses them even where a reference happens to be importable.
    """
    if config.getoption("record_expectations", None):
        return None
    explicit = config.getoption("replay_expectations", None)
    if explicit:
        return Path(explicit)
    if BUNDLED_DIR.is_dir() and any(BUNDLED_DIR.glob("expected-*.pt")):
        return BUNDLED_DIR
    return None


def _replay_data(directory: Path, rope_style: str) -> dict:
    path = recording_path(directory, rope_style)
    data = _LOADED.get(str(path.resolve()))
    if data is None:
        if not path.exists():
            found = sorted(p.name for p in directory.glob("expected-*.pt")) if directory.is_dir() else []
            raise ValueError(
                f"no recorded expected values for ROPE_STYLE={rope_style!r}: {path} does not exist"
                f" (found: {', '.join(found) or 'none'})"
            )
        data = _LOADED[str(path.resolve())] = load_recording(path)
    return data


def live_tests_excluded(config) -> bool:
    """True when replaying a recording made without the ``needs_live_reference`` tests."""
    directory = replay_directory(config)
    if directory is None:
        return False
    for style in ROPE_STYLES:
        if recording_path(directory, style).exists():
            return not _replay_data(directory, style).get("live_tests")
    return True


def expectations_for(config, impl, device: str):
    """The provider for this session: live, recording or replaying (see the module docstring)."""
    import pytest

    record_dir = config.getoption("record_expectations", None)
    directory = replay_directory(config)
    if directory is not None:
        try:
            data = _replay_data(directory, impl.rope_style)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        return ReplayExpectations(data, device, source=str(recording_path(directory, impl.rope_style).name))
    if not reference_available():
        raise pytest.UsageError(
            "the reference implementation is not installed and no recorded expected values were found "
            f"(looked for {BUNDLED_DIR}); pass --replay-expectations DIR"
        )
    from .reference_view import StyledReference, reference_module

    reference = StyledReference(reference_module(), impl.rope_style)
    if record_dir:
        from hypothesis import settings

        provider = RecordingExpectations(reference, impl.rope_style, record_dir, profile=settings._current_profile)
        config._spec_recording = provider
        return provider
    return LiveExpectations(reference)


def finish(session) -> None:
    """Write the recording, if this session made one."""
    provider = getattr(session.config, "_spec_recording", None)
    if provider is not None:
        items = getattr(session, "items", [])
        provider.live_tests = {normalize_key(i.nodeid) for i in items if i.get_closest_marker("needs_live_reference")}
        provider.save()


# --------------------------------------------------------------------------------------------
# The reference as an implementation, in either RoPE style
# --------------------------------------------------------------------------------------------


class ReferenceImplementation:
    """The reference bound to one RoPE style, usable as ``--impl`` (for recording passes)."""

    FAMILIES = ("llama", "gpt2")

    def __init__(self, rope_style: str):
        self.ROPE_STYLE = rope_style

    def __getattr__(self, name: str):
        if name.startswith("_") or name.isupper():
            raise AttributeError(name)
        from .reference_view import StyledReference, reference_module

        return getattr(StyledReference(reference_module(), self.ROPE_STYLE), name)


_STYLED = re.compile(r"reference_(\w+)")


def __getattr__(name: str):
    match = _STYLED.fullmatch(name)
    if match and match.group(1) in ROPE_STYLES:
        return ReferenceImplementation(match.group(1))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
