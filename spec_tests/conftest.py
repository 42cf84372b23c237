"""The suite's fixtures and its short ``--impl`` option, scoped to spec_tests/ (the plugin itself,
``spec_tests.harness.plugin.hooks``, registers only ``--spec-*`` options)."""

pytest_plugins = ["spec_tests.harness.plugin.hooks"]

from spec_tests.harness.plugin.fixtures import device, dtype, family, impl, spec  # noqa: E402,F401
from spec_tests.harness.plugin.hooks import add_short_impl_option  # noqa: E402


def pytest_addoption(parser):
    add_short_impl_option(parser)
