"""Finding the reference's code elsewhere: function bodies compared as syntax trees.

Used by the handout checks (no reference function may appear in a handout) and by grading (a
submission that contains the reference's functions is flagged for staff). A body counts when it is
substantial: at least ``MIN_NODES`` syntax-tree nodes after its docstring and its argument checks
(``if ...: raise ...``, which the protocol dictates). Short bodies are left out
because independent code writes them the same way (``return sum(p.numel() for p in
model.parameters())``, a three-line stable softmax, a norm module's ``__init__``): the independent
implementations under ``tests/independent`` matched the reference in eight such functions, the
largest 48 nodes. Renaming the function does not hide a copy, renaming its variables does.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

MIN_NODES = 60


def _is_guard(stmt: ast.stmt) -> bool:
    """``if <condition>: raise ...``: argument checks, which the protocol dictates (an independent
    implementation wrote the reference's sampling checks word for word)."""
    return isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Raise)


def _bodies(source: str, filename: str):
    """``(qualified name, digest)`` of every substantial function body in ``source``."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return
    yield from _tree_bodies(tree)


def _tree_bodies(tree: ast.AST):
    """``(name, digest)`` of every substantial function body in a parsed module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body = body[1:]
            body = [stmt for stmt in body if not _is_guard(stmt)]
            if sum(1 for stmt in body for _ in ast.walk(stmt)) < MIN_NODES:
                continue
            dump = "\n".join(ast.dump(stmt, annotate_fields=False, include_attributes=False) for stmt in body)
            yield node.name, hashlib.sha256(dump.encode()).hexdigest()


def reference_bodies(reference_dir: Path | None = None) -> dict[str, str]:
    """digest -> ``reference/<file>:<function>`` for every substantial reference function."""
    if reference_dir is None:
        from .manifest import reference_dir as installed_reference

        reference_dir = installed_reference()
    reference_dir = Path(reference_dir)
    out = {}
    for path in sorted(reference_dir.glob("*.py")):
        for name, digest in _bodies(path.read_text(encoding="utf-8"), str(path)):
            out.setdefault(digest, f"reference/{path.name}:{name}")
    return out


@functools.cache
def _installed_reference_bodies() -> dict[str, str]:
    return reference_bodies()


def find_reference_code(paths, bodies: dict[str, str] | None = None) -> list[str]:
    """``"<file>:<function> is reference/<file>:<function>"`` for each copied function in ``paths``."""
    bodies = _installed_reference_bodies() if bodies is None else bodies
    found = []
    for path in paths:
        path = Path(path)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for name, digest in _bodies(source, str(path)):
            if digest in bodies:
                found.append(f"{path}:{name} is {bodies[digest]}")
    return found


def reference_code_in(tree: ast.AST, label: str, bodies: dict[str, str] | None = None) -> list[str]:
    """``find_reference_code`` for a module already parsed (the static flags parse each file once)."""
    bodies = _installed_reference_bodies() if bodies is None else bodies
    return [f"{label}:{name} is {bodies[digest]}" for name, digest in _tree_bodies(tree) if digest in bodies]
