"""Which commit a workdir is, and whether it has changes: recorded with a run, never required.

One job: ask ``git`` (argv lists, no shell, a timeout) about a directory.  A machine
without git, a directory outside any repository, a repository git refuses (another
owner's, "dubious ownership") or a git that hangs all give unknowns, never an error: a
run's code is the snapshot that shipped (:mod:`clusterctl.code.snapshot`); the commit is
a label for people.

Contract:

``git_state(root) -> GitState``
    ``commit``: ``HEAD``'s full hash (None before the first commit); ``dirty``: whether
    ``git status --porcelain --untracked-files=normal -- .`` run in ``root`` lists
    anything, i.e. files under ``root`` differ from ``HEAD`` or are untracked and not
    ignored (changes elsewhere in the repository do not count); ``toplevel``: the work
    tree's top.  All three None outside a repository or without git.

``GIT_OPTIONAL_LOCKS=0``: ``git status`` would otherwise refresh and rewrite the index,
which takes the index lock and can make a ``git commit`` running beside it fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Seconds one git command may take (a status of a huge tree on a slow disk).
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GitState:
    """A workdir's commit, dirtiness and work tree top; None for what is not known."""

    commit: str | None
    dirty: bool | None
    toplevel: str | None


UNKNOWN = GitState(None, None, None)


def _git(root: Path, *args: str) -> str | None:
    """git's stdout, or None when git is missing, fails or takes longer than TIMEOUT_S.

    Its own process group, killed whole on timeout: a hung git's children (a hook, an
    fsmonitor, a credential helper) would otherwise keep its output open, and us waiting.
    """
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        proc = subprocess.Popen(["git", *args], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    if proc.returncode != 0:
        return None
    return out.decode("utf-8", "replace")


def git_state(root: Path | str) -> GitState:
    """The git state of ``root`` (see the module docstring); UNKNOWN when it cannot be known."""
    root = Path(root)
    toplevel = _git(root, "rev-parse", "--show-toplevel")
    if toplevel is None or not toplevel.strip():
        return UNKNOWN
    head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", ".")
    return GitState(commit=(head.strip() or None) if head is not None else None,
                    dirty=None if status is None else bool(status.strip()),
                    toplevel=toplevel.strip())
