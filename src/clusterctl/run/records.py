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
half-written record, even while ``launch`` is still updating it; a new record is
created exclusively (a hard link of the temp file), so two launches that draw the same
run id never share a directory: the second is refused before anything starts.

Who: each record names the uid that launched it (``uid``, and ``user``, its name) and is
acted on as that user's only when the file says so too: :func:`load` refuses a record whose
``uid`` is not its file's owner, whose run directory belongs to someone else, or whose
``run_id`` is not its directory's name (a renamed or planted record); an older record
without ``uid`` belongs to its file's owner.  :func:`resolve` without a run id finds the
caller's newest run, :func:`others_run` names the owner of a run that is not the caller's.
A runs directory that others may write into must have the sticky bit
(:func:`check_runs_dir`; :func:`share_runs_dir` sets one up).  Ports: :func:`take_master_port` gives a launch its master port
under a lock of the runs directory (``runs/.ports/``), after looking at the ports the
runs there hold (:func:`port_holders`: live runs' records and the claims of launches
whose record is not written yet), so two launches at once never get the same one.
"""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import pwd
import re
import secrets
import shlex
import signal
import socket
import stat
import tempfile
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
)

from clusterctl.cluster.containers import ContainerState, find_containers
from clusterctl.cluster.inventory.model import NODE_NAME_RE
from clusterctl.core import exitcodes
from clusterctl.core.deadline import bounded
from clusterctl.core.errors import UserError, did_you_mean
from clusterctl.core.files import denied, one_at_a_time, read_regular, user_name, write_atomic
from clusterctl.core.paths import runs_dir
from clusterctl.core.secretnames import ENV_NAME
from clusterctl.core.text import control_problem, escaped, shown
from clusterctl.run import recovery
from clusterctl.run.jobs import MAX_RESTARTS

if TYPE_CHECKING:
    from clusterctl.cluster.transport import Cluster, NodeConnection

RECORD_NAME = "run.json"
MERGED_LOG = "merged.log"

# A run id becomes a directory name, a docker label value and part of container
# names, so it is restricted to what is valid in all three.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")  # \Z: "$" would let "id\n" through


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
            f"--run-id {shown(run_id, 80)} is not valid: use 1-63 letters, digits, '_', '.' or '-', "
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


def describe_exit(code: int | None) -> str:
    """``exit 137 (SIGKILL)``: a container's real exit code, with the signal it means when it
    is 128 + a signal number (how a shell, docker and srun report a death by signal)."""
    if code is None:
        return ""
    if 128 < code < 128 + 65:
        try:
            return f"exit {code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit {code}"


def current_user() -> str:
    """The user running clusterctl: the name of its effective uid (never ``$USER``/``$LOGNAME``,
    which anyone can set)."""
    return user_name(os.geteuid())


def who() -> str:
    """Who is asking, for the record: ``user@host``."""
    return f"{current_user()}@{socket.gethostname()}"


class Launcher(BaseModel):
    """The ``clusterctl launch`` process that follows a run: when it is gone and the record
    still says running, nobody is following the run and its outcome is unknown until the
    nodes are asked (``status``, ``stop``)."""

    host: str
    boot_id: str = ""
    pid: int
    start_ticks: int | None = None   # /proc/<pid>/stat field 22: a reused pid differs here


def _boot_id() -> str:
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])   # field 22 (after "pid (comm)")
    except (IndexError, ValueError):
        return None


def this_launcher() -> Launcher:
    pid = os.getpid()
    return Launcher(host=socket.gethostname(), boot_id=_boot_id(), pid=pid, start_ticks=_start_ticks(pid))


def launcher_gone(launcher: Launcher | None) -> bool | None:
    """True when ``launcher`` surely no longer runs (same machine and boot, and its pid is gone
    or now another process); None when this machine cannot tell (another host)."""
    if launcher is None or launcher.host != socket.gethostname():
        return None
    if launcher.boot_id and launcher.boot_id != _boot_id():
        return True      # this machine rebooted since
    ticks = _start_ticks(launcher.pid)
    return ticks is None or (launcher.start_ticks is not None and ticks != launcher.start_ticks)


class NodeRecord(BaseModel):
    """One node's part of a run."""

    node: str
    host: str
    rank: int
    container: str
    env: dict[str, str] = Field(default_factory=dict)  # masked: secrets never stored
    state: str = "created"  # created | running | exited | stopped | lost | unknown
    exit_code: int | None = None  # the container's own exit code (128 + N: ended by signal N)
    started: datetime | None = None
    finished: datetime | None = None
    stopped_by: str | None = None  # who stopped this container (None: it ended on its own)
    flight_dir: str | None = None  # the node's directory of flight recorder dumps (nccl), until collected


class CodeRecord(BaseModel):
    """What code a run ran (``launch --workdir``): enough to say so and to run it again."""

    # sha256:... of the shipped tree's manifest (clusterctl.code); it names the tree's directory on
    # every node (<code_dir>/trees/<hex>), so a record read back holds nothing else there
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    files: int = 0
    bytes: int = 0
    workdir: str = ""                 # the directory it was taken from, on the head
    git_commit: str | None = None     # HEAD of the workdir's repository, None outside one
    git_dirty: bool | None = None     # uncommitted changes under the workdir when it was taken
    requirements: str | None = None   # the requirements file, when there was one
    requirements_digest: str | None = None   # sha256:... of it, as its image layer was built from
    image: str | None = None          # the image with the requirements layer the run used
    sent: dict[str, int] = Field(default_factory=dict)   # node -> bytes sent to put the code there


# --- the shapes of a record's nested fields: checked at load, kept as the dicts they were ------

def _shaped(model: type[BaseModel]) -> AfterValidator:
    """A dict field read back holds what ``model`` says (pydantic refuses another shape at load,
    as for any field of the record); it stays the plain dict the code uses, as ``model`` dumps it."""
    def check(value: dict) -> dict:
        try:
            return model.model_validate(value).model_dump()
        except ValidationError as e:
            raise ValueError(_first_error(e)) from None
    return AfterValidator(check)


#: :class:`clusterctl.run.recovery.AttemptEnd` as an attempt's ``end`` holds it, its fields and
#: types taken from the dataclass (``launch --resume`` makes one of each: another key is refused)
_AttemptEnd = create_model(
    "AttemptEnd", __config__=ConfigDict(extra="forbid"),
    **{f.name: (get_type_hints(recovery.AttemptEnd)[f.name],
                ... if f.default is dataclasses.MISSING else f.default)
       for f in dataclasses.fields(recovery.AttemptEnd)})


class _OddRank(BaseModel):
    """A rank the hang watchdog found not with the majority (watchdog.HangReport.record)."""

    node: str
    rank: int | None
    pid: int | None
    state: str
    reason: str


