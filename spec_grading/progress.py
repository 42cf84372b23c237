"""The one progress bar (the grader's and the tools'): on stderr, redrawn in place on a terminal; otherwise
one line per step where ``every_step`` (the tools' logs) or at most every 10% (the grader's), or not at
all (``tty_only``), so logs stay readable. ``elapsed`` adds the seconds since the start."""

from __future__ import annotations

import sys
import threading
import time


class Progress:
    def __init__(
        self,
        total: int,
        label: str = "",
        stream=None,
        width: int = 30,
        tty_only: bool = False,
        every_step: bool = False,
        elapsed: bool = False,
    ):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.done = 0
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_decile = -1
        self.silent = tty_only and not self.tty
        self.every_step, self.elapsed, self._start = every_step, elapsed, time.perf_counter()
        self._lock = threading.Lock()

    def advance(self, note: str = "") -> None:
        with self._lock:
            self.done += 1
            if self.silent:
                return
            filled = int(self.width * self.done / self.total)
            bar = "#" * filled + "." * (self.width - filled)
            line = (f"{self.label} " if self.label else "") + f"[{bar}] {self.done}/{self.total}"
            if self.elapsed:
                line += f" {time.perf_counter() - self._start:5.0f}s"
            line += f" {note}" if note else ""
            if self.tty:
                self.stream.write("\r\x1b[2K" + line[:200])
                if self.done >= self.total:
                    self.stream.write("\n")
            else:
                decile = 10 * self.done // self.total
                if self.every_step or decile != self._last_decile or self.done >= self.total:
                    self._last_decile = decile
                    self.stream.write(line + "\n")
            self.stream.flush()
