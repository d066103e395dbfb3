"""`clusterctl launch | logs | status | stop | runs`: run a job on the nodes and look after it.

Parsing and printing only: the command picks a run backend once (:mod:`clusterctl.run.backends`:
``--scheduler`` for a new run, the record for an existing one) and prints what it reports;
the backends and clusterctl.run.records decide everything (what a run's state implies, when
to ask the nodes).  RUN defaults to
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

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cli.afterdashes import COMMAND_META, CommandAfterDashes
from clusterctl.cli.nodes import NODES_HELP, nodes_option
from clusterctl.cli.push import PlainProgress
from clusterctl.core.console import err, out, print_table
from clusterctl.core.errors import UserError
from clusterctl.run import backends, jobs, records, request, supervise
from clusterctl.run.request import run_outcome


class _Ui:
    """The backends' :class:`~clusterctl.run.backends.Ui` on this terminal."""

    progress = PlainProgress(err)

    @property
    def stdout(self):
        return sys.stdout

    @property
    def stderr(self):
        return sys.stderr

    def note(self, line: str) -> None:
        err.print(line, markup=False, highlight=False)

    def say(self, line: str) -> None:
        out.print(line, markup=False, highlight=False)

    def echo(self, text: str) -> None:
        typer.echo(text, nl=False)

    def table(self, title, columns, rows, *, stderr: bool = False) -> None:
        print_table(escape(title), columns, [[escape(str(c)) for c in row] for row in rows],
                    console=err if stderr else out)


UI = _Ui()

RunArg = Annotated[str | None, typer.Argument(
    help="Run id (default: the newest run; `clusterctl runs` lists them).", show_default=False)]
RunNodesOption = Annotated[Path | None, nodes_option(
    "The inventory (default: the one recorded with the run).")]


# --------------------------------------------------------------------------- launch


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
    hang_timeout: Annotated[str | None, typer.Option(
        "--hang-timeout", metavar="DURATION",
        help="When no rank has written output for this long (e.g. 10m, 90s): dump every rank's "
             "Python stacks (py-spy) into runs/<id>/stacks/, name the odd ranks, stop the run, "
             "exit 124. Default: the job's hang_timeout, else none.")] = None,
    fail_grace: Annotated[int, typer.Option(
        "--fail-grace", min=0, max=3600, metavar="SECONDS",
        help="After a rank fails, the other containers get SIGTERM and this many seconds "
             "before SIGKILL (the run is doomed already; Ctrl-C gives 3).")] = supervise.Settings.fail_grace,
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="RUN_ID",
        help="Take over a run whose launch or supervisor died (its containers keep running): "
             "follow its attempt again, then restart it as it would have (--detach: in a new "
             "supervisor).")] = None,
    rerun: Annotated[str | None, typer.Option(
        "--rerun", metavar="RUN_ID",
        help="Run a recorded run again: the same job and exactly the code it ran (from this "
             "machine's code store), on the same nodes (or --nodes).")] = None,
    any_user: Annotated[bool, typer.Option(
        "--any-user", help="--rerun/--resume a run another user launched (without it, another "
                           "user's run is refused, exit 2).")] = False,
    **derived,  # the job keys that are flags (jobs.KEY_FLAGS: --workdir, --target, ...) and
                # the backends' own options (backends.launch_options(): --partition, ...)
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
    hang = request.duration("--hang-timeout", hang_timeout)
    command = request.command_key(ctx.meta.get(COMMAND_META))
    own = {name: derived.pop(name) for name in backends.launch_options()}
    given = jobs.flag_values(derived, os.environ) | ({"command": command} if command is not None else {})
    if job is None and image is not None and command is not None:
        given["image"] = image               # the job made of flags runs this image
    req = request.LaunchRequest(
        job=job, nodes=nodes, sets=set_ or [], given=given, image=image, dry_run=dry_run,
        json=json_, detach=detach, run_id=run_id, accept_new_host_keys=accept_new_host_keys,
        scheduler=scheduler, hang_timeout=hang, fail_grace=fail_grace, resume=resume,
        rerun=rerun, argv=["clusterctl", *sys.argv[1:]], scheduler_options=own, any_user=any_user)
    request.check(req)
    backend = backends.for_request(req)
    backend.check(req, backends.launchers())
    raise typer.Exit(backend.launch(req, UI))


