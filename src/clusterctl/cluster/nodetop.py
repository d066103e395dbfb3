"""``clusterctl top``'s read of the nodes: ONE bounded SSH command per node, all at once.

Each node runs one ``sh -c`` script (:func:`read_script`) that prints, in marked sections:

* ``stats``: the node runtime's :meth:`~clusterctl.cluster.runtime.base.ContainerRuntime.stats`
  of the run's container there (``docker stats --no-stream``: CPU %, memory);
* ``gpu``: the first tool the node has, ``nvidia-smi`` (:data:`~clusterctl.core.nodestats.NVIDIA_SMI_QUERY`)
  or Cambricon's ``cnmon`` (:data:`~clusterctl.core.nodestats.CNMON_QUERY`), its name on the
  section's first line (``none`` when it has neither);
* ``metrics``: the container's last ``log_lines`` output lines (the runtime's ``logs --tail``)
  that hold the metrics line (``clusterctl-metrics {...}``), at most ``keep`` of them.

The script runs through :func:`clusterctl.cluster.execute.run_everywhere` (the tree or a
connection per node, bounded in time and output, as ``clusterctl exec``), so a node that does
not answer within ``timeout`` + ``grace`` seconds is named with why, never waited on.
:func:`parse_read` turns a node's output into a :class:`NodeRead` (pure).

Contract: :func:`read_script`, :func:`parse_read` (pure), :func:`read_nodes`, :class:`Where`,
:class:`NodeRead`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clusterctl.cluster.execute import Target, run_everywhere
from clusterctl.core.nodestats import (
    CNMON_QUERY,
    NVIDIA_SMI_QUERY,
    ContainerUse,
    GpuUse,
    parse_cnmon,
    parse_docker_stats,
    parse_nvidia_smi,
)

if TYPE_CHECKING:
    from clusterctl.cluster.runtime.base import ContainerRuntime
    from clusterctl.cluster.transport.cluster import Cluster

#: the line that starts each section of the script's output
SECTION = "@@clusterctl-top "
#: the marker of the lines the ``metrics`` section keeps (``run.metrics.MARKER``; the cluster
#: layer cannot import run/, so the word is here too and a test checks they are the same)
METRICS_MARKER = "clusterctl-metrics"
#: output lines of the container the node looks through for metrics lines, and how many it sends
LOG_LINES = 2000
KEEP_LINES = 200
#: seconds past ``timeout`` a silent node is given before it is named (``exec``'s GRACE is 10)
GRACE = 2.0


@dataclass(frozen=True)
class Where:
    """A run's container on one node and the runtime that runs it there."""

    node: str
    rank: int
    container: str
    runtime: ContainerRuntime


@dataclass(frozen=True)
class NodeRead:
    """What one node said: ``error`` set (and the rest empty) when it did not answer."""

    node: str
    rank: int
    container: ContainerUse | None = None
    gpu_tool: str | None = None
    gpus: tuple[GpuUse, ...] = ()
    metric_lines: tuple[str, ...] = ()
    error: str | None = None
    problems: tuple[str, ...] = field(default=())


def read_script(runtime: ContainerRuntime, container: str, *, log_lines: int = LOG_LINES,
                keep: int = KEEP_LINES) -> str:
    """The ``sh`` script one node runs for one refresh (pure)."""
    stats = shlex.join(runtime.stats([container]))
    logs = shlex.join(runtime.logs(container, tail=log_lines))
    nvidia = shlex.join(NVIDIA_SMI_QUERY)
    cnmon = "; ".join(shlex.join(argv) + " 2>&1" for argv in CNMON_QUERY)
    return "\n".join([
        f"echo '{SECTION}stats'",
        f"{stats} 2>&1",
        f"echo '{SECTION}gpu'",
        "if command -v nvidia-smi >/dev/null 2>&1; then echo nvidia-smi; " + nvidia + " 2>&1",
        "elif command -v cnmon >/dev/null 2>&1; then echo cnmon; " + cnmon,
        "else echo none; fi",
        f"echo '{SECTION}metrics'",
        f"{logs} 2>&1 | grep -F {shlex.quote(METRICS_MARKER)} | tail -n {int(keep)}",
        f"echo '{SECTION}end'",
        "",
    ])


