"""tools/protocol_map.py: the protocol inventory is complete, and its check fails on what makes it stale."""

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pmap(monkeypatch):
    spec = importlib.util.spec_from_file_location("protocol_map_under_test", ROOT / "tools" / "protocol_map.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def with_clause(pmap, clause_id, **changes):
    """CLAUSES with one entry changed (``edges`` entries merged)."""
    out = []
    for c in pmap.CLAUSES:
        if c.id == clause_id:
            edges = {**c.edges, **changes.pop("edges", {})}
            c = dataclasses.replace(c, edges=edges, **changes)
        out.append(c)
    return out


def test_the_repository_inventory_is_complete_and_current(pmap):
    """Every clause of docs/protocol.md has an entry, a pinning test and all six edge cases; the file is current."""
    clauses, problems = pmap.build()
    assert problems == []
    assert len(clauses) == len(pmap.protocol_clauses(pmap.PROTOCOL.read_text()))
    assert pmap.OUT.read_text() == pmap.render(clauses)


def test_a_listed_test_that_no_longer_exists_fails_the_check(pmap, monkeypatch):
    monkeypatch.setattr(
        pmap, "CLAUSES", with_clause(pmap, "generate", edges={"ties": {"test_generation.py::test_gone": "x"}})
    )
    _, problems = pmap.build()
    assert problems == ["clause generate: test_generation.py::test_gone does not exist"]


def test_an_edge_case_without_tests_or_reason_fails_the_check(pmap, monkeypatch):
    monkeypatch.setattr(pmap, "CLAUSES", with_clause(pmap, "evaluate", edges={"ties": "to do"}))
    _, problems = pmap.build()
    assert problems == ["clause evaluate: edge case 'ties' has neither tests nor an 'n/a: reason'"]


def test_a_clause_nothing_pins_fails_the_check(pmap, monkeypatch):
    na = dict.fromkeys(pmap.EDGES, "n/a: nothing")
    monkeypatch.setattr(pmap, "CLAUSES", with_clause(pmap, "amendment.7", edges=na, pinned_by=()))
    _, problems = pmap.build()
    assert problems == ["clause amendment.7: no test pins it"]


def test_a_new_clause_of_the_protocol_needs_an_entry(pmap, monkeypatch, tmp_path):
    text = pmap.PROTOCOL.read_text().replace("- Boolean masks:", "- Padding masks: new.\n- Boolean masks:", 1)
    (tmp_path / "protocol.md").write_text(text)
    monkeypatch.setattr(pmap, "PROTOCOL", tmp_path / "protocol.md")
    _, problems = pmap.build()
    assert problems == ["docs/protocol.md bullet 'Padding masks: new.' has no entry in tools/protocol_map.py CLAUSES"]


def test_citations_resolve_to_clause_ids(pmap):
    ids = {c.id for c in pmap.CLAUSES}
    assert pmap.resolve("protocol: generate, amendment 9", [], ids) == ({"generate", "amendment.9"}, [])
    assert pmap.resolve("course notes: x; protocol: Conventions, GQA", [], ids) == ({"conventions.gqa"}, [])
    assert pmap.resolve("protocol: Component functions", ["silu"], ids) == ({"silu"}, [])
    assert pmap.resolve("protocol: somewhere else", [], ids) == (set(), ["protocol: somewhere else"])


def test_listed_parameter_ids_exist(pmap):
    """The check verifies test functions; this verifies the parametrised ids the inventory names, by collection."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "spec_tests", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    collected = {line.strip().removeprefix("spec_tests/") for line in proc.stdout.splitlines() if "::" in line}
    listed = {ref for c in pmap.CLAUSES for v in c.edges.values() if isinstance(v, dict) for ref in v}
    assert sorted(ref for ref in listed if "[" in ref and ref not in collected) == []
