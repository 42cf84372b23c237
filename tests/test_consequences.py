"""The consequence decision (spec_tests/harness/judging/consequences.py) and the summary that reads it: one
decision, dependency order, only failures that can explain, offline wording, unimplemented roots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ahead import run_ahead  # tests/ahead.py: done by a runner while other tests run
from suite_subprocess import implementation, replace_once, run_suite

from spec_tests.harness.judging import consequences, rootcause, settling
from spec_tests.harness.judging.results import TestVerdict
from spec_tests.harness.judging.rootcause import FailureRegistry
from spec_tests.harness.plugin.terminal import summary_lines

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]


def V(test, subjects, status, roots=(), maybe=(), component="attention"):
    return TestVerdict(test, component, list(subjects), status, list(roots), "msg", list(maybe))


def test_dependency_order_is_upstream_first():
    names = ["forward", "multihead_self_attention", "generate", "rope", "scaled_dot_product_attention", "repeat_kv"]
    order = settling.dependency_order(names)
    assert order.index("repeat_kv") < order.index("scaled_dot_product_attention") < order.index("forward")
    assert order.index("rope") < order.index("multihead_self_attention") < order.index("forward")
    assert order[-1] == "generate"


SCRIPT = """
from spec_tests.harness.judging.results import TestVerdict
from spec_tests.harness.plugin.terminal import summary_lines
names = ["swiglu", "rope", "rmsnorm", "softmax", "linear", "layernorm", "gelu_mlp", "repeat_kv", "silu"]
verdicts = [TestVerdict(f"t_{n}", "c", [n], "failed", [], "x") for n in names]
verdicts += [TestVerdict("t_fwd", "model", ["forward"], "consequence", ["rope", "rmsnorm", "linear"], "x")]
print("\\n".join(summary_lines("x", verdicts, {n: [f"t_{n}"] for n in reversed(names)})))
"""


@run_ahead
def test_the_summary_is_the_same_for_every_hash_seed():
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1, outs
    roots = outs.pop().split("root causes, fix these first:\n", 1)[1].splitlines()
    assert roots[-1].startswith("  swiglu:") and roots[-2].startswith("  gelu_mlp:")  # callers after callees


def test_only_failures_that_can_explain_a_math_check_are_offered():
    registry = FailureRegistry()
    registry.mark(["forward"], "t_precision", "precision")
    registry.mark(["build_model"], "t_init", "convention")
    registry.mark(["build_model"], "t_bad_config", "validation")
    registry.mark(["rmsnorm"], "t_rmsnorm_f64", "precision")
    assert registry.explaining(["forward", "build_model", "rmsnorm"]) == []
    assert registry.upstream_of("forward") == []
    registry.mark(["rope"], "t_rope", "math")
    registry.mark(["new_cache"], "t_cache", "math")
    assert registry.explaining(["forward", "rope", "new_cache"]) == ["rope", "new_cache"]
    assert registry.upstream_of("forward") == ["rope"]  # forward may call rope, not new_cache


def root_block(out: str) -> str:
    """The "root causes, fix these first" block of a run's output (the short summary after it left out)."""
    return out.split("root causes")[-1].split("short test summary")[0]


def charged_alone(folder, tmp_path, pytester, selected: str, root: str, spared: str) -> str:
    """Run the tests ``selected`` on ``folder``: ``root`` is among the root causes and ``spared`` is not (its failures
    are ``root``'s consequences). The run's output."""
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert f"{root}: " in roots and f"{spared}: " not in roots, out[-3000:]
    return out


def test_failure_kinds():
    from spec_tests.harness.judging.results import CheckResult
    from spec_tests.harness.judging.spec import SpecFailure
    from spec_tests.harness.judging.tolerances import EXACT
    from spec_tests.harness.subject.subject import ImplementationError, NotImplementedInImpl

    def failure(kind, tolerance=""):
        return SpecFailure(CheckResult("t", "rmsnorm", "norms", "b", "failed", kind=kind, tolerance=tolerance))

    assert rootcause.failure_kind(failure("compare", "rtol 1e-6")) == "math"
    assert rootcause.failure_kind(failure("compare", EXACT.describe())) == "precision"
    rounding, wrong = failure("compare", EXACT.describe()), failure("compare", EXACT.describe())
    rounding.result.ratio, wrong.result.ratio = 3e3, 4.5e9  # float32 rounding; weights given back permuted
    assert rootcause.failure_kind(rounding) == "precision" and rootcause.failure_kind(wrong) == "math"
    assert rootcause.failure_kind(failure("raises")) == "validation"
    assert rootcause.failure_kind(failure("require"), ["init"]) == "convention"
    assert rootcause.failure_kind(failure("compare"), ["precision"]) == "precision"
    assert rootcause.failure_kind(failure("require"), ["init", "rope"]) == "math"
    assert rootcause.failure_kind(NotImplementedInImpl("rmsnorm")) == "not_implemented"
    assert rootcause.failure_kind(ImplementationError("rmsnorm", ("ValueError",), "m")) == "error"


def test_a_root_that_is_only_not_implemented_pays_for_nothing():
    settled = settling.settle(
        [
            V("t_build", ["build_model"], "not_implemented", component="model"),
            V("t_cache", ["cache_kv"], "consequence", ["build_model"], component="kv_cache"),
            V("t_rope", ["rope"], "failed"),
            V("t_mha", ["multihead_self_attention"], "consequence", ["rope"]),
            V("t_fwd", ["forward"], "consequence", ["multihead_self_attention"], component="model"),
        ]
    )
    assert settled["t_cache"].status == "failed" and "pays for nothing" in settled["t_cache"].reason
    assert (settled["t_mha"].status, settled["t_mha"].roots) == ("consequence", ["rope"])
    assert (settled["t_fwd"].status, settled["t_fwd"].roots) == ("consequence", ["rope"])  # through the chain


def test_offline_the_summary_says_what_may_be_a_consequence_and_names_one_root():
    """One repeat_kv bug in a handout (no reference): the attention functions that call it fail too,
    and may be its consequences; only repeat_kv is listed as a root."""
    verdicts = [
        V("t_repeat", ["repeat_kv"], "failed"),
        V("t_sdpa", ["scaled_dot_product_attention"], "failed", maybe=["repeat_kv"]),
        V("t_flash", ["flash_attention"], "failed", maybe=["repeat_kv"]),
        V("t_mha", ["multihead_self_attention"], "failed", maybe=["repeat_kv", "scaled_dot_product_attention"]),
    ]
    registry = {
        "repeat_kv": ["t_repeat"],
        "scaled_dot_product_attention": ["t_sdpa"],
        "flash_attention": ["t_flash"],
        "multihead_self_attention": ["t_mha"],
    }
    lines = summary_lines("x", verdicts, registry)
    roots = lines[lines.index("root causes, fix these first:") + 1 :]
    roots = roots[: roots.index("")]
    assert roots == ["  repeat_kv: 1 failing test(s) of its own"], lines
    text = "\n".join(lines)
    assert "multihead_self_attention: 1 failing test(s), may be consequences of repeat_kv, " in text
    assert "fix repeat_kv first and rerun" in text


def test_the_composition_asks_the_implementation_on_the_references_intermediate_values():
    """The reference's multihead attention composed with a rope that doubles its output: the bridge is
    called (with protocol arguments only) and its answers are used; biases fold into the weights."""
    import reference
    from spec_tests.harness.subject.subject import LocalSubject, reference_subject

    ref, correct_rope = reference_subject("interleaved"), reference.rope
    seen = []

    class Impl:
        FAMILIES = ("llama", "gpt2")

        @staticmethod
        def rope(x, positions, theta=10000.0, **extra):
            seen.append(sorted(extra))
            return 2 * correct_rope(x, positions, theta)

    impl = LocalSubject(Impl(), "impl")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, generator=g, dtype=torch.float64)
    w = [torch.randn(8, 8, generator=g, dtype=torch.float64) for _ in range(4)]

    def compute(m, x, *w):
        return m.multihead_self_attention(x, *w, 2, 2, 10000.0)

    with consequences.composed(ref, impl, ["rope"]) as comp:
        out = compute(ref, x, *w)
    assert comp.called == ["rope"] and seen and all(e == [] for e in seen)
    assert not torch.allclose(out, compute(ref, x, *w))
    # folded biases: the protocol's attention (no biases) computes the biased attention exactly
    b = [torch.randn(8, generator=g, dtype=torch.float64) for _ in range(4)]
    args, _, post = consequences.protocol_call(
        "multihead_self_attention", (x, *w, 2, 2, None), dict(bq=b[0], bk=b[1], bv=b[2], bo=b[3])
    )
    biased = ref.multihead_self_attention(x, *w, 2, 2, None, bq=b[0], bk=b[1], bv=b[2], bo=b[3])
    assert torch.allclose(post(ref.multihead_self_attention(*args)), biased, atol=1e-12)
    # fewer tokens than C: x keeps its width (code may read its head width as C // n_heads); more: one column more
    assert args[0].shape == x.shape and args[1].shape == w[0].shape
    many = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    args, _, post = consequences.protocol_call(
        "multihead_self_attention", (many, *w, 2, 2, None), dict(bq=b[0], bk=b[1], bv=b[2], bo=b[3])
    )
    biased = ref.multihead_self_attention(many, *w, 2, 2, None, bq=b[0], bk=b[1], bv=b[2], bo=b[3])
    assert args[0].shape == (2, 7, 9) and torch.allclose(post(ref.multihead_self_attention(*args)), biased, atol=1e-12)


def test_the_composition_hands_a_name_of_fixed_rank_that_rank():
    """repeat_kv is stated for [B, Hkv, T, d]: the correct attention on per-head tensors with other leading dims (3-D,
    5-D) calls it, through the bridge, with the leading dims merged into one (or one added), and gets its answer
    back in its own shape. An implementation written for 4-D only (transformers') answers instead of raising."""
    x = torch.arange(2 * 3 * 2 * 5 * 4, dtype=torch.float64).reshape(2, 3, 2, 5, 4)
    for value in (x, x[0, 0]):
        args, _, post = consequences.protocol_call("repeat_kv", (value, 3), {})
        assert args[0].dim() == 4
        four_d_only = args[0].repeat_interleave(3, dim=1)  # an answer only a 4-D input gets
        assert torch.equal(post(four_d_only), value.repeat_interleave(3, dim=-3))
    four = x[0]
    args, _, post = consequences.protocol_call("repeat_kv", (four, 3), {})  # already [B, Hkv, T, d]: as it is
    assert args[0] is four and post is None


