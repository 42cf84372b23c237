"""Where the project's packages are: found by the import system (a checkout, an editable or a
regular install, or the current folder), without running them (``reference`` imports torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(name: str) -> Path:
    """The folder of the importable package ``name`` (``ImportError`` naming it when there is none)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the package {name!r} is not importable here (is the project installed?)")
    if spec.origin and spec.origin.endswith("__init__.py"):
        return Path(spec.origin).resolve().parent
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def import_root(name: str) -> Path | None:
    """The folder that makes ``name`` importable by putting it on ``sys.path``, where there is one
    (an editable install that maps a package to a folder of another name has none)."""
    folder = package_dir(name)
    return folder.parent if folder.name == name else None
