"""The per-test ``spec`` object: how a test judges an implementation.

- ``spec.call(name, *args, **kwargs)``: the implementation's ``name`` on the inputs against the
  reference's on float64 copies (the subject is the function's name);
- ``spec.check(compute, *args, subject=...)``: the same for ``compute(subject_like, *args)``;
- ``spec.expected(compute, *args)``: the reference's value only;
- ``spec.close(actual, expected)``: values the test computed itself (relations: the implementation
  against its own other outputs);
- ``spec.require(condition, ...)`` and ``spec.raises(ValueError, call, ...)``.

Each records one ``CheckResult`` (``results.py``) and raises ``SpecFailure`` when it fails.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

from ...protocol import PROTOCOL_NAMES
from ..subject.subject import ImplementationError, NotImplementedInImpl
from . import tolerance_measurement
from .compare import mismatch, shape_note
from .results import CheckResult
from .tolerances import BFLOAT16, EXACT, Tolerance, tolerance
from .treemap import clone_tensors, floating_dtype, in_place_reading, modified_inputs, to_float64

# protocol name -> ``explain(spec, args, kwargs)``: for a call of that name that raised, ``(roots, why)`` where a
# correct version of it, composed with the implementation's own failing upstream ``roots``, cannot run either (and
# runs with the reference's), else None. The spec tests register them: they hold the oracles a correct version
# is built from (``oracles.py``).
UPSTREAM_CRASHES: dict[str, Callable] = {}


def tolerance_dtype(kind: str, value) -> torch.dtype:
    """The dtype whose tolerance judges a check of ``kind`` on ``value``: its floating dtype; bfloat16 only where the
    table has a bfloat16 entry for the kind, float32 for other 16-bit values."""
    dtype = floating_dtype(value) or torch.float64
    if dtype == torch.bfloat16 and kind in BFLOAT16:
        return dtype
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _place(exc, own: str) -> str:
    """Where an implementation's exception was raised, for a failure's text: the innermost frame in its own files
    (``own``) where that is not the frame the call was made through, else that frame."""
    if own and own != exc.where:
        return f" (in your code at {own})"
    return f" (at {exc.where})" if exc.where else ""


def _tentative(hint: str | None) -> bool:
    """A hint that is weak evidence or a note: a test's variant that fits says more, and then it is not said."""
    return bool(hint) and hint.startswith(("likely cause (weak", "note:"))


def first_reading(readings, tol) -> tuple[list[str], list[str]]:
    """The lines and codes of the first of ``readings`` (callables ``(tol) -> (lines, codes)``) that says something."""
    for reading in readings:
        found = reading(tol)
        if found[0]:
            return found
    return [], []


IN_PLACE_FIX = (
    "compute on a copy (x = x / temperature, not x /= temperature; out-of-place ops), never on the caller's tensor"
)


class SpecFailure(AssertionError):
    """A behaviour the implementation does not meet; the message is the whole report.

    ``diagnose`` (when set) explains the failure on demand: the plugin asks for it only when the
    failure is charged to this test, not when a root-cause rerun shows it is a consequence.
    """

    def __init__(self, result: CheckResult | str, diagnose: Callable[[], tuple[list, list]] | None = None):
        self.result = result if isinstance(result, CheckResult) else None
        self._diagnose = diagnose
        super().__init__(result.message() if isinstance(result, CheckResult) else result)

    def run_diagnosis(self) -> None:
        if self._diagnose is None or self.result is None:
            return
        diagnose, self._diagnose = self._diagnose, None
        lines, codes = diagnose()
        self.result.causes, self.result.cause_codes = [*self.result.causes, *lines], [*self.result.cause_codes, *codes]
        self.args = (self.result.message(),)

    def __str__(self) -> str:
        return self.result.message() if self.result is not None else super().__str__()


def inplace_consequence(subject: str | None, roots: list[str]) -> str:
    """What a failure to leave the inputs unchanged that ``roots`` explain says (``Spec.inplace_upstream``)."""
    names = ", ".join(roots)
    return (
        f"consequence of failing {names}: a correct {subject or 'call'} that calls your own {names} changes its "
        f"inputs in place the very same way (your {names} edits what it is given). Fix {names} first."
    )


class ConsequenceFailure(SpecFailure):
    """A failure that disappears when failing upstream names are corrected: charged to ``root``."""

    def __init__(self, result: CheckResult, root):
        super().__init__(result)
        self.root = list(root)