def test_a_crash_behind_an_adapter_is_placed_in_the_library_it_wraps(tmp_path):
    """Code behind an adapter raises outside the implementation's own files (exc.where is empty): the crash's place is
    the innermost frame outside torch, Python and the suite, so two names that reach the same library line are one
    crash (control: another line of the library is another crash)."""
    from spec_tests.harness.subject.subject import ImplementationError

    lib = tmp_path / "some_library.py"
    lib.write_text("def repeat(x):\n    raise RuntimeError('view size 8 is not compatible')\n\n\ndef other(x):\n"
                   "    raise RuntimeError('view size 8 is not compatible')\n")  # fmt: skip
    namespace: dict = {}
    exec(compile(lib.read_text(), str(lib), "exec"), namespace)

    def raised(name, fn):
        try:
            fn(None)
        except RuntimeError as exc:
            return ImplementationError(name, ("RuntimeError",), str(exc), "", original=exc)

    forward, generate = raised("forward", namespace["repeat"]), raised("generate", namespace["repeat"])
    elsewhere = raised("generate", namespace["other"])
    assert rootcause.crash_signature(forward) is not None
    assert rootcause.crash_signature(forward) == rootcause.crash_signature(generate)
    assert rootcause.crash_signature(elsewhere) != rootcause.crash_signature(forward)


def test_a_crash_through_an_adapter_file_is_placed_in_the_package_it_wraps(tmp_path):
    """An adapter file over a package beside it (``--impl=path/adapter.py``): ``exc.where`` is the adapter's line, one
    per protocol name, but the crash's place is the package's innermost line, so forward and generate raising in the
    same cache update are one crash (control: another line of the package is another crash)."""
    from spec_tests.harness.subject.subject import ImplementationError

    lib = tmp_path / "nanolib.py"
    lib.write_text("def attend(x):\n    raise RuntimeError('expected Double but found Float')\n\n\ndef other(x):\n"
                   "    raise RuntimeError('expected Double but found Float')\n")  # fmt: skip
    namespace: dict = {}
    exec(compile(lib.read_text(), str(lib), "exec"), namespace)

    def raised(name, where, fn):
        try:
            fn(None)
        except RuntimeError as exc:
            return ImplementationError(name, ("RuntimeError",), str(exc), where, original=exc)

    forward = raised("forward", "adapter.py:169 in forward", namespace["attend"])
    generate = raised("generate", "adapter.py:183 in generate", namespace["attend"])
    elsewhere = raised("generate", "adapter.py:183 in generate", namespace["other"])
    assert rootcause.crash_signature(forward) == rootcause.crash_signature(generate)
    assert rootcause.crash_signature(elsewhere) != rootcause.crash_signature(generate)


def test_two_dtypes_meeting_at_one_line_are_one_crash_however_torch_words_it():
    """One line meeting a float32 tensor with the caller's dtype raises "expected scalar type Double but found Float"
    for float64 input and "expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16" for bfloat16:
    one crash. Control: another message at the same line, or the same message at another line, is another crash."""
    double = _crash("scaled_dot_product_attention", "attn.py:48 in math", "expected scalar type Double but found Float")
    bf16 = _crash("forward", "attn.py:48 in math", "expected m1 and m2 to have the same dtype, but got: float != "
                  "c10::BFloat16")  # fmt: skip
    assert rootcause.crash_signature(double) == rootcause.crash_signature(bf16)
    assert rootcause.crash_signature(_crash("forward", "attn.py:48 in math")) != rootcause.crash_signature(double)
    assert rootcause.crash_signature(
        _crash("forward", "attn.py:50 in math", bf16.message)
    ) != rootcause.crash_signature(double)


def _crash(name, where="kv_cache.py:44 in update", message="Expected size 0 but got size 6"):
    from spec_tests.harness.subject.subject import ImplementationError

    return ImplementationError(name, ("RuntimeError",), message, where)


def _judge(registry, subjects, uses, exc):
    from spec_tests.harness.judging import rootcause

    def rerun(names):
        raise AssertionError("no composition for model-bound names")

    run = rootcause.ItemRun("t_" + subjects[0], "c", tuple(subjects), tuple(uses))
    return rootcause.judge_failure(run, exc, object(), object(), registry, rerun), run.verdict


def test_a_crash_in_a_used_callee_that_passes_its_own_tests_is_the_subjects():
    """forward given a cache raises in a cache test while forward's own tests pass: the cache's failure (charged
    to new_cache, not a "setup" failure charged to nobody); where forward fails its own tests it stays setup."""
    registry = FailureRegistry()
    _, verdict = _judge(registry, ["new_cache"], ["build_model", "forward"], _crash("forward"))
    assert verdict.status == "setup"  # forward not judged yet: nothing says the crash is not forward's own
    registry.mark_passed(["forward"])
    _, verdict = _judge(registry, ["new_cache"], ["build_model", "forward"], _crash("forward"))
    assert verdict.status == "error" and registry.failing == {"new_cache": ["t_new_cache"]}
    broken = FailureRegistry()
    broken.mark_passed(["forward"])
    broken.mark(["forward"], "t_logits", "error")
    _, verdict = _judge(broken, ["new_cache"], ["build_model", "forward"], _crash("forward", where="model.py:9 in f"))
    assert verdict.status == "setup" and verdict.root_cause == ["forward"]
    # a used name the subject may not call (train_step does not call build_model) stays a setup failure
    built = FailureRegistry(passing={"build_model"})
    _, verdict = _judge(built, ["train_step"], ["build_model"], _crash("build_model"))
    assert verdict.status == "setup"


def test_a_crash_at_the_place_a_failing_model_bound_name_crashes_is_its_consequence_in_pytest_only():
    """generate raising in the cache's code, where new_cache's own tests raised (same type, same line, the same
    message but for its numbers): a consequence of new_cache in pytest's summary; charged in grading; a crash of
    generate's own (another line) is charged."""
    from spec_tests.harness.judging.spec import ConsequenceFailure

    for credit in (True, False):
        registry = FailureRegistry(crash_consequences=credit, passing={"forward"})
        _judge(registry, ["new_cache"], ["build_model", "forward"], _crash("forward"))
        again = _crash("generate", message="Expected size 0 but got size 1")
        raised, verdict = _judge(registry, ["generate"], ["build_model", "new_cache"], again)
        if credit:
            assert isinstance(raised, ConsequenceFailure) and verdict.status == "consequence"
            assert verdict.root_cause == ["new_cache"] and registry.explained == {"generate": ["t_generate"]}
        else:
            assert verdict.status == "error" and verdict.root_cause == []
        own = _crash("generate", where="generation.py:50 in generate")
        _, verdict = _judge(registry, ["generate"], ["build_model", "new_cache"], own)
        assert verdict.status == "error"


def test_an_expected_failure_that_is_a_consequence_leaves_its_subject_unexplained():
    """An xfailed test (a declared divergence, SPEC_XFAILS) raising a consequence says nothing about its subject:
    new_cache, whose only failure is an expected one, is not offered to defer (a sliding-window adapter's cache test
    was deferred to it once)."""
    from spec_tests.harness.judging import rootcause
    from spec_tests.harness.judging.results import CheckResult
    from spec_tests.harness.judging.spec import ConsequenceFailure

    for expected, explained in ((True, {}), (False, {"new_cache": ["t_new_cache"]})):
        registry = FailureRegistry()
        run = rootcause.ItemRun("t_new_cache", "c", ("new_cache",), ("forward",))
        result = CheckResult("t_new_cache", "new_cache", "c", "b", outcome="failed", kind="relation", found="x")
        exc = ConsequenceFailure(result, ["forward"])
        rootcause.judge_failure(run, exc, object(), object(), registry, None, expected=expected)
        assert registry.explained == explained and registry.behaving_wrongly(["new_cache"]) == list(explained)


def test_a_name_failing_only_as_a_consequence_is_offered_to_defer_and_rebase_and_settles_to_its_roots():
    """forward's logits fail only as consequences of repeat_kv: a train_step check rebased on forward may be a
    consequence of it (Spec.failing), and settling charges repeat_kv, not forward."""
    registry = FailureRegistry()
    registry.mark(["repeat_kv"], "t_repeat", "math")
    registry.mark_explained(["forward"], "t_logits")
    assert registry.explaining(["forward", "build_model"]) == []  # no composition is offered forward
    assert registry.behaving_wrongly(["forward", "build_model"]) == ["forward"]
    settled = settling.settle(
        [
            V("t_repeat", ["repeat_kv"], "failed"),
            V("t_logits", ["forward"], "consequence", ["repeat_kv"], component="model"),
            V("t_step", ["train_step"], "consequence", ["forward"], component="training"),
        ]
    )
    assert (settled["t_step"].status, settled["t_step"].roots) == ("consequence", ["repeat_kv"])
    alone = settling.settle([V("t_step", ["train_step"], "consequence", ["forward"], component="training")])
    assert alone["t_step"].status == "failed"  # forward fails nothing, of its own or as a consequence: charged


def test_a_relation_generate_breaks_with_its_own_sample_is_a_consequence_of_sample(tmp_path, pytester):
    """A copy of the reference whose sample draws from the global RNG and whose generate draws with its own copy of
    that function (not the protocol's name, so no substitution reaches it): generate is not reproducible per
    generator, and neither is generation that draws every token with the implementation's own sample, so
    generate's failure is reported as a consequence of sample (issue 18: one bug costs once)."""

    def edit(folder):
        sampling = folder / "sampling.py"
        text = sampling.read_text()
        assert "1, generator=generator\n    )" in text
        sampling.write_text(text.replace("1, generator=generator\n    )", "1\n    )", 1))
        generation = folder / "generation.py"
        text = generation.read_text().replace("next_id = sample(", "next_id = _own_sample(", 1)
        generation.write_text(text + "\n\nimport types as _types\n_own_sample = _types.FunctionType(sample.__code__, "
                              "sample.__globals__, '_own_sample', sample.__defaults__)\n")  # fmt: skip

    folder = implementation(tmp_path, edit=edit)
    selected = "test_sampled_generation_is_reproducible or test_sample_is_reproducible_per_generator"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "sample: 4 failing test(s) of its own; 4 other failure(s) trace back to it" in out, out[-3000:]
    assert "generate: " not in out.split("root causes")[-1], out[-3000:]


def attends_through_its_own_copy(folder, prelude: str, overrides: str) -> None:
    """The copy's model attends through its own copy of multihead_self_attention (not the protocol's name), whose
    module globals are the attention module's with ``overrides`` (``name=value`` source) after ``prelude``."""
    attention = folder / "attention.py"
    attention.write_text(
        attention.read_text() + f"\n\n{prelude}\n\nimport types as _types\n"
        f"_own_mhsa = _types.FunctionType(multihead_self_attention.__code__, dict(globals(), {overrides}), "
        "'_own_mhsa', multihead_self_attention.__defaults__)\n"
        "_own_mhsa.__kwdefaults__ = multihead_self_attention.__kwdefaults__\n"
    )
    model = folder / "model.py"
    model.write_text(
        replace_once(
            model.read_text(),
            "from .attention import multihead_self_attention\n",
            "from .attention import _own_mhsa as multihead_self_attention\n",
            "the model's attention import",
        )
    )


