"""Run records: ``runs/<run-id>/run.json`` plus one ``<node>.log`` per node.

A run record is what survives a run: which inventory and job, which image ID,
the (masked) environment each node got, when it started and ended, every
node's exit code and the first failure.  ``logs``/``status``/``stop`` find a
run's containers on the nodes by the label ``io.clusterctl.run=<id>`` and fall
back to this record once the containers are gone.

Besides the record itself (:class:`RunRecord`, :func:`load`, :func:`resolve`,
:func:`list_runs`), this module decides what a record implies about the nodes:
:func:`may_have_containers` (whether to ask the nodes at all),
:func:`run_status` (each node's word, else the record's),
:func:`containers_ended` (every container ended but nobody recorded it yet) and
:func:`record_stop` (what ``clusterctl stop`` found becomes the run's outcome).
The ``docker`` commands themselves live in :mod:`clusterctl.cluster.containers`.

run.json is rewritten atomically (temp file + rename) so a reader never sees a
half-written record, even while ``launch`` is still updating it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from clusterctl.cluster.containers import ContainerState, find_containers
from clusterctl.core.deadline import bounded
from clusterctl.core.errors import UserError, did_you_mean
from clusterctl.core.paths import runs_dir

RECORD_NAME = "run.json"
MERGED_LOG = "merged.log"

# A run id becomes a directory name, a docker label value and part of container
# names, so it is restricted to what is valid in all three.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_run_id(job_name: str, now: datetime | None = None) -> str:
    """``<job>-<UTC yyyymmdd-hhmmss>-<4 hex>``: readable, unique, sorts by time within a job."""
    now = now or utcnow()
    job = re.sub(r"[^A-Za-z0-9_.-]+", "-", job_name).strip("-.") or "run"
    return f"{job[:30]}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """The run id itself, or UserError saying what a valid one looks like."""
    if not _RUN_ID.match(run_id):
        raise UserError(
            f"--run-id {run_id!r} is not valid: use 1-63 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (it becomes a directory name, a docker label "
            "and part of container names)."
        )
    return run_id


class FailureRecord(BaseModel):
    """The failure that happened first (by time) in a run."""

    node: str
    rank: int
    kind: str  # "exit" (container exited non-zero), "lost" (node stopped answering), "start"
    exit_code: int
    time: datetime
    reason: str = ""
    last_lines: list[str] = Field(default_factory=list)


class NodeRecord(BaseModel):
    """One node's part of a run."""

    node: str
    host: str
    rank: int
    container: str
    env: dict[str, str] = Field(default_factory=dict)  # masked: secrets never stored
    state: str = "created"  # created | running | exited | stopped | lost | unknown
    exit_code: int | None = None
    started: datetime | None = None
    finished: datetime | None = None


class RunRecord(BaseModel):
    """Everything ``runs/<run-id>/run.json`` holds."""

    run_id: str
    job: str
    inventory: str
    image: str
    image_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    detached: bool = False
    state: str = "starting"  # starting | running | succeeded | failed | interrupted | start-failed | stopped
    exit_code: int | None = None
    started: datetime = Field(default_factory=utcnow)
    finished: datetime | None = None
    nodes: list[NodeRecord] = Field(default_factory=list)
    first_failure: FailureRecord | None = None
    argv: list[str] = Field(default_factory=list)  # the clusterctl command line, for the record
    scheduler: str = "ssh"  # ssh | slurm (older run.json files have none: ssh)
    slurm_job: str | None = None  # the Slurm job id of a slurm run

    @property
    def dir(self) -> Path:
        return run_path(self.run_id)

    def node(self, name: str) -> NodeRecord:
        for n in self.nodes:
            if n.node == name:
                return n
        names = [n.node for n in self.nodes]
        raise UserError(
            f"run {self.run_id} has no node {name!r}{did_you_mean(name, names)}; its nodes are "
            + ", ".join(names) + "."
        )

    def log_path(self, node: str) -> Path:
        return self.dir / f"{node}.log"

    def save(self) -> Path:
        """Write run.json atomically (a reader sees the old or the new record, never half)."""
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        target = d / RECORD_NAME
        fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".json", dir=d)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.model_dump_json(indent=2))
                f.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


def run_path(run_id: str) -> Path:
    return runs_dir() / run_id


def load(run_id: str) -> RunRecord:
    """The record of ``run_id``; UserError naming the file when missing or unreadable."""
    check_run_id(run_id)
    path = run_path(run_id) / RECORD_NAME
    if not path.is_file():
        known = [r.run_id for r in list_runs()]
        hint = did_you_mean(run_id, known)
        raise UserError(
            f"no run {run_id!r} in {runs_dir()}{hint} (no {path}). `clusterctl runs` lists the "
            "runs recorded there; CLUSTERCTL_RUNS points to another runs directory."
        )
    try:
        return RunRecord.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as e:
        raise UserError(f"{path} is not a valid run record ({_first_error(e)}); "
                        "it was edited or written by another version.") from None


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"field {loc}: {first['msg']}"
    return str(e).splitlines()[0]


def list_runs() -> list[RunRecord]:
    """Every readable run record under runs_dir(), newest first (by start time)."""
    root = runs_dir()
    if not root.is_dir():
        return []
    found: list[RunRecord] = []
    for path in root.glob(f"*/{RECORD_NAME}"):
        try:
            found.append(RunRecord.model_validate_json(path.read_text()))
        except (ValidationError, ValueError, OSError):
            continue  # a foreign or damaged directory is not a run; `runs` skips it
    found.sort(key=lambda r: (r.started, r.run_id), reverse=True)
    return found


