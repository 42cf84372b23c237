"""Copying an upload as data: no link followed, only regular files and folders, within limits.

An upload is whatever a student handed in; the process copying it may be root, outside any
sandbox. So nothing in it is followed or opened by name alone: folders are opened relative to
their parent's descriptor with ``O_NOFOLLOW``, every entry is classified by ``lstat`` before it is
touched, and a regular file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked again with
``fstat`` (a file swapped for a link or a FIFO in between is refused, not followed or waited on).

- A symbolic link is dropped (neither followed nor copied), and named with its target text.
- A device, FIFO or socket is dropped and named.
- A file over ``max_file_bytes`` is dropped and named; so is a folder deeper than ``max_depth``.
- More than ``max_entries`` entries (of any kind, dropped ones included), more than
  ``max_total_bytes`` copied, or more than ``max_seconds`` spent: the copy stops, what was copied is
  removed, and ``CopyReport.refused_all`` says which limit was hit.

Names in the report lines are quoted with ``ascii()`` (no newline, control or non-ASCII
character survives) and cut, so an upload's names cannot forge a report. ``UploadLimits``'s
defaults are the only place the limits are set (docs/grading.md states them).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CHUNK = 1 << 20
SHOWN_REFUSALS = 20  # lines naming dropped entries; the rest are counted


@dataclass(frozen=True)
class UploadLimits:
    max_entries: int = 10_000  # files, folders, links, anything: every entry of the upload
    max_depth: int = 32  # folders below the top one
    max_total_bytes: int = 50_000_000  # of all files copied
    max_file_bytes: int = 5_000_000  # of one file (a larger one is dropped)
    max_seconds: float = 60.0  # wall time of the whole copy

    def __post_init__(self):
        for name in ("max_entries", "max_depth", "max_total_bytes", "max_file_bytes", "max_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"UploadLimits.{name} must be a number >= 0, got {value!r}")


@dataclass
class CopyReport:
    """What a copy did: ``refused`` names each entry not copied (one line each, the first
    ``SHOWN_REFUSALS``, then a count); ``refused_all`` is set when a limit stopped the whole copy."""

    files: int = 0
    folders: int = 0
    bytes: int = 0
    entries: int = 0
    refused_all: str | None = None
    refused: list[str] = field(default_factory=list)
    dropped: int = 0  # entries not copied (refused ones and skipped ones with a reason)

    def note(self, line: str) -> None:
        self.dropped += 1
        if len(self.refused) < SHOWN_REFUSALS:
            self.refused.append(line)
        elif len(self.refused) == SHOWN_REFUSALS:
            self.refused.append("")  # placeholder for the count, filled in by lines()

    def lines(self) -> list[str]:
        """Every line a report should show: the limit that stopped the copy, then each drop."""
        out = [f"refused: the whole upload: {self.refused_all}"] if self.refused_all else []
        shown = [line for line in self.refused if line]
        out += shown
        if self.dropped > len(shown):
            out.append(f"... and {self.dropped - len(shown)} more entries not staged")
        return out


class _Stop(Exception):
    """A limit that ends the whole copy."""


def quote(name: str, cap: int = 160) -> str:
    """``name`` as one safe line: ASCII only, escapes visible, backticks replaced, cut at ``cap``."""
    text = ascii(name)
    if text[:1] == "'" and text[-1:] == "'":
        text = text[1:-1]
    text = text.replace("`", "'")
    return text if len(text) <= cap else f"{text[: cap // 2]}...{text[-cap // 2 :]}"


_KIND = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


def kind_of(mode: int) -> str:
    return _KIND.get(stat.S_IFMT(mode), f"a special file (type {stat.S_IFMT(mode):o})")


def copy_upload(
    source: str | os.PathLike,
    target: str | os.PathLike,
    limits: UploadLimits | None = None,
    *,
    skip: Callable[[str, bool], str | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CopyReport:
    """Copy the file or folder ``source`` to ``target`` (which must not exist) as data: files 0644,
    folders 0755. ``skip(name, is_folder)`` drops an entry: ``None`` keeps it, ``""`` drops it without a
    report line (caches), any other text drops it with that text as the reason.
    ``source`` itself is the caller's choice and may be reached through a link; nothing below it is
    followed. On ``refused_all`` nothing is left at ``target``."""
    limits = limits or UploadLimits()
    report = CopyReport()
    started = clock()
    source, target = os.fspath(source), os.fspath(target)
    if os.path.lexists(target):
        raise FileExistsError(f"copy_upload: {target} exists already")
    copier = _Copier(limits, report, skip, clock, started)
    try:
        info = os.stat(source)  # the top is the caller's choice: it may be a link
        if stat.S_ISDIR(info.st_mode):
            fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.mkdir(target, 0o755)
                os.chmod(target, 0o755)
                report.folders += 1
                copier.folder(fd, target, "", 0)
            finally:
                os.close(fd)
        elif stat.S_ISREG(info.st_mode):
            parent, name = os.path.split(os.path.realpath(source))
            fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                copier.entries(1)
                copier.file(fd, name, target, quote(name), top=True)
            finally:
                os.close(fd)
        else:
            report.refused_all = f"it is {kind_of(info.st_mode)}, not a file or a folder"
    except _Stop as stop:
        report.refused_all = str(stop)
    if report.refused_all:
        _remove(target)
    return report


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


class _Copier:
    def __init__(self, limits, report, skip, clock, started):
        self.limits, self.report, self.skip, self.clock, self.started = limits, report, skip, clock, started

    def tick(self) -> None:
        if self.clock() - self.started > self.limits.max_seconds:
            raise _Stop(f"staging took longer than {self.limits.max_seconds:g} s (the time limit)")

    def entries(self, n: int) -> None:
        self.report.entries += n
        if self.report.entries > self.limits.max_entries:
            raise _Stop(f"more than {self.limits.max_entries} entries (the entry-count limit)")
        self.tick()

    def skipped(self, name: str, is_folder: bool, shown: str) -> bool:
        why = self.skip(name, is_folder) if self.skip is not None else None
        if why:
            self.report.note(f"not staged: {shown}{'/' if is_folder else ''} ({why})")
        return why is not None

    def folder(self, fd: int, target: str, rel: str, depth: int) -> None:
        with os.scandir(fd) as it:
            names = []
            for entry in it:  # counted while listed: a folder of millions stops at the limit
                self.entries(1)
                names.append(entry.name)
        for name in sorted(names):
            shown = quote(f"{rel}{name}")
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                self.report.note(f"refused: {shown} (vanished while staging)")
                continue
            mode = info.st_mode
            if stat.S_ISLNK(mode):
                try:
                    where = os.readlink(name, dir_fd=fd)
                except OSError:
                    where = "?"
                self.report.note(f"refused: link {shown} -> {quote(where)} (links are not followed or copied)")
            elif stat.S_ISDIR(mode):
                if self.skipped(name, True, shown):
                    continue
                if depth + 1 > self.limits.max_depth:
                    self.report.note(
                        f"refused: folder {shown}/ is deeper than {self.limits.max_depth} folders (the depth limit)"
                    )
                    continue
                try:
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    self.report.note(f"refused: folder {shown}/ could not be opened ({exc.strerror})")
                    continue
                try:
                    sub = os.path.join(target, name)
                    os.mkdir(sub, 0o755)
                    os.chmod(sub, 0o755)
                    self.report.folders += 1
                    self.folder(child, sub, f"{rel}{name}/", depth + 1)
                finally:
                    os.close(child)
            elif stat.S_ISREG(mode):
                if self.skipped(name, False, shown):
                    continue
                self.file(fd, name, os.path.join(target, name), shown)
            else:
                self.report.note(f"refused: {shown} is {kind_of(mode)} (only regular files and folders are staged)")

    def file(self, dir_fd: int, name: str, target: str, shown: str, *, top: bool = False) -> None:
        limits, report = self.limits, self.report
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            if top:
                raise _Stop(f"{shown} could not be opened ({exc.strerror}; a link is not followed)") from None
            report.note(f"refused: {shown} could not be opened ({exc.strerror})")
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # swapped after the lstat
                why = f"{shown} is {kind_of(info.st_mode)} (only regular files and folders are staged)"
                if top:
                    raise _Stop(why)
                report.note(f"refused: {why}")
                return
            if info.st_size > limits.max_file_bytes:
                why = f"{shown} is {info.st_size} bytes, over the per-file limit of {limits.max_file_bytes}"
                if top:
                    raise _Stop(why)
                report.note(f"refused: {why}")
                return
            if report.bytes + info.st_size > limits.max_total_bytes:
                raise _Stop(f"more than {limits.max_total_bytes} bytes in all (the total-size limit)")
            copied = 0
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                while True:
                    chunk = os.read(fd, CHUNK)
                    if not chunk:
                        break
                    copied += len(chunk)
                    if copied > limits.max_file_bytes:  # it grew while being read
                        raise _Stop(f"{shown} grew past the per-file limit of {limits.max_file_bytes} bytes")
                    if report.bytes + copied > limits.max_total_bytes:
                        raise _Stop(f"more than {limits.max_total_bytes} bytes in all (the total-size limit)")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                    self.tick()
                os.fchmod(out, 0o644)
            finally:
                os.close(out)
            report.files += 1
            report.bytes += copied
        finally:
            os.close(fd)
