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

``listed(root, max_entries) -> Listed | None``
    What git itself would put in a commit of ``root``: ``git ls-files --cached --others
    --exclude-standard`` run in ``root`` (every ignore source git reads: ``.gitignore`` in
    ``root`` and its parents, ``info/exclude``, ``core.excludesFile``), as names relative to
    ``root``; gitlinks (submodules, nested repositories) apart.  None outside a work tree,
    without git or when git refuses the repository; ``TooMany`` past ``max_entries``.

``GIT_OPTIONAL_LOCKS=0``: ``git status`` would otherwise refresh and rewrite the index,
which takes the index lock and can make a ``git commit`` running beside it fail.
``core.fsmonitor=false``: a repository's own config may name an fsmonitor command, which
git would run for ``status`` and ``ls-files``; a workdir is data, never a program we run.
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
    """git's stdout as text, or None (see :func:`_git_bytes`)."""
    out = _git_bytes(root, *args)
    return None if out is None else out.decode("utf-8", "replace")


def _git_bytes(root: Path, *args: str) -> bytes | None:
    """git's stdout, or None when git is missing, fails or takes longer than TIMEOUT_S.

    Its own process group, killed whole on timeout: a hung git's children (a hook, an
    fsmonitor, a credential helper) would otherwise keep its output open, and us waiting.
    """
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        proc = subprocess.Popen(["git", "-c", "core.fsmonitor=false", *args], cwd=root, env=env, stdin=subprocess.DEVNULL,
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
    return out


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


class TooMany(Exception):
    """git lists more entries than the caller reads."""


@dataclass(frozen=True)
class Listed:
    """What ``git ls-files --cached --others --exclude-standard`` lists in a directory."""

    files: frozenset[str]      # files and symbolic links, relative, '/'-separated
    gitlinks: frozenset[str]   # submodules and untracked nested repositories (no trailing /)
    dirs: frozenset[str]       # every directory above a listed entry

    def has(self, path: str, is_dir: bool) -> bool:
        """Whether git lists ``path`` (a directory: whether it lists anything below it)."""
        if self.under_gitlink(path):
            return True
        return path in (self.dirs if is_dir else self.files)

    def under_gitlink(self, path: str) -> bool:
        """Whether ``path`` is a gitlink or below one (git does not look inside: we do)."""
        return any(path == g or path.startswith(g + "/") for g in self.gitlinks)


def _names(out: bytes) -> list[str]:
    return [os.fsdecode(n) for n in out.split(b"\0") if n]


def listed(root: Path | str, max_entries: int) -> Listed | None:
    """What git lists in ``root`` (see the module docstring); None when git cannot say."""
    root = Path(root)
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside is None or inside.strip() != "true":
        return None
    staged = _git_bytes(root, "ls-files", "-z", "--cached", "--stage")
    others = _git_bytes(root, "ls-files", "-z", "--others", "--exclude-standard")
    if staged is None or others is None:
        return None
    files: set[str] = set()
    gitlinks: set[str] = set()
    for line in _names(staged):       # "MODE OBJECT STAGE\tPATH"
        meta, _, path = line.partition("\t")
        (gitlinks if meta.startswith("160000") else files).add(path)
        if len(files) + len(gitlinks) > max_entries:
            raise TooMany
    for path in _names(others):
        if path.endswith("/"):        # an untracked repository: git does not enter it
            gitlinks.add(path.rstrip("/"))
        else:
            files.add(path)
        if len(files) + len(gitlinks) > max_entries:
            raise TooMany
    dirs = {path.rsplit("/", i)[0] for path in files | gitlinks for i in range(1, path.count("/") + 1)}
    return Listed(frozenset(files), frozenset(gitlinks), frozenset(dirs))
