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
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spec_tests.harness.remote.upload_copy import UploadLimits, copy_upload, quote

from .packages import package_dir
from .solution_scan import reference_code_in


class SubmissionError(ValueError):
    """An ``--impl`` value that is not a gradeable submission."""


@dataclass(frozen=True)
class Submission:
    label: str
    source: Path  # the package folder or the .py file
    problem: str | None = None  # why this batch entry cannot be graded (it gets a report saying so)


def _lmode(path: Path) -> int:
    """``path``'s own mode (a link is a link), 0 when there is nothing."""
    try:
        return path.lstat().st_mode
    except OSError:
        return 0


def _package_in(folder: Path) -> Path | None:
    """The package of a submission folder, found without following any link inside it."""
    if stat.S_ISREG(_lmode(folder / "__init__.py")):
        return folder
    if stat.S_ISDIR(_lmode(folder / "student")) and stat.S_ISREG(_lmode(folder / "student" / "__init__.py")):
        return folder / "student"
    return None


def _link_text(path: Path) -> str:
    try:
        return quote(os.readlink(path))
    except OSError:
        return "?"


def _not_a_package(folder: Path) -> str:
    why = "neither a package (no __init__.py) nor a folder holding student/__init__.py"
    links = [
        p for p in (folder / "__init__.py", folder / "student", folder / "student" / "__init__.py") if p.is_symlink()
    ]
    for link in links:
        why += f"; {quote(str(link.relative_to(folder)))} is a link -> {_link_text(link)} (links are not followed)"
    return why


ARCHIVES = (".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".7z", ".rar")


def discover(values: list[str], notes: list[str] | None = None) -> list[Submission]:
    """The submissions named by ``--impl`` values (paths, ``student``, ``reference``, batch folders).

    A path given is followed (it is the grader's choice); nothing inside an upload is: a batch
    entry that is a link, or a folder that is not a package, becomes a submission with a
    ``problem`` (graded as "could not run", saying why); other entries that are not submissions
    (archives, other files) are left out with a line in ``notes``."""
    notes = [] if notes is None else notes
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
        if not path.is_dir():
            raise SubmissionError(f"--impl {value}: neither a .py file nor a folder")
        entries = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
        batch, problems = [], []
        for entry in entries:
            mode = _lmode(entry)
            label = entry.stem if entry.suffix == ".py" else entry.name
            if stat.S_ISLNK(mode):
                why = f"{quote(entry.name)} is a link -> {_link_text(entry)} (links in an upload are not followed)"
                problems.append(Submission(label, entry, why))
            elif stat.S_ISREG(mode) and entry.suffix == ".py":
                batch.append(Submission(label, entry))
            elif stat.S_ISDIR(mode) and _package_in(entry) is not None:
                batch.append(Submission(entry.name, _package_in(entry)))
            elif stat.S_ISDIR(mode):
                problems.append(Submission(label, entry, _not_a_package(entry)))
            elif stat.S_ISREG(mode) and entry.name.lower().endswith(ARCHIVES):
                notes.append(f"not graded: {quote(entry.name)} is an archive (unpack it into a folder of its own)")
            else:
                notes.append(f"not graded: {quote(entry.name)} is neither a .py file nor a folder")
        if not batch:
            why = _not_a_package(path)
            raise SubmissionError(f"--impl {value}: {why}, nor a folder of submissions (.py files or package folders)")
        found += sorted(batch + problems, key=lambda sub: sub.source.name)
    labels = [s.label for s in found]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise SubmissionError(f"several submissions share the name(s) {dupes}; grade them from separate folders")
    return found


SKIPPED_FOLDERS = ("__pycache__", ".git")
SKIPPED_SUFFIXES = {".pt": "tensor data", ".pth": "tensor data", ".bin": "binary data"}


def _skip(name: str, is_folder: bool) -> str | None:
    """Entries staging leaves out: caches silently, recorded data with a line (never graded code)."""
    if is_folder:
        return "" if name in SKIPPED_FOLDERS else None
    if name.endswith(".pyc"):
        return ""
    suffix = Path(name).suffix
    if suffix in SKIPPED_SUFFIXES:
        return f"{SKIPPED_SUFFIXES[suffix]} files ({', '.join(SKIPPED_SUFFIXES)}) are not staged"
    return None


@dataclass
class Staged:
    """A staged copy: ``path`` (None when the whole upload was refused), and the report lines saying
    what was not staged (``refused_all``: the limit that refused it all)."""

    path: Path | None
    lines: list[str] = field(default_factory=list)
    refused_all: str | None = None


def stage(submission: Submission, into: Path, limits: UploadLimits | None = None) -> Staged:
    """A private copy of the submission under ``into``, readable by the sandbox's unprivileged user
    (files 0644, folders 0755: an upload may come with 0600 modes). The upload is data: no link in it
    is followed (links, devices, FIFOs and sockets are dropped and named), and ``UploadLimits`` bound
    its entries, depth, bytes and time (``spec_tests/harness/remote/upload_copy.py``)."""
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o755)
    if submission.problem:
        return Staged(None, [f"refused: {submission.problem}"], submission.problem)
    target = into / ("submission.py" if submission.source.is_file() else "submission")
    report = copy_upload(submission.source, target, limits or UploadLimits(), skip=_skip)
    lines = report.lines()
    if report.refused_all:
        return Staged(None, lines, report.refused_all)
    return Staged(target, lines)


