"""`clusterctl shell` and `clusterctl port-forward`: a terminal in a run's container (or on a
node), and a rank's port on this machine.

Parsing and printing only: :func:`clusterctl.run.interactive.shell` and
:func:`~clusterctl.run.interactive.port_forward` find the container and do the work,
:func:`clusterctl.cluster.terminal.on_node` opens a node's own shell, and
:func:`clusterctl.cluster.portforward.parse_spec` reads ``PORT[:LOCAL]``.

``shell`` exits with the shell's own exit status; ``port-forward`` runs until Ctrl-C and
then exits 0.  Bad input (a run that is not running, a rank or node it has not, a port spec
that is no port, a local port in use) exits 2, naming what would be valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clusterctl.cli.nodes import NODES_HELP, nodes_option
from clusterctl.cluster import portforward, terminal
from clusterctl.core import exitcodes
from clusterctl.core.console import err
from clusterctl.core.errors import UserError
from clusterctl.run import interactive, records

RankOption = Annotated[int | None, typer.Option(
    "--rank", metavar="N", min=0,
    help="The run's rank whose container to use (default: node rank 0).", show_default=False)]
NodeOption = Annotated[str | None, typer.Option(
    "--node", metavar="NAME", help="The run's container on this node (instead of --rank).",
    show_default=False)]


def shell(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(
        metavar="RUN/NODE",
        help="A run id (default: your newest run; `clusterctl runs` lists them): the shell opens "
             "in its container. With --nodes FILE: a node of FILE (default its first), the shell "
             "opens on the node itself.", show_default=False)] = None,
    nodes: Annotated[Path | None, nodes_option(
        NODES_HELP + " Given here: a login shell on NODE of this inventory. Only from "
        "$CLUSTERCTL_NODES: NODE when it names no run, else the inventory of the run.")] = None,
    rank: RankOption = None,
    node: NodeOption = None,
) -> None:
    """An interactive terminal in a running run's container (bash, else sh; docker exec -it
    over SSH), or on a node itself with --nodes FILE NODE. Keys, Ctrl-C and resizes reach
    the container as on a local terminal; exits with the shell's exit status."""
    source = ctx.get_parameter_source("nodes")
    given = source is not None and source.name == "COMMANDLINE"
    if nodes is not None and (given or (target is not None and not _is_run(target))):
        if rank is not None or node is not None:
            raise UserError("--rank and --node choose a run's container; with --nodes FILE the "
                            "shell opens on NODE itself: `clusterctl shell --nodes FILE NODE`.")
        try:
            code = terminal.on_node(nodes, target)
        except UserError as e:
            if target is not None and _is_run(target):
                raise UserError(f"{e.message} ({target!r} is a run: `clusterctl shell {target}` "
                                "opens a shell in its container.)") from None
            raise
        raise typer.Exit(_status(code))
    record = records.resolve(target)

    def opened(where: interactive.Place) -> None:
        err.print(f"run {where.run_id}: {where.node} (rank {where.rank}), container "
                  f"{where.container}; `exit` leaves.", markup=False, highlight=False)

    raise typer.Exit(_status(interactive.shell(record, node=node, rank=rank, inventory_path=nodes,
                                               on_open=opened)))


def port_forward(
    first: Annotated[str | None, typer.Argument(
        metavar="RUN", help="A run id (default: your newest run; `clusterctl runs` lists them).",
        show_default=False)] = None,
    second: Annotated[str | None, typer.Argument(
        metavar="PORT[:LOCAL]",
        help="The port on the rank's node (its container runs with --net=host) and the port on "
             "this machine's 127.0.0.1 it is reached at (default PORT; 0: any free one).",
        show_default=False)] = None,
    rank: RankOption = None,
    node: NodeOption = None,
    nodes: Annotated[Path | None, nodes_option(
        "The inventory (default: the one recorded with the run).")] = None,
) -> None:
    """Forward a port of a running run's container to 127.0.0.1 on this machine, over the
    node's SSH connection, until Ctrl-C; prints the local URL. The node connects to the port
    on 127.0.0.1 first, then on its own address."""
    if first is None:
        raise UserError("no port to forward: give [RUN] PORT[:LOCAL] (`clusterctl port-forward "
                        "RUN 8888:18888`).")
    run, port = (None, first) if second is None else (first, second)   # one word: the port
    spec = portforward.parse_spec(port)
    record = records.resolve(run)

    def ready(where: interactive.Place, fwd: portforward.Forwarder) -> None:
        typer.echo(f"Forwarding {fwd.url} -> port {spec.remote} of {where.node} (rank "
                   f"{where.rank}) of run {where.run_id}; Ctrl-C stops.")

    def event(line: str) -> None:
        err.print(line, markup=False, highlight=False)

    try:
        interactive.port_forward(record, spec, node=node, rank=rank, inventory_path=nodes,
                                 on_ready=ready, on_event=event)
    except KeyboardInterrupt:
        err.print("stopped.", markup=False, highlight=False)
    raise typer.Exit(exitcodes.OK)


def _is_run(word: str) -> bool:
    """Whether ``word`` names a recorded run."""
    try:
        records.check_run_id(word)
    except UserError:
        return False
    return (records.run_path(word) / records.RECORD_NAME).is_file()


def _status(code: int) -> int:
    """A session's exit status as clusterctl's: -1 (it ended without one) is a failure."""
    return exitcodes.FAILURE if code < 0 else code


def register(app: typer.Typer) -> None:
    app.command("shell")(shell)
    app.command("port-forward")(port_forward)
