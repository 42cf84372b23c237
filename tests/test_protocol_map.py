"""tools/protocol_map.py: the protocol inventory is complete, and its check fails on what makes it stale."""

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run

ROOT = Path(__file__).resolve().parent.parent


def load_pmap():
    """tools/protocol_map.py as a module of its own (kept in ``sys.modules``: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location("protocol_map_under_test", ROOT / "tools" / "protocol_map.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def pmap():
    return load_pmap()


def with_clause(pmap, clause_id, **changes):
    """The clauses of docs/protocol-clauses.toml with one entry changed (``edges`` entries merged)."""
    out = []
    for c in pmap.load_clauses(pmap.CLAUSE_DATA):
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


def test_a_listed_test_that_no_longer_exists_fails_the_check(pmap):
    _, problems = pmap.build(with_clause(pmap, "generate", edges={"ties": {"test_generation.py::test_gone": "x"}}))
    assert problems == ["clause generate: test_generation.py::test_gone does not exist"]


def test_an_edge_case_without_tests_or_reason_fails_the_check(pmap):
    _, problems = pmap.build(with_clause(pmap, "evaluate", edges={"ties": "to do"}))
    assert problems == ["clause evaluate: edge case 'ties' has neither tests nor an 'n/a: reason'"]


def test_a_clause_nothing_pins_fails_the_check(pmap):
    na = dict.fromkeys(pmap.EDGES, "n/a: nothing")
    _, problems = pmap.build(with_clause(pmap, "amendment.7", edges=na, pinned_by=()))
    assert problems == ["clause amendment.7: no test pins it"]


def test_a_new_clause_of_the_protocol_needs_an_entry(pmap, monkeypatch, tmp_path):
    text = pmap.PROTOCOL.read_text().replace("- Boolean masks:", "- Padding masks: new.\n- Boolean masks:", 1)
    (tmp_path / "protocol.md").write_text(text)
    monkeypatch.setattr(pmap, "PROTOCOL", tmp_path / "protocol.md")
    _, problems = pmap.build()
    assert problems == ["docs/protocol.md bullet 'Padding masks: new.' has no entry in docs/protocol-clauses.toml"]


GOOD = """
[reasons]
pure = "n/a: a function of its arguments only"

[[clause]]
id = "silu"
kind = "row"
match = "silu"
[clause.edges]
sizes = "@pure"
ties = "@pure"
padding = "@pure"
state = "@pure"
extremes = "n/a: no optional arguments"
[clause.edges.paths]
"test_primitives.py::test_silu" = "called directly"
"""


def test_the_data_file_is_read_with_its_reasons_resolved(pmap, tmp_path):
    (tmp_path / "clauses.toml").write_text(GOOD)
    [clause] = pmap.load_clauses(tmp_path / "clauses.toml")
    assert (clause.id, clause.kind, clause.match, clause.pinned_by) == ("silu", "row", "silu", ())
    assert clause.edges["ties"] == "n/a: a function of its arguments only"
    assert clause.edges["paths"] == {"test_primitives.py::test_silu": "called directly"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda t: t.replace('state = "@pure"', 'state = "@pure"\nstates = "@pure"'),
            "clause silu: unknown edge case 'states' (the edge cases are sizes, ties, padding, state, paths, extremes)",
        ),
        (
            lambda t: t.replace('ties = "@pure"', 'ties = "@purr"'),
            "clause silu: edge case 'ties' is '@purr', which names no entry of [reasons] (the reasons are @pure)",
        ),
        (lambda t: t + t.split("\n\n", 1)[1], "clause silu: duplicate id 'silu'"),
        (
            lambda t: t.replace('ties = "@pure"\n', ""),
            "clause silu: edge cases ['ties'] missing (each needs its tests or an 'n/a: reason')",
        ),
        (
            lambda t: t.replace('kind = "row"', 'kind = "rows"'),
            "clause silu: unknown kind 'rows' (the kinds are bullet, row, paragraph, amendment)",
        ),
        (
            lambda t: t.replace('match = "silu"', 'match = "silu"\npinned = []'),
            "clause silu: unknown keys ['pinned'] (expected id, kind, match, pinned_by, edges)",
        ),
    ],
    ids=["unknown-edge", "unresolved-reason", "duplicate-id", "missing-edge", "unknown-kind", "unknown-key"],
)
def test_a_bad_data_file_is_rejected_naming_the_bad_value(pmap, tmp_path, change, message):
    path = tmp_path / "clauses.toml"
    path.write_text(change(GOOD))
    with pytest.raises(pmap.ClauseDataError) as error:
        pmap.load_clauses(path)
    assert str(error.value).splitlines() == [f"{path.resolve()}: {message}"]


def test_the_tool_reports_a_bad_data_file_and_fails(pmap, monkeypatch, tmp_path, capsys):
    (tmp_path / "clauses.toml").write_text(GOOD.replace('state = "@pure"', 'state = "@gone"'))
    monkeypatch.setattr(pmap, "CLAUSE_DATA", tmp_path / "clauses.toml")
    monkeypatch.setattr(sys, "argv", ["protocol_map.py", "--check"])
    assert pmap.main() == 1
    assert "clause silu: edge case 'state' is '@gone'" in capsys.readouterr().out


def test_citations_resolve_to_clause_ids(pmap):
    ids = {c.id for c in pmap.load_clauses(pmap.CLAUSE_DATA)}
    assert pmap.resolve("protocol: generate, amendment 9", [], ids) == ({"generate", "amendment.9"}, [])
    assert pmap.resolve("course notes: x; protocol: Conventions, GQA", [], ids) == ({"conventions.gqa"}, [])
    assert pmap.resolve("protocol: Component functions", ["silu"], ids) == ({"silu"}, [])
    assert pmap.resolve("protocol: somewhere else", [], ids) == (set(), ["protocol: somewhere else"])


@run_ahead
def test_listed_parameter_ids_exist():
    """The check verifies test functions; this verifies the parametrised ids the inventory names, by collection."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "spec_tests", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    collected = {line.strip().removeprefix("spec_tests/") for line in proc.stdout.splitlines() if "::" in line}
    pmap = load_pmap()
    listed = {
        ref for c in pmap.load_clauses(pmap.CLAUSE_DATA) for v in c.edges.values() if isinstance(v, dict) for ref in v
    }
    assert sorted(ref for ref in listed if "[" in ref and ref not in collected) == []
