"""`clusterctl launch | logs | status | stop | runs`: run a job on the nodes and look after it.

Parsing and printing only, over clusterctl.run.launch / supervise / logs / records
(which decide everything: what a run's state implies, when to ask the nodes).  RUN defaults to
the newest run in ./runs (CLUSTERCTL_RUNS); ``--nodes`` defaults to the
inventory recorded with the run.

Exit status of ``launch``: the job's true outcome - 0 when every container
exited 0, else the exit code of the FIRST failure (by time); 255 when the first
failure is a node that stopped answering; 130 after Ctrl-C (143 after SIGTERM),
once every container of the run was stopped; 2 for bad input or a failed
preflight (nothing started); 1 when the image could not be pushed or a
container could not be started (nothing left running); 124 when the hang
watchdog (``--hang-timeout``) found the run hung; 125 when every container
exited 0 but the output shows a collective-library error (suspicious).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cli.nodes import NODES_HELP, nodes_option
from clusterctl.cli.push import PlainProgress
from clusterctl.cluster import preflight
from clusterctl.cluster.inventory import SLURM_WORD, load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.code import snapshot as code_snapshot
from clusterctl.core.console import err, out, print_table
from clusterctl.core.durations import DURATION_HELP, parse_duration
from clusterctl.core.errors import ClusterctlError, UserError, one_of
from clusterctl.core.tools import require_binaries
from clusterctl.image.codeimage import code_tag
from clusterctl.run import detached, plan, records, supervise
from clusterctl.run import launch as launching
from clusterctl.run import logs as logs_mod
from clusterctl.run import workspace as workspaces
from clusterctl.run.jobs import escape_braces, inline_job, is_secret_name, job_path, load_job
from clusterctl.run.slurm import conf as slurm_conf
from clusterctl.run.slurm import options as slurm_options
from clusterctl.run.slurm import script as slurm_script
from clusterctl.run.slurm import submit as slurm_submit
from clusterctl.run.slurm import tasks as slurm_tasks
from clusterctl.run.slurm import track as slurm_track

#: How ``launch`` starts the containers.
SCHEDULERS = ("ssh", "slurm")

RunArg = Annotated[str | None, typer.Argument(
    help="Run id (default: the newest run; `clusterctl runs` lists them).", show_default=False)]
RunNodesOption = Annotated[Path | None, nodes_option(
    "The inventory (default: the one recorded with the run).")]


def _cluster(nodes: Path | None, record: records.RunRecord) -> Cluster:
    """The nodes of ``record``'s run: ``--nodes``, else the inventory recorded with it."""
    return Cluster(load_inventory(nodes or record.inventory))


# --------------------------------------------------------------------------- launch

class CommandAfterDashes(typer.core.TyperCommand):
    """A command whose words after ``--`` are the program to run, kept exactly as typed
    (``launch --workdir . -- python train.py --lr 3e-4``): they never fill an argument."""

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            ctx.meta[COMMAND_META] = args[cut + 1:]
            args = args[:cut]
        return super().parse_args(ctx, args)


COMMAND_META = "clusterctl.command"


