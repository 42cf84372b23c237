"""The judge's pytest plugin (``-p spec_grading.collector``): each test's verdict, as data, to a file.

The judge is ``pytest spec_tests --spec-remote=<staged submission> -p spec_grading.collector ...``
(``judge.py`` builds the command). It never imports submission code: the suite's plugin runs the
submission in a sandboxed worker and attaches a typed verdict (``spec_tests.harness.judging.results``) to
each test's report. This plugin only keeps them:

- ``--grading-tests FILE``: the test ids to run (one per line); other collected tests are deselected;
- ``--grading-out DIR``: ``DIR/progress.jsonl`` gets one JSON line per finished test as it finishes,
  and ``DIR/verdicts.json`` is written atomically when the session ends (``finished: true``);
- ``--grading-describe``: also record what the rubric needs of each test (the manifest pass);
- ``--grading-parent-pid PID``: the judge dies with the grader (``PR_SET_PDEATHSIG``).

A test's entry: ``{"id", "status", "root_cause", "message", "failed_checks", "passed_checks"}``;
``status`` is the verdict's (passed | failed | consequence | not_implemented | setup | error |
skipped | xfailed), or ``error`` for a failure outside any verdict (a fixture, a teardown). Every
string is sanitised and capped here, and again by the grader.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from .textsafe import MESSAGE_CAP, clean, clean_data, write_atomic

FORMAT = 1
FINAL_NAME = "verdicts.json"
PROGRESS_NAME = "progress.jsonl"
FIELD_CAP = 1500  # characters of one field of a check result
MAX_FAILED_CHECKS = 5


def pytest_addoption(parser):
    group = parser.getgroup("spec-grading", "grading judge (spec-grade)")
    group.addoption("--grading-out", dest="grading_out", metavar="DIR", default=None, help="where verdicts go")
    group.addoption("--grading-tests", dest="grading_tests", metavar="FILE", default=None, help="test ids to run")
    group.addoption(
        "--grading-parent-pid", dest="grading_parent_pid", type=int, default=None, help="die with this process"
    )
    group.addoption(
        "--grading-describe", dest="grading_describe", action="store_true", help="record each test's rubric facts"
    )


def pytest_configure(config):
    out = config.getoption("grading_out", None)
    if not out:
        return
    parent = config.getoption("grading_parent_pid")
    if parent is not None:
        from spec_tests.harness.remote.server import die_with_parent

        die_with_parent()
        if os.getppid() != parent:  # the grader is already gone
            os._exit(5)
    config.pluginmanager.register(Collector(config, out), "spec_grading_collector")


def test_id(nodeid: str) -> str:
    return nodeid.split("spec_tests/", 1)[-1]


def describe_item(item) -> dict:
    """What the rubric and the reports need to know about a test (the manifest's entry)."""
    import inspect

    from spec_tests.harness.plugin import markers

    points = item.get_closest_marker("points")
    visibility = item.get_closest_marker("visibility")
    callspec = getattr(item, "callspec", None)
    subjects, _ = markers.subjects_of(item)
    uses = markers.needed_of(item)  # what it needs: an assignment that does not ask for one does not grade it
    tid = test_id(item.nodeid)
    return {
        "id": tid,
        "file": tid.split("::", 1)[0],
        "function": getattr(item, "originalname", None) or item.name,
        "params": callspec.id if callspec is not None else "",
        "doc": inspect.getdoc(getattr(item, "obj", None)) or "",
        "component": markers.component_of(item),
        "subjects": list(subjects),
        "uses": list(uses),
        "bug_classes": markers.bug_classes_of(item),
        "points": float(points.args[0]) if points and points.args else None,
        "visibility": visibility.args[0] if visibility and visibility.args else None,
    }


def _check_json(result) -> dict:
    data = result.to_json()
    for key in ("causes", "cause_codes", "advice"):
        data[key] = [clean(x, FIELD_CAP) for x in data.get(key, [])[:10]]
    return {k: clean(v, FIELD_CAP) if isinstance(v, str) else v for k, v in data.items()}


class Collector:
    def __init__(self, config, out: str):
        self.config = config
        self.out = os.path.abspath(out)
        os.makedirs(self.out, exist_ok=True)
        self.progress = open(os.path.join(self.out, PROGRESS_NAME), "a", encoding="utf-8")
        wanted = config.getoption("grading_tests")
        self.wanted = None
        if wanted:
            with open(wanted, encoding="utf-8") as f:
                self.wanted = {line.strip() for line in f if line.strip()}
        self.describe = config.getoption("grading_describe")
        self.tests: dict[str, dict] = {}
        self.described: dict[str, dict] = {}
        self.reports: dict[str, list] = {}
        self.could_not_run: str | None = None
        self.subject: dict = {}
        self.started = time.monotonic()
        self.early = EarlyStart(config) if config.getoption("spec_remote", None) else None

    # collection -------------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        if self.wanted is not None:
            keep = [i for i in items if test_id(i.nodeid) in self.wanted]
            drop = [i for i in items if test_id(i.nodeid) not in self.wanted]
            if drop:
                config.hook.pytest_deselected(items=drop)
            items[:] = keep
        if not items:
            return
        from spec_tests.harness.plugin.hooks import session_of

        try:  # the worker (started early): the submission is imported there, never here
            if self.early is not None:
                config._spec = self.early.result()
            state = session_of(config)
        except pytest.UsageError as exc:
            self.could_not_run = self.import_failure(str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. the worker did not start in time
            self.could_not_run = clean(f"the process running your code could not start: {exc}", MESSAGE_CAP)
        if self.could_not_run is not None:
            config.hook.pytest_deselected(items=list(items))
            items[:] = []
            return
        impl = state.impl
        worker = getattr(impl, "worker", None)
        self.subject = {
            "label": clean(impl.label, 200),
            "rope_style": clean(impl.rope_style, 40),
            "families": [clean(f, 40) for f in impl.families],
            "sandboxed": bool(getattr(worker, "sandboxed", False)),
            "sandbox_reason": clean(getattr(worker, "sandbox_reason", "") or "", 2000),
        }

    def pytest_collection_finish(self, session):
        if self.describe:  # after every deselection (-k, --grading-tests)
            self.described = {test_id(i.nodeid): describe_item(i) for i in session.items}

    def import_failure(self, text: str) -> str:
        """The suite's "failed to import" message without the grader's temporary paths."""
        staged = self.config.getoption("spec_remote") or ""
        text = re.sub(r"^implementation \S+ failed to import: ", "", text)
        for path in (os.path.dirname(staged.rstrip("/")) + "/", "/submission/"):
            if path != "/":
                text = text.replace(path, "")
        return clean(text, MESSAGE_CAP)

    # running ----------------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report):
        self.reports.setdefault(test_id(report.nodeid), []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        tid = test_id(nodeid)
        entry = self.entry(tid, self.reports.pop(tid, []))
        self.tests[tid] = entry
        self.progress.write(json.dumps(entry, ensure_ascii=True) + "\n")
        self.progress.flush()

    def entry(self, tid: str, reports: list) -> dict:
        from spec_tests.harness.judging.results import Status, results_of, verdict_of

        verdict, checks, error = None, [], None
        for report in reports:
            verdict = verdict_of(report) or verdict
            checks = results_of(report) or checks
            if report.failed and error is None and (verdict is None or report.when == "teardown"):
                error = f"the test failed during {report.when}: {_summary_line(report)}"
        if verdict is not None and error is None:
            status, root, message = verdict.status, list(verdict.root_cause), verdict.message
        elif error is not None:
            status, root, message = Status.ERROR, [], error
        elif any(r.skipped for r in reports):
            status, root, message = Status.SKIPPED, [], _summary_line(next(r for r in reports if r.skipped))
        else:
            status, root, message = Status.ERROR, [], "the test ended without a verdict"
        failed = [c for c in checks if c.failed]
        return {
            "id": tid,
            "status": status,
            "root_cause": [clean(r, 100) for r in root],
            "message": clean(message, MESSAGE_CAP),
            "failed_checks": [_check_json(c) for c in failed[:MAX_FAILED_CHECKS]],
            "passed_checks": len(checks) - len(failed),
        }

    # the end ----------------------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.early is not None and getattr(self.config, "_spec", None) is None:
            self.early.discard()  # nothing was collected: the early worker is not needed
        state = getattr(self.config, "_spec", None)
        worker = getattr(getattr(state, "impl", None), "worker", None)
        log_tail = ""
        if worker is not None:
            worker.close()  # idempotent; the suite's plugin closed it already
            self.subject["worker_restarts"] = int(getattr(worker, "restarts", 0))
            try:
                log_tail = worker.log.tail_text(2000)
            except Exception:  # noqa: BLE001 - a log is a nicety
                log_tail = ""
        data = {
            "format": FORMAT,
            "finished": True,
            "exitstatus": int(exitstatus),
            "could_not_run": self.could_not_run,
            "subject": self.subject,
            "worker_log_tail": clean(log_tail, 2000),
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "tests": self.tests,
        }
        if self.describe:
            data["described"] = self.described
        self.progress.close()
        write_atomic(os.path.join(self.out, FINAL_NAME), json.dumps(clean_data(data, MESSAGE_CAP), ensure_ascii=True))


class EarlyStart:
    """The suite's session (and so the worker, which imports torch and the submission) started on a
    thread at configure time, so that the worker's start overlaps the judge's own imports and
    collection; ``result()`` hands it over (or raises what starting it raised).

    The thread stays alive until ``discard()`` or the judge's exit: the sandbox's ``--die-with-parent``
    (``PR_SET_PDEATHSIG``) kills the worker when the *thread* that spawned it ends, so a thread that
    returned after starting the worker would have it killed, and the first test would start it again
    (an extra import of torch and the submission, charged as a restart)."""

    def __init__(self, config):
        self.config, self.state, self.error = config, None, None
        self._ready, self._release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="spec-grading-early-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from spec_tests.harness.plugin.hooks import Session

        try:
            self.state = Session(self.config)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread by result()
            self.error = exc
        self._ready.set()
        self._release.wait()  # the spawning thread outlives the worker it started (see the class docstring)

    def result(self):
        self._ready.wait()
        if self.error is not None:
            raise self.error
        return self.state

    def discard(self) -> None:
        self._ready.wait()
        worker = getattr(getattr(self.state, "impl", None), "worker", None)
        if worker is not None:
            worker.close()
        self._release.set()
        self.thread.join()


def _summary_line(report) -> str:
    """A skip's reason, or the last line of a failure's report (where the error is stated)."""
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    else:
        text = getattr(report, "longreprtext", "") or ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else report.outcome
