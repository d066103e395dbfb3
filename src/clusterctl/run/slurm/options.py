"""``launch --scheduler slurm`` options, checked before anything is rendered or submitted.

Pure: :func:`check_options` turns what the user typed into :class:`SlurmOptions` or
raises UserError (exit 2) naming the option, what is wrong and what would be valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterctl.cluster.runtime import DEFAULT_RUNTIME, RUNTIMES
from clusterctl.core.errors import UserError, one_of
from clusterctl.core.text import shown

#: Container modes: docker run --net=host on each node, or pyxis/enroot's srun flags.
CONTAINER_MODES = ("docker", "podman", "pyxis")

# sbatch --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds", or UNLIMITED/INFINITE.
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)\Z", re.ASCII)
#: The most nodes a Slurm job here may ask for (Slurm's own node table is far smaller).
MAX_NODES = 100_000
#: The longest time limit a number may say: 365 days, in minutes (longer: UNLIMITED).
MAX_MINUTES = 365 * 24 * 60


def _time_ok(time: str) -> bool:
    """Whether ``time`` is an sbatch ``--time`` of at most :data:`MAX_MINUTES`: minutes and
    seconds after hours under 60, hours after days under 24."""
    if not _TIME.match(time):
        return False
    if time in ("UNLIMITED", "INFINITE"):
        return True
    days, dash, rest = time.partition("-")
    rest = rest if dash else time
    parts = [int(p) for p in rest.split(":")]
    if dash:                                   # D-H, D-H:M, D-H:M:S
        h, m, sec = (parts + [0, 0])[:3]
        fits = h < 24
    elif len(parts) == 3:                      # H:M:S
        h, m, sec = parts
        fits = True
    else:                                      # M, M:S
        h, m, sec = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
        fits = True
    minutes = (int(days) if dash else 0) * 1440 + h * 60 + m
    return fits and sec < 60 and (m < 60 or len(parts) < 3 and not dash) and minutes <= MAX_MINUTES


# A partition or node name as Slurm writes them: no spaces, commas or shell syntax.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True)
class SlurmOptions:
    """What sbatch is asked for: nodes (a count, and their names when an inventory gave
    them), partition, time limit, container mode."""

    nnodes: int
    container: str = "docker"
    partition: str | None = None
    time: str | None = None
    nodelist: tuple[str, ...] = ()


def container_mode(given: str | None, runtimes: dict[str, str], source: str) -> str:
    """The container mode of a Slurm run: ``--container`` when given, else the runtime the
    inventory gives its nodes (``runtimes``: node -> ``runtime``, read from ``source``),
    else docker. One sbatch script serves every node, so its nodes must agree: UserError
    when they differ and no mode is given, or when a given docker/podman is not theirs."""
    kinds = sorted(set(runtimes.values()))
    first = {kind: next(n for n, r in runtimes.items() if r == kind) for kind in kinds}
    named = ", ".join(f"{kind} ({first[kind]})" for kind in kinds)
    if given is None:
        if len(kinds) > 1:
            raise UserError(f"{source}: the nodes' runtime differs: {named}; one sbatch script serves "
                            "every node with one runtime; valid: the same `runtime` on every node, or "
                            "--container pyxis. Nothing was submitted.")
        return kinds[0] if kinds else DEFAULT_RUNTIME
    if given in RUNTIMES and kinds and kinds != [given]:
        raise UserError(f"--container {given}: {source} gives its nodes runtime {named}; valid: "
                        f"--container {kinds[0] if len(kinds) == 1 else 'pyxis'}, or leave --container "
                        "out to use the inventory's. Nothing was submitted.")
    return given


def check_options(*, nnodes: int | None = None, partition: str | None = None,
                  time: str | None = None, container: str = "docker",
                  nodelist: tuple[str, ...] | list[str] = ()) -> SlurmOptions:
    """The checked options; ``nodelist`` (an inventory's node names, which must be Slurm
    node names) fixes the node count unless ``--nnodes`` agrees with it."""
    if container not in CONTAINER_MODES:
        raise UserError(f"--container {shown(container)} is not a container mode; valid: "
                        f"{one_of(CONTAINER_MODES)} (docker: `docker run --net=host` on each "
                        "node; podman: `podman run --net=host` on each node; pyxis: srun "
                        "--container-image, for sites with pyxis/enroot).")
    if nnodes is not None and not 1 <= nnodes <= MAX_NODES:
        raise UserError(f"--nnodes {nnodes} is not a node count; valid: a whole number from 1 to "
                        f"{MAX_NODES:,}.")
    nodelist = tuple(nodelist)
    for name in nodelist:
        if not _NAME.match(name):
            raise UserError(f"inventory node name {shown(name)} is not a Slurm node name; valid: "
                            "letters, digits, '_', '.', '-' (the names `sinfo -N` lists).")
    if nodelist and nnodes is not None and nnodes != len(nodelist):
        raise UserError(f"--nnodes {nnodes} disagrees with the inventory's {len(nodelist)} nodes; "
                        "give one of --nnodes N or --nodes FILE.")
    if nnodes is None and not nodelist:
        raise UserError("--scheduler slurm needs the node count: --nnodes N (Slurm chooses the "
                        "nodes) or --nodes FILE (those nodes, by name).")
    if partition is not None and not (len(partition) <= 255 and _NAME.match(partition)):
        raise UserError(f"--partition {shown(partition)} is not a partition name; valid: at most "
                        "255 letters, digits, '_', '.', '-' (`sinfo -s` lists the partitions).")
    if time is not None and not _time_ok(time):
        raise UserError(f"--time {shown(time)} is not a Slurm time limit; valid: MINUTES, MM:SS, "
                        "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (hours under 24 after days, minutes "
                        "and seconds under 60, at most 365 days) or UNLIMITED (e.g. --time 30 or "
                        "--time 1-12:00:00).")
    return SlurmOptions(nnodes=nnodes or len(nodelist), container=container,
                        partition=partition, time=time, nodelist=nodelist)