class _Hang(BaseModel):
    """What the hang watchdog found (watchdog.HangReport.record): the keys read back typed."""

    model_config = ConfigDict(extra="allow")

    timeout_seconds: float | None = None
    silent_seconds: float | None = None
    phase: str = "running"
    last_output: str | None = None
    detected: str | None = None
    dump_seconds: float | None = None
    stacks_dir: str | None = None
    files: list[str] = Field(default_factory=list)
    majority_frame: str | None = None
    odd_ranks: list[_OddRank] = Field(default_factory=list)
    node_errors: dict[str, str] = Field(default_factory=dict)
    error: str | None = None


class _Spec(BaseModel):
    """The job as it ran (request.spec_of): what ``launch --rerun``/``--resume`` reads back."""

    model_config = ConfigDict(extra="allow")

    job: str | None = None
    flags: dict[str, Any] = Field(default_factory=dict)
    secret_env: list[str] = Field(default_factory=list)
    cwd: str | None = None


class AttemptRecord(BaseModel):
    """One attempt of a run that restarts (``max_restarts``): its nodes, how and why it ended,
    and what followed.  Its logs are in :meth:`RunRecord.attempt_dir`."""

    attempt: int
    started: datetime = Field(default_factory=utcnow)
    finished: datetime | None = None
    state: str = "starting"          # as RunRecord.state
    exit_code: int | None = None
    master_addr: str | None = None
    nodes: list[NodeRecord] = Field(default_factory=list)
    first_failure: FailureRecord | None = None
    ended: str = ""                   # why it ended, in words ("node2 lost", "node1 exited 1")
    then: str = ""                    # what followed ("restart 1/3", "crash loop: ...", "end")
    excluded: dict[str, str] = Field(default_factory=dict)   # nodes excluded after it: node -> why
    replaced: dict[str, str] = Field(default_factory=dict)   # excluded node -> the spare in its place
    checkpoint: str | None = None     # the newest file of the checkpoint directory after it
    # seconds, for `runs --json` and the benchmark: failure noticed, containers stopped,
    # nodes checked again, every container of the next attempt running
    timings: dict[str, float] = Field(default_factory=dict)
    # how it ended, as recovery.AttemptEnd (launch --resume reads it)
    end: Annotated[dict, _shaped(_AttemptEnd)] | None = None


class RunRecord(BaseModel):
    """Everything ``runs/<run-id>/run.json`` holds."""

    run_id: str
    job: str
    inventory: str
    image: str
    image_id: str | None = None
    registry: str | None = None       # the registry every node pulled the image from (None: over SSH)
    image_digest: str | None = None   # sha256:... of its manifest there: every node ran image@digest
    master_addr: str | None = None
    master_port: int | None = None
    detached: bool = False
    # starting | running | restarting (between attempts) | succeeded | failed | hung | suspicious
    # | interrupted | start-failed | stopped | unknown
    state: str = "starting"
    exit_code: int | None = None
    started: datetime = Field(default_factory=utcnow)
    finished: datetime | None = None
    nodes: list[NodeRecord] = Field(default_factory=list)
    first_failure: FailureRecord | None = None
    argv: list[str] = Field(default_factory=list)  # the clusterctl command line, for the record
    scheduler: str = "ssh"  # ssh | slurm (older run.json files have none: ssh)
    slurm_job: str | None = None  # the Slurm job id of a slurm run
    stopped_by: str | None = None  # who stopped the run ("clusterctl stop by root@head", "scancel"...)
    launcher: Launcher | None = None  # the launch process following the run (None: detached/older)
    note: str = ""  # why the state is what it is, when that is not obvious (state unknown...)
    hang_timeout: float | None = None  # seconds of silence the watchdog allowed (None: no watchdog)
    # what the hang watchdog found (clusterctl.run.watchdog.HangReport.record)
    hang: Annotated[dict, _shaped(_Hang)] | None = None
    collective_errors: list[str] = Field(default_factory=list)  # "node[rank]| line" of a suspicious run
    flight: dict[str, list[str] | str] = Field(default_factory=dict)  # node -> flight/<node>/ files, or why none
    code: CodeRecord | None = None  # the shipped project of a workdir run (None: the image's own code)
    # the job as it ran (secret values left out), for `launch --rerun`
    spec: Annotated[dict, _shaped(_Spec)] | None = None
    # recovery (clusterctl.run.recovery): the attempt running or last run (``nodes`` are its
    # nodes), every attempt so far, the restarts allowed, and the nodes excluded for good
    attempt: int = 0
    attempts: list[AttemptRecord] = Field(default_factory=list)
    max_restarts: int = 0
    excluded: dict[str, str] = Field(default_factory=dict)   # node -> why
    spares: list[str] = Field(default_factory=list)          # spares not used (yet)
    checkpoint: str | None = None
    supervised: bool = False   # followed by a supervisor of its own (launch --detach with restarts/hangs)
    next_nodes: list[str] = Field(default_factory=list)   # while restarting: the next attempt's nodes
    checkpoint_start: str | None = None    # the checkpoint directory's newest file when the run began
    user: str = ""   # who launched it (current_user() of the first save; "": an older record)
    uid: int | None = None   # the uid that launched it; must own run.json (None: an older record)

    # False for a record made here and not saved yet: its first save creates run.json
    # exclusively (True: read from disk, or saved once already)
    _on_disk: bool = PrivateAttr(default=False)

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

    def attempt_dir(self, attempt: int | None = None) -> Path:
        """Where an attempt's logs are (default: the current attempt's): runs/<id>/ for the
        first, runs/<id>/attempt-K/ for the K-th restart."""
        k = self.attempt if attempt is None else attempt
        return self.dir if k == 0 else self.dir / f"attempt-{k}"

    def log_path(self, node: str) -> Path:
        return self.attempt_dir() / f"{node}.log"

    def at_attempt(self, attempt: int) -> RunRecord:
        """This record as of one attempt (its nodes, its logs): ``logs RUN --attempt K``.
        UserError naming the attempts there are."""
        if attempt == self.attempt:
            return self
        for a in self.attempts:
            if a.attempt == attempt:
                return self.model_copy(update={"attempt": attempt, "nodes": a.nodes})
        have = [a.attempt for a in self.attempts] or [self.attempt]
        raise UserError(f"run {self.run_id} has no attempt {attempt}; valid: "
                        + ", ".join(map(str, have)))

    def save(self) -> Path:
        """Write run.json atomically (a reader sees the old or the new record, never half).

        The first save of a record made here (not read from disk) creates run.json
        exclusively and records who launched it (``user``): when the run id is recorded
        already (another launch drew it at the same moment), UserError, and the other's
        record is left as it was.  Free text from a job's output or a node is saved as it
        reads back (:func:`_fit_to_read_back`: escaped, bounded)."""
        _fit_to_read_back(self)
        new = not self._on_disk
        if new:
            d = own_run_dir(self.run_id)
            self.uid = os.geteuid()
            self.user = current_user()
        else:
            d = self.dir
            if self.uid is not None and self.uid != os.geteuid() and os.geteuid() != 0:
                return d / RECORD_NAME      # another user's record: only its owner (or root) writes it
        target = d / RECORD_NAME
        try:
            fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".json", dir=d)
        except PermissionError as e:
            raise denied(d, "write into", e) from None
        try:
            os.fchmod(fd, 0o644)            # readable by the users who share the runs directory
            if self.uid is not None and self.uid != os.geteuid():
                os.fchown(fd, self.uid, -1)   # root rewriting another's record keeps it theirs
            with os.fdopen(fd, "w") as f:
                f.write(self.model_dump_json(indent=2))
                f.write("\n")
            if new:
                _create_exclusively(tmp, target, self.run_id)
            else:
                os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        self._on_disk = True
        return target


