"""The documented layering (docs/architecture.md), enforced from the import graph.

protocol <- harness <- spec tests <- tools: each layer imports only the layers above it. The reference and
the student skeleton import nothing of the suite (the reference is the ground truth the harness calls; a
skeleton handed to students must run alone). The spec tests never import the bug catalog (handouts ship
without it). Every import counts, those inside functions too. The edges that cross the rule today are
listed in ``ALLOWED`` with the reason each one stays; a new one fails here until it is justified there.
Within the harness's subsystems (plugin, subject, judging, diagnosis, remote), no two modules import each
other, directly or around a cycle.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {  # folder -> the import name it is installed as (pyproject.toml)
    "spec_tests": "spec_tests",
    "spec_grading": "spec_grading",
    "spec_adapters": "spec_adapters",
    "reference": "reference",
    "student": "student",
}

# (importing module, imported module) -> why the edge stays
ALLOWED = {
    **{
        (f"spec_tests.harness.{m}", "spec_tests.inputs"): "the seeded input helpers the harness binds to a device "
        "and a grading seed (--spec-seed) and hands to the tests; they ship beside the tests in the handout"
        for m in (
            "judging.spec",
            "judging.expectations.recording",
            "judging.expectations.replay",
            "plugin.hypothesis_profiles",
            "plugin.hooks",
        )
    },
    ("spec_tests.harness.diagnosis.catalog", "spec_tests.bugs"): "known-bug matching reads the catalog where it is "
    "installed (imported lazily: handouts and the sandbox hide it)",
    ("spec_tests.harness.subject.loading", "spec_tests.bugs"): "--impl=bug:NAME loads a catalogued bug",
    ("spec_tests.harness.subject.loading", "spec_adapters.cs336"): "--impl=cs336:PATH goes through the CS336 bridge",
    (
        "spec_tests.harness.plugin.markers",
        "spec_tests.bug_classes",
    ): "the bug_class marker checks its names against the vocabulary of classes (data, shipped in handouts)",
    ("spec_tests.harness.remote.sandbox", "spec_tests"): "locates the package's folder to mount it read-only",
    ("spec_tests.harness.subject.subject", "reference"): "the reference is a Subject: the ground truth",
}


def layer(module: str) -> str | None:
    if module.startswith("spec_tests.protocol"):
        return "protocol"
    if module.startswith("spec_tests.harness"):
        return "harness"
    if module == "spec_tests.bugs" or module.startswith("spec_tests.bugs."):
        return "bugs"
    if module == "spec_tests" or module.startswith("spec_tests."):
        return "tests"
    for name in ("spec_grading", "spec_adapters"):
        if module == name or module.startswith(name + "."):
            return "tools"
    for name in ("reference", "student"):
        if module == name or module.startswith(name + "."):
            return name
    return None


# layer -> the layers it may import besides its own
MAY_IMPORT = {
    "protocol": set(),
    "reference": set(),
    "student": set(),
    "harness": {"protocol"},
    "tests": {"protocol", "harness"},
    "bugs": {"protocol", "harness", "tests", "reference"},
    "tools": {"protocol", "harness", "tests", "bugs", "reference", "student"},
}


def module_name(path: Path, folder: Path, package: str) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """Every module ``path`` imports: ``from pkg import name`` is ``pkg.name`` where that is a module, else ``pkg``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return found


@functools.cache  # the checkout's graph serves three tests; each test's own tree is built before it is read
def import_graph(root: Path) -> dict[str, set[str]]:
    """Every module of the suite's packages under root -> the modules it imports (anything else too); read only."""
    modules: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            modules[module_name(path, root / folder, package)] = path
    return {module: imports_of(path, module, set(modules)) for module, path in modules.items()}


def cross_layer_edges(root: Path) -> list[tuple[str, str]]:
    """(importer, imported) pairs against ``MAY_IMPORT``, over every module of the suite's packages under root."""
    edges = set()
    for module, targets in import_graph(root).items():
        for target in targets:
            a, b = layer(module), layer(target)
            if a and b and a != b and b not in MAY_IMPORT[a]:
                edges.add((module, target))
    return sorted(edges)


HARNESS_SUBSYSTEMS = ("plugin", "subject", "judging", "diagnosis", "remote")


def harness_cycles(root: Path) -> list[list[str]]:
    """The import cycles among the modules of the harness's subsystems (strongly connected components of
    more than one module, or a module importing itself), each sorted."""
    prefixes = tuple(f"spec_tests.harness.{s}" for s in HARNESS_SUBSYSTEMS)
    graph = {m: t for m, t in import_graph(root).items() if m.startswith(prefixes)}
    graph = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_import_crosses_the_documented_layering():
    edges = cross_layer_edges(ROOT)
    new = [f"{a} imports {b} ({layer(a)} -> {layer(b)})" for a, b in edges if (a, b) not in ALLOWED]
    assert not new, "imports against the layering of docs/architecture.md:\n" + "\n".join(new)


def test_every_allowed_edge_still_exists():
    """An allowance that no import needs any more is removed, so the list says what is true."""
    stale = sorted(set(ALLOWED) - set(cross_layer_edges(ROOT)))
    assert not stale, f"ALLOWED lists edges that no longer exist: {stale}"


def test_no_import_cycle_within_the_harness():
    """The harness's modules import each other without a cycle (imports inside functions count): each
    concept lives in one module that the others import, never two modules that need each other."""
    cycles = harness_cycles(ROOT)
    assert not cycles, "import cycles among the harness's modules:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_an_import_cycle_is_caught(tmp_path):
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for init in ("spec_tests", "spec_tests/harness", "spec_tests/harness/judging", "spec_tests/harness/diagnosis"):
        (tmp_path / init).mkdir(parents=True, exist_ok=True)
        (tmp_path / init / "__init__.py").write_text("")
    (tmp_path / "spec_tests/harness/judging/spec.py").write_text("def f():\n    from ..diagnosis import knobs\n")
    (tmp_path / "spec_tests/harness/diagnosis/knobs.py").write_text("from ..judging.spec import f\n")
    assert harness_cycles(tmp_path) == [["spec_tests.harness.diagnosis.knobs", "spec_tests.harness.judging.spec"]]


@pytest.mark.parametrize(
    "where, source",
    [
        ("spec_tests/protocol/names.py", "from ..harness.judging import spec\n"),
        ("reference/model.py", "def f():\n    import spec_tests.inputs\n"),  # inside a function too
        ("spec_tests/test_norms.py", "from spec_tests.bugs import CATALOG\n"),
        ("spec_tests/harness/plugin/terminal.py", "import spec_grading.grade\n"),
    ],
)
def test_an_edge_against_the_layering_is_caught(tmp_path, where, source):
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    packages = ("spec_tests", "spec_tests/protocol", "spec_tests/bugs", "spec_grading")
    packages += tuple(f"spec_tests/harness{sub}" for sub in ("", "/judging", "/plugin"))
    for init in packages:
        (tmp_path / init).mkdir(parents=True, exist_ok=True)
        (tmp_path / init / "__init__.py").write_text("")
    for module in ("spec_tests/harness/judging/spec.py", "spec_tests/inputs.py", "spec_grading/grade.py"):
        (tmp_path / module).write_text("")
    (tmp_path / where).write_text(source)
    assert cross_layer_edges(tmp_path), (where, source)
