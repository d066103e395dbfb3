"""`clusterctl exec`: a command on every node, or in every container of a run, output folded.

Parsing and printing only: :func:`clusterctl.cluster.execute.on_nodes` (``--nodes FILE``)
and :func:`clusterctl.run.execute.in_run` (``RUN``) run the command;
:func:`clusterctl.core.gather.fold_outputs` folds what came back as ``clush -b`` does:
each distinct (status, output) once, under a line naming the nodes that gave it
(``node[1-3]``), the largest group first, the odd ones out after it.

Exit status: 0 when every node's command exited 0; 1 when any did not (exited non-zero,
timed out, or its node could not be reached: each node's own status is in the output and in
``--json``); 2 for bad input (no command, a ``--node`` or ``--rank`` the nodes do not have,
a Slurm run).  Like ``pdsh`` and ``clush`` without ``-S``, the remote statuses are not
passed on as clusterctl's own: 2 would then mean two things.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from clusterctl.cli.afterdashes import COMMAND_META, CommandAfterDashes
from clusterctl.cli.nodes import NODES_HELP, nodes_option
from clusterctl.cluster.execute import Outcome, on_nodes
from clusterctl.core import exitcodes
from clusterctl.core.errors import UserError
from clusterctl.core.gather import fold_outputs
from clusterctl.core.hostlist import fold

RULE = "-" * 16


def exec_(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(
        metavar="[RUN] -- COMMAND...",
        help="A run id (`clusterctl runs`): the command runs in each of its containers. Leave it "
             "out to run the command on the nodes of --nodes FILE.", show_default=False)] = None,
    nodes: Annotated[Path | None, nodes_option(
        NODES_HELP + " With RUN: default the inventory recorded with the run.")] = None,
    node: Annotated[list[str] | None, typer.Option(
        "--node", metavar="NAME", help="Only this node (repeat for more).")] = None,
    rank: Annotated[list[int] | None, typer.Option(
        "--rank", metavar="N", min=0,
        help="Only this rank (repeat for more): the run's rank, or the node's place in the "
             "inventory (as `clusterctl nodes` lists them).")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS", min=0.1,
        help="End each node's command after this long (status timeout, exit 124); a node that "
             "does not answer is named, not waited on.")] = 60.0,
    json_: Annotated[bool, typer.Option(
        "--json", help="One JSON object per node: node, rank, status, exit_code (null: no status "
                       "came back), output, cut (output over 1 MiB), error.")] = False,
) -> None:
    """Run a shell command on every node (--nodes FILE), or in every container of a run
    (RUN), all at once; identical outputs are shown once under the nodes that gave them
    (node[1-3], as clush -b does), the odd ones out apart, each with its exit status. The
    words after -- are joined by spaces and read by sh on the node, as ssh does. Exit 1
    when any node's command did not exit 0."""
    command = ctx.meta.get(COMMAND_META) or []
    if not command:
        raise UserError("no command to run: put it after -- (`clusterctl exec --nodes FILE -- uptime`).")
    if run is None and nodes is None:
        raise UserError("nothing to run on: give --nodes FILE (or $CLUSTERCTL_NODES), or a RUN "
                        "(`clusterctl runs` lists them).")
    if run is None:
        got = on_nodes(nodes, command, nodes=node or (), ranks=rank or (), timeout=timeout)
    else:
        # Imported here: the run's side (records, backends) costs `exec --nodes` a third
        # of its start-up (pdsh's whole run on one node takes less).
        from clusterctl.run import execute as run_execute
        from clusterctl.run import records

        got = run_execute.in_run(records.resolve(run), command, inventory_path=nodes,
                                 nodes=node or (), ranks=rank or (), timeout=timeout)
    if json_:
        typer.echo(json.dumps([{"node": o.node, "rank": o.rank, "status": o.status,
                                "exit_code": o.exit_code, "output": o.output, "cut": o.cut,
                                "error": o.error or None} for o in got], indent=2))
    else:
        _print(got)
    raise typer.Exit(exitcodes.OK if all(o.ok for o in got) else exitcodes.FAILURE)


def _print(got: list[Outcome]) -> None:
    by_node = {o.node: o for o in got}
    for group in fold_outputs({o.node: (_status(o), o.output) for o in got}):
        typer.echo(f"{RULE} {group.folded} ({group.status})")
        if group.output:
            typer.echo(group.output, nl=not group.output.endswith("\n"))
        cut = [n for n in group.nodes if by_node[n].cut]
        if cut:
            typer.echo(f"(output cut at 1 MiB on {fold(cut)})")
    failed = [o for o in got if not o.ok]
    typer.echo(f"{RULE} {len(got) - len(failed)} of {len(got)} nodes exited 0"
               + (f"; not: {fold(o.node for o in failed)}" if failed else ""))


def _status(o: Outcome) -> str:
    """A group's status: how the node ended and, without an exit status, why."""
    return o.status if o.exit_code is not None or not o.error else f"{o.status}: {o.error}"


def register(app: typer.Typer) -> None:
    app.command("exec", cls=CommandAfterDashes)(exec_)
