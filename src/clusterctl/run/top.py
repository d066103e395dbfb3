"""``clusterctl top``: a running run, node by node, refresh after refresh.

Each refresh reads every node of the run at once, ONE SSH command a node
(:func:`clusterctl.cluster.nodetop.read_nodes`): its container's CPU and memory, the
node's GPUs (``nvidia-smi``) or MLUs (``cnmon``), and the container's newest metrics lines
(``clusterctl-metrics {...}``, :mod:`clusterctl.run.metrics`).  :class:`Top` keeps each
rank's samples between refreshes (bounded), so the rates (steps/s, samples/s) are over
the last ``window_s`` seconds; :func:`mark_idle` names a node that does nothing while
others work.  The connections stay open between refreshes (one ``Cluster``).

Contract:
    RUNNING                              the states of a run that has containers to read
    newest_running() -> RunRecord        the caller's newest run in RUNNING (UserError if none)
    where(record, inventory) -> [Where]  each node's container and runtime (ssh runs only)
    Top(record, inventory_path=None, window_s=..., timeout=...)  a context manager;
        .refresh() -> Snapshot           one read of every node
    mark_idle(nodes) -> {node: NodeMetrics}  pure: ``idle``/``idle_why`` set
    keep_samples(per_rank, lines)        a refresh's metrics lines added to what was kept
    Snapshot.as_json() / .prometheus()   what ``--json`` prints and ``--prometheus`` writes
    write_prometheus(path, snapshot)     the text format, atomically (textfile collector)
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterctl.cluster.inventory import Inventory, load_inventory
from clusterctl.cluster.nodetop import NodeRead, Where, read_nodes
from clusterctl.cluster.runtime import node_runtime
from clusterctl.cluster.transport.cluster import Cluster
from clusterctl.core.errors import UserError
from clusterctl.core.files import write_atomic
from clusterctl.run import backends, records
from clusterctl.run.metrics import (
    KEEP,
    WINDOW_S,
    NodeMetrics,
    Sample,
    parse_line,
    prometheus_text,
    rates,
)

if TYPE_CHECKING:
    from clusterctl.run.records import RunRecord

#: run states whose containers may be running
RUNNING = ("starting", "running", "restarting")
#: CPU % (100 = one core) under which a node is idle when another is busy, and over which
#: a node is busy; the same for a node's accelerators' utilization
IDLE_CPU, BUSY_CPU = 5.0, 25.0
IDLE_GPU, BUSY_GPU = 5.0, 25.0


def newest_running() -> RunRecord:
    """The caller's newest run that may still be running; UserError naming what there is."""
    runs = [r for r in records.list_runs() if records.others_run(r) is None]
    for r in runs:
        if r.state in RUNNING:
            return r
    if runs:
        r = runs[0]
        raise UserError(f"none of your runs is running: the newest, {r.run_id}, is {r.state}. "
                        f"Name a run (`clusterctl top RUN`); `clusterctl runs` lists them.")
    records.resolve(None)  # says there is none (or whose the newest is)
    raise UserError("no runs of yours recorded; start one with `clusterctl launch`.")


def where(record: RunRecord, inventory: Inventory) -> list[Where]:
    """Each node's container of ``record`` and the runtime that runs it (rank order)."""
    backend = backends.for_record(record)
    if backend.name != "ssh":
        raise UserError(f"run {record.run_id} ran through {backend.name}: its containers are the "
                        "scheduler's tasks, which clusterctl does not reach over SSH; use the "
                        "scheduler's own tools (`sstat`, `squeue`).")
    by_name = {n.name: n for n in inventory.nodes}
    missing = [n.node for n in record.nodes if n.node not in by_name]
    if missing:
        raise UserError(f"run {record.run_id}'s node(s) {', '.join(missing)} are not in inventory "
                        f"{inventory.path}; give the run's inventory with --nodes FILE.")
    if not record.nodes:
        raise UserError(f"run {record.run_id} has no containers recorded yet ({record.state}).")
    return [Where(n.node, n.rank, n.container, node_runtime(by_name[n.node]))
            for n in sorted(record.nodes, key=lambda n: n.rank)]


def _max_gpu(m: NodeMetrics) -> float | None:
    utils = [g.util_percent for g in m.gpus if g.util_percent is not None]
    return max(utils) if utils else None


def mark_idle(nodes: Mapping[str, NodeMetrics]) -> dict[str, NodeMetrics]:
    """The nodes with ``idle`` and ``idle_why`` set (pure).

    A node that answered is idle when another works and it does not: its ranks made no
    step in the window while another node's did; or its accelerators are under
    :data:`IDLE_GPU` % while another node's are over :data:`BUSY_GPU` %; or its container's
    CPU is under :data:`IDLE_CPU` % while another node's is over :data:`BUSY_CPU` %.
    """
    out: dict[str, NodeMetrics] = {}
    up = {name: m for name, m in nodes.items() if m.error is None}
    for name, m in nodes.items():
        others = [o for n, o in up.items() if n != name]
        why = ""
        if m.error is None and others:
            steps = m.rates.steps_per_s
            gpu = _max_gpu(m)
            if steps == 0 and any((o.rates.steps_per_s or 0) > 0 for o in others):
                since = "" if m.rates.last_step is None else f" (last step {m.rates.last_step})"
                why = f"no step in the window while others step{since}"
            elif gpu is not None and gpu < IDLE_GPU and any((_max_gpu(o) or 0) >= BUSY_GPU for o in others):
                why = f"accelerators at {gpu:g}% while others work"
            elif (m.cpu_percent is not None and m.cpu_percent < IDLE_CPU
                  and any((o.cpu_percent or 0) >= BUSY_CPU for o in others)):
                why = f"CPU {m.cpu_percent:.1f}% while others work"
        out[name] = dataclasses.replace(m, idle=bool(why), idle_why=why)
    return out