def _create_exclusively(tmp: str, target: Path, run_id: str) -> None:
    """``tmp``'s content as ``target``, only when ``target`` does not exist (a hard link:
    atomic and exclusive); UserError naming the run id when it does."""
    try:
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise
        except OSError:     # a file system without hard links: O_EXCL claims the name first
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.replace(tmp, target)
    except FileExistsError:
        raise UserError(f"run id {run_id!r} is already recorded in {target.parent} (another launch "
                        "took it at the same moment?); nothing was started: choose another "
                        "--run-id, or leave it out for a new one.") from None


def run_path(run_id: str) -> Path:
    return runs_dir() / run_id


def check_runs_dir(root: Path | None = None) -> Path:
    """The runs directory, when it is safe to write a record into: not writable by others,
    or (shared) with the sticky bit, so nobody can rename or replace another user's run.
    UserError saying what is wrong and how to fix it."""
    root = root or runs_dir()
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return root
    except OSError as e:
        raise denied(root, "use the runs directory", e) from None
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"the runs directory {root} is not a directory; point CLUSTERCTL_RUNS at one.")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        who = "everyone" if mode & 0o002 else f"group {_group_name(st.st_gid)}"
        raise UserError(
            f"the runs directory {root} (mode {mode:04o}) is writable by {who} without the sticky "
            "bit: anyone there could rename or replace another user's runs, so nothing is recorded "
            f"in it. Its owner ({user_name(st.st_uid)}) makes it a shared runs directory with "
            f"`CLUSTERCTL_RUNS={root} clusterctl runs --share GROUP` (or `chmod +t {root}`), "
            "or use a runs directory of your own.")
    return root


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def share_runs_dir(group: str, root: Path | None = None) -> Path:
    """Make ``root`` (default: the runs directory) a runs directory the members of ``group``
    share: group ``group``, mode 3775 (setgid: new entries are the group's; sticky: nobody
    renames or removes another user's entries), its ``.ports/`` the same.  UserError when
    the caller cannot (not the owner, not a member of the group)."""
    root = root or runs_dir()
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise UserError(f"--share {group}: no such group on this machine.") from None
    for d in (root, root / PORTS_DIR):
        try:
            d.mkdir(parents=True, exist_ok=True)
            st = os.lstat(d)
            if not stat.S_ISDIR(st.st_mode):
                raise UserError(f"{d} is not a directory; remove it and run again.")
            os.chown(d, -1, gid)
            os.chmod(d, 0o3775)
        except PermissionError as e:
            raise denied(d, f"share with group {group}", e) from None
    return root


def own_run_dir(run_id: str) -> Path:
    """The directory of a new run of the caller's: made here (0755), or refused when
    something else is already there (another user's directory, a symlink) or the runs
    directory is unsafe (:func:`check_runs_dir`)."""
    check_run_id(run_id)
    root = check_runs_dir()
    d = root / run_id
    try:
        root.mkdir(parents=True, exist_ok=True)
        d.mkdir(mode=0o755)
    except FileExistsError:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise UserError(f"{d} exists and is not a run directory of yours (owner "
                            f"{user_name(st.st_uid)}): nothing was started. Choose another "
                            "--run-id, or leave it out for a new one.") from None
    except PermissionError as e:
        raise denied(root, "create a run directory in", e) from None
    return d


class RecordError(ValueError):
    """A run record that is not what it says it is (planted, renamed, another's)."""


def load(run_id: str) -> RunRecord:
    """The record of ``run_id``; UserError naming the file when missing or unreadable."""
    check_run_id(run_id)
    path = run_path(run_id) / RECORD_NAME
    if not os.path.lexists(path):
        known = [r.run_id for r in list_runs()]
        hint = did_you_mean(run_id, known)
        raise UserError(
            f"no run {shown(run_id, 80)} in {runs_dir()}{hint} (no {path}). `clusterctl runs` lists the "
            "runs recorded there; CLUSTERCTL_RUNS points to another runs directory."
        )
    try:
        return _read(path)
    except RecordError as e:
        raise UserError(f"{path} is not to be trusted: {e}; nothing was done with it. Remove it "
                        "if it is not yours.") from None
    except (ValidationError, ValueError) as e:
        raise UserError(f"{path} is not a valid run record ({_first_error(e)}); "
                        "it was edited or written by another version.") from None
    except OSError as e:
        raise denied(path, "read the run record", e) from None


def _read(path: Path) -> RunRecord:
    """The record at ``path`` (runs/<id>/run.json), when it is what it says: a regular file
    (no symlink, bounded), its ``run_id`` its directory's name, its ``uid`` the owner of the
    file and of the directory.  RecordError when not; OSError when it cannot be read."""
    text, st = read_regular(path)
    record = trusted(text, st, os.lstat(path.parent), path.parent.name)
    record._on_disk = True
    return record


def trusted(text: str | bytes, st: os.stat_result, d: os.stat_result, dir_name: str) -> RunRecord:
    """The record in ``text`` (a run.json whose stat is ``st``, in the directory ``dir_name``
    whose stat is ``d``), when it is what it says: every value usable (:func:`read_back_problem`),
    its ``run_id`` its directory's name, its ``uid`` the owner of the file and of the
    directory; ``uid`` and ``user`` are then the owner's, whatever the file says.  The one
    check of a record read back (``clusterctl`` and the dashboard).  RecordError, or pydantic's
    ValidationError, when not.  Pure."""
    record = RunRecord.model_validate_json(text)
    if not _RUN_ID.match(record.run_id):
        raise RecordError(f"its run id {shown(record.run_id, 80)} is not a valid one")
    problem = read_back_problem(record)
    if problem:
        raise RecordError(problem)
    if record.run_id != dir_name:
        raise RecordError(f"it names run {shown(record.run_id, 80)} but is in directory {shown(dir_name, 80)} "
                          "(renamed or copied)")
    if d.st_uid != st.st_uid:
        raise RecordError(f"the file's owner ({user_name(st.st_uid)}) does not own its directory "
                          f"({user_name(d.st_uid)})")
    if record.uid is not None and record.uid != st.st_uid:
        raise RecordError(f"it says uid {record.uid} ({record.user or '?'}) launched it, but "
                          f"{user_name(st.st_uid)} (uid {st.st_uid}) wrote it")
    record.uid = st.st_uid              # an older record without uid: its file's owner's
    record.user = user_name(st.st_uid)  # the name shown is the owner's, whatever the file says
    return record


