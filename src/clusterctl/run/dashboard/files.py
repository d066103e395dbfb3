"""The dashboard's only way to the disk: files under the runs directory, read without
following a link, in bounded pieces.

A runs directory may be shared, and what is in it may have been put there by someone else
(a run directory or a ``merged.log`` replaced by a link to ``/etc/shadow``, a FIFO that would
block a reader for ever).  So every file is opened one directory at a time from the runs
directory itself (``openat`` with ``O_NOFOLLOW``: a link anywhere below the runs directory
is refused, not followed), must be a regular file (``O_NONBLOCK``: a FIFO does not block the
open), and is read with ``pread`` up to a limit: a request never reads a whole log.

Contract: :class:`RunsDir` (``records()``: every readable run record, newest first;
``record(run_id)``; ``read_lines(run_id, parts, after=, limit=)``: complete lines from a byte
offset, or the tail) and :class:`Refused` (a name or a file that is not served).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from clusterctl.core.errors import UserError
from clusterctl.run import records

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

#: A run.json larger than this is not a record clusterctl wrote (a 1,000-node run's is ~2 MB).
RECORD_LIMIT = 16 * 1024 * 1024
#: At most this much of a log per request (the page asks again from where it stopped).
CHUNK = 256 * 1024
#: Without an offset, the last this much of a log (from its first whole line).
TAIL = 64 * 1024


class Refused(Exception):
    """A name or a file the dashboard does not serve; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Lines:
    """Complete lines of a file from byte ``start`` to ``next`` (where to ask from next time)."""

    start: int
    next: int
    size: int
    lines: list[str]
    reset: bool = False   # the file is shorter than the offset asked for: read from its start

    def json(self) -> dict:
        return {"start": self.start, "next": self.next, "size": self.size, "lines": self.lines,
                "reset": self.reset}


def _name(part: str) -> str:
    if not part or part in (".", "..") or "/" in part or "\0" in part:
        raise Refused(400, f"{part!r} is not a file name under the runs directory")
    return part


def run_id_of(text: str) -> str:
    """``text`` when it is a valid run id (:func:`clusterctl.run.records.check_run_id`), else
    Refused 400 with the rule."""
    try:
        return records.check_run_id(text)
    except UserError as e:
        raise Refused(400, e.message.replace("--run-id ", "run id ", 1)) from None


def _valid(name: str) -> bool:
    try:
        records.check_run_id(name)
    except UserError:
        return False
    return True


class RunsDir:
    """The runs directory ``root`` (the directory itself may be a link: the user named it)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @contextmanager
    def _open(self, parts: list[str]) -> Iterator[tuple[int, int]]:
        """An fd of the regular file ``root/parts[0]/.../parts[-1]``, no link followed below
        root, and one of the directory holding it."""
        fds: list[int] = []
        try:
            try:
                fds.append(os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError as e:
                raise Refused(404, f"no runs directory {self.root} ({e.strerror})") from None
            where = self.root
            for part in parts[:-1]:
                where = where / _name(part)
                fds.append(self._openat(fds[-1], part, _DIR, where))
            where = where / _name(parts[-1])
            fd = self._openat(fds[-1], parts[-1], _FILE, where)
            fds.append(fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused(403, f"{where} is not a regular file; not served")
            yield fd, fds[-2]
        finally:
            for fd in reversed(fds):
                os.close(fd)

    @staticmethod
    def _openat(dir_fd: int, name: str, flags: int, where: Path) -> int:
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            raise Refused(404, f"no {where}") from None
        except OSError as e:   # ELOOP: a link (O_NOFOLLOW); ENOTDIR: a link or a file for a dir
            raise Refused(403, f"{where} is a link or not what it should be ({e.strerror}); "
                               "not served") from None

    def _run_ids(self) -> list[str]:
        try:
            with os.scandir(self.root) as entries:
                return [e.name for e in entries if e.is_dir(follow_symlinks=False) and _valid(e.name)]
        except OSError:
            return []

    def record(self, run_id: str) -> records.RunRecord:
        """The record of ``run_id`` (Refused 400 for a bad id, 404 when there is none)."""
        run_id = run_id_of(run_id)
        where = self.root / run_id / records.RECORD_NAME
        with self._open([run_id, records.RECORD_NAME]) as (fd, dir_fd):
            st, d = os.fstat(fd), os.fstat(dir_fd)
            if st.st_size > RECORD_LIMIT:
                raise Refused(403, f"{where} is {st.st_size} bytes, more than a run record; not served")
            data = os.pread(fd, st.st_size, 0)
        try:           # the one check `clusterctl runs` makes: owner, run id, usable values
            return records.trusted(data, st, d, run_id)
        except records.RecordError as e:
            raise Refused(403, f"{where} is not to be trusted: {e}; not served") from None
        except (ValidationError, ValueError):
            raise Refused(404, f"{where} is not a valid run record") from None

    def records(self) -> list[records.RunRecord]:
        """Every readable run record, newest first (as ``clusterctl runs``); a directory that is
        a link, or holds no valid record, is skipped."""
        found = []
        for run_id in self._run_ids():
            try:
                found.append(self.record(run_id))
            except Refused:
                continue
        found.sort(key=lambda r: (r.started, r.run_id), reverse=True)
        return found

    def read_lines(self, run_id: str, parts: list[str], *, after: int | None = None,
                   limit: int = CHUNK, tail: int = TAIL) -> Lines:
        """Complete lines of ``runs/RUN/parts...`` from byte ``after`` (at most ``limit`` bytes;
        a line longer than that comes in pieces), or without ``after`` the last ``tail``
        bytes' whole lines.  A last line without its newline yet is left for the next call."""
        run_id = run_id_of(run_id)
        with self._open([run_id, *parts]) as (fd, _):
            size = os.fstat(fd).st_size
            reset = after is not None and after > size
            start = max(0, size - tail) if after is None else (0 if reset else after)
            data = os.pread(fd, min(limit, size - start), start)
        if after is None and start > 0:           # the tail starts at its first whole line
            cut = data.find(b"\n")
            start, data = (start + cut + 1, data[cut + 1:]) if cut >= 0 else (start, data)
        end = data.rfind(b"\n")
        if end >= 0:
            data = data[:end + 1]
        elif len(data) < limit:
            data = b""                            # a line still being written
        text = data.decode("utf-8", errors="replace")
        lines = [line.rstrip("\r") for line in text.split("\n")]
        if lines and lines[-1] == "":
            lines.pop()
        return Lines(start=start, next=start + len(data), size=size, lines=lines, reset=reset)
