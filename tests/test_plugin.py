"""The suite's plugin as its users meet it: choosing an implementation, "not provided" skips,
"not implemented" one-liners, import failures, usage errors and expected-failure files.
Each test runs pytest in a subprocess on a small slice of the suite."""

import textwrap
from pathlib import Path

from suite_subprocess import run_suite


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def test_partial_implementation_skips_what_it_does_not_provide(tmp_path):
    """A file defining only silu passes its test and skips the rest as "not provided by <file>"."""
    impl = write(
        tmp_path / "only_silu.py",
        """
        import torch
        def silu(x):
            return x * torch.sigmoid(x)
    """,
    )
    proc = run_suite(f"--impl={impl}", "-rs", "-k", "silu or rmsnorm")
    assert "2 passed" in proc.stdout and "skipped" in proc.stdout, proc.stdout[-2000:]
    assert f"not provided by {impl}: rmsnorm" in proc.stdout


def test_not_implemented_is_one_line(tmp_path):
    """A name raising NotImplementedError fails with the single line "not implemented: <name>"."""
    impl = write(
        tmp_path / "stub.py",
        """
        def rmsnorm(x, weight, eps=1e-5):
            raise NotImplementedError("rmsnorm")
    """,
    )
    proc = run_suite(f"--impl={impl}", "-k", "test_rmsnorm")
    assert proc.returncode == 1
    assert "not implemented: rmsnorm" in proc.stdout
    assert "Traceback" not in proc.stdout and "raise NotImplementedError" not in proc.stdout


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
    proc = run_suite(f"--impl={impl}", "-k", "test_rmsnorm and unit-f64")
    assert "not implemented: my_norm_helper (reached through rmsnorm)" in proc.stdout


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
        "test_norms.py::test_rmsnorm[unit-f64]" = "eps outside the root, on purpose"
        "test_primitives.py::test_silu[f64]" = "claimed to fail, but passes"
    """,
    )
    proc = run_suite(
        f"--impl={impl}", f"--xfails-file={xfails}", "-k", "test_rmsnorm and unit-f64 or test_silu and f64"
    )
    assert "1 failed" in proc.stdout and "1 xfailed" in proc.stdout, proc.stdout[-2000:]
    assert "XPASS(strict)" in proc.stdout


def test_failure_names_the_matching_bug(tmp_path):
    """An independently written rmsnorm with eps outside the root is told which catalogued bug it matches."""
    impl = write(
        tmp_path / "eps_outside.py",
        """
        def rmsnorm(x, weight, eps=1e-5):
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight
    """,
    )
    proc = run_suite(f"--impl={impl}", "-k", "test_rmsnorm and small-f64")
    assert "matches known bug rmsnorm_eps_outside_root" in proc.stdout, proc.stdout[-2000:]
    assert "Fix:" in proc.stdout
