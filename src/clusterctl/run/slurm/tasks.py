"""What each Slurm task records about its container, and the run's outcome read from that.

srun's own status is the highest exit code of all tasks (the survivors it kills give
137/143), so every task writes its container's OWN exit code and finish time to
``<run_dir>/slurm/<node>.json`` (:mod:`clusterctl.run.slurm.script`), and the first failure
is read from these records.  Pure apart from reading the files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from clusterctl.cluster.containers import parse_docker_time
from clusterctl.core.errors import UserError
from clusterctl.core.files import read_below
from clusterctl.core.paths import runs_dir
from clusterctl.run import hints, supervise

#: The most a task record may hold: the script writes one line of a few numbers and names.
TASK_RECORD_LIMIT = 64 << 10


@dataclass(frozen=True)
class TaskRecord:
    """What one task wrote to ``<run_dir>/slurm/<node>.json``."""

    node: str
    rank: int
    exit_code: int
    finished: datetime
    stopped: bool = False


def read_task_records(records_dir: Path) -> dict[str, TaskRecord]:
    """Every readable task record, by node (a half-written one is skipped, and so is one that
    is no record a task wrote: a symlink at any component below the runs directory, a FIFO, a
    file past :data:`TASK_RECORD_LIMIT`; :func:`~clusterctl.core.files.read_below`, never
    followed, waited on nor read whole)."""
    found: dict[str, TaskRecord] = {}
    for path in sorted(records_dir.glob("*.json")) if records_dir.is_dir() else []:
        try:
            d = json.loads(read_below(runs_dir(), path, limit=TASK_RECORD_LIMIT))
            found[d["node"]] = TaskRecord(node=d["node"], rank=int(d["rank"]), exit_code=int(d["exit_code"]),
                                          finished=_parse_time(d["finished"]),
                                          stopped=bool(d.get("stopped", False)))
        except (OSError, ValueError, KeyError, TypeError, UserError):
            continue
    return found


def _parse_time(text: str) -> datetime:
    """The finish time a task wrote: its runtime's FinishedAt
    (:func:`~clusterctl.cluster.containers.parse_docker_time`: Docker's or Podman's form) or
    ``date -u +%Y-%m-%dT%H:%M:%S.%NZ``; ValueError for anything else.  The zero time (a
    container that never ran) is kept as the earliest time, not refused."""
    text = text.strip()
    if text.startswith("0001-01-01"):
        return datetime(1, 1, 1, tzinfo=timezone.utc)
    t = parse_docker_time(text)
    if t is None:
        raise ValueError(f"not a container time: {text[:80]!r}")
    return t


def outcome_of(tasks: Mapping[str, TaskRecord], nodes: Sequence[str], *, ended: float,
               interrupted: str | None, last_lines: Mapping[str, list[str]],
               slurm_exit: int | None = None,
               known_causes: Mapping[str, hints.Hint] | None = None) -> supervise.Outcome:
    """The run's outcome from the tasks' records: first failure by finish time.

    A task stopped by a signal (the teardown after another node failed, or scancel) is
    no failure; a node with no record is lost at ``ended``.  ``known_causes``: each node's
    first output line with a known cause (:class:`~clusterctl.run.hints.FirstHints`), which
    the failure report names under the first failure, as for a run launched over SSH.
    """
    failures = [supervise.Failure(t.node, t.rank, "exit", t.exit_code, t.finished.timestamp())
                for t in tasks.values() if t.exit_code and not t.stopped]
    if not failures and interrupted is None:
        # nothing failed on its own, yet tasks were stopped: the job was cancelled from
        # outside (`clusterctl stop`, scancel, its time limit), which is no success
        failures = [supervise.Failure(t.node, t.rank, "exit", t.exit_code, t.finished.timestamp(),
                                      "stopped by Slurm (scancel or the time limit)")
                    for t in tasks.values() if t.exit_code and t.stopped]
    if interrupted is None:
        for rank, node in enumerate(nodes):
            if node not in tasks:
                failures.append(supervise.Failure(
                    node, rank, "lost", slurm_exit or supervise.NODE_LOST_EXIT, ended,
                    "its Slurm task left no record (cancelled before it ran, or the node failed)"))
    first = supervise.first_failure(failures)
    code = supervise.run_exit_code(first, interrupted)
    state = "interrupted" if interrupted else ("failed" if first else "succeeded")
    return supervise.Outcome(
        exit_code=code, state=state, first_failure=first, failures=failures,
        exit_codes={n: (tasks[n].exit_code if n in tasks else None) for n in nodes},
        containers={}, last_lines={k: list(v) for k, v in last_lines.items()},
        known_causes=dict(known_causes or {}))
