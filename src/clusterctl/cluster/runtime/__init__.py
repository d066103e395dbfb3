"""The container runtime on the nodes: one seam for every container and image command.

Layout (one job per module):

* :mod:`.base` - :class:`ContainerRuntime`: the argv of each operation (run, ps, inspect,
  wait, logs, exec, stop, kill, rm, load, image inspect/ls/rm, tag, pull, version, info), pure;
* :mod:`.docker` - :class:`DockerRuntime`: the ``docker`` CLI, the default;
* :mod:`.podman` - :class:`PodmanRuntime`: the ``podman`` CLI (docker's, with Podman's few
  differences said the way callers read docker's).

A runtime is chosen by name in ONE place, :func:`runtime_for`; a node's runtime in one
function, :func:`node_runtime` (every node runs :data:`DEFAULT_RUNTIME` until the inventory
names another per node: ``runtime:`` per node or in ``defaults``).  Adding a runtime: a
module beside ``docker.py`` and one entry in :data:`RUNTIMES`.

Shell scripts that run on the nodes (stop channels, the followed run's script, the push's
plan and relay, the pull, preflight's engine section) call the runtime as ``"$RT"``, set by
:meth:`ContainerRuntime.script` from the node's runtime; Slurm's docker task still spells
``docker``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterctl.cluster.runtime.base import ContainerRuntime
from clusterctl.cluster.runtime.docker import DockerRuntime
from clusterctl.cluster.runtime.podman import PodmanRuntime
from clusterctl.core.errors import UserError, did_you_mean, one_of

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Node
    from clusterctl.cluster.transport import NodeConnection

#: name -> runtime class: every runtime clusterctl knows, declared once
RUNTIMES: dict[str, type[ContainerRuntime]] = {DockerRuntime.name: DockerRuntime,
                                              PodmanRuntime.name: PodmanRuntime}

#: the runtime of a node that names none
DEFAULT_RUNTIME = DockerRuntime.name


def runtime_for(name: str | None = None) -> ContainerRuntime:
    """The runtime called ``name`` (None: :data:`DEFAULT_RUNTIME`); UserError naming the
    known ones otherwise."""
    name = DEFAULT_RUNTIME if name is None else name
    try:
        return RUNTIMES[name]()
    except KeyError:
        raise UserError(f"container runtime {name!r} is not known{did_you_mean(name, list(RUNTIMES))}; "
                        f"valid: {one_of(sorted(RUNTIMES))}") from None


def node_runtime(node: Node) -> ContainerRuntime:
    """The runtime of inventory node ``node``: its ``runtime`` when it names one, else the
    default.  The one place a node's runtime is decided."""
    return runtime_for(getattr(node, "runtime", None))


def runtime_of(conn: NodeConnection) -> ContainerRuntime:
    """The runtime of the node at the other end of ``conn`` (a ``NodeConnection``)."""
    return node_runtime(conn.node)


__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "ContainerRuntime", "DockerRuntime", "PodmanRuntime",
           "node_runtime",
           "runtime_for", "runtime_of"]
