"""The user a root command acts for: who ran ``sudo clusterctl ...``, and handing files to them.

Under sudo clusterctl runs as root, but what it makes for the user who asked (the sandbox's
client key and inventory, the Docker engines' sockets) must be that user's, so that the
commands after it work without sudo.  sudo names that user in ``SUDO_UID``, ``SUDO_GID``
and ``SUDO_USER`` (FIELD-NOTES §6).  :func:`invoker` reads them: None when not running as
root, not under sudo, or when root itself ran sudo.  :func:`hand_over` gives paths to that
user, never through a symbolic link (a link planted at a path has the link itself changed,
not what it points to).

Contract: :class:`Invoker`, :func:`invoker`, :func:`hand_over`.
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