def _sections(text: str) -> tuple[dict[str, list[str]], bool]:
    """The script's sections, and whether its last line (``end``) came."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    ended = False
    for line in text.splitlines():
        name = line[len(SECTION):].strip() if line.startswith(SECTION) else None
        if name in ("stats", "gpu", "metrics", "end"):
            ended = ended or name == "end"
            current = None if name == "end" or name in found else found.setdefault(name, [])
            continue
        if current is not None:
            current.append(line)
    return found, ended


def parse_read(node: str, rank: int, container: str, text: str) -> NodeRead:
    """One node's script output -> :class:`NodeRead` (pure; never raises).

    ``container``: the run's container there (its ID or name): the stats line of that
    container is taken, or the only one.  What the node could not say is in ``problems``.
    """
    parts, ended = _sections(text)
    if not parts:
        return NodeRead(node=node, rank=rank, problems=(
            "the node's answer was not the read's: " + (text.strip()[:200] or "no output"),))
    problems: list[str] = []
    stats_lines = parts.get("stats", [])
    used = parse_docker_stats("\n".join(stats_lines))
    mine = [u for u in used if u.id.startswith(container) or container.startswith(u.id)
            or u.name == container] or used[:1]
    if not mine:
        said = next((s.strip() for s in stats_lines if s.strip()), "no output")
        problems.append(f"container {container[:12]}: {said[:200]}")
    gpu_lines = parts.get("gpu", [])
    tool = gpu_lines[0].strip() if gpu_lines else None
    gpus: list[GpuUse] = []
    if tool == "nvidia-smi":
        gpus = parse_nvidia_smi("\n".join(gpu_lines[1:]))
    elif tool == "cnmon":
        gpus = parse_cnmon("\n".join(gpu_lines[1:]))
    if tool in ("nvidia-smi", "cnmon") and not gpus:
        said = next((s.strip() for s in gpu_lines[1:] if s.strip()), "no output")
        problems.append(f"{tool}: {said[:200]}")
    if not ended:
        problems.append("the node's answer was cut short")
    lines = tuple(s for s in parts.get("metrics", []) if METRICS_MARKER in s)
    return NodeRead(node=node, rank=rank, container=mine[0] if mine else None,
                    gpu_tool=tool if tool in ("nvidia-smi", "cnmon") else None, gpus=tuple(gpus),
                    metric_lines=lines, problems=tuple(problems))


def read_nodes(cluster: Cluster, where: Sequence[Where], *, timeout: float = 10.0,
               grace: float = GRACE, log_lines: int = LOG_LINES,
               keep: int = KEEP_LINES) -> dict[str, NodeRead]:
    """One refresh: every node's script at once; ``{node: NodeRead}`` in the given order.

    A node that could not be reached or did not answer in ``timeout`` + ``grace`` seconds
    gets a :class:`NodeRead` with ``error`` saying so (``unreachable: ...``, ``timeout``).
    """
    targets = [Target(w.node, ("sh", "-c", read_script(w.runtime, w.container, log_lines=log_lines,
                                                       keep=keep)), w.rank) for w in where]
    outcomes = run_everywhere(cluster, targets, timeout=timeout, grace=grace)
    got: dict[str, NodeRead] = {}
    for w, o in zip(where, outcomes, strict=True):
        if o.exit_code is None or o.status == "timeout":
            got[w.node] = NodeRead(node=w.node, rank=w.rank,
                                   error=f"{o.status}: {o.error}" if o.error else o.status)
        else:
            got[w.node] = parse_read(w.node, w.rank, w.container, o.output)
    return got


__all__ = ["GRACE", "KEEP_LINES", "LOG_LINES", "METRICS_MARKER", "SECTION", "NodeRead", "Where",
           "parse_read", "read_nodes", "read_script"]
