"""Text that goes into a report: sanitised, capped, and written atomically.

Everything a report shows passes through ``clean``: the suite's ``plain_text``
(``spec_tests/harness/text.py``: lone surrogates become U+FFFD, since a string with one cannot be encoded as
UTF-8, which once left a 0-byte ``results.json``; ANSI escapes and control characters other than newline and
tab are removed; the text is cut at a cap with a marker saying how much was cut), with memory addresses
masked. Text from the upload (file names included) also goes through one of the
forms below, the only place where report text is made safe for its destination: ``one_line``
(terminal lines, JUnit properties), ``md_inline`` (Markdown outside code blocks), ``md_fence``
(Markdown code blocks nothing can close) and ``csv_cell`` (spreadsheet cells, formulas defused).
``write_atomic`` writes a file next to its destination and renames it into
place, so a reader (or a grader killed half-way) never sees a partial report.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

from spec_tests.harness.text import plain_text

MESSAGE_CAP = 4000  # characters of one test's output
_SURROGATES = re.compile("[\ud800-\udfff]")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def clean(value, cap: int = MESSAGE_CAP) -> str:
    """``value`` as safe, bounded text (``plain_text``: never raises), with memory addresses masked so
    that two reports of one grading compare equal."""
    return plain_text(_ADDRESS.sub("0x…", plain_text(value, sys.maxsize)), cap)


def one_line(value, cap: int = 300) -> str:
    """``value`` cleaned and on one line: newlines and tabs become ``⏎`` and spaces, so a file name
    holding ``\\n# Grade`` cannot start a line of its own in any report."""
    return clean(value, cap).replace("\r", "").replace("\n", " \u23ce ").replace("\t", " ")


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~=$&:])")


def md_inline(value, cap: int = 300) -> str:
    """``value`` as literal Markdown text on one line: every character Markdown (and GFM tables,
    HTML, links) gives a meaning is backslash-escaped."""
    return _MD_SPECIAL.sub(r"\\\1", one_line(value, cap))


def md_fence(text: str, info: str = "text") -> list[str]:
    """``text`` as a fenced code block that nothing inside it can close: the fence is one backtick
    longer than the longest run of backticks in ``text`` (at least three)."""
    runs = [len(m) for m in re.findall(r"`+", text)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [fence + info, text, fence]


_CSV_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value, cap: int = 2000) -> str:
    """``value`` (text from an upload) safe as a spreadsheet cell: one line, and a cell a spreadsheet
    could read as a formula (starting with ``= + - @``, tab or CR, also after leading spaces) gets a
    leading ``'``. The grader's own numbers are written as they are."""
    raw = value if isinstance(value, str) else clean(value, cap)
    text = one_line(raw, cap)
    if raw.lstrip(" ").startswith(_CSV_TRIGGERS):
        text = "'" + text
    return text


def clean_data(value, cap: int = MESSAGE_CAP):
    """Every string inside JSON-like data (dicts, lists) cleaned; keys too."""
    if isinstance(value, str):
        return clean(value, cap)
    if isinstance(value, dict):
        return {clean(k, 200): clean_data(v, cap) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_data(v, cap) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return clean(value, cap)


def write_atomic(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` via a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = clean_surrogates(text).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def clean_surrogates(text: str) -> str:
    """``text`` encodable as UTF-8 whatever it holds (the last line of defence before writing)."""
    return _SURROGATES.sub("\ufffd", text)