def resolve(run_id: str | None) -> RunRecord:
    """``run_id``'s record, or the newest run's when None."""
    if run_id:
        return load(run_id)
    all_runs = list_runs()
    if not all_runs:
        raise UserError(
            f"no runs recorded in {runs_dir().resolve()} yet; start one with "
            "`clusterctl launch JOB --nodes INVENTORY` (CLUSTERCTL_RUNS points elsewhere)."
        )
    return all_runs[0]


def summary_rows(records: list[RunRecord]) -> list[list[str]]:
    """Rows for the ``clusterctl runs`` table."""
    rows = []
    for r in records:
        rows.append([
            r.run_id, r.job, str(len(r.nodes)), r.state,
            "" if r.exit_code is None else str(r.exit_code),
            _short_time(r.started), _short_time(r.finished),
            "" if r.first_failure is None else f"{r.first_failure.node}[{r.first_failure.rank}]",
        ])
    return rows


def _short_time(t: datetime | None) -> str:
    return "" if t is None else t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def dump(record: RunRecord) -> str:
    return json.dumps(json.loads(record.model_dump_json()), indent=2)


# --- what a record implies about the nodes ---------------------------------------------------

def may_have_containers(record: RunRecord) -> bool:
    """Whether the run's containers may still exist on the nodes.

    A followed run that ended had its containers removed by launch; a detached
    run, one still starting or running, or one with a lost node may still have some.
    """
    return record.detached or record.state in ("starting", "running") or any(
        n.state == "lost" for n in record.nodes)


def record_stop(record: RunRecord, final: dict[str, list[ContainerState]], was_running: bool) -> None:
    """Put what ``clusterctl stop`` found in the record and save it.

    ``final``: node -> its containers' last states (before removal);
    ``was_running``: some container was still running and was stopped.  A
    run that was stopped is "stopped"; a detached run that had ended by itself
    gets its true outcome, the first failure by time.
    """
    for n in record.nodes:
        if final.get(n.node):
            st = final[n.node][0]
            n.state, n.exit_code, n.started, n.finished = st.status, st.exit_code, st.started, st.finished
    if was_running:
        record.state, record.finished = "stopped", record.finished or utcnow()
    elif record.state in ("starting", "running") and all(n.exit_code is not None for n in record.nodes):
        failed = sorted((n for n in record.nodes if n.exit_code), key=lambda n: n.finished or utcnow())
        record.state = "failed" if failed else "succeeded"
        record.exit_code = failed[0].exit_code if failed else 0
        record.finished = max((n.finished for n in record.nodes if n.finished), default=utcnow())
    record.save()


# --- status: the nodes' word first, the record's when a node cannot tell -------------------

class NodeStatus(BaseModel):
    """One row of ``clusterctl status``."""

    node: str
    rank: int
    container: str
    state: str
    exit_code: int | None = None
    started: datetime | None = None
    finished: datetime | None = None
    source: str = "node"  # "node": read from the node now; "record": from run.json
    note: str = ""


def run_status(record: RunRecord, cluster, *, timeout: float = 15.0) -> list[NodeStatus]:
    """Each node's container of ``record``'s run, as the node reports it (found by label).

    A node that does not answer in ``timeout`` or no longer has the container
    falls back to what run.json recorded, and the row says so.
    """
    def ask(conn):
        return bounded(lambda: find_containers(conn, record.run_id, timeout=timeout), timeout,
                       name=f"status-{conn.name}")

    known = [n.node for n in record.nodes if _in_inventory(cluster, n.node)]
    answers = cluster.map(ask, nodes=known) if known else {}
    rows = []
    for n in record.nodes:
        found = answers.get(n.node)
        if isinstance(found, list) and found:
            st = found[0]
            rows.append(NodeStatus(node=n.node, rank=n.rank, container=st.name, state=st.status,
                                   exit_code=st.exit_code, started=st.started, finished=st.finished))
            continue
        if n.node not in known:
            note = "not in this inventory"
        elif isinstance(found, list):
            note = "container removed"
        else:
            note = f"node not answering: {getattr(found, 'reason', found)}"
        rows.append(NodeStatus(node=n.node, rank=n.rank, container=n.container, state=n.state,
                               exit_code=n.exit_code, started=n.started, finished=n.finished,
                               source="record", note=note))
    return rows


def _in_inventory(cluster, name: str) -> bool:
    return any(node.name == name for node in cluster.inventory.nodes)


def containers_ended(record: RunRecord, rows: list[NodeStatus]) -> bool:
    """Every container of a run the record still calls starting/running has ended on its
    node (as the nodes say now): ``clusterctl stop`` would record the outcome."""
    return record.state in ("starting", "running") and bool(rows) and all(
        r.source == "node" and r.state in ("exited", "dead") for r in rows)


def status_rows(rows: list[NodeStatus]) -> list[list[str]]:
    return [[r.node, str(r.rank), r.state, "" if r.exit_code is None else str(r.exit_code),
             _short_time(r.started), _short_time(r.finished),
             r.source + (f" ({r.note})" if r.note else "")] for r in rows]
