"""``clusterctl exec RUN -- CMD``: a command in every container of a run, at once.

One job: :func:`in_run` - the run's containers (the nodes of its record, narrowed by
``--node``/``--rank``; a rank is the record's) each run the user's command through the
node's runtime (``docker exec CONTAINER sh -c CMD``), all at once and bounded, as
:func:`clusterctl.cluster.execute.run_everywhere` runs anything.  A run of another backend
than ssh (Slurm: its containers are the scheduler's tasks') is refused, naming why.

Contract: :func:`in_run`, :func:`targets` (pure: what would run where), :func:`chosen`
(pure: which containers ``--node``/``--rank`` name; ``clusterctl shell`` and
``port-forward`` pick theirs with it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clusterctl.cluster.execute import Outcome, Target, pick, run_everywhere, shell_argv
from clusterctl.cluster.inventory import Inventory, load_inventory
from clusterctl.cluster.runtime import node_runtime
from clusterctl.cluster.transport.cluster import Cluster
from clusterctl.core.errors import UserError
from clusterctl.run import backends, records


def chosen(record: records.RunRecord, inventory: Inventory, *, nodes: Sequence[str] = (),
           ranks: Sequence[int] = ()) -> list[tuple[str, int, str]]:
    """``(node, rank, container)`` of each of ``record``'s containers ``nodes``/``ranks`` name
    (all when neither does), in rank order: UserError for a run of another backend than ssh,
    a node or rank the run has not (naming the valid ones), or a node not in ``inventory``."""
    backend = backends.for_record(record)
    if backend.name != "ssh":
        job = f" (job {record.slurm_job})" if record.slurm_job else ""
        raise UserError(f"run {record.run_id} ran through {backend.name}{job}: its containers are "
                        f"the scheduler's tasks, which clusterctl does not reach over SSH; "
                        + ("`srun --jobid JOB --overlap CMD` runs a command in its allocation."
                           if backend.name == "slurm" else "use the scheduler's own tools."))
    by_name = {n.name for n in inventory.nodes}
    picked = pick(sorted(((n.node, n.rank) for n in record.nodes), key=lambda m: m[1]),
                  nodes=nodes, ranks=ranks,
                  where=f"run {record.run_id}")
    containers = {n.node: n.container for n in record.nodes}
    missing = [n for n, _ in picked if n not in by_name]
    if missing:
        raise UserError(f"run {record.run_id}'s node(s) {', '.join(missing)} are not in inventory "
                        f"{inventory.path}; give the run's inventory with --nodes FILE.")
    return [(n, r, containers[n]) for n, r in picked]


def targets(record: records.RunRecord, inventory: Inventory, command: Sequence[str], *,
            nodes: Sequence[str] = (), ranks: Sequence[int] = ()) -> list[Target]:
    """Each chosen container of ``record``'s run and the argv that runs ``command`` in it."""
    by_name = {n.name: n for n in inventory.nodes}
    return [Target(n, tuple(node_runtime(by_name[n]).exec(c, shell_argv(command))), r)
            for n, r, c in chosen(record, inventory, nodes=nodes, ranks=ranks)]


def in_run(record: records.RunRecord, command: Sequence[str], *, inventory_path: Path | None = None,
           nodes: Sequence[str] = (), ranks: Sequence[int] = (), timeout: float) -> list[Outcome]:
    """``command`` in the chosen containers of the run (``inventory_path``: default the one
    recorded with it); how each ended, in rank order."""
    inventory = load_inventory(inventory_path or record.inventory)
    where = targets(record, inventory, command, nodes=nodes, ranks=ranks)
    with Cluster(inventory) as cluster:
        return run_everywhere(cluster, where, timeout=timeout)


__all__ = ["chosen", "in_run", "targets"]
