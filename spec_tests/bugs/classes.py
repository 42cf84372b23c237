"""The bug classes live in ``spec_tests/bug_classes.py`` (the suite's markers need them where the
catalog is not shipped); re-exported here for the catalog."""

from ..bug_classes import BUG_CLASSES, related_files

__all__ = ["BUG_CLASSES", "related_files"]