def test_a_model_mistake_invisible_at_one_token_leaves_the_cache_uncharged(tmp_path, pytester):
    """A copy of the reference whose model attends through its own copy of multihead_self_attention that merges
    heads without a transpose (invisible at T = 1): the uncached forward and every multi-token chunk are wrong, and
    decoding token by token through the cache is right, so the cache's tests are consequences of forward (a held-out
    bug was charged to forward and new_cache)."""

    def edit(folder):
        attends_through_its_own_copy(folder, "", "merge_heads=lambda x: x.reshape(x.shape[0], x.shape[2], -1)")

    folder = implementation(tmp_path, edit=edit)
    selected = "test_logits_match_reference or test_cached_logits_equal_full_forward or test_cache_equals_no_cache"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "forward: " in roots and "new_cache: " not in roots, out[-3000:]


def test_a_model_mistake_wrong_at_one_token_too_that_explains_the_cached_path_leaves_the_cache_uncharged(
    tmp_path, pytester
):
    """A copy of the reference whose model attends through its own attention with the softmax over the heads and the
    masked scores filled with the dtype's minimum (a graph exported with an opset-11 Softmax axis): wrong at one token
    too, so decoding token by token does not show the cache right, and the uncached and cached paths differ (a masked
    key gets 1 / H in either). The same mistake in the reference model reproduces both, so the cache's tests are
    consequences of forward (held out: charged to forward and new_cache)."""

    def edit(folder):
        heads_sdpa = (
            "def _heads_sdpa(q, k, v, mask=None, *, causal=False, fused=False, softcap=None):\n"
            "    n_rep = _group_size(q, k)\n"
            "    if causal:\n"
            "        mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)\n"
            "    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)\n"
            "    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])\n"
            "    scores = scores.masked_fill(~mask.to(torch.bool), torch.finfo(scores.dtype).min)\n"
            "    return torch.softmax(scores, dim=-3) @ v\n"
        )
        attends_through_its_own_copy(folder, heads_sdpa, "scaled_dot_product_attention=_heads_sdpa")

    folder = implementation(tmp_path, edit=edit)
    selected = "test_logits_match_reference or test_cached_logits_equal_full_forward"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "forward: 8 failing test(s) of its own; 22 other failure(s) trace back to it" in roots, out[-3000:]
    assert "new_cache: " not in roots, out[-3000:]


def test_generation_through_a_forward_whose_masked_cached_path_is_wrong_is_a_consequence_of_forward(tmp_path, pytester):
    """A copy of the reference whose generate always hands its forward a mask (ones for an unpadded prompt) and whose
    forward counts a cached step's positions over the new tokens' part of the mask only: unpadded greedy generation
    with the cache goes wrong through forward, whose padded cached test fails; a correct generate passing the whole
    mask picks the same tokens, so generate's failures are consequences of forward (held out: charged to both)."""
    edits = [
        (
            "generation.py",
            "ids, cache, mask = prompt, None, None",
            "ids, cache, mask = prompt, None, torch.ones_like(prompt)",
        ),
        ("model.py", "padded_positions(real)[:, start:]", "padded_positions(real[:, start:])"),
    ]
    folder = implementation(tmp_path, patches=edits)
    selected = "test_padded_cached_forward_equals_uncached or test_greedy_generation_follows_the_model"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "forward: 2 failing test(s) of its own; 2 other failure(s) trace back to it" in roots, out[-3000:]
    assert "generate: " not in roots, out[-3000:]


def test_a_sample_that_draws_from_its_own_wrong_filter_is_a_consequence_of_sampling_probs(tmp_path, pytester):
    """A copy of the reference whose top-k sets the logits it drops to 0 (not -inf) and whose sample filters through
    its own copy of sampling_probs (not the protocol's name): sample(top_k=1) is not the argmax, and the
    implementation's own sampling_probs(top_k=1) keeps the token it drew, so sample's failure is a consequence of
    sampling_probs (a held-out sampler was charged to both)."""

    def edit(folder):
        sampling = folder / "sampling.py"
        text = sampling.read_text()
        dropped = 'return logits.masked_fill(logits < kth, float("-inf"))'
        assert dropped in text
        text = text.replace(dropped, "return logits.masked_fill(logits < kth, 0.0)", 1).replace(
            "    probs = sampling_probs(logits, temperature, top_k, top_p)",
            "    probs = _own_probs(logits, temperature, top_k, top_p)",
            1,
        )
        own = "_types.FunctionType(sampling_probs.__code__, sampling_probs.__globals__, '_own_probs', "
        sampling.write_text(text + f"\n\nimport types as _types\n_own_probs = {own}sampling_probs.__defaults__)\n")

    folder = implementation(tmp_path, edit=edit)
    out = run_suite(f"--impl={folder}", "-k", "test_sampling_probs_any_leading_shape or test_top_k_keeps_exactly_k",
                    cwd=tmp_path, pytester=pytester).stdout  # fmt: skip
    roots = out.split("root causes")[-1]
    assert "sampling_probs: " in roots and "sample: " not in roots, out[-3000:]


def test_padded_generation_through_a_forward_that_counts_from_one_is_a_consequence_of_forward(tmp_path, pytester):
    """A copy of the reference whose padded positions are cumsum(mask) without the - 1: the padded forward's rows
    differ from each row alone and the variant that counts from 1 names it; greedy generate(attention_mask) picks
    exactly the tokens a correct generate picks with that forward, so the generation tests are forward's
    consequences (a held-out bug was charged to forward and generate)."""
    counted = "return (real.long().cumsum(dim=-1) - 1).clamp(min=0)", "return real.long().cumsum(dim=-1)"
    folder = implementation(tmp_path, patch=("padding.py", *counted))
    selected = "test_padded_forward_rows_equal_each_row_alone or test_padded_greedy or test_padded_cached_generation"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "forward: " in roots and "generate: " not in roots, out[-3000:]
    assert "positions count each row's real tokens from 1" in out, out[-3000:]


def test_padded_cached_paths_through_a_cache_that_loses_its_length_are_consequences_of_new_cache(tmp_path, pytester):
    """A copy of the reference whose cache sets its length to the last chunk's (wrong from the third cached call):
    the cache's own tests fail; the padded cached forward and padded cached generation (which raise on the mask's
    length, or differ) go wrong without padding too, so they are new_cache's consequences, not forward's or
    generate's (a held-out cache was charged to new_cache, forward and generate)."""
    length = ("kv_cache.py", "self.lengths[layer] = end\n", "self.lengths[layer] = end - start if start else end\n")
    folder = implementation(tmp_path, patch=length)
    selected = "test_cached_logits_equal_full_forward or test_padded_cached or test_padded_greedy"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "new_cache: " in roots and "forward: " not in roots and "generate: " not in roots, out[-3000:]


def test_a_train_that_calls_its_own_broken_step_is_a_consequence_of_train_step(tmp_path, pytester):
    """A copy of the reference whose train_step clears the gradients between backward() and step(), and whose train
    calls that step under a private name (no protocol name to substitute): train does not overfit, and neither does
    a correct loop around the copy's own train_step, so the overfit test is train_step's consequence."""

    def edit(folder):
        training = folder / "training.py"
        text = training.read_text()
        step = "    optimizer.step()\n    return loss.item()\n"
        call = "losses.append(train_step(model, optimizer, x, y, max_grad_norm))"
        assert step in text and call in text
        text = text.replace(step, "    optimizer.zero_grad(set_to_none=True)\n" + step + "\n\n_own_step = train_step\n")
        training.write_text(text.replace(call, call.replace("train_step(", "_own_step("), 1))

    folder = implementation(tmp_path, edit=edit)
    selected = "test_train_step_matches_reference or test_tiny_model_overfits"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "train_step: " in roots and "train: " not in roots, out[-3000:]


def test_a_train_with_kingma_ba_adam_around_its_own_broken_step_is_a_consequence_of_train_step(tmp_path, pytester):
    """A copy of the reference whose train_step clips the summed loss's gradients (max_grad_norm / tokens) and whose
    train steps with Adam in Kingma and Ba's form (fairseq's: eps on the uncorrected second moment) around that step
    under a private name: a correct loop around the copy's own train_step with PyTorch's AdamW does not give train's
    losses on one repeated token (eps matters there), with the Kingma-Ba form it does, so train's failures are
    train_step's consequences (held out 68: charged to both)."""
    paper = (
        "\n\nclass _PaperAdam(torch.optim.Optimizer):\n"
        "    def __init__(self, params, lr):\n"
        "        super().__init__(params, dict(lr=lr))\n\n"
        "    @torch.no_grad()\n"
        "    def step(self):\n"
        "        for group in self.param_groups:\n"
        "            for p in group['params']:\n"
        "                if p.grad is None:\n"
        "                    continue\n"
        "                s = self.state[p]\n"
        "                if not s:\n"
        "                    s.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))\n"
        "                s['t'] += 1\n"
        "                s['m'].mul_(0.9).add_(p.grad, alpha=0.1)\n"
        "                s['v'].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)\n"
        "                p.mul_(1 - group['lr'] * 0.01)\n"
        "                size = group['lr'] * (1 - 0.999 ** s['t']) ** 0.5 / (1 - 0.9 ** s['t'])\n"
        "                p.sub_(size * s['m'] / (s['v'].sqrt() + 1e-8))\n"
        "\n\n_own_step = train_step\n"
    )
    edits = [
        ("training.py", "clip_grad_norm_(model.parameters(), max_grad_norm)",
         "clip_grad_norm_(model.parameters(), max_grad_norm / y.numel())"),
        ("training.py", "optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
         "optimizer = _PaperAdam(model.parameters(), lr=lr)"),
        ("training.py", "losses.append(train_step(model, optimizer, x, y, max_grad_norm))",
         "losses.append(_own_step(model, optimizer, x, y, max_grad_norm))"),
    ]  # fmt: skip

    def edit(folder):
        training = folder / "training.py"
        training.write_text(training.read_text() + paper)

    folder = implementation(tmp_path, edit=edit, patches=edits)
    selected = "test_train_step_matches_reference or test_train_defaults_to_adamw or test_train_keeps_its_optimizer"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "train_step: " in roots and "train: " not in roots, out[-3000:]
    assert "3 consequences" in out, out[-3000:]


def test_two_names_that_raise_at_the_same_place_are_one_charge(tmp_path, pytester):
    """A copy of the reference whose config check asks every family for an even head size: the suite's gpt2 config
    (head size 7) makes build_model and kv_cache_bytes raise at the same line, one bug charged to one name."""
    folder = implementation(
        tmp_path, patch=("config.py", 'if cfg.family == "llama" and cfg.d_head % 2:', "if cfg.d_head % 2:")
    )
    selected = "test_kv_cache_bytes or test_logits_match_reference or test_config_defaults"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert sum(line.startswith("  ") and ": " in line for line in roots.splitlines()) == 1, out[-3000:]
    assert "odd head size" in out, out[-3000:]


