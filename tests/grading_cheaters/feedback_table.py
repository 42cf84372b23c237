"""A table copied from the submission's own earlier feedback ("expected 64640, got 70000"): what its
count_parameters said, mapped to what the feedback said was expected, for the configs the tests
used then. The table comes from ``_copied`` (written by ``tests/test_grading_fresh_inputs.py`` from
the handout's configs); without one this is the honest submission.

It gains exactly when grading builds the same configs as the feedback it copied."""

from ._honest import count_parameters as _count

try:
    from ._copied import COUNTS
except ImportError:
    COUNTS = {}


def count_parameters(model):
    mine = _count(model)
    return COUNTS.get(int(mine), mine)
