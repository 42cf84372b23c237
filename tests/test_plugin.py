"""The suite's plugin as its users meet it: choosing an implementation, "not provided" skips,
"not implemented" one-liners, short crash reports, import failures, usage errors, expected-failure
files, the run header and summary, and staying out of other projects' test runs.
Each test runs pytest in a subprocess on a small slice of the suite."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from suite_subprocess import ROOT, run_suite


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def test_partial_implementation_skips_what_it_does_not_provide(tmp_path):
    """A file defining only silu passes its tests and skips the rest as "not provided by <file>"."""
    impl = write(
        tmp_path / "only_silu.py",
        """
        import torch
        def silu(x):
            return x * torch.sigmoid(x)
        """,
    )
    proc = run_suite(f"--impl={impl}", "-rs", "-k", "silu or rmsnorm")
    assert "3 passed" in proc.stdout and "skipped" in proc.stdout, proc.stdout[-2000:]
    assert f"not provided by {impl}: rmsnorm" in proc.stdout


def test_not_implemented_is_one_line_per_function(tmp_path):
    """A name raising NotImplementedError fails as "not implemented", summarised once per function,
    with no traceback and no per-test failure section."""
    impl = write(
        tmp_path / "stub.py",
        """
        def rmsnorm(x, weight, eps=1e-5):
            raise NotImplementedError("rmsnorm")
        """,
    )
    proc = run_suite(f"--impl={impl}", "-k", "test_rmsnorm")
    assert proc.returncode == 1
    assert "not implemented: rmsnorm: 4 tests" in proc.stdout, proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout and "raise NotImplementedError" not in proc.stdout
    assert "4 not implemented" in proc.stdout.splitlines()[-1]


def test_skeleton_run_is_short():
    """The untouched skeleton: one summary line per unimplemented function, not a section per test."""
    proc = run_suite("--impl=student")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) < 80, len(lines)
    assert any(line.startswith("not implemented: rmsnorm: ") for line in lines)
    counts = lines[-1].split(" in ")[0]  # e.g. "265 not implemented, 3 consequences" (deferring to those)
    assert counts.split(",")[0].endswith("not implemented") and "passed" not in counts and "skipped" not in counts


def test_not_implemented_deep_inside_names_the_entry_point(tmp_path):
    """NotImplementedError raised by a helper below a protocol call names both."""
    impl = write(
        tmp_path / "deep.py",
        """
        def _norm(x):
            raise NotImplementedError("my_norm_helper")
        def rmsnorm(x, weight, eps=1e-5):
            return _norm(x)
        """,
    )
    proc = run_suite(f"--impl={impl}", "-k", "test_rmsnorm and unit and f64")
    assert "not implemented: my_norm_helper (reached through rmsnorm)" in proc.stdout, proc.stdout[-2000:]


def test_a_crash_is_two_lines_and_the_traceback_is_on_request(tmp_path):
    """An exception inside the implementation is reported as its message and the line of the
    implementation that raised it; --spec-tb shows the full traceback."""
    impl = write(
        tmp_path / "crashy.py",
        """
        import torch
        def rmsnorm(x, weight, eps=1e-5):
            extra = torch.zeros(1)
            return torch.cat((x, extra), dim=1)
        """,
    )
    proc = run_suite(f"--impl={impl}", "-k", "test_rmsnorm and unit and f64")
    assert "RuntimeError: " in proc.stdout and f"raised at {impl.name}:5 in rmsnorm" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout and "site-packages" not in proc.stdout
    verbose = run_suite(f"--impl={impl}", "-k", "test_rmsnorm and unit and f64", "--spec-tb")
    assert "torch.cat((x, extra), dim=1)" in verbose.stdout


def test_import_failure_is_one_clear_error(tmp_path):
    """An implementation that raises on import gives one error naming the file and the exception."""
    impl = write(tmp_path / "broken.py", "x = 1 / 0\n")
    proc = run_suite(f"--impl={impl}")
    assert proc.returncode != 0
    assert f"implementation {impl} failed to import: ZeroDivisionError" in proc.stderr
    assert proc.stdout.count("Error") + proc.stderr.count("Traceback") <= 1


def test_unknown_impl_lists_the_accepted_forms():
    """An --impl naming nothing is a usage error listing every accepted form."""
    proc = run_suite("--impl=no_such_package_here")
    assert proc.returncode == 4
    assert "Accepted forms: reference | student | bug:<name> | pkg.mod | pkg.mod:object" in proc.stderr


def test_object_form_and_families(tmp_path):
    """pkg.mod:object works, and FAMILIES = ("gpt2",) skips llama-family tests as not provided."""
    write(
        tmp_path / "gpt2_only.py",
        """
        import types, reference
        impl = types.SimpleNamespace(
            FAMILIES=("gpt2",), build_model=reference.build_model, forward=reference.forward,
            canonical_state_dict=reference.canonical_state_dict,
        )
        """,
    )
    proc = run_suite("--impl=gpt2_only:impl", "-rs", "-k", "test_logits_match_reference", cwd=tmp_path)
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
    assert "not provided by gpt2_only:impl: family 'llama'" in proc.stdout


def test_capabilities_skip_what_is_not_supported(tmp_path):
    """CAPABILITIES without "gqa": GQA cases are skipped as not provided, MHA cases still run."""
    write(
        tmp_path / "mha_only.py",
        """
        from reference import *  # noqa: F403
        CAPABILITIES = ("tied_head", "untied_head", "linear_bias", "dropout", "free_d_ff", "rope_theta")
        """,
    )
    proc = run_suite("--impl=mha_only", "-rs", "-k", "test_repeat_kv or test_multihead_attention_layout", cwd=tmp_path)
    assert "capability gqa" in proc.stdout, proc.stdout[-2000:]
    assert "passed" in proc.stdout and "failed" not in proc.stdout


def test_any_value_error_passes_whatever_its_message(tmp_path):
    """Amendment 12: where the protocol asks for a ValueError, a subclass whose message names none of the bad
    values passes; naming them is advice, never a failure."""
    impl = write(
        tmp_path / "terse_errors.py",
        """
        import reference
        from reference import *  # noqa: F403

        class ConfigError(ValueError):
            pass

        def build_model(config, state_dict=None, **kw):
            try:
                return reference.build_model(config, state_dict, **kw)
            except ValueError:
                raise ConfigError("bad config") from None
        """,
    )
    proc = run_suite(f"--impl={impl}", "-k", "test_config_errors_raise")
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-2000:]


def test_expected_failures_are_strict(tmp_path):
    """An xfails file turns a known divergence into xfailed, and a listed test that passes into a failure."""
    impl = write(
        tmp_path / "eps_outside.py",
        """
        import torch
        def rmsnorm(x, weight, eps=1e-5):
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight
        def silu(x):
            return x * torch.sigmoid(x)
        """,
    )
    xfails = write(
        tmp_path / "x.toml",
        """
        [xfail]
        "test_norms.py::test_rmsnorm[f64-small]" = "eps outside the root"
        "test_primitives.py::test_silu[f64]" = "not really failing"
        """,
    )
    proc = run_suite(f"--impl={impl}", f"--spec-xfails={xfails}", "-k", "test_rmsnorm or test_silu")
    assert "XPASS(strict)" in proc.stdout and "xfailed" in proc.stdout, proc.stdout[-2000:]


def test_header_names_the_implementation_and_warns_about_the_default():
    """The run header says which implementation is checked, and that the default is the reference."""
    plain = run_suite("-k", "test_silu and f64", "--co", "-v")
    assert "spec suite: checking reference  (the reference: the ground truth itself." in plain.stdout
    student = run_suite("--impl=student", "-k", "test_silu and f64", "--co", "-v")
    assert "spec suite: checking student" in student.stdout and "ground truth itself" not in student.stdout


def test_the_plugin_leaves_other_projects_alone(tmp_path):
    """An unrelated project in the same environment: its own --device and --impl options, its
    Hypothesis settings and torch's thread count are untouched by the installed suite."""
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            """
            import torch
            THREADS = torch.get_num_threads()

            def pytest_addoption(parser):
                parser.addoption("--device", default="cpu")
                parser.addoption("--impl", default="mine")
            """
        )
    )
    (tmp_path / "test_other.py").write_text(
        textwrap.dedent(
            """
            import os

            import torch
            from hypothesis import given, settings, strategies as st
            import conftest

            SEEN = []

            @given(st.integers())
            def test_property(n):
                SEEN.append(n)

            def test_settings_and_threads(request):
                assert request.config.getoption("device") == "cpu"
                assert request.config.getoption("impl") == "mine"
                # what Hypothesis itself defaults to in this environment (its "ci" profile under CI=true)
                expected = os.environ["EXPECTED_HYPOTHESIS"]
                assert f"{settings.default.max_examples} {settings.default.derandomize}" == expected
                assert torch.get_num_threads() == conftest.THREADS

            def test_property_ran_with_the_default_examples():
                assert len(SEEN) > 10
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEC_", "HYPOTHESIS"))}
    plain = "from hypothesis import settings as s; print(s.default.max_examples, s.default.derandomize)"
    env["EXPECTED_HYPOTHESIS"] = subprocess.run(
        [sys.executable, "-c", plain], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout
    assert "spec suite" not in proc.stdout


def test_spec_check_runs_an_adapter_from_another_folder(tmp_path):
    """`spec-check --impl=module` (and `pytest --pyargs spec_tests --spec-impl=...`) work outside the checkout."""
    write(
        tmp_path / "my_silu.py",
        """
        import torch
        def silu(x):
            return x * torch.sigmoid(x)
        """,
    )
    cmd = [sys.executable, "-m", "spec_tests.harness.cli", "--impl=my_silu", "-q", "-p", "no:warnings", "-k", "silu"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert str(ROOT) not in str(tmp_path)


def test_summary_traces_consequences_through_names_that_failed_only_as_consequences():
    from spec_tests.harness.results import TestVerdict
    from spec_tests.harness.terminal import summary_lines

    verdicts = [
        TestVerdict("t_rope", "positions", ["rope"], "failed", [], "wrong"),
        TestVerdict("t_forward", "model", ["forward"], "consequence", ["rope"], "consequence of failing rope"),
        TestVerdict("t_cache", "kv_cache", ["cache_kv"], "consequence", ["forward"], "forward is failing"),
        TestVerdict("t_norm", "norms", ["rmsnorm"], "failed", [], "wrong"),
    ]
    lines = summary_lines("x", verdicts, {"rope": ["t_rope"], "rmsnorm": ["t_norm"]})
    causes = lines[lines.index("root causes, fix these first:") + 1 :]
    assert causes[:2] == [  # dependency order, then own failures, then by name
        "  rmsnorm: 1 failing test(s) of its own",
        "  rope: 1 failing test(s) of its own; 2 other failure(s) trace back to it",
    ], lines
    assert not any("forward" in line for line in causes)


def test_tests_downstream_of_an_expected_failure_are_judged_as_usual(tmp_path):
    """An expected failure is a declared divergence, not a failing function: a test downstream of it
    that fails is a failure to declare too, never a consequence that fails the run unannounced."""
    own = ["test_rope[f64]", "test_rope[f32]", "test_rope_honours_theta"]
    own += ["test_rope_positions_scattered_and_broadcast", "test_rope_frequencies"]
    xfails = tmp_path / "xfails.toml"
    xfails.write_text("[xfail]\n" + "".join(f'"test_positions.py::{t}" = "declared"\n' for t in own))
    proc = run_suite(
        "--impl=bug:rope_frequency_exponent", f"--spec-xfails={xfails}", "-k", "rope", "-rfE", cwd=tmp_path
    )
    out = proc.stdout
    assert proc.returncode == 1 and "5 xfailed" in out, out
    for case in ("mha", "gqa"):  # rerun with a correct rope they would pass: judged anyway
        test = f"test_attention.py::test_multihead_attention_with_rope[{case}]"
        assert re.search(rf"^FAILED \S*{re.escape(test)}( |$)", out, re.MULTILINE), out
