"""What a failure looks like on the terminal: one short paragraph, never a wall of tracebacks
(``--spec-tb`` shows them), and the end-of-run summary by component with root causes first."""

from __future__ import annotations

from .checks import SpecFailure
from .subject import ImplementationError, NotImplementedInImpl


def _hypothesis_notes(exc: BaseException) -> str:
    notes = [n for n in getattr(exc, "__notes__", ()) if "Falsifying" in n or "draw" in n]
    return "".join(f"\n  {n}" for n in notes)


def short_report(exc: BaseException) -> str | None:
    """The short report for failures the suite explains itself; None for anything else."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            line = short_report(inner)
            if line:
                return line
        return None
    if isinstance(exc, NotImplementedInImpl):
        return f"not implemented: {exc}"
    if isinstance(exc, SpecFailure | ImplementationError):
        return str(exc) + _hypothesis_notes(exc)
    return None


# Report categories of their own, so that pytest's FAILURES section and short summary (which list
# "failed") leave them to the grouped summary below; both still fail the run (exit status 1).
NOT_IMPLEMENTED = "not implemented"
CONSEQUENCE = "consequences"
OWN_CATEGORIES = {NOT_IMPLEMENTED: ("N", "NOT IMPLEMENTED"), CONSEQUENCE: ("c", "CONSEQUENCE")}


def category(verdict) -> str | None:
    if verdict is None:
        return None
    if verdict.status == "not_implemented" or (
        verdict.status == "setup" and verdict.message.startswith("not implemented")
    ):
        return NOT_IMPLEMENTED
    if verdict.status == "consequence":
        return CONSEQUENCE
    return None


def make_failures_red(reporter) -> None:
    """pytest colours a run red only for "failed" and "error": add the suite's own failure categories."""
    import _pytest.terminal as terminal

    for name in OWN_CATEGORIES:
        terminal._color_for_type.setdefault(name, "red")
    original = reporter._determine_main_color

    def main_color(unknown_type_seen: bool) -> str:
        if any(name in reporter.stats for name in OWN_CATEGORIES):
            return "red"
        return original(unknown_type_seen)

    reporter._determine_main_color = main_color


def resolve_roots(roots, verdicts, own_failures) -> list[str]:
    """Root causes with every name that failed only as a consequence replaced by its own roots (a
    cache test judged against the model's forward blames ``forward``; ``forward`` failed only
    because ``rope`` did: the root is ``rope``)."""
    inherited: dict[str, set[str]] = {}
    for v in verdicts:
        if v.status == "consequence":
            for subject in v.subjects:
                inherited.setdefault(subject, set()).update(v.root_cause)
    out, todo, seen = [], list(roots), set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name not in own_failures and inherited.get(name, set()) - seen:
            todo += sorted(inherited[name])
        elif name not in out:
            out.append(name)
    return out


def summary_lines(label: str, verdicts: list, registry_failing: dict) -> list[str]:
    """The end-of-run summary: per component, root causes first, then what is not implemented."""
    from ..protocol import COMPONENT_ORDER

    counts: dict[str, dict[str, int]] = {}
    for v in verdicts:
        row = counts.setdefault(v.component, {})
        key = (
            "not_implemented"
            if category(v) == NOT_IMPLEMENTED
            else {"setup": "failed", "error": "failed"}.get(v.status, v.status)
        )
        row[key] = row.get(key, 0) + 1
    order = [c for c in COMPONENT_ORDER if c in counts] + sorted(set(counts) - set(COMPONENT_ORDER))
    columns = {"passed": "passed", "failed": "failed", "not_implemented": "not impl.", "consequence": "consequences",
               "skipped": "skipped", "xfailed": "xfailed"}  # fmt: skip
    shown = [k for k in columns if any(row.get(k) for row in counts.values())]
    lines = [f"{'component':<12}" + "".join(f"{columns[k]:>14}" for k in shown)]
    for c in order:
        lines.append(f"{c:<12}" + "".join(f"{counts[c].get(k, 0):>14}" for k in shown))
    status = {v.test: v.status for v in verdicts}
    own_failures = {
        name: own for name, tests in registry_failing.items()
        if (own := [t for t in dict.fromkeys(tests) if status.get(t) in ("failed", "error")])
    }  # fmt: skip
    consequences: dict[str, list[str]] = {}
    for v in verdicts:
        if v.status == "consequence":
            for root in resolve_roots(v.root_cause, verdicts, own_failures):
                consequences.setdefault(root, []).append(v.test)
    missing: dict[str, int] = {}
    for v in verdicts:
        if category(v) == NOT_IMPLEMENTED:
            name = v.message.removeprefix("not implemented: ").strip() or "?"
            missing[name] = missing.get(name, 0) + 1
    if own_failures or consequences:
        lines.append("")
        lines.append("root causes, fix these first:")
        for name in sorted(set(own_failures) | set(consequences), key=lambda n: -len(consequences.get(n, []))):
            own = len(own_failures.get(name, []))
            more = consequences.get(name, [])
            if own:
                tail = f"; {len(more)} other failure(s) trace back to it" if more else ""
                lines.append(f"  {name}: {own} failing test(s) of its own{tail}")
            else:  # no failing test of its own: not implemented yet, or judged only through others
                state = "not implemented; " if name in missing else ""
                lines.append(f"  {name}: {state}{len(more)} other failure(s) trace back to it")
    if missing:
        lines.append("")
        lines += [f"not implemented: {name}: {n} test{'s' if n > 1 else ''}" for name, n in sorted(missing.items())]
    return lines
