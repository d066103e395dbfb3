"""`clusterctl push IMAGE --nodes FILE [--registry R]`: put a local image on every node.

Parsing and printing only: the push itself is ``clusterctl.cluster.distribute``,
which reports through its PushProgress protocol; the two displays of that
protocol live here (PlainProgress for logs and pipes, LiveProgress on a terminal).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cli.nodes import NODES_HELP, nodes_option
from clusterctl.cluster import distribute
from clusterctl.cluster.inventory import Inventory, load_inventory
from clusterctl.cluster.registry import pull as registry_pull
from clusterctl.cluster.registry import push as registry_push
from clusterctl.cluster.registry.reference import registry_option
from clusterctl.cluster.transport import Cluster
from clusterctl.core.console import err, interactive, out, print_table
from clusterctl.core.errors import UserError
from clusterctl.core.imageref import check_image
from clusterctl.core.text import shown


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


class PlainProgress:
    """One line per node when it starts and when it ends (logs, CI, pipes)."""

    def __init__(self, console=None) -> None:
        self._lock = threading.Lock()
        self.console = console or out     # `launch --json` keeps stdout for the JSON: err

    def started(self, node: str, plan: str) -> None:
        with self._lock:
            self.console.print(f"{node}: {plan}", markup=False)

    def sent(self, node: str, nbytes: int) -> None:
        pass

    def finished(self, result: distribute.PushResult) -> None:
        with self._lock:
            where = "" if result.status == "skipped" else f" from {result.source}"
            self.console.print(f"{result.node}: {result.describe()}, {_size(result.bytes_sent)}{where} "
                               f"in {result.seconds:.1f}s", markup=False)


class LiveProgress:
    """A rich live display on a terminal: bytes sent and rate per node."""

    def __init__(self, bar) -> None:
        self.bar = bar
        self.tasks: dict[str, int] = {}
        self._lock = threading.Lock()

    def _task(self, node: str) -> int:
        with self._lock:
            if node not in self.tasks:
                self.tasks[node] = self.bar.add_task(escape(node), total=None, plan="connecting")
            return self.tasks[node]

    def started(self, node: str, plan: str) -> None:
        self.bar.update(self._task(node), plan=escape(plan))

    def sent(self, node: str, nbytes: int) -> None:
        self.bar.advance(self._task(node), nbytes)

    def finished(self, result: distribute.PushResult) -> None:
        task = self._task(result.node)
        self.bar.update(task, plan=escape(result.describe()), total=result.bytes_sent or 1,
                        completed=result.bytes_sent or 1)
        self.bar.stop_task(task)


@contextmanager
def _progress():
    if not interactive():
        yield PlainProgress()
        return
    # rich.progress (with rich.live) costs 40-70 ms to import: only a terminal needs it
    from rich.progress import (
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    bar = Progress(TextColumn("{task.description}"), TextColumn("{task.fields[plan]}"),
                   DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
                   console=out, transient=True)
    with bar:
        yield LiveProgress(bar)


def _source(result: distribute.PushResult) -> str:
    """Where a node's bytes came from; for a relay node fed again, after whose failure."""
    if result.refed_after:
        return f"{result.source} (again: {result.refed_after} failed)"
    return result.source


