"""Which slurm.conf the Slurm clients of a run use: SLURM_CONF, a sandbox's, or their default.

A newcomer starts a sandbox with Slurm (``clusterctl sandbox up --nodes 2 --slurm``) and
runs ``launch --scheduler slurm --nodes inventories/sandbox.yaml`` without exporting
SLURM_CONF: the inventory is that sandbox's, so its slurm.conf is the one meant
(:func:`sandbox_for`, pure).  A SLURM_CONF that names no readable file is refused before
any Slurm client runs (:func:`conf_problem`), with exit 2: each client would retry it for
a minute.  Otherwise nothing changes: a site's clients find their own conf
(``/etc/slurm/slurm.conf``, or configless).

:func:`slurm_env` is the thin part (it reads the sandboxes' state files and the file
system); ``launch``, ``logs``, ``status``, ``stop`` and ``runs`` of a Slurm run call it
with the run's inventory (a later command: the inventory recorded with the run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterctl.core.errors import UserError

DEFAULT_CONF = "/etc/slurm/slurm.conf"   # Debian's slurm-client default (configure --sysconfdir)


@dataclass(frozen=True)
class SandboxSlurm:
    """A sandbox with Slurm as its state file records it (paths resolved by the caller)."""

    name: str
    inventory: str     # its inventory file
    conf: str          # its slurm.conf


def sandbox_for(env: Mapping[str, str], inventory: str | None,
                sandboxes: Sequence[SandboxSlurm]) -> SandboxSlurm | None:
    """The sandbox whose Slurm the clients should use: only when SLURM_CONF is not in
    ``env`` and ``inventory`` (resolved) is that sandbox's inventory; else None (the
    environment's SLURM_CONF, or the clients' own default, stands)."""
    if "SLURM_CONF" in env or not inventory:
        return None
    want = os.path.normpath(inventory)
    return next((sb for sb in sandboxes if os.path.normpath(sb.inventory) == want), None)


def conf_problem(path: str, *, exists: bool, is_dir: bool, is_file: bool,
                 readable: bool) -> str | None:
    """Why SLURM_CONF=``path`` cannot be used (the file system's facts in), or None."""
    if not path:
        return "empty"
    if not exists:
        return "no such file"
    if not is_file:
        return "a directory, not a file" if is_dir else "not a regular file"
    if not readable:
        return "not readable by this user"
    return None


def bad_conf_message(path: str, problem: str) -> str:
    """The exit-2 message for an unusable SLURM_CONF: what it is and what is valid."""
    return (f"SLURM_CONF={path}: {problem}, so no Slurm client can run; valid: the path of the "
            "cluster's slurm.conf (a sandbox's: `clusterctl sandbox status` shows it), or unset "
            "SLURM_CONF: with a sandbox's inventory in --nodes its Slurm is used, else the "
            f"Slurm clients' default ({DEFAULT_CONF}). Nothing was asked of Slurm.")


def note_line(sb: SandboxSlurm) -> str:
    return f'using the Slurm of sandbox "{sb.name}": SLURM_CONF={sb.conf}'


# --------------------------------------------------------------------------- the thin part

def recorded_sandboxes() -> list[SandboxSlurm]:
    """The sandboxes with Slurm on this machine, from their state files (nothing is asked)."""
    from clusterctl.cluster import sandbox  # the sandbox package: only when a Slurm run needs it

    return [SandboxSlurm(sb.name, str(Path(sb.inventory_path).resolve()), sb.slurm_conf)
            for sb in sandbox.recorded() if sb.slurm and sb.slurm_conf and sb.inventory_path]


def slurm_env(inventory: str | Path | None, *, env: Mapping[str, str] | None = None,
              note: Callable[[str], None] | None = None) -> dict[str, str]:
    """The Slurm clients' environment for a run on ``inventory`` (None: ``--nnodes``):
    ``env`` (default this process's), with the sandbox's SLURM_CONF when the inventory is
    a sandbox's and SLURM_CONF is unset (``note`` gets the one line that says so).
    UserError (exit 2) when SLURM_CONF is set to a path that is not a readable file."""
    env = dict(os.environ if env is None else env)
    if "SLURM_CONF" in env:
        path = env["SLURM_CONF"]
        problem = conf_problem(path, exists=bool(path) and os.path.exists(path),
                               is_dir=bool(path) and os.path.isdir(path),
                               is_file=bool(path) and os.path.isfile(path),
                               readable=bool(path) and os.access(path, os.R_OK))
        if problem:
            raise UserError(bad_conf_message(path, problem))
        return env
    if inventory is None or str(inventory) == "":
        return env
    sb = sandbox_for(env, str(Path(inventory).resolve()), recorded_sandboxes())
    if sb is not None:
        env["SLURM_CONF"] = sb.conf
        if note is not None:
            note(note_line(sb))
    return env