def launch(
    ctx: typer.Context,
    job: Annotated[str | None, typer.Argument(
        metavar="JOB [-- COMMAND...]",
        help="A shipped job (a file of jobs/ by its name: ddp-smoke, bert, ...) or the path of a "
             "job YAML file. Leave it out to run your own project: --workdir DIR and the "
             "command after --.", show_default=False)] = None,
    nodes: Annotated[Path | None, nodes_option(
        NODES_HELP + " With --scheduler slurm: the nodes to run on, by their Slurm names.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="NAME=VALUE",
        help="Set a job parameter or container env variable (repeatable; value taken as typed).")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Run this image instead of the job's.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print each node's docker run command (secrets masked); touch no node.")] = False,
    json_: Annotated[bool, typer.Option(
        "--json", help="Machine-readable: the plan (with --dry-run) or the run record at the end.")] = False,
    detach: Annotated[bool, typer.Option(
        "--detach", help="Start every container and return; follow later with `clusterctl logs -f`.")] = False,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Name the run (default: JOB-DATE-TIME-XXXX).")] = None,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="Record unknown node host keys (a changed key is always refused).")] = False,
    scheduler: Annotated[str, typer.Option(
        "--scheduler", help="ssh: start the containers over SSH; slurm: submit an sbatch script.")] = "ssh",
    partition: Annotated[str | None, typer.Option("--partition", help="Slurm partition (--scheduler slurm).")] = None,
    nnodes: Annotated[int | None, typer.Option(
        "--nnodes", help="Number of nodes Slurm allocates (--scheduler slurm; or --nodes FILE).")] = None,
    time_: Annotated[str | None, typer.Option(
        "--time", help="Slurm time limit, e.g. 30 or 1-12:00:00 (--scheduler slurm).")] = None,
    container: Annotated[str, typer.Option(
        "--container", help="docker (docker run on each node) or pyxis (srun --container-image); "
                            "--scheduler slurm.")] = "docker",
    hang_timeout: Annotated[str | None, typer.Option(
        "--hang-timeout", metavar="DURATION",
        help="When no rank has written output for this long (e.g. 10m, 90s): dump every rank's "
             "Python stacks (py-spy) into runs/<id>/stacks/, name the odd ranks, stop the run, "
             "exit 124. Default: the job's hang_timeout, else none.")] = None,
    hang_start_timeout: Annotated[str | None, typer.Option(
        "--hang-start-timeout", metavar="DURATION",
        help="The silence the hang watchdog allows before the job has started (its first "
             "line, or the first line --hang-start-line matches): imports, rendezvous, data "
             "loading. Default: the longer of --hang-timeout and 5m. Job key: "
             "hang_start_timeout.")] = None,
    hang_start_line: Annotated[str | None, typer.Option(
        "--hang-start-line", metavar="REGEX",
        help="The watchdog's clock (--hang-timeout) starts at the first output line this "
             "matches, e.g. 'step [0-9]+' (default: the first line any rank writes). Job key: "
             "hang_start_line.")] = None,
    fail_grace: Annotated[int, typer.Option(
        "--fail-grace", min=0, metavar="SECONDS",
        help="After a rank fails, the other containers get SIGTERM and this many seconds "
             "before SIGKILL (the run is doomed already; Ctrl-C gives 3).")] = supervise.Settings.fail_grace,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", metavar="DIR",
        help="Ship this project directory to every node (only what changed travels; "
             ".gitignore and .clusterctlignore honoured) and run the command in it, at "
             "/workspace, read-only. Job key: workdir.")] = None,
    target: Annotated[str | None, typer.Option(
        "--target", help="The stack whose image runs the command (clusterctl targets), e.g. cpu. "
                         "Job key: target.")] = None,
    contract: Annotated[str | None, typer.Option(
        "--contract", help="The launch variables the command reads: torchrun (default), "
                           "accl-bert, mpi, deepspeed. Job key: contract.")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", metavar="NAME=VALUE",
        help="A container environment variable, as the job's env (repeatable; may use "
             "{placeholders}). Job key: env.")] = None,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", min=1,
        help="Processes per node (default: the node's slots, else 1). Job key: nproc_per_node.")] = None,
    requirements: Annotated[Path | None, typer.Option(
        "--requirements", metavar="FILE",
        help="A pip requirements file: its packages become a cached image layer (default: "
             "requirements.txt in the workdir). Job key: requirements.")] = None,
    max_workdir_size: Annotated[str | None, typer.Option(
        "--max-workdir-size", metavar="SIZE",
        help="The most the shipped workdir may hold (default 100MiB), e.g. 500MiB. "
             "Job key: max_workdir_size.")] = None,
    max_restarts: Annotated[int | None, typer.Option(
        "--max-restarts", min=0, metavar="N",
        help="After a failure (a rank exits non-zero, a node is lost, a hang), stop every "
             "container, check the nodes again, replace failed ones by spares (spare: true) "
             "and start again, up to N times; exit 120 when they are used up. Job key: "
             "max_restarts.")] = None,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", metavar="DIR",
        help="A directory every node shares (a host path in the sandbox), mounted at the same "
             "path in every container as CLUSTERCTL_CHECKPOINT_DIR, to save to and resume "
             "from. Job key: checkpoint.")] = None,
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="RUN_ID",
        help="Take over a run whose launch or supervisor died (its containers keep running): "
             "follow its attempt again, then restart it as it would have (--detach: in a new "
             "supervisor).")] = None,
    rerun: Annotated[str | None, typer.Option(
        "--rerun", metavar="RUN_ID",
        help="Run a recorded run again: the same job and exactly the code it ran (from this "
             "machine's code store), on the same nodes (or --nodes).")] = None,
) -> None:
    """Run JOB on every node: one `docker run --net=host` container per node with its rank
    environment, all output merged and prefixed, fail-fast; exits with the job's outcome.

    Your own project, no job file: `clusterctl launch --target cpu --workdir . --nodes
    inv.yaml -- python train.py --lr 3e-4` (a command starting with python runs under
    torchrun on every node). With a job file, these flags win over its keys.

    Exit status: 0 all containers exited 0; else the exit code of the first failure (by
    time); 255 the first failure was a node that stopped answering; 130 Ctrl-C (143
    SIGTERM) after stopping every container; 2 bad input or failed preflight (nothing
    started); 1 push or start failed (nothing left running); 124 hung (--hang-timeout);
    125 every container exited 0 but the output shows a collective-library error;
    with --max-restarts: 120 restarts used up, 121 crash loop, 122 not enough nodes left."""
    hang = _duration("--hang-timeout", hang_timeout)
    command = ctx.meta.get(COMMAND_META)
    given = _job_flags(workdir=workdir, target=target, contract=contract, env=env or [],
                       nproc_per_node=nproc_per_node, requirements=requirements,
                       max_workdir_size=max_workdir_size, command=command)
    if max_restarts is not None:
        given["max_restarts"] = max_restarts
    if hang_start_timeout is not None:
        given["hang_start_timeout"] = hang_start_timeout
    if hang_start_line is not None:
        given["hang_start_line"] = hang_start_line
    if checkpoint is not None:
        given["checkpoint"] = checkpoint
    if job is None and image is not None and command is not None:
        given["image"] = image               # the job made of flags runs this image
    if resume is not None:
        if job is not None or given or rerun is not None:
            raise UserError(f"--resume {resume}: goes on with the recorded run as it was; give no "
                            "JOB, job flags, command or --rerun with it (--nodes, --set and "
                            "--detach are fine).")
        _resume(resume, nodes, set_ or [], json_=json_, detach=detach,
                accept_new_host_keys=accept_new_host_keys, hang=hang, fail_grace=fail_grace)
        return
    if rerun is not None:
        if job is not None or given:
            raise UserError(f"--rerun {rerun}: runs the recorded job as it ran; give no JOB, job "
                            "flags or command with it (--nodes, --set and --detach are fine).")
        _rerun(rerun, nodes, set_ or [], image=image, dry_run=dry_run, json_=json_, detach=detach,
               run_id=run_id, accept_new_host_keys=accept_new_host_keys, hang=hang,
               fail_grace=fail_grace)
        return
    if scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler {scheduler!r} is not a scheduler; valid: {one_of(SCHEDULERS)}.")
    if scheduler == "slurm":
        if dry_run and json_:
            raise UserError("--dry-run --json: with --scheduler slurm the plan is one sbatch script; "
                            "valid: --dry-run (prints it). Nothing was submitted.")
        if hang is not None:
            raise UserError("--hang-timeout: not available with --scheduler slurm yet; launch "
                            "follows the Slurm job to its end (Ctrl-C cancels it). Nothing was submitted.")
        _slurm_launch(_job(job, given), nodes, set_ or [], image=image, dry_run=dry_run, run_id=run_id,
                      partition=partition, nnodes=nnodes, time_=time_, container=container,
                      detach=detach, json_=json_)
        return
    slurm_only = [f for f, v in (("--partition", partition), ("--nnodes", nnodes), ("--time", time_),
                                 ("--container", None if container == "docker" else container)) if v is not None]
    if slurm_only:
        raise UserError(f"{', '.join(slurm_only)}: only with --scheduler slurm; an SSH launch runs on "
                        "every node of --nodes FILE.")
    if nodes is None and os.environ.get("SLURM_JOB_NODELIST"):
        nodes = Path(SLURM_WORD)   # inside a Slurm allocation: its nodes
    if nodes is None:
        raise UserError("--nodes FILE is required (or $CLUSTERCTL_NODES): the inventory to run on; "
                        "see inventories/example.yaml.")
    spec = _job(job, given)
    inventory = load_inventory(nodes)
    _run(spec, inventory, set_ or [], image=image, dry_run=dry_run, json_=json_, detach=detach,
         run_id=run_id, accept_new_host_keys=accept_new_host_keys, hang=hang, fail_grace=fail_grace,
         record_spec=_spec_of(job, given))


