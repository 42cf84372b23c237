"""Write docs/protocol-inventory.md: every clause of docs/protocol.md, the tests that pin it, and the edge cases
considered for it.

    python tools/protocol_map.py            # rewrite docs/protocol-inventory.md
    python tools/protocol_map.py --check    # exit 1 if the file is out of date or the inventory is incomplete

Three sources, each small enough to check:

- **The clauses** are read from docs/protocol.md: each bullet of "Loading and absence" and "Conventions", each
  table row (by its name), the two paragraphs of "Model" before its table, each numbered amendment. ``CLAUSES``
  below gives each one a stable id and says how it is found; the check fails when a clause of the document has
  no entry, or an entry finds no clause (the document changed).
- **The tests declare what they pin**: a spec test pins the table rows it names in ``@judges(...)`` and the
  clauses its docstring cites, "(protocol: generate, amendment 9)", "(protocol: Conventions, GQA)" (``CITES``
  maps the wordings that are not clause ids; a protocol citation that resolves to no clause is an error).
- **The edge cases** are data, per clause, in ``CLAUSES``: for each of ``EDGES`` either the tests that cover it
  (``{"test_file.py::test_name[param]": "what it covers"}``) or the reason it does not apply (a string). Tests
  of the harness itself live in ``tests/`` and are named with that prefix (``pinned_by`` lists them for the
  clauses that are rules of the suite rather than of a computation).

The check fails when: the document is out of date; a clause has no pinning test; an edge case is neither covered
nor given a reason; a listed or cited test no longer exists (parameters are not checked, the function is); a
protocol citation resolves to nothing.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
OUT = ROOT / "docs" / "protocol-inventory.md"

EDGES = {
    "sizes": "zero, one and boundary sizes",
    "ties": "exact ties",
    "padding": "padded or ignored targets in batched shapes, rows with different counts",
    "state": "state carried in: gradients already present, a filled cache, the module's mode, the global RNG",
    "paths": "every call path that reaches the clause",
    "extremes": "each argument at its documented extremes and defaults",
}

# Reasons shared by many clauses.
PURE = "n/a: a function of its arguments only; no gradients, cache, mode or RNG is read"
NO_RANK = "n/a: nothing is ranked or selected, so equal values cannot change which result is right"
NO_TARGETS = "n/a: no targets, padding or per-row counts"
SUITE_RULE = "n/a: a rule of how the suite loads and reports, not of a computation"
DIRECT = "n/a: reached by calling it; the model may compute the same math its own way (judged in the model)"
NO_ARGS = "n/a: no optional arguments"


@dataclass
class Clause:
    id: str
    kind: str  # "bullet", "row", "paragraph", "amendment"
    match: str  # the row's name, the amendment's number, or the opening words of a bullet or paragraph
    edges: dict[str, str | dict[str, str]]
    pinned_by: tuple[str, ...] = ()
    text: str = ""
    pins: set[str] = field(default_factory=set)


def C(id: str, kind: str, match: str, pinned_by=(), **edges) -> Clause:
    return Clause(id, kind, match, edges, tuple(pinned_by))


GEN = "test_generation.py::"
SAM = "test_sampling.py::"
TRA = "test_training.py::"
KVC = "test_kv_cache.py::"
MOD = "test_model.py::"
ATT = "test_attention.py::"
POS = "test_positions.py::"
LOS = "test_losses.py::"
PRI = "test_primitives.py::"
NOR = "test_norms.py::"
MLP = "test_mlp.py::"
PRE = "test_precision.py::"
PLUGIN = "tests/test_plugin.py::"
V2 = "tests/test_protocol_v2.py::"
RSC = "test_rope_scaling.py::"
QKB = "test_qkv_bias.py::"
QKN = "test_qk_norm.py::"
BAT = "test_batched_generation.py::"
SLW = "test_sliding_window.py::"
LSC = "test_logit_softcap.py::"
GEM = "test_gemma_style.py::"
MOE = "test_moe.py::"

CLAUSES: list[Clause] = [
    # ------------------------------------------------------------------------------------ Loading and absence
    C(
        "loading.impl",
        "bullet",
        "`--impl` accepts",
        pinned_by=(PLUGIN + "test_unknown_impl_lists_the_accepted_forms",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={
            PLUGIN + "test_capabilities_skip_what_is_not_supported": "a module name (--impl=mha_only)",
            PLUGIN + "test_object_form_and_families": "pkg.mod:object",
            PLUGIN + "test_partial_implementation_skips_what_it_does_not_provide": "a path to a .py file",
            PLUGIN + "test_skeleton_run_is_short": "student",
            PLUGIN + "test_spec_check_runs_an_adapter_from_another_folder": "an adapter file run from another folder"
            " (a package folder has no test of its own)",
        },
        extremes={PLUGIN + "test_unknown_impl_lists_the_accepted_forms": "a name that is none of the forms"},
    ),
    C(
        "loading.not_provided",
        "bullet",
        "A name the implementation does **not define**",
        pinned_by=(PLUGIN + "test_partial_implementation_skips_what_it_does_not_provide",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={
            PLUGIN + "test_object_form_and_families": "a family not listed in FAMILIES",
            PLUGIN + "test_capabilities_skip_what_is_not_supported": "a capability not listed (amendment 10)",
        },
        extremes=SUITE_RULE,
    ),
    C(
        "loading.not_implemented",
        "bullet",
        "A name that is defined but raises `NotImplementedError`",
        pinned_by=(PLUGIN + "test_not_implemented_is_one_line_per_function", PLUGIN + "test_skeleton_run_is_short"),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={PLUGIN + "test_not_implemented_deep_inside_names_the_entry_point": "raised below a protocol call"},
        extremes=SUITE_RULE,
    ),
    C(
        "loading.import_error",
        "bullet",
        "An implementation that fails to import",
        pinned_by=(PLUGIN + "test_import_failure_is_one_clear_error",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths=SUITE_RULE,
        extremes=SUITE_RULE,
    ),
    C(
        "loading.families",
        "bullet",
        "Optional module attribute `FAMILIES`",
        pinned_by=(PLUGIN + "test_object_form_and_families",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={MOD + "test_count_parameters_gpt2_small_on_meta": "require_family inside a test, not a fixture"},
        extremes={PLUGIN + "test_object_form_and_families": 'FAMILIES = ("gpt2",): every llama test skipped'},
    ),
    # ------------------------------------------------------------------------------------------- Conventions
    C(
        "conventions.tensors",
        "bullet",
        "Tensors are `torch.Tensor`",
        sizes="n/a: sizes belong to each function's own clause",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: about the inputs only",
        paths={
            PRE + "test_float64_computed_in_float64": "float64 computed in float64, every computing function; CUDA: "
            "the same suite with --spec-device cuda (tools/gpu_check.sh), only where a GPU is lent",
            PRE + "test_float64_model_computed_in_float64": "the model",
            SAM + "test_sample_leaves_its_logits_unchanged": "inputs unchanged where a function is judged by "
            "relations only (every spec.call/spec.check also compares its inputs before and after)",
        },
        extremes={
            PRI
            + "test_linear_layout[f32-non-square]": "float32 and float64 inputs (the dtype fixture, every math test)",
            NOR + "test_norm_statistics_in_at_least_float32": "float16 inputs",
        },
    ),
    C(
        "conventions.linear",
        "bullet",
        "Linear weights are",
        sizes={PRI + "test_linear_layout": "square and non-square W (a transposed square W keeps its shape)"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            MOD + "test_logits_match_reference": "the model loads [out, in] weights (wk, wv non-square under GQA)",
            ATT + "test_multihead_attention_layout": "the attention projections",
        },
        extremes={PRI + "test_linear_bias": "with a bias (y = x @ W.T + b)"},
    ),
    C(
        "conventions.layout",
        "bullet",
        "Hidden states",
        sizes={
            ATT + "test_multihead_attention_layout": "B, T, H, d_head all distinct, so a swapped axis is visible",
            MOD + "test_batch_rows_are_independent": "B = 1 against B = 3",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            MOD + "test_logits_match_reference": "the model (head-major wq rows)",
            ATT + "test_sdpa_matches_reference": "attention on [B, H, T, d_head]",
            KVC + "test_cache_layout_rotated_keys_plain_values": "the cache's [B, n_kv_heads, T, d_head]",
        },
        extremes=NO_ARGS,
    ),
    C(
        "conventions.bool_masks",
        "bullet",
        "Boolean masks",
        sizes={ATT + "test_sdpa_mask_broadcast": "masks of four broadcast shapes"},
        ties=NO_RANK,
        padding={ATT + "test_sdpa_mask_broadcast": "a [B, 1, 1, Tk] padding mask hiding 4, 0 and 7 keys per row"},
        state=PURE,
        paths={
            ATT + "test_causal_mask_bottom_right": "causal_mask returns bool, True = may attend",
            ATT + "test_sdpa_matches_reference": "a [T, T] bool causal mask",
        },
        extremes="n/a: rows with no allowed key are unspecified (protocol), so every test mask keeps a key per row",
    ),
    C(
        "conventions.causal",
        "bullet",
        "Causal masks are bottom-right aligned",
        sizes={
            ATT + "test_causal_mask_bottom_right": "t_q = t_k, t_q = 4 < t_k, t_q = 1, t_k = t_q + 6; t_q > t_k (rows "
            "with no key) never arises in a decoder and is not tested"
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={KVC + "test_cached_logits_equal_full_forward": "a filled cache: new queries are the last t_q of t_k"},
        paths={
            ATT + "test_sdpa_gqa_mapping": "attention with a bottom-right mask, t_q = 6 < t_k",
            ATT + "test_flash_attention_matches_reference": "flash_attention(causal=True), T_q = 7 < T_k = 17",
            ATT + "test_attention_defaults": "flash_attention's default (causal)",
            ATT + "test_multihead_attention_is_causal": "self-attention",
            MOD + "test_future_tokens_do_not_change_earlier_logits": "the model",
        },
        extremes=NO_ARGS,
    ),
    C(
        "conventions.gqa",
        "bullet",
        "GQA:",
        sizes={
            ATT + "test_sdpa_gqa_mapping[f64-mqa]": "one kv head (multi-query)",
            ATT + "test_repeat_kv_interleaves[1]": "n_rep = 1",
            MOD + "test_kv_cache_bytes": "a 3-layer config with one kv head",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            ATT + "test_repeat_kv_interleaves": "repeat_kv",
            ATT + "test_flash_attention_matches_reference": "flash_attention with 2 kv heads",
            ATT + "test_multihead_attention_layout[f64-gqa]": "self-attention",
            MOD + "test_logits_match_reference[llama_gqa-f64]": "the model",
            KVC + "test_cache_layout_rotated_keys_plain_values": "the cache holds n_kv_heads heads",
        },
        extremes={ATT + "test_attention_defaults": "n_kv_heads omitted: one kv head per query head"},
    ),
    C(
        "conventions.rope",
        "bullet",
        "RoPE: frequency",
        sizes={
            POS + "test_rope_position_zero_is_identity": "position 0",
            POS + "test_rope_rejects_odd_head_dim": "odd d_head",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            ATT + "test_multihead_attention_with_rope": "queries and keys in attention, never values",
            KVC + "test_cache_layout_rotated_keys_plain_values": "keys cached rotated, values plain",
            MOD + "test_logits_match_reference": "the llama model",
        },
        extremes={
            POS + "test_rope_honours_theta": "theta = 500",
            POS + "test_rope": "the default theta; each implementation in the ROPE_STYLE it declares (the "
            "reference is interleaved, the shipped Hugging Face and litgpt adapters half)",
        },
    ),
    C(
        "conventions.kv_cache",
        "bullet",
        "The KV cache stores",
        sizes={KVC + "test_cache_layout_rotated_keys_plain_values": "T_cached = 9 after chunks [5, 4], every layer"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={KVC + "test_cache_layout_rotated_keys_plain_values": "filled in two calls = one prefill (appended)"},
        paths={GEN + "test_greedy_generation_follows_the_model[llama-cache]": "generate's own cache"},
        extremes=NO_ARGS,
    ),
    # --------------------------------------------------------------------------------------------- Components
    C(
        "linear",
        "row",
        "linear",
        sizes={PRI + "test_linear_layout": "square and non-square weights"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths=DIRECT,
        extremes={PRI + "test_linear_bias": "a bias", PRI + "test_linear_layout": "bias omitted (default None)"},
    ),
    C(
        "embedding",
        "row",
        "embedding",
        sizes={PRI + "test_embedding_lookup": "ids [B, T] and [T]"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={MOD + "test_logits_match_reference": "the model's token lookup"},
        extremes=NO_ARGS,
    ),
    C(
        "softmax",
        "row",
        "softmax",
        sizes={PRI + "test_softmax_over_given_dim": "dim first, middle and last"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths=DIRECT,
        extremes={PRI + "test_softmax_is_stable_for_large_inputs": "inputs near ±1e4"},
    ),
    C(
        "silu",
        "row",
        "silu",
        sizes="n/a: elementwise",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths=DIRECT,
        extremes={PRI + "test_silu": "x = ±30 and ±80"},
    ),
    C(
        "rmsnorm",
        "row",
        "rmsnorm",
        sizes="n/a: one normalised axis, d_model = 80",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={MOD + "test_logits_match_reference": "the llama model's norms"},
        extremes={
            NOR + "test_rmsnorm": "default eps and eps = 1e-3, on inputs small enough (rms 3e-3) for eps to matter",
            NOR + "test_norm_statistics_in_at_least_float32": "float16 inputs near 300 (squares overflow float16)",
        },
    ),
    C(
        "layernorm",
        "row",
        "layernorm",
        sizes="n/a: one normalised axis, d_model = 80",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={MOD + "test_logits_match_reference": "the gpt2 model's norms"},
        extremes={
            NOR + "test_layernorm": "default eps and eps = 1e-3, small inputs with a mean offset",
            NOR + "test_norm_statistics_in_at_least_float32": "float16 inputs near 300",
        },
    ),
    C(
        "swiglu",
        "row",
        "swiglu",
        sizes={MLP + "test_swiglu": "d_ff = 56 differs from d_model (gate/up/down shapes distinct)"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={MOD + "test_logits_match_reference": "the llama model's MLP"},
        extremes=NO_ARGS,
    ),
    C(
        "gelu_mlp",
        "row",
        "gelu_mlp",
        sizes={MLP + "test_gelu_mlp": "d_ff = 56 differs from d_model"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={MOD + "test_logits_match_reference": "the gpt2 model's MLP"},
        extremes="n/a: no optional arguments (the test doubles w_fc so that tanh and exact GELU differ)",
    ),
    C(
        "rope",
        "row",
        "rope",
        sizes={
            POS + "test_rope_position_zero_is_identity": "position 0, T = 1",
            POS + "test_rope_positions_scattered_and_broadcast": "x [T, d_head] (2-D)",
            POS + "test_rope_rejects_odd_head_dim": "odd d_head -> ValueError",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            ATT + "test_multihead_attention_with_rope": "inside self-attention",
            KVC + "test_cached_logits_equal_full_forward": "positions continuing from a cache",
        },
        extremes={
            POS + "test_rope_honours_theta": "theta = 500 (default 10000 in test_rope)",
            POS + "test_rope_positions_scattered_and_broadcast": "unsorted positions up to 500, [T] and [B, 1, T]",
            POS + "test_rope_scores_depend_only_on_relative_position": "positions shifted by -40..40",
        },
    ),
    C(
        "sinusoidal_positions",
        "row",
        "sinusoidal_positions",
        sizes={POS + "test_sinusoidal_table": "odd d_model = 7 (the last sin column has no cos partner)"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths="n/a: the gpt2 model learns its positions; the table is reached by calling it",
        extremes={POS + "test_sinusoidal_table": "the default dtype, a float32 table accepted (amendment 5)"},
    ),
    C(
        "causal_mask",
        "row",
        "causal_mask",
        sizes={ATT + "test_causal_mask_bottom_right": "t_q = 1, t_q < t_k, t_q = t_k"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths=DIRECT,
        extremes={ATT + "test_causal_mask_bottom_right": "the device argument"},
    ),
    C(
        "repeat_kv",
        "row",
        "repeat_kv",
        sizes={ATT + "test_repeat_kv_interleaves": "n_rep = 1 (identity) and 4"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={ATT + "test_sdpa_gqa_mapping": "GQA attention (repeat_interleave semantics)"},
        extremes=NO_ARGS,
    ),
    C(
        "scaled_dot_product_attention",
        "row",
        "scaled_dot_product_attention",
        sizes={ATT + "test_sdpa_gqa_mapping": "T_q = 6 != T_k, one kv head"},
        ties=NO_RANK,
        padding={ATT + "test_sdpa_mask_broadcast": "rows of the batch with 9, 13 and 6 visible keys"},
        state=PURE,
        paths={
            ATT + "test_flash_equals_naive_attention": "the implementation's own attention against its flash",
            ATT + "test_multihead_attention_layout": "inside self-attention",
        },
        extremes={
            ATT + "test_sdpa_matches_reference": "mask omitted (None) and a causal mask; rows with no allowed key "
            "are unspecified and never tested",
        },
    ),
    C(
        "flash_attention",
        "row",
        "flash_attention",
        sizes={
            ATT + "test_flash_attention_matches_reference": "block 1, 4, 5 and 64 > T; T not a multiple of the block",
            ATT + "test_flash_equals_naive_attention": "T_q and T_k from 1, any block size 1..9",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={ATT + "test_flash_equals_naive_attention": "against the implementation's own attention"},
        extremes={
            ATT + "test_flash_attention_stable_for_large_scores": "scores near ±1e4 (the running max)",
            ATT + "test_attention_defaults": "causal and block_size omitted",
        },
    ),
    C(
        "multihead_self_attention",
        "row",
        "multihead_self_attention",
        sizes={ATT + "test_multihead_attention_layout": "MHA and GQA"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={MOD + "test_logits_match_reference": "the model's attention"},
        extremes={
            ATT + "test_multihead_attention_with_rope": "theta given; positions default and scattered",
            ATT + "test_multihead_attention_layout": "theta omitted (no RoPE)",
            ATT + "test_attention_defaults": "n_kv_heads omitted",
        },
    ),
    C(
        "cross_entropy",
        "row",
        "cross_entropy",
        sizes={LOS + "test_cross_entropy_mean_nll": "[N, V] and [B, T, V] (amendment 3)"},
        ties=NO_RANK,
        padding={
            LOS + "test_cross_entropy_ignores_ignore_index": "every third target ignored; a custom ignore_index; "
            "rows with 9, 4 and 13 counted targets. All targets ignored is 0/0, unspecified, not tested"
        },
        state=PURE,
        paths={
            LOS + "test_lm_loss_ignores_padding": "through lm_loss",
            TRA + "test_train_step_matches_reference": "train_step's loss on pre-shifted targets",
            TRA + "test_evaluate_is_token_weighted": "evaluate's total NLL",
        },
        extremes={
            LOS + "test_cross_entropy_stable_for_large_logits": "logits near ±1e4",
            LOS + "test_cross_entropy_ignores_ignore_index": "the default ignore_index -100 and a custom one",
        },
    ),
    C(
        "lm_loss",
        "row",
        "lm_loss",
        sizes="n/a: T = 13; T = 1 predicts nothing (0/0, unspecified)",
        ties=NO_RANK,
        padding={LOS + "test_lm_loss_ignores_padding": "ids padded with -100, rows predicting 8, 3 and 12 tokens"},
        state=PURE,
        paths=DIRECT,
        extremes={LOS + "test_lm_loss_predicts_the_next_token": "no arguments beyond logits and ids"},
    ),
    # ----------------------------------------------------------------------------------------------- Sampling
    C(
        "sampling_probs",
        "row",
        "sampling_probs",
        sizes={
            SAM + "test_sampling_probs_any_leading_shape": "logits [V] and [B, T, V]",
            SAM + "test_top_k_keeps_exactly_k": "k = 1, 3, V and V + 5",
        },
        ties={
            SAM + "test_top_p_with_tied_probabilities": "three tokens tied at 0.3: the nucleus keeps the smallest "
            "set, not every token tied with the crossing one. Ties with the k-th logit (keep them all, or exactly k) "
            "and the argmax among ties at temperature 0 are not specified, and not tested",
            SAM + "test_top_p_keeps_the_crossing_token": "masses at a boundary, decided ±1e-4 away (amendment 2)",
        },
        padding="n/a: every row is filtered on its own (rows of different spread keep different counts: "
        "test_sampling_probs_match_reference)",
        state=PURE,
        paths={
            SAM + "test_sample_frequencies_follow_sampling_probs": "what sample draws",
            GEN + "test_generate_samples_from_sampling_probs": "what generate draws at temperatures 0.7, 1.3, 1.5 "
            "and its default 1, with top_k, top_p and both",
            GEN + "test_generate_applies_sampling_filters": "generate at temperature 1.7 with top_k 1 or top_p 1e-6",
            GEN + "test_greedy_generation_follows_the_model": "generate at temperature 0",
        },
        extremes={
            SAM + "test_temperature_zero_is_argmax": "temperature 0",
            SAM + "test_invalid_arguments_raise": "temperature < 0, top_k 0, top_p 0, 1.5 and -0.1",
            SAM + "test_top_p_keeps_the_crossing_token": "top_p = 1",
            SAM
            + "test_at_least_one_token_kept": "top_p from 1e-12 to 1e-3, float32 and float64 (below float32 rounding)",
            SAM + "test_sampling_probs_match_reference": "temperature omitted (1), 0.5 to 1.9",
        },
    ),
    C(
        "sample",
        "row",
        "sample",
        sizes={SAM + "test_sampling_probs_any_leading_shape": "logits [V] and [B, T, V]"},
        ties="n/a: as sampling_probs",
        padding="n/a: as sampling_probs",
        state={
            SAM + "test_sample_is_reproducible_per_generator": "two draws in a row from generators seeded alike (a "
            "sampler reading the global RNG draws differently)",
            SAM + "test_greedy_sample_leaves_the_generator_alone": "temperature 0 does not consume the generator",
        },
        paths={
            GEN + "test_sampled_generation_is_reproducible": "through generate",
            GEN + "test_generate_samples_from_sampling_probs": "the distribution generate draws from",
        },
        extremes={
            SAM + "test_temperature_zero_is_argmax": "temperature 0 (amendment 4)",
            SAM + "test_invalid_arguments_raise": "invalid arguments",
            SAM + "test_sample_leaves_its_logits_unchanged": "temperature 0, the defaults, and all filters",
        },
    ),
    # -------------------------------------------------------------------------------------------------- Model
    C(
        "model.config",
        "paragraph",
        "Config is a plain dict",
        sizes={
            MOD + "test_kv_cache_bytes": "n_layers 3 with one kv head",
            MOD + "test_config_errors_raise": "d_model % n_heads, n_heads % n_kv_heads, odd RoPE head dim",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: a description of the configuration",
        paths={
            MOD + "test_logits_match_reference": "both families, pre-norm, tied and untied",
            MOD + "test_initialisation_statistics": "fresh models of both families",
        },
        extremes={
            MOD + "test_config_defaults": "every optional key omitted",
            GEN + "test_generation_ignores_dropout": "dropout 0.5",
            MOD + "test_logits_match_reference[llama_mha-f64]": "rope_theta 500, untied head",
        },
    ),
    C(
        "model.weight_names",
        "paragraph",
        "Canonical weight names",
        sizes={
            MOD + "test_canonical_state_dict_roundtrip": "tied and untied (lm_head.weight only when untied), "
            "both families, GQA shapes"
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: names and shapes",
        paths={MOD + "test_count_parameters": "canonical names list a tied matrix once"},
        extremes=NO_ARGS,
    ),
    C(
        "build_model",
        "row",
        "build_model",
        sizes={MOD + "test_config_errors_raise": "the three ValueError conditions"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={MOD + "test_initialisation_statistics": "fresh weights drawn from the (seeded) global RNG"},
        paths={MOD + "test_tied_head_is_the_embedding_parameter": "gradients from both uses of a tied matrix"},
        extremes={
            MOD + "test_initialisation_statistics": "state_dict omitted: initialise (4 layers: residual scale)",
            MOD + "test_canonical_state_dict_roundtrip": "state_dict given, copied exactly (amendment 1)",
        },
    ),
    C(
        "canonical_state_dict",
        "row",
        "canonical_state_dict",
        sizes={MOD + "test_canonical_state_dict_roundtrip": "every config"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={TRA + "test_train_step_matches_reference": "the weights after training steps"},
        extremes=NO_ARGS,
    ),
    C(
        "forward",
        "row",
        "forward",
        sizes={
            MOD + "test_forward_past_context_raises": "exactly context_length accepted, one more raises",
            KVC + "test_cache_overflow_raises": "a cache filled to exactly context_length accepted, past it raises",
            KVC + "test_cached_logits_equal_full_forward": "chunks of one token",
        },
        ties=NO_RANK,
        padding="n/a: forward takes no attention mask; all rows have T tokens",
        state={
            KVC + "test_cached_logits_equal_full_forward": "a cache already filled: ids follow it, positions continue",
            KVC + "test_cache_equals_no_cache_for_any_chunking": "any split into chunks",
        },
        paths={KVC + "test_cache_overflow_raises": "the context check through the cache"},
        extremes={MOD + "test_forward_past_context_raises": "cache omitted (None)"},
    ),
    C(
        "new_cache",
        "row",
        "new_cache",
        sizes={
            KVC + "test_cache_layout_rotated_keys_plain_values": "batch 2",
            GEN + "test_generate_samples_from_sampling_probs": "batch 4000, through generate",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={KVC + "test_cached_logits_equal_full_forward": "an empty cache filled across calls"},
        paths={GEN + "test_greedy_generation_follows_the_model": "generate's cache"},
        extremes=NO_ARGS,
    ),
    C(
        "cache_kv",
        "row",
        "cache_kv",
        sizes={KVC + "test_cache_layout_rotated_keys_plain_values": "every layer, T_cached = 9"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={KVC + "test_cache_layout_rotated_keys_plain_values": "a cache filled in two calls"},
        paths=DIRECT,
        extremes=NO_ARGS,
    ),
    C(
        "generate",
        "row",
        "generate",
        sizes={
            GEN + "test_generation_from_a_single_token": "a 1-token prompt",
            GEN + "test_generate_rejects_an_empty_prompt": "a 0-token prompt (amendment 9)",
            GEN + "test_zero_new_tokens_return_the_prompt": "max_new_tokens = 0",
            GEN + "test_long_prompt_is_cropped": "a prompt of context_length + 7",
            GEN + "test_generation_slides_past_the_context": "through exactly context_length and 8 past it",
        },
        ties="n/a: which of two equal top logits greedy decoding picks is not specified; random weights make "
        "such ties improbable",
        padding="n/a: a prompt [B, T] has no padding",
        state={
            GEN + "test_generate_restores_the_mode": "a model in train or eval mode",
            GEN + "test_generation_ignores_dropout": "training mode with dropout 0.5",
            GEN + "test_sampled_generation_is_reproducible": "two runs with generators seeded alike (a sampler "
            "reading the global RNG differs)",
        },
        paths={
            GEN + "test_greedy_generation_follows_the_model": "with and without the cache",
            GEN + "test_generate_samples_from_sampling_probs": "the distribution really sampled, at temperatures "
            "0.7, 1.3, 1.5 and the default 1",
            GEN + "test_generate_applies_sampling_filters": "top_k and top_p through generate",
        },
        extremes={
            GEN + "test_generate_samples_from_sampling_probs[defaults]": "temperature, top_k, top_p omitted",
            GEN + "test_generate_applies_sampling_filters": "top_k = 1, top_p = 1e-6",
            GEN + "test_greedy_generation_follows_the_model": "temperature 0, use_cache True and False",
        },
    ),
    C(
        "count_parameters",
        "row",
        "count_parameters",
        sizes={
            MOD + "test_count_parameters": "tied and untied",
            MOD + "test_count_parameters_gpt2_small_on_meta": "GPT-2 small on the meta device",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths=DIRECT,
        extremes=NO_ARGS,
    ),
    C(
        "kv_cache_bytes",
        "row",
        "kv_cache_bytes",
        sizes={MOD + "test_kv_cache_bytes": "n_layers 2 and 3, n_kv_heads 1, 2 and 8"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths=DIRECT,
        extremes={MOD + "test_kv_cache_bytes": "float32, bfloat16, float64 and dtype omitted (float32)"},
    ),
    # ------------------------------------------------------------------------------------ Training, evaluation
    C(
        "get_batch",
        "row",
        "get_batch",
        sizes={
            TRA + "test_get_batch_with_exactly_enough_data": "context_length + 1 tokens, batch 1",
            TRA + "test_get_batch_rejects_too_little_data": "context_length tokens -> ValueError",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: the protocol does not say the windows are drawn from `generator` (a mutant drawing from the "
        "global RNG survives: docs/mutation-testing.md)",
        paths={
            TRA + "test_get_batch_windows_and_shift": "numpy and tensor data",
            TRA + "test_train_defaults_to_adamw_at_lr_1e_3": "through train",
        },
        extremes={
            TRA + "test_get_batch_reaches_every_start": "the first and the last start",
            TRA + "test_get_batch_windows_and_shift": "the device argument",
        },
    ),
    C(
        "train_step",
        "row",
        "train_step",
        sizes="n/a: sizes belong to the model",
        ties=NO_RANK,
        padding="n/a: pre-shifted targets without ignored entries (the loss is cross_entropy's clause)",
        state={
            TRA + "test_train_step_ignores_gradients_already_present": "gradients of another loss already present",
            TRA + "test_train_step_runs_in_training_mode": "a model handed over in eval mode",
            TRA + "test_train_step_matches_reference": "an optimizer with state (AdamW's second step)",
        },
        paths={TRA + "test_train_step_runs_in_training_mode": "model(x), forward or a method (amendment 13)"},
        extremes={TRA + "test_train_step_matches_reference": "max_grad_norm omitted (None) and 0.5"},
    ),
    C(
        "train",
        "row",
        "train",
        sizes={
            TRA + "test_train_defaults_to_adamw_at_lr_1e_3": "2 steps",
            TRA + "test_tiny_model_overfits_tiny_corpus": "80 steps",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={TRA + "test_train_is_deterministic_for_a_seed": "different global RNG states, dropout 0.1"},
        paths={
            TRA + "test_train_losses_are_next_token_losses": "get_batch's windows and next-token targets reach "
            "train_step (not swapped, not unshifted)",
            TRA + "test_tiny_model_overfits_tiny_corpus": "get_batch and train_step inside the loop",
        },
        extremes={
            TRA + "test_train_is_deterministic_for_a_seed": "seed omitted (0)",
            TRA + "test_train_defaults_to_adamw_at_lr_1e_3": "lr omitted (1e-3, AdamW); max_grad_norm's default "
            "is not observable there (AdamW's first step ignores the gradient's scale)",
        },
    ),
    C(
        "evaluate",
        "row",
        "evaluate",
        sizes={
            TRA + "test_evaluate_is_token_weighted": "2 tokens; windows dividing the data evenly; a length that is a "
            "multiple of context_length; batch_size below and above the number of windows"
        },
        ties=NO_RANK,
        padding={TRA + "test_evaluate_is_token_weighted": "a short last window weighs by its tokens"},
        state={
            TRA + "test_evaluate_restores_mode_and_computes_no_gradients": "a model in train or eval mode",
            TRA + "test_evaluate_ignores_dropout": "training mode with dropout 0.5",
        },
        paths="n/a: evaluate's own loop (the NLL is cross_entropy's clause)",
        extremes={
            TRA + "test_evaluate_is_token_weighted": "batch_size 2, 3, 4 and 8 (it changes speed, not the result)"
        },
    ),
    # ------------------------------------------------------------------------------------------------ Amendments
    C(
        "amendment.1",
        "amendment",
        "1",
        sizes="n/a: how models are built",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={MOD + "test_canonical_state_dict_roundtrip": "default dtype and device set while building"},
        paths={PRE + "test_float64_model_computed_in_float64": "float64 weights stay float64"},
        extremes=NO_ARGS,
    ),
    C(
        "amendment.2",
        "amendment",
        "2",
        pinned_by=("tests/test_reference_sampling_training.py::test_top_p_keeps_exactly_two",),
        sizes="n/a: about sums",
        ties={
            SAM + "test_top_p_keeps_the_crossing_token": "boundaries 0.5 and 0.8 checked 1e-4 either side, f32 and f64"
        },
        padding=NO_TARGETS,
        state=PURE,
        paths={SAM + "test_top_p_with_tied_probabilities": "masses at least 0.05 from top_p"},
        extremes="n/a: the suite never checks within rounding of the boundary",
    ),
    C(
        "amendment.3",
        "amendment",
        "3",
        sizes={LOS + "test_cross_entropy_mean_nll": "logits [N, V] and [B, T, V]"},
        ties=NO_RANK,
        padding={LOS + "test_cross_entropy_ignores_ignore_index": "a padded [B, T] batch"},
        state=PURE,
        paths={LOS + "test_lm_loss_predicts_the_next_token": "lm_loss's [B, T - 1, V] call"},
        extremes=NO_ARGS,
    ),
    C(
        "amendment.4",
        "amendment",
        "4",
        sizes={SAM + "test_sampling_probs_any_leading_shape": "argmax ids of logits [V] and [B, T, V]"},
        ties="n/a: which argmax among tied logits is not specified",
        padding=NO_TARGETS,
        state={SAM + "test_greedy_sample_leaves_the_generator_alone": "the generator's state is unchanged"},
        paths={GEN + "test_greedy_generation_follows_the_model": "greedy generate"},
        extremes=NO_ARGS,
    ),
    C(
        "amendment.5",
        "amendment",
        "5",
        sizes={POS + "test_sinusoidal_table": "even and odd d_model"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: the default dtype is the suite's (float64 while building models, float32 otherwise)",
        paths=DIRECT,
        extremes={POS + "test_sinusoidal_table": "a float32 table accepted to float32 rounding"},
    ),
    C(
        "amendment.6",
        "amendment",
        "6",
        pinned_by=(
            "tests/test_reference_fast_paths.py::test_fused_attention_equals_the_math",
            "tests/test_reference_fast_paths.py::test_fused_cross_entropy_equals_the_math",
            "tests/test_reference_model.py::test_attention_paths_give_same_logits",
            "tests/test_reference_model.py::test_rope_style_matters",
        ),
        sizes="n/a: options of the reference, not of implementations",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: options of the reference",
        paths={"tests/test_reference_fast_paths.py::test_attention_paths_equal_the_math_with_a_cache": "with a cache"},
        extremes="n/a: options of the reference",
    ),
    C(
        "amendment.7",
        "amendment",
        "7",
        pinned_by=(PLUGIN + "test_expected_failures_are_strict",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths=SUITE_RULE,
        extremes=SUITE_RULE,
    ),
    C(
        "amendment.8",
        "amendment",
        "8",
        pinned_by=(PLUGIN + "test_not_implemented_deep_inside_names_the_entry_point",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths=SUITE_RULE,
        extremes=SUITE_RULE,
    ),
    C(
        "amendment.9",
        "amendment",
        "9",
        sizes={GEN + "test_generate_rejects_an_empty_prompt": "a [2, 0] prompt"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state="n/a: raised before anything runs",
        paths="n/a: generate only",
        extremes=NO_ARGS,
    ),
    C(
        "amendment.10",
        "amendment",
        "10",
        pinned_by=(PLUGIN + "test_capabilities_skip_what_is_not_supported",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={
            PRI + "test_linear_bias": "require_capability in a test",
            TRA + "test_train_step_runs_in_training_mode": "a behaviour checked another way without a capability",
        },
        extremes=SUITE_RULE,
    ),
    C(
        "amendment.11",
        "amendment",
        "11",
        sizes="n/a: about dtypes",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            PRE + "test_float64_model_computed_in_float64": "the model",
            PRE + "test_float64_evaluation_computed_in_float64": "evaluate's total NLL",
        },
        extremes={NOR + "test_norm_statistics_in_at_least_float32": "float16 statistics in at least float32"},
    ),
    C(
        "amendment.12",
        "amendment",
        "12",
        pinned_by=(PLUGIN + "test_any_value_error_passes_whatever_its_message",),
        sizes=SUITE_RULE,
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={MOD + "test_config_errors_raise": "spec.raises with values a good message names (advice only)"},
        extremes=SUITE_RULE,
    ),
    C(
        "amendment.13",
        "amendment",
        "13",
        sizes="n/a: about observation",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={
            TRA + "test_evaluate_restores_mode_and_computes_no_gradients": "no .grad afterwards that was not there",
            TRA + "test_train_step_runs_in_training_mode": "the mode of every submodule that runs",
        },
        paths={TRA + "test_train_step_runs_in_training_mode": "however train_step routes its calls"},
        extremes=NO_ARGS,
    ),
    C(
        "amendment.14",
        "amendment",
        "14",
        sizes={TRA + "test_get_batch_draws_from_its_generator": "batch 4, context 5"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={TRA + "test_get_batch_draws_from_its_generator": "two different global RNG states"},
        paths={TRA + "test_get_batch_draws_from_its_generator": "the generator argument"},
        extremes=NO_ARGS,
    ),
    C(
        "amendment.15",
        "amendment",
        "15",
        pinned_by=(SAM + "test_sampling_probs_match_reference",),
        sizes={SAM + "test_sampling_probs_match_reference": "top_k = 7 of V = 67 with top_p = 0.75"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={SAM + "test_sampling_probs_match_reference": "temperature, top-k and top-p together"},
        extremes={SAM + "test_sampling_probs_match_reference": "top-k removing mass that top-p would have counted"},
    ),
    C(
        "amendment.16",
        "amendment",
        "16",
        pinned_by=(MOD + "test_tied_head_is_the_embedding_parameter", TRA + "test_train_defaults_to_adamw_at_lr_1e_3"),
        sizes="n/a: about how weights are found",
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={MOD + "test_tied_head_is_the_embedding_parameter": "parameters restored after the coded read"},
        paths={
            MOD + "test_tied_head_is_the_embedding_parameter": "the parameter holding the embedding, by its values",
            TRA + "test_train_defaults_to_adamw_at_lr_1e_3": "gradients under canonical names, by values",
        },
        extremes=NO_ARGS,
    ),
    C(
        "amendment.17",
        "amendment",
        "17",
        sizes={TRA + "test_train_draws_fresh_windows_every_step": "4 steps, batch 2, context 8, 400 tokens"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={TRA + "test_train_draws_fresh_windows_every_step": "lr = 0: the weights never move between steps"},
        paths={TRA + "test_train_draws_fresh_windows_every_step": "train's own batch drawing"},
        extremes={TRA + "test_train_draws_fresh_windows_every_step": "lr = 0"},
    ),
    # ---------------------------------------------------------------- protocol v2: optional capabilities
    C(
        "amendment.18",
        "amendment",
        "18",
        pinned_by=(
            V2 + "test_a_v1_list_implies_both_filters",
            V2 + "test_a_v2_list_holds_exactly_what_it_names",
            V2 + "test_bad_declarations_raise",
            V2 + "test_a_v1_implementation_skips_only_the_v2_tests",
        ),
        sizes={V2 + "test_a_v2_list_holds_exactly_what_it_names": "an empty v2 list; an empty v1 list (a rubric)"},
        ties=SUITE_RULE,
        padding=SUITE_RULE,
        state=SUITE_RULE,
        paths={
            V2 + "test_a_v1_implementation_skips_only_the_v2_tests": "a star import of the reference (v1, undeclared)",
            V2 + "test_bad_declarations_raise": "v2 names under version 1, unknown names, unknown versions",
        },
        extremes={V2 + "test_a_v1_list_implies_both_filters": "the default list and the empty list"},
    ),
    C(
        "amendment.19",
        "amendment",
        "19",
        pinned_by=(V2 + "test_a_sampler_without_top_p_is_judged_on_everything_else",),
        sizes={SAM + "test_sampling_probs_any_leading_shape": "[V] and [B, T, V] logits, with the filters it has"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={SAM + "test_sample_is_reproducible_per_generator": "the global RNG seeded differently, no filter"},
        paths={
            V2 + "test_a_sampler_without_top_p_is_judged_on_everything_else": "sampling_probs, sample, generate "
            "without a top_p parameter",
            GEN + "test_sampled_generation_is_reproducible": "generate with the filters the implementation has",
        },
        extremes={SAM + "test_sample_leaves_its_logits_unchanged": "temperature 0, defaults, the filters it has"},
    ),
    C(
        "amendment.20",
        "amendment",
        "20",
        sizes={
            RSC + "test_dynamic_scaling_follows_the_sequence_length": "seq_len = L0 (unscaled), 40 and 90 from 6 "
            "positions"
        },
        ties="n/a: nothing is ranked; a wavelength exactly on a bound is interpolated to the same value either side",
        padding=NO_TARGETS,
        state=PURE,
        paths={
            RSC + "test_rope_scaling_matches_reference": "rope(..., scaling=) for each type",
            RSC + "test_model_honours_rope_scaling": "the config's rope_scaling in the model (table and dynamic paths)",
        },
        extremes={
            RSC
            + "test_rope_scaling_matches_reference": "positions up to 4 L0, beyond original_max_position_embeddings",
            RSC + "test_rope_scaling_frequencies": "llama3's three wavelength regimes; YaRN's ramp",
            RSC + "test_rope_scaling_rejects_bad_dicts": "an unknown type, factor below 1",
        },
    ),
    C(
        "amendment.21",
        "amendment",
        "21",
        sizes={ATT + "test_multihead_attention_without_rope_is_causal": "cuts at 1, T/2 and T - 1"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state=PURE,
        paths={
            ATT + "test_multihead_attention_without_rope_is_causal": "multihead_self_attention without theta",
            PRE + "test_float64_attention_without_rope_computed_in_float64": "float64, without theta",
        },
        extremes={ATT + "test_multihead_attention_is_causal": "with theta: skipped where FAMILIES lacks llama"},
    ),
    C(
        "amendment.22",
        "amendment",
        "22",
        sizes={QKB + "test_logits_match_reference_with_qkv_bias": "llama GQA config, ids [2, 11]"},
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={QKB + "test_cache_equals_no_cache_with_qkv_bias": "chunks 6, 1, 1, 9 through the cache"},
        paths={
            QKB + "test_logits_match_reference_with_qkv_bias": "forward with non-zero biases on q, k, v",
            QKB + "test_qkv_bias_canonical_names": "exactly attn.w{q,k,v}.bias added; no wo or MLP bias",
        },
        extremes={QKB + "test_qkv_bias_needs_the_llama_family": "qkv_bias on a gpt2 config raises"},
    ),
    C(
        "amendment.23",
        "amendment",
        "23",
        sizes={
            BAT + "test_padded_greedy_generation_equals_each_row_alone": "1 to 3 rows, real lengths 1..6, padding "
            "0..7 (an unpadded row beside padded ones, one real token)"
        },
        ties="n/a: greedy ties between logits are as unlikely as in v1's greedy tests; nothing else is ranked",
        padding={
            BAT + "test_padded_forward_rows_equal_each_row_alone": "rows padded 0, 2 and 5 in one batch",
            BAT + "test_padding_token_ids_do_not_matter": "padding ids 0, V - 1 and random",
        },
        state={
            BAT + "test_padded_cache_holds_each_row_alone": "the cache after a padded prefill, layers 0 and last",
            BAT + "test_padded_cached_forward_equals_uncached": "a filled cache, the whole mask passed at each call",
        },
        paths={
            BAT + "test_padded_forward_rows_equal_each_row_alone": "forward, llama and gpt2",
            BAT + "test_padded_cached_generation_equals_uncached": "generate with and without the cache",
        },
        extremes={
            BAT + "test_attention_mask_rejects_what_is_not_left_padding": "right padding, a hole, an all-zero row, "
            "a wrong shape, in forward and generate"
        },
    ),
    C(
        "amendment.24",
        "amendment",
        "24",
        sizes={
            QKN + "test_logits_match_reference_with_qk_norm": "llama GQA config, ids [2, 11]",
            QKN + "test_qk_norm_is_per_head": "8 query heads at scales 0.2..5, 2 key heads at 4 and 0.25",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={QKN + "test_cache_equals_no_cache_with_qk_norm": "chunks 6, 1, 1, 9 through the cache"},
        paths={
            QKN + "test_logits_match_reference_with_qk_norm": "forward with gains in [0.5, 1.5] on q and k",
            QKN + "test_qk_norm_comes_before_rope": "multihead_self_attention(q_norm=, k_norm=) at scattered positions",
            QKN + "test_qk_norm_on_queries_and_keys_not_values": "wk x4 normalised back, wv x3 kept",
            QKN + "test_qk_norm_canonical_names": "exactly attn.{q,k}_norm.weight added; as loaded; fresh ones",
        },
        extremes={
            QKN + "test_qk_norm_eps_inside_the_root": "norm_eps = 0.25 against unit-scale heads",
            QKN + "test_qk_norm_needs_the_llama_family": "qk_norm on a gpt2 config raises",
        },
    ),
    C(
        "amendment.25",
        "amendment",
        "25",
        sizes={
            LSC + "test_attention_scores_are_softcapped_before_the_mask": "5 queries against 13 keys (masked keys in "
            "every row but the last), GQA where supported",
            LSC + "test_logits_match_reference_with_softcaps": "llama GQA config, ids [2, 11]",
        },
        ties=NO_RANK,
        padding="n/a: the cap is elementwise on scores and logits; padding masks are amendment 23's, applied after it",
        state={
            LSC + "test_cache_equals_no_cache_with_softcaps": "chunks 6, 1, 1, 9 through the cache, both caps",
            LSC + "test_loss_uses_the_capped_logits": "evaluate runs the model itself, in eval mode",
        },
        paths={
            LSC + "test_attention_scores_are_softcapped_before_the_mask": "scaled_dot_product_attention(softcap=)",
            LSC + "test_multihead_attention_softcaps_its_scores": "multihead_self_attention(softcap=)",
            LSC + "test_logits_match_reference_with_softcaps": "forward with both caps; |logits| < the final cap",
            LSC + "test_loss_uses_the_capped_logits": "evaluate's loss from the capped logits",
        },
        extremes={
            LSC + "test_attention_scores_are_softcapped_before_the_mask": "scores up to about +-6 against cap 1.7",
            LSC + "test_softcaps_must_be_positive": "a cap of 0 and a negative cap raise",
        },
    ),
    C(
        "amendment.26",
        "amendment",
        "26",
        sizes={
            GEM + "test_logits_match_reference_with_norm_offset": "llama GQA config, ids [2, 11]",
            GEM + "test_cache_equals_no_cache_with_gemma_options": "every option held together, with the soft-caps",
        },
        ties=NO_RANK,
        padding=NO_TARGETS,
        state={
            GEM + "test_cache_equals_no_cache_with_gemma_options": "chunks 6, 1, 1, 9 through the cache",
            GEM + "test_zero_offsets_are_the_identity_gain": "fresh weights of a newly built model",
        },
        paths={
            GEM + "test_logits_match_reference_with_norm_offset": "every norm with an offset, the final one included",
            GEM + "test_logits_match_reference_with_embed_scale": "the input embeddings scaled, the tied head not",
            GEM + "test_logits_match_reference_with_geglu": "tanh-GELU on the gate (up projections x 4)",
            GEM + "test_logits_match_reference_with_post_norms": "both post-norms, before the residual add",
            GEM + "test_post_norms_canonical_names": "exactly attn_post_norm and mlp_post_norm added, as loaded",
            "tests/test_protocol_v2.py::test_the_reference_with_every_gemma_option_fixed_passes": "FIXED_CONFIG: "
            "the v1 model tests on Gemma-style configs",
        },
        extremes={
            GEM + "test_zero_offsets_are_the_identity_gain": "every offset 0: the gain 1, the plain normalisation",
            GEM + "test_gemma_options_need_the_llama_family": "each option on a gpt2 config raises",
        },
    ),
    C(
        "amendment.27",
        "amendment",
        "27",
        sizes={
            SLW + "test_window_mask": "t_q = t_k, t_q < t_k, one query, a chunk longer than the window, W = 1, "
            "W past every key",
            SLW + "test_tokens_before_the_window_never_matter": "W 1..6, any query and any earlier position",
        },
        ties="n/a: nothing is ranked; a key exactly W back is the boundary, pinned on both sides",
        padding="n/a: padding with a window is amendment 23's rule on real tokens, which the window leaves unchanged",
        state={
            SLW + "test_cache_equals_no_cache_past_the_window": "token by token, prefill + decode + chunk, chunks "
            "longer than the window",
            SLW + "test_sliding_cache_holds_the_last_keys_and_values": "a rolling cache allowed: the last W - 1 "
            "entries of a sliding layer, every entry of a full one",
            SLW + "test_greedy_generation_past_the_window": "14 tokens after a 6-token prompt, with the cache",
        },
        paths={
            SLW + "test_multihead_attention_with_window": "multihead_self_attention(..., window=)",
            SLW + "test_logits_match_reference_with_sliding_window": "every layer sliding, and a layer_types pattern",
        },
        extremes={
            SLW + "test_window_holds_exactly_w_tokens": "the oldest key in the window and the first one out of it",
            SLW + "test_bad_sliding_window_raises": "W = 0, W < 0, layer_types of the wrong length or with an "
            "unknown entry, sliding layers without a window",
        },
    ),
    C(
        "amendment.28",
        "amendment",
        "28",
        sizes={
            MOE + "test_moe_mlp": "x [3, 13, 80], 5 experts of width 56, top 2, float32 and float64",
            MOE + "test_moe_mlp_other_top_k": "top_k 1 (one expert, weight 1) and 3 of 5",
            MOE + "test_moe_mlp_with_every_expert_is_the_dense_mixture": "top_k = n_experts",
            MOE + "test_logits_match_reference_with_moe": "llama GQA config with 4 experts, 2 per token, ids [2, 11]",
        },
        ties={
            MOE + "test_moe_load_balancing_loss_of_a_uniform_router": "every logit equal: the loss is top_k whichever "
            "experts torch.topk's ties choose",
            MOE + "test_moe_mlp": "routed outputs: no ties in the inputs (ties broken as torch.topk, unspecified)",
        },
        padding="n/a: tokens are routed one by one; the loss is one layer's, without Hugging Face's attention mask",
        state={
            MOE + "test_cache_equals_no_cache_with_moe": "chunks 6, 1, 1, 9 through the cache",
            MOE + "test_moe_unchosen_expert_gets_no_gradient": "gradients of the model's cross-entropy",
        },
        paths={
            MOE + "test_moe_mlp": "moe_mlp called directly",
            MOE + "test_logits_match_reference_with_moe": "the model's MLP through moe_mlp",
            MOE + "test_moe_canonical_names": "mlp.router.weight and mlp.experts.{e}.* in place of the dense MLP",
            MOE + "test_moe_load_balancing_loss": "moe_load_balancing_loss, 40 tokens, 5 experts, top 2",
        },
        extremes={
            MOE + "test_moe_weights_are_renormalised": "a near-uniform router: the top 2 of 5 sum to about 0.4",
            MOE + "test_moe_unchosen_expert_has_no_effect": "an expert no token chooses, its weights changed",
            MOE + "test_moe_load_balancing_loss_of_a_uniform_router": "the uniform router, top_k 1 and 3",
            MOE + "test_moe_mlp_rejects_a_bad_top_k": "top_k 0 and n_experts + 1, in both functions",
            MOE + "test_moe_bad_config_raises": "n_experts_per_token 0, above n_experts, missing, without experts; "
            "n_experts < 0",
            MOE + "test_moe_needs_the_llama_family": "n_experts on a gpt2 config raises",
        },
    ),
]

# Citation wordings that are not clause ids ("protocol: <wording>"); "Conventions, X" looks X up in CONVENTIONS.
CITES = {
    "Model": "model.config",
    "canonical weight names": "model.weight_names",
    "KV cache": "conventions.kv_cache",
    "RoPE": "conventions.rope",
    "at least one token always kept": "sampling_probs",
    "forward with cache": "forward",
    "Component functions": "@judges",  # the table row(s) the test judges
}
CONVENTIONS = {
    "bottom-right aligned": "conventions.causal",
    "GQA": "conventions.gqa",
    "linear": "conventions.linear",
    "ground truth in float64": "conventions.tensors",
    "inputs are never modified in place": "conventions.tensors",
    "head-major": "conventions.layout",
}
CITATION = re.compile(r"\((course notes|symptoms table|protocol|amendment)[^()]*(?:\([^()]*\)[^()]*)*\)")
AMENDMENT = re.compile(r"amendment (\d+)")


# ------------------------------------------------------------------------------------------------ the document
def protocol_clauses(text: str) -> list[tuple[str, str, str]]:
    """``(kind, key, text)`` of every clause of docs/protocol.md."""
    found: list[tuple[str, str, str]] = []
    section, paragraph, in_amendments = "", [], False

    def flush():
        if paragraph and section == "Model":
            found.append(("paragraph", " ".join(paragraph), " ".join(paragraph)))
        paragraph.clear()

    for line in text.splitlines():
        if line.startswith("## "):
            flush()
            section = line[3:].strip()
            in_amendments = section.startswith(("Project amendments", "Protocol v2"))
            continue
        if in_amendments:
            m = re.match(r"^(\d+)\. (.*)", line)
            if m:
                found.append(("amendment", m.group(1), m.group(2)))
            elif found and found[-1][0] == "amendment" and line.startswith("   ") and not line.strip().startswith("|"):
                kind, key, body = found[-1]
                found[-1] = (kind, key, f"{body} {line.strip()}")
            continue
        if section in ("Loading and absence", "Conventions"):
            if line.startswith("- "):
                found.append(("bullet", line[2:], line[2:]))
            elif line.startswith("  ") and found and found[-1][0] == "bullet":
                kind, key, body = found[-1]
                found[-1] = (kind, f"{key} {line.strip()}", f"{body} {line.strip()}")
            continue
        m = re.match(r"^\| `(\w+)` \| `([^|]*)` \| (.*) \|$", line)
        if m and section in ("Component functions", "Sampling", "Model", "Training and evaluation"):
            flush()
            found.append(("row", m.group(1), f"`{m.group(1)}{m.group(2)}`: {m.group(3)}"))
            continue
        if section == "Model" and not line.startswith("|"):
            if line.strip():
                paragraph.append(line.strip())
            else:
                flush()
    flush()
    return found


def attach_text(clauses: list[Clause], parsed) -> list[str]:
    """Give each clause its text; the problems (a clause of the document without entry, or the reverse)."""
    problems = []
    taken = set()
    for clause in clauses:
        hits = [
            i
            for i, (kind, key, _) in enumerate(parsed)
            if kind == clause.kind
            and (key == clause.match if kind in ("row", "amendment") else key.startswith(clause.match))
        ]
        if len(hits) != 1:
            problems.append(f"clause {clause.id}: {len(hits)} clauses of docs/protocol.md match {clause.match!r}")
            continue
        taken.add(hits[0])
        clause.text = parsed[hits[0]][2]
    for i, (kind, key, _) in enumerate(parsed):
        if i not in taken:
            problems.append(f"docs/protocol.md {kind} {key[:60]!r} has no entry in tools/protocol_map.py CLAUSES")
    return problems


# ---------------------------------------------------------------------------------------------------- the tests
def test_functions() -> dict[str, ast.FunctionDef]:
    """``file::name`` -> its AST, for spec_tests/test_*.py (file relative to spec_tests) and tests/test_*.py."""
    found = {}
    for folder, prefix in ((ROOT / "spec_tests", ""), (ROOT / "tests", "tests/")):
        for path in sorted(folder.glob("test_*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                    found[f"{prefix}{path.name}::{node.name}"] = node
    return found


def judged(node: ast.FunctionDef) -> list[str]:
    """The names a spec test's ``@judges(...)`` decorator lists (its subjects, not ``uses``)."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "judges":
            return [a.value for a in dec.args if isinstance(a, ast.Constant)]
    return []


