"""The independent fixtures are well formed (fast: no suite runs).

Every seeded bug's ``old`` text occurs exactly once in its base file, names are unique snake_case,
accepted cause codes are valid, and every materialized package imports and differs from its base.
The independent implementations import and declare what they are.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from pathlib import Path

import pytest

from spec_tests import protocol
from spec_tests.harness.diagnosis import codes

INDEPENDENT = Path(__file__).resolve().parent / "independent"
sys.path.insert(0, str(INDEPENDENT))
import seeded  # noqa: E402

sys.path.remove(str(INDEPENDENT))


def import_package(folder: Path):
    """Import the package in ``folder`` under a fresh module name (its relative imports work)."""
    name = f"_independent_{folder.name}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
    return module


@pytest.mark.parametrize("base", seeded.BASES)
def test_independent_implementations_expose_the_protocol(base):
    module = import_package(INDEPENDENT / base)
    v1_names = [n for n in protocol.PROTOCOL_NAMES if n not in protocol.CAPABILITY_OF]  # a v2 name comes with its
    missing = [n for n in v1_names if not callable(getattr(module, n, None))]  # capability (amendment 28)
    assert not missing, f"{base} lacks {missing}"
    assert getattr(module, "ROPE_STYLE", protocol.DEFAULT_ROPE_STYLE) in protocol.ROPE_STYLES
    assert set(getattr(module, "FAMILIES", protocol.ALL_FAMILIES)) <= set(protocol.ALL_FAMILIES)
    assert set(getattr(module, "CAPABILITIES", protocol.ALL_CAPABILITIES)) <= set(protocol.ALL_CAPABILITIES)


def test_there_are_enough_seeded_bugs_with_unique_names():
    names = [bug.name for bug in seeded.SEEDED]
    assert len(names) >= 30
    assert len(set(names)) == len(names), "duplicate seeded bug names"
    bad = [n for n in names if not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", n)]
    assert not bad, f"not snake_case: {bad}"


@pytest.mark.parametrize("bug", seeded.SEEDED, ids=lambda b: b.name)
def test_seeded_bug_is_well_formed(bug):
    assert bug.base in seeded.BASES
    assert bug.old != bug.new
    assert bug.mistake and "\n" not in bug.mistake
    assert seeded.source_of(bug).count(bug.old) == 1, f"old text of {bug.name} must occur exactly once"
    invalid = [c for c in bug.accepted if not codes.is_valid(c)]
    assert not invalid, f"invalid cause codes {invalid}"


@pytest.mark.parametrize("bug", seeded.SEEDED, ids=lambda b: b.name)
def test_materialized_bug_imports_and_differs(bug, tmp_path):
    folder = seeded.materialize(bug, tmp_path)
    base = seeded.base_folder(bug.base)
    patched = (folder / bug.file).read_text()
    assert patched != (base / bug.file).read_text()
    assert patched.count(bug.new) >= 1
    unchanged = [
        p.relative_to(base)
        for p in base.rglob("*.py")
        if p.relative_to(base) != Path(bug.file) and p.read_text() != (folder / p.relative_to(base)).read_text()
    ]
    assert not unchanged, f"files other than {bug.file} differ: {unchanged}"
    module = import_package(folder)
    assert callable(module.build_model)