def _run(spec, inventory, sets, *, image, dry_run, json_, detach, run_id, accept_new_host_keys,
         hang, fail_grace, record_spec, workspace=None, resume=None) -> None:
    """An SSH launch of a loaded job: the dry run's plan, or the run and its outcome."""
    overrides = plan.parse_sets(sets)
    if run_id:
        records.check_run_id(run_id)
    if dry_run:
        plans = launching.dry_run(spec, inventory, run_id=run_id, image=image, overrides=overrides,
                                  hang_timeout=hang, on_code=None if json_ else _show_code)
        typer.echo(plan.render_dry_run(plans, json=json_), nl=False)
        return
    settings = supervise.Settings(fail_grace=fail_grace)
    if detach and (launching.hang_timeout_of(spec, hang) or spec.max_restarts or spec.retry_on_exit
                   or resume is not None):
        _supervised(spec, inventory, overrides, image=image, run_id=run_id, json_=json_,
                    accept_new_host_keys=accept_new_host_keys, hang=hang, settings=settings,
                    workspace=workspace, record_spec=record_spec, resume=resume)
        return
    result = _launch(spec, inventory, overrides, image=image, detach=detach, run_id=run_id,
                     accept_new_host_keys=accept_new_host_keys, json_=json_, hang_timeout=hang,
                     settings=settings, workspace=workspace, spec=record_spec, resume=resume)
    _report(result, detach=detach, json_=json_)
    raise typer.Exit(result.exit_code)


def _supervised(spec, inventory, overrides, *, image, run_id, json_, accept_new_host_keys, hang,
                settings, workspace, record_spec, resume=None) -> None:
    """``launch --detach`` of a run clusterctl must keep watching (restarts, a hang watchdog):
    a supervisor process of its own follows it (:mod:`clusterctl.run.detached`); this process
    shows its log until the containers run, then returns."""
    run_id = run_id or records.new_run_id(spec.name)
    if resume is None and records.run_path(run_id).exists():
        raise UserError(f"run id {run_id!r} is already recorded in {records.run_path(run_id)}; "
                        "choose another --run-id (or leave it out for a new one).")

    def follow() -> int:
        try:
            result = _launch(spec, inventory, overrides, image=image, detach=False, run_id=run_id,
                             accept_new_host_keys=accept_new_host_keys, json_=False,
                             hang_timeout=hang, settings=settings, workspace=workspace,
                             spec=record_spec, supervised=True, resume=resume)
        except ClusterctlError as e:
            err.print(f"error: {e}", markup=False)
            return e.exit_code
        _report(result, detach=False, json_=False)
        return result.exit_code

    started = detached.start(run_id, follow, show=lambda line: err.print(line, markup=False,
                                                                          highlight=False))
    if started.exit_code is not None:
        err.print(f"run {run_id}: the supervisor ended (exit {started.exit_code}) before the run "
                  f"ran; its log: {started.log}", markup=False)
        raise typer.Exit(started.exit_code)
    rec = started.record
    if json_:
        typer.echo(records.dump(rec))
        return
    out.print(f"run {run_id} is {rec.state} detached, supervised by pid {started.pid} (restarts "
              f"and checks go on with this terminal closed; its log: {started.log}); follow it with "
              f"`clusterctl attach {run_id}`, stop it with `clusterctl stop {run_id}`", markup=False)


