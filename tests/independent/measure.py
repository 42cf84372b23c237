"""Run the spec suite on every independently seeded bug: is it killed, and is it named?

    python tests/independent/measure.py                   # every bug in seeded.SEEDED, 2 workers
    python tests/independent/measure.py --bugs a,b --jobs 1
    python tests/independent/measure.py --json out.json   # also write every result

For each base implementation the suite first runs on the unpatched package: tests that already fail
there (what the base legitimately lacks, e.g. float64 precision for ``half_f32_mha``) do not count.
Then each bug runs on a patched copy of its base (``seeded.materialize``), in-process, as
``tools/bugcheck.py`` runs the catalog, reading the suite's typed check results:

- *killed*: a test fails that passes on the base;
- *named*: some charged failure (not a consequence of another failing function) names first, in its
  diagnosis, a cause whose code is among the bug's ``accepted`` codes
  (``spec_tests/harness/diagnosis/codes.py``; a "matches known bug" line counts through its catalogued
  bug's code);
- *named wrongly with confidence*: some charged failure names first, with confidence (not marked
  weak, ambiguous or unconfirmed), a cause whose code is not among them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(ROOT / "tools"), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import seeded  # noqa: E402

from spec_tests.harness.judging.results import KILLING, Status  # noqa: E402

CHARGED = (Status.FAILED,)  # bugcheck's statuses: failed (incl. not implemented, setup, error), consequence, ...


@dataclass
class BugResult:
    name: str
    base: str
    killed: bool
    failing: list[str]
    named: bool
    wrong: list[str] = field(default_factory=list)  # "test: code" of confident wrong names
    causes: list[str] = field(default_factory=list)  # distinct diagnosis lines of the charged failures
    accepted: tuple[str, ...] = ()


def failing_tests(result: dict) -> dict[str, dict]:
    return {t["nodeid"]: t for t in result["tests"] if t["outcome"] in KILLING}


def named_code(codes: list[str]) -> tuple[str, bool] | None:
    """The code a failure's diagnosis names first, and whether with confidence (``~`` marks weak evidence).

    A "matches known bug" line names the catalogued bug; its cause code follows it in ``codes``.
    """
    if not codes:
        return None
    first = codes[0]
    if first.startswith("known_bug:"):
        mapped = next((c for c in codes[1:] if not c.startswith("known_bug:")), None)
        return (mapped, True) if mapped else None
    return first.lstrip("~"), not first.startswith("~")


def judge(bug, base_failing: set[str], result: dict) -> BugResult:
    new = {k: t for k, t in failing_tests(result).items() if k not in base_failing}
    charged = [t for t in new.values() if t["outcome"] in CHARGED]
    accepted = set(bug.accepted)
    names = [(t, named_code(t["codes"])) for t in charged]
    named = any(n is not None and n[0] in accepted for _, n in names)
    wrong = [f"{t['nodeid'].split('::', 1)[-1]}: {n[0]}" for t, n in names if n and n[1] and n[0] not in accepted]
    causes = sorted({line for t in charged for line in t["causes"]})
    return BugResult(bug.name, bug.base, bool(new), sorted(new), named, wrong, causes, tuple(bug.accepted))


def _init():
    import bugcheck

    bugcheck._worker_init()


def _run(impl: str) -> dict:
    import bugcheck

    return bugcheck.run_suite((impl, True))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bugs", default="", help="comma-separated seeded bug names (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless every bug is killed, at least 80%% of them named, and none named wrongly with confidence",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.bugs.split(",") if n.strip()]
    bugs = [b for b in seeded.SEEDED if not names or b.name in names]
    bases = sorted({b.base for b in bugs})
    with tempfile.TemporaryDirectory(prefix="seeded-") as tmp:
        impls = {base: str(HERE / base) for base in bases}
        impls.update({b.name: str(seeded.materialize(b, Path(tmp) / b.name)) for b in bugs})
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(processes=max(1, args.jobs), initializer=_init) as pool:
            runs = dict(zip(impls, pool.map(_run, list(impls.values()))))
    base_failing = {base: set(failing_tests(runs[base])) for base in bases}
    results = [judge(b, base_failing[b.base], runs[b.name]) for b in bugs]
    width = max(len(r.name) for r in results)
    print(f"{'seeded bug':<{width}}  killed  named  wrong  failing")
    for r in results:
        wrong = "; ".join(r.wrong[:2]) if r.wrong else ""
        print(
            f"{r.name:<{width}}  {'yes' if r.killed else 'NO':>6}  {'yes' if r.named else '-':>5}  "
            f"{len(r.wrong):>5}  {len(r.failing):>3}  {wrong}"
        )
    killed = [r for r in results if r.killed]
    named = [r for r in killed if r.named]
    wrong = [r for r in killed if r.wrong]
    print(
        f"\nseeded bugs: {len(results)}; killed {len(killed)}; named correctly {len(named)} of the killed "
        f"({100 * len(named) / max(1, len(killed)):.0f}%); named wrongly with confidence: {len(wrong)}"
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.check and (len(killed) < len(results) or len(named) < 0.8 * len(killed) or wrong):
        print("seeded-bug goals not met: every bug killed, >= 80% named, none named wrongly with confidence")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
