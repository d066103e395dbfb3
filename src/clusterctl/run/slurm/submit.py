"""Submit a rendered sbatch script to a real Slurm and follow it to its true end.

``submit(job, options, ...)`` is ``launch --scheduler slurm`` without the CLI:

1. render the script (:mod:`clusterctl.run.slurm.script`) and check the cluster
   (:func:`check_cluster`: Slurm new enough, ``--partition`` known); in docker mode with an
   inventory, push the image to its nodes first (clusterctl's own push); with
   ``--nnodes`` only Slurm picks the nodes, so the image must already be on them
   (``on_note`` says so);
2. write ``runs/<id>/sbatch.sh`` and run.json (``scheduler: slurm``), then
   ``sbatch --parsable`` (secret values only in sbatch's environment, never the script);
3. follow: the job's labelled output (``N: text``, N the task = node rank) becomes the
   merged ``node[rank]| text`` stream and runs/<id>/ files (:class:`~clusterctl.run.logs.LogSink`);
   ``squeue`` is polled, each call bounded, until the job has left the queue;
4. the exit code is read from the per-node records the tasks wrote (the containers' own
   exit codes, ``<run_dir>/slurm/<node>.json``): the first failure by finish time, 0
   when all are 0.  srun's own status would be the highest code of all tasks.
   A node without a record (the job was cancelled before it ran, a node died) counts as
   lost, at the job's end time;
5. Ctrl-C / SIGTERM (``stop_event``): ``scancel``, then the job is followed to its end
   and the exit status is 130 / 143.  With an inventory, any container of the run still
   on a node afterwards is removed (nothing is left running).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

import hostlist

from clusterctl.cluster import containers
from clusterctl.cluster.inventory import Inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import ClusterctlError, UserError, did_you_mean, one_of
from clusterctl.run import launch as launching
from clusterctl.run import logs, plan, records, supervise
from clusterctl.run.jobs import Job
from clusterctl.run.slurm import script as slurm_script
from clusterctl.run.slurm.options import SlurmOptions

SCRIPT_NAME = "sbatch.sh"
CLIENT_TIMEOUT = 30.0     # seconds one sbatch / squeue / scontrol / scancel call may take
POLL_INTERVAL = 1.0       # seconds between reads of the job's output
QUEUE_EVERY = 2.0         # seconds between squeue calls
END_GRACE = 10.0          # after the job left the queue: wait this long for the tasks' records
CANCEL_WAIT = 120.0       # after scancel: follow the job this long at most


class SubmitFailed(UserError):
    """sbatch did not accept the job (a partition it does not know, a node count too
    large...); nothing was submitted (exit 2)."""


@dataclass
class SlurmResult:
    """What :func:`submit` returns (the same shape the CLI reports for an SSH launch)."""

    run_id: str
    exit_code: int
    record: records.RunRecord
    outcome: supervise.Outcome | None = None
    job_id: str = ""
    slurm_state: str = ""

    @property
    def summary(self) -> list[str]:
        return supervise.summary_lines(self.outcome) if self.outcome else []


def slurm_client(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    """One Slurm client call (argv list), bounded; never raises for a non-zero status."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} timed out after {timeout:.0f}s")


# --------------------------------------------------------------------------- the cluster first

#: The oldest Slurm clusterctl submits to. The sandbox (Debian bookworm) runs 22.05;
#: 20.11 is the oldest release whose srun/sbatch options the script uses unchanged
#: (--kill-on-bad-exit, --label, --parsable, scontrol show hostnames all predate it).
MIN_SLURM = (20, 11)


