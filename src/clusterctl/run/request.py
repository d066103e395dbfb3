"""What one ``launch`` asks for, and the job, nodes and code it comes to.

:class:`LaunchRequest` holds a launch's options as the user gave them (the CLI fills it and
nothing else); :func:`prepare` turns it into a :class:`Prepared` launch: the job (a job file
with the flags over it, or the flags alone), the inventory, and for ``--rerun`` /
``--resume`` the recorded job and exactly its code, reconstructed from the run record.
Every backend (:mod:`clusterctl.run.backends`) starts from a ``Prepared``; none of this
touches a node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clusterctl.cluster.inventory import SLURM_WORD, Inventory, load_inventory
from clusterctl.core.durations import DURATION_HELP, parse_duration
from clusterctl.core.errors import UserError
from clusterctl.core.text import without_credentials
from clusterctl.run import plan, records, supervise
from clusterctl.run import workspace as workspaces
from clusterctl.run.jobs import Job, escape_braces, inline_job, is_secret_name, job_path, load_job


@dataclass
class LaunchRequest:
    """One ``launch``: its options exactly as given (None: not given)."""

    job: str | None = None                 # a shipped job's name or a job file's path
    nodes: Path | None = None              # the inventory (Slurm: the nodes by their names)
    sets: list[str] = field(default_factory=list)      # --set NAME=VALUE items
    given: dict[str, Any] = field(default_factory=dict)  # job keys given as flags (and the command)
    image: str | None = None
    dry_run: bool = False
    json: bool = False
    detach: bool = False
    run_id: str | None = None
    accept_new_host_keys: bool = False
    scheduler: str = "ssh"
    scheduler_options: dict[str, Any] = field(default_factory=dict)  # --partition, --nnodes, ...
    hang_timeout: float | None = None      # seconds (--hang-timeout)
    fail_grace: int = supervise.Settings.fail_grace
    resume: str | None = None              # RUN_ID
    rerun: str | None = None               # RUN_ID
    any_user: bool = False                 # --rerun/--resume of another user's run allowed
    argv: list[str] = field(default_factory=list)      # the command line, as recorded


@dataclass
class Prepared:
    """A launch made concrete: the job to run, where, and (rerun/resume) what it ran before."""

    request: LaunchRequest
    job: Job
    inventory: Inventory | None
    record_spec: dict | None = None        # what run.json keeps to run it again
    workspace: workspaces.Workspace | None = None  # a recorded copy of the code (--rerun)
    resume: records.RunRecord | None = None
    image: str | None = None


def duration(option: str, text: str | None) -> float | None:
    """Seconds of a duration option, or UserError naming the option and a valid example."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as e:
        raise UserError(f"{option} {e}; valid: {DURATION_HELP}.") from None


def command_key(command: list[str] | None) -> list[str] | None:
    """The command typed after ``--`` as the job key ``command`` (None: none was typed)."""
    if command is None:
        return None
    if not command:
        raise UserError("nothing after --: give the command to run, e.g. -- python train.py.")
    return [escape_braces(word) for word in command]


def check(req: LaunchRequest) -> None:
    """The combinations of options no launch accepts; UserError saying what is valid."""
    if req.run_id is not None:     # an empty one too: it is refused, not silently replaced
        records.check_run_id(req.run_id)
    if req.resume is not None:
        if req.job is not None or req.given or req.rerun is not None:
            raise UserError(f"--resume {req.resume}: goes on with the recorded run as it was; give no "
                            "JOB, job flags, command or --rerun with it (--nodes, --set and "
                            "--detach are fine).")
        if req.dry_run:     # resuming acts at once (it follows, and may restart, the run)
            raise UserError(f"--resume {req.resume} --dry-run: resuming takes the live run over (it "
                            "follows its containers and restarts them as the run would), so there is "
                            f"no plan to show; `clusterctl status {req.resume}` shows its containers. "
                            "Nothing was done.")
    elif req.rerun is not None:
        if req.job is not None or req.given:
            raise UserError(f"--rerun {req.rerun}: runs the recorded job as it ran; give no JOB, job "
                            "flags or command with it (--nodes, --set and --detach are fine).")