def test_a_cache_that_stores_keys_as_values_is_charged_to_new_cache_alone(tmp_path, pytester):
    """A copy of the reference whose cache writes the keys into the value buffer: its own prefill through the cache
    already differs from its uncached forward, so what cache_kv returns is new_cache's mistake (a held-out cache was
    charged to new_cache, cache_kv and generate)."""
    keys_as_values = (
        "self.value_buffers[layer][..., start:end, :] = v",
        "self.value_buffers[layer][..., start:end, :] = k",
    )
    folder = implementation(tmp_path, patch=("kv_cache.py", *keys_as_values))
    selected = "test_cached_logits_equal_full_forward or test_cache_holds or test_cache_layout"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "new_cache: " in roots and "cache_kv: " not in roots, out[-3000:]


def test_a_crash_through_the_cache_in_a_forward_test_is_new_cache_s(tmp_path, pytester):
    """A copy of the reference whose cache buffers are float32 whatever the model's dtype: a float64 model's cached
    forward raises in attention, in new_cache's tests and in forward's padded-cache test alike, one charge (new_cache
    is among the names that test uses, though it is also one of forward's callers)."""
    regrown = "    grown = like.new_zeros(*buffer.shape[:-2], capacity, buffer.shape[-1])\n"
    float32 = "    grown = torch.zeros(*buffer.shape[:-2], capacity, buffer.shape[-1], device=like.device)\n"
    folder = implementation(tmp_path, patch=("kv_cache.py", regrown, float32))
    selected = "test_logits_match_reference or test_cached_logits_equal or test_padded_cache_holds_each_row"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "new_cache: " in roots and "forward: " not in roots, out[-3000:]


def test_a_float32_statistic_in_rmsnorm_explains_the_float64_models_rounding(tmp_path, pytester):
    """rmsnorm computed in float32: its own precision test fails, and the float64 model's logits, rounded by it, are
    its consequence (a precision failure upstream explains a check to float64 rounding, never a math check); the
    model's math tests pass. A held-out bug was charged to rmsnorm and forward."""
    f32 = "    xf = x.to(_compute_dtype(x))\n    normed", "    xf = x.float()\n    normed"
    folder = implementation(tmp_path, patch=("norms.py", *f32))
    selected = "test_float64_computed_in_float64 or test_float64_model_computed_in_float64"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "rmsnorm: " in roots and "forward: " not in roots, out[-3000:]
    assert "consequence" in out, out[-3000:]


# rope rotating in complex64 (mistral-inference's ``xq.float()``): float64 queries and keys come back rounded
ROPE_IN_COMPLEX64 = (
    "positions.py",
    "    x0, x1 = pairs[..., 0], pairs[..., 1]\n"
    "    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)\n"
    "    return rearrange(rotated, _UNPAIR_PATTERN[style])\n",
    "    z = torch.view_as_complex(pairs.float().contiguous()) * torch.complex(cos.float(), sin.float())\n"
    "    return rearrange(torch.view_as_real(z), _UNPAIR_PATTERN[style]).to(x.dtype)\n",
)


def test_attention_rotating_through_its_own_float32_rope_on_another_layout_is_rope_s(tmp_path, pytester):
    """rope rotates in complex64, and attention calls it on queries laid out [B, T, H, d] (as code whose heads come
    last does): the same float32 arithmetic rounds differently on that layout, so attention's float64 result is not
    bit for bit the reference composed with its rope. It carries rope's rounding all the same (nearer the
    composition than the float64 result), so its precision failure is rope's consequence. A held-out bug (88's
    float32 rotary detour) was charged to rope and to multihead_self_attention."""
    q_on_heads_last = (
        "attention.py",
        "        q = rope(q, positions, theta, style=rope_style, table_size=rope_table_size, scaling=rope_scaling)\n",
        "        at = positions[..., None] if positions.dim() == 1 else rearrange(positions, 'b 1 t -> b t 1')\n"
        "        q = rope(q.transpose(1, 2), at, theta, style=rope_style).transpose(1, 2)\n",
    )
    folder = implementation(tmp_path, patches=[ROPE_IN_COMPLEX64, q_on_heads_last])
    selected = "test_float64_computed_in_float64 and (rope or multihead)"
    out = charged_alone(folder, tmp_path, pytester, selected, "rope", "multihead_self_attention")
    assert "consequence" in out, out[-3000:]


def test_attention_rounding_on_its_own_beside_a_float32_rope_is_charged(tmp_path, pytester):
    """The protocol's rope rounds to float32, but attention rotates with its own float64 path and rounds its output:
    its error does not carry rope's rounding (it lies farther from the composition than from the float64 result),
    so both are charged."""
    rope_rounded = (
        "__init__.py",
        "from .positions import rope, sinusoidal_positions\n",
        "from .positions import rope as _rope, sinusoidal_positions\n\n\n"
        "def rope(x, *args, **kwargs):\n    return _rope(x, *args, **kwargs).float().to(x.dtype)\n",
    )
    output_rounded = (
        "attention.py",
        "    return linear(merge_heads(out), wo, bo)\n",
        "    return linear(merge_heads(out), wo, bo).float().to(x.dtype)\n",
    )
    folder = implementation(tmp_path, patches=[rope_rounded, output_rounded])
    selected = "test_float64_computed_in_float64 and (rope or multihead)"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "rope: " in roots and "multihead_self_attention: " in roots, out[-3000:]


def test_cached_chunks_through_attention_wrong_past_position_0_are_its_consequence(tmp_path, pytester):
    """Attention whose keys ignore the positions (rotated at arange(T)): right at positions 0..T-1, so the uncached
    model passes, and wrong at the positions past 0 that every chunk after the first reaches through the cache. The
    cached checks are attention's consequence, not new_cache's. A held-out bug (92's keys rotated without
    `input_pos`) was charged to multihead_self_attention and to new_cache."""
    folder = implementation(tmp_path, "mha_keys_rotated_from_zero")
    selected = "test_cached_logits_equal_full_forward or test_multihead_attention_with_rope"
    charged_alone(folder, tmp_path, pytester, selected, "multihead_self_attention", "new_cache")


def test_a_functional_step_of_a_model_that_leaves_a_weight_unused_is_the_model_s(tmp_path, pytester):
    """The MLP reads the attention's normalised input, so mlp_norm's gain is never used, and train_step gives every
    parameter a gradient (zero for the unused one, as a functional step does), so AdamW decays that gain where
    PyTorch's own step would skip it. train_step is right for the model it is given: its failures are forward's. A
    held-out bug (97's MLP reading the attention's norm, under an optax-like chain) was charged to forward and
    train_step."""
    unused_norm = (
        "model.py",
        """        x = x + self.drop(self.attn(self.attn_norm(x), positions, cache, layer, mask))
        return x + self.drop(self.mlp(self.mlp_norm(x)))""",
        """        h = self.attn_norm(x)
        x = x + self.drop(self.attn(h, positions, cache, layer, mask))
        return x + self.drop(self.mlp(h))""",
    )
    every_grad = (
        "training.py",
        "    loss.backward()\n    if max_grad_norm is not None:\n",
        "    loss.backward()\n    for p in model.parameters():  # a functional step: every parameter has a gradient\n"
        "        p.grad = torch.zeros_like(p) if p.grad is None else p.grad\n    if max_grad_norm is not None:\n",
    )
    folder = implementation(tmp_path, patches=[unused_norm, every_grad])
    selected = "test_logits_match_reference or test_train_step_matches_reference"
    charged_alone(folder, tmp_path, pytester, selected, "forward", "train_step")


def test_a_crash_a_consequence_raised_is_its_roots_for_the_tests_that_meet_it_later(tmp_path, pytester):
    """cross_entropy flattens its logits, then its targets, with .view, and get_batch hands out y as a slice of one
    window: cross_entropy raises on its sliced logits in its own tests; train_step's crash on sliced targets (another
    line) is its consequence by composition; train, whose own get_batch gives the slice (a correct train on the
    reference's contiguous windows would run), raises at train_step's place: cross_entropy's too, recorded with the
    consequence, not a name of its own. A held-out bug (92's loss `.view`) cost train."""
    flatten = (
        "losses.py",
        "    if fused:\n        check_targets(logits, targets)",
        "    logits.view(-1, logits.shape[-1])  # flattens that need contiguous memory, one line each\n"
        "    targets.view(-1)\n"
        "    if fused:\n        check_targets(logits, targets)",
    )
    windows = (
        "training.py",
        "    x, y = tokens[offsets], tokens[offsets + 1]\n",
        "    window = tokens[starts[:, None] + torch.arange(context_length + 1)[None, :]]\n"
        "    x, y = window[:, :-1], window[:, 1:]  # views of one window\n",
    )
    folder = implementation(tmp_path, patches=[flatten, windows])
    selected = "(test_leading_dims and cross_entropy) or test_train_step_matches_reference or test_train_"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "cross_entropy: " in roots and "train_step: " not in roots and "train: " not in roots, out[-3000:]


def test_weights_exported_permuted_are_canonical_state_dict_s_and_explain_the_training_checks(tmp_path, pytester):
    """A copy of the reference whose canonical_state_dict gives wq's rows back reordered (a load permutation applied
    again at export, held out): the roundtrip names the reordering, and the train_step checks, which read the
    trained weights through it, are its consequences (a miss of 0.6 at float64 rounding's tolerance is a wrong
    value, not rounding). One charge."""
    export = (
        "    return {name: p.detach() for name, p in model.named_parameters()}",
        "    return {name: (p.detach()[torch.arange(p.shape[0]).flip(0)] if name.endswith('attn.wq.weight') else "
        "p.detach()) for name, p in model.named_parameters()}",
    )
    folder = implementation(tmp_path, patch=("model.py", *export))
    selected = "test_canonical_state_dict_roundtrip or test_train_step_matches_reference"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "canonical_state_dict: " in roots and "train_step: " not in roots, out[-3000:]
    assert "entries along dim 0 are reordered" in out, out[-3000:]


ACCUMULATING = """    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = 0.0
    for xs, ys in zip(x.split(2), y.split(2)):  # gradient accumulation over micro-batches of 2 rows
        part = cross_entropy(model(xs), ys, fused=True) / len(x.split(2)){weighting}
        part.backward()
        loss = loss + part.item(){clip}
    if max_grad_norm is not None and {once}:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss
"""
STEP = """    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = cross_entropy(model(x), y, fused=True)  # F.cross_entropy: the same value, faster
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()
"""
CLIP_INSIDE = (
    "\n        if max_grad_norm is not None:"
    "\n            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)"
)