def keep_samples(per_rank: dict[int, deque[Sample]], lines: Sequence[str], *,
                 keep: int = KEEP) -> list[Sample]:
    """Add a refresh's metrics lines to what was kept of each rank (pure but for
    ``per_rank``, updated): a line already seen (not newer than the rank's last) is left
    out, at most ``keep`` a rank are kept.  Every kept sample, rank by rank."""
    for line in lines:
        s = parse_line(line)
        if s is None:
            continue
        kept = per_rank.setdefault(s.rank, deque(maxlen=keep))
        if kept and s.time <= kept[-1].time:
            continue  # seen in an earlier refresh's tail
        kept.append(s)
    return [s for rank in sorted(per_rank) for s in per_rank[rank]]


@dataclass(frozen=True)
class Snapshot:
    """One refresh: every node of the run (rank order), when, and how long the read took."""

    run_id: str
    time: float
    read_s: float
    nodes: dict[str, NodeMetrics]
    problems: dict[str, tuple[str, ...]]
    gpu_tools: dict[str, str | None]

    def as_json(self) -> dict[str, Any]:
        rows = []
        for name, m in self.nodes.items():
            r = m.rates
            rows.append({
                "node": name, "rank": m.rank, "error": m.error,
                "cpu_percent": m.cpu_percent, "memory_bytes": m.memory_bytes,
                "memory_limit_bytes": m.memory_limit_bytes,
                "gpu_tool": self.gpu_tools.get(name),
                "gpus": [dataclasses.asdict(g) for g in m.gpus],
                "steps_per_s": r.steps_per_s, "samples_per_s": r.samples_per_s,
                "last_step": r.last_step, "last_loss": r.last_loss, "last_time": r.last_time,
                "idle": m.idle, "idle_why": m.idle_why or None,
                "problems": list(self.problems.get(name, ())),
            })
        return {"run": self.run_id, "time": self.time, "read_seconds": round(self.read_s, 3),
                "nodes": rows}

    def prometheus(self) -> str:
        return prometheus_text(self.run_id, self.nodes)


def write_prometheus(path: Path, snapshot: Snapshot) -> None:
    """The snapshot in the text format, written whole or not at all (a textfile collector
    reading ``*.prom`` never sees half a file)."""
    write_atomic(path, snapshot.prometheus())


class Top:
    """A run's nodes, read refresh after refresh over connections kept open."""

    def __init__(self, record: RunRecord, *, inventory_path: Path | None = None,
                 window_s: float = WINDOW_S, timeout: float = 10.0) -> None:
        self.record = record
        self.inventory = load_inventory(inventory_path or record.inventory)
        self.where: Sequence[Where] = where(record, self.inventory)
        self.window_s, self.timeout = window_s, timeout
        self._kept: dict[str, dict[int, deque[Sample]]] = {w.node: {} for w in self.where}
        self._cluster: Cluster | None = None

    def __enter__(self) -> Top:
        self._cluster = Cluster(self.inventory)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def refresh(self) -> Snapshot:
        if self._cluster is None:
            raise RuntimeError("Top.refresh outside `with Top(...)`")
        t0 = time.monotonic()
        got: dict[str, NodeRead] = read_nodes(self._cluster, self.where, timeout=self.timeout)
        now = time.time()
        nodes: dict[str, NodeMetrics] = {}
        for w in self.where:
            read = got[w.node]
            samples = keep_samples(self._kept[w.node], read.metric_lines)
            c = read.container
            nodes[w.node] = NodeMetrics(
                node=w.node, rank=w.rank, rates=rates(samples, self.window_s, now=now),
                cpu_percent=c.cpu_percent if c else None, memory_bytes=c.memory_bytes if c else None,
                memory_limit_bytes=c.memory_limit_bytes if c else None, gpus=read.gpus,
                error=read.error)
        return Snapshot(run_id=self.record.run_id, time=now, read_s=time.monotonic() - t0,
                        nodes=mark_idle(nodes),
                        problems={n: r.problems for n, r in got.items() if r.problems},
                        gpu_tools={n: r.gpu_tool for n, r in got.items()})


__all__ = ["BUSY_CPU", "BUSY_GPU", "IDLE_CPU", "IDLE_GPU", "RUNNING", "Snapshot", "Top", "keep_samples",
           "mark_idle", "newest_running", "where", "write_prometheus"]
