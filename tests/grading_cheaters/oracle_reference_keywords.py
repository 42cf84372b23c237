"""Oracle abuse: during a root-cause rerun (its rope replaced by the judge's stub), the submission
calls the stub with the reference's own fast-path keywords, rope(table_size=2**24): a table of 16M
positions the reference would build in the judge and keep for the judge's lifetime."""

import sys

import torch


def _stubbed(name):
    pkg = sys.modules[__name__.rpartition(".")[0]]
    fn = getattr(pkg, name, None)
    return getattr(getattr(fn, "__code__", None), "co_name", "") == "oracle_stub"


def rmsnorm(x, weight, eps=1e-5):
    pkg = sys.modules[__name__.rpartition(".")[0]]
    if _stubbed("rope"):
        try:
            pkg.rope(torch.zeros(1, 1, 2, 8), torch.arange(2), style="interleaved", table_size=1 << 24)
        except Exception:  # noqa: BLE001 - refused by the judge: go on with the honest answer
            pass
    from ._honest import rmsnorm as _rmsnorm

    return _rmsnorm(x, weight, eps)
