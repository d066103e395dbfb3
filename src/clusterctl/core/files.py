"""Files written whole and work done one process at a time: the two rules of local state.

:func:`write_atomic` writes a file so that a reader sees the old or the new content, never a
half (a temporary file in the same directory, renamed over the target); :func:`one_at_a_time`
holds an exclusive ``flock`` on a lock file so two clusterctl processes on this machine do a
piece of work one after the other (the second is told it waits, then usually finds the work
done).

Everything here may meet a directory other users write into (a shared runs directory): a
file is never opened through a symlink (``O_NOFOLLOW``), a file created is created
exclusively (``O_EXCL``), what is read must be a regular file of bounded size, a lock is
waited on for a bounded time, and a permission problem becomes a :class:`UserError` that
names the file and what to fix, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import pwd
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from clusterctl.core.errors import UserError

#: Open flags that never follow a symlink nor wait on a FIFO.
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
#: The most a record, claim or cache file read back may hold.
READ_LIMIT = 8 << 20


def user_name(uid: int) -> str:
    """The password database's name of ``uid``, else the uid as digits (what every message
    naming a file's owner says)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def denied(path: Path, doing: str, e: OSError) -> UserError:
    """A permission or type problem with ``path`` as a message saying what to fix."""
    try:
        st = os.lstat(path)
        owner = user_name(st.st_uid)
        what = (" (a symlink: clusterctl never follows one here; remove it)" if stat.S_ISLNK(st.st_mode)
                else f" (owner {owner}, mode {stat.S_IMODE(st.st_mode):04o})")
    except OSError:
        what = ""
    return UserError(f"cannot {doing} {path}{what}: {e.strerror or e}. Its owner can fix it "
                     "(`chmod a+r` for reading), or point CLUSTERCTL_RUNS at a directory of your own.")


def read_regular(path: Path, *, limit: int = READ_LIMIT) -> tuple[str, os.stat_result]:
    """The text of the regular file ``path`` and its stat, never through a symlink, never
    waiting on a FIFO, at most ``limit`` bytes.  OSError (ELOOP for a symlink) when it cannot
    be opened; ValueError when it is not a regular file or too large."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} is {st.st_size} bytes, more than {limit} a record may hold")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} grew past {limit} bytes")
    return data.decode("utf-8", errors="replace"), st


class TooLarge(UserError):
    """:func:`read_input`'s refusal of a file larger than its limit (a caller may say it its way)."""


def read_input(path: str | os.PathLike, what: str, *, limit: int, valid: str) -> bytes:
    """The bytes of the file ``path`` a user named or a tool left (a ``what`` such as "the
    requirements file"), read the one way every such file is read: it must be a regular file
    (a FIFO is never waited on, a directory or device never read), of at most ``limit`` bytes
    (a huge file is never read whole).  A symlink is followed: the user named the path.
    UserError naming the file, what is wrong and ``valid`` (what would be), otherwise;
    FileNotFoundError passes through for the caller to say what a missing file means."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UserError(f"{path}: cannot read {what} ({e.strerror or e}); valid: {valid}.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file; nothing "
                            f"was read from it; valid: {valid}.")
        if st.st_size > limit:
            raise TooLarge(f"{path}: {what} is {st.st_size} bytes, larger than {limit // 1024} KiB, "
                           f"far more than it may hold (is this the right file?); valid: {valid}.")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UserError(f"{path}: cannot read {what} ({e.strerror or e}); valid: {valid}.") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(f"{path}: {what} grew past {limit} bytes while read; valid: {valid}.")
    return data


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def open_text(path: Path) -> IO[str]:
    """``path`` opened to read as text (bad bytes replaced), never through a symlink and only a
    regular file: a log may be streamed whole, so it is not size-bounded.  UserError naming the
    file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as e:
        raise denied(path, "read", e) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file; nothing was read from it.")
    return os.fdopen(fd, encoding="utf-8", errors="replace")


#: Opening one directory below the root: never through a symlink.
_DIR_BELOW = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
#: The most of a file a follower reads at a time (a line longer than this comes in pieces).
CHUNK = 1 << 20


def _below_refusal(where: Path, root: Path, dir_fd: int, name: str, e: OSError) -> Exception:
    """Why ``name`` (``where``, in the directory ``dir_fd``) could not be opened, as a message."""
    if isinstance(e, FileNotFoundError):
        return FileNotFoundError(e.errno, e.strerror, str(where))
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return denied(where, "read", e)
    if stat.S_ISLNK(st.st_mode):
        return UserError(f"cannot read {where} (a symlink: clusterctl never follows one here, nor "
                         f"anywhere below {root}); nothing was read through it. Remove it (someone "
                         "may have planted it) and run again.")
    if e.errno == errno.ENOTDIR:
        return UserError(f"{where} is {_kind(st.st_mode)} where a directory should be; nothing was "
                         "read from it. Remove it and run again.")
    return denied(where, "read", e)


