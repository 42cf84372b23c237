"""Write docs/protocol-inventory.md: every clause of docs/protocol.md, the tests that pin it, and the edge cases
considered for it.

    python tools/protocol_map.py            # rewrite docs/protocol-inventory.md
    python tools/protocol_map.py --check    # exit 1 if the file is out of date or the inventory is incomplete

Three sources, each small enough to check:

- **The clauses** are read from docs/protocol.md: each bullet of "Loading and absence" and "Conventions", each
  table row (by its name), the two paragraphs of "Model" before its table, each numbered amendment. The data
  file docs/protocol-clauses.toml gives each one a stable id and says how it is found (one ``[[clause]]``
  entry each, read by ``load_clauses``); the check fails when a clause of the document has no entry, or an
  entry finds no clause (the document changed).
- **The tests declare what they pin**: a spec test pins the table rows it names in ``@judges(...)`` and the
  clauses its docstring cites, "(protocol: generate, amendment 9)", "(protocol: Conventions, GQA)" (``CITES``
  maps the wordings that are not clause ids; a protocol citation that resolves to no clause is an error).
- **The edge cases** are data, per clause, in docs/protocol-clauses.toml: for each of ``EDGES`` either the
  tests that cover it (a table ``"test_file.py::test_name[param]" = "what it covers"``) or the reason it does
  not apply (a string "n/a: ...", or "@name" for one of the file's shared ``[reasons]``). Tests of the harness
  itself live in ``tests/`` and are named with that prefix (``pinned_by`` lists them for the clauses that are
  rules of the suite rather than of a computation).

The data file is validated as it is read (unknown keys, kinds or edge names, a missing edge, a duplicate id, an
"@name" with no reason): each is an error naming the value and the clause. The check then fails when: the
document is out of date; a clause has no pinning test; an edge case is neither covered nor given a reason; a
listed or cited test no longer exists (parameters are not checked, the function is); a protocol citation
resolves to nothing.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
OUT = ROOT / "docs" / "protocol-inventory.md"
CLAUSE_DATA = ROOT / "docs" / "protocol-clauses.toml"

EDGES = {
    "sizes": "zero, one and boundary sizes",
    "ties": "exact ties",
    "padding": "padded or ignored targets in batched shapes, rows with different counts",
    "state": "state carried in: gradients already present, a filled cache, the module's mode, the global RNG",
    "paths": "every call path that reaches the clause",
    "extremes": "each argument at its documented extremes and defaults",
}
KINDS = ("bullet", "row", "paragraph", "amendment")


@dataclass
class Clause:
    id: str
    kind: str  # "bullet", "row", "paragraph", "amendment"
    match: str  # the row's name, the amendment's number, or the opening words of a bullet or paragraph
    edges: dict[str, str | dict[str, str]]
    pinned_by: tuple[str, ...] = ()
    text: str = ""
    pins: set[str] = field(default_factory=set)


# ------------------------------------------------------------------------------------------------ the data file
class ClauseDataError(ValueError):
    """The clause data file is malformed; the message names the file and every bad value found."""


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load_clauses(path: Path) -> list[Clause]:
    """The clauses of a data file such as docs/protocol-clauses.toml, "@name" edge values resolved through its
    ``[reasons]``; raises ``ClauseDataError`` listing every malformed value (nothing is checked against
    docs/protocol.md or the tests here: ``build`` does that)."""
    name = _shown(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ClauseDataError(f"{name}: not valid TOML: {e}") from e
    problems: list[str] = []
    unknown = sorted(set(data) - {"reasons", "clause"})
    if unknown:
        problems.append(f"unknown top-level keys {unknown} (expected [reasons] and [[clause]] entries)")
    reasons = data.get("reasons", {})
    if not isinstance(reasons, dict):
        problems.append("reasons must be a table of name = 'n/a: reason'")
        reasons = {}
    for key, value in reasons.items():
        if not isinstance(value, str):
            problems.append(f"reasons.{key} must be a string, not {value!r}")
    entries = data.get("clause", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ClauseDataError(f"{name}: clause must be an array of tables ([[clause]] entries)")
    clauses: list[Clause] = []
    seen: set[str] = set()
    used: set[str] = set()
    for n, entry in enumerate(entries, 1):
        cid = entry.get("id")
        where = f"clause {cid}" if isinstance(cid, str) and cid else f"clause #{n} (no id)"
        bad = sorted(set(entry) - {"id", "kind", "match", "pinned_by", "edges"})
        if bad:
            problems.append(f"{where}: unknown keys {bad} (expected id, kind, match, pinned_by, edges)")
        for key in ("id", "match"):
            if not isinstance(entry.get(key), str) or not entry.get(key):
                problems.append(f"{where}: {key} must be a non-empty string, not {entry.get(key)!r}")
        if isinstance(cid, str) and cid:
            if cid in seen:
                problems.append(f"{where}: duplicate id {cid!r}")
            seen.add(cid)
        kind = entry.get("kind")
        if kind not in KINDS:
            problems.append(f"{where}: unknown kind {kind!r} (the kinds are {', '.join(KINDS)})")
        pinned_by = entry.get("pinned_by", [])
        if not isinstance(pinned_by, list) or not all(isinstance(p, str) for p in pinned_by):
            problems.append(f"{where}: pinned_by must be a list of test ids, not {pinned_by!r}")
            pinned_by = []
        edges = entry.get("edges")
        if isinstance(edges, dict):
            for edge in edges:
                if edge not in EDGES:
                    problems.append(f"{where}: unknown edge case {edge!r} (the edge cases are {', '.join(EDGES)})")
            missing = [edge for edge in EDGES if edge not in edges]
            if missing:
                problems.append(f"{where}: edge cases {missing} missing (each needs its tests or an 'n/a: reason')")
        else:
            problems.append(f"{where}: no [clause.edges] table")
            edges = {}
        resolved: dict[str, str | dict[str, str]] = {}
        for edge, value in edges.items():
            if isinstance(value, str) and value.startswith("@"):
                if value[1:] not in reasons:
                    problems.append(
                        f"{where}: edge case {edge!r} is {value!r}, which names no entry of [reasons]"
                        f" (the reasons are {', '.join('@' + r for r in reasons)})"
                    )
                used.add(value[1:])
                resolved[edge] = reasons.get(value[1:], value)
            elif isinstance(value, str) or (
                isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
            ):
                resolved[edge] = value
            else:
                problems.append(
                    f"{where}: edge case {edge!r} must be a reason string or a table of test id = 'what it covers',"
                    f" not {value!r}"
                )
        clauses.append(Clause(str(cid), str(kind), str(entry.get("match")), resolved, tuple(pinned_by)))
    unused = [r for r in reasons if r not in used]
    if unused:
        problems.append(f"reasons {unused} are used by no clause")
    if problems:
        raise ClauseDataError("\n".join(f"{name}: {p}" for p in problems))
    return clauses


# Citation wordings that are not clause ids ("protocol: <wording>"); "Conventions, X" looks X up in CONVENTIONS.
CITES = {
    "Model": "model.config",
    "canonical weight names": "model.weight_names",
    "KV cache": "conventions.kv_cache",
    "RoPE": "conventions.rope",
    "at least one token always kept": "sampling_probs",
    "forward with cache": "forward",
    "Component functions": "@judges",  # the table row(s) the test judges
}
CONVENTIONS = {
    "bottom-right aligned": "conventions.causal",
    "GQA": "conventions.gqa",
    "linear": "conventions.linear",
    "ground truth in float64": "conventions.tensors",
    "inputs are never modified in place": "conventions.tensors",
    "head-major": "conventions.layout",
}
CITATION = re.compile(r"\((course notes|symptoms table|protocol|amendment)[^()]*(?:\([^()]*\)[^()]*)*\)")
AMENDMENT = re.compile(r"amendment (\d+)")


# ------------------------------------------------------------------------------------------------ the document
def protocol_clauses(text: str) -> list[tuple[str, str, str]]:
    """``(kind, key, text)`` of every clause of docs/protocol.md."""
    found: list[tuple[str, str, str]] = []
    section, paragraph, in_amendments = "", [], False

    def flush():
        if paragraph and section == "Model":
            found.append(("paragraph", " ".join(paragraph), " ".join(paragraph)))
        paragraph.clear()

    for line in text.splitlines():
        if line.startswith("## "):
            flush()
            section = line[3:].strip()
            in_amendments = section.startswith(("Project amendments", "Protocol v2"))
            continue
        if in_amendments:
            m = re.match(r"^(\d+)\. (.*)", line)
            if m:
                found.append(("amendment", m.group(1), m.group(2)))
            elif found and found[-1][0] == "amendment" and line.startswith("   ") and not line.strip().startswith("|"):
                kind, key, body = found[-1]
                found[-1] = (kind, key, f"{body} {line.strip()}")
            continue
        if section in ("Loading and absence", "Conventions"):
            if line.startswith("- "):
                found.append(("bullet", line[2:], line[2:]))
            elif line.startswith("  ") and found and found[-1][0] == "bullet":
                kind, key, body = found[-1]
                found[-1] = (kind, f"{key} {line.strip()}", f"{body} {line.strip()}")
            continue
        m = re.match(r"^\| `(\w+)` \| `([^|]*)` \| (.*) \|$", line)
        if m and section in ("Component functions", "Sampling", "Model", "Training and evaluation"):
            flush()
            found.append(("row", m.group(1), f"`{m.group(1)}{m.group(2)}`: {m.group(3)}"))
            continue
        if section == "Model" and not line.startswith("|"):
            if line.strip():
                paragraph.append(line.strip())
            else:
                flush()
    flush()
    return found


def attach_text(clauses: list[Clause], parsed) -> list[str]:
    """Give each clause its text; the problems (a clause of the document without entry, or the reverse)."""
    problems = []
    taken = set()
    for clause in clauses:
        hits = [
            i
            for i, (kind, key, _) in enumerate(parsed)
            if kind == clause.kind
            and (key == clause.match if kind in ("row", "amendment") else key.startswith(clause.match))
        ]
        if len(hits) != 1:
            problems.append(f"clause {clause.id}: {len(hits)} clauses of docs/protocol.md match {clause.match!r}")
            continue
        taken.add(hits[0])
        clause.text = parsed[hits[0]][2]
    for i, (kind, key, _) in enumerate(parsed):
        if i not in taken:
            problems.append(f"docs/protocol.md {kind} {key[:60]!r} has no entry in {_shown(CLAUSE_DATA)}")
    return problems


# ---------------------------------------------------------------------------------------------------- the tests
def test_functions() -> dict[str, ast.FunctionDef]:
    """``file::name`` -> its AST, for spec_tests/test_*.py (file relative to spec_tests) and tests/test_*.py."""
    found = {}
    for folder, prefix in ((ROOT / "spec_tests", ""), (ROOT / "tests", "tests/")):
        for path in sorted(folder.glob("test_*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                    found[f"{prefix}{path.name}::{node.name}"] = node
    return found


def judged(node: ast.FunctionDef) -> list[str]:
    """The names a spec test's ``@judges(...)`` decorator lists (its subjects, not ``uses``)."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "judges":
            return [a.value for a in dec.args if isinstance(a, ast.Constant)]
    return []


