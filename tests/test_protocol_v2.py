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
    """A star import of the reference (v1: no PROTOCOL_VERSION) keeps the filters and has no rope_scaling."""
    write(tmp_path / "v1_copy.py", "from reference import *  # noqa: F403\n")
    proc = run_suite("--impl=v1_copy", "-rs", "-k", "test_rope_scaling or test_top_k_keeps", cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "4 passed" in out, out[-3000:]  # test_top_k_keeps_exactly_k
    assert "capability rope_scaling" in out and "failed" not in out, out[-3000:]
