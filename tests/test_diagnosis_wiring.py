"""Model wiring (spec_tests/harness/diagnosis/wiring.py): a model whose parts are connected wrongly, or whose
weights are laid out wrongly at load, is named by the reference model with that one wiring choice changed, and
by no other; a mistake of another kind (inside a component, another wiring) is named by no wiring.

The buggy models are written here as plain functions of the canonical weights (torch.nn.functional, no
reference code), each mistake as real code makes it: a view that puts the channel before the head, a fused
qkv matrix read per head, x @ W for x @ W.T, a block that returns ``attn(norm(x))``.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run
from diagnosis_cases import rope_complex
from suite_subprocess import implementation, run_suite

from spec_tests import models
from spec_tests.harness.diagnosis.model_knobs import model_variants
from spec_tests.harness.diagnosis.variant import fitting_variants
from spec_tests.harness.diagnosis.wiring import WIRINGS, NotApplicable, run_wired
from spec_tests.harness.judging.compare import mismatch
from spec_tests.harness.judging.tolerances import tolerance
from spec_tests.harness.subject.subject import reference_subject

TOL = tolerance("model", torch.float64)

pytest_plugins = ["pytester"]


def _linear(x, w, b=None, *, transposed=False):
    return x @ w + (0 if b is None else b) if transposed else F.linear(x, w, b)


def functional_logits(cfg: dict, sd: dict, ids: torch.Tensor, bug: str | None = None) -> torch.Tensor:
    """Logits of the protocol's model for ``cfg`` (llama or gpt2) from canonical weights, with one ``bug``."""
    llama = cfg.get("family", "llama") == "llama"
    H, d = cfg["n_heads"], cfg["d_model"]
    H_kv, dh = models.n_kv(cfg), d // H
    B, T = ids.shape
    pos = torch.arange(T)

    def norm(x, prefix, gain=True):
        weight, bias = (sd[f"{prefix}.weight"], sd.get(f"{prefix}.bias")) if gain else (None, None)
        if llama:
            return F.rms_norm(x, (d,), weight, cfg.get("norm_eps", 1e-5))
        return F.layer_norm(x, (d,), weight, bias, cfg.get("norm_eps", 1e-5))

    def proj(x, name, p):
        w, b = sd[f"{p}.attn.{name}.weight"], sd.get(f"{p}.attn.{name}.bias")
        if bug == "rope_rows_permuted_to_half" and name in ("wq", "wk"):  # a converter's permute, rows 2i, 2i+1 -> i
            n = H if name == "wq" else H_kv
            w = w.view(n, dh // 2, 2, d).transpose(1, 2).reshape(n * dh, d)
            b = None if b is None else b.view(n, dh // 2, 2).transpose(1, 2).reshape(n * dh)
        return _linear(x, w, b, transposed=bug == f"transposed_{name}" or bug == "transposed_attention")

    def heads(t, n):
        if bug in ("qkv_not_head_major", "qkvo_not_head_major"):
            return t.view(B, T, dh, n).transpose(-1, -2).transpose(1, 2)
        return t.view(B, T, n, dh).transpose(1, 2)

    suffix = "_from_the_unnormalised_stream"  # those projections read the block's input, not attn_norm's output
    raw_roles = bug[: -len(suffix)].split("_") if bug and bug.endswith(suffix) else ()

    def attention(h, p, stream=None):
        names = {"wq_wk_swapped": "wk wq wv", "wk_wv_swapped": "wq wv wk", "wq_wv_swapped": "wv wk wq"}
        nq, nk, nv = names.get(bug, "wq wk wv").split()
        source = {n: stream if n in raw_roles else h for n in ("wq", "wk", "wv")}
        if bug == "fused_qkv_per_head":
            w = torch.cat([sd[f"{p}.attn.{n}.weight"] for n in ("wq", "wk", "wv")])
            bias = None if llama else torch.cat([sd[f"{p}.attn.{n}.bias"] for n in ("wq", "wk", "wv")])
            qkv = F.linear(h, w, bias).view(B, T, H, 3, dh)
            q, k, v = (qkv[..., i, :].transpose(1, 2) for i in range(3))
        else:
            q, k, v = (
                heads(proj(source[n], m, p), c) for n, m, c in (("wq", nq, H), ("wk", nk, H_kv), ("wv", nv, H_kv))
            )
        late = {}  # qkv_bias_after_rope: the query and key biases taken out here, added after the rotation
        if bug == "qkv_bias_after_rope":
            late = {n: sd[f"{p}.attn.{n}.bias"].view(-1, 1, dh) for n in ("wq", "wk")}
            q, k = q - late["wq"], k - late["wk"]
        if llama:
            theta = cfg.get("rope_theta", 10000.0)
            q_theta = 10000.0 if bug == "queries_default_theta" else theta  # a rotary layer without theta passed
            k_theta = 10000.0 if bug == "keys_default_theta" else theta
            q, k = rope_complex(q, pos, q_theta), rope_complex(k, pos, k_theta)
            if bug == "rope_cos_only":  # a complex freqs_cis cast to real: x * cos(angle), the sine term lost
                cos = torch.cos(pos[:, None].double() * theta ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh))
                cos = cos.repeat_interleave(2, dim=-1)  # interleaved pairs share their angle
                q, k = heads(proj(h, nq, p), H) * cos, heads(proj(h, nk, p), H_kv) * cos
        if late:
            q, k = q + late["wq"], k + late["wk"]
        scale = 1 / math.sqrt(dh) / (1 + int(p.split(".")[1]) if bug == "scores_scaled_by_layer" else 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H_kv != H, scale=scale)
        if bug == "qkvo_not_head_major":
            out = out.permute(0, 2, 3, 1).reshape(B, T, d)
        else:
            out = out.transpose(1, 2).reshape(B, T, d)
        return proj(out, "wo", p)

    def mlp(h, p):
        if llama:
            gate = F.linear(h, sd[f"{p}.mlp.w_gate.weight"])
            return F.linear(F.silu(gate) * F.linear(h, sd[f"{p}.mlp.w_up.weight"]), sd[f"{p}.mlp.w_down.weight"])
        hidden = F.gelu(F.linear(h, sd[f"{p}.mlp.w_fc.weight"], sd[f"{p}.mlp.w_fc.bias"]), approximate="tanh")
        return F.linear(hidden, sd[f"{p}.mlp.w_proj.weight"], sd[f"{p}.mlp.w_proj.bias"])

    if bug == "ids_shifted_right":  # Trax's ShiftRight kept in a language model: a 0 in front, the last id dropped
        ids = F.pad(ids[:, :-1], (1, 0))

    def weightless_norm(x):
        default = bug.endswith("_at_the_default_eps") or "_at_the_default_eps_" in bug
        if "rms" in bug:
            return F.rms_norm(x, (d,), None, None if default else cfg.get("norm_eps", 1e-5))
        return F.layer_norm(x, (d,), None, None, 1e-5 if default else cfg.get("norm_eps", 1e-5))

    x = F.embedding(ids, sd["tok_embeddings.weight"])
    if bug and bug.startswith("embeddings_") and bug.endswith("_before_the_positions"):
        x = weightless_norm(x)
    if bug == "embedding_scale":
        x = x * math.sqrt(d)
    if not llama:
        scale = {"position_embeddings_scaled_down": d**-0.5, "position_embeddings_scaled_up": d**0.5}.get(bug, 1.0)
        x = x + F.embedding(pos, sd["pos_embeddings.weight"]) * (0.0 if bug == "no_position_embeddings" else scale)
    if bug and bug.startswith("embeddings_") and not bug.endswith("_before_the_positions"):
        x = weightless_norm(x)  # nanochat's parameter-free norm after the embedding
    before = x
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}"
        if bug in ("every_layer_the_first", "every_layer_the_last"):  # one block's weights at every layer
            p = f"layers.{0 if bug.endswith('first') else cfg['n_layers'] - 1}"
        if bug == "no_attn_residual":
            x = attention(norm(x, f"{p}.attn_norm"), p)
            x = x + mlp(norm(x, f"{p}.mlp_norm"), p)
        elif bug == "no_mlp_residual":
            x = x + attention(norm(x, f"{p}.attn_norm"), p)
            x = mlp(norm(x, f"{p}.mlp_norm"), p)
        elif bug == "mlp_residual_from_input":
            h = x + attention(norm(x, f"{p}.attn_norm"), p)
            x = x + mlp(norm(h, f"{p}.mlp_norm"), p)
        elif bug == "post_ln":
            x = norm(x + attention(x, p), f"{p}.attn_norm")
            x = norm(x + mlp(x, p), f"{p}.mlp_norm")
        elif bug == "norm_on_stream":
            x = norm(x, f"{p}.attn_norm")
            x = x + attention(x, p)
            x = norm(x, f"{p}.mlp_norm")
            x = x + mlp(x, p)
        elif bug == "norm_on_fused_stream":  # a fused add-and-norm's normalised output carried as the stream
            if i:  # every norm but the first (which has no residual to add) replaces the stream
                x = norm(x, f"{p}.attn_norm")
                x = x + attention(x, p)
            else:
                x = x + attention(norm(x, f"{p}.attn_norm"), p)
            x = norm(x, f"{p}.mlp_norm")
            x = x + mlp(x, p)
        elif bug == "norm_on_fused_stream_before_gain":  # vLLM's fused add + RMSNorm handing on x / rms(x) as residual
            if i:
                h = norm(x, f"{p}.attn_norm")
                x = norm(x, f"{p}.attn_norm", gain=False) + attention(h, p)
            else:
                x = x + attention(norm(x, f"{p}.attn_norm"), p)
            h = norm(x, f"{p}.mlp_norm")
            x = norm(x, f"{p}.mlp_norm", gain=False) + mlp(h, p)
        elif bug == "norm_on_attn_stream":
            x = norm(x, f"{p}.attn_norm")
            x = x + attention(x, p)
            x = x + mlp(norm(x, f"{p}.mlp_norm"), p)
        elif bug == "norm_on_mlp_stream":
            x = x + attention(norm(x, f"{p}.attn_norm"), p)
            x = norm(x, f"{p}.mlp_norm")
            x = x + mlp(x, p)
        elif bug == "parallel":
            x = x + attention(norm(x, f"{p}.attn_norm"), p) + mlp(norm(x, f"{p}.mlp_norm"), p)
        elif bug == "parallel_shared_norm":
            h = norm(x, f"{p}.attn_norm")
            x = x + attention(h, p) + mlp(h, p)
        elif bug == "mlp_on_attn_norm":
            x = x + attention(norm(x, f"{p}.attn_norm"), p)
            x = x + mlp(norm(x, f"{p}.attn_norm"), p)
        elif bug == "stale_block_input":  # block i's attention reads block i - 1's input (a variable not updated)
            source, before = (before if i else x), x
            x = x + attention(norm(source, f"{p}.attn_norm"), p)
            x = x + mlp(norm(x, f"{p}.mlp_norm"), p)
        elif bug == "last_block_no_mlp_residual" and i == cfg["n_layers"] - 1:  # the final norm reads the MLP alone
            x = x + attention(norm(x, f"{p}.attn_norm"), p)
            x = mlp(norm(x, f"{p}.mlp_norm"), p)
        elif bug == "doubled_residual":
            x = 2 * x + attention(norm(x, f"{p}.attn_norm"), p)
            x = x + mlp(norm(x, f"{p}.mlp_norm"), p)
        else:
            x = x + attention(norm(x, f"{p}.attn_norm"), p, x)
            x = x + mlp(norm(x, f"{p}.mlp_norm"), p)
    if bug != "no_final_norm":
        x = norm(x, "final_norm")
    head = sd.get("lm_head.weight", sd["tok_embeddings.weight"])
    return F.linear(x, head)


