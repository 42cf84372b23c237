"""Lone surrogates and control characters in what the grader reports: exception messages and output."""

import sys

from ._honest import rope as _rope


class _Odd(ValueError):
    pass


try:
    sys.stdout.write("printing a lone surrogate \udc80\n")
except UnicodeEncodeError:
    sys.stdout.buffer.write(b"raw bytes \xff\xfe\x00\x1b[31m\n")
sys.stdout.flush()


def rmsnorm(x, weight, eps=1e-5):
    raise _Odd("bad \udc80 value \x1b[31m\x00 red \u2028 \ud800")


def rope(x, positions, theta=10000.0):
    _rope(x, positions, theta)
    raise KeyError("\ud800\udfff\x07")


def count_parameters(model):
    raise RuntimeError("\udcff" * 100)
