"""Root causes cannot be gamed, and inlined components are charged: implementations made from the
reference with catalogued patches applied, judged as users run the suite: each run by a runner of
tests/ahead.py, in a fork of its interpreter (``run_forked``: tests/suite_subprocess.py says what such a
run keeps apart).

- A deliberately broken cheap component does not exempt a broken model: the model's failing test
  is rerun with that component replaced by a correct one, still fails, and is charged.
- Consequences are decided from behaviour (spec_tests/harness/judging/consequences.py): a caller that keeps
  its own copy of a component with the component's bug (it never calls the protocol function) is a
  consequence of it, reported once; a caller with a bug of its own is charged.
- A submission that recognises the composition calls (by the call stack) gains nothing.
- Model-bound names (the model, the cache, train_step under train) cannot be composed: their consumers are
  judged on top of the implementation's own model, cache or train_step, so one bug there is charged once (a
  component bug is not charged to build_model or train_step, a copied tied head only to build_model, a crashing
  cache only to new_cache), while a consumer broken on its own is still charged.
"""

from __future__ import annotations

import re
from pathlib import Path

from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run
from suite_subprocess import implementation, run_suite, statuses

LOGITS = "test_model.py::test_logits_match_reference[llama_gqa-f64]"


@run_ahead
def test_control_a_component_bug_alone_makes_the_model_a_consequence(tmp_path):
    found = statuses(implementation(tmp_path, "rmsnorm_eps_outside_root"), tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED", found
    assert found[LOGITS] == "CONSEQUENCE", found


@run_ahead
def test_a_broken_cheap_component_does_not_exempt_a_broken_model(tmp_path):
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root", "post_ln")
    found = statuses(folder, tmp_path, "rmsnorm or logits_match")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED", found
    assert found[LOGITS] == "FAILED", found  # still wrong with a correct rmsnorm: charged


MHA = "test_attention.py::test_multihead_attention_with_rope[mha]"


@run_ahead
def test_control_attention_calling_a_broken_rope_is_a_consequence(tmp_path):
    found = statuses(implementation(tmp_path, "rope_frequency_exponent"), tmp_path, "rope")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED", found
    assert found[MHA] == "CONSEQUENCE", found


def _inline_rope(folder: Path) -> None:
    """attention.py keeps its own copy of rope (a distinct function object with the same code)."""
    path = folder / "attention.py"
    source = path.read_text()
    anchor = "from .positions import rope\n"
    assert source.count(anchor) == 1, anchor
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
    assert found["test_positions.py::test_rope[f64]"] == "FAILED", found
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
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED", found
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
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED", found
    assert found[LOGITS] == "FAILED", found


@run_ahead
def test_a_test_of_two_functions_charges_the_one_that_failed(tmp_path):
    """test_sampling_probs_any_leading_shape judges sampling_probs and sample; with only
    sampling_probs wrong, the summary charges sampling_probs and never sample."""
    proc = run_suite(
        f"--impl={implementation(tmp_path, 'top_p_before_top_k')}", "-k", "sampling", cwd=tmp_path, forked=True
    )
    roots = proc.stdout.split("root causes, fix these first:", 1)[1].split("=====", 1)[0]
    assert "  sampling_probs: " in roots, proc.stdout[-3000:]
    assert "  sample: " not in roots, roots


def _rope_table_crash(folder: Path) -> None:
    """The RoPE frequencies raise: rope crashes, and so does the model, through its own table helper."""
    path = folder / "positions.py"
    source = path.read_text()
    old = "    exponents = torch.arange(0, d_head, 2, dtype=torch.float64) / d_head\n"
    assert source.count(old) == 1, old
    path.write_text(source.replace(old, '    raise IndexError("no frequencies for this head size")\n' + old))


def _forward_crash_of_its_own(folder: Path) -> None:
    """forward raises the very same exception on a line of its own, before it reaches RoPE."""
    _rope_table_crash(folder)
    path = folder / "model.py"
    source = path.read_text()
    old = "    if attention_mask is None and positions is None:\n        return model(ids, cache)\n"
    assert source.count(old) == 1, old
    path.write_text(source.replace(old, '    raise IndexError("no frequencies for this head size")\n' + old))


@run_ahead
def test_a_crash_in_a_component_that_the_model_reaches_its_own_way_is_a_consequence(tmp_path):
    """The correct model composed with the implementation's rope raises the same exception: one charge."""
    folder = implementation(tmp_path, edit=_rope_table_crash)
    found = statuses(folder, tmp_path, "test_rope or logits_match or multihead_attention_with_rope")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED", found
    assert found[LOGITS] == "CONSEQUENCE" and found[MHA] == "CONSEQUENCE", found


@run_ahead
def test_a_crash_of_its_own_that_looks_like_the_upstream_one_is_charged(tmp_path):
    """forward raises rope's exception (type and message) on a line of its own: the correct forward composed
    with this rope raises it too, but at rope's line, not forward's, so the test is charged."""
    folder = implementation(tmp_path, edit=_forward_crash_of_its_own)
    found = statuses(folder, tmp_path, "test_rope or logits_match")
    assert found["test_positions.py::test_rope[f64]"] == "FAILED", found
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
        raised = rootcause.judge_failure(run, exc, object(), object(), registry, rerun)
        assert raised is exc and run.verdict.status == "error"
    assert asked == [["rope"]]  # tried in pytest's run, not in grading's


# ------------------------------------------------------------------------------------------------
# model-bound names: one bug, one charged group (issue 18)


@run_ahead
def test_a_component_bug_is_not_charged_to_build_model_through_the_default_config(tmp_path):
    """The defaults are judged as a relation on the implementation's own models (omitted = written out): an rmsnorm
    bug leaves it passing, and the default config's logits are rmsnorm's consequence."""
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root")
    found = statuses(folder, tmp_path, "rmsnorm or defaults or default_config")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED", found
    assert found["test_model.py::test_config_defaults[llama]"] == "PASSED", found
    assert found["test_model.py::test_default_config_logits_match_reference[llama]"] == "CONSEQUENCE", found


def _default_theta_500000(folder: Path) -> None:
    path = folder / "config.py"
    source = path.read_text()
    old = "    rope_theta: float = 10000.0\n"
    assert source.count(old) == 1, old
    path.write_text(source.replace(old, "    rope_theta: float = 500000.0\n"))


@run_ahead
def test_a_wrong_default_is_still_charged_to_build_model(tmp_path):
    found = statuses(implementation(tmp_path, edit=_default_theta_500000), tmp_path, "config_defaults")
    assert found["test_model.py::test_config_defaults[llama]"] == "FAILED", found
    assert found["test_model.py::test_config_defaults[gpt2]"] == "PASSED", found  # no RoPE, no theta


STEP = "test_training.py::test_train_step_matches_reference[llama-no-clip-sgd]"


@run_ahead
def test_a_component_bug_is_not_charged_to_train_step(tmp_path):
    """train_step is judged on top of the model's own forward (a correct step on the implementation's model): an
    rmsnorm bug fails forward as its consequence, and train_step as forward's, settled to rmsnorm."""
    found = statuses(implementation(tmp_path, "rmsnorm_eps_outside_root"), tmp_path, "rmsnorm or logits_match or step")
    assert found["test_norms.py::test_rmsnorm[f64-small]"] == "FAILED", found
    assert found[LOGITS] == "CONSEQUENCE" and found[STEP] == "CONSEQUENCE", found


@run_ahead
def test_a_broken_train_step_is_charged_beside_a_broken_component(tmp_path):
    folder = implementation(tmp_path, "rmsnorm_eps_outside_root", "train_step_no_zero_grad")
    found = statuses(folder, tmp_path, "rmsnorm or logits_match or train_step_matches")
    assert found[STEP.replace("no-clip-sgd", "no-clip-adamw")] == "FAILED", found


def _copy_the_tied_head(folder: Path) -> None:
    """A tied head that is a copy of the embedding made before loading: it keeps its initialisation, counts as a
    parameter of its own and trains apart (loading and canonical names skip it, so nothing crashes)."""
    path = folder / "model.py"
    source = path.read_text()
    for old, new in (
        (
            "            self.lm_head.weight = self.tok_embeddings.weight  # one parameter, two uses\n",
            "            self.lm_head.weight = nn.Parameter(self.tok_embeddings.weight.detach().clone())\n",
        ),
        (
            "    params = dict(model.named_parameters())  # a tied lm_head is not listed separately\n",
            "    params = {k: p for k, p in model.named_parameters() if not (k == 'lm_head.weight' and "
            "model.config.tie_embeddings)}\n",
        ),
        (
            "    return {name: p.detach() for name, p in model.named_parameters()}\n",
            "    return {name: p.detach() for name, p in model.named_parameters() if not (name == 'lm_head.weight' and "
            "model.config.tie_embeddings)}\n",
        ),
    ):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path.write_text(source)


COPY_SELECT = "logits_match_reference or count_parameters or train_step_matches or determined or tied_head"


@run_ahead
def test_a_tied_head_that_is_a_copy_is_charged_to_build_model_once(tmp_path):
    found = statuses(implementation(tmp_path, edit=_copy_the_tied_head), tmp_path, COPY_SELECT)
    assert found["test_model.py::test_tied_head_is_the_embedding_parameter[llama]"] == "FAILED", found
    assert found["test_model.py::test_model_is_determined_by_its_weights[llama_gqa]"] == "FAILED", found
    assert found["test_model.py::test_logits_match_reference[llama_gqa-f64]"] == "CONSEQUENCE", found
    assert found["test_model.py::test_logits_match_reference[llama_mha-f64]"] == "PASSED", found  # untied
    assert found["test_model.py::test_count_parameters[llama_gqa]"] == "CONSEQUENCE", found
    assert found[STEP] == "CONSEQUENCE", found


def _copy_and_miscount(folder: Path) -> None:
    """The copied head, and count_parameters one too many whatever the model holds."""
    _copy_the_tied_head(folder)
    path = folder / "model.py"
    source = path.read_text()
    old = "    return sum(p.numel() for p in model.parameters())\n"
    assert source.count(old) == 1, old
    path.write_text(source.replace(old, "    return sum(p.numel() for p in model.parameters()) + 1\n"))


@run_ahead
def test_beside_a_copied_head_a_broken_count_and_step_are_charged(tmp_path):
    folder = implementation(tmp_path, "train_step_no_zero_grad", edit=_copy_and_miscount)
    found = statuses(folder, tmp_path, COPY_SELECT)
    assert found["test_model.py::test_count_parameters[llama_gqa]"] == "FAILED", found
    assert found[STEP.replace("no-clip-sgd", "no-clip-adamw")] == "FAILED", found


CACHED = "test_kv_cache.py::test_cached_logits_equal_full_forward[llama_gqa-token-by-token]"
LAYOUT = "test_kv_cache.py::test_cache_layout_rotated_keys_plain_values[llama_gqa]"
GREEDY = "test_generation.py::test_greedy_generation_follows_the_model[llama-cache]"


@run_ahead
def test_a_crashing_cache_is_charged_once_and_generate_crashing_in_it_is_its_consequence(tmp_path):
    """The cache raises in its own update (forward given a cache, whose own tests pass): the cache's tests are
    charged to new_cache; cache_kv's and generate's tests, raising at the same place, are its consequences."""
    folder = implementation(tmp_path, "kv_cache_wrong_axis")
    proc = run_suite(f"--impl={folder}", "-k", "kv_cache or greedy or logits_match", "-vv", cwd=tmp_path, forked=True)
    found = dict(re.findall(r"spec_tests/(\S+::\S+) +(PASSED|FAILED|CONSEQUENCE|SKIPPED)", proc.stdout))
    assert found[CACHED] == "FAILED" and found[LAYOUT] == "CONSEQUENCE" and found[GREEDY] == "CONSEQUENCE", found
    roots = proc.stdout.split("root causes, fix these first:", 1)[1].split("=====", 1)[0]
    assert [line.split(":")[0].strip() for line in roots.strip().splitlines()] == ["new_cache"], roots


def _generate_crashes_on_its_own(folder: Path) -> None:
    path = folder / "generation.py"
    source = path.read_text()
    old = "    ctx = model.config.context_length\n"
    assert source.count(old) == 1, old
    new = old + '    if use_cache:\n        raise RuntimeError("Sizes of tensors must match except in dimension 1")\n'
    path.write_text(source.replace(old, new))


@run_ahead
def test_a_generate_that_crashes_on_its_own_beside_a_crashing_cache_is_charged(tmp_path):
    folder = implementation(tmp_path, "kv_cache_wrong_axis", edit=_generate_crashes_on_its_own)
    found = statuses(folder, tmp_path, "cached_logits or greedy or logits_match")
    assert found[CACHED] == "FAILED" and found[GREEDY] == "FAILED", found


@run_ahead
def test_a_cache_that_appends_wrongly_costs_the_cache_once(tmp_path):
    """Positions restart at every cached call: the cache's contents after chunks differ from one prefill, which
    new_cache's logits relations already charge; what cache_kv reads is judged on one prefill, and is right."""
    found = statuses(implementation(tmp_path, "cache_positions_restart"), tmp_path, "test_kv_cache")
    assert found[CACHED] == "FAILED" and found[LAYOUT] == "CONSEQUENCE", found
    assert found["test_kv_cache.py::test_cache_holds_the_specified_keys_and_values[llama_gqa]"] == "PASSED", found


def _cache_kv_swaps_keys_and_values(folder: Path) -> None:
    path = folder / "kv_cache.py"
    source = path.read_text()
    old = "    return cache.kv(layer)\n"
    assert source.count(old) == 1, old
    path.write_text(source.replace(old, "    k, v = cache.kv(layer)\n    return v, k\n"))


@run_ahead
def test_a_broken_cache_kv_beside_a_cache_that_appends_wrongly_is_charged(tmp_path):
    folder = implementation(tmp_path, "cache_positions_restart", edit=_cache_kv_swaps_keys_and_values)
    found = statuses(folder, tmp_path, "test_kv_cache")
    assert found[LAYOUT] == "FAILED", found


KEEPS = "test_training.py::test_train_keeps_its_optimizer_state_across_steps"


@run_ahead
def test_a_train_step_bug_is_not_charged_again_to_train(tmp_path):
    """train is judged on top of the implementation's own train_step (which it may call): clipping after the step
    fails train_step, and train's losses are those of a correct loop around that train_step."""
    found = statuses(implementation(tmp_path, "clip_after_step"), tmp_path, "train_step_matches or train_keeps")
    assert found["test_training.py::test_train_step_matches_reference[llama-clip0.5-sgd]"] == "FAILED", found
    assert found[KEEPS] == "CONSEQUENCE", found


@run_ahead
def test_a_broken_train_beside_a_broken_train_step_is_charged(tmp_path):
    folder = implementation(tmp_path, "clip_after_step", "train_optimizer_made_every_step")
    found = statuses(folder, tmp_path, "train_step_matches or train_keeps")
    assert found[KEEPS] == "FAILED", found


@run_ahead
def test_windows_left_in_the_datas_dtype_cost_get_batch_once(tmp_path):
    """Token data kept in its own dtype (numpy uint16 windows) fails get_batch's own test; train and evaluate on the
    same data, which cut their windows the same way, are its consequence (held-out batch 65), never a second
    charge, while the same test on long data still judges them."""
    found = statuses(implementation(tmp_path, "token_data_keeps_its_dtype"), tmp_path, "any_integer_dtype or windows")
    assert found["test_training.py::test_get_batch_windows_and_shift[numpy-uint16]"] == "FAILED", found
    assert found["test_training.py::test_train_and_evaluate_take_tokens_of_any_integer_dtype[llama]"] == "CONSEQUENCE"


def test_a_model_holding_a_head_bias_is_named_by_the_count(tmp_path, pytester):
    """Held-out batch 108 kept GPT-J's biased lm_head: a [vocab_size] parameter outside the canonical weights, which
    count_parameters counts as the model holds it. The count exceeds the config's weights by exactly vocab_size, which
    names a bias on the output head."""
    biased = (
        "model.py",
        "nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)",
        "nn.Linear(cfg.d_model, cfg.vocab_size)",
    )
    loaded = ("model.py", "    params = dict(model.named_parameters())  # a tied lm_head is not listed separately",
              "    params = {k: p for k, p in model.named_parameters() if k != 'lm_head.bias'}")  # fmt: skip
    listed = ("model.py", "    return {name: p.detach() for name, p in model.named_parameters()}",
              "    return {n: p.detach() for n, p in model.named_parameters() if n != 'lm_head.bias'}")  # fmt: skip
    folder = implementation(tmp_path, patches=[biased, loaded, listed])
    out = run_suite(f"--impl={folder}", "-k", "test_count_parameters", cwd=tmp_path, pytester=pytester).stdout
    assert "likely cause: your count equals the unique parameters your model holds" in out, out[-3000:]
    assert "more than the config's weights: an extra bias on the output head, [vocab_size]" in out, out[-3000:]


def test_attention_whose_rows_reach_each_other_is_named_by_its_rows_alone(tmp_path, pytester):
    """Held-out batch 113's packed attention started every sequence's key range at the pack's start, so a later row
    attended the earlier rows' tokens: multihead_self_attention on each row alone is right, the rows together are not.
    Written here as keys summed over the rows before them; no knob fits, and the rows read says how it differs."""
    line = "    v = split_heads(linear(x, wv, bv), n_kv_heads)\n"
    packed = ("attention.py", line, line + "    k = k.cumsum(0)  # earlier rows' keys reached\n")
    folder = implementation(tmp_path, patch=packed)
    out = run_suite(f"--impl={folder}", "--spec-diagnosis-bugs=,", "-k", "test_multihead_attention_layout",
                    cwd=tmp_path, pytester=pytester).stdout  # fmt: skip
    said = "multihead_self_attention gives the specified output for each row of the batch alone ([1, ...])"
    assert said in out, out[-3000:]
