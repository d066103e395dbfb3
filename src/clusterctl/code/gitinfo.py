"""Which commit a workdir is, and whether it has changes: recorded with a run, never required.

One job: ask ``git`` (argv lists, no shell, a timeout) about a directory.  For the
commit, a machine without git, a directory outside any repository, a repository git
refuses (another owner's, "dubious ownership") or a git that hangs all give unknowns,
never an error: a run's code is the snapshot that shipped
(:mod:`clusterctl.code.snapshot`); the commit is a label for people.  What ships is
another matter: inside a repository git cannot list, :func:`listed` says so
(:class:`Unlisted`) rather than let a walk guess what git's ignore sources leave out.

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
    ``root``.  Below a gitlink (a submodule, an untracked nested repository) git does not
    look, so the same is asked of that repository's own git, in it, and its names join
    the listing; one git cannot list is named in ``Listed.unlisted`` with why.  None
    outside a repository (git says so, or git cannot be asked and no ``.git`` is above
    ``root``); :class:`Unlisted` when ``root`` is inside one but git cannot list it
    (missing, too slow, refusing another user's repository: "dubious ownership"), since
    what its ignore sources leave out is then unknown; ``TooMany`` past ``max_entries``.
``repository_above(root) -> Path | None``
    The work tree top a ``.git`` in ``root`` or a parent marks, as git's own discovery
    finds it (stopping below ``GIT_CEILING_DIRECTORIES``), without running git.

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
from dataclasses import dataclass, field
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
    """git's stdout, or None when git is missing, fails or takes longer than TIMEOUT_S."""
    return _call(root, *args)[0]


def _call(root: Path, *args: str) -> tuple[bytes | None, str]:
    """(git's stdout, "") or (None, why not: git's own words when it gave some).

    Its own process group, killed whole on timeout: a hung git's children (a hook, an
    fsmonitor, a credential helper) would otherwise keep its output open, and us waiting.
    """
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        proc = subprocess.Popen(["git", "-c", "core.fsmonitor=false", *args], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except FileNotFoundError:
        return None, "git is not installed (no git on PATH)"
    except OSError as e:
        return None, f"git cannot be run ({e.strerror})"
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"`git {args[0]}` did not answer within {TIMEOUT_S:g} s"
    if proc.returncode != 0:
        return None, _why(err, args[0], proc.returncode)
    return out, ""


def _why(stderr: bytes, command: str, status: int) -> str:
    """git's reason for failing: its first ``fatal:``/``error:`` line, else its exit status."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    for line in lines:
        for prefix in ("fatal: ", "error: "):
            if line.startswith(prefix):
                return line[len(prefix):][:300]
    said = f": {lines[0][:300]}" if lines else ""
    return f"`git {command}` failed with exit status {status}{said}"


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


class Unlisted(Exception):
    """A directory is inside a git repository, but git cannot list it."""

    def __init__(self, why: str, repository: Path) -> None:
        super().__init__(f"{repository}: {why}")
        self.why = why                  # git's own words where it gave some
        self.repository = repository    # the work tree top (or the directory asked)


@dataclass(frozen=True)
class Listed:
    """What ``git ls-files --cached --others --exclude-standard`` lists in a directory,
    nested repositories' own listings included."""

    files: frozenset[str]      # files and symbolic links, relative, '/'-separated
    gitlinks: frozenset[str]   # submodules and untracked nested repositories (no trailing /)
    dirs: frozenset[str]       # every directory above a listed entry
    unlisted: dict[str, str] = field(default_factory=dict)  # nested repositories git cannot list: why

    def has(self, path: str, is_dir: bool) -> bool:
        """Whether git lists ``path`` (a directory: whether it lists anything below it, or
        it is a nested repository git cannot list, for the caller to name)."""
        if is_dir and path in self.unlisted:
            return True
        return path in (self.dirs if is_dir else self.files)


def _names(out: bytes) -> list[str]:
    return [os.fsdecode(n) for n in out.split(b"\0") if n]


def _is_repository(d: str) -> bool:
    """Whether ``d/.git`` is what git takes for a repository: a directory with ``HEAD``,
    ``objects/`` and ``refs/``, or a ``gitdir:`` file (a worktree, a submodule)."""
    dot_git = os.path.join(d, ".git")
    try:
        if os.path.isdir(dot_git):
            return (os.path.isfile(os.path.join(dot_git, "HEAD"))
                    and os.path.isdir(os.path.join(dot_git, "objects"))
                    and os.path.isdir(os.path.join(dot_git, "refs")))
        if os.path.isfile(dot_git):
            with open(dot_git, "rb") as f:
                return f.read(8) == b"gitdir: "
    except OSError:
        return False
    return False


def repository_above(root: Path | str) -> Path | None:
    """The work tree top that a ``.git`` in ``root`` or a parent marks (see the module docstring)."""
    ceilings = {os.path.realpath(c) for c in os.environ.get("GIT_CEILING_DIRECTORIES", "").split(":")
                if os.path.isabs(c)}
    d = os.path.realpath(root)
    while True:
        if _is_repository(d):
            return Path(d)
        parent = os.path.dirname(d)
        if parent == d or parent in ceilings:  # git does not go up into a ceiling directory
            return None
        d = parent


def listed(root: Path | str, max_entries: int) -> Listed | None:
    """What git lists in ``root`` (see the module docstring); None outside a repository."""
    root = Path(root)
    inside, why = _call(root, "rev-parse", "--is-inside-work-tree")
    top = repository_above(root)
    if inside is None:
        if top is None:
            return None
        raise Unlisted(why, top)
    if inside.strip() != b"true":     # inside a .git directory
        return None
    return _listing(root, top or root, max_entries)


def _listing(root: Path, top: Path, max_entries: int) -> Listed:
    """``root``'s listing, in the work tree whose top is ``top``; Unlisted when git cannot."""
    staged, why = _call(root, "ls-files", "-z", "--cached", "--stage")
    if staged is None:
        raise Unlisted(why, top)
    others, why = _call(root, "ls-files", "-z", "--others", "--exclude-standard")
    if others is None:
        raise Unlisted(why, top)
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
    unlisted: dict[str, str] = {}
    nested_links: set[str] = set()
    for link in sorted(gitlinks):
        below = root / link
        if not _is_repository(str(below)):   # a submodule not checked out: nothing is there
            continue
        try:
            inner = _listing(below, below, max_entries - len(files) - len(gitlinks))
        except Unlisted as e:
            unlisted[link] = e.why
            continue
        files.update(f"{link}/{p}" for p in inner.files)
        nested_links.update(f"{link}/{p}" for p in inner.gitlinks)
        unlisted.update({f"{link}/{p}": w for p, w in inner.unlisted.items()})
        if len(files) + len(gitlinks) > max_entries:
            raise TooMany
    gitlinks |= nested_links
    dirs = {path.rsplit("/", i)[0] for path in files | set(unlisted)
            for i in range(1, path.count("/") + 1)}
    return Listed(frozenset(files), frozenset(gitlinks), frozenset(dirs), unlisted)
