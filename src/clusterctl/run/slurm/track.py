"""A submitted Slurm job after ``sbatch``: its state, its output, its end, who stopped it.

What ``status``, ``logs [--follow]``, ``stop`` and ``runs`` need for a Slurm run, whether
``launch`` follows it or it was submitted with ``--detach``:

* :func:`job_info`: the job as Slurm tells it.  ``sacct`` when the cluster keeps accounting
  (it remembers finished jobs, their exit code and who cancelled them); without
  accounting (``AccountingStorageType=accounting_storage/none``, as in the sandbox) sacct
  answers "Slurm accounting storage is disabled" and ``scontrol show job`` is asked, which
  forgets a job MinJobAge after it ended; after that only the run record and the tasks'
  own records (``runs/<id>/slurm/<node>.json``) are left.  :class:`JobInfo` says which
  source answered.  :func:`parse_sacct` reads sacct's documented ``--parsable2`` format;
* :func:`output_lines`: the job's labelled output file as (node, text), task = node rank;
* :func:`outcome`: the run's outcome from the tasks' records and the job's state: the
  first failure by finish time; a job stopped from outside clusterctl (``scancel`` by hand,
  its time limit) is "stopped", with who stopped it when Slurm or clusterctl knows;
* :func:`settle`: once the job has left the queue, its outcome goes into the record (the
  follower, ``status``, ``logs``, ``stop`` and ``runs`` all call it; it is idempotent);
* :func:`follow`: stream the output while the job runs, then settle;
* a job that requeues itself (the job's ``max_restarts``, :mod:`clusterctl.run.slurm.script`)
  goes back to PENDING, which squeue still lists: following goes on through every attempt
  and settles only when the job has left the queue.  Each attempt's first line
  (:data:`~clusterctl.run.slurm.script.ATTEMPT_MARK`) gives its nodes, so its labelled lines
  are mapped to them; the outcome is the last attempt's (the task records in
  ``slurm/``), and :func:`record_attempts` puts every attempt into the record (the earlier
  ones from ``slurm/attempt-<K>/``).

``clusterctl stop`` leaves :data:`STOP_REQUEST` in the run directory before ``scancel``, so
whoever settles the run knows it was clusterctl, and who.
"""

from __future__ import annotations

import json
import pwd
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from clusterctl.core.errors import UserError
from clusterctl.core.files import lines_below, open_below, read_below
from clusterctl.core.lines import MAX_LINE, LineSplitter
from clusterctl.core.paths import runs_dir
from clusterctl.core.text import digits
from clusterctl.run import hints, logs, records, supervise
from clusterctl.run.slurm import script as slurm_script
from clusterctl.run.slurm.client import (
    in_queue,
    job_nodes,
    parse_label,
    scontrol_fields,
    slurm_client,
)
from clusterctl.run.slurm.tasks import TASK_RECORD_LIMIT, TaskRecord, outcome_of, read_task_records

STOP_REQUEST = slurm_script.STOP_REQUEST     # the requeue step of the script checks it too
STOP_REQUEST_LIMIT = 64 << 10   # request_stop writes who and when: a few hundred bytes
POLL_INTERVAL = 1.0       # seconds between reads of the job's output
READ_CHUNK = 1 << 20      # bytes read from the output file at a time
QUEUE_EVERY = 2.0         # seconds between squeue calls
END_GRACE = 10.0          # after the job left the queue: wait this long for the tasks' records
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "NodeList")
#: Slurm job states after which nothing more runs (squeue/scontrol/sacct words).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE")


@dataclass
class JobInfo:
    """One Slurm job as the best available source tells it."""

    source: str    # sacct | scontrol | none (Slurm no longer knows it) | unreachable (no answer)
    state: str = ""                  # Slurm's word: PENDING RUNNING COMPLETED CANCELLED ...
    exit_code: int | None = None     # the batch script's (srun's: the highest of all tasks)
    signal: int | None = None
    nodes: list[str] = field(default_factory=list)
    cancelled_by: str | None = None  # sacct: "CANCELLED by UID" -> the user's name
    why: str = ""                    # why a better source did not answer

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def words(self) -> str:
        """``Slurm job 12: CANCELLED (sacct)`` style text for a status note."""
        if self.source == "none":
            return f"not known to Slurm any more ({self.why})"
        if self.source == "unreachable":
            return f"Slurm did not answer ({self.why})"
        state = self.state or "?"
        if self.cancelled_by:
            state += f" by {self.cancelled_by}"
        return f"{state} (from {self.source}" + (f"; {self.why}" if self.why else "") + ")"