# --- what a record read back may hold: one table of (field, rule), walked over every record --

#: Every state a run (and each of its attempts) is recorded in.
RUN_STATES = ("starting", "running", "restarting", "succeeded", "failed", "hung", "suspicious",
              "interrupted", "start-failed", "stopped", "unknown")
#: Every state a node's container is recorded in: clusterctl's words and what the container
#: runtimes report (docker: created ... dead; Podman also configured, initialized, stopping).
NODE_STATES = ("created", "running", "exited", "stopped", "lost", "unknown", "restarting", "paused",
               "removing", "dead", "configured", "initialized", "stopping")
#: What a first failure (and an attempt's end) was: supervise.Failure.kind, recovery.AttemptEnd.kind.
FAILURE_KINDS = ("exit", "lost", "start", "check", "hang")
#: Characters of free text (a note, a reason, an output line), of a name (node, host, container,
#: user; DNS's 253), of a path, and of one command-line argument or environment value.
TEXT_MAX, NAME_MAX, PATH_MAX, ARG_MAX = 4096, 253, 4096, 65536
#: Ranks are 0..RANK_MAX; exit codes what a process returns (docker, srun, a shell: 0-255, the
#: code clusterctl records for a run too: exitcodes, 128 + a signal); pids at most Linux's pid_max.
RANK_MAX, EXIT_MAX, PID_MAX = 10**7, 255, 2**22

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
#: A Slurm job id as clusterctl records it: what slurm.submit.parse_job_id takes from sbatch.
_SLURM_JOB = re.compile(r"[0-9]{1,20}\Z")
_GIT_COMMIT = re.compile(r"[0-9a-f]{4,64}\Z")


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What one field read back may hold: ``problem(value)`` says why not, in words safe to print
    (None: usable); ``fit`` makes a value clusterctl itself produced (free text from a job's
    output, a runtime's word) one that reads back, when the record is saved."""

    problem: Callable[[Any], str | None]
    fit: Callable[[Any], Any] | None = None


def _text(limit: int, *, lines: bool = False) -> _Rule:
    """Text of at most ``limit`` characters without a control character (``lines``: but tab and
    line feed); saved escaped and cut to fit."""
    def problem(v: Any) -> str | None:
        if not isinstance(v, str):
            return f"is {shown(v, 40)}, not text"
        if len(v) > limit:
            return f"is {len(v)} characters long, more than {limit}"
        return control_problem(v, multiline=lines)
    return _Rule(problem, lambda v: escaped(v)[:limit] if isinstance(v, str) else v)


def _pattern(regex: re.Pattern, what: str) -> _Rule:
    return _Rule(lambda v: None if isinstance(v, str) and regex.match(v) else f"is {shown(v, 40)}, {what}")


def _one_of(words: tuple[str, ...], what: str, fit: str | None = None) -> _Rule:
    return _Rule(lambda v: None if v in words else f"is {shown(v, 40)}, {what}",
                 (lambda _v: fit) if fit else None)


def _int(low: int, high: int, what: str) -> _Rule:
    def problem(v: Any) -> str | None:
        number = isinstance(v, int) and not isinstance(v, bool)
        if number and low <= v <= high:
            return None
        said = str(v) if number and abs(v) < 10**40 else shown(v, 40)
        return f"is {said}, not {what} (from {low} to {high})"
    return _Rule(problem)


def _node_name(v: Any) -> str | None:
    if isinstance(v, str) and len(v) <= NAME_MAX and NODE_NAME_RE.fullmatch(v):
        return None
    return (f"is {shown(v, 40)}, which is not a node name (letters, digits, '.', '_', ':' and '-', "
            "starting with a letter or digit)")


_NODE = _Rule(_node_name)
_NAME, _LINE, _PATH = _text(NAME_MAX), _text(TEXT_MAX), _text(PATH_MAX)
_ARG = _text(ARG_MAX, lines=True)
_LINES = _Rule(lambda v: next(filter(None, map(_LINE.problem, v)), None) if isinstance(v, list)
               else _LINE.problem(v), lambda v: [*map(_LINE.fit, v)] if isinstance(v, list) else _LINE.fit(v))
_RUN_STATE = _one_of(RUN_STATES, "not a state of a run")
_NODE_STATE = _one_of(NODE_STATES, "not a state of a container", fit="unknown")
_KIND = _one_of(FAILURE_KINDS, "not a kind of failure")
_EXIT = _int(0, EXIT_MAX, "an exit code")
_RANK = _int(0, RANK_MAX, "a rank")
_COUNT = _int(0, MAX_RESTARTS, "a number of attempts")
_DIGEST_RULE = _pattern(_DIGEST, "not sha256:<64 hex digits>")


def _node_fields(at: str) -> list[tuple[str, _Rule]]:
    return [(f"{at}.node", _NODE), (f"{at}.host", _NAME), (f"{at}.container", _NAME),
            (f"{at}.rank", _RANK), (f"{at}.state", _NODE_STATE), (f"{at}.exit_code", _EXIT),
            (f"{at}.stopped_by", _LINE), (f"{at}.flight_dir", _PATH),
            (f"{at}.env{{}}", _text(NAME_MAX + 2)), (f"{at}.env[]", _ARG)]


def _failure_fields(at: str) -> list[tuple[str, _Rule]]:
    return [(f"{at}.node", _NODE), (f"{at}.rank", _RANK), (f"{at}.kind", _KIND),
            (f"{at}.exit_code", _EXIT), (f"{at}.reason", _LINE), (f"{at}.last_lines[]", _LINE)]


#: Every value of a record read back and what it may hold (:func:`read_back_problem`), as a
#: path: ``a.b`` a field, ``a[]`` each item of a list (each value of a dict), ``a{}`` each key
#: of a dict.  A value that is None (not recorded) is not checked.
READ_BACK: tuple[tuple[str, _Rule], ...] = (
    # node names: they become file names (<node>.log, flight/<node>/) and arguments
    ("spares[]", _NODE), ("next_nodes[]", _NODE), ("excluded{}", _NODE), ("flight{}", _NODE),
    *_node_fields("nodes[]"), *_failure_fields("first_failure"),
    ("attempt", _COUNT), ("max_restarts", _COUNT),
    ("image_digest", _DIGEST_RULE), ("slurm_job", _pattern(_SLURM_JOB, "not a Slurm job id (digits)")),
    ("job", _NAME), ("inventory", _PATH), ("image", _LINE), ("image_id", _LINE), ("registry", _LINE),
    ("master_addr", _NAME), ("master_port", _int(0, 65535, "a port")), ("state", _RUN_STATE),
    ("exit_code", _EXIT), ("argv[]", _ARG), ("scheduler", _NAME), ("stopped_by", _LINE),
    ("launcher.host", _NAME), ("launcher.boot_id", _NAME), ("launcher.pid", _int(1, PID_MAX, "a pid")),
    ("note", _LINE), ("collective_errors[]", _LINE), ("flight[]", _LINES),
    ("excluded[]", _LINE), ("checkpoint", _PATH), ("checkpoint_start", _PATH),
    ("hang.phase", _one_of(("start", "running"), "not a phase of a hang")), ("hang.stacks_dir", _PATH),
    ("hang.files[]", _NAME), ("hang.majority_frame", _LINE), ("hang.last_output", _NAME),
    ("hang.detected", _NAME), ("hang.odd_ranks[].node", _NODE), ("hang.odd_ranks[].rank", _RANK),
    ("hang.odd_ranks[].pid", _int(1, PID_MAX, "a pid")), ("hang.odd_ranks[].state", _NAME),
    ("hang.odd_ranks[].reason", _LINE), ("hang.node_errors{}", _NODE), ("hang.node_errors[]", _LINE),
    ("hang.error", _LINE),
    ("code.workdir", _PATH), ("code.git_commit", _pattern(_GIT_COMMIT, "not a git commit (hex)")),
    ("code.requirements", _PATH), ("code.requirements_digest", _LINE), ("code.image", _LINE),
    ("code.sent{}", _NODE),
    ("spec.job", _PATH), ("spec.cwd", _PATH), ("spec.flags.workdir", _PATH),
    ("spec.flags.requirements", _PATH),
    ("spec.secret_env[]", _pattern(ENV_NAME, "not an environment variable's name")),
    *_node_fields("attempts[].nodes[]"), *_failure_fields("attempts[].first_failure"),
    ("attempts[].excluded{}", _NODE), ("attempts[].replaced{}", _NODE), ("attempts[].replaced[]", _NODE),
    ("attempts[].attempt", _COUNT), ("attempts[].state", _RUN_STATE), ("attempts[].exit_code", _EXIT),
    ("attempts[].master_addr", _NAME), ("attempts[].ended", _LINE), ("attempts[].then", _LINE),
    ("attempts[].excluded[]", _LINE), ("attempts[].checkpoint", _PATH), ("attempts[].timings{}", _NAME),
    ("attempts[].end.attempt", _COUNT), ("attempts[].end.state", _RUN_STATE),
    ("attempts[].end.exit_code", _EXIT), ("attempts[].end.node", _NODE), ("attempts[].end.kind", _KIND),
    ("attempts[].end.last_line", _LINE), ("attempts[].end.lost[]", _NODE),
    ("attempts[].end.blamed[]", _NODE), ("attempts[].end.checkpoint", _PATH),
)


def _at(obj: Any, steps: list[str], label: str, put: Callable[[Any], None] | None):
    """(label, value, put) of each value at ``steps`` below ``obj`` (see :data:`READ_BACK`);
    ``put`` replaces the value (None: a key, or an item of a tuple)."""
    if obj is None:
        return
    if not steps:
        yield label, obj, put
        return
    step, rest = steps[0], steps[1:]
    name = step.rstrip("[]{}")
    child = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None) if isinstance(
        obj, BaseModel) else None
    where = f"{label}.{name}" if label else name
    if step.endswith("{}"):
        for key in child if isinstance(child, dict) else ():
            yield from _at(key, rest, f"{where} key", None)
    elif step.endswith("[]"):
        items = (child.items() if isinstance(child, dict) else enumerate(child)
                 if isinstance(child, (list, tuple)) else ())
        for key, value in items:
            yield from _at(value, rest, f"{where}[{shown(key, 40) if isinstance(child, dict) else key}]",
                           None if isinstance(child, tuple) else
                           (lambda v, c=child, k=key: c.__setitem__(k, v)))
    else:
        yield from _at(child, rest, where, (lambda v: obj.__setitem__(name, v)) if isinstance(obj, dict)
                       else (lambda v: setattr(obj, name, v)))