def parse_slurm_version(text: str) -> tuple[int, int] | None:
    """``sbatch --version``'s ``slurm 22.05.8`` (or ``slurm-wlm 22.05.8``) -> (22, 5)."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None


def check_cluster(options: SlurmOptions, env: Mapping[str, str]) -> None:
    """Before anything is pushed, written or submitted: the Slurm is new enough and knows
    ``--partition``. UserError (exit 2) naming what is wrong and what would work."""
    res = slurm_client(["sbatch", "--version"], env=env)
    version = parse_slurm_version(res.stdout) if res.returncode == 0 else None
    if version is None:
        raise UserError(f"cannot tell the Slurm version: `sbatch --version` gave "
                        f"{(res.stdout + res.stderr).strip()[:200]!r}; valid: a Slurm client "
                        "(slurm-client) that answers with its version.")
    if version < MIN_SLURM:
        raise UserError(f"Slurm {version[0]}.{version[1]:02d} is too old for clusterctl; valid: "
                        f"Slurm {MIN_SLURM[0]}.{MIN_SLURM[1]:02d} or newer. Nothing was submitted.")
    if options.partition:
        res = slurm_client(["sinfo", "-h", "-o", "%R"], env=env)
        if res.returncode != 0:
            raise UserError(f"sinfo could not list the partitions: "
                            f"{(res.stderr or res.stdout).strip()[:300]}; nothing was submitted "
                            "(is SLURM_CONF right, does slurmctld answer?).")
        known = sorted({line.strip() for line in res.stdout.splitlines() if line.strip()})
        if options.partition not in known:
            raise UserError(f"--partition {options.partition!r} is not a partition of this Slurm "
                            f"cluster{did_you_mean(options.partition, known)}; valid: "
                            f"{one_of(known) or '(sinfo lists none)'}. Nothing was submitted.")


# --------------------------------------------------------------------------- pure parts

def parse_job_id(parsable: str) -> str:
    """``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER``."""
    first = parsable.strip().splitlines()[0] if parsable.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"sbatch printed {parsable.strip()!r}, not a job id")
    return job_id


def parse_label(line: str) -> tuple[int, str] | None:
    """``srun --label``'s ``N: text`` -> (N, text); None for Slurm's own lines."""
    head, sep, text = line.partition(": ")
    if not sep:
        head, sep, text = line.partition(":")
    head = head.strip()
    if sep and head.isdigit():
        return int(head), text
    return None


def scontrol_fields(text: str) -> dict[str, str]:
    """``scontrol show job`` output -> {field: value} (values without spaces)."""
    out: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


@dataclass(frozen=True)
class TaskRecord:
    """What one task wrote to ``<run_dir>/slurm/<node>.json``."""

    node: str
    rank: int
    exit_code: int
    finished: datetime
    stopped: bool = False


def read_task_records(records_dir: Path) -> dict[str, TaskRecord]:
    """Every readable task record, by node (a half-written one is skipped)."""
    found: dict[str, TaskRecord] = {}
    for path in sorted(records_dir.glob("*.json")) if records_dir.is_dir() else []:
        try:
            d = json.loads(path.read_text())
            found[d["node"]] = TaskRecord(node=d["node"], rank=int(d["rank"]), exit_code=int(d["exit_code"]),
                                          finished=_parse_time(d["finished"]),
                                          stopped=bool(d.get("stopped", False)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _parse_time(text: str) -> datetime:
    """Docker's FinishedAt / ``date +%N`` times (nanoseconds) as an aware datetime."""
    text = text.strip().replace("Z", "+00:00")
    if "." in text:
        head, rest = text.split(".", 1)
        digits = "".join(c for c in rest if c.isdigit())
        tz = rest[len(digits):] or "+00:00"
        text = f"{head}.{digits[:6].ljust(6, '0')}{tz}"
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def outcome_of(tasks: Mapping[str, TaskRecord], nodes: Sequence[str], *, ended: float,
               interrupted: str | None, last_lines: Mapping[str, list[str]],
               slurm_exit: int | None = None) -> supervise.Outcome:
    """The run's outcome from the tasks' records: first failure by finish time.

    A task stopped by a signal (the teardown after another node failed, or scancel) is
    no failure; a node with no record is lost at ``ended``.
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
        containers={}, last_lines={k: list(v) for k, v in last_lines.items()})


# --------------------------------------------------------------------------- the follower

class OutputTail:
    """Reads the job's output file as it grows and hands labelled lines to a sink."""

    def __init__(self, path: Path, sink: logs.LogSink) -> None:
        self.path, self.sink = path, sink
        self.nodes: list[str] = []      # task id (= node rank) -> node name, once known
        self._pos, self._partial, self._held = 0, "", []

    def read(self, final: bool = False) -> None:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self._pos)
                data = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return
        text = self._partial + data
        lines = text.split("\n")
        self._partial = "" if final else lines.pop()
        for line in lines:
            if line or final:
                self._line(line)
        self.flush_held()
        if data:
            self.sink.flush()     # runs/<id>/ is what `clusterctl logs` reads during the run

    def _line(self, line: str) -> None:
        parsed = parse_label(line)
        if parsed is None:
            return          # Slurm's own lines ("srun: error: ..."): in slurm-<job>.out only
        task, text = parsed
        if task < len(self.nodes):
            self.sink.write(self.nodes[task], text)
        else:
            self._held.append((task, text))

    def flush_held(self) -> None:
        if self.nodes and self._held:
            held, self._held = self._held, []
            for task, text in held:
                self.sink.write(self.nodes[task] if task < len(self.nodes) else f"task{task}", text)