def _user(uid: str) -> str:
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError):
        return f"uid {uid}"


def parse_sacct(text: str, job_id: str) -> JobInfo | None:
    """``sacct -n -P -X -j ID -o JobID,State,ExitCode,Start,End,NodeList`` (sacct's documented
    ``--parsable2`` format: one line per job, fields split by ``|``, no trailing ``|``;
    ExitCode is ``EXIT:SIGNAL``; a cancelled job's State is ``CANCELLED by UID``) -> JobInfo;
    None when the job is not in it."""
    for line in text.splitlines():
        parts = line.rstrip("\n").split("|")
        if len(parts) < len(SACCT_FIELDS) or parts[0].strip() != job_id:
            continue
        f = dict(zip(SACCT_FIELDS, (p.strip() for p in parts[:len(SACCT_FIELDS)]), strict=True))
        state, _, by = f["State"].partition(" by ")
        code, _, sig = f["ExitCode"].partition(":")
        nodes = f["NodeList"]
        return JobInfo(source="sacct", state=state.strip(),
                       exit_code=int(code) if digits(code) else None,
                       signal=int(sig) if digits(sig) else None,
                       nodes=hostlist.expand_hostlist(nodes) if nodes and nodes not in (
                           "None assigned", "(null)") else [],
                       cancelled_by=_user(by.strip()) if by.strip() else None)
    return None


def parse_scontrol(text: str) -> JobInfo:
    """``scontrol -o show job ID`` -> JobInfo (it does not say who cancelled a job)."""
    f = scontrol_fields(text)
    code, _, sig = f.get("ExitCode", "").partition(":")
    nodes = f.get("NodeList", "")
    return JobInfo(source="scontrol", state=f.get("JobState", ""),
                   exit_code=int(code) if digits(code) else None,
                   signal=int(sig) if digits(sig) else None,
                   nodes=hostlist.expand_hostlist(nodes) if nodes and nodes != "(null)" else [])


