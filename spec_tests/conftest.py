"""The suite's fixtures and its short ``--impl`` option, scoped to spec_tests/ (the plugin itself,
``spec_tests.harness.plugin``, registers only ``--spec-*`` options)."""

pytest_plugins = ["spec_tests.harness.plugin"]

from spec_tests.harness.fixtures import device, dtype, family, impl, spec  # noqa: E402,F401
from spec_tests.harness.plugin import add_short_impl_option  # noqa: E402


def pytest_addoption(parser):
    add_short_impl_option(parser)
