"""One bug costs once: telling a test's own failure from a consequence of a failing upstream name.

Decided from behaviour (``consequences.py``), never by changing anything inside the implementation:

- a failing comparison with the reference (``Spec.check``) is a consequence when the reference
  composed with the implementation's own failing upstream functions computes the implementation's
  actual output (decided in the check itself);
- any other failing check (a relation, a requirement) is a consequence when the whole test, run on
  the reference composed with those functions instead of the implementation, fails at the same check
  (``judge_failure``'s composed rerun); a crash is a consequence when that rerun raises the same
  exception (type, message, place in the implementation's code) from one of those functions, called
  by the correct code, or, for model-bound names that cannot be composed, when that name's own tests
  were charged with the same crash (``crash_signature``: type, place, message but for its numbers);
  only in pytest's summary, never in grading (``FailureRegistry``);
- a crash in a used (not judged) name the subject may call, whose own tests pass, is the subject's
  (``forward`` given a cache, in the cache's tests), not a "setup" failure charged to nobody.

A test whose failure is not explained is charged: a broken upstream never excuses a broken
downstream. Only upstream failures that can explain a math check count (``failure_kind``: not a
precision, validation or convention failure). Without a reference (a handout replaying a
recording) nothing can be verified: the verdict says which failing upstream names it *may* be a
consequence of, and is charged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from ...protocol import PROTOCOL_NAMES
from ..subject.subject import ImplementationError, NotImplementedInImpl
from . import consequences
from .consequences import upstream_closure
from .results import CHARGED_TO_SUBJECTS, CRASHES, REAL_FAILURES, CheckResult, Status, TestVerdict
from .settling import dependency_order
from .spec import ConsequenceFailure, SpecFailure

PASS_THROUGH = (pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception, KeyboardInterrupt)

# Failure kinds (``failure_kind``) that can explain a downstream check at math tolerance.
EXPLAINING_KINDS = frozenset({"math", "error"})
# A miss of a check to float64 rounding (EXACT, 1e-10) by at most this many tolerances is rounding: float32
# arithmetic inside (2**-24 per operation, compounded through a model to 1e-5 at worst) stays below 1e-4. A miss
# beyond it (canonical weights coming back permuted, 0.6 off) is a wrong value that explains downstream checks.
ROUNDING_RATIO = 1e6
# Bug classes of tests that judge conventions, not the math a downstream check depends on.
CONVENTION_CLASSES = frozenset({"precision", "half_precision", "validation", "init", "memory"})


# ------------------------------------------------------------------------------------------------
# which failures can explain a downstream check
# ------------------------------------------------------------------------------------------------


def failure_kind(exc: BaseException, bug_classes=()) -> str:
    """``math`` | ``precision`` | ``validation`` | ``convention`` | ``error`` | ``not_implemented``."""
    from .tolerances import EXACT

    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return failure_kind(exc.exceptions[0], bug_classes)
    if isinstance(exc, NotImplementedInImpl):
        return "not_implemented"
    if isinstance(exc, ImplementationError):  # a crash on an input that must run, whatever the test's class
        return "error"
    classes = set(bug_classes)
    if classes and classes <= CONVENTION_CLASSES:
        return "convention" if not classes <= {"precision"} else "precision"
    if isinstance(exc, SpecFailure) and exc.result is not None:
        if exc.result.kind == "raises":
            return "validation"
        if exc.result.kind == "precision":
            return "precision"
        if exc.result.tolerance == EXACT.describe():  # float64 rounding: rounding if the miss is rounding-sized
            ratio = exc.result.ratio
            return "precision" if ratio is None or ratio <= ROUNDING_RATIO else "math"
    return "math"


@dataclass
class FailureRegistry:
    """Protocol names whose own tests failed (charged) in this session, with those tests and the
    kinds of their failures (``failure_kind``)."""

    failing: dict[str, list[str]] = field(default_factory=dict)
    kinds: dict[str, set[str]] = field(default_factory=dict)
    # a crash downstream of a crashing upstream name may be its consequence (pytest's summary: one charge).
    # Not in grading: a crash stops the computation where the upstream raised, so nothing after it was
    # judged, and crediting it would pay for downstream code that may not exist.
    crash_consequences: bool = True
    # names whose tests failed only as consequences of other names (their own roots pay: settling.settle)
    explained: dict[str, list[str]] = field(default_factory=dict)
    # a charged crash's place in the implementation's code (crash_signature) -> the names it is charged to
    crashes: dict[tuple, list[str]] = field(default_factory=dict)
    # names judged by a test that passed
    passing: set[str] = field(default_factory=set)
    # tests started so far, and when each name was first seen failing (its own failure or a consequence): a test
    # that ran before a name it rests on failed is judged again once the run has ended (plugin/rejudging.py)
    clock: int = 0
    first_failed: dict[str, int] = field(default_factory=dict)
    # when each name last met a crash it had not raised before (a new signature): a crash charged before another
    # test of a name it rests on raised the same crash is judged again too (plugin/rejudging.py)
    new_crash: dict[str, int] = field(default_factory=dict)
    # while a test is judged again after the run, it changes nothing here (its first verdict was recorded)
    frozen: bool = False

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def mark(self, names, test: str, kind: str = "math") -> None:
        if self.frozen:
            return
        for name in names:
            self.failing.setdefault(name, []).append(test)
            self.kinds.setdefault(name, set()).add(kind)
            if kind in EXPLAINING_KINDS:
                self.first_failed.setdefault(name, self.clock)

    def mark_passed(self, names) -> None:
        if not self.frozen:
            self.passing.update(names)

    def mark_explained(self, names, test: str) -> None:
        if self.frozen:
            return
        for name in names:
            self.explained.setdefault(name, []).append(test)
            self.first_failed.setdefault(name, self.clock)

    def failed_since(self, names, moment: int) -> list[str]:
        """Those of ``names`` first seen failing in a way that can explain a math check after ``moment``."""
        return dependency_order(n for n in names if self.first_failed.get(n, -1) > moment)

    def crashed_since(self, names, moment: int) -> list[str]:
        """Those of ``names`` that raised a crash new to them after ``moment``."""
        return dependency_order(n for n in names if self.new_crash.get(n, -1) > moment)

    def record_crash(self, names, exc: BaseException) -> None:
        if self.frozen:
            return
        signature = crash_signature(exc)
        if signature is not None:
            known = self.crashes.setdefault(signature, [])
            for n in names:
                if n not in known:
                    known.append(n)
                    self.new_crash[n] = self.clock

    def explaining(self, names, kinds=EXPLAINING_KINDS) -> list[str]:
        """Those of ``names`` with a failure that can explain a check at math tolerance (of ``kinds``)."""
        return [n for n in names if self.kinds.get(n, set()) & kinds]

    def behaving_wrongly(self, names, *, precision: bool = False) -> list[str]:
        """Those of ``names`` that fail tests that can explain a math check, their own or as consequences of
        other names (a model-bound name whose tests fail because a component does: ``Spec.failing``, for the
        checks that defer or rebase onto model-bound names; settling resolves such a root to its own roots).
        ``precision``: for a check to float64 rounding, which a precision failure explains too."""
        kinds = EXPLAINING_KINDS | {"precision"} if precision else EXPLAINING_KINDS
        return [n for n in names if n in self.explaining([n], kinds) or n in self.explained]

    def same_crash(self, exc: BaseException, candidates) -> list[str]:
        """The candidates charged with a crash at the same place in the implementation's code, of the same
        type and message (numbers aside): the one upstream first."""
        signature = crash_signature(exc)
        names = [n for n in self.crashes.get(signature, ()) if n in set(candidates)] if signature else []
        return dependency_order(names)[:1]

    def charged_upstream(self, name: str, exc: BaseException, subjects=()) -> list[str]:
        """The names upstream of ``name`` (other than ``subjects``) charged with ``exc``'s crash, at the same place:
        a crash the test's verdict will leave to them (``same_crash``), so probing its inputs would say nothing."""
        if not self.crash_consequences:
            return []
        return self.same_crash(exc, upstream_closure([name]) - {name} - set(subjects))

    def upstream_of(self, subject: str, *, precision: bool = False) -> list[str]:
        """Failing, composable names ``subject`` may call whose failures can explain a math check (their own, or
        consequences of other names: settling resolves such a root to its roots); with
        ``precision``, a check to float64 rounding, whose failure a precision failure upstream explains too (a
        float32 statistic in rmsnorm rounds a float64 model's logits)."""
        names = upstream_closure([subject]) - {subject}
        wrong = self.behaving_wrongly(names, precision=precision)  # consequences too: a chain settling resolves
        return dependency_order(n for n in wrong if n in consequences.COMPOSABLE)

    def rounding_upstream_of(self, subject: str) -> list[str]:
        """Composable names ``subject`` may call that fail for float32 rounding alone (precision failures, nothing
        else): a check to float64 rounding may carry their rounding (``consequences.explain_rounding``)."""
        names = upstream_closure([subject]) - {subject}
        return dependency_order(n for n in names if self.kinds.get(n) == {"precision"} and n in consequences.COMPOSABLE)

    def upstream_failing(self, subjects, used, *, composable: bool = True) -> list[str]:
        """Failing names the test may depend on, other than what it judges (dependency order). Names whose failures
        were consequences are left out here (a rerun of a whole test on them found wrong consequences: a mode check
        of a model whose attention's failures its mask explains); comparisons compose them (``upstream_of``)."""
        candidates = (upstream_closure(used) | set(used)) - set(subjects)
        names = self.explaining(candidates)
        return dependency_order(n for n in names if n in consequences.COMPOSABLE or not composable)