def push(
    image: Annotated[str, typer.Argument(help="Local image (tag or ID) to put on every node.",
                                         show_default=False)],
    nodes: Annotated[Path | None, nodes_option(
        NODES_HELP + " Optional with --registry (the image then goes to the registry only).")] = None,
    registry: Annotated[str | None, typer.Option(
        "--registry", metavar="HOST[:PORT][/NAMESPACE]",
        help="Push the image to this registry (credentials: `docker login`) and print its "
             "digest; with --nodes every node then pulls it by digest. Default: the "
             "inventory's registry:, else over SSH.", show_default=False)] = None,
    fanout: Annotated[int | None, typer.Option(
        "--fanout", min=1, help="Nodes pushed to at once (default: the inventory's ssh.fanout).")] = None,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys",
        help="Record unknown node host keys (a changed key is always refused).")] = False,
    strategy: Annotated[str, typer.Option(
        "--strategy", metavar="auto|star|relay",
        help="star: this machine sends to every node; relay: nodes forward to each other "
             "while they receive (this machine sends each stream once); auto: relay from "
             f"{distribute.RELAY_FROM_NODES} nodes that need the image, unless the star would "
             f"send under {distribute.RELAY_FROM_BYTES >> 20} MiB in all.")] = "auto",
    compress: Annotated[bool | None, typer.Option(
        "--compress/--no-compress",
        help="zstd on the wire (relay; default: decided from a measurement of the "
             "link and of zstd on this machine).", show_default=False)] = None,
) -> None:
    """Put a local image on every node: nodes that have it are skipped, others get only
    the layers they lack; each node's image ID is verified. Exit 1 if any node failed.

    With a registry (--registry, or the inventory's registry:): this machine pushes the
    image there once and prints its digest; every node pulls it by digest. Exit 2 when the
    registry cannot be reached, refuses the credentials or lacks TLS."""
    if strategy not in distribute.STRATEGIES:
        raise UserError(f"--strategy {shown(strategy)}: valid values are "
                        + ", ".join(distribute.STRATEGIES))
    if nodes is None and registry is None:
        raise UserError("push: give --nodes FILE (or $CLUSTERCTL_NODES), --registry "
                        "HOST[:PORT][/NAMESPACE], or both.")
    check_image(image, "push IMAGE")      # before any engine, registry or node is asked
    target = registry_option(registry)
    inventory = load_inventory(nodes) if nodes is not None else None
    target = target or (inventory.registry if inventory is not None else None)
    if target is not None:
        _push_registry(image, target, inventory, accept_new_host_keys=accept_new_host_keys,
                       fanout=fanout, strategy=strategy, compress=compress)
        return
    with _progress() as progress:
        results = distribute.push_image(image, inventory, progress=progress, fanout=fanout,
                                        accept_new_host_keys=accept_new_host_keys or None,
                                        strategy=strategy, compress=compress)
    print_table(f"push {image}", ["node", "from", "received", "seconds", "result"],
                [(escape(r.node), escape(_source(r)) if r.status not in ("skipped",) else "-",
                  _size(r.bytes_sent), f"{r.seconds:.1f}", escape(r.describe()))
                 for r in results])
    out.print(f"sent by this machine: {_size(sum(r.head_bytes for r in results))}", markup=False)
    sources = sorted({r.read_from for r in results if r.read_from})
    if sources:
        out.print("read from: " + "; ".join(sources), markup=False)
    wires = sorted({r.compression for r in results if r.compression})
    if wires:
        out.print("on the wire: " + "; ".join(wires), markup=False)
    _end(results, "push")


def _end(results, verb: str) -> None:
    """A partial outcome (which nodes have the image now, which do not) and exit 1, or nothing."""
    failed = [r for r in results if not r.ok]
    if failed:
        out.print(f"image on {len(results) - len(failed)} of {len(results)} node(s); "
                  f"without it: {', '.join(r.node for r in failed)}", markup=False)
        err.print(f"{verb} failed on {len(failed)} of {len(results)} node(s): "
                  + "; ".join(f"{r.node}: {r.error}" for r in failed), markup=False)
        raise typer.Exit(1)


def _push_registry(image: str, target, inventory: Inventory | None, *, accept_new_host_keys: bool,
                   fanout: int | None = None, strategy: str = "auto",
                   compress: bool | None = None) -> None:
    """``push --registry`` (or an inventory's registry): push once, then nodes pull by digest."""
    pushed = registry_push.push(image, target)
    err.print(f"pushed {image} to {target} as {pushed.tagged} in {pushed.seconds:.1f}s", markup=False)
    out.print(f"digest: {pushed.digest}", markup=False)
    out.print(f"reference: {pushed.reference}", markup=False)
    if inventory is None:
        return
    # the layers go through the relay push (the head's link carries the image once); the
    # pull by digest then finds the image ID on the node and fetches only the manifest
    with _progress() as progress:
        relayed = distribute.push_image(image, inventory, progress=progress, fanout=fanout,
                                        accept_new_host_keys=accept_new_host_keys or None,
                                        strategy=strategy, compress=compress)
    lost = {r.node: r for r in relayed if not r.ok}
    with Cluster(inventory, accept_new_host_keys=accept_new_host_keys or None) as cluster, \
            _progress() as progress:
        pulled = registry_pull.pull(cluster, pushed.reference, pushed.image_id,
                                    registry=target.address, auth=registry_push.credentials(target),
                                    nodes=[n.name for n in inventory.nodes if n.name not in lost],
                                    progress=progress)
    results = [*lost.values(), *pulled]
    sent = {r.node: r.bytes_sent for r in relayed}
    print_table(f"push {pushed.reference}", ["node", "layers sent", "pull seconds", "result"],
                [(escape(r.node), _size(sent.get(r.node, 0)), f"{r.seconds:.1f}", escape(r.describe()))
                 for r in results])
    _end(results, "pull")


def register(app: typer.Typer) -> None:
    app.command("push")(push)
