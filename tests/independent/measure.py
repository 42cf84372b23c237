"""Run the spec suite on every independently seeded bug and print what caught it.

    python tests/independent/measure.py                 # every bug in seeded.SEEDED
    python tests/independent/measure.py --bugs a,b      # some bugs
    python tests/independent/measure.py --json out.json # also write the results

For each base implementation the suite first runs on the unpatched package: tests that already fail
there (suite overreach, or what the base legitimately lacks) do not count as kills. Then, for each bug,
the suite runs (one pytest process at a time) on a patched copy of the base; a bug is *killed* when a
test fails that passes on its base. The failure texts of those tests are searched for a diagnosis
line ("matches known bug ..." / "likely cause ..."); ``named`` says whether a diagnosis line mentions
one of the bug's accepted cause codes (a text heuristic: read the lines before trusting it).

The results are plain dataclasses (``SuiteRun``, ``BugResult``) so that a later version can read the
suite's typed check results instead of pytest's junit XML.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import seeded  # noqa: E402

DIAGNOSIS = re.compile(r"(matches known bug [^\n]*|likely cause[^\n]*)", re.IGNORECASE)


@dataclass
class SuiteRun:
    """One pytest run of the suite: outcome per test id, failure text per failed test."""

    impl: str
    returncode: int
    seconds: float
    passed: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # test id -> failure text
    crash: str = ""  # pytest's own output when it produced no report


@dataclass
class BugResult:
    name: str
    base: str
    killed: bool
    new_failures: list[str]
    diagnoses: list[str]  # distinct diagnosis lines in the new failures
    named: bool | None  # a diagnosis mentions an accepted code (None: no diagnosis or nothing accepted)
    accepted: tuple[str, ...]
    mistake: str
    seconds: float


def run_suite(impl: Path | str, timeout: float = 1200.0, extra: tuple[str, ...] = ()) -> SuiteRun:
    with tempfile.TemporaryDirectory() as tmp:
        xml_path = Path(tmp) / "report.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "spec_tests",
            f"--impl={impl}",
            "-q",
            "-p",
            "no:warnings",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml_path}",
            *extra,
        ]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        run = SuiteRun(str(impl), proc.returncode, time.monotonic() - start)
        if not xml_path.exists():
            run.crash = (proc.stdout + proc.stderr)[-4000:]
            return run
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            test_id = _test_id(case)
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is not None:
                run.failed[test_id] = "\n".join(filter(None, (bad.get("message", ""), bad.text or "")))
            elif case.find("skipped") is not None:
                run.skipped.add(test_id)
            else:
                run.passed.add(test_id)
        if not (run.passed or run.failed or run.skipped):
            run.crash = (proc.stdout + proc.stderr)[-4000:]
        return run


def _test_id(case: ET.Element) -> str:
    """``test_module.py::test_name[params]`` from a junit testcase (classname ``spec_tests.test_module``)."""
    module = case.get("classname", "").split(".")[-1]
    return f"{module}.py::{case.get('name', '')}"


def diagnosis_lines(texts) -> list[str]:
    seen: dict[str, None] = {}
    for text in texts:
        for line in DIAGNOSIS.findall(text):
            seen.setdefault(line.strip(), None)
    return list(seen)


def names_accepted(lines: list[str], accepted: tuple[str, ...]) -> bool | None:
    if not lines or not accepted:
        return None
    words = set()
    for code in accepted:
        tail = code.split(":", 1)[-1]
        words.update({tail, tail.replace("_", " ")})
    text = "\n".join(lines).lower()
    return any(w.lower() in text for w in words)


def measure(bugs, timeout: float = 1200.0, log=print) -> tuple[dict[str, SuiteRun], list[BugResult]]:
    baselines: dict[str, SuiteRun] = {}
    for base in sorted({bug.base for bug in bugs}):
        baselines[base] = run_suite(seeded.base_folder(base), timeout)
        b = baselines[base]
        log(f"baseline {base}: {len(b.passed)} passed, {len(b.failed)} failed, {len(b.skipped)} skipped")
    results = []
    with tempfile.TemporaryDirectory(prefix="seeded_") as tmp:
        for bug in bugs:
            folder = seeded.materialize(bug, Path(tmp))
            run = run_suite(folder, timeout)
            base = baselines[bug.base]
            if run.crash:
                new = ["<suite did not run: " + run.crash.strip().splitlines()[-1] + ">"]
                lines: list[str] = []
            else:
                new = sorted(t for t in run.failed if t not in base.failed)
                lines = diagnosis_lines(run.failed[t] for t in new)
            result = BugResult(
                name=bug.name,
                base=bug.base,
                killed=bool(new),
                new_failures=new,
                diagnoses=lines,
                named=names_accepted(lines, bug.accepted),
                accepted=bug.accepted,
                mistake=bug.mistake,
                seconds=round(run.seconds, 1),
            )
            results.append(result)
            log(
                f"{bug.name}: {'killed' if result.killed else 'SURVIVED'} ({len(new)} new failures, {run.seconds:.0f}s)"
            )
    return baselines, results


def table(results: list[BugResult]) -> str:
    rows = [("bug", "base", "killed", "fails", "diagnosis", "names accepted code", "first diagnosis")]
    for r in results:
        first = r.diagnoses[0][:70] if r.diagnoses else ""
        named = {None: "-", True: "yes", False: "no"}[r.named]
        rows.append(
            (r.name, r.base, "yes" if r.killed else "NO", str(len(r.new_failures)), str(len(r.diagnoses)), named, first)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for row in rows:
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    killed = sum(r.killed for r in results)
    out.append(f"\n{killed}/{len(results)} seeded bugs killed")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bugs", help="comma-separated bug names (default: all)")
    parser.add_argument("--json", type=Path, help="write baselines and per-bug results here")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per suite run")
    args = parser.parse_args(argv)
    bugs = [seeded.BY_NAME[n] for n in args.bugs.split(",")] if args.bugs else list(seeded.SEEDED)
    baselines, results = measure(bugs, args.timeout, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(results))
    if args.json:
        payload = {
            "baselines": {b: {"failed": sorted(r.failed), "passed": len(r.passed)} for b, r in baselines.items()},
            "bugs": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
