"""Graded inputs are drawn fresh (issue 19, item 2): a spec seed draws every input and the model
configs' sizes; grading draws one the submission cannot know; answers looked up by input or copied
from earlier feedback then answer nothing; integer answers never show their expected number.

The unit tests check the seed's plumbing in-process (inputs, configs, Hypothesis, the option, the
conceal mode). The grading tests grade, in one batch per seed, the reference, the honest-but-wrong
submission of ``tests/grading_cheaters/`` and two cheaters built on it: ``recording_replay`` (the
handout's recorded expected values, looked up by the fingerprint of their inputs) and
``feedback_table`` (counts copied from the submission's own earlier feedback). Under ``--seed 0``
(the handout's inputs) both cheaters gain, so the attack is real and the test can fail; under a
fresh seed (drawn by the grader) and a fixed other one, each scores exactly what the honest
submission scores, and the reference 100 with the same verdicts.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ahead import built_ahead, run_ahead  # tests/ahead.py: built in a runner while other tests run
from manifest_cache import shared_cache  # tests/manifest_cache.py: the session's manifests
from suite_subprocess import run_forked

from spec_tests import inputs, models
from spec_tests.harness.judging import compare
from spec_tests.harness.judging.tolerances import EXACT

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHEATERS = HERE / "grading_cheaters"
SELECT = "test_norms or test_positions or (count_parameters and not gpt2_small)"
RUBRIC = """
total = 100
[limits]
test_timeout_s = 20
run_timeout_s = 240
memory_mb = 3072
"""
FIXED_SEED = 918273645


@pytest.fixture
def seeded():
    """Set a spec seed for one test, and always go back to the default."""
    yield inputs.set_seed
    inputs.set_seed(inputs.DEFAULT_SEED)


# ------------------------------------------------------------------------------------------------
# the seed's plumbing


def test_the_default_seed_draws_the_suites_own_inputs():
    assert inputs.spec_seed() == inputs.DEFAULT_SEED
    want = torch.randn(3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(inputs.randn(3, 4, seed=5), want)
    assert torch.equal(
        inputs.token_ids(7, seed=3), torch.randint(0, 67, (7,), generator=torch.Generator().manual_seed(3))
    )
    assert inputs.mixed(123) == 123
    assert models.LLAMA_GQA == dict(
        family="llama", vocab_size=67, context_length=29, d_model=80, n_layers=2, n_heads=8, n_kv_heads=2,
        d_ff=56, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=True,
    )  # fmt: skip
    assert models.GPT2["d_model"] == 42 and models.GPT2["d_ff"] == 50 and models.GPT2["vocab_size"] == 67
    assert models.LLAMA_MHA["n_kv_heads"] == 8 and models.LLAMA_MHA["tie_embeddings"] is False


def test_another_seed_draws_other_inputs_reproducibly(seeded):
    default = inputs.randn(3, 4, seed=5)
    seeded(77)
    a, b, c = inputs.randn(3, 4, seed=5), inputs.randn(3, 4, seed=5), inputs.randn(3, 4, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, default) and not torch.equal(a, c)
    g1, g2 = inputs.generator(2), inputs.generator(2)
    assert torch.equal(torch.rand(5, generator=g1), torch.rand(5, generator=g2))
    seeded(78)
    assert not torch.equal(inputs.randn(3, 4, seed=5), a)


def test_configs_under_other_seeds_are_valid_and_never_the_handouts(seeded):
    default = {name: dict(cfg) for name, cfg in models.CONFIGS.items()}
    seen = set()
    for seed in range(1, 40):
        seeded(seed)
        for name, cfg in models.CONFIGS.items():
            sizes = [cfg["vocab_size"], cfg["d_model"], cfg["d_ff"], models.d_head(cfg), cfg["n_heads"]]
            assert len(set(sizes)) == len(sizes), (seed, name, sizes)  # no coincidence of axes
            assert cfg["d_model"] % cfg["n_heads"] == 0 and cfg["n_heads"] % models.n_kv(cfg) == 0
            if cfg["family"] == "llama":
                assert models.d_head(cfg) % 2 == 0
            for key in ("vocab_size", "d_model"):
                assert cfg[key] != default[name][key], (seed, name, key)  # every count and byte size differs
            seen.add((name, cfg["vocab_size"], cfg["d_model"], cfg["d_ff"]))
    assert len(seen) > 12  # the seeds do spread over the choices
    seeded(inputs.DEFAULT_SEED)
    assert {name: dict(cfg) for name, cfg in models.CONFIGS.items()} == default


def test_bad_seeds_are_refused(seeded):
    for bad in (-1, 2**63, 1.5, "3", True):
        with pytest.raises(ValueError, match="spec seed must be an integer"):
            seeded(bad)


def test_integer_answers_can_conceal_the_expected_number():
    assert "expected 64640, got 0" in compare.mismatch(0, 64640, EXACT).found
    compare.CONCEAL_EXACT = True
    try:
        low, high = compare.mismatch(0, 64640, EXACT).found, compare.mismatch(70000, 64640, EXACT).found
        assert "64640" not in low + high and "fewer than expected" in low and "more than expected" in high
        assert compare.mismatch(64640, 64640, EXACT) is None
        assert "expected True" in compare.mismatch(False, True, EXACT).found  # a yes/no answer is no secret
        # whatever the answer's type: a float, None, a string, a tensor, inside a mapping or a sequence
        for answer in (0.0, 64640.0, 1e9, float("nan"), None, "x", [64640], torch.tensor([1, 2])):
            for got, want in ((answer, 64640), ({"n": answer}, {"n": 64640}), ([1, answer], [1, 64640])):
                found = compare.mismatch(got, want, EXACT).found
                assert "64640" not in found.replace(repr(answer), "") and "expected number is not shown" in found, found
        assert (
            "got 0.0: a float where an integer is expected; less than expected"
            in compare.mismatch(0.0, 64640, EXACT).found
        )
        assert "got None: NoneType where an integer is expected" in compare.mismatch(None, 64640, EXACT).found
    finally:
        compare.CONCEAL_EXACT = False


def test_property_tests_draw_their_examples_from_the_spec_seed(seeded):
    from types import SimpleNamespace

    from hypothesis import given
    from hypothesis import strategies as st

    from spec_tests.harness.plugin import hypothesis_profiles

    drawn: list[int] = []

    @given(st.integers(0, 10**9))
    def prop(n):
        drawn.append(n)

    config = SimpleNamespace(getoption=lambda *a, **k: None)

    def examples(seed) -> list[int]:
        seeded(seed)
        hypothesis_profiles.apply([SimpleNamespace(obj=prop)], config)
        drawn.clear()
        prop()
        return list(drawn)

    default, again = examples(inputs.DEFAULT_SEED), examples(inputs.DEFAULT_SEED)
    one, one_again, other = examples(11), examples(11), examples(12)
    assert default == again and one == one_again  # derandomised: the same examples for the same seed
    assert one != default and one != other
    assert prop._hypothesis_internal_use_seed is not None
    examples(inputs.DEFAULT_SEED)
    assert prop._hypothesis_internal_use_seed is None


def run_suite(*args, forked: bool = False) -> subprocess.CompletedProcess:
    """The suite in the project's root folder: in a fresh interpreter, or ``forked`` from this one (a runner's:
    its plugin sets the spec seed when a session starts and resets it when the session ends)."""
    suite = [str(ROOT / "spec_tests"), "-q", "-p", "no:cacheprovider", *args]
    if forked:
        return run_forked(*suite, cwd=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *suite], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


@run_ahead
def test_the_option_reaches_inputs_configs_and_hypothesis(tmp_path):
    """``--spec-seed`` (also from a file) changes every recorded fingerprint; a recording replayed under
    another seed is refused with both seeds named."""
    select = [
        "-k",
        "(test_rmsnorm or test_logits_match_reference or test_rope) and not rope_scaling_frequencies",
    ]  # literal unit vectors (docs/grading.md)
    fingerprints = {}
    (tmp_path / "seed.txt").write_text("4242\n")
    for name, seed in (("default", None), ("seeded", "@" + str(tmp_path / "seed.txt"))):
        args = [*select, f"--spec-record={tmp_path / name}"] + ([f"--spec-seed={seed}"] if seed else [])
        args.append("--spec-diagnosis-bugs=rmsnorm_eps_outside_root")  # the inputs matter here, not bug outputs
        done = run_suite("spec_tests/test_norms.py", "spec_tests/test_model.py", *args, forked=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        data = torch.load(tmp_path / name / "expected-interleaved.pt", weights_only=True)
        fingerprints[name] = {k: e["fingerprint"] for k, e in data["entries"].items()}
    default, seeded = fingerprints["default"], fingerprints["seeded"]
    assert any("logits_match_reference[llama_gqa" in k for k in default) and set(default) == set(seeded), default
    shared = set(default.values()) & set(seeded.values())
    assert not shared, shared  # no input of one seed is an input of the other
    refused = run_suite(
        "spec_tests/test_norms.py",
        "-k",
        "test_rmsnorm",
        "--spec-seed=5",
        f"--spec-replay={tmp_path / 'default'}",
        forked=True,
    )
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "spec seed 0" in said and "--spec-seed 5" in said, said[-3000:]
    bad = run_suite("spec_tests/test_norms.py", "--spec-seed=x", forked=True)
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "--spec-seed must be an integer" in said, said[-3000:]


# ------------------------------------------------------------------------------------------------
# grading with fresh inputs


def reference_dir() -> Path:
    import reference

    return Path(reference.__file__).resolve().parent


def build(folder: Path, name: str, extra: dict[str, str]) -> Path:
    """The honest-but-wrong submission plus one attack (as tests/test_grading_attacks.py builds it)."""
    pkg = folder / name
    shutil.copytree(reference_dir(), pkg / "_ref", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(CHEATERS / "_honest.py", pkg / "_honest.py")
    (pkg / "_attack.py").write_text((CHEATERS / f"{name}.py").read_text() if name != "honest" else "")
    for filename, text in extra.items():
        (pkg / filename).write_text(text)
    (pkg / "__init__.py").write_text("from ._honest import *  # noqa: F403\nfrom ._attack import *  # noqa: F403\n")
    return pkg


def replay_table(tmp: Path) -> str:
    """The handout's recording of the graded tests, as a fingerprint -> values table in a .py file."""
    done = run_suite(  # run_suite collects the whole suite: -k keeps the table to the graded files
        "-k",
        "test_norms or test_positions",
        "--impl=reference",
        f"--spec-record={tmp}",
        "--spec-diagnosis-bugs=rmsnorm_eps_outside_root",  # the table holds expected values, not bug outputs
        forked=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    data = torch.load(tmp / "expected-interleaved.pt", weights_only=True)
    table: dict[str, list] = {}
    for entry in data["entries"].values():
        if isinstance(entry["value"], torch.Tensor):
            table.setdefault(entry["fingerprint"], []).append(entry["value"])
    buffer = io.BytesIO()
    torch.save(table, buffer)
    return f"DATA = {base64.b64encode(buffer.getvalue()).decode()!r}\n"


def copied_counts() -> str:
    """What the honest count_parameters said and what its feedback said was expected, for the handout's configs."""
    import reference

    counts = {}
    for cfg in models.CONFIGS.values():
        model = reference.build_model(cfg, None)
        counts[sum(v.numel() for v in model.state_dict().values())] = reference.count_parameters(model)
    return f"COUNTS = {counts!r}\n"


def grade(subs: list[Path], out: Path, cache: Path, rubric: Path, *extra) -> subprocess.CompletedProcess:
    args = [a for sub in subs for a in ("--impl", str(sub))]
    args += ["--select", SELECT, "--cache-dir", str(cache), "--rubric", str(rubric), "--out-dir", str(out)]
    args += ["--gradescope", "results.json", "--markdown", "report.md", "--jobs", "2", "--failures", *extra]
    cmd = [sys.executable, "-m", "spec_grading.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


NAMES = ("reference_copy", "honest", "recording_replay", "feedback_table")


@built_ahead
def gradings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fresh")
    rubric = tmp / "rubric.toml"
    rubric.write_text(RUBRIC)
    subs = tmp / "subs"
    ref = subs / "reference_copy"
    shutil.copytree(reference_dir(), ref, ignore=shutil.ignore_patterns("__pycache__"))
    table = replay_table(tmp / "recorded")
    packages = [
        ref,
        build(subs, "honest", {}),
        build(subs, "recording_replay", {"_replay_table.py": table}),
        build(subs, "feedback_table", {"_copied.py": copied_counts()}),
    ]
    runs = {}
    for label, extra in (("fresh", ()), ("handout", ("--seed", "0")), ("fixed", ("--seed", str(FIXED_SEED)))):
        proc = grade(packages, tmp / label, shared_cache(), rubric, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = {n: json.loads((tmp / label / n / "results.json").read_text()) for n in NAMES}
        reports = {n: (tmp / label / n / "report.md").read_text() for n in NAMES}
        runs[label] = {"proc": proc, "results": results, "reports": reports}
    return runs


def passed(results: dict) -> set[str]:
    return {t["name"] for t in results["tests"] if t["status"] == "passed"}


def test_grading_draws_a_fresh_seed_and_tells_only_staff(gradings):
    proc = gradings["fresh"]["proc"]
    seeds = re.findall(r"spec seed (\d+)", proc.stderr)
    assert seeds and int(seeds[0]) not in (0, FIXED_SEED)
    assert f"graded inputs drawn from spec seed {seeds[0]}" in proc.stdout  # the staff notes (--failures)
    for name in NAMES:
        visible = json.dumps(gradings["fresh"]["results"][name]) + gradings["fresh"]["reports"][name]
        assert seeds[0] not in visible, name
    assert "spec seed 0" in gradings["handout"]["proc"].stderr


@pytest.mark.parametrize("run", ["fresh", "handout", "fixed"])
def test_the_reference_scores_100_under_every_seed(gradings, run):
    assert gradings[run]["results"]["reference_copy"]["score"] == 100.0


def test_the_honest_verdicts_do_not_depend_on_the_seed(gradings):
    honest = [gradings[run]["results"]["honest"] for run in ("fresh", "handout", "fixed")]
    assert len({h["score"] for h in honest}) == 1 and 0 < honest[0]["score"] < 100
    assert passed(honest[0]) == passed(honest[1]) == passed(honest[2])


def test_the_attacks_gain_with_the_handouts_inputs(gradings):
    """The cheaters are real: given the handout's inputs, each passes tests the honest submission fails."""
    results = gradings["handout"]["results"]
    for name in ("recording_replay", "feedback_table"):
        assert results[name]["score"] > results["honest"]["score"], name
        assert passed(results[name]) > passed(results["honest"]), name


@pytest.mark.parametrize("run", ["fresh", "fixed"])
@pytest.mark.parametrize("name", ["recording_replay", "feedback_table"])
def test_replayed_answers_gain_nothing_under_a_grading_seed(gradings, run, name):
    results = gradings[run]["results"]
    assert results[name]["score"] == results["honest"]["score"]
    assert passed(results[name]) == passed(results["honest"])


def test_count_feedback_shows_no_expected_number(gradings):
    for run in ("fresh", "fixed"):
        tests = gradings[run]["results"]["honest"]["tests"]
        counts = [t for t in tests if t["name"].startswith("count_parameters") and t["status"] == "failed"]
        assert counts, run
        for t in counts:
            assert "more than expected (the expected number is not shown)" in t["output"]
            assert "counted twice" in t["output"]  # the parameter group it is off by
            assert not re.search(r"expected \d", t["output"]), t["output"]
