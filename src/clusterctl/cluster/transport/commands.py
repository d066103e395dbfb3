"""Remote commands: argv in, one safely quoted command line out, and what the command did.

Remote commands are argv lists.  The only way a command string is made is
:func:`command_line` (``shlex.join``), so no user value (label, env value, image
name) can ever be interpreted by the remote shell.  The remote login shell must
be POSIX-compatible (sh, bash, dash, zsh), as for OpenSSH itself.

Contract: :func:`command_line`, :class:`CommandResult`, :func:`short` (a command
cut to a readable length for messages).  Pure: no I/O, nothing else of the
transport package imported.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from clusterctl.core.errors import NodeError

_STDERR_TAIL = 800


def command_line(argv: Sequence[str | os.PathLike]) -> str:
    """The remote command string for ``argv``: ``shlex.join``, the only way one is made.

    A plain string is refused (it would be run by the shell as-is), as is a NUL
    byte (it cannot travel inside an SSH exec request).
    """
    if isinstance(argv, str | bytes):
        raise TypeError("a remote command must be an argv list, not a string")
    items = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
    if not items:
        raise ValueError("a remote command needs at least one argument")
    for a in items:
        if not isinstance(a, str):
            raise TypeError(f"remote command arguments must be strings, got {a!r}")
        if "\0" in a:
            raise ValueError(f"a remote command argument cannot contain a NUL byte: {a!r}")
    return shlex.join(items)


@dataclass
class CommandResult:
    """What one remote command did on one node (exit_code -1: killed by a signal)."""

    node: str
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> CommandResult:
        """Self when it exited 0, else NodeError(node, "<cmd> exited N: <stderr tail>")."""
        if self.exit_code != 0:
            raise NodeError(self.node, _exit_message(self.argv, self.exit_code, self.stderr))
        return self


def _exit_message(argv: Sequence[str], code: int, stderr: str) -> str:
    tail = stderr.strip()
    if len(tail) > _STDERR_TAIL:
        tail = "..." + tail[-_STDERR_TAIL:]
    msg = (f"`{short(argv)}` was killed by a signal (no exit status)" if code == -1
           else f"`{short(argv)}` exited {code}")
    return f"{msg}: {tail}" if tail else msg


def short(argv: Sequence[str], limit: int = 120) -> str:
    line = command_line(argv)
    return line if len(line) <= limit else line[: limit - 3] + "..."