@dataclass
class ItemRun:
    """The state of one spec test while it runs: its results, its verdict, how to rerun it."""

    test: str
    component: str
    subjects: tuple[str, ...]
    uses: tuple[str, ...]
    bug_classes: tuple[str, ...] = ()  # its bug_class markers (read by the plugin)
    started: int = 0  # the registry's clock when it started (FailureRegistry.tick)
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
        return (Status.NOT_IMPLEMENTED if exc.name in subjects else Status.SETUP), exc.name
    if isinstance(exc, ImplementationError):
        return (Status.ERROR if exc.name in subjects else Status.SETUP), exc.name
    if isinstance(exc, SpecFailure):
        return Status.FAILED, None
    return Status.ERROR, None


def judge_failure(
    run: ItemRun, exc: BaseException, impl, reference, registry: FailureRegistry, rerun, *, expected: bool = False
):
    """The exception to report for a failed spec test (the original, or a consequence), and its verdict.
    ``expected``: the test is an expected failure (xfail, the implementation's ``SPEC_XFAILS``).

    ``rerun(names)`` runs the test body again on the reference composed with the implementation's
    ``names`` (``consequences.composed``), returns the ``Composition``, and raises what the body raises
    (with the composition as the exception's ``composition`` attribute).
    """
    if isinstance(exc, PASS_THROUGH):
        return exc
    # an expected failure (xfail) is no evidence about its subjects: never charged, never an explained failure
    if isinstance(exc, ConsequenceFailure):  # the check itself showed it (composition, rebase, defer)
        run.set_verdict(Status.CONSEQUENCE, exc.root, first_line(exc))
        if not expected:
            registry.mark_explained(failing_subjects(exc, run.subjects), run.test)
            if isinstance(exc.__cause__, ImplementationError):  # a crash its roots' function raises: where it raised
                registry.record_crash(list(exc.root), exc.__cause__)  # is theirs for the tests that meet it later
        return exc
    status, name = classify(exc, run.subjects)
    used = set(run.subjects) | set(run.uses) | set(getattr(impl, "calls", ()))
    if status == Status.SETUP and _through_a_callee_that_passes(exc, name, run.subjects, registry):
        status = Status.ERROR  # the subject's own behaviour, reached through a name it may call (forward with a cache)
    # a crash (in a judged name, or in one the test uses: "setup") may be an upstream function's crash
    crashed = registry.crash_consequences and status in CRASHES and isinstance(exc, ImplementationError)
    # a check that wanted one exception and got a crash (AttributeError for ValueError) is that crash too
    wrong_raise = getattr(exc, "raised", None) if registry.crash_consequences else None
    if crashed or isinstance(wrong_raise, ImplementationError):
        # what it uses, and any name outside its own callers: two names that raise at the same place in the code
        # (a config parser that build_model and kv_cache_bytes share) are one bug, charged where it showed first
        callers = {n for n in PROTOCOL_NAMES if set(run.subjects) & (upstream_closure([n]) - {n})}
        candidates = upstream_closure(used) | used | (set(PROTOCOL_NAMES) - callers)
        # the name that raised is no candidate; the test's other subjects are (train raising in a test of train and
        # evaluate where evaluate's own tests raise at the same place)
        raised = {name} if status == Status.ERROR and name else set(run.subjects)
        same = registry.same_crash(exc if crashed else wrong_raise, candidates - raised)
        if same:
            names = ", ".join(same)
            message = (
                f"consequence of failing {names}: your code raises here what {names}'s own tests raise, at the same "
                f"place in your code. Fix {names} first.\n  (it failed with: {first_line(exc)})"
            )
            behaviour = "the call runs on inputs the protocol allows"
            return _consequence(run, registry, same, message, behaviour, "require", explained=not expected)
    upstream = registry.upstream_failing(run.subjects, used) if status == Status.FAILED or crashed else []
    if upstream and reference is not None and not _compared(exc):
        roots = composed_rerun(exc, upstream, rerun)
        if roots:
            names = ", ".join(roots)
            message = (
                f"consequence of failing {names}: the correct {run.subjects[0] if run.subjects else 'code'} "
                f"composed with your own {names} fails this test at the same check. Fix {names} first.\n"
                f"  (it failed with: {first_line(exc)})"
            )
            behaviour = "failure traced to a failing upstream function"
            return _consequence(run, registry, roots, message, behaviour, "relation", explained=not expected)
    if isinstance(exc, SpecFailure):
        exc.run_diagnosis()
    message = f"not implemented: {exc}" if isinstance(exc, NotImplementedInImpl) else first_line(exc)
    maybe = registry.upstream_failing(run.subjects, used, composable=False) if reference is None else []
    run.set_verdict(status, [name] if status == Status.SETUP and name else [], message)
    if maybe and status in REAL_FAILURES:
        run.verdict.maybe_roots = maybe  # offline: nothing can be verified; fix these first and rerun
    # an expected failure (the implementation's SPEC_XFAILS) is a declared divergence, not a failing
    # function: tests downstream of it are judged as usual, and a failure they show is declared too
    if status in CHARGED_TO_SUBJECTS and not expected:
        kind = failure_kind(exc, list(run.bug_classes))
        charged = failing_subjects(exc, run.subjects)
        registry.mark(charged, run.test, kind)
        if status == Status.ERROR:
            registry.record_crash(charged, exc)
    return exc