def job_of(job: str | None, given: dict) -> Job:
    """The job to run: a job file with the flags over it, or the flags alone."""
    if job is not None:
        return load_job(job, given)
    if "command" not in given:
        raise UserError("give a JOB (a shipped job or a job YAML file), or your own command after "
                        "--, e.g. clusterctl launch --target cpu --workdir . --nodes inv.yaml -- "
                        "python train.py")
    return inline_job(given)


def spec_of(job: str | None, given: dict, secrets=()) -> dict:
    """What run.json keeps to run the job again (``launch --rerun``): the job file and the
    flags; an ``--env`` value that is secret (named like one, listed in the job's
    ``secrets``, or a URL holding a credential) is left out, only its name kept."""
    env = given.get("env") or {}
    hidden = sorted(k for k, v in env.items()
                    if is_secret_name(k, secrets) or without_credentials(str(v)) != str(v))
    flags = {**given, "env": {k: v for k, v in env.items() if k not in hidden}} if env else given
    return {"job": str(job_path(job).absolute()) if job is not None else None, "flags": flags,
            "secret_env": hidden, "cwd": str(Path.cwd())}


def secret_env_again(run_id_of: str, names: list[str], sets: list[str]) -> dict[str, str]:
    """The values of a recorded run's secret ``--env`` variables: ``--set NAME=...`` given
    again, else clusterctl's own environment; UserError naming the missing ones."""
    given = {item.partition("=")[0] for item in sets}
    found = {n: os.environ[n] for n in names if n not in given and n in os.environ}
    missing = [n for n in names if n not in given and n not in found]
    if missing:
        raise UserError(f"run {run_id_of} was given {', '.join(missing)} with --env, and secret "
                        "values are never recorded: give them again (--set NAME=..., or export "
                        "NAME=... before clusterctl). Nothing was started.")
    return found


def recorded_sets(record: records.RunRecord, sets: list[str]) -> list[str]:
    """The run's own ``--set`` items (from its recorded command line) with ``sets`` over them;
    a masked (secret) one must be given again.  UserError naming those missing."""
    given = {item.partition("=")[0] for item in sets}
    found, hidden = [], []
    argv = list(record.argv)
    for flag, item in zip(argv, argv[1:], strict=False):
        if flag == "--set" and item.partition("=")[0] not in given:
            (hidden if plan.MASK in item.partition("=")[2] else found).append(item)
    if hidden:
        names = ", ".join(h.partition("=")[0] for h in hidden)
        raise UserError(f"run {record.run_id} was given {names} with --set, and secret values are "
                        "never recorded: give them again (--set NAME=...). Nothing was started.")
    return [*found, *sets]


def recorded_job(record: records.RunRecord, nodes: Path | None, sets: list[str], *, what: str
                 ) -> tuple[Job, Inventory, workspaces.Workspace | None]:
    """The job, inventory and code a recorded run ran (``--rerun``, ``--resume``)."""
    run_id_of = record.run_id
    if record.spec is None or record.scheduler != "ssh":
        raise UserError(f"run {run_id_of} cannot be {what}: it was made by an older clusterctl or "
                        "through Slurm (its record keeps no job spec); launch the job again instead.")
    flags = dict(record.spec.get("flags") or {})
    secret_env = secret_env_again(run_id_of, list(record.spec.get("secret_env") or []), sets)
    if secret_env:
        flags["env"] = {**(flags.get("env") or {}), **secret_env}
    old_cwd = Path(record.spec.get("cwd") or ".")
    for key in ("workdir", "requirements"):      # relative to where the run was launched
        if key in flags:
            flags[key] = str(old_cwd / flags[key])
    if record.code is not None:
        flags.pop("requirements", None)          # the recorded image has them
        flags["workdir"] = record.code.workdir or str(old_cwd)
    needed = record.code is None      # with a recorded copy, the workdir may be gone since
    spec = (load_job(record.spec["job"], flags, workdir_needed=needed) if record.spec.get("job")
            else inline_job(flags, name=record.job, workdir_needed=needed))
    if record.code is not None:
        spec = replace(spec, requirements=None)
    inventory = load_inventory(records.inventory_path(record, nodes))
    ws = workspaces.rerun(record.code) if record.code is not None else None
    return spec, inventory, ws


