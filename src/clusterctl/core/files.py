"""Files written whole and work done one process at a time: the two rules of local state.

:func:`write_atomic` writes a file so that a reader sees the old or the new content, never a
half (a temporary file in the same directory, renamed over the target); :func:`one_at_a_time`
holds an exclusive ``flock`` on a lock file so two clusterctl processes on this machine do a
piece of work one after the other (the second is told it waits, then usually finds the work
done).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """``data`` to ``path`` whole or not at all; ``mode``: the file's permission bits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def one_at_a_time(path: Path, on_wait: Callable[[str], None], what: str) -> Iterator[None]:
    """Hold the exclusive lock ``path`` while the block runs; ``on_wait`` hears it when another
    process holds it (``waiting for another <what> (<path>)``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait(f"waiting for another {what} ({path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