def job_info(job_id: str, env: Mapping[str, str]) -> JobInfo:
    """The job from sacct when accounting exists, else from scontrol, else source "none"."""
    res = slurm_client(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", ",".join(SACCT_FIELDS)], env=env)
    why = ""
    if res.returncode == 0:
        found = parse_sacct(res.stdout, job_id)
        if found is not None and found.state:
            return found
        why = "sacct does not list it yet"
    else:
        why = "no accounting: " + ((res.stderr or res.stdout).strip().splitlines() or [
            f"sacct exit {res.returncode}"])[-1]
    res = slurm_client(["scontrol", "-o", "show", "job", job_id], env=env)
    if res.returncode == 0 and res.stdout.strip():
        info = parse_scontrol(res.stdout)
        info.why = why
        return info
    said = (res.stderr or res.stdout).strip().splitlines()
    said = said[-1] if said else f"exit {res.returncode}"
    # "Invalid job id": Slurm forgot it (MinJobAge); anything else: Slurm did not answer
    return JobInfo(source="none" if "Invalid job id" in said else "unreachable",
                   why=f"{why}; scontrol: {said}")


# --------------------------------------------------------------------------- nodes and output

def fit_nodes(record: records.RunRecord, names: Sequence[str]) -> bool:
    """The record's nodes in Slurm's task order (rank = SLURM_NODEID = the task id); True
    when that changed the record."""
    if [n.node for n in record.nodes] == list(names) and all(
            n.rank == i for i, n in enumerate(record.nodes)):
        return False
    by_name = {n.node: n for n in record.nodes}
    record.nodes = [records.NodeRecord(node=name, host=by_name[name].host if name in by_name else name,
                                       rank=i, container=f"{record.run_id}-{name}",
                                       state=by_name[name].state if name in by_name and
                                       by_name[name].state != "created" else "running")
                    for i, name in enumerate(names)]
    return True


def nodes_from_tasks(tasks: Mapping[str, TaskRecord]) -> list[str]:
    """The job's nodes in task order, from the tasks' own records (Slurm may have forgotten)."""
    return [t.node for t in sorted(tasks.values(), key=lambda t: t.rank)]


def output_path(record: records.RunRecord) -> Path:
    return record.dir / f"slurm-{record.slurm_job}.out"


def output_lines(record: records.RunRecord, *, node: str | None = None) -> Iterator[tuple[str, str]]:
    """(node, text) of every labelled line of the job's output file so far (Slurm's own lines,
    ``srun: error: ...``, are left out); task N is the record's node of rank N.  Read as a
    stream (:func:`~clusterctl.core.files.lines_below`: no symlink followed below the runs
    directory, never a FIFO, a long line in pieces): the file can be larger than memory.
    UserError naming the file when it is not one to read."""
    names = {n.rank: n.node for n in record.nodes}
    lines = lines_below(runs_dir(), output_path(record), max_line=MAX_LINE)
    try:
        for line in lines:
            parsed = parse_label(line.rstrip("\n"))
            if parsed is None:
                attempt = slurm_script.parse_attempt_mark(line.rstrip("\n"))
                if attempt and attempt[1]:       # a (requeued) attempt's own nodes from here on
                    names = dict(enumerate(attempt[1]))
                continue
            name = names.get(parsed[0], f"task{parsed[0]}")
            if node is None or name == node:
                yield name, parsed[1]
    except FileNotFoundError:
        return


# --------------------------------------------------------------------------- the end

def stop_request(record: records.RunRecord) -> str | None:
    """Who asked clusterctl to stop the run (``clusterctl stop`` writes it before scancel).
    None when there is no such request, or the file is not one clusterctl wrote (a symlink, a
    FIFO, too large: :func:`~clusterctl.core.files.read_below`; never followed nor waited on)."""
    try:
        by = json.loads(read_below(runs_dir(), record.dir / STOP_REQUEST, limit=STOP_REQUEST_LIMIT))["by"]
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None
    return by if isinstance(by, str) else None


def request_stop(record: records.RunRecord, by: str) -> None:
    path = record.dir / STOP_REQUEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"by": by, "at": records.utcnow().isoformat()}) + "\n")
    tmp.replace(path)


def stopped_by(record: records.RunRecord, info: JobInfo) -> str:
    """Who stopped a job that no task of which failed on its own."""
    asked = stop_request(record)
    if asked:
        return asked
    if info.state == "TIMEOUT":
        return "Slurm (the job's time limit)"
    if info.cancelled_by:
        return f"scancel by {info.cancelled_by} (outside clusterctl)"
    if info.state == "PREEMPTED":
        return "Slurm (preempted)"
    return ("scancel outside clusterctl (who: unknown, "
            + ("sacct does not say)" if info.source == "sacct" else "no accounting to tell)"))


def outcome(record: records.RunRecord, tasks: Mapping[str, TaskRecord], nodes: Sequence[str],
            info: JobInfo, *, interrupted: str | None, last_lines: Mapping[str, list[str]],
            ended: float, known_causes: Mapping[str, hints.Hint] | None = None
            ) -> tuple[supervise.Outcome, str | None]:
    """(the run's outcome, who stopped it or None): :func:`outcome_of` on the tasks' records,
    and "stopped" when the job was cancelled (scancel, time limit) and no task failed by itself."""
    out = outcome_of(tasks, nodes, ended=ended, interrupted=interrupted, last_lines=last_lines,
                     slurm_exit=info.exit_code, known_causes=known_causes)
    if interrupted is not None:
        return out, None
    own = [f for f in out.failures if not f.reason.startswith("stopped by Slurm")
           and not (f.kind == "lost" and info.state in ("CANCELLED", "TIMEOUT", "PREEMPTED"))]
    cancelled = info.state in ("CANCELLED", "TIMEOUT", "PREEMPTED") or any(
        t.stopped for t in tasks.values()) or stop_request(record) is not None
    if own or not cancelled or out.state == "succeeded" and not any(t.stopped for t in tasks.values()):
        return out, None
    out.state, out.exit_code, out.first_failure, out.failures = "stopped", records.STOPPED_EXIT, None, []
    return out, stopped_by(record, info)


