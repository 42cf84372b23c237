"""Write the student handout: what students receive, with no solution code.

    python tools/make_handout.py OUT [--force] [--styles interleaved,half] [--diagnosis-max-kib 64]
                                     [--tests test_norms.py,test_attention.py]

OUT gets:

- ``student/``: the skeleton;
- ``spec_tests/``: the suite, without ``spec_tests/bugs/`` (the bug catalog is built from the
  reference's source);
- ``spec_tests/recorded/expected-<style>.pt``: every expected value the suite needs, recorded
  from the reference with the suite's fixed seeds (plain tensors and numbers; ``torch.load(...,
  weights_only=True)``), with the outputs of catalogued bugs where they are small, so failures
  still name the bug they match;
- ``README.md`` for students, ``pytest.ini`` and ``requirements.txt``.

``--tests`` makes a partial handout (say, for a first assignment) with only those test files.

In the handout, ``pytest spec_tests --impl=student`` runs offline against the recordings. Tests
marked ``needs_live_reference`` are left out (they stay in the graded suite). Exit status 0 on
success, 2 on usage errors, 1 when recording fails.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from .recording import RecordingError, record, torch_version  # noqa: E402
from .rubric import RubricError, load_rubric  # noqa: E402

STYLES = ("interleaved", "half")
EXCLUDED_DIRS = {"bugs", "recorded", "__pycache__", ".hypothesis", ".pytest_cache"}


def copy_tree(src: Path, dst: Path, test_files: list[str] | None = None) -> None:
    def ignore(folder, names):
        drop = [n for n in names if n in EXCLUDED_DIRS or n.endswith((".pyc", ".pt"))]
        if test_files is not None and Path(folder) == src:
            drop += [n for n in names if n.startswith("test_") and n.endswith(".py") and n not in test_files]
        return drop

    shutil.copytree(src, dst, ignore=ignore)


def readme(rubric, styles, torch_version: str, live_left_out: int) -> str:
    rows = "\n".join(f"| {name} | {weight:g} |" for name, weight in rubric.components.items())
    extra = (
        f", plus {live_left_out} test{'s' if live_left_out != 1 else ''} that need{'s' if live_left_out == 1 else ''} "
        "the reference itself (not in this handout)"
        if live_left_out
        else ""
    )
    if rubric.visibility != "visible" or any(o.visibility not in (None, "visible") for o in rubric.overrides):
        extra += "; some tests are hidden or shown only later"
    return f"""# Build a transformer from scratch: your handout

You implement a GPT-2 / Llama-style decoder in `student/`, one function at a time. Every
function is already there with its exact signature and a docstring (shapes, conventions, the
classic bug to avoid); each raises `NotImplementedError` until you write it.

## Check your work

```bash
python -m pip install -r requirements.txt
python -m pytest spec_tests --impl=student          # everything (or just: python -m pytest)
python -m pytest spec_tests --impl=student -k rmsnorm -x   # one concept, stop at the first failure
```

- `not implemented: rmsnorm` — the function still raises `NotImplementedError`.
- Otherwise a failure names the behaviour, then expected against actual: the largest error,
  where it is, the tolerance and the shapes. When your output matches a classic mistake, the
  failure says which one and how to fix it (`matches known bug ...`).

The expected values come from a recording of the course's reference implementation
(`spec_tests/recorded/`, made with torch {torch_version}, with fixed seeds): no reference code is
needed, and none is included. If a failure says the recording "holds no expected value for
these inputs", your torch draws different random numbers: install torch {torch_version}
(`requirements.txt`).

Pick the RoPE pairing you implement with `ROPE_STYLE` in `student/__init__.py`
(recordings are included for: {", ".join(styles)}).

## How you are graded

Your submission is graded with the same suite{extra}.

Points per component (relative weights, total {rubric.total:g}):

| component | weight |
|---|---:|
{rows}

