"""Naming a failure after a catalogued bug by comparing outputs, not names.

When a check fails, the catalogued bugs that change its subject (``spec_tests.bugs``) are run on the
same inputs; those reproducing the implementation's output are named. An implementation written
independently with the same mistake therefore gets the same line. The catalog is optional (student
handouts ship without it, and use the bug outputs recorded with the expected values instead).
"""

from __future__ import annotations

from ...protocol import CATALOG_GROUPS
from ..judging.compare import mismatch
from ..judging.tolerances import Tolerance

ONLY: set[str] | None = None  # --spec-diagnosis-bugs: the bugs diagnosis may name (None: all)

# The catalog tags bugs by the checks they change; model-level checks judge these protocol names.
# CATALOG_GROUPS (imported): each protocol entry's ``catalog_groups`` (spec_tests/protocol/entries.py)


# The cause code a catalogued bug's class stands for (diagnosis lines name the bug; codes let a
# measurement compare it with what other diagnoses would say).
CLASS_CODES = {
    "layout": "layout",
    "leading_dims": "crash",
    "mask_broadcast": "mask",
    "masking": "mask",
    "softmax_dim": "knob:reduction_dim",
    "causality": "causality",
    "causal_mask": "knob:mask_alignment",
    "attention_scale": "knob:scale_constant",
    "stability": "knob:max_subtraction",
    "flash": "boundary",
    "gqa": "knob:gqa_mapping",
    "rope_frequency": "knob:rope_base",
    "rope_on_values": "knob:rope_target",
    "rope_q_only": "knob:rope_target",
    "sinusoidal": "knob:sinusoid_layout",
    "rmsnorm": "knob:eps_placement",
    "layernorm": "knob:variance_bias",
    "precision": "precision",
    "swiglu": "knob:activation",
    "gelu": "knob:activation",
    "init": "knob:init_std",
    "cache_positions": "knob:position_offset",
    "prompt_cropping": "knob:window",
    "dropout_generation": "knob:mode",
    "mode_restore": "knob:mode",
    "sampling_order": "knob:sampling_order",
    "top_p": "knob:top_p_boundary",
    "top_k": "knob:top_k",
    "unshifted_labels": "knob:label_shift",
    "ignore_index": "knob:ignore_index",
    "evaluation": "knob:loss_reduction",
    "gradient_clipping": "knob:clipping",
    "batch_mixing": "batch_mixing",
    "norm_placement": "knob:norm_placement",
    "tied_weights": "knob:tying",
    "kv_cache": "knob:cache_contents",
    "qkv_bias": "knob:qkv_bias",
    "sliding_window": "knob:sliding_window",
    "qk_norm": "knob:qk_norm",
    "logit_softcap": "knob:logit_softcap",
    "norm_offset": "knob:norm_offset",
    "embed_scale": "knob:embed_scale",
    "geglu": "knob:activation",
    "post_norms": "knob:post_norms",
    "moe": "knob:moe",
}


def bug_subjects(subject: str, rope_style: str, names=None) -> list:
    """``[(bug, reference-like subject), ...]`` for the catalogued bugs that change ``subject``'s checks (only
    those in ``names``, where given)."""
    try:
        from ...bugs import CATALOG, load_bug
    except ImportError:
        return []
    from ..subject.subject import reference_subject

    tags = {subject, *CATALOG_GROUPS.get(subject, ())}
    return [
        (bug, reference_subject(rope_style, load_bug(bug.name), label=f"bug:{bug.name}"))
        for bug in CATALOG.values()
        if tags & set(bug.components) and (ONLY is None or bug.name in ONLY) and (names is None or bug.name in names)
    ]


def matching_bugs(
    subject: str, compute_on, actual, tol: Tolerance, rope_style: str, names=None, ruled_out: set | None = None
) -> list:
    """The catalogued bugs whose output on the check's inputs matches ``actual`` within ``tol`` (of ``names``
    only, where given; none of ``ruled_out``, to which each bug that ran and did not match is added)."""
    matches = []
    for bug, bug_subject in bug_subjects(subject, rope_style, names):
        if ruled_out is not None and bug.name in ruled_out:
            continue
        try:
            out = compute_on(bug_subject)
        except Exception:  # noqa: BLE001 - a bug that cannot run on these inputs cannot be the one
            continue
        if mismatch(actual, out, tol) is None:
            matches.append(bug)
        elif ruled_out is not None:
            ruled_out.add(bug.name)
    return matches


def known_bug_lines(bugs) -> list[str]:
    """``matches known bug <name>: <explanation>. Fix: <fix>`` for each bug; where several match, the output cannot
    tell them apart, and each line after the first says so."""
    coincide = (
        f" (the outputs of these {len(bugs)} known bugs coincide on this input: which one is yours it cannot tell)"
    )
    return [
        f"{'or ' if i else ''}matches known bug {b.name}{coincide if i else ''}: {b.explanation}. Fix: {b.fix}"
        for i, b in enumerate(bugs)
    ]