def _show_code(snap) -> None:
    """What a dry run would ship, before the plan (a comment line, as the plan's own)."""
    typer.echo(f"# code: {snap.root} -> /workspace: {snap.file_count} files, {snap.total_bytes} "
               f"bytes, {snap.digest}")


def _job_flags(*, workdir, target, contract, env, nproc_per_node, requirements, max_workdir_size,
               command) -> dict:
    """The job keys given as flags (and the command after ``--``), as a job file would hold them."""
    given: dict = {}
    if workdir is not None:
        given["workdir"] = str(workdir)
    if target is not None:
        given["target"] = target
    if contract is not None:
        given["contract"] = contract
    if env:
        given["env"] = _env_flags(env)
    if nproc_per_node is not None:
        given["nproc_per_node"] = nproc_per_node
    if requirements is not None:
        given["requirements"] = str(requirements)
    if max_workdir_size is not None:
        given["max_workdir_size"] = max_workdir_size
    if command is not None:
        if not command:
            raise UserError("nothing after --: give the command to run, e.g. -- python train.py.")
        given["command"] = [escape_braces(word) for word in command]
    return given


def _env_flags(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` items; a malformed one names itself (its value is never shown)."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"--env: expected NAME=VALUE (e.g. --env OMP_NUM_THREADS=4), got an item "
                            f"of {len(item)} characters (not shown: it may be a secret).")
        found[name] = value
    return found


def _job(job: str | None, given: dict):
    """The job to run: a job file with the flags over it, or the flags alone."""
    if job is not None:
        return load_job(job, given)
    if "command" not in given:
        raise UserError("give a JOB (a shipped job or a job YAML file), or your own command after "
                        "--, e.g. clusterctl launch --target cpu --workdir . --nodes inv.yaml -- "
                        "python train.py")
    return inline_job(given)


def _spec_of(job: str | None, given: dict) -> dict:
    """What run.json keeps to run the job again (``launch --rerun``): the job file and the
    flags; an ``--env`` value whose name makes it secret is left out, only its name kept."""
    env = given.get("env") or {}
    hidden = sorted(k for k in env if is_secret_name(k))
    flags = {**given, "env": {k: v for k, v in env.items() if k not in hidden}} if env else given
    return {"job": str(job_path(job).absolute()) if job is not None else None, "flags": flags,
            "secret_env": hidden, "cwd": str(Path.cwd())}


def _secret_env_again(run_id_of: str, names: list[str], sets: list[str]) -> dict[str, str]:
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


def _resume(run_id_of: str, nodes, sets, *, json_, detach, accept_new_host_keys, hang,
            fail_grace) -> None:
    """``launch --resume RUN_ID``: follow a run whose follower died, and go on with it."""
    record = records.load(run_id_of)
    if record.state not in ("starting", "running", "restarting", "unknown"):
        raise UserError(f"run {run_id_of} has ended ({run_outcome(record)}): nothing to resume; "
                        f"`clusterctl launch --rerun {run_id_of}` runs it again.")
    if records.launcher_gone(record.launcher) is False:
        raise UserError(f"run {run_id_of} is followed by pid {record.launcher.pid} on this machine: "
                        f"`clusterctl attach {run_id_of}` follows it too.")
    if record.detached and not record.attempts:
        raise UserError(f"run {run_id_of} was started with --detach and nothing follows it by design; "
                        f"`clusterctl logs {run_id_of} --follow` follows it.")
    sets = _recorded_sets(record, sets)
    spec, inventory, ws = _recorded_job(record, nodes, sets, what="resumed")
    if record.state == "unknown":        # `runs` marked it when it found its launch gone
        record.state = "running"
    _run(spec, inventory, sets, image=record.image, dry_run=False, json_=json_, detach=detach,
         run_id=record.run_id, accept_new_host_keys=accept_new_host_keys, hang=hang,
         fail_grace=fail_grace, record_spec=record.spec, workspace=ws, resume=record)


def _recorded_sets(record: records.RunRecord, sets: list[str]) -> list[str]:
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


def _recorded_job(record: records.RunRecord, nodes, sets, *, what: str):
    """The job, inventory and code a recorded run ran (``--rerun``, ``--resume``)."""
    run_id_of = record.run_id
    if record.spec is None or record.scheduler != "ssh":
        raise UserError(f"run {run_id_of} cannot be {what}: it was made by an older clusterctl or "
                        "through Slurm (its record keeps no job spec); launch the job again instead.")
    flags = dict(record.spec.get("flags") or {})
    secret_env = _secret_env_again(run_id_of, list(record.spec.get("secret_env") or []), sets)
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
    inventory = load_inventory(nodes or record.inventory)
    ws = workspaces.rerun(record.code) if record.code is not None else None
    return spec, inventory, ws


def _rerun(run_id_of: str, nodes, sets, *, image, dry_run, json_, detach, run_id,
           accept_new_host_keys, hang, fail_grace) -> None:
    """``launch --rerun RUN_ID``: the recorded job and exactly its code, on its nodes."""
    record = records.load(run_id_of)
    spec, inventory, ws = _recorded_job(record, nodes, sets, what="run again")
    if ws is not None:
        _note(f"rerun of {run_id_of}: code {record.code.digest} from this machine's store"
              + (f" (git {ws.git.commit[:7]})" if ws.git.commit else ""))
    if ws is not None and not dry_run and ws.image and image is None:
        image = ws.image
    _run(spec, inventory, sets, image=image, dry_run=dry_run, json_=json_, detach=detach,
         run_id=run_id, accept_new_host_keys=accept_new_host_keys, hang=hang, fail_grace=fail_grace,
         record_spec=record.spec, workspace=ws)


def _slurm_launch(spec, nodes, sets, *, image, dry_run, run_id, partition, nnodes, time_,
                  container, detach=False, json_=False) -> None:
    """``launch --scheduler slurm``: check everything, then print (``--dry-run``) or submit."""
    inventory = load_inventory(nodes) if nodes is not None else None
    options = slurm_options.check_options(nnodes=nnodes, partition=partition, time=time_,
                                          container=container,
                                          nodelist=inventory.names if inventory else ())
    overrides = plan.parse_sets(sets)
    run_id = records.check_run_id(run_id) if run_id else records.new_run_id(spec.name)
    base = plan.image_of(spec, image)
    if spec.workdir is not None and base is not None:
        # Slurm's nodes start containers of an image: the code goes in as a thin layer
        if dry_run:     # the image it would build, by name (the tag is the tree's digest)
            snap = code_snapshot.take(spec.workdir, limit_bytes=spec.max_workdir_size
                                      or code_snapshot.DEFAULT_LIMIT_BYTES)
            if spec.requirements is not None:
                base = _requirements_tag(base, spec.requirements)
            image = code_tag(base, snap.digest)
            _show_code(snap)
        else:
            ws = workspaces.prepare(spec, base, log=_note)
            image = workspaces.code_image(ws, base, log=_note)
            _note(f"code: {workspaces.describe(ws)}, in image {image}")
    if dry_run:
        script = slurm_submit.render(spec, options, run_id=run_id, inventory=inventory,
                                     image=image, overrides=overrides)
        typer.echo(script.text, nl=False)
        return
    env = slurm_conf.slurm_env(inventory.path if inventory else None, note=_note)
    require_binaries("sbatch", "squeue", "scontrol", "scancel", packages="slurm-client")

    def submitted(record: records.RunRecord) -> None:
        err.print(f"run {record.run_id}: Slurm job {record.slurm_job} submitted "
                  f"(logs in {record.dir})", markup=False)

    try:
        result = slurm_submit.submit(
            spec, options, inventory=inventory, image=image, overrides=overrides, run_id=run_id,
            detach=detach, handle_signals=True, stream=sys.stderr if json_ else sys.stdout,
            progress=PlainProgress(err),
            argv=["clusterctl", *sys.argv[1:]], on_submitted=submitted, env=env,
            on_note=lambda msg: err.print(f"note: {msg}", markup=False))
    except KeyboardInterrupt:  # before the job was submitted (the push)
        err.print("interrupted before anything was submitted", markup=False)
        raise typer.Exit(supervise.INTERRUPTED_EXIT) from None
    if detach and not json_:
        rec = result.record
        out.print(f"run {rec.run_id} submitted detached as Slurm job {rec.slurm_job}; follow it with "
                  f"`clusterctl logs {rec.run_id} --follow`, stop it with `clusterctl stop {rec.run_id}`",
                  markup=False)
        return
    _report(result, detach=False, json_=json_)
    raise typer.Exit(result.exit_code)


def _requirements_tag(base: str, requirements: Path) -> str:
    """The tag of the requirements layer a launch would build over ``base`` (its lines are
    checked; the engine is asked for the base's ID only, nothing is built)."""
    from clusterctl.image import deps
    reqs = deps.read_requirements(requirements)
    try:
        base_id = launching.local_image_id(base)
    except (UserError, OSError, ClusterctlError) as e:    # no engine, or it lacks the image
        typer.echo(f"# (the requirements layer over {base} is named once {base} is in this "
                   f"machine's Docker engine: {str(e).splitlines()[0]})")
        return base
    return deps.deps_tag(base, base_id, deps.normalised(reqs))


def _note(line: str) -> None:
    err.print(line, markup=False, highlight=False)


def _slurm_env(record: records.RunRecord, *, note: bool = True) -> dict[str, str]:
    """The Slurm clients' environment for a recorded Slurm run: SLURM_CONF, else the Slurm
    of the sandbox whose inventory the run used (exit 2 for a SLURM_CONF naming no file)."""
    return slurm_conf.slurm_env(record.inventory or None, note=_note if note else None)


def _duration(option: str, text: str | None) -> float | None:
    """Seconds of a duration option, or UserError naming the option and a valid example."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as e:
        raise UserError(f"{option} {e}; valid: {DURATION_HELP}.") from None


def _launch(job, inventory, overrides, *, image, detach, run_id, accept_new_host_keys, json_,
            hang_timeout=None, settings=None, workspace=None, spec=None, supervised=False,
            resume=None):
    def started(record: records.RunRecord) -> None:
        err.print(f"run {record.run_id}: {len(record.nodes)} containers running "
                  f"(logs in {record.dir})", markup=False)

    try:
        return launching.launch(
            job, inventory, image=image, overrides=overrides, run_id=run_id, detach=detach,
            accept_new_host_keys=accept_new_host_keys or None, handle_signals=True,
            stream=sys.stderr if json_ else sys.stdout, progress=PlainProgress(err),
            argv=["clusterctl", *sys.argv[1:]], on_started=started, hang_timeout=hang_timeout,
            settings=settings, workspace=workspace, spec=spec, supervised=supervised, resume=resume,
            recheck=_recheck(job, image, accept_new_host_keys),
            on_note=_note,
            on_warning=lambda node, text: err.print(f"{node}: warning: {text}", markup=False))
    except launching.PreflightFailed as e:
        print_table("preflight", preflight.COLUMNS,
                    [[escape(c) for c in row] for row in preflight.table_rows(e.checks)], console=err)
        raise
    except KeyboardInterrupt:  # before any container existed (preflight, push)
        err.print("interrupted before anything was started", markup=False)
        raise typer.Exit(supervise.INTERRUPTED_EXIT) from None


def _recheck(job, image, accept_new_host_keys):
    """A job with ``collective_check``: the bounded collective check before each restart."""
    if not job.collective_check:
        return None
    from clusterctl.run.collective import check as collective

    def run(inventory) -> dict[str, str]:
        return collective.recheck(inventory, job=job, image=image,
                                  accept_new_host_keys=accept_new_host_keys or None, note=_note)
    return run


def _report(result: launching.RunResult, *, detach: bool, json_: bool) -> None:
    rec = result.record
    if json_:
        typer.echo(records.dump(rec))
        return
    if detach:
        out.print(f"run {rec.run_id} started detached on {len(rec.nodes)} nodes; follow it with "
                  f"`clusterctl logs {rec.run_id} --follow`, stop it with `clusterctl stop {rec.run_id}`",
                  markup=False)
        return
    for line in result.summary:
        err.print(line, markup=False, highlight=False)
    for node, kept in sorted(rec.flight.items()):
        what = (f"{len(kept)} file(s) in {rec.dir / 'flight' / node}" if isinstance(kept, list) and kept
                else "no dump" if isinstance(kept, list) else kept)
        err.print(f"flight recorder, {node}: {what}", markup=False, highlight=False)
    verdict = {"succeeded": "succeeded", "interrupted": "interrupted", "hung": "HUNG",
               "suspicious": "SUSPICIOUS", "stopped": f"stopped by {rec.stopped_by}"}.get(rec.state, "FAILED")
    err.print(f"run {rec.run_id} {verdict} (exit {result.exit_code}); record: {rec.dir}",
              markup=False)


# --------------------------------------------------------------------------- logs

def logs(
    run: RunArg = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node's output.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the containers end.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N lines of each node.")] = None,
    nodes: RunNodesOption = None,
    attempt: Annotated[int | None, typer.Option(
        "--attempt", min=0, metavar="K",
        help="A run that restarted: attempt K's output (0 the first; default the latest).")] = None,
) -> None:
    """Show a run's merged, prefixed output: from the nodes while its containers exist,
    from runs/<run-id>/ after. Without RUN: your newest run; another user's run, named,
    is shown with its owner named first (on stderr)."""
    record = records.resolve(run)
    _name_owner(record)
    if attempt is not None:
        record = record.at_attempt(attempt)
    if node is not None:
        record.node(node)  # UserError naming the run's nodes
    if record.scheduler == "slurm":
        _slurm_logs(record, node=node, follow=follow, tail=tail)
        return
    sink = logs_mod.LogSink({n.node: n.rank for n in record.nodes}, stream=sys.stdout)
    sources, unreachable = [], {}
    if records.may_have_containers(record):
        with _cluster(nodes, record) as cluster:
            sources, unreachable = logs_mod.live_containers(cluster, record, node=node)
            if sources:
                for n, why in unreachable.items():
                    err.print(f"{n}: not answering ({why}); its recorded log: {record.log_path(n)}",
                              markup=False)
                try:
                    if follow:
                        logs_mod.follow_from_nodes(cluster, sources, sink, tail=tail)
                    else:
                        logs_mod.show_from_nodes(cluster, sources, sink, tail=tail)
                except KeyboardInterrupt:
                    raise typer.Exit(supervise.INTERRUPTED_EXIT) from None
                return
    if not logs_mod.show_from_files(record, sink, node=node, tail=tail):
        err.print(f"no output recorded for run {record.run_id} in {record.dir}", markup=False)


def _slurm_logs(record: records.RunRecord, *, node: str | None, follow: bool, tail: int | None) -> None:
    """A Slurm run's output: runs/<id>/merged.log once launch wrote it, else the job's own
    output file; ``--follow`` streams it while the job runs, then prints the run's outcome
    and exits with the run's exit status."""
    going = record.state in ("starting", "running", "unknown")
    env: dict[str, str] = dict(os.environ)
    if going:
        env = _slurm_env(record)
        require_binaries("squeue", "scontrol", packages="slurm-client")
        slurm_track.settle(record, env, grace=0)   # fits task order, or it ended
        going = record.state in ("starting", "running", "unknown")
    sink = logs_mod.LogSink({n.node: n.rank for n in record.nodes}, stream=sys.stdout)
    if follow and going:
        stop = threading.Event()
        try:
            outcome, _info = slurm_track.follow(record, env, sink, stop_event=stop, node=node)
        except KeyboardInterrupt:     # leave the job running: this only followed it
            raise typer.Exit(supervise.INTERRUPTED_EXIT) from None
        finally:
            sink.close()
        record = records.load(record.run_id)
        for line in supervise.summary_lines(outcome) if outcome and record.state == "failed" else []:
            err.print(line, markup=False, highlight=False)
        err.print(f"run {record.run_id}: {run_outcome(record)}", markup=False)
        raise typer.Exit(record.exit_code or 0)
    shown = 0 if going else logs_mod.show_from_files(record, sink, node=node, tail=tail)
    if not shown:        # running, or detached: the job's own output file is the log
        for n, text in logs_mod.tail_per_node(lambda: slurm_track.output_lines(record, node=node), tail):
            sink.write(n, text)
            shown += 1
        sink.flush()
    if not shown:
        err.print(f"no output recorded for run {record.run_id} in {record.dir} yet", markup=False)
    if follow:     # it had ended already: its outcome and exit status, as after following it
        err.print(f"run {record.run_id}: {run_outcome(record)}", markup=False)
        raise typer.Exit(record.exit_code or 0)


# --------------------------------------------------------------------------- attach

def attach(run: RunArg = None) -> None:
    """Follow a run again: its merged output, attempt after attempt, to its end; exits with
    the run's exit status (Ctrl-C stops following only, the run goes on)."""
    record = records.resolve(run)
    if record.scheduler == "slurm":
        raise UserError(f"run {record.run_id} went through Slurm: follow it with "
                        f"`clusterctl logs {record.run_id} --follow`.")
    try:
        final = detached.attach(record.run_id, sys.stdout,
                                note=lambda text: err.print(text, markup=False, highlight=False))
    except KeyboardInterrupt:
        err.print(f"stopped following; run {record.run_id} goes on (`clusterctl attach "
                  f"{record.run_id}` again)", markup=False)
        raise typer.Exit(supervise.INTERRUPTED_EXIT) from None
    for line in records.attempt_lines(final):
        err.print(line, markup=False, highlight=False)
    err.print(f"run {final.run_id}: {run_outcome(final)}", markup=False)
    raise typer.Exit(final.exit_code or 0)


