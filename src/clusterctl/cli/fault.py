"""`clusterctl fault KIND --node NODE`: inject one fault from outside a run, to rehearse failures.

Parsing and printing only: clusterctl.run.faults checks and does everything.  RUN
defaults to the newest run in ./runs (CLUSTERCTL_RUNS); ``--nodes`` defaults to the
inventory recorded with the run, as for ``status`` and ``stop``.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from clusterctl.cli.nodes import nodes_option
from clusterctl.core.console import out
from clusterctl.run import faults

#: The kinds as typer's choice list (``clusterctl fault --help`` lists them).
Kind = Enum("Kind", [(k.replace("-", "_"), k) for k in faults.KINDS], type=str)


def fault(
    kind: Annotated[Kind, typer.Argument(
        metavar="KIND", show_default=False,
        help="The fault: " + "; ".join(f"{k}: {h}" for k, h in faults.KIND_HELP.items()) + ".")],
    node: Annotated[str, typer.Option("--node", help="The node to hit, by its inventory name.",
                                      show_default=False)],
    run: Annotated[str | None, typer.Option(
        "--run", metavar="RUN_ID",
        help="The run whose container kill and sigstop hit (default: the newest run; "
             "`clusterctl runs` lists them).")] = None,
    rank: Annotated[int | None, typer.Option(
        "--rank", min=0, help="sigstop: the global rank (RANK) whose process stops "
                              "(default: the node's first rank).")] = None,
    nodes: Annotated[Path | None, nodes_option(
        "The inventory (default: the one recorded with the run).")] = None,
    after: Annotated[float, typer.Option(
        "--after", min=0, metavar="SECONDS",
        help="Wait this long before the fault (after every check).")] = 0.0,
) -> None:
    """Inject one fault on one node from outside a run (rehearse failures, test restarts):
    kill its container, stop a rank, or on a sandbox take the node's link or Docker engine
    down and back up. Prints when it was done; exit 2 for an unknown node or no running
    container of the run there, 1 when the node cannot be reached."""
    done = faults.inject(kind.value, node, nodes=nodes, run_id=run, rank=rank, after=after)
    out.print(faults.describe(done), markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("fault")(fault)
