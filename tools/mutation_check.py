"""Mutation testing of ``reference/`` with the spec suite as the killer (a secondary measure, not a
CI gate; results in docs/mutation-testing.md).

    pip install cosmic-ray
    python tools/mutation_check.py --sample 250 --seed 0 --json mutation.json

Mutants are cosmic-ray's (its core operators enumerate every mutation site of every reference
file, as ``cosmic-ray init`` does; ``cosmic_ray.mutating.mutate_code`` writes each one). They are
*run* here rather than by ``cosmic-ray exec``, because the suite's expected values come from the
live reference: a mutant applied to ``reference/`` in place would be compared with itself. Each
mutant is instead imported as a private package next to the pristine reference (the bug
catalog's loader) and the suite runs with ``--impl=<that package>`` and ``-x``, in-process, on
all cores, CPU only, Hypothesis derandomised, torch's global seed reset before every run.

Outcomes: killed (a test failed), survived (the suite passed), timeout (counted as killed, as
mutation tools do), incompetent (the mutant does not import) and equivalent (it changes only a
type annotation, which ``from __future__ import annotations`` never evaluates): the last two are
left out of the score.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import io
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
for p in (str(ROOT), str(TOOLS)):
    if p not in sys.path:
        sys.path.insert(0, p)

import bugcheck  # noqa: E402  (the in-process suite runner)


class MutantTimeout(BaseException):
    """Raised by the alarm when one mutant's suite run takes too long."""


def reference_texts(base: str | None = None) -> dict[str, str]:
    """Module stem -> source of reference/*.py: the working tree, or commit ``base`` (``git show``)."""
    stems = sorted(p.stem for p in (ROOT / "reference").glob("*.py"))
    if base is None:
        return {stem: (ROOT / "reference" / f"{stem}.py").read_text() for stem in stems}
    show = lambda stem: (
        subprocess.run(
            ["git", "show", f"{base}:reference/{stem}.py"],
            cwd=ROOT,
            check=True,  # noqa: E731
            capture_output=True,
            text=True,
        ).stdout
    )
    return {stem: show(stem) for stem in stems}


def enumerate_mutations(base: str | None = None) -> list[dict]:
    """Every (file, operator, occurrence) cosmic-ray's core operators produce on reference/*.py."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast

    sources = reference_texts(base)
    found = []
    for stem, source in sources.items():
        nodes = list(ast_nodes(get_ast(source)))
        for op_name in cosmic_ray.plugins.operator_names():
            op_class = cosmic_ray.plugins.get_operator(op_name)
            if op_class.arguments():
                continue
            op = op_class()
            positions = [pos for node in nodes for pos in op.mutation_positions(node)]
            for occurrence, (start, _end) in enumerate(positions):
                found.append({"stem": stem, "operator": op_name, "occurrence": occurrence, "line": start[0]})
    return found


def _without_annotations(source: str) -> str:
    """The AST dump of ``source`` with every annotation removed (they are never evaluated here:
    each reference module has ``from __future__ import annotations``)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.returns = None
        elif isinstance(node, ast.AnnAssign):
            node.annotation = ast.Constant(None)
    return ast.dump(tree)


def annotation_only(original: str, mutated: str) -> bool:
    """True when the mutation only changes type annotations: an equivalent mutant."""
    try:
        return _without_annotations(original) == _without_annotations(mutated)
    except SyntaxError:
        return False


def mutant_sources(m: dict, base: str | None = None) -> tuple[dict[str, str], str] | None:
    """The reference sources with mutation ``m`` applied, and a one-line diff; None if unchanged."""
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    sources = reference_texts(base)
    op = cosmic_ray.plugins.get_operator(m["operator"])()
    mutated = mutate_code(sources[m["stem"]], op, m["occurrence"])
    if mutated is None or mutated == sources[m["stem"]]:
        return None
    diff = [
        ln
        for ln in difflib.unified_diff(sources[m["stem"]].splitlines(), mutated.splitlines(), lineterm="", n=0)
        if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    ]
    return {**sources, m["stem"]: mutated}, " | ".join(d.strip() for d in diff)[:300]


def _alarm(signum, frame):
    raise MutantTimeout()


