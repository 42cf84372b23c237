"""20 MB failure messages and 20 MB printed, hoping for a report too large to use."""

import sys

_BIG = 20_000_000
sys.stdout.write("o" * _BIG)
sys.stderr.write("e" * _BIG)


def rmsnorm(x, weight, eps=1e-5):
    raise ValueError("A" * _BIG)


def rope(x, positions, theta=10000.0):
    raise RuntimeError("B" * _BIG + "\udc80")


def count_parameters(model):
    raise AssertionError("C" * _BIG)
