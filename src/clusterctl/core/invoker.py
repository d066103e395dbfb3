"""The user a root command acts for: who ran ``sudo clusterctl ...``, and handing files to them.

Under sudo clusterctl runs as root, but what it makes for the user who asked (the sandbox's
client key and inventory, the Docker engines' sockets) must be that user's, so that the
commands after it work without sudo.  sudo names that user in ``SUDO_UID``, ``SUDO_GID``
and ``SUDO_USER`` (FIELD-NOTES §6).  :func:`invoker` reads them: None when not running as
root, not under sudo, or when root itself ran sudo.  :func:`hand_over` gives paths to that
user, never through a symbolic link (a link planted at a path has the link itself changed,
not what it points to).

Contract: :class:`Invoker`, :func:`invoker`, :func:`hand_over`, :func:`owner_of_place`,
:func:`hand_over_tree`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Invoker:
    """The user who ran clusterctl through sudo."""

    uid: int
    gid: int
    name: str


def invoker(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Invoker | None:
    """The user who ran this root process through sudo; None when the process is not root,
    was not started by sudo, or sudo was run by root (pure with both arguments given)."""
    env = os.environ if environ is None else environ
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    try:
        uid, gid = int(env["SUDO_UID"]), int(env["SUDO_GID"])
    except (KeyError, ValueError):
        return None
    if uid <= 0 or gid < 0:
        return None
    return Invoker(uid, gid, env.get("SUDO_USER") or str(uid))


def hand_over(*paths: Path, group: bool = True, to: Invoker | None = None) -> Invoker | None:
    """Give each existing path to ``to`` (default: :func:`invoker`): owner, and the group
    too unless ``group`` is False (a Docker socket keeps the group that may use it).  A
    symbolic link is changed itself, never followed; a missing path is skipped.  Returns
    the user the paths went to; None (nothing changed) when no one ran clusterctl through sudo."""
    who = to or invoker()
    if who is None:
        return None
    for path in paths:
        try:
            os.chown(path, who.uid, who.gid if group else -1, follow_symlinks=False)
        except FileNotFoundError:
            continue
    return who


def owner_of_place(dest: Path) -> tuple[Invoker, Path] | None:
    """The invoker, and ``dest``'s nearest existing ancestor (``dest`` itself included),
    when that ancestor is the invoker's: a place in their own space (their checkout), where
    what a root command writes for them must be theirs afterwards.  None when no one ran
    clusterctl through sudo or the place is someone else's (say, root's ``/opt``)."""
    who = invoker()
    if who is None:
        return None
    place = Path(dest).absolute()
    while not os.path.lexists(place) and place != place.parent:
        place = place.parent
    try:
        return (who, place) if os.lstat(place).st_uid == who.uid else None
    except OSError:
        return None


def hand_over_tree(top: Path, below: Path, to: Invoker) -> None:
    """Give ``top``, everything under it, and the directories between ``below`` (an
    existing ancestor, left as it is) and ``top`` to ``to``.  Links are changed themselves,
    never followed, and a file with other hard links (a wheel linked from a cache) keeps
    its owner: the directory holding it is the user's, so they can still remove it."""
    top = Path(top).absolute()
    below = Path(below).absolute()
    between = [p for p in top.parents if p != below and below in p.parents]
    for path in [*between, top]:
        hand_over(path, to=to)
    if not top.is_dir() or top.is_symlink():
        return
    for root, dirs, files in os.walk(top):   # os.walk never descends into a linked directory
        for name in dirs + files:
            path = Path(root) / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not os.path.isdir(path) and st.st_nlink > 1 and not os.path.islink(path):
                continue
            hand_over(path, to=to)
