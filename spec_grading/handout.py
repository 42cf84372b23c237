"""spec-handout: write the student handout, with no solution code.

    spec-handout OUT [--force] [--styles interleaved,half] [--diagnosis-max-kib 64]
                     [--tests test_norms.py,test_attention.py] [--rubric rubric.toml]

OUT gets:

- ``student/``: the skeleton;
- ``spec_tests/``: the suite, without ``spec_tests/bugs/`` (the bug catalog is built from the
  reference's source);
- ``spec_tests/recorded/expected-<style>.pt`` (+ ``.sha256``): every expected value the suite
  needs, recorded from the reference by the suite itself (``pytest --spec-record``), with the
  outputs of catalogued bugs where they are small, so failures still name the bug they match. The
  suite replays them (``spec_tests/harness/judging/expectations/replay.py``) after checking each file's
  SHA-256 against its sidecar;
- ``README.md`` for students, ``pytest.ini`` and ``requirements.txt``.

``--tests`` makes a partial handout (say, for a first assignment) with only those test files.
The suite, the skeleton and the reference are found by importing them, so an installed copy of
the project works as well as a checkout. ``student/`` must still be the skeleton: a function whose
body is more than its docstring and ``raise NotImplementedError``, a class, a module-level binding
that is not a literal, or a protocol name imported from elsewhere is solution code, and the
handout is refused with the list of them (``--allow-implemented name,...`` hands out the functions
staff mean to give). Exit status 0 on success, 2 on usage errors and refusals, 1 when recording
fails.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .judge import child_env, spec_tests_dir
from .manifest import torch_version
from .packages import package_dir
from .rubric import Rubric, RubricError, resolve_rubric

STYLES = ("interleaved", "half")
EXCLUDED = {"bugs", "recorded", "__pycache__", ".hypothesis", ".pytest_cache"}
RECORD_TIMEOUT_S = 1800


class RecordingError(RuntimeError):
    """The recording pass on the reference failed."""


def _unimplemented(body: list[ast.stmt]) -> bool:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        return True
    if len(body) > 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def _literal(node: ast.expr | None) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False
    return True


def implementations_in(folder: Path, allowed: frozenset[str] = frozenset()) -> list[str]:
    """``"<file>:<line> <what>"`` for each piece of solution code in a skeleton folder."""
    from spec_tests.protocol import PROTOCOL_NAMES

    found = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(folder.parent)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError) as exc:
            found.append(f"{rel}: cannot be read as Python ({exc.__class__.__name__})")
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name not in allowed and not _unimplemented(node.body):
                    found.append(f"{rel}:{node.lineno} {node.name}() is implemented")
            elif isinstance(node, ast.ClassDef):
                if node.name not in allowed:
                    found.append(f"{rel}:{node.lineno} class {node.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if not _literal(node.value) and not set(names) <= allowed:
                    found.append(f"{rel}:{node.lineno} {', '.join(names) or 'an assignment'} = (not a literal)")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                bound = [a.asname or a.name for a in node.names]
                clash = [n for n in bound if n in PROTOCOL_NAMES and n not in allowed]
                if clash:
                    found.append(f"{rel}:{node.lineno} {', '.join(clash)} imported from {node.module}")
            elif not isinstance(node, ast.Import | ast.ImportFrom | ast.Expr):
                found.append(f"{rel}:{node.lineno} module-level {node.__class__.__name__.lower()} statement")
            elif isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
                found.append(f"{rel}:{node.lineno} module-level code")
    return found


def copy_tree(src: Path, dst: Path, test_files: list[str] | None = None) -> None:
    def ignore(folder, names):
        drop = [n for n in names if n in EXCLUDED or n.endswith((".pyc", ".pt", ".sha256"))]
        if test_files is not None and Path(folder) == src:
            drop += [n for n in names if n.startswith("test_") and n.endswith(".py") and n not in test_files]
        return drop

    shutil.copytree(src, dst, ignore=ignore)


def record(styles, into: Path, *, test_files: list[str] | None, max_bug_bytes: int) -> None:
    """``pytest <suite> --impl=<reference in style> --spec-record=<into>``, once per style."""
    suite = spec_tests_dir()
    targets = [str(suite / f) for f in test_files] if test_files else [str(suite)]
    env = child_env(PYTHONHASHSEED="0", SPEC_RECORD_MAX_BUG_BYTES=str(max_bug_bytes), PYTHONDONTWRITEBYTECODE="1")
    for n, style in enumerate(styles, 1):
        what = "the selected test files" if test_files else "the whole suite"
        print(f"spec-handout: recording expected values, RoPE style {style} ({n} of {len(styles)}): "
              f"{what} on the reference, about a minute each", file=sys.stderr, flush=True)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="handout-record-") as cwd:
            cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", "--tb=short"]
            cmd += [f"--rootdir={suite.parent}", f"--impl=spec_tests.harness.subject.subject:reference_{style}"]
            cmd += [f"--spec-record={into}"]
            done = subprocess.run(
                cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=RECORD_TIMEOUT_S, check=False
            )
        if done.returncode != 0 or not (into / f"expected-{style}.pt").is_file():
            tail = (done.stdout + done.stderr)[-3000:]
            raise RecordingError(f"recording the reference ({style}) failed (exit {done.returncode}):\n{tail}")


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def requirements(version: str) -> str:
    """The handout's ``requirements.txt``: the torch the recordings were made with, from PyTorch's CPU
    wheels (the default index's Linux wheels bundle CUDA: a download of several GB, not needed here)."""
    return (
        "# torch from PyTorch's CPU wheel index (small; the suite runs on CPU). Remove the next line to\n"
        "# get the default (CUDA) build instead. Or install it first yourself, then the rest:\n"
        f"#   python -m pip install torch=={version} --index-url {TORCH_CPU_INDEX}\n"
        f"--extra-index-url {TORCH_CPU_INDEX}\n"
        f"torch=={version}\nnumpy\neinops\npytest>=8\nhypothesis>=6.100\n"
    )


def assignment_lines(rubric: Rubric) -> str:
    """What the assignment grades, where the rubric narrows the suite (families, names, cases)."""
    from spec_tests.protocol import ALL_FAMILIES

    lines = []
    if set(rubric.families) != set(ALL_FAMILIES):
        lines.append(f"- Model families graded: {', '.join(rubric.families)} (tests of other families are not graded).")
    if rubric.not_graded:
        lines.append(f"- Not part of this assignment (not graded): {', '.join(rubric.not_graded)}.")
    if any(o.graded is False for o in rubric.overrides):
        lines.append("- Some single test cases are not graded (`[[tests]]` entries with `graded = false`).")
    lines.append(f"- Capabilities required: {', '.join(rubric.capabilities) or 'none'}.")
    return "\n".join(lines)


def readme(rubric: Rubric, styles, version: str) -> str:
    rows = "\n".join(f"| {name} | {weight:g} |" for name, weight in rubric.components.items())
    table = f"| component | weight |\n|---|---:|\n{rows}" if rows else "(every component weighs the same)"
    title = f" ({rubric.assignment})" if rubric.assignment else ""
    hidden = ""
    if rubric.visibility != "visible" or any(o.visibility not in (None, "visible") for o in rubric.overrides):
        hidden = " Some tests are hidden, or shown only later."
    return f"""# Build a transformer from scratch: your handout

You implement a GPT-2 / Llama-style decoder in `student/`, one function at a time. Every
function is already there with its exact signature and a docstring (shapes, conventions, the
classic bug to avoid); each raises `NotImplementedError` until you write it.

## Check your work

```bash
python -m pip install -r requirements.txt          # torch from the CPU wheels (see the file)
python -m pytest spec_tests --impl=student          # everything (or just: python -m pytest)
python -m pytest spec_tests --impl=student -k rmsnorm -x   # one concept, stop at the first failure
```

- `not implemented: rmsnorm` -- the function still raises `NotImplementedError`.
- Otherwise a failure names the behaviour, then expected against actual: the largest error,
  where it is, the tolerance and the shapes. When your output matches a classic mistake, the
  failure says which one and how to fix it (`matches known bug ...`).
- A failure "consequence of failing X" means the test passes once `X` is right: fix `X` first.

The expected values come from a recording of the course's reference implementation
(`spec_tests/recorded/`, made with torch {version}, with fixed seeds; each file is checked against
its SHA-256 before use): no reference code is needed, and none is included. If a failure says the
recording "holds no expected value for these inputs", your torch draws different random numbers:
install torch {version} (`requirements.txt`).

Pick the RoPE pairing you implement with `ROPE_STYLE` in `student/__init__.py`
(recordings are included for: {", ".join(styles)}).

## How you are graded{title}

Graded with the rubric `{rubric.identity}`.

{assignment_lines(rubric)}

Your submission is graded with the same tests.{hidden} A test you fail only because a function it
builds on fails ("consequence of failing X") is not charged: `X`'s own tests are.

Points per component (relative weights, total {rubric.total:g}):

{table}

When graded, your code runs in a separate, sandboxed process (no network, no access to the
grader's files) with a time limit per test ({rubric.test_timeout_s:g} s) and a memory limit
({rubric.memory_mb} MiB); the grader runs in another process and only receives your functions'
results as data. Ending the process (`sys.exit`), crashing, or running out of time or memory
fails the test concerned.
"""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="spec-handout", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the folder to write (must not exist, or be empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--styles", default=",".join(STYLES), help="RoPE styles to record (default: both)")
    p.add_argument(
        "--diagnosis-max-kib",
        type=float,
        default=64.0,
        help="keep recorded bug outputs up to this size each, for 'matches known bug' (0: none)",
    )
    p.add_argument(
        "--rubric", help="rubric summarised in the README (default: the project's rubric.toml, else built-in; never ./)"
    )
    p.add_argument("--tests", help="comma-separated test files to include (default: all of spec_tests/test_*.py)")
    p.add_argument(
        "--allow-implemented",
        default="",
        help="comma-separated names in student/ that may hold code (functions staff hand out written)",
    )
    return p, p.parse_args(argv)


def overwrites_the_project(out: Path) -> Path | None:
    """The project folder ``out`` would be written over (or into), if any."""
    packages = [spec_tests_dir(), package_dir("student"), package_dir("reference")]
    for folder in packages:
        if out == folder or out in folder.parents or folder in out.parents:
            return folder
    return None


def main(argv=None) -> int:
    p, args = parse_args(argv)
    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    bad = [s for s in styles if s not in STYLES]
    if bad or not styles:
        p.error(f"--styles must name some of {', '.join(STYLES)}, got {args.styles!r}")
    if args.diagnosis_max_kib < 0:
        p.error(f"--diagnosis-max-kib must be >= 0, got {args.diagnosis_max_kib:g}")
    suite = spec_tests_dir()
    test_files = None
    if args.tests:
        test_files = [t.strip() for t in args.tests.split(",") if t.strip()]
        missing = [t for t in test_files if not t.startswith("test_") or not (suite / t).is_file()]
        if missing or not test_files:
            p.error(f"--tests: no such test file(s) in {suite}: {', '.join(missing) or repr(args.tests)}")
    try:
        rubric = resolve_rubric(args.rubric)
    except RubricError as exc:
        p.error(str(exc))
    print(f"spec-handout: rubric {rubric.identity}", file=sys.stderr)
    allowed = frozenset(n.strip() for n in args.allow_implemented.split(",") if n.strip())
    solution = implementations_in(package_dir("student"), allowed)
    if solution:
        listing = "\n  ".join(solution[:20]) + (f"\n  ... and {len(solution) - 20} more" if len(solution) > 20 else "")
        p.error(
            f"refusing: {package_dir('student')} is not the skeleton, it holds solution code:\n  {listing}\n"
            "Restore the skeleton (git checkout student/), or pass --allow-implemented NAME,... for code "
            "you mean to hand out."
        )
    out = Path(args.out).resolve()
    clash = overwrites_the_project(out)
    if clash is not None:
        p.error(f"refusing to write the handout over (part of) the project: {out} (inside or around {clash})")
    if out.exists() and any(out.iterdir()):
        if not args.force:
            p.error(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    copy_tree(package_dir("student"), out / "student")
    copy_tree(suite, out / "spec_tests", test_files)
    max_bytes = int(args.diagnosis_max_kib * 1024)
    try:
        record(styles, out / "spec_tests" / "recorded", test_files=test_files, max_bug_bytes=max_bytes)
    except (RecordingError, subprocess.TimeoutExpired) as exc:
        print(f"spec-handout: {exc}", file=sys.stderr)
        return 1
    version = torch_version().split("+")[0]
    (out / "README.md").write_text(readme(rubric, styles, version), encoding="utf-8")
    (out / "pytest.ini").write_text("[pytest]\ntestpaths = spec_tests\naddopts = -p no:cacheprovider --impl=student\n")
    (out / "requirements.txt").write_text(requirements(version), encoding="utf-8")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"handout written to {out} ({total / 2**20:.1f} MiB; recordings for {', '.join(styles)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
