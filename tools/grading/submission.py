"""Submissions: finding them, staging a private copy to grade, and static integrity flags.

A submission is a package folder (with ``__init__.py``), a folder holding such a package named
``student/`` (a Gradescope upload of the whole folder), or a single ``.py`` file. A folder that is
none of these but holds submissions is a batch (one submission per entry). ``student`` and
``reference`` name the installed packages of those names (found by the import system).

Graded code runs from a copy named ``submission`` (or ``submission.py``) in a private folder, so
that messages never depend on where or under which name it was uploaded, and nothing is written
into the original.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .packages import package_dir
from .solution_scan import find_reference_code

MAX_FILE_BYTES = 5_000_000


class SubmissionError(ValueError):
    """An ``--impl`` value that is not a gradeable submission."""


@dataclass(frozen=True)
class Submission:
    label: str
    source: Path  # the package folder or the .py file


def _package_in(folder: Path) -> Path | None:
    if (folder / "__init__.py").is_file():
        return folder
    if (folder / "student" / "__init__.py").is_file():
        return folder / "student"
    return None


def discover(values: list[str]) -> list[Submission]:
    """The submissions named by ``--impl`` values (paths, ``student``, ``reference``, batch folders)."""
    found: list[Submission] = []
    for value in values:
        if value in ("student", "reference"):
            found.append(Submission(value, package_dir(value)))
            continue
        path = Path(value)
        if not path.exists():
            raise SubmissionError(
                f"--impl {value}: no such file or folder (give a .py file, a package folder, "
                "a folder of submissions, 'student' or 'reference')"
            )
        if path.is_file():
            if path.suffix != ".py":
                raise SubmissionError(f"--impl {value}: a single-file submission must be a .py file")
            found.append(Submission(path.stem, path))
            continue
        package = _package_in(path)
        if package is not None:
            found.append(Submission(path.resolve().name, package))
            continue
        entries = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
        batch = []
        for entry in entries:
            if entry.is_file() and entry.suffix == ".py":
                batch.append(Submission(entry.stem, entry))
            elif entry.is_dir() and _package_in(entry) is not None:
                batch.append(Submission(entry.name, _package_in(entry)))
        if not batch:
            raise SubmissionError(
                f"--impl {value}: neither a package (no __init__.py, no student/__init__.py) nor a "
                "folder of submissions (.py files or package folders)"
            )
        found += batch
    labels = [s.label for s in found]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise SubmissionError(f"several submissions share the name(s) {dupes}; grade them from separate folders")
    return found


def stage(submission: Submission, into: Path) -> Path:
    """A private copy of the submission under ``into``, readable by the sandbox's unprivileged user
    (files 0644, folders 0755: an upload may come with 0600 modes); returns its path."""
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o755)
    if submission.source.is_file():
        target = into / "submission.py"
        shutil.copyfile(submission.source, target)
        target.chmod(0o644)
        return target
    target = into / "submission"

    def ignore(folder, names):
        return [
            n
            for n in names
            if n in ("__pycache__", ".git")
            or n.endswith((".pyc", ".pt", ".pth", ".bin"))
            or ((Path(folder) / n).is_file() and (Path(folder) / n).stat().st_size > MAX_FILE_BYTES)
        ]

    shutil.copytree(submission.source, target, ignore=ignore, symlinks=False)
    for entry in [target, *target.rglob("*")]:
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    return target


def rope_style(source: Path) -> str | None:
    """The ``ROPE_STYLE = "..."`` a submission declares, read without running it (None: not found)."""
    init = source if source.is_file() else source / "__init__.py"
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    style = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ROPE_STYLE" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                style = node.value.value
            else:
                return None
        if isinstance(node, ast.ImportFrom) and any(a.name in ("ROPE_STYLE", "*") for a in node.names):
            return None
    return style or "interleaved"


SUSPICIOUS = [
    (
        re.compile(r"^\s*(from|import)\s+reference\b|import_module\(\s*['\"]reference|['\"]reference['\"]", re.M),
        "mentions the reference package",
    ),
    (re.compile(r"^\s*(from|import)\s+spec_tests\b|import_module\(\s*['\"]spec_tests", re.M), "imports the test suite"),
    (re.compile(r"\bsys\.modules\b"), "reads sys.modules"),
    (re.compile(r"\bgc\.get_(objects|referrers|referents)\b"), "walks the garbage collector's objects"),
    (
        re.compile(r"\b_getframe\b|\binspect\.(stack|currentframe|getouterframes)\b|\bf_back\b|\bf_locals\b"),
        "inspects the call stack",
    ),
    (re.compile(r"\bctypes\b"), "uses ctypes"),
    (re.compile(r"\b(subprocess|os\.system|os\.popen|os\.exec\w*|os\.fork)\b"), "starts processes"),
    (
        re.compile(r"\bsignal\.(signal|setitimer|alarm)\b|\bresource\.setrlimit\b|\baddaudithook\b"),
        "changes signals, limits or audit hooks",
    ),
    (re.compile(r"expected-\w+\.pt|transformer-spec"), "mentions recorded expected values"),
]


LARGE_DATA_BYTES = 100_000


def large_data(source: Path) -> list[str]:
    """Files or string literals large enough to hold copied expected values (the handout ships a
    recording of the suite's inputs and answers; grading uses the same inputs)."""
    found = []
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for path in files:
        rel = path.name if source.is_file() else str(path.relative_to(source))
        size = path.stat().st_size
        if size > LARGE_DATA_BYTES:
            found.append(f"{rel} is {size // 1000} kB")
            continue
        if path.suffix == ".py":
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            big = [
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str | bytes) and len(n.value) > 20_000
            ]
            if big:
                found.append(f"{rel}:{big[0].lineno} holds a {len(big[0].value) // 1000} kB literal")
    return found


def static_flags(source: Path) -> list[str]:
    """Things in a submission's source that staff may want to look at (never affects the score)."""
    files = [source] if source.is_file() else sorted(source.rglob("*.py"))
    flags = [f"large data ({what}): copied expected values?" for what in large_data(source)]
    for path in files:
        if "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        rel = path.name if source.is_file() else str(path.relative_to(source))
        for pattern, what in SUSPICIOUS:
            match = pattern.search(text)
            if match:
                line = text.count("\n", 0, match.start()) + 1
                flags.append(f"{rel}:{line} {what}")
    copies = [c.replace(str(source.parent) + "/", "") for c in find_reference_code(files)]
    if copies:
        more = f" and {len(copies) - 3} more" if len(copies) > 3 else ""
        flags.append(f"contains {len(copies)} functions of the reference: {'; '.join(copies[:3])}{more}")
    return flags
