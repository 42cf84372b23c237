"""Loading a catalogued bug: a private copy of the reference package with one source patch.

Each bug lives in its own module namespace ``_spec_bug_<name>`` (and submodules
``_spec_bug_<name>.attention`` ...), imported from in-memory sources by a meta-path finder, so
the live reference and any number of bug copies coexist in one process. Tracebacks show the
patched lines (the loader serves ``get_source``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

from .bug import Bug, replace_once

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "reference"
PREFIX = "_spec_bug_"


def reference_sources() -> dict[str, str]:
    """Module stem -> source text of every file of the reference package."""
    if not (REFERENCE_DIR / "__init__.py").exists():
        raise FileNotFoundError(f"the bug catalog needs the reference sources, not found at {REFERENCE_DIR}")
    return {p.stem: p.read_text() for p in sorted(REFERENCE_DIR.glob("*.py"))}


def apply_patch(bug: Bug, sources: dict[str, str]) -> dict[str, str]:
    """``sources`` with ``bug.old`` replaced by ``bug.new`` in ``bug.file``; the old text must occur once."""
    stem = bug.file.removesuffix(".py")
    if stem not in sources:
        raise ValueError(f"bug {bug.name}: reference/{bug.file} does not exist")
    return {**sources, stem: replace_once(sources[stem], bug.old, bug.new, f"bug {bug.name} in reference/{bug.file}")}


class _SourceLoader(importlib.abc.InspectLoader):
    def __init__(self, source: str, filename: str):
        self.source, self.filename = source, filename

    def get_source(self, fullname):
        return self.source

    def get_filename(self, fullname):
        return self.filename

    def exec_module(self, module):
        exec(compile(self.source, self.filename, "exec", dont_inherit=True), module.__dict__)


class _PatchedPackages(importlib.abc.MetaPathFinder):
    """Serves registered packages (``_spec_bug_<name>[.<stem>]``) from in-memory sources."""

    def __init__(self):
        self.packages: dict[str, tuple[str, dict[str, str]]] = {}  # package -> (label, sources)

    def find_spec(self, fullname, path=None, target=None):
        package, _, stem = fullname.partition(".")
        if package not in self.packages:
            return None
        label, sources = self.packages[package]
        key = stem or "__init__"
        if key not in sources:
            return None
        filename = f"<{label}>/reference/{key}.py"
        loader = _SourceLoader(sources[key], filename)
        spec = importlib.util.spec_from_loader(fullname, loader, origin=filename, is_package=not stem)
        spec.has_location = False
        return spec


_FINDER = _PatchedPackages()


def import_sources(package: str, label: str, sources: dict[str, str]):
    """Import (once) ``sources`` (module stem -> text, with ``__init__``) as the package ``package``.

    ``label`` names the copy in tracebacks (``<label>/reference/<stem>.py``).
    """
    if package in sys.modules:
        return sys.modules[package]
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _FINDER.packages[package] = (label, sources)
    module = importlib.import_module(package)
    for stem in sources:  # import every submodule, so a broken patch fails here
        if stem != "__init__":
            importlib.import_module(f"{package}.{stem}")
    return module


def import_patched(bug: Bug):
    """Import (once) the package ``_spec_bug_<name>``: the reference with ``bug``'s patch applied."""
    return import_sources(PREFIX + bug.name, f"bug:{bug.name}", apply_patch(bug, reference_sources()))
