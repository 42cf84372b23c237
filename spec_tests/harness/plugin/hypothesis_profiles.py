"""The suite's Hypothesis profiles. They apply to the suite's own property tests only: nothing here
changes Hypothesis's global settings, so other projects' tests in the same environment keep theirs.

- ``spec-dev``: randomised, 40 examples, shrinking (a small failing example);
- ``spec-ci`` (the default) and ``spec-grading``: derandomised, 10 examples, no shrinking (a failing
  run stops at the first counterexample), no example database.
"""

from __future__ import annotations

import os

PROFILES = {
    # name: (max_examples, derandomize)
    "spec-dev": (40, False),
    "spec-ci": (10, True),
    "spec-grading": (10, True),
}
DEFAULT = "spec-ci"
ENV = "SPEC_HYPOTHESIS_PROFILE"


def register() -> None:
    from hypothesis import HealthCheck, Phase, settings

    for name, (examples, derandomize) in PROFILES.items():
        phases = tuple(Phase) if not derandomize else (Phase.explicit, Phase.reuse, Phase.generate)
        settings.register_profile(
            name,
            max_examples=examples,
            derandomize=derandomize,
            deadline=None,
            database=None if derandomize else settings.default.database,
            print_blob=False,
            phases=phases,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.function_scoped_fixture,
            ],
        )


def current_profile(config) -> str:
    """``--spec-hypothesis-profile`` when given, else ``--hypothesis-profile`` when it names one of the
    suite's profiles, else ``$SPEC_HYPOTHESIS_PROFILE``, else ``spec-ci``.

    Hypothesis's own ``--hypothesis-profile`` also switches every other test of the session (a host
    project's too); ``--spec-hypothesis-profile`` switches the suite's property tests only."""
    host = config.getoption("hypothesis_profile", None)
    return (
        config.getoption("spec_hypothesis_profile", None)
        or (host if host in PROFILES else None)
        or os.environ.get(ENV)
        or DEFAULT
    )


def apply(items, config) -> None:
    """Give the suite's Hypothesis tests (and only them) the current profile's settings."""
    from hypothesis import settings

    register()
    profile = settings.get_profile(current_profile(config))
    from ... import inputs

    seeded = inputs.spec_seed() != inputs.DEFAULT_SEED
    done = set()
    for item in items:
        fn = getattr(item, "obj", None)
        inner = getattr(fn, "hypothesis", None)
        if inner is None or id(fn) in done:
            continue
        done.add(id(fn))
        fn._hypothesis_internal_use_settings = profile
        # A spec seed gives every property test its own seed (as ``@hypothesis.seed`` does, which wins
        # over derandomisation): other examples per spec seed, the same ones for the same seed.
        fn._hypothesis_internal_use_seed = (
            inputs.mixed(0, salt=f"hypothesis:{fn.__module__}.{fn.__qualname__}") if seeded else None
        )