# --------------------------------------------------------------------------- status

def status(run: RunArg = None, nodes: RunNodesOption = None,
           json_: Annotated[bool, typer.Option("--json", help="One JSON object per node.")] = False) -> None:
    """Each node's container of a run: state, exit code, start and end (from the nodes,
    else from the run record). Without RUN: your newest run; another user's run, named,
    says whose it is in its heading."""
    record = records.resolve(run)
    owner = records.others_run(record)
    slurm_note = ""
    if record.scheduler == "slurm":
        rows, slurm_note = _slurm_status_rows(record)
    else:
        orphaned = records.launcher_died(record)
        with _cluster(nodes, record) as cluster:
            rows = records.run_status(record, cluster)
        # what the nodes say now becomes the record: ended containers give the outcome;
        # a run whose launch died without one is "unknown" until they have ended
        if not records.record_ended(record, rows) and orphaned:
            records.mark_unknown_if_orphaned(record)
    if json_:
        typer.echo(json.dumps({"run_id": record.run_id, "user": record.user or None,
                               "state": record.state, "exit_code": record.exit_code,
                               "stopped_by": record.stopped_by, "note": record.note or None,
                               "attempt": record.attempt, "excluded": record.excluded,
                               **({"slurm": slurm_note} if slurm_note else {}),
                               "nodes": [json.loads(r.model_dump_json()) for r in rows]}, indent=2))
        return
    print_table(f"run {escape(record.run_id)} ({escape(record.job)}; {escape(run_outcome(record))})"
                + (f", user {escape(owner)}'s run" if owner else ""),
                ["node", "rank", "container state", "exit code", "started (UTC)", "finished (UTC)", "source"],
                [[escape(c) for c in row] for row in records.status_rows(rows)])
    if slurm_note:
        out.print(slurm_note, markup=False)
    for line in records.attempt_lines(record):
        out.print(line, markup=False, highlight=False)
    if record.note:
        out.print(record.note, markup=False)
    if record.state not in ("starting", "running", "unknown") and any(
            r.source == "node" for r in rows) and record.scheduler != "slurm":
        out.print(f"its containers are still on the nodes; `clusterctl stop {record.run_id}` removes "
                  "them (their output is kept in runs/)", markup=False)
    if record.first_failure:
        f = record.first_failure
        out.print(f"first failure: {f.node}[{f.rank}] "
                  + ("stopped answering" if f.kind == "lost" else records.describe_exit(f.exit_code).replace(
                      "exit", "exited", 1)), markup=False)


