"""The bug catalog (``spec_tests/bugs``): every patch applies once, every bug module imports as an
independent copy of the reference, and the suite's diagnosis names a bug by its outputs, also
for an independently written implementation with the same mistake.

Whether the suite *kills* every bug is ``tools/bugcheck.py``'s job (it runs the whole suite once
per bug); these checks are the fast structural ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from suite_subprocess import implementation, run_suite

import reference
from spec_tests.bugs import BUG_CLASSES, CATALOG, apply_patch, load_bug, reference_sources, related_files
from spec_tests.harness.diagnosis.catalog import CATALOG_GROUPS, bug_subjects, known_bug_lines, matching_bugs
from spec_tests.harness.judging.tolerances import tolerance
from spec_tests.protocol import PROTOCOL_NAMES

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures_bugs"
NAMES = list(CATALOG)

pytest_plugins = ["pytester"]

# The classes the catalog must cover (course notes, symptoms table, and beyond).
REQUIRED_CLASSES = (
    "layout",
    "mask_broadcast",
    "softmax_dim",
    "rope_on_values",
    "rope_q_only",
    "kv_cache",
    "gqa",
    "unshifted_labels",
    "dropout_generation",
    "sampling_order",
    "causality",
    "stability",
    "attention_scale",
    "norm_placement",
    "tied_weights",
    "cache_positions",
    "validation",
    "prompt_cropping",
    "rmsnorm",
    "top_p",
    "top_k",
    "evaluation",
    "causal_mask",
    "rope_frequency",
    "swiglu",
    "init",
)


def test_catalog_has_at_least_30_bugs_covering_every_required_class():
    used = {b.bug_class for b in CATALOG.values()}
    assert len(CATALOG) >= 30, len(CATALOG)
    assert not set(REQUIRED_CLASSES) - used, sorted(set(REQUIRED_CLASSES) - used)
    assert used <= set(BUG_CLASSES)


def test_catalog_keeps_corner_only_bugs():
    """Bugs visible only in a corner (e.g. a prepended cache, invisible to one-token decoding) are kept."""
    corner = {b.name for b in CATALOG.values() if b.corner}
    assert {"kv_cache_prepended", "model_top_left_mask_with_cache", "evaluate_mean_of_batch_means"} <= corner


@pytest.mark.parametrize("name", NAMES)
def test_patch_applies_exactly_once(name):
    bug = CATALOG[name]
    sources = reference_sources()
    source = sources[bug.file.removesuffix(".py")]
    assert source.count(bug.old) == 1, f"{name}: old text occurs {source.count(bug.old)} times in reference/{bug.file}"
    patched = apply_patch(bug, sources)
    assert patched[bug.file.removesuffix(".py")] != source
    assert {k: v for k, v in patched.items() if k != bug.file.removesuffix(".py")} == {
        k: v for k, v in sources.items() if k != bug.file.removesuffix(".py")
    }, "a patch changes exactly one file"


def test_a_patch_that_does_not_apply_is_an_error():
    bug = CATALOG[NAMES[0]]
    broken = type(bug)(**{**bug.__dict__, "old": "this text is not in the reference"})
    with pytest.raises(ValueError, match="occurs 0 times"):
        apply_patch(broken, reference_sources())


@pytest.mark.parametrize("name", NAMES)
def test_bug_module_imports_and_differs_from_the_reference(name):
    bug = CATALOG[name]
    module = load_bug(name)
    stem = bug.file.removesuffix(".py")
    sub = getattr(module, stem)
    assert module.__name__ == f"_spec_bug_{name}" and sub.__name__ == f"_spec_bug_{name}.{stem}"
    assert module is not reference and sub is not getattr(reference, stem, None)
    source = sub.__loader__.get_source(sub.__name__)
    assert source != (ROOT / "reference" / bug.file).read_text()
    assert bug.new in source and (ROOT / "reference" / bug.file).read_text().count(bug.old) == 1
    assert set(reference.PROTOCOL_NAMES) <= set(dir(module)), "a bug module offers every protocol name"
    assert load_bug(name) is module, "loaded once and cached"


def test_bug_copies_and_the_reference_coexist():
    """Loading bugs leaves the live reference untouched, and each bug is its own copy."""
    top_left = load_bug("causal_mask_top_left")
    tiled = load_bug("repeat_kv_tiled")
    want = torch.ones(2, 5, dtype=torch.bool).tril(diagonal=3)
    assert torch.equal(reference.causal_mask(2, 5), want)
    assert not torch.equal(top_left.causal_mask(2, 5), want)
    assert torch.equal(tiled.causal_mask(2, 5), want)
    x = torch.arange(2.0).reshape(1, 2, 1, 1)
    assert reference.repeat_kv(x, 2).flatten().tolist() == [0.0, 0.0, 1.0, 1.0]
    assert tiled.repeat_kv(x, 2).flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
    assert reference.attention.repeat_kv.__module__ == "reference.attention"


def test_unknown_bug_name_is_a_value_error_listing_the_catalog():
    with pytest.raises(ValueError, match="no catalogued bug named 'nope'.*post_ln"):
        load_bug("nope")


def test_every_catalog_component_is_a_check_subject():
    """A bug's components are protocol names the suite's checks judge (or the groups of model-level
    checks, diagnosis/catalog.py CATALOG_GROUPS), so diagnosis can reach it."""
    known = set(PROTOCOL_NAMES) | {g for groups in CATALOG_GROUPS.values() for g in groups}
    unknown = {f"{b.name}: {c}" for b in CATALOG.values() for c in b.components if c not in known}
    assert not unknown, sorted(unknown)


def test_every_bug_class_names_existing_test_files():
    files = {p.stem for p in (ROOT / "spec_tests").glob("test_*.py")}
    for bug_class, (_, related) in BUG_CLASSES.items():
        assert related and set(related) <= files, (bug_class, related)


def test_bug_subjects_of_a_check():
    names = {bug.name for bug, _ in bug_subjects("multihead_self_attention", "interleaved")}
    assert {"mha_rope_on_values", "merge_heads_without_transpose", "attention_missing_scale"} <= names
    assert all(s.obj is load_bug(bug.name) for bug, s in bug_subjects("rope", "half"))
    assert bug_subjects("no_such_component", "interleaved") == []


# ----------------------------------------------------------------------------- diagnosis


def load_fixture(stem: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_fixture_bug_{stem}", FIXTURES / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mha_inputs():
    from spec_tests import inputs
    from spec_tests.inputs import S

    x = inputs.randn(S.B, S.T, S.d_model, seed=60)
    d, dh = S.d_model, S.D_HEAD
    weights = (
        inputs.fan_in_weight(S.H * dh, d, seed=61),
        inputs.fan_in_weight(S.H_KV * dh, d, seed=62),
        inputs.fan_in_weight(S.H_KV * dh, d, seed=63),
        inputs.fan_in_weight(d, S.H * dh, seed=64),
    )
    return x, weights, S.H, S.H_KV


def test_independent_implementation_gets_the_catalog_diagnosis():
    """An MHA written from scratch (view/transpose, complex RoPE) with RoPE on values is diagnosed
    as mha_rope_on_values: the diagnosis compares outputs, not code."""
    fixture = load_fixture("mha_rope_on_values")
    x, weights, h, h_kv = mha_inputs()

    def compute(m):
        return m.multihead_self_attention(x, *weights, h, h_kv, theta=10000.0)

    actual = compute(fixture)
    tol = tolerance("attention", torch.float64)
    assert (actual - compute(reference)).abs().max() > 1e-3, "the fixture really is wrong"
    found = matching_bugs("multihead_self_attention", compute, actual, tol, "interleaved")
    lines = known_bug_lines(found)
    assert [b.name for b in found] == ["mha_rope_on_values"], lines
    assert lines[0].startswith("matches known bug mha_rope_on_values: ") and "Fix: rotate q and k only" in lines[0]
    assert matching_bugs("multihead_self_attention", compute, compute(reference) + 0.1, tol, "interleaved") == []


def test_independent_sampling_implementation_gets_the_catalog_diagnosis():
    fixture = load_fixture("top_p_drops_crossing_token")
    from spec_tests import inputs

    logits = inputs.randn(4, 67, seed=31) * torch.tensor([0.3, 1.0, 2.5, 5.0], dtype=torch.float64)[:, None]

    def compute(m):  # on a copy: a catalogued bug edits its input in place (temperature_divides_the_logits_in_place)
        return m.sampling_probs(logits.clone(), temperature=0.5, top_p=0.9)

    found = matching_bugs("sampling_probs", compute, compute(fixture), tolerance("pointwise"), "interleaved")
    assert "top_p_drops_crossing_token" in [b.name for b in found]


@pytest.mark.parametrize("impl", ["bug:mha_rope_on_values", "tests/fixtures_bugs/mha_rope_on_values.py"])
def test_pytest_output_names_the_bug(impl, pytester):
    """The failure pytest prints says which known bug the output matches, and its fix."""
    proc = run_suite(f"--impl={impl}", "-k", "multihead_attention_with_rope", cwd=ROOT, pytester=pytester)
    out = proc.stdout + proc.stderr
    assert "2 failed" in out, out[-3000:]
    # Count in the failure reports only: on CI (env CI set) pytest prints the short summary untruncated,
    # so the diagnosis appears there a second time.
    failures = out.split("short test summary info")[0]
    assert failures.count("matches known bug mha_rope_on_values: RoPE is applied to the values") == 2, out[-3000:]
    assert "Fix: rotate q and k only" in out


# ----------------------------------------------------------------------------- tools/bugcheck.py verdicts


def bugcheck():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import bugcheck as module
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return module


def synthetic_run(*failures: tuple[str, float | None]) -> dict:
    tests = [
        {
            "nodeid": f"spec_tests/{f}.py::t",
            "file": f,
            "outcome": "failed",
            "message": "",
            "ratio": r,
            "markers": [],
            "named": [],
        }
        for f, r in failures
    ]
    tests.append(
        {
            "nodeid": "spec_tests/test_mlp.py::ok",
            "file": "test_mlp",
            "outcome": "passed",
            "message": "",
            "ratio": None,
            "markers": [],
            "named": [],
        }
    )
    return {"impl": "bug:x", "exit_code": 1 if failures else 0, "seconds": 1.0, "tests": tests, "collect_errors": []}


def test_bugcheck_verdicts():
    bc, bug = bugcheck(), CATALOG["kv_cache_prepended"]  # related: test_kv_cache, test_generation
    assert bc.judge(bug, synthetic_run()).status == "survived"
    assert bc.judge(bug, synthetic_run(("test_model", 1e9))).status == "unrelated"
    assert bc.judge(bug, synthetic_run(("test_kv_cache", 3.0), ("test_model", 1e9))).status == "near-miss"
    ok = bc.judge(bug, synthetic_run(("test_kv_cache", 3.0), ("test_generation", None)))
    assert (
        ok.status == "ok" and ok.margin == float("inf") and ok.killed_by == {"test_kv_cache": 1, "test_generation": 1}
    )


def test_bugcheck_related_only_runs_the_class_files_and_rejects_an_unknown_one():
    """``--related-only`` (CI's bugcheck) collects each bug's related test files alone; the reference, with no
    files, the whole suite; a stem that names no spec test file is an error naming it, not an empty run."""
    bc = bugcheck()
    assert bc.suite_paths() == [str(ROOT / "spec_tests")]
    paths = bc.suite_paths(related_files(CATALOG["kv_cache_prepended"].bug_class))
    assert [Path(p).name for p in paths] == ["test_kv_cache.py", "test_generation.py"]
    with pytest.raises(ValueError, match="test_no_such_file"):
        bc.suite_paths(("test_no_such_file",))


def test_a_known_bug_is_not_named_where_the_tests_own_variants_are_ambiguous(tmp_path, pytester):
    """Held-out batch 28's clip_grad_value_ was told it "matches known bug clip_after_step": at max_grad_norm 0.5
    clamping each entry, not clipping and clipping after the step give the same two steps. The gradients train_step
    leaves tell the last apart (clipped after the step they are at most max_grad_norm); where several of the test's
    variants still fit, a catalogued bug that reproduces the output is only one of them, and the line stays
    ambiguous. The catalogued clip_after_step itself is named (its READINGS entry)."""
    folder = implementation(
        tmp_path,
        patch=(
            "training.py",
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)",
            "        torch.nn.utils.clip_grad_value_(model.parameters(), max_grad_norm)",
        ),
    )
    out = run_suite(f"--impl={folder}", "-k", "test_train_step_matches_reference and llama-clip0.5-sgd",
                    cwd=tmp_path, pytester=pytester).stdout  # fmt: skip
    assert " failed" in out and "matches known bug clip_after_step" not in out, out[-3000:]
    assert "likely cause: gradients are clipped after optimizer.step()" not in out and "clip_grad_value_" in out, out[
        -3000:
    ]


READINGS = [
    ("greedy_divides_by_temperature_zero", "sampling_probs_any_leading_shape",
     "temperature 0 divides the logits by zero"),
    ("clip_after_step", "train_step_matches_reference", "likely cause: gradients are clipped after optimizer.step()"),
    ("layers_read_the_cache_length_after_layer_0", "cached_logits_equal_full_forward",
     "the cached keys are the specified ones rotated to other positions (layer 1's by"),
    ("rope_pairs_counted_from_one", "test_rope and not frequencies and not relative and not norms and not odd",
     "pair i turns at pair i + 1's frequency"),
    ("embedding_rows_scaled_by_sqrt_d_model", "test_embedding_lookup", "the rows are multiplied by sqrt(d_model)"),
    ("lm_loss_slices_without_shifting", "test_lm_loss", "labels are not shifted while the logits are sliced"),
    ("train_lr_stepped_down_every_batch", "train_keeps_its_optimizer_state", "is multiplied by 0.9 at every step"),
    ("sample_one_noise_row_for_the_batch", "sample_frequencies_follow or samples_from_sampling_probs",
     "one draw or one row of noise shared by every row of the batch"),
    ("generate_rolls_a_full_cache", "generation_slides_past_the_context or long_prompt_is_cropped",
     "generate's cache drops its oldest entry and keeps the others as they were computed"),
    ("evaluate_windows_of_the_model_context", "evaluate_is_token_weighted",
     "the windows are the model's own context_length"),
    ("rope_model_table_loses_its_sine", "logits_match_reference", "the rotation's sine is lost"),
    ("yarn_attention_factor_applied_twice", "model_honours_rope_scaling",
     "YaRN's attention factor 1.208 is applied twice"),
    ("merge_heads_unfolds_the_batch_head_major", "multihead_attention_layout",
     "are unfolded as if indexed h * B + b"),
    ("model_reads_its_ids_shifted_right", "logits_match_reference", "the model reads its ids shifted right by one"),
    ("generate_prefixes_a_start_token", "greedy_generation_follows_the_model",
     "generate puts a token 0 in front of the prompt"),
    ("train_step_gradients_over_the_time_axis", "train_step_matches_reference",
     "every weight's step is 0.2727 times the specified one"),
    ("evaluate_rescales_padded_row_means", "evaluate_is_token_weighted",
     "each window's loss is its mean over the batch's padded width"),
    ("top_p_mask_scattered_to_ascending_ids", "sampling_probs_match_reference",
     "is scattered back to the token ids of an ascending sort"),
    ("generate_feeds_the_prompts_last_token_again", "greedy_generation_follows_the_model",
     "feeds the prompt's last token again after the prompt"),
    ("causal_mask_from_the_rope_positions", "multihead_attention_with_rope",
     "the causal mask compares the RoPE positions"),
    ("generate_counts_the_prompt_as_one_step", "greedy_generation_follows_the_model",
     "1, 2, 3, ...: a step counter advanced by one after the prompt"),
    ("train_reseeds_its_batches_every_step", "train_draws_fresh_windows_every_step",
     "likely cause: every step trains on the same windows"),
    ("cache_writes_every_call_at_slot_zero", "cached_logits_equal_full_forward",
     "whose write position is 0 at every call"),
    ("residual_init_scales_the_attention_output_only", "initialisation_statistics",
     "mlp.w_down is not scaled by 1/sqrt(2 n_layers) while attn.wo is"),
    ("cache_prepends_each_call", "cached_logits_equal_full_forward",
     "that puts each call's keys and values before the cached ones"),
    ("sample_folds_its_rows_back_column_major", "sampling_probs_any_leading_shape",
     "flattened in one order and the ids folded back in the other"),
    ("cache_length_advanced_by_the_batch_size", "cached_logits_equal_full_forward",
     "the cache's length advances by the batch size instead of the tokens written"),
    ("greedy_sample_is_one_based", "temperature_zero_is_argmax", "every id is its row's argmax plus 1"),
    ("generate_picks_from_the_first_position", "greedy_generation_follows_the_model",
     "the argmax of your own logits at its first position (0)"),
    ("generate_caches_only_the_prompts_last_token", "greedy_generation_follows_the_model",
     "feeds only the prompt's last token into the fresh cache"),
    ("train_step_loss_drops_its_last_partial_chunk", "train_step_matches_reference",
     "the last 1 contribute nothing, as a loss computed in chunks of rows"),
    ("generate_crops_a_full_cache_to_its_oldest", "generation_slides_past_the_context",
     "is cropped to its first context_length - 1 entries"),
    ("generate_feeds_every_new_token_at_position_zero", "greedy_generation_follows_the_model",
     "0 at every step: the new token's position taken from the front"),
    ("evaluate_labels_each_window_with_itself", "evaluate_is_token_weighted",
     "each window is given its own tokens as labels, which the model shifts inside"),
    ("cached_chunk_mask_laid_new_tokens_first", "cached_logits_equal_full_forward",
     "gets its causal mask laid out new-tokens-first"),
    ("keys_rotated_at_the_default_theta", "logits_match_reference",
     "the keys' RoPE turns at the default theta 10000"),
    ("train_steps_only_the_linear_matrices", "train_defaults_to_adamw",
     "only the linear layers' matrices, a weight-decay group"),
    ("generate_no_prompt_cropping", "long_prompt_is_cropped", "tokens (more than the context_length, 29) and works"),
    ("mha_keys_rotated_from_zero", "multihead_attention_with_rope", "the keys are rotated at arange(T)"),
    ("cached_path_rotates_values_not_keys", "cached_logits_equal_full_forward",
     "RoPE rotates the values instead of the keys"),
    ("top_p_prefilter_cutoff_drops_a_flat_row", "top_p_on_a_flat_distribution", "tokens at probability 1 per row"),
    ("evaluate_divides_by_static_batch_slots", "evaluate",
     "divided by every slot of the batches padded to a static [batch_size, context_length]"),
    ("train_step_loss_per_sequence", "train_step_matches_reference",
     "summed over each sequence's target tokens and averaged over the sequences"),
    ("causal_mask_sized_by_the_queries", "test_causal_mask", "that axis is sized by t_q, not t_k"),
    ("cache_rows_written_into_one_place", "cached_logits_equal_full_forward", "the rows are written to one place"),
    ("evaluate_perplexity_base_two", "evaluate_is_token_weighted", "the perplexity is 2 ** loss"),
    ("build_model_keeps_the_given_tensors", "build_model_copies_the_given_weights",
     "build_model keeps the caller's tensors"),
    ("rotating_buffer_read_in_slot_order", "cache_equals_no_cache_past_the_window",
     "the rotating buffer is read in slot order"),
    ("one_norm_module_for_both_branches", "each_canonical_weight_has_a_parameter_of_its_own",
     "one module is put in several places"),
    ("generate_takes_row_0s_prompt_logits", "greedy_generation_follows_the_model",
     "every row's first new token is row 0's"),
    ("decode_step_misses_its_own_key", "cached_logits_equal_full_forward",
     "does not attend to its own key"),
    ("cache_write_position_set_to_the_call_length", "cached_logits_equal_full_forward",
     "whose write position is set to the call's length"),
    ("rope_tables_laid_out_for_the_other_pairing", "rope_frequencies",
     "the cos/sin tables are laid out for half pairs while the rotation pairs channels interleaved"),
    ("evaluate_scores_the_padding_as_token_0", "evaluate_is_token_weighted",
     "the inputs padded with 0 apart, the targets with 0 instead of ignore_index"),
    ("evaluate_drops_the_last_short_batch", "evaluate_is_token_weighted",
     "the last batch is left out where it holds fewer than batch_size windows"),
    ("get_batch_keeps_the_data_dtype", "get_batch_windows_and_shift",
     "get_batch keeps the data's own dtype (torch.uint16)"),
    ("cache_counts_later_calls_by_one", "cached_logits_equal_full_forward",
     "the first call is counted in full and the second advances the cached length by one"),
    ("train_step_label_smoothing_left_on", "train_step_matches_reference",
     "plus label smoothing with coefficient 0.1"),
    ("train_step_z_loss_left_on", "train_step_matches_reference", "plus a z-loss with coefficient 0.001"),
    ("layers_stacked_and_reshaped_at_load", "canonical_state_dict",
     "gives back rows of the same weight of other layers"),
    ("top_p_mass_in_vocabulary_order", "sampling_probs_match_reference",
     "summed over the probabilities in vocabulary order (not sorted)"),
    ("sdpa_query_heads_grouped_group_major", "sdpa_gqa_mapping",
     "query head h is paired with kv head h % 2 (tiled) instead of h // 4; output heads 0..7 hold query heads"),
    ("train_step_clips_without_the_head", "train_step_matches_reference and llama and clip0.02 and sgd",
     "clipping leaves out the untied output head"),
    ("final_softcap_on_the_tied_head_only", "logits_match_reference_with_softcaps",
     "the option's path misses the untied head"),
    ("generate_drops_the_generator", "sampled_generation_is_reproducible",
     "generate's draws follow the global RNG, not the generator it is given"),
    ("new_cache_hands_back_the_last_one", "a_fresh_cache_holds_no_positions or cached_logits_equal_full_forward",
     "new_cache hands on an earlier cache's state"),
    ("forward_flattens_ids_with_view", "forward_takes_ids_of_any_memory_layout",
     "forward raises for a non-contiguous ids and works for a contiguous copy"),
    ("generate_window_one_short", "generation_slides_past_the_context",
     "generate conditions on the last 28 tokens, not the last 29"),
    ("eval_reaches_direct_children_only", "eval_mode_applies_no_dropout",
     "the mode does not reach nested modules"),
    ("mode_restored_from_the_top_only", "restores_the_mode or restores_mode",
     "restores the mode with one call on the whole model"),
    ("cache_kv_reads_the_layer_before", "cache_holds_the_specified or cache_layout",
     "the layer index is off by one"),
    ("filters_zero_probabilities_unrenormalised", "sampling_probs_match_reference",
     "the kept ones are not renormalised"),
    ("train_adamw_first_moment_undamped", "train_keeps_its_optimizer_state_across_steps",
     "AdamW's first moment is not damped"),
    ("train_adamw_v_hat_beta1", "train_keeps_its_optimizer_state_across_steps",
     "likely cause: AdamW's second moment is bias-corrected with beta1"),
    ("clip_norm_without_root", "train_step_matches_reference", "the global norm's square root is left out"),
    ("final_norm_default_eps", "config_norm_eps", "the final norm ignores config norm_eps"),
    ("train_adamw_decay_after_lr_scale", "train_defaults_to_adamw", "the weight decay is added after the learning"),
    ("train_adamw_step_count_per_parameter", "train_defaults_to_adamw and llama",
     "advanced inside the loop over parameters"),
    ("rope_complex_view_of_a_strided_input", "any_leading_dims and rope and strided",
     "torch.view_as_complex where the last axis is not unit-stride"),
    ("qkv_bias_after_rope", "logits_match_reference_with_qkv_bias", "biases are added after RoPE, to the rotated"),
    ("residual_init_scaled_by_layer_depth", "initialisation_statistics and llama",
     "scaled by each layer's own depth"),
    ("keys_detached_from_the_graph", "tied_head_is_the_embedding_parameter and llama",
     "no gradient reaches layers.0.attn.wk.weight"),
    ("temperature_divides_the_logits_in_place", "top_p_uses_temperature_scaled_distribution",
     "it was scaled in place by"),
    ("train_adamw_step_count_by_parameter_count", "train_keeps_its_optimizer_state_across_steps",
     "step s is corrected as step 1 + P (s - 1)"),
    ("weights_rounded_to_float32_at_load", "canonical_state_dict_roundtrip and llama_gqa",
     "the error is at the level of float32 rounding"),
    ("flash_skips_by_the_first_query", "flash_attention_matches_reference",
     "a key block is skipped when it starts after the query block's first query"),
    ("gqa_heads_merged_group_minor", "multihead_attention_layout", "merged in (query heads per group, kv heads)"),
    ("gqa_query_heads_split_group_minor", "multihead_attention_layout",
     "split in (query heads per group, kv heads)"),
    ("top_p_on_unrenormalised_top_k", "sampling_probs_match_reference and top_k",
     "top-p runs on top-k's log-probabilities without renormalising them"),
    ("mode_restored_on_the_children_only", "generate_restores_the_mode and train",
     "the mode was put back on some modules only"),
    ("generate_uncached_feeds_the_newest_token", "greedy_generation_follows_the_model and no-cache",
     "each step feeds only the newest token"),
    ("loader_skips_the_value_projection", "model_is_determined_by_its_weights",
     "attn.wv.weight come back from canonical_state_dict differently"),
    ("final_norm_without_the_last_residual", "test_logits_match_reference",
     "the final norm reads the last block's MLP output alone"),
    ("softmax_over_heads", "sdpa_matches_reference", "the softmax runs over the heads"),
    ("init_reuses_one_seed", "fresh_weights_are_drawn_independently and llama", "one random stream is restarted"),
    ("cache_attends_unwritten_slots", "cached_logits_equal_full_forward and llama_mha and one-prefill",
     "attend the whole preallocated buffer"),
    ("cache_attends_a_buffer_grown_in_steps", "cached_logits_equal_full_forward and llama_mha and one-prefill",
     "buffer grown in steps of 256 slots"),
    ("cache_counts_calls_not_tokens", "cache_overflow_raises and llama", "the cache counts calls, not tokens"),
    ("attention_output_weight_transposed", "attention_defaults", "wo is used transposed"),
    ("cached_calls_rotate_interleaved", "cached_logits_equal_full_forward and llama_mha and chunked",
     "calls through a cache that already holds tokens rotate the new queries and keys with the other RoPE pairing"),
    ("generate_keeps_a_default_top_k", "generate_samples_from_sampling_probs and defaults",
     "a default top-k of 50 kept where no top_k was given"),
    ("evaluate_batch_means_summed", "evaluate_is_token_weighted and llama",
     "each batch's mean NLL (a mean-reduced loss) is added to the total as if it were the batch's sum"),
    ("train_adamw_v_weight_beta1", "train_keeps_its_optimizer_state_across_steps",
     "second moment takes the new squared gradient with weight 1 - beta1"),
    ("sample_multinomial_on_any_rank", "sampling_probs_any_leading_shape", "sample raises for 3-D input"),
    ("cross_entropy_ignored_rows_zeroed_without_grad", "cross_entropy_gradient",
     "the rows whose target is ignore_index get a gradient in the backward pass"),
    ("loader_swaps_the_block_norms", "test_logits_match_reference", "attn_norm and mlp_norm exchanged in every layer"),
    ("position_embeddings_scaled_down", "test_logits_match_reference and gpt2",
     "position embeddings are scaled by d_model ** -0.5"),
    ("train_step_clip_norm_without_vectors", "train_step_matches_reference and llama-clip0.5-sgd",
     "leaves out the weights of fewer than two dims"),
    ("generate_cached_step_feeds_the_token_before", "greedy_generation_follows_the_model and llama-cache",
     "generate's own cached path feeds its cache otherwise than the protocol's loop"),
    ("evaluate_sums_over_padded_slots", "evaluate_is_token_weighted and llama-61/11/b8",
     "divided by every slot of its padded windows"),
    ("train_step_masks_its_first_token", "train_step_matches_reference and llama-no-clip-sgd",
     "is not the cross-entropy of your own forward(model, x) against y"),
    ("generate_masks_the_prompt_start", "greedy_generation_follows_the_model and llama-no-cache",
     "generate's first new token is not the argmax of your own forward(model, prompt)'s last logits"),
    ("evaluate_positions_from_one", "evaluate_is_token_weighted and gpt2-61/11/b2",
     "evaluate computes its logits otherwise than forward"),
    ("evaluate_metric_never_reset", "evaluate_keeps_nothing_from_an_earlier_call and llama",
     "evaluate keeps its running totals from the call before"),
    ("train_warmup_starts_at_zero", "train_defaults_to_adamw_at_lr_1e_3", "first step leaves the model as it was"),
    ("train_leaves_the_head_out_of_the_optimizer", "train_defaults_to_adamw_at_lr_1e_3 and llama",
     "never steps the untied output head lm_head.weight"),
    ("model_attention_scale_rooted_twice", "logits_match_reference and gpt2-f64",
     "= d_head ** -0.25 instead of 1/sqrt(d_head)"),
    ("generate_keeps_its_cache_between_calls", "generate_keeps_nothing_from_an_earlier_call and llama",
     "raises for this call only after earlier calls"),
    ("evaluate_batch_means_shortest_first", "evaluate_is_token_weighted and gpt2",
     "the windows sorted shortest first, so the short window is in the first batch"),
]  # fmt: skip


INVERTED_DROPOUT = """
import torch
from reference import *  # noqa: F403
import reference


def build_model(config, state_dict=None, **kw):
    model = reference.build_model(config, state_dict, **kw)
    for m in model.modules():  # every dropout told training=not m.training (an inference= flag passed on as it is)
        if isinstance(m, torch.nn.Dropout):
            m.forward = lambda x, m=m: torch.nn.functional.dropout(x, m.p, training=not m.training)
    return model
"""


def test_a_dropout_reading_its_mode_the_wrong_way_round_is_named(tmp_path, pytester):
    """Held out (batch 70): every dropout applied exactly when its module is in eval mode. The model in training mode
    gives one logits under every seed, so the line names the inverted flag, not a dropout that ignores the mode (the
    catalogued dropout_mode_inverted inverts the embeddings' dropout alone, which that reading cannot tell)."""
    (tmp_path / "inverted_dropout.py").write_text(INVERTED_DROPOUT)
    proc = run_suite(
        f"--impl={tmp_path / 'inverted_dropout.py'}", "-k", "eval_mode_applies", cwd=ROOT, pytester=pytester
    )
    out = proc.stdout + proc.stderr
    assert " failed" in out and "the mode is read the wrong way round" in out, out[-3000:]


WORKSPACE = (
    "generation.py",
    "                cache = new_cache(model, ids.shape[0]) if use_cache else None",
    """                kept = model.__dict__.get("_kept_cache")
                room = ctx - ids.shape[1] - max_new_tokens  # a workspace reused while it has room
                fits = kept is not None and kept.batch_size == ids.shape[0] and kept.length <= room
                cache = (kept if fits else new_cache(model, ids.shape[0])) if use_cache else None
                model.__dict__["_kept_cache"] = cache""",
)


def test_a_generate_that_keeps_a_workspace_between_calls_is_named(tmp_path, pytester):
    """Held out (batch 78): generate starts from the cache an earlier call left where it has room (an inference
    workspace whose token count is not reset), a fresh one where it has not. It raises on no call; the same greedy
    call gives other tokens from one call to the next under one global seed, which is said (not the global RNG)."""
    folder = implementation(tmp_path, patch=WORKSPACE)
    proc = run_suite(f"--impl={folder}", "-k", "generate_keeps_nothing or reproducible", cwd=ROOT, pytester=pytester)
    out = proc.stdout + proc.stderr
    assert " failed" in out and "generate keeps state from one call to the next" in out, out[-3000:]
    assert "draws from the global RNG" not in out and "follow the global RNG" not in out, out[-3000:]


@pytest.mark.parametrize("bug,select,said", READINGS, ids=[r[0] for r in READINGS])
def test_a_catalogued_bug_gets_the_reading_that_names_it(bug, select, said, pytester):
    """Bugs whose held-out versions were missed or misnamed (batches 52 to 55): the suite's own reading names each
    mechanism, with the known-bug matcher off so that only the behavioural evidence speaks."""
    proc = run_suite(f"--impl=bug:{bug}", "--spec-diagnosis-bugs=,", "-k", select, cwd=ROOT, pytester=pytester)
    out = proc.stdout + proc.stderr
    assert " failed" in out and said in out, out[-3000:]