When graded, your code runs in a separate process with a time limit per test
({rubric.test_timeout_s:g} s) and a memory limit ({rubric.memory_mb} MiB). It may not import the
reference, read the recorded expected values, start other processes, or end the process
(`sys.exit`): each of these fails the test concerned and is shown in your report. Code that
reaches into the test suite is flagged for the course staff to read.
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools/make_handout.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the folder to write (must not exist, or be empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--styles", default=",".join(STYLES), help="RoPE styles to record (default: both)")
    p.add_argument(
        "--diagnosis-max-kib",
        type=float,
        default=64.0,
        help="keep recorded bug outputs up to this size each, for 'matches known bug' (0: none)",
    )
    p.add_argument("--rubric", default=str(ROOT / "rubric.toml"), help="rubric summarised in the README")
    p.add_argument("--tests", help="comma-separated test files to include (default: all of spec_tests/test_*.py)")
    args = p.parse_args(argv)
    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    bad = [s for s in styles if s not in STYLES]
    if bad or not styles:
        p.error(f"--styles must name some of {', '.join(STYLES)}, got {args.styles!r}")
    if args.diagnosis_max_kib < 0:
        p.error(f"--diagnosis-max-kib must be >= 0, got {args.diagnosis_max_kib:g}")
    test_files = None
    if args.tests:
        test_files = [t.strip() for t in args.tests.split(",") if t.strip()]
        missing = [t for t in test_files if not (ROOT / "spec_tests" / t).is_file() or not t.startswith("test_")]
        if missing or not test_files:
            p.error(f"--tests: no such test file(s) in spec_tests/: {', '.join(missing) or args.tests!r}")
    try:
        rubric = load_rubric(args.rubric)
    except RubricError as exc:
        p.error(str(exc))
    out = Path(args.out).resolve()
    if (
        out == ROOT
        or out in ROOT.parents
        or any(
            out == ROOT / d or ROOT / d in out.parents for d in ("student", "spec_tests", "reference", "tools", ".git")
        )
    ):
        p.error(f"refusing to write the handout over (part of) the repository: {out}")
    if out.exists() and any(out.iterdir()):
        if not args.force:
            p.error(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    copy_tree(ROOT / "student", out / "student")
    copy_tree(ROOT / "spec_tests", out / "spec_tests", test_files)
    recorded = out / "spec_tests" / "recorded"
    try:
        max_bytes = int(args.diagnosis_max_kib * 1024)
        record(
            styles,
            recorded,
            manifest=False,
            live=False,
            files=test_files,
            env={"SPEC_RECORD_MAX_BUG_BYTES": str(max_bytes if max_bytes > 0 else 0)},
        )
    except RecordingError as exc:
        print(f"tools/make_handout.py: {exc}", file=sys.stderr)
        return 1
    for log in recorded.glob("record-*.log"):
        log.unlink()
    live_left_out = _count_live_tests(test_files)
    version = torch_version().split("+")[0]
    (out / "README.md").write_text(readme(rubric, styles, version, live_left_out), encoding="utf-8")
    (out / "pytest.ini").write_text("[pytest]\ntestpaths = spec_tests\naddopts = -p no:cacheprovider --impl=student\n")
    (out / "requirements.txt").write_text(
        f"torch=={version}\nnumpy\neinops\npytest>=8\nhypothesis>=6.100\n", encoding="utf-8"
    )
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"handout written to {out} ({total / 2**20:.1f} MiB; recordings for {', '.join(styles)})")
    return 0


def _count_live_tests(test_files=None) -> int:
    """How many test functions of the suite need the live reference (left out of the handout)."""
    import ast

    count = 0
    for path in sorted((ROOT / "spec_tests").glob("test_*.py")):
        if test_files is not None and path.name not in test_files:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                "needs_live_reference" in ast.unparse(d) for d in node.decorator_list
            ):
                count += 1
    return count


if __name__ == "__main__":
    sys.exit(main())