def read_back_problem(record: RunRecord) -> str | None:
    """Why ``record`` holds a value that must not be used, by :data:`READ_BACK`: a node name that
    would become a file name or a path part (``..``, ``/``), a Slurm job id that is no job id
    (it becomes an argument of scancel and sacct), a state that is none, text holding a
    control character (it would act on a terminal when printed) or too long to print, an
    exit code or rank no process or job has.  None when every value is usable.  Pure."""
    for path, rule in READ_BACK:
        for label, value, _put in _at(record, path.split("."), "", None):
            problem = rule.problem(value)
            if problem:
                return f"its {label} {problem}"
    return None


def _fit_to_read_back(record: RunRecord) -> None:
    """Make the values clusterctl itself recorded read back (:data:`READ_BACK`): free text from
    a job's output or a node (a last line, a reason) escaped and cut, a runtime's unknown word
    for a container's state "unknown".  What is already fine is left as it is."""
    for path, rule in READ_BACK:
        if rule.fit is None:
            continue
        for _label, value, put in list(_at(record, path.split("."), "", None)):
            if put is not None and rule.problem(value):
                put(rule.fit(value))


def _first_error(e: Exception) -> str:
    """The first problem pydantic (or a read) found, safe to print: a location or message
    read back may hold a planted key."""
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return shown(f"field {loc}: {first['msg']}", 300, quoted=False)
    return shown(str(e).splitlines()[0] if str(e) else type(e).__name__, 300, quoted=False)


def list_runs(skipped: list[str] | None = None) -> list[RunRecord]:
    """Every readable, trustworthy run record under runs_dir(), newest first (by start time);
    ``skipped`` gets a line for each record left out and why."""
    root = runs_dir()
    if not root.is_dir():
        return []
    found: list[RunRecord] = []
    for path in root.glob(f"*/{RECORD_NAME}"):
        said = escaped(str(path))       # a directory name anyone sharing the runs directory chose
        try:
            found.append(_read(path))
        except RecordError as e:
            if skipped is not None:
                skipped.append(f"{said}: not to be trusted ({e})")
        except PermissionError:
            if skipped is not None:
                skipped.append(f"{said}: not readable (its owner runs `chmod a+r` on it)")
        except (ValidationError, ValueError) as e:
            if skipped is not None:
                skipped.append(f"{said}: not a valid run record ({_first_error(e)})")
        except OSError:
            continue  # a foreign or damaged directory is not a run; `runs` skips it
    found.sort(key=lambda r: (r.started, r.run_id), reverse=True)
    return found


