"""The transformer spec suite: behaviours of protocol v1 and classic bug classes, checked against
the live reference. Run ``pytest spec_tests --impl=NAME``.

PYTEST_DONT_REWRITE: this package file holds no assertions; ``spec-check`` imports it before pytest
starts (pytest would warn "Module already imported"). The test modules are rewritten as usual.
"""
