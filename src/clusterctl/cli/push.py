"""`clusterctl push IMAGE --nodes FILE`: put a local image on every node.

Parsing and printing only: the push itself is ``clusterctl.cluster.distribute``,
which reports through its PushProgress protocol; the two displays of that
protocol live here (PlainProgress for logs and pipes, LiveProgress on a terminal).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cli.nodes import NodesOption
from clusterctl.cluster import distribute
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.console import err, interactive, out, print_table
from clusterctl.core.errors import UserError


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


def push(
    image: Annotated[str, typer.Argument(help="Local image (tag or ID) to put on every node.",
                                         show_default=False)],
    nodes: NodesOption,
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
    the layers they lack; each node's image ID is verified. Exit 1 if any node failed."""
    if strategy not in distribute.STRATEGIES:
        raise UserError(f"--strategy {strategy!r}: valid values are "
                        + ", ".join(distribute.STRATEGIES))
    inventory = load_inventory(nodes)
    with _progress() as progress:
        results = distribute.push_image(image, inventory, progress=progress, fanout=fanout,
                                        accept_new_host_keys=accept_new_host_keys or None,
                                        strategy=strategy, compress=compress)
    print_table(f"push {image}", ["node", "from", "received", "seconds", "result"],
                [(escape(r.node), escape(r.source) if r.status not in ("skipped",) else "-",
                  _size(r.bytes_sent), f"{r.seconds:.1f}", escape(r.describe()))
                 for r in results])
    out.print(f"sent by this machine: {_size(sum(r.head_bytes for r in results))}", markup=False)
    sources = sorted({r.read_from for r in results if r.read_from})
    if sources:
        out.print("read from: " + "; ".join(sources), markup=False)
    wires = sorted({r.compression for r in results if r.compression})
    if wires:
        out.print("on the wire: " + "; ".join(wires), markup=False)
    failed = [r for r in results if not r.ok]
    if failed:
        err.print(f"push failed on {len(failed)} of {len(results)} node(s): "
                  + "; ".join(f"{r.node}: {r.error}" for r in failed), markup=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("push")(push)