def resolve(run_id: str | None, *, uid: int | None = None) -> RunRecord:
    """``run_id``'s record (whoever's), or when None the newest run of ``uid`` (default: the
    caller's).
    UserError when there is none, naming the newest run of another user if there is one."""
    if run_id:
        return load(run_id)
    all_runs = list_runs()
    if not all_runs:
        raise UserError(
            f"no runs recorded in {runs_dir().resolve()} yet; start one with "
            "`clusterctl launch JOB --nodes INVENTORY` (CLUSTERCTL_RUNS points elsewhere)."
        )
    uid = os.geteuid() if uid is None else uid
    user = user_name(uid)
    for r in all_runs:
        if owned_by(r, uid):
            return r
    other = all_runs[0]
    raise UserError(
        f"no runs of user {user} in {runs_dir().resolve()}; without RUN only your own runs are "
        f"meant. The newest is {other.run_id} of user {other.user}: name it (e.g. `clusterctl "
        f"status {other.run_id}`); `clusterctl runs` lists them all."
    )


def owned_by(record: RunRecord, uid: int | None = None) -> bool:
    """Whether ``record`` is the run of ``uid`` (default: the caller's effective uid)."""
    return record.uid == (os.geteuid() if uid is None else uid)


def others_run(record: RunRecord, uid: int | None = None) -> str | None:
    """The owner of ``record`` when it is not ``uid``'s (default: the caller's) run, else
    None: what ``logs``/``status`` name in a header and ``stop``, ``launch --rerun`` and
    ``--resume`` refuse without ``--any-user``."""
    if owned_by(record, uid):
        return None
    return record.user or (user_name(record.uid) if record.uid is not None else "unknown")


def summary_rows(records: list[RunRecord]) -> list[list[str]]:
    """Rows for the ``clusterctl runs`` table."""
    rows = []
    for r in records:
        state = r.state + (f" ({len(r.attempts)} attempts)" if len(r.attempts) > 1 else "")
        rows.append([
            r.run_id, r.user, r.job, code_words(r.code), str(len(r.nodes)), state,
            "" if r.exit_code is None else str(r.exit_code),
            _short_time(r.started), _short_time(r.finished),
            _why(r),
        ])
    return rows


def code_words(code: CodeRecord | None) -> str:
    """``3f2a9c1d04be @ 1c2d3e4 (dirty)``: the code digest and the git commit it came from."""
    if code is None:
        return ""
    words = code.digest.split(":", 1)[-1][:12]
    if code.git_commit:
        words += f" @ {code.git_commit[:7]}" + (" (dirty)" if code.git_dirty else "")
    return words


def attempt_lines(r: RunRecord) -> list[str]:
    """A restarted run's attempts in words (``status``): nodes, how each ended, what followed;
    then the nodes excluded for good."""
    lines = []
    for a in r.attempts:
        nodes = ", ".join(f"{n.node}[{n.rank}]" for n in a.nodes)
        lines.append(f"attempt {a.attempt}: {nodes}: " + (a.ended or a.state)
                     + (f"; {a.then}" if a.then else "")
                     + "".join(f"; {new} replaced {old}" for old, new in a.replaced.items()))
    if r.excluded:
        lines.append("excluded: " + "; ".join(f"{n} ({why})" for n, why in r.excluded.items()))
    return lines


def _why(r: RunRecord) -> str:
    """The ``runs`` table's last column: the first failure, a hang, a collective error in the
    output of a run that exited 0, who stopped the run, or a note."""
    if r.attempts and r.note:
        return r.note
    if r.first_failure is not None:
        f = r.first_failure
        return f"{f.node}[{f.rank}] " + ("lost" if f.kind == "lost" else describe_exit(f.exit_code))
    if r.hang:
        odd = [f"{o['node']} rank {o['rank']}" for o in r.hang.get("odd_ranks", [])]
        return "hang" + (": " + ", ".join(odd) if odd else "")
    if r.collective_errors:
        return "collective error in output"
    if r.stopped_by:
        return f"stopped by {r.stopped_by}"
    return r.note


def _short_time(t: datetime | None) -> str:
    return "" if t is None else t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def dump(record: RunRecord) -> str:
    return json.dumps(json.loads(record.model_dump_json()), indent=2)


# --- master ports: which runs hold which, one launch choosing at a time -------------------

#: Record states of a run whose master port is (or is about to be) taken on its master.
LIVE_STATES = ("starting", "running", "restarting")
#: runs/.ports/: the lock launches choose their master port under, and their claims.
PORTS_DIR = ".ports"
#: A claim whose launch cannot be checked (another host) counts this long at most.
CLAIM_TTL = timedelta(hours=12)
#: Seconds a launch waits at most for another to finish choosing its port.
LOCK_TIMEOUT = 60.0


def _own_ports_dir(d: Path) -> None:
    """runs/.ports/, made as shareable as the runs directory (a sticky group directory gets a
    sticky group .ports/) and checked like it (:func:`check_runs_dir`)."""
    root = check_runs_dir(d.parent)
    try:
        root.mkdir(parents=True, exist_ok=True)
        d.mkdir()
        shared = stat.S_IMODE(os.stat(root).st_mode)
        if shared & stat.S_ISVTX:
            os.chmod(d, shared & 0o3777)
    except FileExistsError:
        pass
    except PermissionError as e:
        raise denied(d, "create", e) from None
    if os.path.islink(d):
        raise UserError(f"{d} is a symlink; clusterctl never follows one there: remove it.")
    check_runs_dir(d)


class PortClaim(BaseModel):
    """``runs/.ports/<run-id>.json``: the master port a launch took, from the moment it chose
    it until its record says so (and while that launch lives)."""

    run_id: str
    user: str
    uid: int | None = None
    master_addr: str
    port: int
    time: datetime = Field(default_factory=utcnow)
    launcher: Launcher


class Holder(BaseModel):
    """A run that holds a master port."""

    run_id: str
    user: str = ""
    state: str = ""

    def words(self) -> str:
        return f"run {self.run_id} of user {self.user or 'unknown'}" + (
            f" ({self.state})" if self.state else "")


def _claims_dir() -> Path:
    return runs_dir() / PORTS_DIR


