"""Protocol v2's capabilities (docs/protocol.md, amendments 18-21): how a declaration is read, and that a sampler
without top_p, or a v1 implementation, keeps every verdict that has nothing to do with what it lacks."""

import textwrap

import pytest
from ahead import run_ahead  # tests/ahead.py: run by a runner process while other tests run
from suite_subprocess import run_suite

from spec_tests.protocol import ALL_CAPABILITIES, ROPE_SCALING_TYPES, effective_capabilities


def test_a_v1_list_implies_both_filters():
    assert effective_capabilities(ALL_CAPABILITIES) == frozenset(ALL_CAPABILITIES) | {"top_k", "top_p"}
    assert effective_capabilities((), 1) == {"top_k", "top_p"}
    # a list given to the suite (a rubric) is read by its names, whatever the submission declares
    assert effective_capabilities(("gqa",)) == {"gqa", "top_k", "top_p"}
    assert effective_capabilities(("gqa", "top_k")) == {"gqa", "top_k"}


def test_a_v2_list_holds_exactly_what_it_names():
    assert effective_capabilities(("gqa", "top_k"), 2) == {"gqa", "top_k"}
    assert effective_capabilities((), 2) == frozenset()
    every_type = {f"rope_scaling:{t}" for t in ROPE_SCALING_TYPES}
    assert effective_capabilities(("rope_scaling",), 2) == {"rope_scaling", *every_type}
    assert effective_capabilities(("rope_scaling:llama3",), 2) == {"rope_scaling", "rope_scaling:llama3"}


@pytest.mark.parametrize(
    "names,version,words",
    [
        (("rope_scaling",), 1, "PROTOCOL_VERSION = 2"),
        (("top_k",), 1, "PROTOCOL_VERSION = 2"),
        (("telepathy",), 2, "telepathy"),
        (("gqa",), 3, "PROTOCOL_VERSION must be one of"),
    ],
)
def test_bad_declarations_raise(names, version, words):
    with pytest.raises(ValueError, match=words):
        effective_capabilities(names, version)


def write(path, source: str):
    path.write_text(textwrap.dedent(source))
    return path


@run_ahead
def test_a_sampler_without_top_p_is_judged_on_everything_else(tmp_path):
    """No top_p parameter at all: the filter's tests are skipped as not provided, shapes, temperature,
    reproducibility and generation are judged and pass; nothing is "not implemented" or failed."""
    write(
        tmp_path / "no_top_p.py",
        """
        import reference
        from reference import *  # noqa: F403

        PROTOCOL_VERSION = 2
        CAPABILITIES = ("gqa", "tied_head", "untied_head", "linear_bias", "dropout", "free_d_ff", "rope_theta", "top_k")


        def sampling_probs(logits, temperature=1.0, top_k=None):
            return reference.sampling_probs(logits, temperature, top_k)


        def sample(logits, temperature=1.0, top_k=None, generator=None):
            return reference.sample(logits, temperature, top_k, generator=generator)


        def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None, use_cache=True):
            return reference.generate(model, prompt, max_new_tokens, temperature, top_k, None, generator, use_cache)
        """,
    )
    proc = run_suite("--impl=no_top_p", "-rs", "-k", "test_sampl or test_generate_applies", cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "failed" not in out and "not implemented" not in out, out[-3000:]
    assert "capability top_p" in out, out[-3000:]
    for judged in ("test_sample_is_reproducible_per_generator[plain]", "test_temperature_zero_is_argmax"):
        assert f"SKIPPED [1] {judged}" not in out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("capability top_p" in line for line in skipped), skipped


@run_ahead
def test_a_v1_implementation_skips_only_the_v2_tests(tmp_path):
    """A star import of the reference (v1: no PROTOCOL_VERSION) keeps the filters and has no rope_scaling (nor
    sliding_window)."""
    write(tmp_path / "v1_copy.py", "from reference import *  # noqa: F403\n")
    k = "test_rope_scaling or test_top_k_keeps or test_sliding_window"
    proc = run_suite("--impl=v1_copy", "-rs", "-k", k, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "4 passed" in out, out[-3000:]  # test_top_k_keeps_exactly_k
    assert "capability rope_scaling" in out and "failed" not in out, out[-3000:]
    assert "capability sliding_window" in out, out[-3000:]


# ---------------------------------------------------------------- FIXED_CONFIG (amendment 26)

GEMMA_FIXED = {"norm_offset": True, "embed_scale": True, "geglu": True, "post_norms": True}


@pytest.mark.parametrize(
    "fixed,words",
    [
        ({"rope_scaling": True}, "not one of"),
        ({"norm_offset": False}, "must be True"),
        ({"post_norms": True}, "without the capability 'post_norms'"),
        (["norm_offset"], "must be a dict"),
    ],
)
def test_bad_fixed_configs_raise(fixed, words):
    from types import SimpleNamespace

    from spec_tests.harness.subject.subject import declared_fixed_config

    impl = SimpleNamespace(FIXED_CONFIG=fixed)
    with pytest.raises(ValueError, match=words):
        declared_fixed_config(impl, "impl", frozenset({"norm_offset", "qkv_bias"}))


def test_fixed_options_go_into_every_llama_config_and_no_gpt2_one():
    from types import SimpleNamespace

    from spec_tests import models
    from spec_tests.harness.subject.subject import declared_fixed_config

    caps = frozenset({"gqa", "tied_head", "untied_head", "free_d_ff", "rope_theta", *GEMMA_FIXED})
    impl = SimpleNamespace(
        fixed_config=declared_fixed_config(SimpleNamespace(FIXED_CONFIG=GEMMA_FIXED), "impl", caps),
        capabilities=caps,
        require_family=lambda family: None,
        require_capability=lambda *names: None,
    )
    assert models.family_config(impl, "llama").items() >= GEMMA_FIXED.items()
    assert not set(GEMMA_FIXED) & set(models.family_config(impl, "gpt2"))


@run_ahead
def test_the_reference_with_every_gemma_option_fixed_passes(tmp_path):
    """The reference declaring FIXED_CONFIG with every Gemma option: the v1 model tests (logits, initialisation,
    config defaults, cache, generation) run on Gemma-style configs, and pass."""
    write(
        tmp_path / "gemma_fixed.py",
        f"""
        import reference
        from reference import *  # noqa: F403

        PROTOCOL_VERSION = 2
        CAPABILITIES = reference.CAPABILITIES
        FIXED_CONFIG = {GEMMA_FIXED!r}
        """,
    )
    proc = run_suite("--impl=gemma_fixed", "-k", "test_model or test_kv_cache or test_gemma_style", cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "failed" not in out and " passed" in out, out[-3000:]


@run_ahead
def test_the_reference_with_qwen_attention_fixed_passes(tmp_path):
    """The reference declaring FIXED_CONFIG qkv_bias and qk_norm (Qwen2's and Qwen3's attention, amendments 22 and
    24): the v1 model tests (logits, initialisation, cache, generation) run with the biases and the q/k norms in
    every llama config, and pass."""
    write(
        tmp_path / "qwen_fixed.py",
        """
        import reference
        from reference import *  # noqa: F403

        PROTOCOL_VERSION = 2
        CAPABILITIES = reference.CAPABILITIES
        FIXED_CONFIG = {"qkv_bias": True, "qk_norm": True}
        """,
    )
    proc = run_suite("--impl=qwen_fixed", "-k", "test_model or test_kv_cache or test_generation", cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "failed" not in out and " passed" in out, out[-3000:]
