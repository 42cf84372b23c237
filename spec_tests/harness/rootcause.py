"""One bug costs once: telling a test's own failure from a consequence of a failing upstream name.

When a test fails while a protocol name it may depend on (``protocol.MAY_CALL``) has failed its own
tests, the test is run again with those names replaced, inside the implementation, by correct ones
(``Subject.substituted``: the reference in-process, the judge's oracle in grading). A test that then
passes failed only because of them: it is a *consequence*, reported under its root cause and not
charged. A test that still fails is charged: a broken upstream never excuses a broken downstream.
Components the implementation inlines (it never calls its own upstream function) are unaffected by
the replacement, so they are charged normally.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ..protocol import MAY_CALL, SUBSTITUTABLE
from .checks import ConsequenceFailure, SpecFailure
from .results import CheckResult, TestVerdict
from .subject import ImplementationError, NotImplementedInImpl

PASS_THROUGH = (pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception, KeyboardInterrupt)


def upstream_closure(names) -> set[str]:
    """Every protocol name the given names may call, directly or not."""
    seen, todo = set(), list(names)
    while todo:
        for callee in MAY_CALL.get(todo.pop(), ()):
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen


@dataclass
class FailureRegistry:
    """Protocol names whose own tests failed (charged) in this session, with those tests."""

    failing: dict[str, list[str]] = field(default_factory=dict)

    def mark(self, names, test: str) -> None:
        for name in names:
            self.failing.setdefault(name, []).append(test)

    def upstream_failing(self, subjects, used) -> list[str]:
        """Failing, substitutable names the test may depend on, other than what it judges."""
        candidates = (upstream_closure(used) | set(used)) - set(subjects)
        return sorted(n for n in candidates if n in self.failing and n in SUBSTITUTABLE)


@dataclass
class ItemRun:
    """The state of one spec test while it runs: its results, its verdict, how to rerun it."""

    test: str
    component: str
    subjects: tuple[str, ...]
    uses: tuple[str, ...]
    results: list[CheckResult] = field(default_factory=list)
    verdict: TestVerdict | None = None
    failure: BaseException | None = None

    def set_verdict(self, status: str, root_cause=(), message: str = "") -> None:
        self.verdict = TestVerdict(self.test, self.component, list(self.subjects), status, list(root_cause), message)


def classify(exc: BaseException, subjects) -> tuple[str, str | None]:
    """``(status, failing name)`` of a failure: failed | not_implemented | setup | error."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return classify(exc.exceptions[0], subjects)
    if isinstance(exc, NotImplementedInImpl):
        return ("not_implemented" if exc.name in subjects else "setup"), exc.name
    if isinstance(exc, ImplementationError):
        return ("error" if exc.name in subjects else "setup"), exc.name
    if isinstance(exc, SpecFailure):
        return "failed", None
    return "error", None


def judge_failure(item, run: ItemRun, exc: BaseException, impl, reference, registry: FailureRegistry, rerun):
    """The exception to report for a failed spec test (the original, or a consequence), and its verdict.

    ``rerun()`` runs the test body again and raises if it fails.
    """
    if isinstance(exc, PASS_THROUGH):
        return exc
    if isinstance(exc, ConsequenceFailure):  # the test itself showed it (Spec.check's rebase)
        run.set_verdict("consequence", exc.root, first_line(exc))
        return exc
    status, name = classify(exc, run.subjects)
    itself = isinstance(exc, NotImplementedInImpl) and exc.inner in ("", exc.name)  # no replacement can help
    used = set(run.subjects) | set(run.uses) | set(getattr(impl, "calls", ()))
    upstream = [] if itself else registry.upstream_failing(run.subjects, used)
    if upstream and reference is not None:
        replacements = {n: getattr(reference, n) for n in upstream}
        try:
            with impl.substituted(replacements):
                rerun()
        except PASS_THROUGH:
            raise
        except BaseException:  # noqa: BLE001 - still failing with correct upstream: charged below
            pass
        else:
            names = ", ".join(upstream)
            message = (
                f"consequence of failing {names}: this test passes when {names} "
                f"{'is' if len(upstream) == 1 else 'are'} replaced by a correct version inside your code. Fix "
                f"{names} first.\n  (it failed with: {first_line(exc)})"
            )
            run.set_verdict("consequence", upstream, message)
            result = CheckResult(
                run.test,
                run.subjects[0] if run.subjects else "",
                run.component,
                "failure traced to a failing upstream function",
                outcome="failed",
                kind="relation",
                found=message,
            )
            return ConsequenceFailure(result, upstream)
    if isinstance(exc, SpecFailure):
        exc.run_diagnosis()
    if upstream and reference is None:
        note = f"possibly a consequence of failing {', '.join(upstream)} (fix it first)"
        run.set_verdict(status, upstream, note)
    else:
        message = f"not implemented: {exc}" if isinstance(exc, NotImplementedInImpl) else first_line(exc)
        run.set_verdict(status, [name] if status == "setup" and name else [], message)
    # an expected failure (the implementation's SPEC_XFAILS) is a declared divergence, not a failing
    # function: tests downstream of it are judged as usual, and a failure they show is declared too
    expected = item is not None and item.get_closest_marker("xfail") is not None
    if status in ("failed", "not_implemented", "error") and not expected:
        registry.mark(failing_subjects(exc, run.subjects), run.test)
    return exc


def failing_subjects(exc: BaseException, subjects) -> tuple[str, ...]:
    """The subjects a failure is charged to: the one whose check failed or that raised, when the
    test judges several (a test of two functions where only one is wrong charges that one)."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return failing_subjects(exc.exceptions[0], subjects)
    if isinstance(exc, SpecFailure):
        name = exc.result.subject if exc.result is not None else None
    else:
        name = getattr(exc, "name", None)
    return (name,) if name in subjects else tuple(subjects)


def first_line(exc: BaseException) -> str:
    from .subject import safe_text

    text = safe_text(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
