"""Where expected values come from: the live reference in float64, or a recording of it.

Every expected value a test needs goes through ``provider.value(key, compute, inputs)``, keyed by
the test id and a per-test label and fingerprinted by its float64 inputs, so that a recording can
stand in for the reference where its source is not available (a student handout). Each provider
also answers ``known_bugs(...)`` for a failed check (from the live catalog, or from recorded bug
outputs) and sees every check through ``observe_check(...)``.

- ``live.LiveExpectations``: ``compute(reference)`` on the live (style-bound) reference;
- ``recording.RecordingExpectations`` (``--spec-record DIR``): live, and every value kept for a
  recording, with the catalogued bugs' outputs;
- ``replay.ReplayExpectations`` (``--spec-replay DIR``, or ``spec_tests/recorded/``): values from a
  verified recording.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parents[3] / "recorded"


def reference_available() -> bool:
    try:
        return importlib.util.find_spec("reference") is not None
    except (ImportError, ValueError):
        return False


def replay_directory(config) -> Path | None:
    """The recording directory to replay from, or None to use the live reference.

    ``--spec-replay`` wins; otherwise a suite that ships recordings (a student handout,
    ``spec_tests/recorded/``) uses them even where a reference happens to be importable.
    """
    if config.getoption("spec_record", None):
        return None
    explicit = config.getoption("spec_replay", None)
    if explicit:
        return Path(explicit)
    if BUNDLED_DIR.is_dir() and any(BUNDLED_DIR.glob("expected-*.pt")):
        return BUNDLED_DIR
    return None


def expectations_for(config, rope_style: str, device: str):
    """The provider for this session: live, recording or replaying."""
    import pytest

    directory = replay_directory(config)
    if directory is not None:
        from .replay import replay_for

        try:
            return replay_for(directory, rope_style, device)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if not reference_available():
        raise pytest.UsageError(
            "the reference implementation is not installed and no recorded expected values were found "
            f"(looked for {BUNDLED_DIR}); pass --spec-replay DIR"
        )
    from ...subject.subject import reference_subject

    reference = reference_subject(rope_style)
    record_dir = config.getoption("spec_record", None)
    if record_dir:
        from ...plugin.hypothesis_profiles import current_profile
        from .recording import RecordingExpectations

        provider = RecordingExpectations(reference, record_dir, profile=current_profile(config))
        config._spec_recording = provider
        return provider
    from .live import LiveExpectations

    return LiveExpectations(reference)
