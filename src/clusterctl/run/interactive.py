"""A terminal in one of a run's containers, or one of its ports here: ``clusterctl shell RUN``
and ``clusterctl port-forward RUN``.

One job: find the one container (:func:`place`: a rank or a node of the run, default node
rank 0; the choice is :func:`clusterctl.run.execute.chosen`'s, as for ``exec``), make sure it
is running (the record first, then the node's own word), and hand its node's SSH connection
to :mod:`clusterctl.cluster.terminal` (``docker exec -it`` from the node's runtime) or to
:class:`clusterctl.cluster.portforward.Forwarder`.  A run that is not running, or whose
container on that node is not, is a ``UserError`` (exit 2) saying what there is.

Contract: :func:`place` (pure), :func:`shell`, :func:`port_forward`, :class:`Place`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterctl.cluster import sshconfig
from clusterctl.cluster.containers import find_containers
from clusterctl.cluster.inventory import Inventory, load_inventory
from clusterctl.cluster.portforward import Forwarder, PortSpec
from clusterctl.cluster.runtime import runtime_of
from clusterctl.cluster.terminal import open_terminal, shell_argv, terminal_type
from clusterctl.cluster.transport import Cluster, NodeConnection
from clusterctl.core.errors import UserError
from clusterctl.run import records
from clusterctl.run.execute import chosen

#: record states of a run whose containers may be running
GOING = ("starting", "running", "restarting", "unknown")


@dataclass(frozen=True)
class Place:
    """One container of a run: on inventory node ``node``, the run's rank ``rank``."""

    run_id: str
    node: str
    rank: int
    container: str
    host: str     # the node's address (its inventory host), for messages and the forward


def place(record: records.RunRecord, inventory: Inventory, *, node: str | None = None,
          rank: int | None = None) -> Place:
    """The container ``node`` or ``rank`` names (neither: node rank 0's); UserError for a run
    that is not running (its state and the runs that are), both given, or a node or rank the
    run has not (naming those it has)."""
    if node is not None and rank is not None:
        raise UserError("give --rank N or --node NAME, not both.")
    if record.state not in GOING:
        raise UserError(f"run {record.run_id} is not running: it is {record.state}"
                        + (f" ({records.describe_exit(record.exit_code)})"
                           if record.exit_code is not None else "")
                        + f", so it has no container to enter; {_going_runs(record.run_id)}")
    ranks = [rank] if rank is not None else ([] if node is not None else
                                             [min(n.rank for n in record.nodes)])
    if not record.nodes:
        raise UserError(f"run {record.run_id} has no containers recorded yet (it is "
                        f"{record.state}); `clusterctl status {record.run_id}` shows its nodes.")
    name, got_rank, container = chosen(record, inventory, nodes=[node] if node else [],
                                       ranks=ranks)[0]
    host = next(n.host for n in inventory.nodes if n.name == name)
    return Place(record.run_id, name, got_rank, container, host)


def _going_runs(skip: str) -> str:
    going = [r.run_id for r in records.list_runs() if r.state in GOING and r.run_id != skip]
    if not going:
        return "no recorded run is running (`clusterctl runs` lists them all)."
    shown = ", ".join(going[:5]) + (f" and {len(going) - 5} more" if len(going) > 5 else "")
    return f"running: {shown}."


def _running_container(conn: NodeConnection, where: Place) -> str:
    """The run's running container on ``conn``'s node (the recorded one, else the one of the
    run's label that runs: a restart named it anew); UserError saying what the node has."""
    found = find_containers(conn, where.run_id)
    for c in sorted(found, key=lambda c: c.name != where.container):
        if c.status == "running":
            return c.name
    what = ", ".join(f"{c.name} {c.status}" + (f" (exit {c.exit_code})" if c.exit_code is not None
                                                 else "") for c in found)
    raise UserError(f"run {where.run_id}'s container on node {where.node} (rank {where.rank}) is "
                    "not running: " + (f"the node has {what}" if found else "the node has none")
                    + f"; `clusterctl status {where.run_id}` shows every node's.")


def shell(record: records.RunRecord, *, node: str | None = None, rank: int | None = None,
          inventory_path: Path | None = None,
          on_open: Callable[[Place], None] = lambda where: None,
          stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """An interactive shell in the chosen container of the run, on this terminal (see
    :mod:`clusterctl.cluster.terminal`); the shell's exit status.  ``on_open`` is told where,
    once the container is found running."""
    inventory = load_inventory(inventory_path or record.inventory)
    where = place(record, inventory, node=node, rank=rank)
    with Cluster(inventory) as cluster:
        conn = cluster.connection(where.node)
        container = _running_container(conn, where)
        argv = runtime_of(conn).exec_interactive(container, shell_argv(),
                                                  env=[("TERM", terminal_type())])
        on_open(where)
        return open_terminal(conn, argv, stdin_fd=stdin_fd, stdout_fd=stdout_fd)


def port_forward(record: records.RunRecord, spec: PortSpec, *, node: str | None = None,
                 rank: int | None = None, inventory_path: Path | None = None,
                 on_ready: Callable[[Place, Forwarder], None] = lambda where, fwd: None,
                 on_event: Callable[[str], None] = lambda line: None,
                 stop: threading.Event | None = None) -> None:
    """The chosen container's port ``spec.remote`` (its node's: containers run with
    ``--net=host``) on ``127.0.0.1:spec.local`` here, until ``stop`` is set or Ctrl-C; the
    local port is taken before any node is contacted (UserError when it is in use).
    ``on_ready`` is told where and the forwarder (its ``url``) once it listens."""
    inventory = load_inventory(inventory_path or record.inventory)
    where = place(record, inventory, node=node, rank=rank)
    forwarder = Forwarder(spec, hosts=("127.0.0.1", sshconfig.resolve_host(where.host)),
                          on_event=on_event)
    forwarder.bind()
    try:
        with Cluster(inventory) as cluster:
            conn = cluster.connection(where.node)
            _running_container(conn, where)
            on_ready(where, forwarder)
            forwarder.serve(conn, stop)
    finally:
        forwarder.close()


__all__ = ["GOING", "Place", "place", "port_forward", "shell"]