def _consequence(run: ItemRun, registry: FailureRegistry, roots, message, behaviour, kind, *, explained):
    """The verdict and the exception of a failure the judge traced to ``roots`` (a shared crash, a composition)."""
    run.set_verdict(Status.CONSEQUENCE, roots, message)
    if explained:  # an expected failure (xfail) is no evidence about its subjects
        registry.mark_explained(run.subjects, run.test)
    subject = run.subjects[0] if run.subjects else ""
    result = CheckResult(run.test, subject, run.component, behaviour, outcome="failed", kind=kind, found=message)
    return ConsequenceFailure(result, roots)


def _through_a_callee_that_passes(exc: BaseException, name, subjects, registry: FailureRegistry) -> bool:
    """A name the test uses (not judges) raised, one its subjects may call, whose own tests (run before, upstream
    first) passed, and none failed, not even as a consequence: the crash is in behaviour only the subject's tests
    reach through it (``forward`` given a cache, in the cache's tests), so it is the subject's own failure."""
    if not isinstance(exc, ImplementationError) or isinstance(exc, NotImplementedInImpl) or not name:
        return False
    judged_right = name in registry.passing and name not in registry.failing and name not in registry.explained
    return judged_right and name in upstream_closure(subjects)


def crash_signature(exc: BaseException) -> tuple | None:
    """Where and how the implementation raised: the exception's type, its innermost frame in the implementation's
    own code (``_own_frame``; for code behind an adapter in an installed library, ``_library_frame``), and its
    message with numbers left out (the same line raises for inputs of other sizes); ``None`` when the place is
    unknown."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return crash_signature(exc.exceptions[0])
    if not isinstance(exc, ImplementationError) or isinstance(exc, NotImplementedInImpl):
        return None
    where = _own_frame(exc.original) or exc.where or _library_frame(exc.original)
    return (exc.type_name, where, numbers_aside(exc.message)) if where else None


# dtype names as torch's messages spell them ("float != double", "c10::BFloat16", "torch.float64", "Long")
_DTYPE = re.compile(
    r"\b(?:torch\.|c10::)?(?:b?float\d*|double|half|bfloat16|BFloat16|Half|Float|Double|Long|Int|Short|Byte|Bool|"
    r"u?int\d*|long|short|bool|complex\d*)\b"
)


def numbers_aside(message: str) -> str:
    """A message with its numbers and dtype names left out: the same line raises it for inputs of other sizes and
    dtypes (one cast to float32 meets a float64 input in one call and a bfloat16 one in another). Torch words two
    dtypes meeting in one operation by the operation ("expected scalar type Double but found Float", "expected m1 and
    m2 to have the same dtype, but got: float != c10::BFloat16"): any message naming a dtype and two dtype names is
    that one mistake (held out: a float32 softmax met a float64 attention in one call, a bfloat16 model in another)."""
    if len(_DTYPE.findall(message)) >= 2 and re.search(r"dtype|scalar type", message, re.IGNORECASE):
        return "<two dtypes meet in one operation>"
    numbered = re.sub(r"-?\d+", "#", _DTYPE.sub("<dtype>", message))
    # a shape's length is its rank: the same line raises for inputs of another rank ("Target sizes: [4, -1, -1, -1]"
    # for 3-D per-head tensors, "[-1, 4, -1, -1, -1]" for 4-D ones: held out, one repeat helper behind two names)
    return re.sub(r"([\[(])#(?:, ?#)*,?([\])])", r"\1#...\2", numbered)


def _own_frame(exc: BaseException | None) -> str:
    """The innermost frame outside the suite, the adapters, torch and installed packages: for code wired through an
    adapter file of its own (``--impl=path/adapter.py`` over a package beside it), the package's line, which every
    protocol name the adapter maps onto it reaches alike (``exc.where`` is the adapter's line, one per name)."""
    from ..diagnosis.crashes import own_frame

    return own_frame(exc)


def _library_frame(exc: BaseException | None) -> str:
    """For code behind an adapter (``exc.where`` is empty): the innermost frame outside torch, Python's standard
    library and the suite, a library's own frames included (transformers' attention raising where two names
    reach it)."""
    from ..diagnosis.crashes import own_frame

    return own_frame(exc, libraries=True)


def _compared(exc: BaseException) -> bool:
    """A failed comparison with the reference: its check already asked the composition."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _compared(exc.exceptions[0])
    return isinstance(exc, SpecFailure) and exc.result is not None and exc.result.kind == "compare"


def _same_check(again: BaseException, exc: BaseException) -> bool:
    if isinstance(again, BaseExceptionGroup) and again.exceptions:
        again = again.exceptions[0]
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if type(again) is not SpecFailure or type(exc) is not SpecFailure:
        return False
    a, b = again.result, exc.result
    return a is not None and b is not None and (a.subject, a.behaviour, a.kind) == (b.subject, b.behaviour, b.kind)


def _same_raise(again: BaseException, exc: BaseException) -> bool:
    """The correct code, given the implementation's upstream, raises what the implementation raised (type and
    message, numbers aside) in its own code: the upstream's output is what no correct downstream can take (NaN
    probabilities from a top-k that keeps nothing, which any sampler refuses)."""
    if not isinstance(exc, ImplementationError) or exc.process or isinstance(again, SpecFailure | AssertionError):
        return False
    if isinstance(again, ImplementationError):
        if again.process:
            return False
        kind, message = again.type_name, again.message
    else:  # the reference's own code raised (torch refusing what the upstream handed on)
        kind, message = type(again).__name__, str(again)
    return kind == exc.type_name and numbers_aside(message) == numbers_aside(exc.message)


def composed_rerun(exc: BaseException, upstream, rerun) -> list[str]:
    """The roots (dependency order) when the test fails at the same check (or raises the same exception,
    from the implementation's own upstream function) on the reference composed with the implementation's
    ``upstream``; ``[]`` when it passes there, fails differently, or the implementation's answers to the
    composition are not those of a function of its inputs."""
    from .tolerances import tolerance

    try:
        rerun(upstream)
        return []  # the correct code with these upstream functions passes: not explained
    except KeyboardInterrupt:
        raise
    except BaseException as again:  # noqa: BLE001 - any other outcome explains nothing
        comp = getattr(again, "composition", None)
        crash = getattr(comp, "raised", None) is not None and consequences.same_crash(again, exc)
        if comp is None or not (_same_check(again, exc) or crash or _same_raise(again, exc)):
            return []
    roots = dependency_order(n for n in {*comp.called, comp.raised} if n in upstream)
    if not roots or not comp.consistent(tolerance("model")):
        return []
    return roots


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
    from ..text import plain_text

    text = plain_text(exc, 2000).strip().splitlines()
    return text[0] if text else type(exc).__name__