def _with_derived_options(command):
    """``command``'s signature with a keyword option for every backend's own option (after
    ``--scheduler``: :func:`clusterctl.run.backends.launch_options`) and for every job key
    that is a flag (after ``--fail-grace``: :data:`clusterctl.run.jobs.KEY_FLAGS`): typer
    reads it, so neither is declared here."""
    kinds = {"str": str, "int": int, "path": Path, "list": list[str], "bool": bool}
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [p.replace(kind=kw) for p in inspect.signature(command, eval_str=True).parameters.values()
              if p.kind is not inspect.Parameter.VAR_KEYWORD]
    own = [inspect.Parameter(name, kw, default=o.default, annotation=Annotated[
        kinds[o.kind] if o.default is not None else kinds[o.kind] | None,
        typer.Option(o.flag, help=o.help)]) for name, o in backends.launch_options().items()]
    keys = [inspect.Parameter(name, kw, default=None, annotation=Annotated[
        kinds[f.kind] | None, typer.Option(f.flag, metavar=f.metavar, min=f.min,
                                           help=jobs.key_flag_help(name))])
        for name, f in jobs.KEY_FLAGS.items()]
    names = [p.name for p in params]
    after_scheduler, after_grace = names.index("scheduler") + 1, names.index("fail_grace") + 1
    command.__signature__ = inspect.Signature([
        *params[:after_scheduler], *own, *params[after_scheduler:after_grace], *keys,
        *params[after_grace:]])
    command.__annotations__ = {**{p.name: p.annotation
                                  for p in command.__signature__.parameters.values()},
                               "return": None}
    return command


_with_derived_options(launch)


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
    raise typer.Exit(backends.for_record(record).logs(record, UI, node=node, follow=follow,
                                                      tail=tail, nodes=nodes))


# --------------------------------------------------------------------------- attach

def attach(run: RunArg = None) -> None:
    """Follow a run again: its merged output, attempt after attempt, to its end; exits with
    the run's exit status (Ctrl-C stops following only, the run goes on)."""
    record = records.resolve(run)
    raise typer.Exit(backends.for_record(record).attach(record, UI))


# --------------------------------------------------------------------------- status

def status(run: RunArg = None, nodes: RunNodesOption = None,
           json_: Annotated[bool, typer.Option("--json", help="One JSON object per node.")] = False) -> None:
    """Each node's container of a run: state, exit code, start and end (from the nodes,
    else from the run record). Without RUN: your newest run; another user's run, named,
    says whose it is in its heading."""
    record = records.resolve(run)
    owner = records.others_run(record)
    backend = backends.for_record(record)
    found = backend.status(record, UI, nodes=nodes)
    rows = found.rows
    if json_:
        typer.echo(json.dumps({"run_id": record.run_id, "user": record.user or None,
                               "state": record.state, "exit_code": record.exit_code,
                               "stopped_by": record.stopped_by, "note": record.note or None,
                               "attempt": record.attempt, "excluded": record.excluded,
                               **found.extra,
                               "nodes": [json.loads(r.model_dump_json()) for r in rows]}, indent=2))
        return
    print_table(f"run {escape(record.run_id)} ({escape(record.job)}; {escape(run_outcome(record))})"
                + (f", user {escape(owner)}'s run" if owner else ""),
                ["node", "rank", "container state", "exit code", "started (UTC)", "finished (UTC)", "source"],
                [[escape(c) for c in row] for row in records.status_rows(rows)])
    if found.note:
        out.print(found.note, markup=False)
    for line in records.attempt_lines(record):
        out.print(line, markup=False, highlight=False)
    if record.note:
        out.print(record.note, markup=False)
    if record.state not in ("starting", "running", "unknown") and any(
            r.source == "node" for r in rows) and backend.leaves_containers:
        out.print(f"its containers are still on the nodes; `clusterctl stop {record.run_id}` removes "
                  "them (their output is kept in runs/)", markup=False)
    if record.first_failure:
        f = record.first_failure
        out.print(f"first failure: {f.node}[{f.rank}] "
                  + ("stopped answering" if f.kind == "lost" else records.describe_exit(f.exit_code).replace(
                      "exit", "exited", 1)), markup=False)


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
    raise typer.Exit(backends.for_record(record).stop(record, UI, nodes=nodes, grace=grace))


def _name_owner(record: records.RunRecord) -> None:
    """Another user's run: a line on stderr naming whose it is (stdout stays its output)."""
    owner = records.others_run(record)
    if owner:
        err.print(f"run {record.run_id} is user {owner}'s run", markup=False)


# --------------------------------------------------------------------------- runs

def runs(json_: Annotated[bool, typer.Option("--json", help="The run records as JSON.")] = False,
         mine: Annotated[bool, typer.Option(
             "--mine", help="Only your own runs (default: every user's, with a user column).")] = False,
         share: Annotated[str | None, typer.Option(
             "--share", metavar="GROUP",
             help="Make the runs directory one the members of GROUP share (group GROUP, mode "
                  "3775: sticky and setgid), then list.")] = None,
         ) -> None:
    """List recorded runs, newest first: every user's (who launched each is in the user
    column), or only yours with --mine. A record that cannot be read or trusted is named
    on stderr."""
    if share is not None:
        shared = records.share_runs_dir(share)
        err.print(f"runs directory {shared.resolve()} is shared with group {share} (mode 3775: "
                  "members add runs, nobody renames or removes another's)", markup=False)
    skipped: list[str] = []
    found = records.list_runs(skipped)
    for line in skipped:
        err.print(f"skipped {line}", markup=False)
    if mine:
        found = [r for r in found if records.owned_by(r)]
    for rec in found:        # what is true now, not what was last written
        backends.for_record(rec).refresh(rec)
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
