"""Independently written implementations with one classic mistake each (not copies of the
reference), used to show that the suite's diagnosis names a bug by comparing outputs."""
