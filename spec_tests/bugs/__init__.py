"""The bug catalog: the reference with exactly one plausible mistake each.

``--impl=bug:<name>`` runs the suite against one of them (``load_bug``); a failing comparison
tries the bugs of its component on the same inputs (``spec_tests/harness/diagnosis/catalog.py``)
and names the one whose output the implementation reproduces.
``python tools/bugcheck.py`` checks that the suite kills every entry, with margin.

- ``bug.py``: what a bug is (``Bug``: a source patch on one reference file);
- ``classes.py``: the bug classes and the test files meant to catch each;
- ``components.py``, ``attention.py``, ``model.py``, ``sampling.py``, ``training.py``, ``rope_scaling.py``,
  ``padding.py``, ``qkv_bias.py``, ``qk_norm.py``, ``sliding_window.py``, ``logit_softcap.py``,
  ``gemma_style.py``, ``moe.py`` (protocol v2): the entries;
- ``model_components.py``: the model-level ``component=`` names, in one place;
- ``loading.py``: importing a patched private copy of the reference package.
"""

from __future__ import annotations

import functools

from . import (
    attention,
    components,
    gemma_style,
    logit_softcap,
    model,
    moe,
    padding,
    qk_norm,
    qkv_bias,
    rope_scaling,
    sampling,
    sliding_window,
    training,
)
from .bug import Bug
from .classes import BUG_CLASSES, related_files
from .loading import apply_patch, import_patched, reference_sources


def _catalog() -> dict[str, Bug]:
    catalog: dict[str, Bug] = {}
    for group in (
        components,
        attention,
        model,
        sampling,
        training,
        rope_scaling,
        padding,
        qkv_bias,
        qk_norm,
        sliding_window,
        logit_softcap,
        gemma_style,
        moe,
    ):
        for bug in group.BUGS:
            if bug.name in catalog:
                raise ValueError(f"bug name {bug.name!r} is catalogued twice")
            related_files(bug.bug_class)  # an unknown class is an error at import
            catalog[bug.name] = bug
    return catalog


CATALOG: dict[str, Bug] = _catalog()


def get_bug(name: str) -> Bug:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"no catalogued bug named {name!r}; known: {', '.join(CATALOG)}") from None


@functools.cache
def load_bug(name: str):
    """The implementation module of bug ``name`` (package ``_spec_bug_<name>``), loaded once."""
    return import_patched(get_bug(name))


__all__ = [
    "BUG_CLASSES",
    "CATALOG",
    "Bug",
    "apply_patch",
    "get_bug",
    "load_bug",
    "reference_sources",
    "related_files",
]