def resolve(citation: str, judges: list[str], ids: set[str]) -> tuple[set[str], list[str]]:
    """Clause ids a citation group "(protocol: ...; amendment N ...)" names, and its unresolved protocol parts."""
    hits, unresolved, kind = set(), [], ""
    for part in (p.strip() for p in citation.split(";")):
        head = part.split(":", 1)[0].strip()
        if head in ("course notes", "symptoms table"):
            kind = head
            continue
        if head.startswith("amendment") or head == "protocol":
            kind = "protocol"
        if kind != "protocol":
            continue
        found = {f"amendment.{n}" for n in AMENDMENT.findall(part)}
        items = [i.strip() for i in part.removeprefix("protocol:").split(",")]
        for j, item in enumerate(items):
            if item in ids:
                found.add(item)
            elif item == "Conventions":
                found.update(CONVENTIONS[n] for n in items[j + 1 :] if n in CONVENTIONS)
            elif CITES.get(item) == "@judges":
                found.update(n for n in judges if n in ids)
            elif item in CITES:
                found.add(CITES[item])
        if not found:
            unresolved.append(part)
        hits |= found
    return hits, unresolved


def declared_pins(functions, ids: set[str]) -> tuple[dict[str, set[str]], list[str]]:
    """Clause id -> spec tests declaring it (``@judges`` rows and docstring citations); problems."""
    pins: dict[str, set[str]] = defaultdict(set)
    problems = []
    for test, node in functions.items():
        if test.startswith("tests/"):
            continue
        names = judged(node)
        for name in names:
            if name in ids:
                pins[name].add(test)
        doc = (ast.get_docstring(node) or "").replace("\n", " ")
        for m in CITATION.finditer(doc):
            hits, unresolved = resolve(m.group(0)[1:-1], names, ids)
            for clause in hits:
                pins[clause].add(test)
            problems += [f"{test}: citation {part!r} names no clause of the protocol" for part in unresolved]
    return pins, problems