def run_outcome(record: records.RunRecord) -> str:
    """``failed, exit 7`` / ``stopped by clusterctl stop (root@head), exit 143``: the heading."""
    words = record.state
    if record.stopped_by:
        words += f" by {record.stopped_by}"
    return words + ("" if record.exit_code is None else f", exit {record.exit_code}")


def _slurm_status_rows(record: records.RunRecord) -> tuple[list[records.NodeStatus], str]:
    """A Slurm run's nodes: the job as sacct (accounting) or scontrol tells it, each node's
    own exit code from its task's record; settled into the record once the job has ended."""
    env = _slurm_env(record)
    require_binaries("squeue", "scontrol", packages="slurm-client")
    info = slurm_track.job_info(record.slurm_job, env) if record.slurm_job else None
    if info is not None:
        slurm_track.settle(record, env, info=info)
    note = f"Slurm job {record.slurm_job}: {info.words() if info else 'never submitted'}"
    tasks = slurm_tasks.read_task_records(record.dir / slurm_script.RECORDS_DIR)
    rows = []
    for n in record.nodes:
        t = tasks.get(n.node)
        state, code, fin = n.state, n.exit_code, n.finished
        if t is not None and n.state in ("running", "created"):
            state, code, fin = "stopped" if t.stopped else "exited", t.exit_code, t.finished
        rows.append(records.NodeStatus(node=n.node, rank=n.rank, container=n.container, state=state,
                                       exit_code=code, started=n.started, finished=fin,
                                       source="task record" if t is not None else "record",
                                       stopped_by=n.stopped_by))
    return rows, note


