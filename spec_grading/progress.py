"""A progress bar on stderr: redrawn in place on a terminal, one line per step (at most every 10%)
otherwise (or not at all, ``tty_only``), so logs stay readable."""

from __future__ import annotations

import sys
import threading


class Progress:
    def __init__(self, total: int, label: str, stream=None, width: int = 30, tty_only: bool = False):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.done = 0
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_decile = -1
        self.silent = tty_only and not self.tty
        self._lock = threading.Lock()

    def advance(self, note: str = "") -> None:
        with self._lock:
            self.done += 1
            if self.silent:
                return
            filled = int(self.width * self.done / self.total)
            bar = "#" * filled + "." * (self.width - filled)
            line = f"{self.label} [{bar}] {self.done}/{self.total}" + (f" {note}" if note else "")
            if self.tty:
                self.stream.write("\r\x1b[2K" + line[:200])
                if self.done >= self.total:
                    self.stream.write("\n")
            else:
                decile = 10 * self.done // self.total
                if decile != self._last_decile or self.done >= self.total:
                    self._last_decile = decile
                    self.stream.write(line + "\n")
            self.stream.flush()