def record_outcome(record: records.RunRecord, result: supervise.Outcome, tasks: Mapping[str, TaskRecord],
                   who: str | None) -> None:
    """Put ``result`` and each task's own exit code into ``record`` (not saved)."""
    record.state, record.exit_code, record.finished = result.state, result.exit_code, records.utcnow()
    record.stopped_by = who if result.state == "stopped" else record.stopped_by
    for n in record.nodes:
        t = tasks.get(n.node)
        if t is not None:
            n.exit_code, n.finished = t.exit_code, t.finished
            n.state = "stopped" if t.stopped else "exited"
            n.stopped_by = who if t.stopped and who else n.stopped_by
        else:
            n.state = "lost" if result.state not in ("interrupted", "stopped") else "stopped"
    f = result.first_failure
    if f is not None:
        record.first_failure = records.FailureRecord(
            node=f.node, rank=f.rank, kind=f.kind, exit_code=f.exit_code, time=f.when,
            reason=f.reason, last_lines=result.last_lines.get(f.node, []))


def settle(record: records.RunRecord, env: Mapping[str, str], *, info: JobInfo | None = None,
           grace: float = END_GRACE) -> bool:
    """When the record says the job is going but Slurm says it has ended (or forgot it): read
    the tasks' records and put the run's outcome in the record, saved.  True when it did.

    Also fits the record's nodes to Slurm's task order while the job is known."""
    if record.state not in ("starting", "running", "unknown") or not record.slurm_job:
        return False
    info = info or job_info(record.slurm_job, env)
    if info.source == "unreachable":
        return False                 # no news is not an end
    if info.nodes and fit_nodes(record, info.nodes):
        record.save()
    if not info.ended and info.source != "none":
        if in_queue(record.slurm_job, env) is not False:
            return False
    tasks = read_task_records(record.dir / slurm_script.RECORDS_DIR)
    deadline = time.monotonic() + grace
    expected = len(info.nodes or record.nodes)
    while len(tasks) < expected and time.monotonic() < deadline and info.state not in (
            "CANCELLED", "TIMEOUT", "PREEMPTED"):
        time.sleep(0.5)          # a task's record may trail the job's end on a shared file system
        tasks = read_task_records(record.dir / slurm_script.RECORDS_DIR)
    if tasks and (not record.nodes or not info.nodes and earlier_attempts(record)):
        fit_nodes(record, nodes_from_tasks(tasks))    # a requeued job: the last attempt's nodes
    last: dict[str, deque[str]] = {}
    try:
        for node, text in output_lines(record):
            last.setdefault(node, deque(maxlen=logs.KEEP_LAST)).append(text)
    except UserError:
        last = {}     # an output file not to be read: the outcome stands without its last lines
    result, who = outcome(record, tasks, [n.node for n in record.nodes], info, interrupted=None,
                          last_lines={k: list(v) for k, v in last.items()},
                          ended=time.time())
    record_outcome(record, result, tasks, who)
    record_attempts(record)
    record.save()
    return True


def earlier_attempts(record: records.RunRecord) -> list[int]:
    """The attempts before the last one of a requeued job: the ``slurm/attempt-<K>/``
    directories its later attempts moved their task records to, in order."""
    base = record.dir / slurm_script.RECORDS_DIR
    found = [p.name.removeprefix("attempt-") for p in base.glob("attempt-*")] if base.is_dir() else []
    return sorted(int(k) for k in found if digits(k))


def _attempt_of(records_dir: Path) -> int | None:
    """The attempt the task records in ``records_dir`` belong to (their ``attempt``)."""
    for path in sorted(records_dir.glob("*.json")):
        try:
            return int(json.loads(read_below(runs_dir(), path, limit=TASK_RECORD_LIMIT))["attempt"])
        except (OSError, ValueError, KeyError, TypeError, UserError):
            continue
    return None