# --------------------------------------------------------------------------- stop

def stop(run: RunArg = None, nodes: RunNodesOption = None,
         grace: Annotated[int, typer.Option("--grace", min=0,
                                            help="Seconds between SIGTERM and SIGKILL.")] = 3,
         any_user: Annotated[bool, typer.Option(
             "--any-user", help="Stop RUN even when another user launched it (without it, "
                                "another user's run is refused, exit 2).")] = False) -> None:
    """Stop and remove a run's containers on every node (idempotent); their output is kept
    in runs/<run-id>/. Without RUN: your newest run. Another user's run only with
    --any-user. Exit 1 when a node could not be reached."""
    record = records.resolve(run)
    owner = records.others_run(record)
    if owner and not any_user:
        raise UserError(f"run {record.run_id} is user {owner}'s run, not yours "
                        f"({records.current_user()}); nothing was stopped. To stop it anyway: "
                        f"`clusterctl stop {record.run_id} --any-user`.")
    if owner:
        err.print(f"run {record.run_id} is user {owner}'s run; stopping it (--any-user)", markup=False)
    if record.scheduler == "slurm":
        env = _slurm_env(record)
        require_binaries("squeue", "scancel", "scontrol", packages="slurm-client")
        what = slurm_submit.cancel(record, env=env, by=f"clusterctl stop ({records.who()})")
        out.print(f"stop {record.run_id}: {what}", markup=False)
        out.print(f"run {record.run_id}: {run_outcome(records.load(record.run_id))}", markup=False)
        return
    by = f"clusterctl stop ({records.who()})"
    if (record.supervised or record.attempts) and detached.ask_to_stop(record, timeout=grace + 60.0):
        out.print(f"run {record.run_id}: its supervisor (pid {record.launcher.pid}) stopped it",
                  markup=False)     # no restart follows; what is left is cleaned up below
        record = records.load(record.run_id)
    with _cluster(nodes, record) as cluster:
        results = supervise.stop_run(cluster, record, grace=grace, by=by)
    rows, failed = [], []
    for n in record.nodes:
        r = results[n.node]
        if r.error:
            failed.append(n.node)
            what = f"NOT STOPPED: {r.error}"
        elif not r.containers:
            what = "no container (already removed)"
        else:
            what = "; ".join(_stopped_words(c, c.name in r.was_running, grace) for c in r.containers)
        rows.append([n.node, str(n.rank), n.container, what])
    print_table(f"stop {escape(record.run_id)}", ["node", "rank", "container", "result"],
                [[escape(c) for c in row] for row in rows])
    out.print(f"run {record.run_id}: {run_outcome(record)}", markup=False)
    if failed:
        err.print(f"could not stop the run on {', '.join(failed)}; run `clusterctl stop "
                  f"{record.run_id}` again when the node answers", markup=False)
        raise typer.Exit(1)