def job_nodes(job_id: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """(JobState, the job's nodes in task order) from ``scontrol show job``; ("", []) unknown."""
    res = slurm_client(["scontrol", "-o", "show", "job", job_id], env=env)
    if res.returncode != 0:
        return "", []
    f = scontrol_fields(res.stdout)
    nodelist = f.get("NodeList", "")
    names = hostlist.expand_hostlist(nodelist) if nodelist and nodelist != "(null)" else []
    return f.get("JobState", ""), names


def in_queue(job_id: str, env: Mapping[str, str]) -> bool | None:
    """Whether the job is still pending/running; None when squeue could not tell."""
    res = slurm_client(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env)
    if res.returncode != 0:
        # squeue errors with "Invalid job id" once a finished job is purged
        return False if "Invalid job id" in res.stderr else None
    state = res.stdout.strip()
    return bool(state) and state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                         "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL")


# --------------------------------------------------------------------------- submit

@dataclass
class _Signals:
    caught: list[str] = field(default_factory=list)


def render(job: Job, options: SlurmOptions, *, run_id: str, inventory: Inventory | None = None,
           image: str | None = None, overrides: Mapping[str, str] | None = None,
           env: Mapping[str, str] | None = None) -> slurm_script.SlurmScript:
    """The sbatch script of run ``run_id``, from the facts this machine gives (what both
    ``--dry-run`` and :func:`submit` use): clusterctl's environment (``env``, default
    os.environ: secrets listed by the job) and, with an inventory, its nodes' addresses
    (the containers' ``--add-host`` entries). UserError (exit 2) on unusable input."""
    host_env = dict(os.environ if env is None else env)
    addresses = launching.local_facts(inventory)["addresses"] if inventory is not None else None
    return slurm_script.render_script(job, options, run_id=run_id,
                                      run_dir=records.run_path(run_id).resolve(),
                                      inventory=inventory, image=image, overrides=overrides,
                                      host_env=host_env, addresses=addresses)


