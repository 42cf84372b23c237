"""What a failure looks like on the terminal: one short paragraph, never a wall of tracebacks
(``--spec-tb`` shows them), and the end-of-run summary by component with root causes first."""

from __future__ import annotations

from ..judging.results import CRASHES, REAL_FAILURES, Status
from ..judging.spec import SpecFailure
from ..subject.subject import ImplementationError, NotImplementedInImpl


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


# Report categories of their own (pytest's words for its stats, not statuses), so that pytest's FAILURES
# section and short summary (which list "failed") leave them to the grouped summary below; both still fail
# the run (exit status 1).
NOT_IMPLEMENTED = "not implemented"
CONSEQUENCE = "consequences"
OWN_CATEGORIES = {NOT_IMPLEMENTED: ("N", "NOT IMPLEMENTED"), CONSEQUENCE: ("c", "CONSEQUENCE")}


def category(verdict) -> str | None:
    if verdict is None:
        return None
    if verdict.status == Status.NOT_IMPLEMENTED or (
        verdict.status == Status.SETUP and verdict.message.startswith("not implemented")
    ):
        return NOT_IMPLEMENTED
    if verdict.status == Status.CONSEQUENCE:
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


def summary_lines(label: str, verdicts: list, registry_failing: dict | None = None) -> list[str]:
    """The end-of-run summary: per component, root causes first (dependency order: upstream first,
    then by own failures, then by name), then what is not implemented.

    Consequences are settled by ``settling.settle``, the decision the grade reads too. Without a
    reference (a handout), charged failures that may be consequences of failing upstream names are
    listed under them ("fix X first and rerun"), never as roots of their own.
    """
    from ...protocol import COMPONENT_ORDER
    from ..judging.settling import dependency_key, settle

    verdicts = sorted(verdicts, key=lambda v: v.test)
    settled = settle(verdicts)
    counts: dict[str, dict[str, int]] = {}
    for v in verdicts:
        row = counts.setdefault(v.component, {})
        status = settled[v.test].status
        key = (
            Status.NOT_IMPLEMENTED if category(v) == NOT_IMPLEMENTED else Status.FAILED if status in CRASHES else status
        )
        row[key] = row.get(key, 0) + 1
    order = [c for c in COMPONENT_ORDER if c in counts] + sorted(set(counts) - set(COMPONENT_ORDER))
    columns = {Status.PASSED: "passed", Status.FAILED: "failed", Status.NOT_IMPLEMENTED: "not impl.",
               Status.CONSEQUENCE: "consequences", Status.SKIPPED: "skipped", Status.XFAILED: "xfailed"}  # fmt: skip
    shown = [k for k in columns if any(row.get(k) for row in counts.values())]
    lines = [f"{'component':<12}" + "".join(f"{columns[k]:>14}" for k in shown)]
    for c in order:
        lines.append(f"{c:<12}" + "".join(f"{counts[c].get(k, 0):>14}" for k in shown))
    charged: dict[str, list[str]] = {}  # test -> the names it is charged to (the registry's record)
    for name, tests in sorted((registry_failing or {}).items()):
        for t in dict.fromkeys(tests):
            charged.setdefault(t, []).append(name)
    missing: dict[str, int] = {}
    for v in verdicts:
        if category(v) == NOT_IMPLEMENTED:
            name = v.message.removeprefix("not implemented: ").strip() or "?"
            missing[name] = missing.get(name, 0) + 1
    own_failures: dict[str, list[str]] = {}
    maybe: dict[str, set[str]] = {}  # name -> upstream names its failures may be consequences of
    confident: set[str] = set()  # names with a failure no failing upstream name could explain
    consequences: dict[str, list[str]] = {}
    for v in verdicts:
        if settled[v.test].status not in REAL_FAILURES or category(v) == NOT_IMPLEMENTED:
            continue
        if v.status == Status.CONSEQUENCE and v.root_cause and all(r in missing for r in v.root_cause):
            for root in v.root_cause:  # it earns nothing (settle), but it is the unwritten root that stops it
                consequences.setdefault(root, []).append(v.test)
            continue
        for name in charged.get(v.test) or v.subjects:
            own_failures.setdefault(name, []).append(v.test)
            if getattr(v, "maybe_roots", None):
                maybe.setdefault(name, set()).update(v.maybe_roots)
            else:
                confident.add(name)
    # a root named only as one subject of a failing test charged to another subject (sample beside sampling_probs in
    # a test of both) hands its consequences to the names that test is charged to: it fails nothing of its own
    handed: dict[str, list[str]] = {}
    for v in verdicts:
        names = charged.get(v.test) or []
        if settled[v.test].status in REAL_FAILURES and names:
            for s in v.subjects:
                if s not in names:
                    handed.setdefault(s, []).extend(n for n in names if n not in handed.get(s, []))
    for v in verdicts:
        for root in settled[v.test].roots:
            for name in handed.get(root, [root]) if root not in own_failures else [root]:
                consequences.setdefault(name, []).append(v.test)
    roots = [n for n in own_failures if n in confident or not (maybe.get(n, set()) & set(own_failures))]
    roots += [n for n in consequences if n not in roots]
    if roots:
        lines.append("")
        lines.append("root causes, fix these first:")
        for name in sorted(roots, key=lambda n: (dependency_key(n)[0], -len(own_failures.get(n, [])), n)):
            own = len(own_failures.get(name, []))
            more = consequences.get(name, [])
            if own:
                tail = f"; {len(more)} other failure(s) trace back to it" if more else ""
                lines.append(f"  {name}: {own} failing test(s) of its own{tail}")
            else:  # no failing test of its own: not implemented yet, or judged only through others
                state = "not implemented; " if name in missing else ""
                lines.append(f"  {name}: {state}{len(more)} other failure(s) trace back to it")
    unverified = {n: sorted(maybe[n] & set(own_failures), key=dependency_key) for n in own_failures if n not in roots}
    if unverified:
        lines.append("")
        lines.append("may be consequences (no reference here to tell):")
        for name in sorted(unverified, key=dependency_key):
            ups = ", ".join(unverified[name])
            lines.append(
                f"  {name}: {len(own_failures[name])} failing test(s), may be consequences of {ups}: "
                f"fix {ups} first and rerun"
            )
    if missing:
        lines.append("")
        lines += [f"not implemented: {name}: {n} test{'s' if n > 1 else ''}" for name, n in sorted(missing.items())]
    return lines