def _name_owner(record: records.RunRecord) -> None:
    """Another user's run: a line on stderr naming whose it is (stdout stays its output)."""
    owner = records.others_run(record)
    if owner:
        err.print(f"run {record.run_id} is user {owner}'s run", markup=False)


def _stopped_words(c, was_running: bool, grace: int) -> str:
    """One container's end in words: who ended it, with its real exit code or signal."""
    code = records.describe_exit(c.exit_code) or "exit code unknown"
    if not was_running:
        return f"removed (had exited by itself), {code}"
    how = ("SIGTERM, then SIGKILL after the " f"{grace}s grace" if c.exit_code == 137
           else "SIGTERM")
    return f"stopped and removed ({how}), {code}"


# --------------------------------------------------------------------------- runs

def runs(json_: Annotated[bool, typer.Option("--json", help="The run records as JSON.")] = False,
         mine: Annotated[bool, typer.Option(
             "--mine", help="Only your own runs (default: every user's, with a user column).")] = False
         ) -> None:
    """List recorded runs, newest first: every user's (who launched each is in the user
    column), or only yours with --mine."""
    found = records.list_runs()
    if mine:
        me = records.current_user()
        found = [r for r in found if records.owned_by(r, me)]
    slurm_ok = shutil.which("squeue") is not None and shutil.which("scontrol") is not None
    for rec in found:        # what is true now, not what was last written
        if rec.scheduler == "slurm" and slurm_ok:
            if rec.state in ("starting", "running", "unknown"):   # ended jobs get their outcome
                slurm_track.settle(rec, _slurm_env(rec, note=False), grace=0)
        elif rec.scheduler != "slurm":
            records.mark_unknown_if_orphaned(rec)            # a followed run whose launch died
    if json_:
        typer.echo(json.dumps([json.loads(r.model_dump_json()) for r in found], indent=2))
        return
    if not found:
        out.print(f"no runs {f'of user {records.current_user()} ' if mine else ''}recorded in "
                  f"{records.runs_dir().resolve()}", markup=False)
        return
    print_table("runs (newest first)", ["run", "user", "job", "code", "nodes", "state", "exit", "started (UTC)",
                                        "finished (UTC)", "first failure / stopped by"],
                [[escape(c) for c in row] for row in records.summary_rows(found)])


def register(app: typer.Typer) -> None:
    app.command("launch", cls=CommandAfterDashes)(launch)
    app.command("logs")(logs)
    app.command("attach")(attach)
    app.command("status")(status)
    app.command("stop")(stop)
    app.command("runs")(runs)