def record_attempts(record: records.RunRecord) -> None:
    """Every attempt of a Slurm run into ``record`` (not saved), as an SSH launch with
    restarts records them: the earlier ones of a requeued job from their task records
    (``slurm/attempt-<K>/``), the last one from the record's own outcome.  Nothing for a
    job that allows no restarts and was never requeued."""
    earlier = earlier_attempts(record)
    if not earlier and not record.max_restarts:
        return
    base = record.dir / slurm_script.RECORDS_DIR
    last = _attempt_of(base)
    last = last if last is not None else (earlier[-1] + 1 if earlier else 0)
    attempts, started = [], record.started
    for k in (k for k in earlier if k < last):
        tasks = read_task_records(base / f"attempt-{k}")
        scratch = record.model_copy(deep=True)
        scratch.nodes = []
        fit_nodes(scratch, nodes_from_tasks(tasks))
        out = outcome_of(tasks, [n.node for n in scratch.nodes], ended=time.time(),
                         interrupted=None, last_lines={})
        record_outcome(scratch, out, tasks, None)
        finished = max((t.finished for t in tasks.values()), default=None)
        attempts.append(records.AttemptRecord(
            attempt=k, started=started, finished=finished, state=scratch.state,
            exit_code=scratch.exit_code, nodes=scratch.nodes, first_failure=scratch.first_failure,
            ended=_ended_words(scratch), then=f"requeued: restart {k + 1}"
            + (f"/{record.max_restarts}" if record.max_restarts else " (by Slurm)")))
        started = finished or started     # the next attempt started after this one ended
    used_up = record.state == "failed" and record.max_restarts and last >= record.max_restarts
    attempts.append(records.AttemptRecord(
        attempt=last, started=started, finished=record.finished, state=record.state,
        exit_code=record.exit_code, nodes=[n.model_copy() for n in record.nodes],
        first_failure=record.first_failure, ended=_ended_words(record),
        then=f"restarts used up ({last}/{record.max_restarts})" if used_up else "end"))
    record.attempt, record.attempts = last, attempts


def _ended_words(record: records.RunRecord) -> str:
    f = record.first_failure
    if f is not None:
        return f"{f.node} lost" if f.kind == "lost" else f"{f.node} exited {f.exit_code}"
    return record.state


# --------------------------------------------------------------------------- follow

class OutputTail:
    """Reads the job's output file as it grows and hands labelled lines to a sink."""

    def __init__(self, path: Path, sink: logs.LogSink, *, node: str | None = None,
                 on_attempt: Callable[[int, list[str]], None] | None = None) -> None:
        self.path, self.sink, self.only = path, sink, node
        self.on_attempt = on_attempt    # an attempt's first line: (attempt, its nodes)
        self.nodes: list[str] = []      # task id (= node rank) -> node name, once known
        self._pos, self._held = 0, []
        self._task: int | None = None   # the task of the line being read (its cut pieces' too)
        self.hints = hints.FirstHints()  # every node's first line with a known cause
        self._lines = LineSplitter(self._line, on_continued=self._continued, keep_whole=sink.redact)

    def read(self, final: bool = False) -> None:
        """What the file gained since the last read, in bounded chunks (a job's output may
        grow by gigabytes; one line is bounded by core.lines.MAX_LINE)."""
        got = False
        try:
            with open_below(runs_dir(), self.path) as f:   # never a link below runs/, never a FIFO
                f.seek(self._pos)
                while data := f.read(READ_CHUNK):
                    got = True
                    self._lines.feed(data)
                self._pos = f.tell()
        except FileNotFoundError:
            return
        if final:
            self._lines.flush()
        self.flush_held()
        if got:
            self.sink.flush()     # runs/<id>/ is what `clusterctl logs` reads during the run

    def _line(self, line: str) -> None:
        parsed = parse_label(line)
        if parsed is None:
            self._task = None
            attempt = slurm_script.parse_attempt_mark(line)
            if attempt and attempt[1]:   # a (requeued) attempt starts: its labels are its nodes
                self.nodes = attempt[1]
                self.flush_held()
                if self.on_attempt:
                    self.on_attempt(*attempt)
            return          # Slurm's own lines ("srun: error: ..."): in slurm-<job>.out only
        self._task, text = parsed
        self._labelled(self._task, text)

    def _continued(self, piece: str) -> None:
        """A piece of a line longer than MAX_LINE: it belongs to that line's task."""
        if self._task is not None:
            self._labelled(self._task, piece)

    def _labelled(self, task: int, text: str) -> None:
        if task < len(self.nodes):
            self._write(self.nodes[task], text)
        else:
            self._held.append((task, text))

    def _write(self, node: str, text: str) -> None:
        self.hints.see(node, self.sink.ranks.get(node, -1), text)
        if self.only is None or node == self.only:
            self.sink.write(node, text)

    def flush_held(self) -> None:
        if self.nodes and self._held:
            held, self._held = self._held, []
            for task, text in held:
                self._write(self.nodes[task] if task < len(self.nodes) else f"task{task}", text)