def resolve(citation: str, judges: list[str], ids: set[str]) -> tuple[set[str], list[str]]:
    """Clause ids a citation group "(protocol: ...; amendment N ...)" names, and its unresolved protocol parts."""
    hits, unresolved, kind = set(), [], ""
    for part in (p.strip() for p in citation.split(";")):
        head = part.split(":", 1)[0].strip()
        if head in ("course notes", "symptoms table"):
            kind = head
            continue
        if head.startswith("amendment") or head == "protocol":
            kind = "protocol"
        if kind != "protocol":
            continue
        found = {f"amendment.{n}" for n in AMENDMENT.findall(part)}
        items = [i.strip() for i in part.removeprefix("protocol:").split(",")]
        for j, item in enumerate(items):
            if item in ids:
                found.add(item)
            elif item == "Conventions":
                found.update(CONVENTIONS[n] for n in items[j + 1 :] if n in CONVENTIONS)
            elif CITES.get(item) == "@judges":
                found.update(n for n in judges if n in ids)
            elif item in CITES:
                found.add(CITES[item])
        if not found:
            unresolved.append(part)
        hits |= found
    return hits, unresolved


def declared_pins(functions, ids: set[str]) -> tuple[dict[str, set[str]], list[str]]:
    """Clause id -> spec tests declaring it (``@judges`` rows and docstring citations); problems."""
    pins: dict[str, set[str]] = defaultdict(set)
    problems = []
    for test, node in functions.items():
        if test.startswith("tests/"):
            continue
        names = judged(node)
        for name in names:
            if name in ids:
                pins[name].add(test)
        doc = (ast.get_docstring(node) or "").replace("\n", " ")
        for m in CITATION.finditer(doc):
            hits, unresolved = resolve(m.group(0)[1:-1], names, ids)
            for clause in hits:
                pins[clause].add(test)
            problems += [f"{test}: citation {part!r} names no clause of the protocol" for part in unresolved]
    return pins, problems


