"""What a catalogued bug is: the reference with exactly one plausible mistake, as a source patch."""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


def replace_once(text: str, old: str, new: str, what: str) -> str:
    """``text`` with ``old`` replaced by ``new``; ``old`` must occur exactly once (``what`` names the patch
    and the file in the error). Every source patch of the project goes through here: the catalog's, the
    independently seeded bugs', the project tests' copies of the reference."""
    count = text.count(old)
    if count != 1:
        raise ValueError(f"{what}: the old text occurs {count} times, expected once")
    return text.replace(old, new)


@dataclass(frozen=True)
class Bug:
    """One seeded mistake.

    ``old`` must occur exactly once in ``reference/<file>`` and is replaced by ``new``; the patched
    package is the buggy implementation (``--impl=bug:<name>``).

    - ``name``: snake_case identifier (also the module suffix ``_spec_bug_<name>``);
    - ``bug_class``: a key of ``classes.BUG_CLASSES`` (which test files are *meant* to catch it);
    - ``components``: the ``component=`` names of ``spec.check`` calls whose output the mistake
      changes; a failing check of one of them tries this bug in its diagnosis;
    - ``explanation``: what the buggy code does, one line, no final full stop;
    - ``fix``: what to do instead, one line, no final full stop;
    - ``corner``: True when the mistake only shows in a corner case (the most valuable kind);
    - ``code``: the diagnosis cause code (``spec_tests/harness/diagnosis/codes.py``) it stands for,
      where its class's code (``CLASS_CODES``) does not say it.
    """

    name: str
    bug_class: str
    components: tuple[str, ...]
    file: str
    old: str
    new: str
    explanation: str
    fix: str
    corner: bool = False
    code: str | None = None  # the cause code it stands for, where its class's code is too coarse

    def __post_init__(self):
        if not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"bug name must be snake_case, got {self.name!r}")
        if isinstance(self.components, str) or not self.components:
            raise ValueError(f"bug {self.name}: components must be a non-empty tuple, got {self.components!r}")
        if self.old == self.new:
            raise ValueError(f"bug {self.name}: the patch changes nothing")
        for field in ("explanation", "fix"):
            text = getattr(self, field)
            if not text or text.endswith(".") or "\n" in text:
                raise ValueError(f"bug {self.name}: {field} must be one line without a final full stop")
