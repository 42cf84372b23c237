"""``spec-check``: run the spec suite against an implementation from any folder.

    spec-check --impl my_pkg.adapter            # a module on sys.path
    spec-check --impl path/to/adapter.py -q     # a file; further arguments go to pytest
    spec-check --impl student -k rmsnorm
    spec-check --impl my_pkg.adapter --write-xfails my_adapter.xfails.toml   # start green and strict

The installed suite runs as ``pytest --pyargs spec_tests --spec-impl=...`` (the same as
``python -m pytest --pyargs spec_tests --spec-impl=...``), so it works outside a checkout too.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="spec-check", description=__doc__.split("\n\n")[0], add_help=True)
    parser.add_argument("--impl", required=True, help="the implementation to check (as pytest spec_tests --impl=)")
    parser.add_argument(
        "--write-xfails",
        metavar="FILE",
        help="write every test that did not pass to FILE, an expected-failure file for --spec-xfails / SPEC_XFAILS",
    )
    args, rest = parser.parse_known_args(argv)
    if args.write_xfails:
        rest = [f"--spec-write-xfails={args.write_xfails}", *rest]
    import os

    import pytest

    if os.getcwd() not in sys.path:  # as `python -m pytest` would: modules in this folder are importable
        sys.path.insert(0, os.getcwd())

    return int(pytest.main(["--pyargs", "spec_tests", f"--spec-impl={args.impl}", "-p", "no:cacheprovider", *rest]))


if __name__ == "__main__":
    sys.exit(main())