def follow(record: records.RunRecord, env: Mapping[str, str], sink: logs.LogSink, *,
           stop_event: threading.Event, on_stop: Callable[[], str | None] | None = None,
           cancel_wait: float = 120.0, node: str | None = None,
           on_nodes: Callable[[list[str]], None] | None = None) -> tuple[supervise.Outcome | None, JobInfo]:
    """Stream the job's labelled output into ``sink`` until it has left the queue.

    ``stop_event`` set: ``on_stop()`` runs once (``launch``: scancel, returns why, e.g.
    "SIGTERM"; ``logs -f``: None, just stop following and return (None, info)).  Returns the
    outcome (recorded in ``record`` unless the follow was left early) and the last JobInfo.
    """
    def new_attempt(_attempt: int, names: list[str]) -> None:
        if fit_nodes(record, names):
            record.save()
        sink.ranks.update({n.node: n.rank for n in record.nodes})
        if on_nodes:
            on_nodes(list(names))

    tail = OutputTail(output_path(record), sink, node=node, on_attempt=new_attempt)
    if record.nodes and all(n.state != "created" for n in record.nodes):
        tail.nodes = [n.node for n in sorted(record.nodes, key=lambda n: n.rank)]
    why_stopped: str | None = None
    stopped_at: float | None = None
    last_queue = 0.0
    info = JobInfo(source="none")
    while True:
        if stop_event.is_set() and stopped_at is None:
            why_stopped = on_stop() if on_stop else None
            if why_stopped is None:
                tail.read(final=True)
                return None, info
            stopped_at = time.monotonic()
        if time.monotonic() - last_queue >= QUEUE_EVERY or not tail.nodes:
            last_queue = time.monotonic()
            if not tail.nodes:
                _state, names = job_nodes(record.slurm_job or "", env)   # scontrol: cheap
                if names:
                    if fit_nodes(record, names):
                        record.save()
                    tail.nodes = list(names)
                    sink.ranks.update({n.node: n.rank for n in record.nodes})
                    if on_nodes:
                        on_nodes(tail.nodes)
            queued = in_queue(record.slurm_job or "", env)
            if queued is False:
                break
            if stopped_at is not None and time.monotonic() - stopped_at > cancel_wait:
                break
        tail.read()
        stop_event.wait(POLL_INTERVAL)
    info = job_info(record.slurm_job or "", env)
    if info.nodes and not tail.nodes:
        tail.nodes = list(info.nodes)
        if fit_nodes(record, info.nodes):
            record.save()
    tasks = read_task_records(record.dir / slurm_script.RECORDS_DIR)
    deadline = time.monotonic() + END_GRACE
    nodes = tail.nodes or [n.node for n in record.nodes]
    while len(tasks) < len(nodes) and time.monotonic() < deadline and why_stopped is None \
            and info.state not in ("CANCELLED", "TIMEOUT", "PREEMPTED"):
        time.sleep(0.5)     # a task's record may trail the job's end on a shared file system
        tasks = read_task_records(record.dir / slurm_script.RECORDS_DIR)
    tail.read(final=True)
    if not record.nodes and tasks:
        fit_nodes(record, nodes_from_tasks(tasks))
        nodes = [n.node for n in record.nodes]
    result, who = outcome(record, tasks, nodes, info, interrupted=why_stopped,
                          last_lines={k: list(v) for k, v in sink.last.items()}, ended=time.time(),
                          known_causes=tail.hints.found)
    fresh = _reload(record)
    if fresh is not None and fresh.state not in ("starting", "running", "unknown"):
        return result, info        # someone settled it meanwhile (stop, status): theirs stands
    record_outcome(record, result, tasks, who)
    record_attempts(record)
    if why_stopped is not None:
        record.stopped_by = f"clusterctl launch ({'Ctrl-C' if why_stopped == 'SIGINT' else why_stopped})"
    record.save()
    return result, info


def _reload(record: records.RunRecord) -> records.RunRecord | None:
    try:
        return records.load(record.run_id)
    except Exception:  # noqa: BLE001 - no record on disk: ours is the one
        return None