def _claim_live(claim: PortClaim, recorded: Mapping[str, RunRecord]) -> bool:
    """A claim counts while its launch lives (or, from another host, for CLAIM_TTL), and once
    its run is recorded only while that record says the run goes on."""
    gone = launcher_gone(claim.launcher)
    if not (gone is False or (gone is None and utcnow() - claim.time < CLAIM_TTL)):
        return False
    record = recorded.get(claim.run_id)
    return record is None or record.state in LIVE_STATES


def _claims(recorded: Mapping[str, RunRecord]) -> list[tuple[Path, PortClaim | None, bool]]:
    """Every claim file: (path, the claim or None when unreadable, whether it counts).  A
    claim that cannot be read counts for CLAIM_TTL after it was written (its port is not
    known: see :func:`take_master_port`); a damaged one counts not at all.  A file whose name
    is no run id's, or whose run id or uid disagrees with its name or owner, is no claim
    (left out, never removed); a claim's ``user`` is its file's owner, whatever it says."""
    d = _claims_dir()
    found = []
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        if not _RUN_ID.match(path.name[:-len(".json")]):
            continue        # no name clusterctl gives a claim: not one, and never removed
        try:
            text, st = read_regular(path)
            claim = PortClaim.model_validate_json(text)
        except PermissionError:
            try:
                young = utcnow() - datetime.fromtimestamp(os.lstat(path).st_mtime, timezone.utc) < CLAIM_TTL
            except OSError:
                young = False
            found.append((path, None, young))
            continue
        except (ValidationError, ValueError, OSError):
            found.append((path, None, False))
            continue
        if path.name != f"{claim.run_id}.json" or claim.uid not in (None, st.st_uid):
            continue        # renamed, or says another uid wrote it: no claim, never removed
        claim.user = user_name(st.st_uid)   # who holds it: its file's owner, whatever it says
        found.append((path, claim, _claim_live(claim, recorded)))
    return found


def port_holders(master_addr: str, *, skip_run: str | None = None) -> dict[int, Holder]:
    """port -> the run of this runs directory that holds it on the master ``master_addr``:
    a run whose record says starting, running or restarting (not one whose launch died),
    or a launch that claimed the port and has not recorded it yet.  ``skip_run``: a run
    whose own ports do not count (its next attempt may take them again)."""
    return _holders(master_addr, skip_run, _recorded())[0]


def _recorded() -> dict[str, RunRecord]:
    return {r.run_id: r for r in list_runs()}


def _holders(master_addr: str, skip_run: str | None, recorded: Mapping[str, RunRecord]
             ) -> tuple[dict[int, Holder], list[Path]]:
    """port_holders, and the claim files that no longer count (to remove: only the caller's
    own; another user's claim is never removed).  UserError when a claim that may be live
    cannot be read (the port it holds is unknown)."""
    held: dict[int, Holder] = {}
    for r in recorded.values():
        if (r.run_id != skip_run and r.master_port and r.master_addr == master_addr
                and r.state in LIVE_STATES and not launcher_died(r)):
            held.setdefault(r.master_port, Holder(run_id=r.run_id, user=r.user, state=r.state))
    stale = []
    for path, claim, live in _claims(recorded):
        if not live:
            if _is_mine(path):
                stale.append(path)
        elif claim is None:
            raise UserError(unreadable_claim_message(path))
        elif claim.run_id != skip_run and claim.master_addr == master_addr:
            held.setdefault(claim.port, Holder(run_id=claim.run_id, user=claim.user,
                                               state=getattr(recorded.get(claim.run_id), "state", "starting")))
    return held, stale


def unreadable_claim_message(path: Path) -> str:
    """Why no port was chosen while the claim ``path`` cannot be read, and what its owner does
    (the path escaped, and shell-quoted in the command to copy)."""
    shown_path = escaped(str(path))
    return (f"the port claim {shown_path} cannot be read (owner {_owner_name(path)}), so the port it "
            "holds is not known and none was chosen; nothing was started. Its owner makes it "
            f"readable (`chmod a+r {shlex.quote(shown_path)}`) or removes it; it stops counting "
            f"{CLAIM_TTL.total_seconds() / 3600:g} h after it was written.")


