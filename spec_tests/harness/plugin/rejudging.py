"""Judging again, once the run has ended, the failures that ran before what can explain them.

A failure is a consequence of upstream names already seen failing (``judging/rootcause.py`` and the
checks' own ``spec.failing``), and the run order (``ordering.py``) puts every test after the tests of
the names it rests on. Inside a cycle it cannot: the model, its cache and its state dict rest on each
other, so a cache test may run before the ``forward`` test that shows the model wrong. Such a test,
charged, is run again when the session ends, against every failure the run has seen: where it is now
a consequence, that verdict replaces the first one, so the order of the cycle's tests decides nothing.

Only a charged failure that ran before a name it rests on was first seen failing is run again (a few
tests), with the failure registry frozen (``FailureRegistry.frozen``): the first run's record stands,
and a test judged again only ever turns into a consequence, never into a new failure. The second run must
fail every check the first failed (``failed_checks``): code that answers otherwise when asked again gains
nothing. The reports replace the first ones in pytest's counts and for the plugins that keep verdicts (the
grader's collector), without printing the test's progress again.

``promote_charged`` does the converse in pytest's counts only: a consequence whose roots, at the end, fail no test of
their own is charged by ``settling.settle`` (the spec summary and the grade), and its report is moved to the failures.
"""

from __future__ import annotations

from ..judging.results import CRASHES, REAL_FAILURES, Status
from .ordering import rests_on


def candidates(items, registry) -> list:
    """The items whose charged failure ran before a name they rest on was first seen failing, or, for a crash, before
    a name they rest on raised a crash new to it (the same crash, reached by that name's own test later)."""
    out = []
    for item in items:
        run = getattr(item, "_spec_run", None)
        verdict = getattr(run, "verdict", None)
        if verdict is None or verdict.status not in (*REAL_FAILURES, *CRASHES) or item.get_closest_marker("xfail"):
            continue
        upstream = rests_on(run.subjects, run.uses)
        crashed = verdict.status in CRASHES and registry.crashed_since(upstream, run.started)
        if registry.failed_since(upstream, run.started) or crashed:
            out.append(item)
    return out


def failed_checks(run) -> set[tuple[str, str]]:
    """``(subject, behaviour)`` of the checks a run of a test failed."""
    return {(r.subject, r.behaviour) for r in run.results if r.failed}


def replaces(first, again) -> bool:
    """Whether the second run of a test stands for it: a consequence that failed every check the first run failed."""
    verdict = getattr(again, "verdict", None)
    return verdict is not None and verdict.status == Status.CONSEQUENCE and failed_checks(first) <= failed_checks(again)


def settles(verdicts: dict, verdict) -> bool:
    """Whether ``verdict`` (a consequence) holds once settled beside ``verdicts`` and leaves every consequence that
    held before holding: a second run never turns two failures into consequences of each other (a crash in the
    cache reached first by a ``forward`` test, whose cache tests then deferred to ``forward``), which settling
    would charge both of."""
    from ..judging.settling import settle

    def held(records) -> set[str]:
        return {t for t, v in settle(records).items() if v.status == Status.CONSEQUENCE}

    before = held(verdicts.values())
    after = held([*(v for t, v in verdicts.items() if t != verdict.test), verdict])
    return verdict.test in after and before <= after


def rejudge(session, state) -> list[str]:
    """Run the candidates again; those that now end as consequences replace their first verdicts. Returns
    their test ids."""
    from _pytest.runner import runtestprotocol

    registry = state.registry
    items = candidates(session.items, registry)
    if not items or session.shouldfail or session.shouldstop:
        return []
    changed = []
    registry.frozen = True
    try:
        for item in items:
            first = item._spec_run
            reports = runtestprotocol(item, nextitem=None, log=False)
            again = getattr(item, "_spec_run", None)
            if again is None or not replaces(first, again):
                item._spec_run = first
                continue
            verdict = again.verdict
            if not settles(state.verdicts, verdict):
                item._spec_run = first
                continue
            _replace_reports(session.config, item, reports)
            state.verdicts[verdict.test] = verdict
            changed.append(verdict.test)
    finally:
        registry.frozen = False
    return changed


def _replace_reports(config, item, reports) -> None:
    """The new reports stand for the test: in the terminal's counts (its old ones dropped) and for every other
    plugin that reads reports (the grader's collector), without printing the test's progress again."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for key, kept in list(reporter.stats.items()):
            reporter.stats[key] = [r for r in kept if getattr(r, "nodeid", None) != item.nodeid]
        for report in reports:
            category, *_ = config.hook.pytest_report_teststatus(report=report, config=config)
            reporter.stats.setdefault(category, []).append(report)
    quiet = [reporter] if reporter is not None else []
    logreport = config.pluginmanager.subset_hook_caller("pytest_runtest_logreport", remove_plugins=quiet)
    for report in reports:
        logreport(report=report)
    finish = config.pluginmanager.subset_hook_caller("pytest_runtest_logfinish", remove_plugins=quiet)
    finish(nodeid=item.nodeid, location=item.location)


def promote_charged(session, state) -> list[str]:
    """The other way round: a test that ended as a consequence of names that, at the end, fail no test of their own
    is charged (``settling.settle``, the decision the grade reads). Its report moves from pytest's consequences to its
    failures, with the reason appended, so the terminal's counts, ``-rf`` and the failures section agree with the
    spec summary. Returns their test ids."""
    from ..judging.results import verdict_of
    from ..judging.settling import settle
    from .terminal import CONSEQUENCE

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not reporter.stats.get(CONSEQUENCE):
        return []
    settled = settle(state.verdicts.values())
    promoted = []
    for report in list(reporter.stats[CONSEQUENCE]):
        verdict = verdict_of(report)
        if verdict is None or verdict.test not in settled or settled[verdict.test].status != Status.FAILED:
            continue
        reporter.stats[CONSEQUENCE].remove(report)
        reporter.stats.setdefault("failed", []).append(report)
        report.longrepr = f"{report.longrepr}\n  {settled[verdict.test].reason}"
        report._spec_charged = True  # pytest's own "failed" status from here on
        promoted.append(verdict.test)
    if not reporter.stats[CONSEQUENCE]:
        del reporter.stats[CONSEQUENCE]
    return promoted