def run_mutant(task: tuple[int, dict, int, str | None]) -> dict:
    """Import mutant ``index`` as ``_spec_mut_<index>`` and run the suite against it with ``-x``."""
    import pytest
    import torch

    from spec_tests.bugs.loading import import_sources

    index, m, timeout, base = task
    made = mutant_sources(m, base)
    result = {**m, "index": index, "diff": "", "outcome": "", "detail": "", "seconds": 0.0}
    if made is None:
        return {**result, "outcome": "unchanged"}
    sources, result["diff"] = made
    if annotation_only(reference_texts(base)[m["stem"]], sources[m["stem"]]):
        return {**result, "outcome": "equivalent", "detail": "changes only a type annotation"}
    package = f"_spec_mut_{index}"
    start = time.perf_counter()
    try:
        import_sources(package, f"mutant:{index}", sources)
    except BaseException as exc:  # noqa: BLE001 - a mutant that cannot import is incompetent
        return {**result, "outcome": "incompetent", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    torch.manual_seed(bugcheck._INITIAL_SEED)
    recorder = bugcheck.Recorder()
    args = [
        str(ROOT / "spec_tests"),
        f"--impl={package}",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        f"--hypothesis-profile={bugcheck.PROFILE}",
        "--rootdir",
        str(ROOT),
        "-W",
        "ignore",
    ]
    out = io.StringIO()
    import spec_tests.bugs as catalog

    catalog.candidates_for = lambda component: []  # naming catalogued bugs is no use here, only time
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = int(pytest.main(args, plugins=[recorder]))
    except MutantTimeout:
        return {**result, "outcome": "timeout", "seconds": round(time.perf_counter() - start, 1)}
    finally:
        signal.alarm(0)
    failed = [t for t in recorder.tests.values() if t.outcome == "failed"]
    outcome = "survived" if code == 0 else "killed" if code == 1 else "error"
    detail = failed[0].nodeid if failed else ("" if code in (0, 1) else out.getvalue()[-300:])
    return {**result, "outcome": outcome, "detail": detail, "seconds": round(time.perf_counter() - start, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=250, help="mutants to run, drawn uniformly (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=int, default=180, help="seconds per mutant before it counts as a timeout")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument(
        "--base",
        default=None,
        metavar="COMMIT",
        help="mutate reference/ as of this git commit (default: the working tree); expected values "
        "still come from the working tree's reference",
    )
    parser.add_argument(
        "--rerun",
        default=None,
        metavar="JSON",
        help="rerun the survivors of an earlier --json result (e.g. after the suite changed) and "
        "report the merged outcome",
    )
    args = parser.parse_args(argv)

    start = time.perf_counter()
    population = enumerate_mutations(args.base)
    earlier = json.loads(Path(args.rerun).read_text())["results"] if args.rerun else None
    if earlier is not None:
        chosen = [
            {k: r[k] for k in ("stem", "operator", "occurrence", "line")} for r in earlier if r["outcome"] == "survived"
        ]
    else:
        chosen = (
            population
            if not args.sample
            else random.Random(args.seed).sample(population, min(args.sample, len(population)))
        )
    print(f"{len(population)} cosmic-ray mutants of reference/; running {len(chosen)}", file=sys.stderr)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    progress = bugcheck.Progress(len(chosen))
    results = []
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=max(1, args.jobs), initializer=bugcheck._worker_init) as pool:
        tasks = [(i, m, args.timeout, args.base) for i, m in enumerate(chosen)]
        for r in pool.imap_unordered(run_mutant, tasks):
            results.append(r)
            progress.step(f"{r['outcome']:<11} {r['stem']}:{r['line']} {r['operator'].split('/')[-1]}")
    results.sort(key=lambda r: r["index"])
    if earlier is not None:  # merge: earlier non-survivors stand, survivors take their new outcome
        again = {(r["stem"], r["operator"], r["occurrence"]): r for r in results}
        results = [again.get((r["stem"], r["operator"], r["occurrence"]), r) for r in earlier]
    kinds = ("killed", "timeout", "survived", "incompetent", "equivalent", "unchanged", "error")
    counts = {k: sum(r["outcome"] == k for r in results) for k in kinds}
    scored = counts["killed"] + counts["timeout"] + counts["survived"]
    score = (counts["killed"] + counts["timeout"]) / scored if scored else float("nan")
    elapsed = time.perf_counter() - start
    print(f"\n{counts}")
    print(f"mutation score {score:.1%} ({counts['killed'] + counts['timeout']}/{scored}) in {elapsed:.0f}s")
    for r in results:
        if r["outcome"] in ("survived", "error"):
            print(f"  {r['outcome'].upper():<8} reference/{r['stem']}.py:{r['line']} {r['operator']}: {r['diff']}")
    if args.json_path:
        Path(args.json_path).write_text(
            json.dumps(
                {
                    "population": len(population),
                    "sample": len(results),
                    "seed": args.seed,
                    "base": args.base,
                    "counts": counts,
                    "score": score,
                    "elapsed_seconds": round(elapsed, 1),
                    "results": results,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