def open_below(root: Path, path: Path) -> IO[bytes]:
    """The regular file ``path``, below the directory ``root`` (the runs directory, the code
    store), opened to read in binary: read it in chunks, it may be large.

    Opened one component at a time from ``root`` (``openat`` with ``O_NOFOLLOW``): a symlink at
    any component below ``root`` is refused, never followed (``root`` itself may be one: the
    user named it; a ``path`` not below ``root`` is opened from its own directory).  A FIFO is
    never waited on (``O_NONBLOCK``), only a regular file is read, and only one owned by the
    caller or by the owner of the directory holding it (a file another user put there is not
    read).  FileNotFoundError when a component is missing (nothing written yet); UserError
    naming the file and what to fix otherwise."""
    root, path = Path(root), Path(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        root, parts = path.parent, (path.name,)
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{path} is not a file below {root}")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise denied(root, "read", e) from None
    where = root
    try:
        for i, name in enumerate(parts):
            where = where / name
            try:
                nfd = os.open(name, _DIR_BELOW if i < len(parts) - 1 else os.O_RDONLY | _NOFOLLOW,
                              dir_fd=fd)
            except OSError as e:
                raise _below_refusal(where, root, fd, name, e) from None
            holder = os.fstat(fd)
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{where} is {_kind(st.st_mode)}, not a regular file; nothing was read "
                            "from it. Remove it (someone may have planted it) and run again.")
        if st.st_uid not in (os.geteuid(), holder.st_uid):
            raise UserError(f"{where} belongs to {user_name(st.st_uid)}, not to the owner of its "
                            f"directory ({user_name(holder.st_uid)}) nor to you; nothing was read from "
                            "it. Remove it (someone else put it there) and run again.")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return f


def read_below(root: Path, path: Path, *, limit: int = READ_LIMIT) -> bytes:
    """The bytes of the regular file ``path`` below ``root`` (:func:`open_below`), at most
    ``limit``: UserError naming the file when it holds more.  FileNotFoundError when missing."""
    with open_below(root, path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise UserError(f"{path} is {max(size, len(data))} bytes, more than the {limit} bytes "
                            "clusterctl ever writes there; nothing was read from it. Remove it and "
                            "run again.")
    return data


def read_from(root: Path, path: Path, offset: int, *, limit: int = CHUNK) -> bytes:
    """What the regular file ``path`` below ``root`` (:func:`open_below`) holds from byte
    ``offset``, at most ``limit`` bytes (b"" when nothing new: call again for more).
    FileNotFoundError when missing."""
    with open_below(root, path) as f:
        return os.pread(f.fileno(), limit, offset)


def lines_below(root: Path, path: Path, *, max_line: int) -> Iterator[str]:
    """The text lines of the regular file ``path`` below ``root`` (:func:`open_below`), bad
    bytes replaced, read as a stream: a line longer than ``max_line`` characters comes in
    pieces, so the file is never held whole.  FileNotFoundError when missing."""
    with io.TextIOWrapper(open_below(root, path), encoding="utf-8", errors="replace") as f:
        while line := f.readline(max_line):
            yield line


def open_append(path: Path, mode: int = 0o644) -> IO[str]:
    """``path`` opened to append text, created (with ``mode``) when missing, never through a
    symlink; ValueError when it is not a regular file, UserError when it is not ours to write."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, mode)
    except OSError as e:
        raise denied(path, "write", e) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UserError(f"{path} is not a regular file of yours (owner uid {st.st_uid}); nothing was "
                        "written to it. Remove it (someone else put it there) and run again.")
    return os.fdopen(fd, "a", encoding="utf-8")


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = 0o644) -> None:
    """``data`` to ``path`` whole or not at all; ``mode``: the file's permission bits (default
    readable by all: records and claims are read by the users who share them).  The temporary
    file is created exclusively (``mkstemp``) and renamed over ``path``: a symlink planted at
    ``path`` is replaced, never followed.  UserError naming the file when it is not ours to
    write (a sticky shared directory refuses to replace another user's file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except PermissionError as e:
        raise denied(path.parent, "write into", e) from None
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        try:
            os.replace(tmp, path)
        except PermissionError as e:
            raise denied(path, "replace", e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _lock_fd(path: Path) -> int:
    """A read-only descriptor of the lock file ``path`` (``flock`` needs no write access, so
    one user's lock file serves every user who can read it), created exclusively (0644) when
    missing; never through a symlink, never anything but a regular file."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except FileNotFoundError:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644))
            except FileExistsError:
                pass            # another process made it first: open theirs
            except OSError as e:
                raise denied(path, "create the lock", e) from None
            continue
        except OSError as e:
            raise denied(path, "open the lock", e) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UserError(f"the lock {path} is not a regular file; remove it and run again.")
        return fd
    raise UserError(f"the lock {path} keeps disappearing; run again.")


@contextlib.contextmanager
def one_at_a_time(path: Path, on_wait: Callable[[str], None], what: str, *,
                  timeout: float | None = None) -> Iterator[None]:
    """Hold the exclusive lock ``path`` while the block runs; ``on_wait`` hears it when another
    process holds it (``waiting for another <what> (<path>)``).  ``timeout``: seconds to wait
    at most (None: as long as it takes), then UserError naming the lock."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make the directory {path.parent} (of the lock that lets one "
                        f"{what} run at a time): {e.strerror or e}; nothing was started. Make it yours (its parent "
                        "writable by you), or point clusterctl at a directory of your own: "
                        "CLUSTERCTL_CACHE (or XDG_CACHE_HOME) for its cache, CLUSTERCTL_RUNS "
                        "for its runs.") from None
    fd = _lock_fd(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait(f"waiting for another {what} ({path})")
            if timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                _wait_lock(fd, path, what, timeout)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _wait_lock(fd: int, path: Path, what: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= end:
                raise UserError(f"another {what} has held {path} for more than {timeout:g} s; "
                                "nothing was started. Run again when it is done (`fuser "
                                f"{path}` names the process holding it).") from None
            time.sleep(0.05)