def test_gradient_accumulation_mistakes_are_named(tmp_path, pytester):
    """A train_step that accumulates gradients over micro-batches of 2 rows: the loss as the mean of their means
    (a short last one weighs as much as a full one: the 2024 gradient-accumulation bug), and clipping inside the
    loop, are named (held out, batch 17). The control, the same accumulation weighted by rows and clipped once, is
    right and passes."""
    weighted = ACCUMULATING.format(weighting=" * len(x.split(2)) * len(xs) / len(x)", clip="", once="True")
    means = ACCUMULATING.format(weighting="", clip="", once="True")
    inside = ACCUMULATING.format(weighting=" * len(x.split(2)) * len(xs) / len(x)", clip=CLIP_INSIDE, once="False")
    selected = "test_train_step_matches_reference"
    for body, said in ((means, "mean of their means"), (inside, "clipped after each micro-batch's backward pass")):
        folder = implementation(tmp_path / said[:4].strip(), patch=("training.py", STEP, body))
        out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
        assert "micro-batches of 2 rows" in out and said in out, out[-3000:]
    folder = implementation(tmp_path / "right", patch=("training.py", STEP, weighted))
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "failed" not in out and " passed" in out, out[-3000:]


def test_a_right_generate_beside_a_wrong_sampling_probs_is_sampling_probs_s(tmp_path, pytester):
    """A copy of the reference whose exported sampling_probs ignores top_k while generate draws through the right
    one (held out: a library's generate used its own sampler): generate's distribution test, whose target is the
    implementation's own sampling_probs, is a consequence of sampling_probs, since generate draws with the specified
    probabilities. The control: a generate that ignores top_k itself stays charged."""
    export = (
        "from .sampling import sample, sampling_probs",
        "from .sampling import sample\nfrom .sampling import sampling_probs as _right\n\n\n"
        "def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):\n"
        "    return _right(logits, temperature, None, top_p)\n",
    )
    folder = implementation(tmp_path, patch=("__init__.py", *export))
    selected = "test_generate_samples_from_sampling_probs or test_sampling_probs_match_reference"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "sampling_probs: " in roots and "generate: " not in roots, out[-3000:]
    ignoring = (
        "    probs = sampling_probs(logits, temperature, top_k, top_p)",
        "    probs = sampling_probs(logits, temperature, None, top_p)",
    )
    folder = implementation(tmp_path / "control", patch=("sampling.py", *ignoring))
    out = run_suite(
        f"--impl={folder}", "-k", "test_generate_samples_from_sampling_probs", cwd=tmp_path, pytester=pytester
    ).stdout
    assert "generate: " in out.split("root causes")[-1], out[-3000:]


def test_a_model_right_on_the_weights_it_holds_is_charged_to_its_loading(tmp_path, pytester):
    """A square weight left transposed at load (wo; held out: minGPT's list of weights to transpose missing c_proj) and
    given back as held: the model computes the specified logits of what canonical_state_dict gives back, so its
    logits tests are consequences of the failing roundtrip, which says the weight is transposed. The control: the
    same loading beside a post-LN block keeps forward charged (its logits are wrong on the weights it holds too)."""
    selected = "test_canonical_state_dict_roundtrip or test_logits_match_reference"
    folder = implementation(tmp_path / "load", "wo_transposed_at_load")
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "canonical_state_dict: " in roots and "forward: " not in roots, out[-3000:]
    assert "axes dim0 and dim1 are transposed" in out, out[-3000:]
    folder = implementation(tmp_path / "both", "wo_transposed_at_load", "post_ln")
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "forward: " in out.split("root causes")[-1], out[-3000:]


def test_weights_given_back_under_each_other_s_names_are_named():
    """A state dict whose wq holds what wk was given names the exchange; the control, wq given back permuted, does
    not."""
    from spec_tests.harness.diagnosis import diagnose
    from spec_tests.harness.judging.tolerances import EXACT

    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(6, 6, generator=g, dtype=torch.float64) for k in ("a.wq.weight", "a.wk.weight", "a.wv.weight")}

    def lines(actual):
        found, _ = diagnose(subject="canonical_state_dict", call=None, args64=None, actual=actual, expected=sd,
                            tol=EXACT, axes=None, rope_style="interleaved", known_bugs=list)  # fmt: skip
        return found

    swapped = {**sd, "a.wq.weight": sd["a.wk.weight"], "a.wk.weight": sd["a.wq.weight"]}
    said = lines(swapped)
    assert any("['a.wq.weight'] gives back the weight given as ['a.wk.weight']" in ln for ln in said), said
    permuted = {**sd, "a.wq.weight": sd["a.wq.weight"].flip(0)}
    said = lines(permuted)
    assert not any("gives back the weight given as" in ln for ln in said) and any("reordered" in ln for ln in said)
    assert not any("gives back rows of" in ln for ln in said), said  # its own rows only: a reordering


def test_rows_of_a_fused_matrix_split_in_another_layout_are_named():
    """wq given back with rows of wk and wv among its own (held out: a Megatron-style fused qkv loaded as a plain
    [q; k; v] stack and split per group) is named by where its rows come from; the control, a wq with one row of its
    own changed, is not."""
    from spec_tests.harness.diagnosis import diagnose
    from spec_tests.harness.judging.tolerances import EXACT

    g = torch.Generator().manual_seed(1)
    sd = {"a.wq.weight": torch.randn(8, 6, generator=g, dtype=torch.float64)}
    sd |= {k: torch.randn(4, 6, generator=g, dtype=torch.float64) for k in ("a.wk.weight", "a.wv.weight")}

    def lines(actual):
        found, _ = diagnose(subject="canonical_state_dict", call=None, args64=None, actual=actual, expected=sd,
                            tol=EXACT, axes=None, rope_style="interleaved", known_bugs=list)  # fmt: skip
        return found

    mixed = torch.cat([sd["a.wq.weight"][:4], sd["a.wk.weight"][:2], sd["a.wv.weight"][:2]])
    said = lines({**sd, "a.wq.weight": mixed})
    assert any("['a.wq.weight'] gives back rows of ['a.wk.weight'], ['a.wv.weight']" in ln for ln in said), said
    changed = sd["a.wq.weight"].clone()
    changed[5] += 1.0
    assert not any("gives back rows of" in ln for ln in lines({**sd, "a.wq.weight": changed}))


def test_a_crash_in_a_helper_that_several_names_share_is_charged_once(tmp_path, pytester):
    """A copy of the reference whose token-data helper (shared by get_batch, train and evaluate) takes the data for a
    numpy array (held out: ``data.astype`` raised on a tensor in three names' tests, among them a check that wanted
    ValueError and got the AttributeError): one name is charged, the others are its consequences, and the wrong
    exception is shown at the helper's line. The control: get_batch and evaluate raising at lines of their own are
    charged each."""
    numpy_only = (
        "    tokens = torch.from_numpy(np.asarray(data)) if not isinstance(data, torch.Tensor) else data",
        "    tokens = torch.from_numpy(data.astype('int64'))",
    )
    folder = implementation(tmp_path / "shared", patch=("training.py", *numpy_only))
    selected = "test_get_batch or test_evaluate or test_train_and_evaluate_take_tokens"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert sum(line.startswith("  ") and ": " in line for line in roots.splitlines()) == 1, out[-3000:]
    assert "raised AttributeError instead" in out and "in your code at" in out, out[-3000:]

    def two_places(folder):  # get_batch and evaluate each raise, at lines of their own
        path = folder / "training.py"
        text = path.read_text()
        text = text.replace("    tokens = as_token_tensor(data)\n", "    tokens = data.astype('int64')\n", 1)
        path.write_text(text.replace("    tokens = as_token_tensor(data)\n", "    tokens = data.numpy()\n", 1))

    folder = implementation(tmp_path / "apart", edit=two_places)
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "get_batch: " in roots and "evaluate: " in roots, out[-3000:]


