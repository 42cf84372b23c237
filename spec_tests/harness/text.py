"""Text from outside the suite made safe to show: an implementation's messages, what crosses the wire
from a worker, an upload's file names. One function, ``plain_text``; the grader's report forms
(``spec_grading/textsafe.py``) build on it."""

from __future__ import annotations

import re

_SURROGATES = re.compile("[\ud800-\udfff]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def plain_text(value, cap: int = 4000) -> str:
    """``value`` as a plain ``str``, never raising (an object whose ``__str__`` raises is named by its type):
    lone surrogates become U+FFFD (a string with one cannot be encoded as UTF-8), ANSI escapes and control
    characters other than newline and tab are removed, and the text is cut at ``cap`` characters with a
    marker saying how many were cut."""
    if not isinstance(value, str):
        try:
            value = str(value)
        except Exception:  # noqa: BLE001 - what is shown must not depend on an object's __str__
            return f"<unprintable {type(value).__name__}>"
        if not isinstance(value, str):
            return f"<unprintable {type(value).__name__}>"
    text = str.__str__(value)
    if not text.isascii() or not text.isprintable():
        text = _CONTROL.sub("", _ANSI.sub("", _SURROGATES.sub("\ufffd", text)))
    if len(text) > cap:
        text = f"{text[:cap]}... [{len(text) - cap} more characters cut]"
    return text