def rope_style(source: Path) -> str | None:
    """The ``ROPE_STYLE = "..."`` a submission declares, read without running it (None: not found)."""
    init = source if source.is_file() else source / "__init__.py"
    try:
        if init.lstat().st_size > SCAN_FILE_BYTES:  # not parsed in the grader (see the static flags)
            return None
        tree = ast.parse(init.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, *UNSCANNABLE):
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
        re.compile(
            r"^[ \t]*(from|import)[ \t]+reference\b|import_module\([ \t]*['\"]reference|['\"]reference['\"]", re.M
        ),
        "mentions the reference package",
    ),
    (
        re.compile(r"^[ \t]*(from|import)[ \t]+spec_tests\b|import_module\([ \t]*['\"]spec_tests", re.M),
        "imports the test suite",
    ),
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


UNSCANNABLE = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)


def _parse(path: Path, text: str, unscanned: dict[str, str]) -> ast.AST | None:
    """``text`` parsed, or None: a file the parser cannot take (nested too deeply: RecursionError,
    MemoryError) is named once in ``unscanned``; a plain syntax error is the worker's to report."""
    try:
        return ast.parse(text, str(path))
    except (RecursionError, MemoryError) as exc:
        unscanned.setdefault(str(path), f"{type(exc).__name__} while parsing: nested too deeply to scan")
    except UNSCANNABLE:
        pass
    return None


def _files(source: Path) -> list[Path]:
    """The regular files of a staged copy (which holds no links), in a fixed order."""
    if source.is_file():
        return [source]
    return sorted(p for p in source.rglob("*") if p.is_file() and not p.is_symlink())


def _rel(source: Path, path: Path) -> str:
    return quote(path.name if source.is_file() else str(path.relative_to(source)))


# The static flags run in the grader, outside the sandbox, on whatever the upload holds: what they read is
# bounded. A file over SCAN_FILE_BYTES is neither parsed nor searched (``ast.parse`` of a 4.8 MB list literal
# took 8.7 s and 2.3 GB; it is flagged as large data anyway); all files together at most SCAN_TOTAL_BYTES
# (parsing takes about 1.3 s per MB of literals) and SCAN_SECONDS of wall time. A file left out is named
# "not scanned (why)", the first UNSCANNED_NAMED of them, the rest counted.
SCAN_FILE_BYTES = LARGE_DATA_BYTES
SCAN_TOTAL_BYTES = 1_000_000
SCAN_SECONDS = 10.0
UNSCANNED_NAMED = 20
LARGE_LITERAL_CHARS = 20_000