# Mistakes that are not wiring (inside a component or the head), written the same way: no wiring may name them.
OTHER_BUGS = {
    "norm_gains_off": lambda cfg, sd, ids: functional_logits(
        cfg, {**sd, **{k: v * 1.01 for k, v in sd.items() if k.endswith("norm.weight")}}, ids
    ),
    "head_scaled": lambda cfg, sd, ids: functional_logits(cfg, sd, ids) * 1.5,
    "doubled_residual": lambda cfg, sd, ids: functional_logits(cfg, sd, ids, "doubled_residual"),
}

CONFIGS = ("llama_gqa", "llama_mha", "gpt2")


def _inputs(name):
    cfg = models.CONFIGS[name]
    sd = models.random_state_dict(cfg, seed=2)
    ids = torch.randint(0, cfg["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(3))
    return cfg, sd, ids


def _compute(cfg):
    return lambda m, sd, ids: models.logits(m, cfg, sd, ids)


@functools.cache
def _wired_outputs(config: str) -> dict:
    """Each applicable wiring's output on ``config``'s inputs (computed once per configuration)."""
    cfg, sd, ids = _inputs(config)
    reference, compute, outputs = reference_subject("interleaved"), _compute(cfg), {}
    for w in WIRINGS:
        try:
            outputs[w.name] = run_wired(compute, reference, (sd, ids), w)
        except NotApplicable:
            continue
    return outputs


def _fitting(config: str, actual) -> set[str]:
    """The names of the wirings whose output equals ``actual``."""
    return {name for name, out in _wired_outputs(config).items() if mismatch(actual, out, TOL) is None}


@pytest.mark.parametrize("config", CONFIGS)
def test_the_independent_model_is_the_reference(config):
    cfg, sd, ids = _inputs(config)
    want = models.logits(reference_subject("interleaved"), cfg, sd, ids)
    assert mismatch(functional_logits(cfg, sd, ids), want, TOL) is None


def _applicable(config: str) -> list[str]:
    return list(_wired_outputs(config))


CASES = [(c, w) for c in CONFIGS for w in _applicable(c)]


@pytest.mark.parametrize("config,bug", CASES, ids=[f"{c}-{w}" for c, w in CASES])
def test_each_wiring_mistake_is_named_by_its_own_variant_alone(config, bug):
    cfg, sd, ids = _inputs(config)
    actual = functional_logits(cfg, sd, ids, bug)
    assert mismatch(actual, functional_logits(cfg, sd, ids), TOL) is not None, "the mistake changes the logits"
    assert _fitting(config, actual) == {bug}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("other", list(OTHER_BUGS))
def test_no_wiring_names_a_mistake_of_another_kind(config, other):
    cfg, sd, ids = _inputs(config)
    assert _fitting(config, OTHER_BUGS[other](cfg, sd, ids)) == set()


def test_a_permute_toward_the_declared_rope_pairing_is_left_to_the_style_knob():
    """Rows permuted for the declared (interleaved) pairing give the other pairing's scores, which the rope_style knob
    names; the permute for the other pairing (held-out 81's NEOX rotation of NORMAL rows) is a wiring of its own."""
    assert "rope_rows_permuted_to_half" in _applicable("llama_gqa")
    assert "rope_rows_permuted_to_interleaved" not in _applicable("llama_gqa")
    assert "rope_rows_permuted_to_half" not in _applicable("gpt2")


def test_grouped_keys_offer_no_swap_of_unequal_projections():
    assert {"wq_wk_swapped", "wq_wv_swapped", "fused_qkv_per_head", "transposed_wk"}.isdisjoint(
        _applicable("llama_gqa")
    )
    assert "wk_wv_swapped" in _applicable("llama_gqa")


def test_qkv_biases_added_after_rope_are_named_by_their_wiring_alone():
    """Held-out batch 66's biases added to the rotated q and k (Qwen2-style qkv_bias, protocol v2): its own wiring
    fits, no other; the plain model with those biases fits none; and no model without biases offers it."""
    cfg = {**models.CONFIGS["llama_gqa"], "qkv_bias": True}
    sd = models.random_state_dict(cfg, seed=4)
    ids = torch.randint(0, cfg["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(5))
    reference = reference_subject("interleaved")
    outputs = {}
    for w in WIRINGS:
        try:
            outputs[w.name] = run_wired(_compute(cfg), reference, (sd, ids), w)
        except NotApplicable:
            continue
    assert mismatch(functional_logits(cfg, sd, ids), models.logits(reference, cfg, sd, ids), TOL) is None
    actual = functional_logits(cfg, sd, ids, "qkv_bias_after_rope")
    assert {n for n, out in outputs.items() if mismatch(actual, out, TOL) is None} == {"qkv_bias_after_rope"}
    right = functional_logits(cfg, sd, ids)
    assert "qkv_bias_after_rope" not in {n for n, out in outputs.items() if mismatch(right, out, TOL) is None}
    assert "qkv_bias_after_rope" not in _applicable("llama_gqa") + _applicable("gpt2")


def test_the_model_search_names_a_missing_residual_with_its_code():
    """End to end through model_knobs.model_variants (the search Spec.check runs), with its memo."""
    cfg, sd, ids = _inputs("llama_gqa")
    reference = reference_subject("interleaved")
    actual = functional_logits(cfg, sd, ids, "no_mlp_residual")
    tried = model_variants(_compute(cfg), reference, (sd, ids), memo=None)
    fit = fitting_variants(tried, actual, TOL, reference, sd, ids)
    assert [(v.code, v.knob) for v in fit] == [("knob:missing_residual", ("wiring", "no_mlp_residual"))]


def test_a_remembered_search_offers_the_fitting_wirings_other_forms():
    """A test's later cases try what fitted its first (model_knobs' memo); a mistake whose wiring takes another form
    in another family (the token embeddings normalised: the stream itself in llama, before the positions in gpt2,
    held-out batch 104) is named in both, in either order."""
    from spec_tests.harness.diagnosis import model_knobs

    bug, reference = "embeddings_rms_normalised_at_the_default_eps", reference_subject("interleaved")
    form = {"llama_gqa": bug, "gpt2": f"{bug}_before_the_positions"}  # the form each family's mistake takes
    for order in (("llama_gqa", "gpt2"), ("gpt2", "llama_gqa")):
        memo = f"test-memo-{order[0]}"
        model_knobs._SEARCHED.pop(memo, None)
        for config in order:
            cfg, sd, ids = _inputs(config)
            actual = functional_logits(cfg, sd, ids, form[config])
            tried = model_variants(_compute(cfg), reference, (sd, ids), memo=memo)
            fit = fitting_variants(tried, actual, TOL, reference, sd, ids)
            model_knobs.remember(memo, fit)
            assert [v.knob for v in fit] == [("wiring", form[config])], (order, config)
        model_knobs._SEARCHED.pop(memo, None)


def test_a_computation_that_builds_no_model_is_not_a_wiring():
    cfg, sd, ids = _inputs("llama_gqa")
    with pytest.raises(NotApplicable):
        run_wired(lambda m, sd, ids: sd["final_norm.weight"], reference_subject("interleaved"), (sd, ids), WIRINGS[0])


# The catalogued bugs that are wiring mistakes, and the wiring that names each (the rest must fit none).
CATALOG_WIRING = {
    "post_ln": "post_ln",
    "missing_final_norm": "no_final_norm",
    "mlp_residual_missing": "no_mlp_residual",
    "parallel_attention_and_mlp": "parallel",
    "embedding_scaled_by_sqrt_d_model": "embedding_scale",
    "wo_transposed_at_load": "transposed_wo",
    "attention_output_weight_transposed": "transposed_wo",  # the same logits, whether at load or in attention
    "wq_wk_swapped_at_load": "wq_wk_swapped",
    "every_layer_runs_the_last_block": "every_layer_the_last",
    "final_norm_without_the_last_residual": "last_block_no_mlp_residual",
    "position_embeddings_scaled_down": "position_embeddings_scaled_down",
    # the lookup scaled inside embedding: llama's only embedding is the tokens' (gpt2's positions are scaled too)
    "embedding_rows_scaled_by_sqrt_d_model": ("embedding_scale", ("llama_gqa", "llama_mha")),
    "model_reads_its_ids_shifted_right": "ids_shifted_right",
    "rope_model_table_loses_its_sine": "rope_cos_only",
    "keys_rotated_at_the_default_theta": "keys_default_theta",  # gpt2 has no RoPE: its logits do not change
}


def _model_bugs() -> list[str]:
    from spec_tests.bugs import CATALOG

    return sorted(name for name, bug in CATALOG.items() if "model" in bug.components)


@run_ahead
@pytest.mark.parametrize("config", CONFIGS)
def test_catalogued_model_bugs_are_named_by_their_wiring_and_no_other(config):
    """Every catalogued bug that changes the model's logits, run on the same inputs: a wiring mistake is named by
    its own wiring alone, any other mistake (inside attention, RoPE, a norm, the cache ...) by none."""
    from spec_tests.bugs import load_bug

    cfg, sd, ids = _inputs(config)
    wrong = {}
    for name in _model_bugs():
        try:
            actual = models.logits(reference_subject("interleaved", load_bug(name)), cfg, sd, ids)
        except Exception:  # noqa: BLE001 - a bug that cannot build this config (wq and wk swapped with GQA)
            continue
        if mismatch(actual, models.logits(reference_subject("interleaved"), cfg, sd, ids), TOL) is None:
            continue  # the bug does not show in these logits
        named = CATALOG_WIRING.get(name)
        if isinstance(named, tuple):  # a wiring that names it in some configurations only
            named = named[0] if config in named[1] else None
        want = {named} if named else set()
        got = _fitting(config, actual)
        if got != want:
            wrong[name] = sorted(got)
    assert not wrong, f"wirings fitting other bugs (or missing their own): {wrong}"


class _Functional:
    """A model given as ``functional_logits`` with one ``bug`` (None: the protocol's)."""

    def __init__(self, cfg, bug=None):
        self.cfg, self.bug = cfg, bug

    def logits(self, sd, ids):
        return functional_logits(self.cfg, sd, ids, self.bug)


@pytest.mark.parametrize("bug, ignored", [("mlp_on_attn_norm", "layers.0.mlp_norm.weight"), ("head_scaled", None)])
def test_a_weight_the_model_does_not_use_is_named(bug, ignored):
    """diagnosis/sensitivity.py: each canonical weight changed alone; one whose change leaves the implementation's
    output exactly as it was while the specified model's moves is named (the MLP normalised with the attention's norm
    leaves mlp_norm unused); a mistake that uses every weight (the head's output scaled) names none."""
    from spec_tests.harness.diagnosis.sensitivity import ignored_weights

    cfg, sd, ids = _inputs("gpt2")
    compute = lambda m, sd, ids: m.logits(sd, ids)
    impl = _Functional(cfg, None if bug == "head_scaled" else bug)
    if bug == "head_scaled":
        impl.logits = lambda sd, ids: OTHER_BUGS["head_scaled"](cfg, sd, ids)
    actual = compute(impl, sd, ids)
    expected = compute(_Functional(cfg), sd, ids)
    lines, codes = ignored_weights(compute, impl, _Functional(cfg), (sd, ids), (sd, ids), actual, expected, TOL)
    if ignored is None:
        assert (lines, codes) == ([], []), lines
    else:
        assert codes == ["ignored_weight"] and ignored in lines[0] and "attn_norm" not in lines[0], lines


def test_a_weight_an_option_model_does_not_use_is_named(tmp_path, pytester):
    """End to end, on a model option (post_norms): a copy of the reference that normalises the attention's output with
    the MLP's post-norm leaves attn_post_norm.weight unused, and the option's logits test names it."""
    swapped = "x = x + self.drop(self.attn_post_norm(h))", "x = x + self.drop(self.mlp_post_norm(h))"
    folder = implementation(tmp_path, patch=("model.py", *swapped))
    out = run_suite(f"--impl={folder}", "-k", "test_logits_match_reference_with_post_norms", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    assert "does not depend on layers.0.attn_post_norm.weight, layers.1.attn_post_norm.weight" in out, out[-3000:]


@pytest.mark.parametrize(
    "bug, codes",
    [
        ("scores_scaled_by_layer", ["layer_index"]),
        ("stale_block_input", ["~between_blocks"]),
        ("head_scaled", ["~outside_blocks"]),
        ("mlp_on_attn_norm", []),
    ],
)
def test_silencing_blocks_says_where_in_the_stack_a_model_differs(bug, codes):
    """diagnosis/depth.py: the blocks' output projections zeroed, all of them or all but one, on both sides. Attention
    scores divided by the layer's number (Megatron's query-key layer scaling left half applied) are right in block 0
    alone and wrong in block 1 alone; a block reading the previous block's input is right block by block and wrong
    stacked; a scaled head differs with every block silenced. A mistake inside every block (the MLP normalised with
    the attention's norm) is wrong in block 0 alone, and nothing is said: the component's tests say more."""
    from spec_tests.harness.diagnosis.depth import depth_lines

    cfg, sd, ids = _inputs("llama_gqa")
    compute = lambda m, sd, ids: m.logits(sd, ids)
    impl = _Functional(cfg, None if bug in OTHER_BUGS else bug)
    if bug in OTHER_BUGS:
        impl.logits = lambda sd, ids: OTHER_BUGS[bug](cfg, sd, ids)
    assert mismatch(compute(impl, sd, ids), compute(_Functional(cfg), sd, ids), TOL) is not None
    lines, found = depth_lines(compute, impl, _Functional(cfg), (sd, ids), (sd, ids), TOL)
    assert found == codes, lines
    if codes == ["layer_index"]:
        assert "block 1 alone does not" in lines[0], lines