def base(ref: str) -> str:
    return ref.split("[", 1)[0]


# ---------------------------------------------------------------------------------------------------- the check
def build(clauses: list[Clause] | None = None) -> tuple[list[Clause], list[str]]:
    """The clauses (from docs/protocol-clauses.toml unless given) with their text and pins; the problems."""
    source = load_clauses(CLAUSE_DATA) if clauses is None else clauses
    clauses = [Clause(c.id, c.kind, c.match, dict(c.edges), c.pinned_by) for c in source]
    problems = attach_text(clauses, protocol_clauses(PROTOCOL.read_text()))
    ids = {c.id for c in clauses}
    repeated = sorted(i for i, n in Counter(c.id for c in clauses).items() if n > 1)
    if repeated:
        problems.append(f"duplicate clause ids {repeated}")
    functions = test_functions()
    pins, cite_problems = declared_pins(functions, ids)
    problems += cite_problems
    for c in clauses:
        c.pins = set(pins.get(c.id, ()))
        listed = list(c.pinned_by)
        for edge in EDGES:
            value = c.edges.get(edge)
            if isinstance(value, dict) and value:
                listed += list(value)
            elif not (isinstance(value, str) and value.startswith("n/a: ")):
                problems.append(f"clause {c.id}: edge case {edge!r} has neither tests nor an 'n/a: reason'")
        unknown = set(c.edges) - set(EDGES)
        if unknown:
            problems.append(f"clause {c.id}: unknown edge cases {sorted(unknown)}")
        for ref in listed:
            if base(ref) not in functions:
                problems.append(f"clause {c.id}: {ref} does not exist")
        if not c.pins and not listed:
            problems.append(f"clause {c.id}: no test pins it")
    return clauses, problems


