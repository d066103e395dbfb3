"""Errors that clusterctl reports to a user as a message, never as a traceback.

``UserError`` is bad input (a file, a flag, a value): exit status 2, and the
message says what was wrong, where, and what would be valid.  ``NodeError`` is a
failure on one node and always names it.
"""

from __future__ import annotations

import difflib

from clusterctl.core import exitcodes


class ClusterctlError(Exception):
    """Base of every error the CLI prints as a message instead of a traceback."""

    exit_code = exitcodes.FAILURE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UserError(ClusterctlError):
    """Bad input: an unknown name, a malformed value, a missing file. Exit 2."""

    exit_code = exitcodes.BAD_INPUT


class EnvironmentProblem(UserError):
    """Something the machine lacks (no Docker engine, not root, a missing package). Exit 2."""


class NodeError(ClusterctlError):
    """A failure on one node; the message always starts with the node's name."""

    def __init__(self, node: str, message: str, *, exit_code: int | None = None) -> None:
        self.node = node
        self.reason = message
        super().__init__(f"{node}: {message}", exit_code=exit_code)


def did_you_mean(word: str, choices: list[str] | tuple[str, ...] | set[str]) -> str:
    """' (did you mean "x"?)' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def one_of(choices, *, most: int = 50) -> str:
    """'a, b or c' for a message listing the valid values; past ``most`` values the list ends
    with how many more there are (a 100,000-node inventory is not one message)."""
    items = [str(c) for c in choices]
    if len(items) > most:
        return ", ".join(items[:most]) + f" or one of {len(items) - most:,} more"
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]