def submit(job: Job, options: SlurmOptions, *, inventory: Inventory | None = None,
           image: str | None = None, overrides: Mapping[str, str] | None = None,
           run_id: str | None = None, stream: TextIO | None = None, color: bool | None = None,
           stop_event: threading.Event | None = None, handle_signals: bool = False,
           push: bool = True, progress=None, argv: Sequence[str] = (),
           env: Mapping[str, str] | None = None,
           on_note: Callable[[str], None] | None = None,
           on_submitted: Callable[[records.RunRecord], None] | None = None) -> SlurmResult:
    """Submit ``job`` to Slurm, follow it, return its true outcome (see the module docstring).

    ``env``: the Slurm clients' environment (default this process's; SLURM_CONF in it).
    """
    note = on_note or (lambda _msg: None)
    base_env = dict(os.environ if env is None else env)
    run_id = launching._fresh_run_id(run_id, job)
    run_dir = records.run_path(run_id).resolve()
    script = render(job, options, run_id=run_id, inventory=inventory, image=image,
                    overrides=overrides, env=base_env)
    stop_event = stop_event or threading.Event()
    check_cluster(options, base_env)       # nothing pushed, written or submitted before this
    if options.container == "docker":
        if inventory is not None and push:
            launching.local_image_id(script.image)          # UserError when not here
            with Cluster(inventory) as cluster:
                launching.push_image(cluster, script.image, progress)
        elif inventory is None:
            note(f"--nnodes: Slurm chooses the nodes, so clusterctl cannot push {script.image} to "
                 "them; it must already be on every node of the partition (a node without it "
                 "fails with exit 125). Give --nodes FILE to have it pushed.")
    record = _new_record(job, script, inventory, argv)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / slurm_script.RECORDS_DIR).mkdir(exist_ok=True)
    script_path = run_dir / SCRIPT_NAME
    script_path.write_text(script.text)
    record.save()
    res = slurm_client(["sbatch", "--parsable", str(script_path)],
                       env={**base_env, **script.environment})
    try:
        if res.returncode != 0:
            raise ValueError(res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}")
        job_id = parse_job_id(res.stdout)
    except ValueError as e:
        record.state, record.exit_code, record.finished = "start-failed", 2, records.utcnow()
        record.save()
        raise SubmitFailed(f"sbatch did not accept run {run_id}: {e}; nothing was submitted "
                           f"(script: {script_path}).") from None
    record.slurm_job, record.state = job_id, "running"
    record.save()
    if on_submitted is not None:
        on_submitted(record)
    sig = _Signals()
    with launching.stop_on_signals(stop_event, sig.caught.append) if handle_signals else nullcontext():
        outcome, slurm_state = _follow(script, record, job_id, base_env, stream=stream, color=color,
                                       stop_event=stop_event,
                                       interrupted=lambda: (sig.caught or ["SIGINT"])[-1])
    if inventory is not None:
        with Cluster(inventory) as cluster:
            left = containers.remove_run_containers(cluster, run_id, inventory.names)
        for node, why in left.items():
            outcome.not_stopped[node] = f"container not removed: {why}"
    _record_outcome(record, outcome)
    record.save()
    return SlurmResult(run_id, outcome.exit_code, record, outcome, job_id, slurm_state)


def _new_record(job: Job, script: slurm_script.SlurmScript, inventory: Inventory | None,
                argv: Sequence[str]) -> records.RunRecord:
    secrets = set(script.environment.values())
    nodes = []
    if inventory is not None:
        nodes = [records.NodeRecord(node=n.name, host=n.host, rank=i, container=f"{script.run_id}-{n.name}")
                 for i, n in enumerate(inventory.nodes)]
    return records.RunRecord(
        run_id=script.run_id, job=job.name,
        inventory=str(inventory.path.absolute()) if inventory is not None else "",
        image=script.image, scheduler="slurm",
        argv=[plan.mask_text(a, secrets) for a in argv], nodes=nodes)


def _follow(script, record: records.RunRecord, job_id: str, env: Mapping[str, str], *,
            stream: TextIO | None, color: bool | None, stop_event: threading.Event,
            interrupted: Callable[[], str]) -> tuple[supervise.Outcome, str]:
    run_dir = Path(script.run_dir)
    ranks = {n.node: n.rank for n in record.nodes}
    sink = logs.LogSink(ranks, run_dir=run_dir, stream=sys.stdout if stream is None else stream,
                        color=color, redact=script.environment.values())
    tail = OutputTail(run_dir / f"slurm-{job_id}.out", sink)
    why_stopped: str | None = None
    cancelled_at: float | None = None
    last_queue = 0.0
    state = ""
    try:
        while True:
            if stop_event.is_set() and why_stopped is None:
                why_stopped = interrupted()
                cancelled_at = time.monotonic()
                slurm_client(["scancel", job_id], env=env)
            if not tail.nodes or time.monotonic() - last_queue >= QUEUE_EVERY:
                last_queue = time.monotonic()
                if not tail.nodes:
                    state, names = job_nodes(job_id, env)
                    if names:
                        tail.nodes = names
                        _fit_nodes(record, names, script.run_id, sink)
                        record.save()
                queued = in_queue(job_id, env)
                if queued is False:
                    break
                if cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_WAIT:
                    break
            tail.read()
            stop_event.wait(POLL_INTERVAL)
        state, names = job_nodes(job_id, env)
        if names and not tail.nodes:
            tail.nodes = names
            _fit_nodes(record, names, script.run_id, sink)
        nodes = tail.nodes or [n.node for n in record.nodes]
        deadline = time.monotonic() + END_GRACE
        tasks = read_task_records(script.records_dir)
        while len(tasks) < len(nodes) and time.monotonic() < deadline and why_stopped is None:
            time.sleep(0.5)     # a task's record may trail the job's end on a shared file system
            tasks = read_task_records(script.records_dir)
        tail.read(final=True)
        exit_field = scontrol_fields(slurm_client(["scontrol", "-o", "show", "job", job_id],
                                                  env=env).stdout).get("ExitCode", "")
        slurm_exit = int(exit_field.split(":")[0]) if exit_field.split(":")[0].isdigit() else None
        outcome = outcome_of(tasks, nodes, ended=time.time(), interrupted=why_stopped,
                             last_lines={k: list(v) for k, v in sink.last.items()},
                             slurm_exit=slurm_exit)
        return outcome, state
    finally:
        sink.close()