class Spec:
    """What a test needs: the subject under test, expected values, and the device."""

    def __init__(
        self,
        impl,
        expectations,
        device: str,
        test_id: str,
        component: str,
        subjects=(),
        *,
        sink=None,
        failing=lambda names, **_: [],
        upstream=lambda subject, precision=False: [],
        rounding_upstream=lambda subject: [],
        crash_consequences: bool = True,
        charged_upstream=lambda name, exc, subjects=(): [],
    ):
        from ..diagnosis.crashes import Probing

        self.impl, self.expectations, self.device = Probing(impl, self._crashed), expectations, device
        self._crashes: dict = {}  # (name, type, message) of a crash -> (probe lines, own frame)
        self._raise_expected = False  # inside ``raises``: an exception is the contract, not a crash to probe
        self._checking = False  # inside ``check``'s computation: a crash is composed there, as that computation
        self.failing = failing  # names -> those of them whose own failures can explain a math check
        self.upstream = upstream  # subject -> the failing upstream names it may call (consequences.py)
        self.rounding_upstream = rounding_upstream  # subject -> those failing for float32 rounding alone
        self.crash_consequences = crash_consequences  # not in grading (rootcause.FailureRegistry)
        # (name, exc, subjects) -> upstream names charged with the same crash at the same place: not probed again
        self.charged_upstream = charged_upstream
        self.test_id, self.component, self.subjects = test_id, component, tuple(subjects)
        self.results: list[CheckResult] = sink if sink is not None else []
        self._labels: dict[str, int] = {}
        from ... import inputs

        self.inputs = inputs.On(device)

    # ---------------------------------------------------------------------------------- helpers
    def _key(self, label: str | None) -> str:
        label = label or "value"
        n = self._labels.get(label, 0)
        self._labels[label] = n + 1
        return f"{self.test_id}::{label}#{n}"

    def _result(self, subject: str | None, behaviour: str, **fields) -> CheckResult:
        subject = subject or (self.subjects[0] if self.subjects else "")
        result = CheckResult(self.test_id, subject, self.component, behaviour, **fields)
        self.results.append(result)
        return result

    def _tolerance(self, kind: str, value, tol: Tolerance | None) -> Tolerance:
        if tol is not None:
            return tol
        return tolerance(kind, tolerance_dtype(kind, value), self.device)

    # ---------------------------------------------------------------------------------- checks
    def expected(self, compute: Callable, *args, label: str | None = None):
        """``compute(reference, *args)`` with floating inputs promoted to float64."""
        args64 = to_float64(args)
        return self.expectations.value(self._key(label), lambda ref: compute(ref, *args64), args64)

    def call(
        self,
        name: str,
        *args,
        behaviour: str,
        kind: str = "pointwise",
        label: str | None = None,
        tol: Tolerance | None = None,
        axes: str | None = None,
        hint: str | None = None,
        hint_code: str | None = None,
        rebase=None,
        **kwargs,
    ):
        """The implementation's ``name(*args, **kwargs)`` against the reference's; returns the actual value.
        ``rebase``: as ``check`` takes it."""
        return self.check(
            lambda m, *a: getattr(m, name)(*a, **kwargs),
            *args,
            subject=name,
            behaviour=behaviour,
            kind=kind,
            label=label,
            tol=tol,
            axes=axes,
            call=(name, kwargs),
            hint=hint,
            hint_code=hint_code,
            rebase=rebase,
        )

    def check(
        self,
        compute: Callable,
        *args,
        behaviour: str,
        subject: str | None = None,
        kind: str = "pointwise",
        label: str | None = None,
        tol: Tolerance | None = None,
        axes: str | None = None,
        call=None,
        rebase=None,
        given=None,
        hint: str | None = None,
        hint_code: str | None = None,
        variants=(),
        model_knobs: bool = False,
        weights_used: bool = False,
        step=None,
        readings=(),
    ):
        """Assert ``compute(impl, *args)`` equals ``compute(reference, *float64 args)``; returns the actual value.

        The tolerance is the table's math tolerance for ``kind``, unless ``tol`` is given.

        ``rebase = (names, own)`` (or a list of them, tried in turn): when the check fails while some of ``names``
        (model-bound names that cannot be swapped for correct ones) fail their own tests, ``own()`` gives what a correct
        subject computes on top of the implementation's own (failing) upstream. Matching it makes the
        failure a consequence of those names; not matching it leaves the failure charged here.

        ``given = (names, holds, why)``: what the check presumes of model-bound ``names``, shown by the
        implementation's own outputs (``holds()``: e.g. that the model its weights build is determined by
        them). When the check fails and ``holds()`` is False, the check cannot judge its subject (``why``
        says so): a consequence of those names, which holds only while they fail tests of their own
        (``settling.settle``). A list of such tuples: each presumption in turn.

        ``variants``: ``Variant``s (``diagnosis/variant.py``) whose ``compute(reference, *float64 args)`` is
        the specified computation with one knob changed; one that reproduces the failing output is named.
        ``model_knobs``: also try the reference model with one knob of one of its components turned
        (``diagnosis/model_knobs.py``), for computations that run a model.
        ``weights_used``: where no variant fits, change each canonical weight alone (``diagnosis/sensitivity.py``)
        and name those the implementation ignores (with ``model_knobs`` too).
        ``step = (what, one)``: where no variant fits, ``one(subject, *args)`` (``{"loss", "weights"}`` after one
        optimisation step) on the implementation and the reference names the weights whose step alone differs
        (``diagnosis/steps.py``).
        ``readings``: callables ``(tol) -> (lines, codes)`` measuring the implementation further, tried in turn where
        no variant fits (as ``close``'s).
        """
        pristine = clone_tensors(args)
        try:
            self._checking = True  # a crash inside is composed as this computation (``_crash_composed``)
            actual = compute(self.impl, *args)
        except ImplementationError as exc:
            self._explain_crash(exc, subject, compute, call, pristine)
            self._crash_composed(exc, subject, compute, pristine)
            raise
        finally:
            self._checking = False
        changed = modified_inputs(pristine, args)
        if changed:  # a failing upstream that edits what it is given: the composed rerun of the test shows it
            edit = in_place_reading(pristine, args, changed[0])
            self.require(
                False,
                subject=subject,
                behaviour="Inputs are never modified in place (protocol v1, Conventions)",
                found=f"the implementation changed input(s) {changed} during the call",
                causes=(f"likely cause: {changed[0]}: {edit}. Fix: {IN_PLACE_FIX}",) if edit else (),
                codes=("knob:in_place",) if edit else (),
            )
        key = self._key(label)
        args64 = to_float64(pristine)
        expected = self.expectations.value(key, lambda ref: compute(ref, *args64), args64)
        subject = subject or (self.subjects[0] if self.subjects else "")
        self.expectations.observe_check(key, subject, lambda bug: compute(bug, *clone_tensors(pristine)))
        if tol is None and tolerance_measurement.enabled():  # only checks judged at a math tolerance
            dtype = tolerance_dtype(kind, args)
            tolerance_measurement.record(
                kind if dtype != torch.bfloat16 else f"{kind}@bfloat16", self.test_id, actual, expected
            )
        tol = self._tolerance(kind, args, tol)
        found = mismatch(actual, expected, tol)
        result = self._result(subject, behaviour, kind="compare", tolerance=tol.describe())
        if found is None:
            return actual
        result.outcome, result.found, result.ratio, result.where = "failed", found.found, found.ratio, found.where
        result.note = shape_note(actual, expected)
        # a weak hint is said where none of the test's variants fits (one that fits names the mistake itself)
        weak = _tentative(hint) and bool(variants)
        if hint and not weak:
            result.causes.append(hint)
            result.cause_codes += [hint_code] if hint_code else []
        reference = getattr(self.expectations, "reference", None)
        self._composed(result, compute, args64, actual, tol, reference, expected, kind)
        if rebase is not None:
            self._rebase(result, rebase, actual, tol)
        for presumed in given if isinstance(given, list) else [] if given is None else [given]:
            self._given(result, presumed)

        def diagnose():
            from ..diagnosis import diagnose as run
            from ..diagnosis.variant import fitting_variants, variant_lines

            batch_rows = ([], [])

            if call is not None:  # each row alone right and the rows together not (diagnosis/rows.py), or the logits
                # shifted by their max right (shifted.py): every fit to this output is a coincidence, so that is all
                from ...protocol import BATCH_ROWS
                from ..diagnosis.rows import rows_alone
                from ..diagnosis.shifted import shifted

                raw = getattr(self.impl, "_subject", self.impl)
                for reading in (rows_alone, shifted):
                    found = reading(call[0], lambda *a: compute(raw, *a), args64, call[1], actual, expected, tol)
                    if found[0] and reading is rows_alone and call[0] in BATCH_ROWS:
                        batch_rows = found  # a batch's rows reaching each other: a knob that fits says how
                    elif found[0]:
                        return found
            tried = list(variants)
            memo = f"{self.impl.label}::{self.test_id.split('[')[0]}"
            if model_knobs and reference is not None:
                from ..diagnosis.model_knobs import model_variants

                tried += model_variants(compute, reference, args64, memo=memo)
            fitting = fitting_variants(tried, actual, tol, reference, *args64) if reference else []
            lines, codes = variant_lines(fitting)
            if weak and not any(v in variants for v in fitting):
                lines, codes = [hint, *lines], ([hint_code] if hint_code else []) + codes
            if model_knobs and reference is not None:
                from ..diagnosis.model_knobs import remember

                remember(memo, [v for v in fitting if v not in variants])
            if (model_knobs or weights_used) and reference is not None and not fitting:  # which weights are unused?
                from ..diagnosis.sensitivity import ignored_weights

                found = ignored_weights(compute, self.impl, reference, pristine, args64, actual, expected, tol)
                if not found[0]:  # two weights in each other's places
                    from ..diagnosis.sensitivity import swapped_weights

                    found = swapped_weights(compute, reference, args64, actual, tol)
                lines, codes = lines + found[0], codes + found[1]
                if model_knobs and not found[0]:  # the attention's scale, fitted inside the model
                    from ..diagnosis.constant_fit import model_scale_lines

                    found = model_scale_lines(compute, reference, args64, actual, tol, memo)
                    lines, codes = lines + found[0], codes + found[1]
                if model_knobs and not found[0]:  # where in the stack the model goes wrong
                    from ..diagnosis.depth import depth_lines

                    found = depth_lines(compute, self.impl, reference, pristine, args64, tol)
                    lines, codes = lines + found[0], codes + found[1]
            if not fitting:
                found = first_reading(readings, tol)
                lines, codes = lines + found[0], codes + found[1]
            if step is not None and reference is not None and not fitting:  # which weights' step differs
                from ..diagnosis.steps import step_lines

                raw = getattr(self.impl, "_subject", self.impl)
                found = step_lines(
                    step[0], lambda: step[1](raw, *clone_tensors(pristine)), lambda: step[1](reference, *args64), tol
                )
                if found[0] and weak and lines[:1] == [hint]:  # the step read on the implementation says more
                    lines, codes = lines[1:], codes[1:] if hint_code else codes
                lines, codes = lines + found[0], codes + found[1]
            if call is not None and not fitting:  # an activation's constants, measured on the implementation
                from ..diagnosis.activation_fit import fitted_activation

                raw = getattr(self.impl, "_subject", self.impl)
                run_raw = lambda *a: compute(raw, *a)  # the implementation's own call, measured
                found = fitted_activation(call[0], run_raw, args64, call[1], actual, tol)
                lines, codes = lines + found[0], codes + found[1]
                if not found[0]:  # a constant of the computation, fitted to the output
                    from ..diagnosis.constant_fit import fitted_constant

                    found = fitted_constant(call[0], run_raw, args64, call[1], actual, tol, self.impl.rope_style)
                    lines, codes = lines + found[0], codes + found[1]
            more, more_codes = run(
                subject=subject,
                call=call,
                args64=args64,
                actual=actual,
                expected=expected,
                tol=tol,
                axes=axes,
                rope_style=self.impl.rope_style,
                known_bugs=lambda: self.expectations.known_bugs(
                    key, subject, lambda bug: compute(bug, *clone_tensors(pristine)), actual, tol
                ),
                input_dtype=floating_dtype(pristine),
                second=second,
                reduced=reduced,
            )
            if lines and lines[0].startswith("likely cause (ambiguous"):  # several of the test's variants fit: a
                # catalogued bug that reproduces the output is one of them, no more certain than the others
                more = [line for line in more if not line.startswith(("matches known bug", "or matches"))]
                more_codes = [c for c in more_codes if not c.startswith("known_bug:")]
            if batch_rows[0] and not any(line.startswith("likely cause:") for line in lines + more):
                return batch_rows  # nothing more specific names how the rows reach each other
            return lines + more, codes + more_codes

        def second():
            """The call on a second input, as a knob's confirmation (``diagnosis.diagnose``)."""
            from ..diagnosis.knobs import mixed_input

            args2 = mixed_input(pristine) if call is not None else None
            if args2 is None:
                return None
            try:
                return to_float64(args2), compute(getattr(self.impl, "_subject", self.impl), *args2)
            except Exception:  # noqa: BLE001 - what does not run confirms nothing
                return None

        def reduced():
            """The call again with each of its options dropped in turn (left at its default), where it has two or
            more: ``(kwargs, actual)`` pairs, as a knob's confirmation (``diagnosis.diagnose``)."""
            name, kwargs = call if call is not None else (None, {})
            given = [k for k, v in kwargs.items() if v is not None]
            raw = getattr(self.impl, "_subject", self.impl)
            found = []
            for key in given if len(given) > 1 else ():
                fewer = {k: v for k, v in kwargs.items() if k != key}
                try:
                    found.append((to_float64(fewer), getattr(raw, name)(*clone_tensors(pristine), **fewer)))
                except Exception:  # noqa: BLE001 - what does not run confirms nothing
                    continue
            return found

        raise SpecFailure(result, diagnose)

    def _composed(
        self, result: CheckResult, compute, args64, actual, tol: Tolerance, reference, expected=None, kind="model"
    ) -> None:
        """Raise ``ConsequenceFailure`` when the reference composed with the implementation's own failing
        upstream functions computes ``actual`` (consequences.py); otherwise the failure stays charged. A check
        to float64 rounding whose error is the float32 rounding of an upstream failing for that alone is its
        consequence too (``explain_rounding``)."""
        composing = getattr(self, "composing", False)  # a rerun on the composed reference: no nesting
        precision = tol.describe() == EXACT.describe()  # a check to float64 rounding
        candidates = (
            self.upstream(result.subject, precision=precision) if reference is not None and not composing else []
        )
        if not candidates:
            return
        from .consequences import explain, explain_rounding

        roots = explain(compute, args64, actual, tol, reference, self.impl._subject, candidates)
        rounded = []
        if not roots and precision and expected is not None:
            loose = self._tolerance(kind, args64, None)
            rounding = [n for n in self.rounding_upstream(result.subject) if n in candidates]
            impl = self.impl._subject
            rounded = explain_rounding(compute, args64, actual, expected, loose, reference, impl, rounding)
        if not roots and not rounded:
            return
        names = ", ".join(roots or rounded)
        if rounded:
            result.found = (
                f"consequence of failing {names}: your result carries {names}'s float32 rounding (it equals, to "
                f"float32 rounding, what a correct {result.subject} computes with your own {names}, and lies nearer "
                f"to that than to the float64 result). Fix {names} first and rerun: a float32 step of "
                f"{result.subject}'s own would then show here.\n  (it failed with: {result.found})"
            )
            roots = rounded
        else:
            result.found = (
                f"consequence of failing {names}: your result equals what a correct {result.subject} computes with "
                f"your own {names} (called on the correct intermediate values). Fix {names} first.\n  "
                f"(it failed with: {result.found})"
            )
        result.causes, result.cause_codes = [], []  # the roots' own tests say what is wrong
        raise ConsequenceFailure(result, roots)

    def inplace_upstream(self, subject: str, compute, pristine, after) -> list[str]:
        """The failing upstream name (one, upstream first) whose own function, called by the reference composed with
        it (``compute(reference, *copies of pristine)``), changes those copies as the implementation's call changed
        ``after``: the in-place edit is that function's. ``[]`` when none does (or outside pytest's judgement)."""
        from .consequences import COMPOSABLE, composed
        from .settling import dependency_order

        reference = getattr(self.expectations, "reference", None)
        if reference is None or not self.crash_consequences or getattr(self, "composing", False):
            return []
        raw = self.impl._subject
        for name in dependency_order(n for n in self.upstream(subject) if n in COMPOSABLE and raw.provides(n)):
            copies = clone_tensors(pristine)
            try:
                with composed(reference, raw, [name]):
                    compute(reference, *copies)
            except Exception:  # noqa: BLE001 - a composition that cannot run explains nothing
                continue
            if modified_inputs(pristine, copies) and not modified_inputs(copies, after):
                return [name]
        return []

    def _crash_composed(self, exc: ImplementationError, subject, compute, pristine) -> None:
        """Raise ``ConsequenceFailure`` when the reference composed with one of the implementation's own failing
        upstream functions raises the same exception (consequences.explain_crash); otherwise the crash stays
        charged here."""
        reference = getattr(self.expectations, "reference", None)
        subject = subject or (self.subjects[0] if self.subjects else "")
        if reference is None or not self.crash_consequences or getattr(self, "composing", False):
            return
        candidates = self.upstream(subject)
        if not candidates:
            return
        from .consequences import explain_crash

        roots = explain_crash(compute, to_float64(pristine), exc, reference, self.impl._subject, candidates)
        if roots:
            self._crash_consequence(subject, roots, exc)

    def _crash_consequence(self, subject: str, roots: list[str], exc: ImplementationError, why: str = "") -> None:
        """Raise the ``ConsequenceFailure`` of a crash a correct ``subject`` meets with the implementation's own
        ``roots``: the same exception at the same place, or ``why`` (a correct ``subject`` cannot run either)."""
        names = ", ".join(roots)
        result = self._result(subject, "the call runs on inputs the protocol allows", kind="require")
        result.outcome = "failed"
        result.found = (
            f"consequence of failing {names}: your code raises what a correct {subject} raises when it calls your "
            f"own {names} on the correct intermediate values ({exc.type_name}: {exc.message}). Fix {names} first."
            if not why
            else f"consequence of failing {names}: {why} Fix {names} first.\n  (it raised {exc.type_name}: "
            f"{exc.message})"
        )
        raise ConsequenceFailure(result, roots) from exc

    def _explain_crash(self, exc: ImplementationError, subject, compute, call, pristine) -> None:
        """A check's computation raised: probe its inputs (``_crashed``) unless the protocol call that
        raised was probed already."""
        if call is not None:
            name, kwargs = call
            raw = self.impl._subject
            run = lambda *a, **k: getattr(raw, name)(*a, **k)
            self._crashed(name, run, pristine, dict(kwargs), exc, fresh=self.impl.fresh_for(name))
        else:
            self._crashed(subject or exc.name, lambda *a: compute(self.impl._subject, *a), pristine, {}, exc)

    def _crashed(self, name: str, run, args, kwargs, exc: ImplementationError, fresh=None) -> None:
        """The implementation raised in ``run(*args, **kwargs)``: probe which input property triggers it
        (``diagnosis/crashes.py``), record it as a failed result, and add it to the exception's message."""
        from ..diagnosis.crashes import out_of_memory, own_frame, probe

        if self._raise_expected:
            return
        key = (exc.name, exc.type_name, exc.message)
        if key not in self._crashes and len(self._crashes) < 2:  # Hypothesis examples crash alike: probe twice
            self._crashes[key] = None  # a probe's own crash is not probed again
            # a timeout or a lost process is not an input's fault that a retry could show, and every retry
            # would cost the worker a restart; memory running out is a raise on one machine and a kill on another
            # an upstream name charged with the same crash at the same place has it: the verdict leaves it to it
            known = exc.process or out_of_memory(exc) or self.charged_upstream(name, exc, self.subjects)
            if known:
                lines, codes = [], []
            else:
                with self.impl._subject.diagnosing():
                    lines, codes = probe(name, run, args, kwargs, self.impl.ledger, fresh, exc)
            where = own_frame(exc.original)
            subject = exc.name if exc.name in PROTOCOL_NAMES else (self.subjects[0] if self.subjects else "")
            result = self._result(subject, "the call runs on inputs the protocol allows", kind="require")
            result.outcome, result.found = "failed", f"{name} raised {exc.type_name}: {exc.message}{_place(exc, where)}"
            result.causes, result.cause_codes = list(lines), list(codes)
            self._crashes[key] = (lines, where)
        lines, where = self._crashes.get(key) or ([], "")
        extra = [f"in your code at {where}"] if where and where != exc.where else []
        text = str(exc)
        if (lines or extra) and not text.endswith(tuple(lines or extra)):
            exc.args = ("\n  ".join([text, *extra, *lines]),)
        self._upstream_crash(name, args, kwargs, exc)

    def _upstream_crash(self, name: str, args, kwargs, exc: ImplementationError) -> None:
        """Raise ``ConsequenceFailure`` for a protocol call that raised where the reference's ``name`` composed with
        one of the implementation's own failing upstream functions raises the same crash at the same place
        (``consequences.explain_crash``; a call of tensors and numbers only, outside ``check``, which composes its
        own computation), or where the spec tests' explainer of ``name`` (``UPSTREAM_CRASHES``) finds that a
        correct ``name`` composed with them cannot run either."""
        from ..diagnosis.crashes import plain

        if not self.crash_consequences or getattr(self, "composing", False):
            return
        reference = getattr(self.expectations, "reference", None)
        direct = reference is not None and not self._checking and plain((args, kwargs))
        if direct and (candidates := self.upstream(name)):
            from .consequences import explain_crash

            kw64 = to_float64(dict(kwargs))
            compute = lambda m, *a: getattr(m, name)(*a, **kw64)
            # the very tensors the call raised on where they are float64 (an expanded layout is kept: a copy is
            # contiguous); the implementation's call has failed, so what the composition does to them is moot
            roots = explain_crash(compute, to_float64(args), exc, reference, self.impl._subject, candidates)
            if roots:
                self._crash_consequence(name, roots, exc)
        explain = UPSTREAM_CRASHES.get(name)
        found = explain(self, args, kwargs) if explain is not None else None
        if found:
            roots, why = found
            self._crash_consequence(name, roots, exc, why)

    def _rebase(self, result: CheckResult, rebase, actual, tol: Tolerance) -> None:
        if isinstance(rebase, list):  # several upstream names, each with its own correct computation: in turn
            for one in rebase:
                self._rebase(result, one, actual, tol)
            return
        names, own = rebase
        failing = self.failing(names)
        if not failing:
            return
        if mismatch(actual, own(), tol) is None:
            names = ", ".join(failing)
            result.found = (
                f"consequence of failing {names}: the result differs from the reference's but equals what a correct "
                f"{result.subject} computes with your own {names}. Fix {names} first.\n  (it failed with: "
                f"{result.found})"
            )
            raise ConsequenceFailure(result, failing)
        result.advice.append(
            f"it also differs from what a correct {result.subject} computes with your own {', '.join(failing)}"
        )

    def _given(self, result: CheckResult, given) -> None:
        names, holds, why = given
        try:
            if holds():
                return
        except Exception:  # noqa: BLE001 - what cannot be shown explains nothing: the failure stays charged
            return
        failing = self.failing(names) or list(names)  # settling charges it if none of them fails on its own
        names = ", ".join(failing)
        result.found = (
            f"consequence of failing {names}: {why}, so this check cannot judge {result.subject}. Fix {names} first."
            f"\n  (it failed with: {result.found})"
        )
        result.causes, result.cause_codes = [], []
        raise ConsequenceFailure(result, failing)

    @contextmanager
    def unless_failing(self, names, behaviour: str, why: str):
        """Judge the block; where it fails (a check or a crash) while some of the model-bound ``names`` fail their own
        tests, the failure is left to them (``why``: why it cannot judge the subject then). The block runs first, so a
        subject that is right passes whatever else fails, and whether the test is a consequence does not depend on
        which of the model's tests ran before it (``plugin/rejudging.py`` judges it again once the run has ended)."""
        try:
            yield
        except (SpecFailure, ImplementationError) as exc:
            if isinstance(exc, (ConsequenceFailure, NotImplementedInImpl)):
                raise
            failing = self.failing(names)
            if not failing:
                raise
            names = ", ".join(failing)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise self.defer(failing, behaviour, f"not judged: {names} {why}.\n  (it failed with: {first})") from None

    def defer(self, root, behaviour: str, found: str, subject: str | None = None) -> ConsequenceFailure:
        """A failure this test leaves to ``root`` (another check reports it): raise the returned exception."""
        result = self._result(subject, behaviour, kind="relation", outcome="failed", found=found)
        return ConsequenceFailure(result, root)

    def close(
        self,
        actual,
        expected,
        *,
        behaviour: str,
        subject: str | None = None,
        kind: str | None = None,
        tol: Tolerance | None = None,
        axes: str | None = None,
        variants=(),
        hint: str | None = None,
        hint_code: str | None = None,
        structural: bool = True,
        rebase=None,
        readings=(),
    ):
        """Compare two values the test computed (a relation); ``kind`` picks a math tolerance.

        ``variants``: ``Variant``s whose ``compute()`` gives the related value with one knob changed.
        ``structural=False``: no structural detectors (the test's ``hint`` reads the evidence better).
        ``rebase``: as for ``check`` (``expected`` is what a correct implementation gives).
        ``readings``: callables ``(tol) -> (lines, codes)``, each a further call of the implementation that localises
        the difference (``diagnosis/steps.py``), tried in turn where no variant fits; the first that says something is
        said.
        """
        if tol is None and kind and tolerance_measurement.enabled():
            tolerance_measurement.record(kind, self.test_id, actual, expected)
        if tol is None:
            tol = self._tolerance(kind or "pointwise", expected, None)
        found = mismatch(actual, expected, tol)
        result = self._result(subject, behaviour, kind="relation", tolerance=tol.describe())
        if found is None:
            return
        result.outcome, result.found, result.ratio, result.where = "failed", found.found, found.ratio, found.where
        result.note = shape_note(actual, expected)
        if rebase is not None:
            self._rebase(result, rebase, actual, tol)
        tentative = _tentative(hint) and bool(variants)  # said where none of the variants fits
        if hint and not tentative:
            result.causes.append(hint)
            result.cause_codes += [hint_code] if hint_code else []

        def diagnose():
            from ..diagnosis import diagnose as run
            from ..diagnosis.variant import fitting_variants, variant_lines

            fitting = fitting_variants(variants, actual, tol, expected=expected)
            lines, codes = variant_lines(fitting)
            if not fitting:
                found = first_reading(readings, tol)
                lines, codes = lines + found[0], codes + found[1]
            if tentative and not fitting and not lines:
                lines, codes = [hint, *lines], ([hint_code] if hint_code else []) + codes
            more, more_codes = run(
                subject=subject,
                call=None,
                args64=None,
                actual=actual,
                expected=expected,
                tol=tol,
                axes=axes,
                rope_style=self.impl.rope_style,
                known_bugs=list,
                structural=structural,
            )
            return lines + more, codes + more_codes

        raise SpecFailure(result, diagnose)

    def require(
        self,
        condition: bool,
        *,
        behaviour: str,
        found: str,
        subject: str | None = None,
        causes: tuple[str, ...] = (),
        codes: tuple[str, ...] = (),
    ) -> None:
        """Fail with ``found`` unless ``condition`` holds. ``causes``: diagnosis lines the test can state,
        ``codes``: their cause codes (diagnosis/codes.py)."""
        result = self._result(subject, behaviour, kind="require")
        if condition:
            return
        result.outcome, result.found, result.causes, result.cause_codes = "failed", found, list(causes), list(codes)
        raise SpecFailure(result)

    def raises(
        self,
        exc_type: type[BaseException],
        call: Callable,
        *,
        behaviour: str,
        subject: str | None = None,
        mention: tuple[str, ...] = (),
        causes: tuple[str, ...] = (),
        codes: tuple[str, ...] = (),
    ) -> None:
        """Fail unless ``call()`` raises ``exc_type`` (the protocol's contract).

        ``mention``: values a good message names. A message without them is advice shown with the
        result, never a failure: the protocol fixes the exception type and condition, not the wording.
        """
        result = self._result(subject, behaviour, kind="raises")
        expected, self._raise_expected = self._raise_expected, True
        try:
            call()
        except NotImplementedInImpl:
            raise
        except ImplementationError as exc:
            if exc.is_a(exc_type):
                missing = [s for s in mention if s not in exc.message]
                if missing:
                    result.advice.append(
                        f"advice: the {exc.type_name} message {exc.message!r} does not mention {missing}; "
                        "naming the bad values helps whoever reads it"
                    )
                return
            from ..diagnosis.crashes import own_frame

            found = f"raised {exc.type_name} instead: {exc.message}{_place(exc, own_frame(exc.original))}"
            result.outcome, result.found = "failed", found
            result.causes, result.cause_codes = list(causes), list(codes)  # the condition was not checked either
            failure = SpecFailure(result)
            failure.raised = exc  # a crash another name's tests charge at the same place is one bug (rootcause.py)
            raise failure from None
        finally:
            self._raise_expected = expected
        result.outcome, result.found = "failed", f"no error was raised (expected {exc_type.__name__})"
        result.causes, result.cause_codes = list(causes), list(codes)
        raise SpecFailure(result)
