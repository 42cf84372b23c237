"""The transformer spec suite: behaviours of protocol v1 and classic bug classes, checked against
the live reference. Run ``pytest spec_tests --impl=NAME``."""