def _fit_nodes(record: records.RunRecord, names: list[str], run_id: str, sink: logs.LogSink) -> None:
    """The record's nodes in Slurm's task order (rank = SLURM_NODEID = task id here)."""
    by_name = {n.node: n for n in record.nodes}
    record.nodes = [records.NodeRecord(node=name, host=by_name[name].host if name in by_name else name,
                                       rank=i, container=f"{run_id}-{name}", state="running")
                    for i, name in enumerate(names)]
    sink.ranks.update({n.node: n.rank for n in record.nodes})


def _record_outcome(record: records.RunRecord, outcome: supervise.Outcome) -> None:
    record.state, record.exit_code, record.finished = outcome.state, outcome.exit_code, records.utcnow()
    tasks = read_task_records(records.run_path(record.run_id) / slurm_script.RECORDS_DIR)
    for n in record.nodes:
        t = tasks.get(n.node)
        if t is not None:
            n.exit_code, n.finished = t.exit_code, t.finished
            n.state = "stopped" if t.stopped else "exited"
        else:
            n.state = "lost" if outcome.state != "interrupted" else "stopped"
    f = outcome.first_failure
    if f is not None:
        record.first_failure = records.FailureRecord(
            node=f.node, rank=f.rank, kind=f.kind, exit_code=f.exit_code, time=f.when,
            reason=f.reason, last_lines=outcome.last_lines.get(f.node, []))



def cancel(record: records.RunRecord, *, env: Mapping[str, str] | None = None,
           wait: float = CANCEL_WAIT) -> str:
    """``clusterctl stop`` for a Slurm run: ``scancel`` its job and wait (bounded) until it
    left the queue; the tasks stop their containers and record it.  Returns what happened
    in words; UserError when the record has no job id, ClusterctlError when scancel fails."""
    if not record.slurm_job:
        raise UserError(f"run {record.run_id} has no Slurm job id in {record.dir / records.RECORD_NAME} "
                        "(sbatch never accepted it): there is nothing to cancel.")
    env = dict(os.environ if env is None else env)
    if in_queue(record.slurm_job, env) is False:
        return f"Slurm job {record.slurm_job} had already ended"
    res = slurm_client(["scancel", record.slurm_job], env=env)
    if res.returncode != 0:
        raise ClusterctlError(f"scancel {record.slurm_job} failed: {res.stderr.strip() or res.returncode}; "
                              f"run `clusterctl stop {record.run_id}` again.")
    deadline = time.monotonic() + wait
    while in_queue(record.slurm_job, env) is not False:
        if time.monotonic() > deadline:
            return f"Slurm job {record.slurm_job} cancelled, still ending after {wait:.0f}s"
        time.sleep(0.5)
    if record.state in ("starting", "running"):
        fresh = records.load(record.run_id)      # the following launch may have written it
        if fresh.state in ("starting", "running"):
            fresh.state, fresh.finished = "stopped", records.utcnow()
            fresh.save()
    return f"Slurm job {record.slurm_job} cancelled and ended"