def render(clauses: list[Clause]) -> str:
    def link(ref: str) -> str:
        return f"`{ref}`"

    lines = [
        "# Protocol inventory: every clause, the tests that pin it, the edge cases considered",
        "",
        "Generated by `python tools/protocol_map.py` (CI: `--check`) from `docs/protocol.md`, the spec tests'",
        "`@judges(...)` markers and docstring citations, and the clause and edge-case data in",
        "`docs/protocol-clauses.toml`.",
        "Spec tests are named relative to `spec_tests/`; tests of the suite itself start with `tests/`.",
        "",
        "Edge cases considered for every clause:",
        "",
        *[f"- **{k}**: {v}" for k, v in EDGES.items()],
        "",
        "Each is either covered (the tests, and what they exercise) or marked *n/a* with the reason.",
        "",
        "## Summary",
        "",
        "| clause | pinning tests | edge cases covered | n/a |",
        "|---|---:|---:|---:|",
    ]
    for c in clauses:
        covered = sum(isinstance(c.edges[e], dict) for e in EDGES)
        pinned = (
            c.pins
            | {base(r) for r in c.pinned_by}
            | {base(r) for e in EDGES if isinstance(c.edges[e], dict) for r in c.edges[e]}
        )
        lines.append(f"| [`{c.id}`](#{c.id.replace('.', '')}) | {len(pinned)} | {covered} | {len(EDGES) - covered} |")
    section = None
    headings = {"loading": "Loading and absence", "conventions": "Conventions", "amendment": "Project amendments"}
    for c in clauses:
        group = headings.get(c.id.split(".")[0], "Model" if c.id.startswith("model.") else "Functions")
        if group != section:
            section = group
            lines += ["", f"## {group}"]
        text = c.text if len(c.text) <= 700 else c.text[:697].rsplit(" ", 1)[0] + " ..."
        lines += ["", f"### {c.id}", "", f"> {text}", ""]
        declared = sorted(c.pins)
        if declared:
            lines.append(f"Declared by the tests (`@judges` or a citation): {', '.join(map(link, declared))}.")
        if c.pinned_by:
            lines.append(f"Tests of the suite itself: {', '.join(map(link, c.pinned_by))}.")
        lines += ["", "| edge case | covered by | what / why not |", "|---|---|---|"]
        for edge in EDGES:
            value = c.edges[edge]
            if isinstance(value, str):
                lines.append(f"| {edge} | n/a | {value.removeprefix('n/a: ')} |")
            else:
                for i, (ref, note) in enumerate(value.items()):
                    lines.append(f"| {edge if i == 0 else ''} | {link(ref)} | {note} |")
    return "\n".join(lines).replace("\u00b1", "±") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    try:
        clauses, problems = build()
    except ClauseDataError as e:
        print(e)
        return 1
    text = render(clauses)
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            problems.append(f"{OUT.relative_to(ROOT)} is out of date: run python tools/protocol_map.py")
        print("\n".join(problems) or f"protocol inventory up to date ({len(clauses)} clauses, every one pinned)")
        return 1 if problems else 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(clauses)} clauses)")
    if problems:
        print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
