"""A command on many nodes at once, each bounded in time and output: ``clusterctl exec``.

One job: :func:`run_everywhere` - each :class:`Target` (a node and the argv to run there:
the user's command in a shell, or the runtime's ``exec`` of it into a container) runs at
the same time on every node, through :func:`~clusterctl.cluster.transport.tree.run_commands`:
the tree when the inventory takes it (``ssh.tree: true``, or ``auto`` from 16 nodes on), so
this machine holds one SSH connection however many nodes there are; else a connection per
node, ``ssh.fanout`` at a time.

Bounds: on the node, ``scripts/exec-bounded.sh`` runs the argv with no stdin, its stderr
on its stdout, at most :data:`OUTPUT_CAP` bytes of that sent back (the rest read and
dropped: :attr:`Outcome.cut`), and ends it after ``timeout`` seconds with timeout(1)
(exit 124: status ``timeout``).  Here, a node that does not answer within ``timeout`` +
:data:`GRACE` seconds (no timeout(1) there, its link down) is given up on and named with
status ``timeout``; one that cannot be reached is named with why (status ``unreachable``).
Nothing here decides what the command is: it is the user's, run as given.

Contract: :func:`on_nodes` (an inventory's nodes), :func:`run_everywhere` (any targets:
``run.execute`` gives a run's containers), :func:`pick` (``--node``/``--rank``),
:class:`Target`, :class:`Outcome`, :data:`OUTPUT_CAP`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import tree
from clusterctl.cluster.transport.cluster import Cluster
from clusterctl.core.errors import NodeError, UserError, did_you_mean, one_of
from clusterctl.core.scripts import script_text

#: bytes of each node's output kept (the rest is dropped on the node, and said)
OUTPUT_CAP = 1 << 20
#: seconds, past the command's own timeout, this machine waits for a node's answer (the
#: node's timeout(1) kills a command that ignores SIGTERM 5 s after it)
GRACE = 10.0
#: the exit status timeout(1) gives a command it ended
TIMEOUT_EXIT = 124

_BOUNDED = script_text("clusterctl.cluster", "exec-bounded.sh")


@dataclass(frozen=True)
class Target:
    """What runs on one node: ``argv`` on inventory node ``node``, shown as ``node``
    (with ``rank`` when it is a run's container)."""

    node: str
    argv: tuple[str, ...]
    rank: int | None = None


@dataclass(frozen=True)
class Outcome:
    """How a target ended: ``exit_code`` None when no status came back (``error`` says why)."""

    node: str
    rank: int | None
    exit_code: int | None
    output: str
    error: str = ""
    cut: bool = False

    @property
    def status(self) -> str:
        """``exit N``, ``timeout`` (ended by timeout(1), or no answer in time) or ``unreachable``."""
        if self.exit_code == TIMEOUT_EXIT or (self.exit_code is None and "timed out" in self.error):
            return "timeout"
        if self.exit_code is None:
            return "unreachable"
        return f"exit {self.exit_code}"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def shell_argv(command: Sequence[str]) -> tuple[str, ...]:
    """The user's words as ssh runs them: joined by spaces, read by the node's ``sh``."""
    return ("sh", "-c", " ".join(command))


def pick(members: Sequence[tuple[str, int]], *, nodes: Sequence[str] = (), ranks: Sequence[int] = (),
         where: str) -> list[tuple[str, int]]:
    """The ``(node, rank)`` members ``--node`` and ``--rank`` name (all when neither does), in
    their order; UserError naming the valid ones for a name or rank ``where`` has not."""
    names = [m[0] for m in members]
    for name in nodes:
        if name not in names:
            raise UserError(f"--node {name}: {where} has no node {name!r}{did_you_mean(name, names)}; "
                            f"valid: {one_of(names)}.")
    valid = [m[1] for m in members]
    for rank in ranks:
        if rank not in valid:
            raise UserError(f"--rank {rank}: {where} has no rank {rank}; valid: {one_of(valid)}.")
    if not nodes and not ranks:
        return list(members)
    return [m for m in members if m[0] in nodes or m[1] in ranks]


def on_nodes(inventory_path: Path, command: Sequence[str], *, nodes: Sequence[str] = (),
             ranks: Sequence[int] = (), timeout: float) -> list[Outcome]:
    """``command`` (the user's words, read by each node's ``sh``) on every node of the
    inventory (or those ``nodes``/``ranks`` name; a rank is the node's place in the
    inventory, as ``clusterctl nodes`` lists it)."""
    inventory = load_inventory(inventory_path)
    chosen = pick([(n.name, r) for r, n in enumerate(inventory.nodes)], nodes=nodes, ranks=ranks,
                  where=f"inventory {inventory_path}")
    with Cluster(inventory) as cluster:
        return run_everywhere(cluster, [Target(n, shell_argv(command), r) for n, r in chosen],
                              timeout=timeout)


def run_everywhere(cluster: Cluster, targets: Sequence[Target], *, timeout: float,
                   grace: float = GRACE) -> list[Outcome]:
    """Run every target at once (one per node) and return how each ended, in the given order;
    a node silent ``grace`` seconds past ``timeout`` is given up on (``clusterctl top``
    refreshing every 2 s gives less than :data:`GRACE`)."""
    commands = {t.node: [tree.Command(("sh", "-c", _BOUNDED, "clusterctl-exec", f"{timeout:g}",
                                       str(OUTPUT_CAP + 1), *t.argv))] for t in targets}
    got = tree.run_commands(cluster, commands, timeout=timeout + grace)
    return [_outcome(t, got[t.node], timeout, grace) for t in targets]


def _outcome(target: Target, got, timeout: float, grace: float = GRACE) -> Outcome:
    if isinstance(got, NodeError):
        why = got.reason
        if "timed out" in why:
            why = f"no answer within {timeout + grace:g}s (timed out)"
        return Outcome(target.node, target.rank, None, "", why)
    result = got[0]
    data = (result.stdout + result.stderr).encode()
    cut = len(data) > OUTPUT_CAP
    output = data[:OUTPUT_CAP].decode("utf-8", "replace") if cut else result.stdout + result.stderr
    error = f"ended after {timeout:g}s (--timeout)" if result.exit_code == TIMEOUT_EXIT else ""
    return Outcome(target.node, target.rank, result.exit_code, output, error, cut)


__all__ = ["GRACE", "OUTPUT_CAP", "Outcome", "Target", "on_nodes", "pick", "run_everywhere", "shell_argv"]