def run_outcome(record: records.RunRecord) -> str:
    """``failed, exit 7`` / ``stopped by clusterctl stop (root@head), exit 143``: the heading."""
    words = record.state
    if record.stopped_by:
        words += f" by {record.stopped_by}"
    return words + ("" if record.exit_code is None else f", exit {record.exit_code}")


def _own_or_allowed(record: records.RunRecord, req: LaunchRequest, flag: str,
                    note: Callable[[str], None]) -> records.RunRecord:
    """``record`` when it is the caller's run, or another user's with ``--any-user`` (said on
    stderr); else UserError naming whose it is: its command would run with your identity."""
    owner = records.others_run(record)
    if owner is None:
        return record
    if not req.any_user:
        raise UserError(f"run {record.run_id} is user {owner}'s run, not yours "
                        f"({records.current_user()}): {flag} would run its recorded command on "
                        f"your nodes as you; nothing was started. To do it anyway: `clusterctl "
                        f"launch {flag} {record.run_id} --any-user`.")
    note(f"run {record.run_id} is user {owner}'s run; {flag} of it as you (--any-user)")
    return record


def resumed(req: LaunchRequest, note: Callable[[str], None] = lambda _text: None) -> Prepared:
    """``launch --resume RUN_ID``: a run whose follower died, to follow and go on with."""
    run_id_of = req.resume
    record = _own_or_allowed(records.load(run_id_of), req, "--resume", note)
    if record.state not in ("starting", "running", "restarting", "unknown"):
        raise UserError(f"run {run_id_of} has ended ({run_outcome(record)}): nothing to resume; "
                        f"`clusterctl launch --rerun {run_id_of}` runs it again.")
    if records.launcher_gone(record.launcher) is False:
        raise UserError(f"run {run_id_of} is followed by pid {record.launcher.pid} on this machine: "
                        f"`clusterctl attach {run_id_of}` follows it too.")
    if record.detached and not record.attempts:
        raise UserError(f"run {run_id_of} was started with --detach and nothing follows it by design; "
                        f"`clusterctl logs {run_id_of} --follow` follows it.")
    sets = recorded_sets(record, req.sets)
    spec, inventory, ws = recorded_job(record, req.nodes, sets, what="resumed")
    if record.state == "unknown":        # `runs` marked it when it found its launch gone
        record.state = "running"
    again = replace(req, sets=sets, dry_run=False, run_id=record.run_id)
    return Prepared(again, spec, inventory, record_spec=record.spec, workspace=ws, resume=record,
                    image=record.image)


def rerun(req: LaunchRequest, note) -> Prepared:
    """``launch --rerun RUN_ID``: the recorded job and exactly its code, on its nodes."""
    run_id_of = req.rerun
    record = _own_or_allowed(records.load(run_id_of), req, "--rerun", note)
    spec, inventory, ws = recorded_job(record, req.nodes, req.sets, what="run again")
    if ws is not None:
        note(f"rerun of {run_id_of}: code {record.code.digest} from this machine's store"
             + (f" (git {ws.git.commit[:7]})" if ws.git.commit else ""))
    image = req.image
    if ws is not None and ws.image and image is None:     # the dry run shows the same image
        image = ws.image
    return Prepared(req, spec, inventory, record_spec=record.spec, workspace=ws, image=image)


def fresh(req: LaunchRequest) -> Prepared:
    """A new SSH launch: the job and the inventory (``--nodes``; inside a Slurm allocation,
    its nodes)."""
    nodes = req.nodes
    if nodes is None and os.environ.get("SLURM_JOB_NODELIST"):
        nodes = Path(SLURM_WORD)   # inside a Slurm allocation: its nodes
    if nodes is None:
        raise UserError("--nodes FILE is required (or $CLUSTERCTL_NODES): the inventory to run on; "
                        "see inventories/example.yaml.")
    spec = job_of(req.job, req.given)
    inventory = load_inventory(nodes)
    return Prepared(req, spec, inventory, record_spec=spec_of(req.job, req.given, spec.secrets),
                    image=req.image)
