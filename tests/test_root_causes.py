"""Root causes cannot be gamed, and inlined components are charged: implementations made from the
reference with catalogued patches applied, judged in a subprocess as users run the suite.

- A deliberately broken cheap component does not exempt a broken model: the model's failing test
  is rerun with that component replaced by a correct one, still fails, and is charged.
- A component the implementation inlines (its caller never calls the protocol function, so no
  replacement reaches it) is charged to the caller, not deferred to the component.
"""

from __future__ import annotations

from pathlib import Path

from suite_subprocess import implementation, run_suite, statuses

LOGITS = "test_model.py::test_logits_match_reference[llama_gqa-f64]"


def test_control_a_component_bug_alone_makes_the_model_a_consequence(tmp_path):
    found = statuses(implementation(tmp_path, "rmsnorm_eps_outside_root"), tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED"
    assert found[LOGITS] == "CONSEQUENCE", found


def test_a_broken_cheap_component_does_not_exempt_a_broken_model(tmp_path):
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root", "post_ln")
    found = statuses(folder, tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED"
    assert found[LOGITS] == "FAILED", found  # still wrong with a correct rmsnorm: charged


MHA = "test_attention.py::test_multihead_attention_with_rope[mha]"


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


def test_a_component_inlined_by_its_caller_is_charged_to_the_caller(tmp_path):
    folder = implementation(tmp_path, "rope_frequency_exponent", edit=_inline_rope)
    found = statuses(folder, tmp_path, "rope")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED"
    assert found[MHA] == "FAILED", found  # no replacement of rope reaches the copy: charged


def test_a_test_of_two_functions_charges_the_one_that_failed(tmp_path):
    """test_sampling_probs_any_leading_shape judges sampling_probs and sample; with only
    sampling_probs wrong, the summary charges sampling_probs and never sample."""
    proc = run_suite(f"--impl={implementation(tmp_path, 'top_p_before_top_k')}", "-k", "sampling", cwd=tmp_path)
    roots = proc.stdout.split("root causes, fix these first:", 1)[1].split("=====", 1)[0]
    assert "  sampling_probs: " in roots, proc.stdout[-3000:]
    assert "  sample: " not in roots, roots
