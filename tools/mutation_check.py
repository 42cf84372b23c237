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

Protocol-level behaviours (what generation, training, evaluation, sampling and the KV cache do
around the math) are mostly statements and arguments rather than operators, which cosmic-ray's core
operators do not touch. ``--files`` restricts the mutants to some reference modules, and four more
operators (``protocol/*``, below) mutate at that level: a call statement removed (``model.train()``,
``optimizer.zero_grad()``, ``torch.manual_seed(seed)``), a keyword argument dropped (its callee's
default applies: ``generator=generator``), two adjacent positional arguments swapped, and a ``with``
block unwrapped (``with eval_mode(model):`` runs its body without the context):

    python tools/mutation_check.py --files generation,training,sampling,kv_cache --sample 150 --seed 0 --jobs 1
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

from spec_grading.progress import Progress  # noqa: E402


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
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return {stem: show(stem) for stem in stems}


# ------------------------------------------------------------------------ protocol-level operators
# Each finds its sites in a module's AST (in source order) and rewrites the source text of one site,
# leaving every other line as it was (so line numbers and diffs stay readable).


def _offsets(source: str) -> list[int]:
    """Byte offset of the start of every line (AST columns are UTF-8 byte offsets)."""
    starts, total = [0], 0
    for line in source.encode().splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _replace(source: str, node: ast.AST, text: str) -> str:
    """``source`` with the text of ``node`` replaced by ``text``."""
    data, starts = source.encode(), _offsets(source)
    begin = starts[node.lineno - 1] + node.col_offset
    end = starts[node.end_lineno - 1] + node.end_col_offset
    return (data[:begin] + text.encode() + data[end:]).decode()


def _sorted(nodes):
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _calls(tree: ast.AST) -> list[ast.Call]:
    return _sorted(n for n in ast.walk(tree) if isinstance(n, ast.Call))


class RemoveCallStatement:
    """A statement that is only a call (``model.train()``, ``loss.backward()``) becomes ``pass``."""

    @staticmethod
    def sites(tree):
        return _sorted(n for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call))

    @staticmethod
    def apply(source, tree, site):
        return _replace(source, site, "pass")


class DropKeywordArgument:
    """One keyword argument of a call is left out, so the callee's default applies."""

    @staticmethod
    def sites(tree):
        return [(call, i) for call in _calls(tree) for i, kw in enumerate(call.keywords) if kw.arg is not None]

    @staticmethod
    def apply(source, tree, site):
        call, i = site
        changed = ast.Call(call.func, call.args, [kw for j, kw in enumerate(call.keywords) if j != i])
        return _replace(source, call, ast.unparse(changed))


class SwapAdjacentArguments:
    """Two neighbouring positional arguments of a call trade places (``f(a, b)`` -> ``f(b, a)``)."""

    @staticmethod
    def sites(tree):
        return [
            (call, i)
            for call in _calls(tree)
            for i in range(len(call.args) - 1)
            if not isinstance(call.args[i], ast.Starred)
            and not isinstance(call.args[i + 1], ast.Starred)
            and ast.dump(call.args[i]) != ast.dump(call.args[i + 1])
        ]

    @staticmethod
    def apply(source, tree, site):
        call, i = site
        args = list(call.args)
        args[i], args[i + 1] = args[i + 1], args[i]
        return _replace(source, call, ast.unparse(ast.Call(call.func, args, call.keywords)))


class UnwrapWith:
    """``with ctx: body`` -> ``body``: the block runs without the context manager (one item, no ``as``)."""

    @staticmethod
    def sites(tree):
        return _sorted(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.With) and len(n.items) == 1 and n.items[0].optional_vars is None
        )

    @staticmethod
    def apply(source, tree, site):
        lines = source.splitlines(keepends=True)
        first = site.body[0].lineno - 1
        shift = site.body[0].col_offset - site.col_offset
        body = [ln[shift:] if ln[:shift].strip() == "" else ln for ln in lines[first : site.end_lineno]]
        return "".join(lines[: site.lineno - 1] + body + lines[site.end_lineno :])


PROTOCOL_OPERATORS = {
    "protocol/RemoveCallStatement": RemoveCallStatement,
    "protocol/DropKeywordArgument": DropKeywordArgument,
    "protocol/SwapAdjacentArguments": SwapAdjacentArguments,
    "protocol/UnwrapWith": UnwrapWith,
}


def _site_line(site) -> int:
    return (site[0] if isinstance(site, tuple) else site).lineno


def enumerate_mutations(base: str | None = None, files: tuple[str, ...] | None = None) -> list[dict]:
    """Every (file, operator, occurrence) cosmic-ray's core operators (and, with ``files``, the protocol-level
    operators) produce on reference/*.py, or on the modules ``files`` names."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast

    sources = reference_texts(base)
    found = []
    for stem, source in sources.items():
        if files is not None and stem not in files:
            continue
        nodes = list(ast_nodes(get_ast(source)))
        for op_name in cosmic_ray.plugins.operator_names():
            op_class = cosmic_ray.plugins.get_operator(op_name)
            if op_class.arguments():
                continue
            op = op_class()
            positions = [pos for node in nodes for pos in op.mutation_positions(node)]
            for occurrence, (start, _end) in enumerate(positions):
                found.append({"stem": stem, "operator": op_name, "occurrence": occurrence, "line": start[0]})
        if files is None:
            continue  # the whole-reference population stays cosmic-ray's alone (comparable with earlier runs)
        tree = ast.parse(source)
        for op_name, op in PROTOCOL_OPERATORS.items():
            for occurrence, site in enumerate(op.sites(tree)):
                found.append({"stem": stem, "operator": op_name, "occurrence": occurrence, "line": _site_line(site)})
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
    if m["operator"] in PROTOCOL_OPERATORS:
        op = PROTOCOL_OPERATORS[m["operator"]]
        tree = ast.parse(sources[m["stem"]])
        mutated = op.apply(sources[m["stem"]], tree, op.sites(tree)[m["occurrence"]])
    else:
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


def _head() -> str | None:
    """The commit the suite was run at (``git rev-parse --short HEAD``), plus ``+dirty`` for local changes."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    return head + ("+dirty" if git("status", "--porcelain", "--", "spec_tests", "reference") else "") if head else None


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
        "--files",
        default=None,
        metavar="STEMS",
        help="comma-separated reference modules to mutate (e.g. generation,training,sampling,kv_cache), with "
        "the protocol-level operators as well as cosmic-ray's (default: every module, cosmic-ray's only)",
    )
    parser.add_argument(
        "--operators",
        default=None,
        metavar="PREFIX",
        help="only operators whose name starts with PREFIX (e.g. protocol/ or core/NumberReplacer)",
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
    files = tuple(f.strip().removesuffix(".py") for f in args.files.split(",")) if args.files else None
    population = enumerate_mutations(args.base, files)
    if args.operators:
        population = [m for m in population if m["operator"].startswith(args.operators)]
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
    where = f"reference/{{{','.join(files)}}}.py" if files else "reference/"
    print(f"{len(population)} mutants of {where}; running {len(chosen)}", file=sys.stderr)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    progress = Progress(len(chosen), every_step=True, elapsed=True)
    results = []
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=max(1, args.jobs), initializer=bugcheck._worker_init) as pool:
        tasks = [(i, m, args.timeout, args.base) for i, m in enumerate(chosen)]
        for r in pool.imap_unordered(run_mutant, tasks):
            results.append(r)
            progress.advance(f"{r['outcome']:<11} {r['stem']}:{r['line']} {r['operator'].split('/')[-1]}")
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
                    "files": list(files) if files else None,
                    "commit": _head(),
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