def _is_mine(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _owner_name(path: Path) -> str:
    try:
        return user_name(os.lstat(path).st_uid)
    except OSError:
        return "unknown"


def held_message(port: int, node: str, holder: Holder, where: str = "") -> str:
    """``port 29500 on node1 is held by run X of user alice (running)``, with what to do."""
    return (f"port {port} on {node}{f' ({where})' if where else ''} is held by {holder.words()}; "
            "nothing was started. Leave the port unpinned (launch then picks a free one), pin "
            f"another, or wait for that run (`clusterctl status {holder.run_id}`).")


def take_master_port(run_id: str, master_addr: str, choose: Callable[[Mapping[int, Holder]], int],
                     *, on_wait: Callable[[str], None] = lambda _text: None) -> int:
    """The master port of ``run_id``'s attempt on ``master_addr``: ``choose(holders)`` (which
    may raise UserError) with the ports other runs hold (:func:`port_holders`), under the
    runs directory's port lock, and claimed there before the lock is let go, so a launch
    choosing at the same moment sees it.  Stale claims (their launch ended) are removed."""
    d = _claims_dir()
    _own_ports_dir(d)
    with one_at_a_time(d / "lock", on_wait, "launch choosing its master port", timeout=LOCK_TIMEOUT):
        held, stale = _holders(master_addr, run_id, _recorded())
        port = choose(held)
        for path in stale:
            path.unlink(missing_ok=True)
        claim = PortClaim(run_id=run_id, user=current_user(), uid=os.geteuid(),
                          master_addr=master_addr, port=port, launcher=this_launcher())
        write_atomic(d / f"{run_id}.json", claim.model_dump_json(indent=2) + "\n", mode=0o644)
    return port


# --- what a record implies about the nodes ---------------------------------------------------

def inventory_path(record: RunRecord, nodes: Path | None = None) -> Path:
    """The inventory to reach ``record``'s nodes with: ``nodes`` (``--nodes``) when given,
    else the one recorded.  Another user's record names a file that user chose: it is read
    only when that user could read it (a regular file, through directories they may enter):
    root, or anyone who can read more than they can, would otherwise read, and quote in a
    refusal, whatever file the record names (/etc/shadow), and reach the hosts in it with
    their own identity.  A file the caller cannot even look at is left to the reader, whose
    message says so.  UserError saying to give ``--nodes`` when not."""
    if nodes is not None:
        return Path(nodes)
    path = Path(record.inventory)
    if owned_by(record) or record.uid is None:
        return path
    try:
        theirs = readable_by(path, record.uid)
    except OSError:
        return path
    if not theirs:
        raise UserError(f"run {record.run_id} is {others_run(record)}'s, and the inventory its record "
                        f"names ({shown(record.inventory)}) is not a file {others_run(record)} can read: "
                        "it is not read for them. Give the inventory of its nodes: --nodes FILE.")
    return path


def readable_by(path: Path, uid: int) -> bool:
    """Whether the user ``uid`` may read ``path`` (a regular file, every directory above it
    enterable), by its modes, owners and that user's groups.  OSError when this process
    cannot look at it itself."""
    if uid == 0:
        return True
    try:
        pw = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except KeyError:
        groups = set()

    def may(st: os.stat_result, owner: int, group: int, other: int) -> bool:
        if st.st_uid == uid:
            return bool(st.st_mode & owner)
        return bool(st.st_mode & (group if st.st_gid in groups else other))

    real = Path(os.path.realpath(path))
    if not all(may(os.stat(d), 0o100, 0o010, 0o001) for d in reversed(real.parents)):
        return False
    st = os.stat(real)
    return stat.S_ISREG(st.st_mode) and may(st, 0o400, 0o040, 0o004)


def may_have_containers(record: RunRecord) -> bool:
    """Whether the run's containers may still exist on the nodes.

    A followed run that ended had its containers removed by launch; a detached
    run, one still starting or running, or one with a lost node may still have some.
    """
    return record.detached or record.state in ("starting", "running", "restarting", "unknown") or any(
        n.state in ("lost", "unknown") for n in record.nodes)


def record_stop(record: RunRecord, final: dict[str, list[ContainerState]], was_running: bool,
                *, by: str | None = None, stopped: dict[str, list[str]] | None = None) -> None:
    """Put what ``clusterctl stop`` found in the record and save it.

    ``final``: node -> its containers' last states (before removal);
    ``was_running``: some container was still running and was stopped;
    ``stopped``: node -> the names of the containers that were stopped (the rest had ended
    on their own); ``by``: who stopped them.  A run that was stopped is "stopped", with
    :data:`STOPPED_EXIT` and ``stopped_by``; each container keeps its real exit code.  A run
    whose containers had all ended by themselves gets its true outcome, the first failure by
    time.
    """
    stopped = stopped or {}
    for n in record.nodes:
        if final.get(n.node):
            st = final[n.node][0]
            n.state, n.exit_code, n.started, n.finished = st.status, st.exit_code, st.started, st.finished
            if st.name in stopped.get(n.node, []):
                n.state, n.stopped_by = "stopped", by
    if was_running:
        record.state, record.finished = "stopped", record.finished or utcnow()
        record.exit_code = STOPPED_EXIT if record.exit_code is None else record.exit_code
        record.stopped_by = record.stopped_by or by
    elif record.state in ("starting", "running", "unknown") and all(
            n.exit_code is not None for n in record.nodes):
        settle_ended(record)
    record.save()


#: The exit status recorded for a run stopped on request (128 + SIGTERM, as `launch` exits
#: after SIGTERM): each container's own code stays in its node's record.
STOPPED_EXIT = exitcodes.TERMINATED  # 143


def settle_ended(record: RunRecord) -> None:
    """Every container of ``record`` has ended on its own (each node's exit code and finish
    time are in it): the run's outcome is the first failure by finish time, else success."""
    failed = sorted((n for n in record.nodes if n.exit_code), key=lambda n: n.finished or utcnow())
    record.state = "failed" if failed else "succeeded"
    record.exit_code = failed[0].exit_code if failed else 0
    record.note = ""
    record.finished = max((n.finished for n in record.nodes if n.finished), default=utcnow())
    if failed:
        f = failed[0]
        record.first_failure = record.first_failure or FailureRecord(
            node=f.node, rank=f.rank, kind="exit", exit_code=f.exit_code or 1,
            time=f.finished or record.finished)


def launcher_died(record: RunRecord) -> bool:
    """The record says a followed run is going, but the launch that followed it is gone
    (killed: SIGKILL, a crash, the machine rebooted): nobody will record its outcome."""
    return (not record.detached and record.state in ("starting", "running", "restarting")
            and launcher_gone(record.launcher) is True)


def mark_unknown_if_orphaned(record: RunRecord) -> bool:
    """Record state "unknown" for a followed run whose launch process died (see
    :func:`launcher_died`); True when it did.  ``status`` and ``stop`` ask the nodes and
    record the real outcome then."""
    if not launcher_died(record):
        return False
    launcher = record.launcher
    record.state = "unknown"
    record.note = (f"the launch following it (pid {launcher.pid} on {launcher.host}) ended without "
                   "recording an outcome; `clusterctl status` asks the nodes, `clusterctl stop` "
                   "stops and removes its containers")
    record.save()
    return True


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
    stopped_by: str | None = None  # from the record: who stopped this container


def run_status(record: RunRecord, cluster: Cluster, *, timeout: float = 15.0) -> list[NodeStatus]:
    """Each node's container of ``record``'s run, as the node reports it (found by label).

    A node that does not answer in ``timeout`` or no longer has the container
    falls back to what run.json recorded, and the row says so.
    """
    def ask(conn: NodeConnection):
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
                               source="record", note=note, stopped_by=n.stopped_by))
    return rows


def _in_inventory(cluster: Cluster, name: str) -> bool:
    return any(node.name == name for node in cluster.inventory.nodes)


def containers_ended(record: RunRecord, rows: list[NodeStatus]) -> bool:
    """Every container of a run the record still calls starting/running/unknown has ended on
    its node (as the nodes say now): its outcome can be recorded."""
    return record.state in ("starting", "running", "unknown") and bool(rows) and all(
        r.source == "node" and r.state in ("exited", "dead") for r in rows) and (
        launcher_gone(record.launcher) is not False)    # a live launch records it itself


def record_ended(record: RunRecord, rows: list[NodeStatus]) -> bool:
    """When every container has ended (:func:`containers_ended`), put each one's exit code and
    times and the run's true outcome in the record (``status`` does this: a run whose
    containers all exited 0 is "succeeded", not "running").  True when it did."""
    if not containers_ended(record, rows):
        return False
    by_node = {r.node: r for r in rows}
    for n in record.nodes:
        r = by_node.get(n.node)
        if r is not None:
            n.state, n.exit_code, n.started, n.finished = r.state, r.exit_code, r.started, r.finished
    settle_ended(record)
    record.save()
    return True


def status_rows(rows: list[NodeStatus]) -> list[list[str]]:
    return [[r.node, str(r.rank), r.state, describe_exit(r.exit_code)[5:],
             _short_time(r.started), _short_time(r.finished),
             r.source + (f" ({r.note})" if r.note else "")
             + (f"; stopped by {r.stopped_by}" if r.stopped_by else "")] for r in rows]
