"""Root causes cannot be gamed, and inlined components are charged: implementations made from the
reference with catalogued patches applied, judged in a subprocess as users run the suite.

- A deliberately broken cheap component does not exempt a broken model: the model's failing test
  is rerun with that component replaced by a correct one, still fails, and is charged.
- Consequences are decided from behaviour (spec_tests/harness/judging/consequences.py): a caller that keeps
  its own copy of a component with the component's bug (it never calls the protocol function) is a
  consequence of it, reported once; a caller with a bug of its own is charged.
- A submission that recognises the composition calls (by the call stack) gains nothing.
"""

from __future__ import annotations

from pathlib import Path

from ahead import run_ahead  # tests/ahead.py: run by a runner process while other tests run
from suite_subprocess import implementation, run_suite, statuses

LOGITS = "test_model.py::test_logits_match_reference[llama_gqa-f64]"


@run_ahead
def test_control_a_component_bug_alone_makes_the_model_a_consequence(tmp_path):
    found = statuses(implementation(tmp_path, "rmsnorm_eps_outside_root"), tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED"
    assert found[LOGITS] == "CONSEQUENCE", found


@run_ahead
def test_a_broken_cheap_component_does_not_exempt_a_broken_model(tmp_path):
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root", "post_ln")
    found = statuses(folder, tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED"
    assert found[LOGITS] == "FAILED", found  # still wrong with a correct rmsnorm: charged


MHA = "test_attention.py::test_multihead_attention_with_rope[mha]"


@run_ahead
def test_control_attention_calling_a_broken_rope_is_a_consequence(tmp_path):
    found = statuses(implementation(tmp_path, "rope_frequency_exponent"), tmp_path, "rope")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED"
    assert found[MHA] == "CONSEQUENCE", found


def _inline_rope(folder: Path) -> None:
    """attention.py keeps its own copy of rope (a distinct function object with the same code)."""
    path = folder / "attention.py"
    source = path.read_text()
    anchor = "from .positions import rope\n"
    assert source.count(anchor) == 1
    copy = (
        "import types as _types\n\n"
        "rope = _types.FunctionType(rope.__code__, rope.__globals__, 'rope', rope.__defaults__, rope.__closure__)\n"
        "rope.__kwdefaults__ = dict(_positions_rope.__kwdefaults__ or {})\n"
    )
    path.write_text(
        source.replace(anchor, "from .positions import rope\nfrom .positions import rope as _positions_rope\n" + copy)
    )


@run_ahead
def test_a_component_inlined_by_its_caller_with_its_bug_is_a_consequence(tmp_path):
    folder = implementation(tmp_path, "rope_frequency_exponent", edit=_inline_rope)
    found = statuses(folder, tmp_path, "rope")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED"
    assert found[MHA] == "CONSEQUENCE", found  # the copy behaves as the broken rope: one charge


def _private_norm_class(folder: Path) -> None:
    """model.py never calls the protocol's rmsnorm: its RMSNorm module computes the same (buggy) formula."""
    path = folder / "model.py"
    source = path.read_text()
    for old, new in (
        ("from .norms import layernorm, rmsnorm\n", "from .norms import layernorm\n"),
        (
            "        return rmsnorm(x, self.weight, self.eps)\n",
            "        return x / (torch.sqrt((x * x).mean(-1, keepdim=True)) + self.eps) * self.weight\n",
        ),
    ):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path.write_text(source)


@run_ahead
def test_a_cascade_in_code_that_never_calls_protocol_names_is_reported_once(tmp_path):
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root", edit=_private_norm_class)
    found = statuses(folder, tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED"
    assert found[LOGITS] == "CONSEQUENCE", found


RECOGNISES = """

import os as _os
import sys as _sys


def _called_by_the_judge():
    frame, here = _sys._getframe(2), _os.path.dirname(_os.path.abspath(__file__))
    while frame is not None:
        name = _os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(here) and f"{_os.sep}reference{_os.sep}" in name:
            return True
        frame = frame.f_back
    return False


_buggy_rmsnorm = rmsnorm


def rmsnorm(x, weight, eps=1e-5):
    if _called_by_the_judge():  # behave correctly where the composition asks
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight
    return _buggy_rmsnorm(x, weight, eps)
"""


def _recognise_composition(folder: Path) -> None:
    path = folder / "norms.py"
    path.write_text(path.read_text() + RECOGNISES)


@run_ahead
def test_a_submission_that_recognises_the_composition_calls_gains_nothing(tmp_path):
    """A broken model (post-LN) with a broken rmsnorm that answers correctly when the reference's
    code calls it: the composition then is the reference, which the broken model does not match."""
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root", "post_ln", edit=_recognise_composition)
    found = statuses(folder, tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED"
    assert found[LOGITS] == "FAILED", found


@run_ahead
def test_a_test_of_two_functions_charges_the_one_that_failed(tmp_path):
    """test_sampling_probs_any_leading_shape judges sampling_probs and sample; with only
    sampling_probs wrong, the summary charges sampling_probs and never sample."""
    proc = run_suite(f"--impl={implementation(tmp_path, 'top_p_before_top_k')}", "-k", "sampling", cwd=tmp_path)
    roots = proc.stdout.split("root causes, fix these first:", 1)[1].split("=====", 1)[0]
    assert "  sampling_probs: " in roots, proc.stdout[-3000:]
    assert "  sample: " not in roots, roots


def _rope_table_crash(folder: Path) -> None:
    """The RoPE frequencies raise: rope crashes, and so does the model, through its own table helper."""
    path = folder / "positions.py"
    source = path.read_text()
    old = "    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head\n"
    assert source.count(old) == 1
    path.write_text(source.replace(old, '    raise IndexError("no frequencies for this head size")\n' + old))


def _forward_crash_of_its_own(folder: Path) -> None:
    """forward raises the very same exception on a line of its own, before it reaches RoPE."""
    _rope_table_crash(folder)
    path = folder / "model.py"
    source = path.read_text()
    old = "    if attention_mask is None and positions is None:\n        return model(ids, cache)\n"
    assert source.count(old) == 1
    path.write_text(source.replace(old, '    raise IndexError("no frequencies for this head size")\n' + old))


@run_ahead
def test_a_crash_in_a_component_that_the_model_reaches_its_own_way_is_a_consequence(tmp_path):
    """The correct model composed with the implementation's rope raises the same exception: one charge."""
    folder = implementation(tmp_path, edit=_rope_table_crash)
    found = statuses(folder, tmp_path, "test_rope or logits_match or multihead_attention_with_rope")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED"
    assert found[LOGITS] == "CONSEQUENCE" and found[MHA] == "CONSEQUENCE", found


@run_ahead
def test_a_crash_of_its_own_that_looks_like_the_upstream_one_is_charged(tmp_path):
    """forward raises rope's exception (type and message) on a line of its own: the correct forward composed
    with this rope raises it too, but at rope's line, not forward's, so the test is charged."""
    folder = implementation(tmp_path, edit=_forward_crash_of_its_own)
    found = statuses(folder, tmp_path, "test_rope or logits_match")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED"
    assert found[LOGITS] == "FAILED", found


def test_in_grading_a_crash_is_never_credited_as_a_consequence():
    """Grading (--spec-remote) keeps every crash charged: nothing after the upstream's raise was judged."""
    from spec_tests.harness.judging import rootcause
    from spec_tests.harness.subject.subject import ImplementationError

    exc = ImplementationError("forward", ("IndexError",), "no frequencies", "model.py:3 in forward")
    asked = []

    def rerun(names):
        asked.append(names)
        raise AssertionError("not reached")

    for credit in (True, False):
        registry = rootcause.FailureRegistry(crash_consequences=credit)
        registry.mark(["rope"], "test_rope", "error")
        run = rootcause.ItemRun("test_logits", "model", ("forward",), ("build_model",))
        raised = rootcause.judge_failure(None, run, exc, object(), object(), registry, rerun)
        assert raised is exc and run.verdict.status == "error"
    assert asked == [["rope"]]  # tried in pytest's run, not in grading's