def test_positions_a_cached_path_starts_at_are_named(tmp_path, pytester):
    """A cached path whose chunks all start at position 3 (held out: a past length read from the head axis, a
    constant) is named with that start for learned positions, and as a constant start for RoPE, where every constant
    is the same model. The control: a causal mask aligned top-left after cached tokens gets no position line."""
    three = (
        "            positions = torch.arange(start, start + ids.shape[1], device=ids.device)",
        "            positions = torch.arange(start if cache is None else 3, (start if cache is None else 3) + "
        "ids.shape[1], device=ids.device)",
    )
    folder = implementation(tmp_path / "three", patch=("model.py", *three))
    out = run_suite(f"--impl={folder}", "-k", "test_cached_logits_equal_full_forward", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    assert "every chunk's positions start at 3, whatever the cache holds" in out, out[-3000:]
    assert "start at the same number (0, or any constant" in out, out[-3000:]
    folder = implementation(tmp_path / "mask", "model_top_left_mask_with_cache")
    out = run_suite(f"--impl={folder}", "-k", "test_cached_logits_equal_full_forward", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    named = (
        "every chunk's positions start at",
        "positions continue from the cache length +",
        "count the earlier calls",
    )
    assert "failed" in out and not any(line in out for line in named), out[-3000:]


ATTENDED = '    else:\n        out = scaled_dot_product_attention(q, k, v, causal=True, fused=attention == "sdpa")'


def _attend_with(mask: str):
    """An edit: every call through a cache attends with ``mask`` (an expression of q, k, cache) instead of the
    causal mask aligned bottom-right."""

    def edit(folder):
        path = folder / "attention.py"
        new = ATTENDED.replace("causal=True", f"None if cache is None else ({mask}), causal=cache is None")
        path.write_text(replace_once(path.read_text(), ATTENDED, new, "the cached mask"))

    return edit


def _counting_calls(folder):
    """The cache counts its calls, not its tokens: positions and the mask's rows start at the number of calls."""
    _attend_with("torch.arange(k.shape[-2])[None, :] <= torch.arange(q.shape[-2])[:, None] + cache.calls")(folder)
    path = folder / "model.py"
    text = replace_once(
        path.read_text(),
        "        start = 0 if cache is None else cache.length\n",
        "        start = 0 if cache is None else cache.__dict__.setdefault('calls', 0)\n",
        "positions from the calls",
    )
    layers = "            x = block(x, positions, cache, layer, mask)\n"
    path.write_text(replace_once(text, layers, layers + "        if cache is not None:\n            cache.calls += 1\n",
                                 "one call counted"))  # fmt: skip


def _tiled_when_cached(folder):
    """Through a cache, query head h reads kv head h % n_kv_heads (the kv heads tiled)."""
    path = folder / "attention.py"
    tiled = "(x if cache is None else torch.cat([x] * (q.shape[-3] // x.shape[-3]), dim=-3))"
    new = ATTENDED.replace("(q, k, v,", f"(q, {tiled.replace('x', 'k')}, {tiled.replace('x', 'v')},")
    path.write_text(replace_once(path.read_text(), ATTENDED, new, "the cached heads"))


def _chunk_at_its_last_position(folder):
    """Through a cache, every token of a chunk is rotated at the chunk's last position."""
    path = folder / "model.py"
    old = "            positions = torch.arange(start, start + ids.shape[1], device=ids.device)\n"
    new = (
        "            positions = torch.arange(start, start + ids.shape[1], device=ids.device)\n"
        "            if cache is not None:\n"
        "                positions = torch.full_like(positions, start + ids.shape[1] - 1)\n"
    )
    path.write_text(replace_once(path.read_text(), old, new, "the chunk's positions"))


CACHED_PATH_LINES = {
    "mask_missing": "on the cached path the causal mask is missing",
    "top_left": "on the cached path the causal mask is aligned top-left",
    "counting_calls": "the cache counts its calls, not its tokens",
    "unrotated": "on the cached path the keys are read back unrotated",
    "tiled": "on the cached path query head h reads kv head h % n_kv_heads",
    "last_position": "every token of a chunk is rotated at the chunk's last position",
}


@pytest.mark.parametrize(
    "case, bugs, edit",
    [
        ("mask_missing", (), _attend_with("torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)")),
        ("top_left", (), _attend_with("torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()")),
        ("counting_calls", (), _counting_calls),
        ("unrotated", ("cache_keys_never_rotated",), None),
        ("tiled", (), _tiled_when_cached),
        ("last_position", (), _chunk_at_its_last_position),
        ("control: a top-left mask for several new tokens only", ("model_top_left_mask_with_cache",), None),
    ],
)
def test_a_cached_path_mistake_is_named(tmp_path, pytester, case, bugs, edit):
    """What a cached path does differently from the specified one, held out in batches 15, 16, 19 and 20: a mask that
    hides only the keys not yet written (a decode-mode mask used for chunks), a mask whose rows are sliced from 0, a
    pointer advanced once per call, the keys cached before RoPE, the kv heads tiled; in batch 22, every token of a
    chunk rotated at its last position. Each is named by its own line and
    no other's. The control, a top-left mask for several new tokens only (one new token after cached ones right), is
    the top-left mask where no single token follows cached ones, and gets no other line."""
    folder = implementation(tmp_path, *bugs, edit=edit)
    out = run_suite(f"--impl={folder}", "-k", "test_cached_logits_equal_full_forward", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    assert "failed" in out, out[-3000:]
    said = {name for name, line in CACHED_PATH_LINES.items() if line in out}
    assert said == ({case} if case in CACHED_PATH_LINES else {"top_left"}), (said, out[-3000:])


def test_a_crash_a_correct_downstream_meets_too_is_the_upstream_s(tmp_path, pytester):
    """A top-k that keeps k - 1 tokens (nothing at top_k=1: NaN probabilities, held out): generate raises where the
    sampler refuses them, and the correct generate composed with this sampling_probs raises the same (type and
    message) in its own code, so generate's crash is sampling_probs'. The control: a generate that raises that message
    on its own beside a right sampling_probs stays charged."""
    k_minus_one = (
        '    return logits.masked_fill(logits < kth, float("-inf"))',
        '    return logits.masked_fill(logits <= kth, float("-inf"))',
    )
    folder = implementation(tmp_path / "topk", patch=("sampling.py", *k_minus_one))
    selected = "test_generate_applies_sampling_filters or test_top_k_keeps_exactly_k"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "sampling_probs: " in roots and "generate: " not in roots, out[-3000:]
    refusing = (
        "            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)",
        "            if top_k == 1:\n"
        "                raise RuntimeError('probability tensor contains either `inf`, `nan` or element < 0')\n"
        "            next_id = sample(logits[:, -1], temperature, top_k, top_p, generator)",
    )
    folder = implementation(tmp_path / "own", patch=("generation.py", *refusing))
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "generate: " in out.split("root causes")[-1], out[-3000:]


def test_evaluate_handing_the_model_back_in_training_mode_is_named(tmp_path, pytester):
    """evaluate that puts the model in training mode on its way out (held out: llama2.c's estimate_loss ends with
    model.train()) is named from the mode it found and the mode it left; the control: a right evaluate passes."""
    folder = implementation(tmp_path / "bug", "mode_not_restored")
    out = run_suite(f"--impl={folder}", "-k", "test_evaluate_restores_mode", cwd=tmp_path, pytester=pytester).stdout
    assert "likely cause: evaluate hands the model back in training mode" in out, out[-3000:]
    folder = implementation(tmp_path / "right")
    out = run_suite(f"--impl={folder}", "-k", "test_evaluate_restores_mode", cwd=tmp_path, pytester=pytester).stdout
    assert "failed" not in out and "passed" in out, out[-3000:]


def _zero_targets_ignored(folder):
    """evaluate leaves targets equal to token 0 out of its loss (a pad id of 0 used as the ignored label)."""
    path = folder / "training.py"
    text = replace_once(
        path.read_text(),
        "                total += token_nll(model(x), y).sum().double().cpu()\n",
        "                total += (token_nll(model(x), y) * (y != 0)).sum().double().cpu()\n",
        "zero targets dropped",
    )
    text = replace_once(text, "    loss = (total / n_pred).item()\n",
                        "    loss = (total / int((tokens[1:] != 0).sum())).item()\n", "their count")  # fmt: skip
    path.write_text(text)


def test_evaluate_leaving_out_token_0_is_named(tmp_path, pytester):
    """evaluate that reads token 0 as padding and leaves its targets out (held out in batches 22 and 23: a pad id of 0
    used as the ignored label) is named by that variant; the control: a loss averaged over len(data) instead of the
    predicted tokens gets its own line, not this one."""
    named = "targets equal to token 0 are left out of the loss"
    folder = implementation(tmp_path / "zero", edit=_zero_targets_ignored)
    out = run_suite(f"--impl={folder}", "-k", "test_evaluate_is_token_weighted", cwd=tmp_path, pytester=pytester).stdout
    assert named in out, out[-3000:]
    control = ("    loss = (total / n_pred).item()\n", "    loss = (total / len(tokens)).item()\n")
    folder = implementation(tmp_path / "all", patch=("training.py", *control))
    out = run_suite(f"--impl={folder}", "-k", "test_evaluate_is_token_weighted", cwd=tmp_path, pytester=pytester).stdout
    assert "divided by len(data)" in out and named not in out, out[-3000:]


def test_a_cached_step_s_positions_from_the_mask_s_front_are_named(tmp_path, pytester):
    """Position ids from the padding mask sliced from its front on a cached step (held out: batch 23's
    position_ids[:, :seq_len]) are named; the window left out of cached calls is named too (the catalogued
    sliding_window_not_on_cached_path). A generate whose own cached steps are wrong whatever the window gets no window
    line: its own cached steps are named (the cache, fed as the protocol's loop feeds it, is right)."""
    front = (
        "            positions = padded_positions(real)[:, start:] if positions is None else positions\n",
        "            positions = padded_positions(real)[:, : ids.shape[1]] if positions is None else positions\n",
    )
    folder = implementation(tmp_path / "front", patch=("model.py", *front))
    select = "test_padded_cached_forward_equals_uncached or test_greedy_generation_past_the_window"
    out = run_suite(f"--impl={folder}", "-k", select, cwd=tmp_path, pytester=pytester).stdout
    assert "a cached step's positions are read from the mask's first columns" in out, out[-3000:]
    assert "the window is not applied" not in out, out[-3000:]
    folder = implementation(tmp_path / "window", "sliding_window_not_on_cached_path")
    out = run_suite(f"--impl={folder}", "-k", "test_cache_equals_no_cache_past_the_window", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    assert "the window is not applied on the cached path" in out, out[-3000:]
    at_zero = (  # generate's own cached steps at position 0, whatever the window
        "                logits = model(ids[:, -1:], cache, **padded(mask))\n",
        "                logits = model(ids[:, -1:], cache, positions=torch.zeros(1, dtype=torch.long), "
        "**padded(mask))\n",
    )
    folder = implementation(tmp_path / "steps", patch=("generation.py", *at_zero))
    out = run_suite(f"--impl={folder}", "-k", "test_greedy_generation_past_the_window", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    assert "failed" in out and "the window is not applied" not in out, out[-3000:]
    # generate's own cached steps are what is wrong: its cache, fed as the protocol's loop feeds it, is right
    assert "generate's own cached path feeds its cache otherwise than the protocol's loop" in out, out[-3000:]


def _generate_with_own_sample(folder, greedy_pick: str, old="        return probs.argmax(dim=-1)\n"):
    """The reference copy in ``folder`` with sample's temperature-0 pick (or the line ``old``) replaced by
    ``greedy_pick`` and generate drawing with its own copy of sample (not the protocol's name: no substitution reaches
    it)."""
    sampling = folder / "sampling.py"
    indent = old[: len(old) - len(old.lstrip())]
    sampling.write_text(replace_once(sampling.read_text(), old, f"{indent}return {greedy_pick}\n", "sampling.py"))
    generation = folder / "generation.py"
    text = generation.read_text().replace("next_id = sample(", "next_id = _own_sample(", 1)
    generation.write_text(text + "\n\nimport types as _types\n_own_sample = _types.FunctionType(sample.__code__, "
                          "sample.__globals__, '_own_sample', sample.__defaults__)\n")  # fmt: skip


def test_a_greedy_generate_crashing_on_its_own_samples_answers_is_a_consequence_of_sample(tmp_path, pytester):
    """A copy of the reference whose sample takes the argmax over the flattened logits at temperature 0 (one id for
    the whole batch) and whose generate draws with its own copy of sample: greedy generate raises. A correct greedy
    generate that picks each token with the implementation's own sample cannot run either, and with the argmax it
    runs, so generate's crashes are consequences of sample (a held-out bug charged sample, sampling_probs and
    generate). A generate that raises on its own while sample passes stays charged."""
    folder = implementation(tmp_path, edit=lambda f: _generate_with_own_sample(f, "probs.argmax()"))
    selected = "test_temperature_zero or greedy_generation_follows or generation_ignores_dropout"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "sample: " in roots and "generate: " not in roots, out[-3000:]
    assert "the argmax is taken over the flattened logits" in out, out[-3000:]

    def broken_generate(f):
        generation = f / "generation.py"
        generation.write_text(replace_once(generation.read_text(), "    ctx = model.config.context_length\n",
                                           "    ctx = model.config.context_length\n    assert prompt.shape[0] == 1\n",
                                           "generation.py"))  # fmt: skip

    control = implementation(tmp_path / "control", edit=broken_generate)
    out = run_suite(f"--impl={control}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "generate: " in out.split("root causes")[-1], out[-3000:]


def test_a_sampled_generate_crashing_on_its_own_samples_shape_is_a_consequence_of_sample(tmp_path, pytester):
    """A copy of the reference whose sample squeezes multinomial's draws (a batch of one row gives a 0-d id) and whose
    generate draws with its own copy of sample: sampled generate raises for a batch of one. A correct generate that
    draws each token with the implementation's own sample, its result taken as the protocol's [B], cannot run either,
    so generate's crash is a consequence of sample (held out 82: charged to sample and generate)."""
    folder = implementation(
        tmp_path,
        edit=lambda f: _generate_with_own_sample(f, "ids.squeeze()", "    return ids.reshape(probs.shape[:-1])\n"),
    )
    out = run_suite(
        f"--impl={folder}", "-k", "generat or sampling_probs_any_leading", cwd=tmp_path, pytester=pytester
    ).stdout
    roots = out.split("root causes")[-1]
    assert "sample: " in roots and "generate: " not in roots, out[-3000:]


def test_greedy_tokens_a_generate_gets_from_its_own_sample_are_a_consequence_of_sample(tmp_path, pytester):
    """A copy of the reference whose sample picks the argmin of the one-hot at temperature 0 and whose generate draws
    with its own copy of sample: greedy generate gives other tokens than the model's argmax, the very tokens a
    correct greedy generate picking with the implementation's own sample gives, so they are sample's consequence."""
    folder = implementation(tmp_path, edit=lambda f: _generate_with_own_sample(f, "probs.argmin(dim=-1)"))
    selected = "test_temperature_zero or greedy_generation_follows"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "sample: " in roots and "generate: " not in roots, out[-3000:]


def _sample_with_own_probs(folder, *, probs_in_place: bool, sample_in_place: bool):
    """The reference copy in ``folder`` whose sample calls its own copy of sampling_probs (no substitution reaches
    it); ``probs_in_place``: sampling_probs divides the caller's logits by the temperature in place;
    ``sample_in_place``: sample does, before calling it."""
    sampling = folder / "sampling.py"
    text = sampling.read_text()
    if probs_in_place:
        text = replace_once(text, "    scaled = logits / temperature\n", "    scaled = logits.div_(temperature)\n", "s")
    if sample_in_place:  # scales the caller's logits, then samples from the unscaled values
        old = "    probs = sampling_probs(logits, temperature, top_k, top_p)\n"
        new = "    logits.mul_(2.0)\n    probs = sampling_probs(logits / 2.0, temperature, top_k, top_p)\n"
        text = replace_once(text, old, new, "sampling.py")
    text = text.replace("    probs = sampling_probs(logits", "    probs = _own_probs(logits", 1)
    sampling.write_text(text + "\n\nimport types as _types\n_own_probs = _types.FunctionType(sampling_probs.__code__, "
                        "sampling_probs.__globals__, '_own_probs', sampling_probs.__defaults__)\n")  # fmt: skip


def test_an_in_place_edit_sample_makes_through_its_own_sampling_probs_is_a_consequence(tmp_path, pytester):
    """A copy of the reference whose sampling_probs divides the caller's logits in place and whose sample calls its
    own copy of it (a held-out bug charged sampling_probs and sample): sample's logits change, and its draws from
    expanded logits raise. A correct sample calling the implementation's sampling_probs changes its logits the same
    way and raises the same crash at the same place, so both are sampling_probs' consequences. A sample that
    edits its logits itself, beside a correct sampling_probs, stays charged."""
    selected = "test_sample_leaves_its_logits_unchanged or test_sample_frequencies_follow or sampling_probs_match"
    folder = implementation(
        tmp_path, edit=lambda f: _sample_with_own_probs(f, probs_in_place=True, sample_in_place=False)
    )
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "sampling_probs: " in roots and "sample: " not in roots, out[-3000:]
    control = implementation(
        tmp_path / "control", edit=lambda f: _sample_with_own_probs(f, probs_in_place=False, sample_in_place=True)
    )
    out = run_suite(f"--impl={control}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    assert "sample: " in out.split("root causes")[-1], out[-3000:]


def test_an_input_a_failing_upstream_edits_in_place_is_its_consequence_in_a_check(tmp_path, pytester):
    """A copy of the reference whose cross_entropy subtracts each row's max from the logits in place, and whose
    lm_loss calls its own copy of it on a view of its logits: lm_loss's check sees its input changed. The test run
    again with the reference's lm_loss composed with the implementation's cross_entropy fails at the same check, so
    lm_loss's failure is cross_entropy's consequence (``rootcause.composed_rerun``); cross_entropy is charged. A test
    that requires unchanged inputs itself asks ``Spec.inplace_upstream`` (test_sample_leaves_its_logits_unchanged)."""

    def edit(folder):
        losses = folder / "losses.py"
        text = replace_once(losses.read_text(), "    nll = token_nll(logits, targets, ignore_index)\n",
                            "    logits = logits.sub_(logits.amax(-1, keepdim=True).detach())\n"
                            "    nll = token_nll(logits, targets, ignore_index)\n", "losses.py")  # fmt: skip
        text = text.replace(
            "    return cross_entropy(logits[:, :-1], ids[:, 1:])", "    return _own_ce(logits[:, :-1], ids[:, 1:])"
        )
        losses.write_text(text + "\n\nimport types as _types\n_own_ce = _types.FunctionType(cross_entropy.__code__, "
                          "cross_entropy.__globals__, '_own_ce', cross_entropy.__defaults__)\n"
                          "_own_ce.__kwdefaults__ = cross_entropy.__kwdefaults__\n")  # fmt: skip

    folder = implementation(tmp_path, edit=edit)
    out = run_suite(f"--impl={folder}", "-k", "test_lm_loss_predicts or test_cross_entropy_mean", cwd=tmp_path,
                    pytester=pytester).stdout  # fmt: skip
    roots = out.split("root causes")[-1]
    assert "cross_entropy: " in roots and "lm_loss: " not in roots, out[-3000:]


def test_an_attention_that_shares_the_loader_s_mistake_is_a_consequence_of_the_loading(tmp_path, pytester):
    """Held out (batches 76 and 79): code whose multihead_self_attention converts the weights it is given with the
    loader that converts a model's, a mistake in that conversion in both. Here a copy of the reference whose attention
    uses wo transposed and whose canonical_state_dict gives wo back transposed: the attention's output is the
    reference's on the weights the implementation's own round trip gives back, so its failures are consequences of
    canonical_state_dict. The attention's bug alone (catalog attention_output_weight_transposed) stays charged to
    multihead_self_attention, as test_bug_catalog's reading shows."""
    edits = [
        ("attention.py", "linear(merge_heads(out), wo, bo)", "linear(merge_heads(out), wo.T, bo)"),
        (
            "model.py",
            "    return {name: p.detach() for name, p in model.named_parameters()}",
            "    return {name: p.detach().T if name.endswith('attn.wo.weight') else p.detach()\n"
            "            for name, p in model.named_parameters()}",
        ),
    ]
    folder = implementation(tmp_path, patches=edits)
    selected = "test_multihead_attention_layout or test_canonical_state_dict_roundtrip"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "canonical_state_dict: " in roots and "multihead_self_attention: " not in roots, out[-3000:]


def test_a_feed_forward_that_shares_the_loader_s_mistake_is_a_consequence_of_the_loading(tmp_path, pytester):
    """Held out (batch 75): gate and up halves swapped where the loader fuses them, and the same conversion in the
    adapter's swiglu. Here a copy of the reference whose swiglu swaps w_gate and w_up and whose canonical_state_dict
    gives them back swapped: swiglu's output (its own test and its leading-dims tests, through the protocol entry's
    ``loaded_as``) is the reference's on the weights the round trip gives back, so they are consequences of
    canonical_state_dict, charged once."""
    edits = [
        (
            "mlp.py",
            "silu(linear(x, w_gate), fused=fused) * linear(x, w_up)",
            "silu(linear(x, w_up)) * linear(x, w_gate)",
        ),
        (
            "model.py",
            "    return {name: p.detach() for name, p in model.named_parameters()}",
            "    swap = {'mlp.w_gate.': 'mlp.w_up.', 'mlp.w_up.': 'mlp.w_gate.'}\n"
            "    out = {}\n"
            "    for name, p in model.named_parameters():\n"
            "        for a, b in swap.items():\n"
            "            if a in name:\n"
            "                name = name.replace(a, b)\n"
            "                break\n"
            "        out[name] = p.detach()\n"
            "    return out",
        ),
    ]
    folder = implementation(tmp_path, patches=edits)
    selected = "test_swiglu or swiglu-fewer or test_canonical_state_dict_roundtrip"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = out.split("root causes")[-1]
    assert "canonical_state_dict: " in roots and "swiglu: " not in roots, out[-3000:]


def test_a_padded_prefill_read_through_a_failing_cache_is_the_cache_s(pytester):
    """Held out (batch 79): a cache that counts calls, not tokens, holds one time step after a prefill, so the
    padded-prefill test that reads the cache (judging forward's padding) fails too. The cache fails its own tests
    (its cached logits, which its overflow test's line explains), so that failure is the cache's consequence, not a
    second root under forward."""
    out = run_suite(
        "--impl=bug:cache_counts_calls_not_tokens",
        "--spec-diagnosis-bugs=,",
        "-k",
        "padded_cache_holds_each_row_alone or cache_overflow_raises or cached_logits_equal_full_forward",
        cwd=ROOT,
        pytester=pytester,
    ).stdout
    roots = out.split("root causes")[-1]
    assert "new_cache: " in roots and "forward: " not in roots, out[-3000:]


PADDED_EVALUATE = (
    """            for length in sorted({n for _, n in group}):  # the short last window goes alone
                starts = torch.tensor([s for s, n in group if n == length])
                offsets = starts[:, None] + torch.arange(length)[None, :]
                x, y = tokens[offsets].to(device), tokens[offsets + 1].to(device)
                total += token_nll(model(x), y).sum().double().cpu()
""",
    """            x = torch.zeros(len(group), context_length, dtype=torch.long)
            y = torch.full((len(group), context_length), -100, dtype=torch.long)
            for row, (s, n) in enumerate(group):  # every window padded to the context, its padding's targets ignored
                x[row, :n], y[row, :n] = tokens[s : s + n], tokens[s + 1 : s + n + 1]
            total += cross_entropy(model(x.to(device)), y.to(device)).double().cpu() * sum(n for _, n in group)
""",
)


@pytest.mark.parametrize("evaluate_wrong", [False, True], ids=["evaluate-right", "evaluate-wrong-too"])
def test_an_evaluate_that_pads_batches_for_its_own_cross_entropy_is_its_consequence(tmp_path, pytester, evaluate_wrong):
    """An evaluate that pads each batch to the context and calls the implementation's own cross_entropy (the padding's
    targets ignored), whose cross_entropy counts ignored targets: evaluate's failures equal a token-weighted evaluate
    over padded batches through that cross_entropy, so they are its consequences, one charge (held out: GPT-NeoX's
    loss mask averaged over every position cost cross_entropy and evaluate). An evaluate that also weighs its batches
    wrongly (each batch's loss counted once, not by its tokens) equals no such composition and stays charged."""
    patches = [("training.py", *PADDED_EVALUATE)]
    if evaluate_wrong:
        patches.append(
            ("training.py", "    loss = (total / n_pred).item()", "    loss = (total / n_pred * len(windows)).item()")
        )
        patches.append(("training.py", " * sum(n for _, n in group)\n", "\n"))
    folder = implementation(tmp_path, "cross_entropy_counts_ignored", patches=patches)
    selected = "test_cross_entropy or test_evaluate_is_token_weighted or test_evaluate_keeps_nothing"
    out = run_suite(f"--impl={folder}", "-k", selected, cwd=tmp_path, pytester=pytester).stdout
    roots = root_block(out)
    assert "cross_entropy: " in roots, out[-3000:]
    assert ("evaluate: " in roots) == evaluate_wrong, out[-3000:]
    if not evaluate_wrong:
        assert " consequences in " in out.splitlines()[-1], out[-3000:]


def test_train_around_a_train_step_that_keeps_gradients_is_its_consequence_with_beta2_0_95(tmp_path, pytester):
    """A train that runs AdamW with beta2 0.95 (hyperparameters the protocol leaves open) around a train_step that
    never clears the gradients: train's clipping test equals a correct loop with that AdamW around the implementation's
    own train_step, so it is train_step's consequence, one charge (held out: llama.cpp's ggml_opt_fit cost train_step
    and train)."""
    betas = (
        "    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
        "    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)",
    )
    folder = implementation(tmp_path, "train_step_no_zero_grad", patch=("training.py", *betas))
    charged_alone(
        folder,
        tmp_path,
        pytester,
        "test_train_step_matches_reference or test_train_clips_at_the_given_max_grad_norm",
        "train_step",
        "train",
    )


def test_keys_a_cached_path_rotated_at_other_positions_are_new_cache_s(tmp_path, pytester):
    """Layers after the first take their positions from the cache's length after layer 0 advanced it: the keys each
    layer writes are right but for their positions, so what cache_kv reads back is the cached path's mistake, judged
    by new_cache's cached-logits tests, and cache_kv is not charged (held out: a student's KV cache read with
    get_seq_length() of layer 0 cost new_cache and cache_kv)."""
    folder = implementation(tmp_path, "layers_read_the_cache_length_after_layer_0")
    charged_alone(
        folder,
        tmp_path,
        pytester,
        "test_cache_holds_the_specified or test_cached_logits_equal_full_forward",
        "new_cache",
        "cache_kv",
    )


def test_a_failing_function_the_model_calls_at_one_of_two_places_explains_the_model(tmp_path, pytester):
    """embedding scales its rows by sqrt(d_model) and the model looks up its position embeddings without it (a gpt2
    whose token embedding is the failing function, its positions another path): the reference composed with the
    implementation's embedding at the token lookup alone gives the model's logits, so forward's failures are
    embedding's consequences, one charge (held out: the Annotated Transformer's Embeddings cost embedding and forward);
    composed at both places it would not match."""
    scaled = ("    return weight[ids]", "    return weight[ids] * weight.shape[-1] ** 0.5")
    positions = (
        "            x = x + embedding(positions, self.pos_embeddings.weight)",
        "            x = x + self.pos_embeddings.weight[positions]",
    )
    folder = implementation(tmp_path, patches=[("primitives.py", *scaled), ("model.py", *positions)])
    charged_alone(
        folder, tmp_path, pytester, "test_embedding_lookup or test_logits_match_reference", "embedding", "forward"
    )


def test_train_around_a_get_batch_with_unshifted_targets_is_its_consequence(tmp_path, pytester):
    """get_batch gives the inputs as their own targets and train draws its batches from it: train's first loss equals
    a correct train's with the targets the implementation's own get_batch pairs with each window, so it is get_batch's
    consequence, one charge (held out: the Annotated Transformer's Batch with tgt_y unshifted cost get_batch and
    train)."""
    folder = implementation(tmp_path, "get_batch_unshifted_targets")
    charged_alone(
        folder,
        tmp_path,
        pytester,
        "test_get_batch_windows_and_shift or test_train_losses_are_next_token_losses",
        "get_batch",
        "train",
    )


def test_a_cache_check_a_failing_component_explains_is_that_component_s(tmp_path, pytester):
    """A router whose softmax runs over the tokens: a chunk through the cache routes otherwise than the whole
    sequence, and the cached chunks equal what the reference's model and cache compute with the implementation's own
    moe_mlp, so the cache check is moe_mlp's consequence, one charge (held out: mistral-inference's MoE cost moe_mlp
    and new_cache)."""
    folder = implementation(tmp_path, "moe_router_softmax_over_tokens")
    charged_alone(
        folder, tmp_path, pytester, "test_moe_mlp or test_cache_equals_no_cache_with_moe", "moe_mlp", "new_cache"
    )


def test_a_mask_without_its_diagonal_costs_the_mask_once_through_attention_and_the_model(tmp_path, pytester):
    """The implementation's causal_mask leaves out the diagonal and its own attention builds its mask with it,
    giving the first query, which then sees no key, zero weights (no NaN). The correct attention composed with that
    mask leaves the first query's row undefined (NaN: no key to attend), a row the protocol leaves unspecified, and
    equals the implementation elsewhere: attention is the mask's consequence. The model's failures are attention's,
    whose own are the mask's: a chain, settled to the mask alone. A held-out bug (101's broadcast_lesser) was charged
    to causal_mask and multihead_self_attention, then to causal_mask and forward."""
    no_diagonal = ("attention.py", "    return k_pos <= q_pos\n", "    return k_pos < q_pos  # the diagonal left out\n")
    own_mask = (  # the implementation's attention always builds its mask with causal_mask, and zero-fills empty rows
        "attention.py",
        "    if fused and softcap is None:\n        if causal and mask is None and t_q == 1 and n_rep > 1:",
        "    if False:\n        if causal and mask is None and t_q == 1 and n_rep > 1:",
    )
    zero_rows = (
        "attention.py",
        '    return einsum(weights, v, "... h tq tk, ... h tk d -> ... h tq d")\n\n\ndef flash_attention(',
        '    return einsum(weights.nan_to_num(0.0), v, "... h tq tk, ... h tk d -> ... h tq d")\n\n\n'
        "def flash_attention(",
    )
    folder = implementation(tmp_path, patches=[no_diagonal, own_mask, zero_rows])
    selected = "test_causal_mask_bottom_right or test_multihead_attention_layout or test_logits_match_reference"
    out = charged_alone(folder, tmp_path, pytester, selected, "causal_mask", "multihead_self_attention")
    assert "forward: " not in root_block(out), out[-3000:]


def test_logits_of_a_model_that_shares_an_untied_head_with_the_embedding_are_build_model_s(tmp_path, pytester):
    """An untied gpt2 head built on the embedding's parameter (GluonNLP's params=self._embed.params whatever
    tie_embeddings says): loading lm_head.weight writes over the embedding, and the model computes the specified
    logits of the one matrix it holds for both. The logits check is build_model's consequence (its
    parameter-of-its-own check fails), not forward's. A held-out bug (101) was charged to build_model and forward."""
    shared = [
        (
            "model.py",
            "        if cfg.tie_embeddings:\n",
            "        if True:  # the bug: shared whatever the config says\n",
        ),
        (
            "model.py",
            "    params = dict(model.named_parameters())  # a tied lm_head is not listed separately",
            "    params = dict(model.named_parameters(remove_duplicate=model.config.tie_embeddings))",
        ),
        (
            "model.py",
            "    return {name: p.detach() for name, p in model.named_parameters()}",
            "    tied = model.config.tie_embeddings\n"
            "    return {name: p.detach() for name, p in model.named_parameters(remove_duplicate=tied)}",
        ),
    ]
    folder = implementation(tmp_path, patches=shared)
    selected = "test_logits_match_reference_with_an_untied_gpt2_head or test_each_canonical_weight_has_a_parameter"
    charged_alone(folder, tmp_path, pytester, selected, "build_model", "forward")


def test_keys_that_are_no_rotation_in_a_cache_that_reads_back_are_the_model_s(tmp_path, pytester):
    """The model's RoPE table keeps only the cosine (a complex buffer cast to a real dtype): its keys are not a
    rotation of themselves, so cache_kv's check that the same token's key keeps its length fails, while the cache,
    fed the tokens in chunks, gives the model's own uncached logits. The cache holds what its model computes: that
    check is forward's consequence. A held-out bug (99's freqs_cis buffer) was charged to forward and cache_kv; a
    cache that stores keys before RoPE still costs cache_kv (its chunks do not read back)."""
    folder = implementation(tmp_path, "rope_model_table_loses_its_sine")
    selected = "test_logits_match_reference or test_cache_layout_rotated_keys_plain_values"
    charged_alone(folder, tmp_path, pytester, selected, "forward", "cache_kv")


def test_a_training_step_that_calls_a_failing_loss_is_its_consequence(tmp_path, pytester):
    """Held-out batch 107's cross_entropy divides the summed NLL by the logits' first axis (a numpy assignment's N),
    and its train_step hands it [B, T, V] logits: the loss is T times the mean, its gradients too. The composition
    of the reference's train_step with the implementation's cross_entropy carries the gradient back through it (a
    bridged call inside a computation autograd records runs with gradients), so train_step is charged to
    cross_entropy alone."""
    by_rows = (
        "losses.py",
        "    return nll.sum() / (targets != ignore_index).sum()",
        "    return nll.sum() / targets.shape[0]",
    )
    unfused = ("training.py", "cross_entropy(model(x), y, fused=True)", "cross_entropy(model(x), y)")
    folder = implementation(tmp_path, patches=[by_rows, unfused])
    charged_alone(folder, tmp_path, pytester, "cross_entropy or train_step_matches_reference", "cross_entropy",
                  "train_step")  # fmt: skip


def test_a_crash_message_reads_alike_whatever_the_shapes_it_names():
    """The same line raises for inputs of other sizes, dtypes and ranks: the shapes torch's message names (their
    numbers, signs and lengths) are left out of a crash's signature (held out 106: a repeat helper behind repeat_kv and
    scaled_dot_product_attention raised with "Target sizes: [-1, 4, -1, -1, -1]" and "[4, -1, -1, -1]"); the words
    stay (control: another message is another crash)."""
    aside = rootcause.numbers_aside
    one = "The expanded size of the tensor (4) must match the existing size (2) at non-singleton dimension 1.  Target "
    five, four = one + "sizes: [-1, 4, -1, -1, -1].  Tensor sizes: [3, 2, 1, 13, 10]", one + "sizes: [4, -1, -1, -1]."
    assert aside(five.replace("dimension 1", "dimension 0")) == aside(five)
    assert aside(four + "  Tensor sizes: [2, 1, 13, 10]") == aside(five)
    assert aside("shape '[2, 5, -1, 64]' is invalid") == aside("shape '[2, -1, 64]' is invalid")
    assert aside("shape '[2, 5, -1, 64]' is invalid") != aside("size '[2, 5, -1, 64]' is invalid")