def base(ref: str) -> str:
    return ref.split("[", 1)[0]


# ---------------------------------------------------------------------------------------------------- the check
def build() -> tuple[list[Clause], list[str]]:
    clauses = [Clause(c.id, c.kind, c.match, dict(c.edges), c.pinned_by) for c in CLAUSES]
    problems = attach_text(clauses, protocol_clauses(PROTOCOL.read_text()))
    ids = {c.id for c in clauses}
    if len(ids) != len(clauses):
        problems.append("duplicate clause ids in CLAUSES")
    functions = test_functions()
    pins, cite_problems = declared_pins(functions, ids)
    problems += cite_problems
    for c in clauses:
        c.pins = set(pins.get(c.id, ()))
        listed = list(c.pinned_by)
        for edge in EDGES:
            value = c.edges.get(edge)
            if isinstance(value, dict) and value:
                listed += list(value)
            elif not (isinstance(value, str) and value.startswith("n/a: ")):
                problems.append(f"clause {c.id}: edge case {edge!r} has neither tests nor an 'n/a: reason'")
        unknown = set(c.edges) - set(EDGES)
        if unknown:
            problems.append(f"clause {c.id}: unknown edge cases {sorted(unknown)}")
        for ref in listed:
            if base(ref) not in functions:
                problems.append(f"clause {c.id}: {ref} does not exist")
        if not c.pins and not listed:
            problems.append(f"clause {c.id}: no test pins it")
    return clauses, problems


