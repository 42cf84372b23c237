"""Registers the suite's plugin when it is not installed as an entry point (e.g. in a handout)."""

pytest_plugins = ["spec_tests.plugin"]