@dataclass
class ScanBudget:
    """What the static flags may still read: bytes of all files together, and wall time (``clock``)."""

    total_bytes: int = SCAN_TOTAL_BYTES
    seconds: float = SCAN_SECONDS
    clock: Callable[[], float] = time.monotonic
    spent_bytes: int = 0
    started: float | None = None

    def __post_init__(self):
        for name in ("total_bytes", "seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"ScanBudget.{name} must be a number >= 0, got {value!r}")

    def read(self, path: Path) -> tuple[str | None, str]:
        """``(text, "")`` of a file to scan, or ``(None, why it is not scanned)``."""
        if self.started is None:
            self.started = self.clock()
        size = path.lstat().st_size
        if size > SCAN_FILE_BYTES:
            return None, f"over {SCAN_FILE_BYTES // 1000} kB: not parsed or searched"
        if self.spent_bytes + size > self.total_bytes:
            return None, f"the static scan's {self.total_bytes // 1000} kB for all files were spent"
        if self.clock() - self.started > self.seconds:
            return None, f"the static scan's {self.seconds:g} s were spent"
        with path.open("rb") as f:
            data = f.read(SCAN_FILE_BYTES + 1)
        if len(data) > SCAN_FILE_BYTES:  # grew since lstat
            return None, f"over {SCAN_FILE_BYTES // 1000} kB: not parsed or searched"
        self.spent_bytes += len(data)
        return data.decode("utf-8"), ""


def large_data(source: Path, unscanned: dict[str, str] | None = None) -> list[str]:
    """Files large enough to hold copied expected values (the handout ships a recording of the suite's
    inputs and answers; grading uses the same inputs), from their sizes alone; large string literals are
    found while the files are scanned (``static_flags``)."""
    unscanned = {} if unscanned is None else unscanned
    found = []
    for path in _files(source):
        try:
            size = path.lstat().st_size
        except OSError as exc:
            unscanned.setdefault(str(path), type(exc).__name__)
            continue
        if size > LARGE_DATA_BYTES:
            found.append(f"{_rel(source, path)} is {size // 1000} kB")
    return found


def static_flags(source: Path, budget: ScanBudget | None = None) -> list[str]:
    """Things in a submission's source that staff may want to look at (never affects the score).
    Each file is read once, within ``budget`` (above), and scanned on its own: one the scanners cannot
    take (a deeply nested expression makes ``ast.parse`` raise RecursionError or MemoryError) or the
    budget leaves out is named "not scanned", and the others are still scanned."""
    budget = ScanBudget() if budget is None else budget
    unscanned: dict[str, str] = {}
    large = large_data(source, unscanned)
    files = [p for p in _files(source) if p.suffix == ".py" and "__pycache__" not in p.parts]
    found: list[str] = []
    copies: list[str] = []
    for path in files:
        rel = _rel(source, path)
        try:
            text, why = budget.read(path)
            if text is None:
                unscanned.setdefault(str(path), why)
                continue
            for pattern, what in SUSPICIOUS:
                match = pattern.search(text)
                if match:
                    line = text.count("\n", 0, match.start()) + 1
                    found.append(f"{rel}:{line} {what}")
            tree = _parse(path, text, unscanned)
            if tree is None:
                continue
            big = [
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant)
                and isinstance(n.value, str | bytes)
                and len(n.value) > LARGE_LITERAL_CHARS
            ]
            if big:
                large.append(f"{rel}:{big[0].lineno} holds a {len(big[0].value) // 1000} kB literal")
            copies += reference_code_in(tree, quote(str(path.relative_to(source.parent))))
        except (OSError, UnicodeError, *UNSCANNABLE) as exc:
            unscanned.setdefault(str(path), type(exc).__name__)
    flags = [f"large data ({what}): copied expected values?" for what in large] + found
    if copies:
        more = f" and {len(copies) - 3} more" if len(copies) > 3 else ""
        flags.append(f"contains {len(copies)} functions of the reference: {'; '.join(copies[:3])}{more}")
    named = list(unscanned.items())
    for path, why in named[:UNSCANNED_NAMED]:
        flags.append(f"{_rel(source, Path(path))} not scanned ({why})")
    if len(named) > UNSCANNED_NAMED:
        flags.append(f"{len(named) - UNSCANNED_NAMED} more files not scanned")
    return flags
