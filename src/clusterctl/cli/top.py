"""`clusterctl top`: a running run's nodes live: CPU, memory, accelerators, steps/s.

Parsing and printing only: :class:`clusterctl.run.top.Top` reads the nodes (one SSH
command a node a refresh); this module shows each snapshot as a table refreshed in place
on a terminal (plain tables one after the other otherwise), or as JSON (``--once --json``),
and writes the Prometheus text file (``--prometheus FILE``).

Exit status: 0 after Ctrl-C or ``--once``; with ``--once``, 1 when a node did not answer
(named in the output); 2 for bad input (no running run, a Slurm run, a bad flag).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from clusterctl.cli.nodes import nodes_option
from clusterctl.core import console, exitcodes
from clusterctl.run import records
from clusterctl.run import top as run_top
from clusterctl.run.metrics import WINDOW_S

COLUMNS = ("node", "rank", "CPU %", "memory", "GPU util %", "GPU memory", "steps/s", "samples/s",
           "step", "loss", "note")


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _row(name: str, m, problems: tuple[str, ...]) -> list[str]:
    gpu_util = ", ".join("-" if g.util_percent is None else f"{g.util_percent:g}" for g in m.gpus)
    gpu_mem = ", ".join(_bytes(g.memory_used_bytes) for g in m.gpus)
    r = m.rates
    if m.error:
        note = f"[red]{escape(m.error)}[/]"
    elif m.idle:
        note = f"[bold yellow]idle[/]: {escape(m.idle_why)}"
    else:
        note = escape("; ".join(problems))
    mem = _bytes(m.memory_bytes) + (f" / {_bytes(m.memory_limit_bytes)}" if m.memory_limit_bytes else "")
    return [escape(name), str(m.rank), _num(m.cpu_percent, ".1f"), mem if m.memory_bytes is not None else "-",
            gpu_util or "-", gpu_mem or "-", _num(r.steps_per_s), _num(r.samples_per_s, ".1f"),
            "-" if r.last_step is None else str(r.last_step), _num(r.last_loss, ".4g"), note]


def render(snap: run_top.Snapshot, interval: float | None):
    """The table of one snapshot, with a line saying when and how long the read took."""
    rows = [_row(name, m, snap.problems.get(name, ())) for name, m in snap.nodes.items()]
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.time))
    every = f", every {interval:g}s (Ctrl-C ends)" if interval else ""
    head = Text(f"run {snap.run_id} at {stamp}: nodes read in {snap.read_s:.1f}s{every}")
    return Group(head, console.table(None, COLUMNS, rows))


def top(
    run: Annotated[str | None, typer.Argument(
        help="A run id (`clusterctl runs`); default: your newest run that is running.",
        show_default=False)] = None,
    nodes: Annotated[Path | None, nodes_option(
        "The run's inventory (default: the one recorded with the run).")] = None,
    interval: Annotated[float, typer.Option(
        "--interval", metavar="SECONDS", min=0.5, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option(
        "--once", help="Read every node once, print, and exit (1 when a node did not answer).")] = False,
    json_: Annotated[bool, typer.Option(
        "--json", help="Print each refresh as one JSON object (one line a refresh): run, time, "
                       "read_seconds, and per node: node, rank, error, cpu_percent, memory_bytes, "
                       "memory_limit_bytes, gpu_tool, gpus, steps_per_s, samples_per_s, last_step, "
                       "last_loss, last_time, idle, idle_why, problems.")] = False,
    prometheus: Annotated[Path | None, typer.Option(
        "--prometheus", metavar="FILE",
        help="Write each refresh to FILE in the Prometheus text format, atomically (for "
             "node_exporter's textfile collector: a FILE ending in .prom in its directory).",
        show_default=False)] = None,
    window: Annotated[float, typer.Option(
        "--window", metavar="SECONDS", min=1.0,
        help="Steps/s and samples/s are over this many seconds of metrics lines.")] = WINDOW_S,
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS", min=1.0,
        help="A node that has not answered a refresh after this long (plus 2 s) is named as "
             "not answering; the others are shown.")] = 10.0,
) -> None:
    """Show a running run live, node by node: its container's CPU and memory (docker stats),
    the node's GPUs (nvidia-smi) or MLUs (cnmon), and the training's steps/s and samples/s
    from the metrics lines it prints (`clusterctl-metrics {...}`). A node that does nothing
    while others work is marked idle. One SSH command per node per refresh, all at once.
    Ctrl-C ends it."""
    record = records.load(run) if run else run_top.newest_running()
    with run_top.Top(record, inventory_path=nodes, window_s=window, timeout=timeout) as reader:
        if once:
            snap = reader.refresh()
            _emit(snap, json_, prometheus, None)
            down = [n for n, m in snap.nodes.items() if m.error]
            raise typer.Exit(exitcodes.FAILURE if down else exitcodes.OK)
        try:
            if json_ or not console.interactive():
                _loop_plain(reader, json_, prometheus, interval)
            else:
                _loop_live(reader, prometheus, interval)
        except KeyboardInterrupt:
            pass
    raise typer.Exit(exitcodes.OK)


def _emit(snap: run_top.Snapshot, json_: bool, prometheus: Path | None, interval: float | None) -> None:
    if prometheus is not None:
        run_top.write_prometheus(prometheus, snap)
    if json_:
        typer.echo(json.dumps(snap.as_json()))
    else:
        console.out.print(render(snap, interval))


def _pause(started: float, interval: float) -> None:
    time.sleep(max(0.0, interval - (time.monotonic() - started)))


def _loop_plain(reader: run_top.Top, json_: bool, prometheus: Path | None, interval: float) -> None:
    while True:
        started = time.monotonic()
        _emit(reader.refresh(), json_, prometheus, interval)
        _pause(started, interval)


def _loop_live(reader: run_top.Top, prometheus: Path | None, interval: float) -> None:
    with Live(Text(f"reading the nodes of run {reader.record.run_id}..."), console=console.out,
              auto_refresh=False, transient=False) as live:
        while True:
            started = time.monotonic()
            snap = reader.refresh()
            if prometheus is not None:
                run_top.write_prometheus(prometheus, snap)
            live.update(render(snap, interval), refresh=True)
            _pause(started, interval)


def register(app: typer.Typer) -> None:
    app.command("top")(top)