def render(clauses: list[Clause]) -> str:
    def link(ref: str) -> str:
        return f"`{ref}`"

    lines = [
        "# Protocol inventory: every clause, the tests that pin it, the edge cases considered",
        "",
        "Generated by `python tools/protocol_map.py` (CI: `--check`) from `docs/protocol.md`, the spec tests'",
        "`@judges(...)` markers and docstring citations, and the edge-case table in `tools/protocol_map.py`.",
        "Spec tests are named relative to `spec_tests/`; tests of the suite itself start with `tests/`.",
        "",
        "Edge cases considered for every clause:",
        "",
        *[f"- **{k}**: {v}" for k, v in EDGES.items()],
        "",
        "Each is either covered (the tests, and what they exercise) or marked *n/a* with the reason.",
        "",
        "## Summary",
        "",
        "| clause | pinning tests | edge cases covered | n/a |",
        "|---|---:|---:|---:|",
    ]
    for c in clauses:
        covered = sum(isinstance(c.edges[e], dict) for e in EDGES)
        pinned = (
            c.pins
            | {base(r) for r in c.pinned_by}
            | {base(r) for e in EDGES if isinstance(c.edges[e], dict) for r in c.edges[e]}
        )
        lines.append(f"| [`{c.id}`](#{c.id.replace('.', '')}) | {len(pinned)} | {covered} | {len(EDGES) - covered} |")
    section = None
    headings = {"loading": "Loading and absence", "conventions": "Conventions", "amendment": "Project amendments"}
    for c in clauses:
        group = headings.get(c.id.split(".")[0], "Model" if c.id.startswith("model.") else "Functions")
        if group != section:
            section = group
            lines += ["", f"## {group}"]
        text = c.text if len(c.text) <= 700 else c.text[:697].rsplit(" ", 1)[0] + " ..."
        lines += ["", f"### {c.id}", "", f"> {text}", ""]
        declared = sorted(c.pins)
        if declared:
            lines.append(f"Declared by the tests (`@judges` or a citation): {', '.join(map(link, declared))}.")
        if c.pinned_by:
            lines.append(f"Tests of the suite itself: {', '.join(map(link, c.pinned_by))}.")
        lines += ["", "| edge case | covered by | what / why not |", "|---|---|---|"]
        for edge in EDGES:
            value = c.edges[edge]
            if isinstance(value, str):
                lines.append(f"| {edge} | n/a | {value.removeprefix('n/a: ')} |")
            else:
                for i, (ref, note) in enumerate(value.items()):
                    lines.append(f"| {edge if i == 0 else ''} | {link(ref)} | {note} |")
    return "\n".join(lines).replace("\u00b1", "±") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    clauses, problems = build()
    text = render(clauses)
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            problems.append(f"{OUT.relative_to(ROOT)} is out of date: run python tools/protocol_map.py")
        print("\n".join(problems) or f"protocol inventory up to date ({len(clauses)} clauses, every one pinned)")
        return 1 if problems else 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(clauses)} clauses)")
    if problems:
        print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
