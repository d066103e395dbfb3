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
container could not be started (nothing left running).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clusterctl.cli.nodes import NODES_HELP, nodes_option
from clusterctl.cli.push import PlainProgress
from clusterctl.cluster import preflight
from clusterctl.cluster.inventory import SLURM_WORD, load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core.console import err, out, print_table
from clusterctl.core.errors import UserError, one_of
from clusterctl.core.tools import require_binaries
from clusterctl.run import launch as launching
from clusterctl.run import logs as logs_mod
from clusterctl.run import plan, records, supervise
from clusterctl.run.jobs import load_job
from clusterctl.run.slurm import options as slurm_options
from clusterctl.run.slurm import submit as slurm_submit

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

def launch(
    job: Annotated[str, typer.Argument(help="A shipped job (ddp-smoke, bert) or a job YAML file.",
                                       show_default=False)],
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
) -> None:
    """Run JOB on every node: one `docker run --net=host` container per node with its rank
    environment, all output merged and prefixed, fail-fast; exits with the job's outcome.

    Exit status: 0 all containers exited 0; else the exit code of the first failure (by
    time); 255 the first failure was a node that stopped answering; 130 Ctrl-C (143
    SIGTERM) after stopping every container; 2 bad input or failed preflight (nothing
    started); 1 push or start failed (nothing left running)."""
    if scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler {scheduler!r} is not a scheduler; valid: {one_of(SCHEDULERS)}.")
    if scheduler == "slurm":
        not_wired = [f for f, v in (("--detach", detach), ("--json", json_ and not dry_run)) if v]
        if not_wired:
            raise UserError(f"{', '.join(not_wired)}: not available with --scheduler slurm yet; "
                            "launch follows the Slurm job to its end (Ctrl-C cancels it). "
                            "Nothing was submitted.")
        _slurm_launch(job, nodes, set_ or [], image=image, dry_run=dry_run, run_id=run_id,
                      partition=partition, nnodes=nnodes, time_=time_, container=container)
        return
    given = [f for f, v in (("--partition", partition), ("--nnodes", nnodes), ("--time", time_),
                            ("--container", None if container == "docker" else container)) if v is not None]
    if given:
        raise UserError(f"{', '.join(given)}: only with --scheduler slurm; an SSH launch runs on "
                        "every node of --nodes FILE.")
    if nodes is None and os.environ.get("SLURM_JOB_NODELIST"):
        nodes = Path(SLURM_WORD)   # inside a Slurm allocation: its nodes
    if nodes is None:
        raise UserError("--nodes FILE is required (or $CLUSTERCTL_NODES): the inventory to run on; "
                        "see inventories/example.yaml.")
    spec = load_job(job)
    inventory = load_inventory(nodes)
    overrides = plan.parse_sets(set_ or [])
    if run_id:
        records.check_run_id(run_id)
    if dry_run:
        plans = launching.dry_run(spec, inventory, run_id=run_id, image=image, overrides=overrides)
        typer.echo(plan.render_dry_run(plans, json=json_), nl=False)
        return
    result = _launch(spec, inventory, overrides, image=image, detach=detach, run_id=run_id,
                     accept_new_host_keys=accept_new_host_keys, json_=json_)
    _report(result, detach=detach, json_=json_)
    raise typer.Exit(result.exit_code)


def _slurm_launch(job, nodes, sets, *, image, dry_run, run_id, partition, nnodes, time_,
                  container) -> None:
    """``launch --scheduler slurm``: check everything, then print (``--dry-run``) or submit."""
    spec = load_job(job)
    inventory = load_inventory(nodes) if nodes is not None else None
    options = slurm_options.check_options(nnodes=nnodes, partition=partition, time=time_,
                                          container=container,
                                          nodelist=inventory.names if inventory else ())
    overrides = plan.parse_sets(sets)
    run_id = records.check_run_id(run_id) if run_id else records.new_run_id(spec.name)
    if dry_run:
        script = slurm_submit.render(spec, options, run_id=run_id, inventory=inventory,
                                     image=image, overrides=overrides)
        typer.echo(script.text, nl=False)
        return
    require_binaries("sbatch", "squeue", "scontrol", "scancel", packages="slurm-client")

    def submitted(record: records.RunRecord) -> None:
        err.print(f"run {record.run_id}: Slurm job {record.slurm_job} submitted "
                  f"(logs in {record.dir})", markup=False)

    try:
        result = slurm_submit.submit(
            spec, options, inventory=inventory, image=image, overrides=overrides, run_id=run_id,
            handle_signals=True, stream=sys.stdout, progress=PlainProgress(),
            argv=["clusterctl", *sys.argv[1:]], on_submitted=submitted,
            on_note=lambda msg: err.print(f"note: {msg}", markup=False))
    except KeyboardInterrupt:  # before the job was submitted (the push)
        err.print("interrupted before anything was submitted", markup=False)
        raise typer.Exit(supervise.INTERRUPTED_EXIT) from None
    _report(result, detach=False, json_=False)
    raise typer.Exit(result.exit_code)


def _launch(spec, inventory, overrides, *, image, detach, run_id, accept_new_host_keys, json_):
    def started(record: records.RunRecord) -> None:
        err.print(f"run {record.run_id}: {len(record.nodes)} containers running "
                  f"(logs in {record.dir})", markup=False)

    try:
        return launching.launch(
            spec, inventory, image=image, overrides=overrides, run_id=run_id, detach=detach,
            accept_new_host_keys=accept_new_host_keys or None, handle_signals=True,
            stream=sys.stderr if json_ else sys.stdout, progress=PlainProgress(),
            argv=["clusterctl", *sys.argv[1:]], on_started=started)
    except launching.PreflightFailed as e:
        print_table("preflight", preflight.COLUMNS,
                    [[escape(c) for c in row] for row in preflight.table_rows(e.checks)], console=err)
        raise
    except KeyboardInterrupt:  # before any container existed (preflight, push)
        err.print("interrupted before anything was started", markup=False)
        raise typer.Exit(supervise.INTERRUPTED_EXIT) from None


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
    verdict = {"succeeded": "succeeded", "interrupted": "interrupted"}.get(rec.state, "FAILED")
    err.print(f"run {rec.run_id} {verdict} (exit {result.exit_code}); record: {rec.dir}",
              markup=False)


# --------------------------------------------------------------------------- logs

def logs(
    run: RunArg = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node's output.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the containers end.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N lines of each node.")] = None,
    nodes: RunNodesOption = None,
) -> None:
    """Show a run's merged, prefixed output: from the nodes while its containers exist,
    from runs/<run-id>/ after."""
    record = records.resolve(run)
    if node is not None:
        record.node(node)  # UserError naming the run's nodes
    sink = logs_mod.LogSink({n.node: n.rank for n in record.nodes}, stream=sys.stdout)
    sources, unreachable = [], {}
    # a Slurm run's output reaches runs/<id>/ through the launch that follows it
    if record.scheduler != "slurm" and records.may_have_containers(record):
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


# --------------------------------------------------------------------------- status

def status(run: RunArg = None, nodes: RunNodesOption = None,
           json_: Annotated[bool, typer.Option("--json", help="One JSON object per node.")] = False) -> None:
    """Each node's container of a run: state, exit code, start and end (from the nodes,
    else from the run record)."""
    record = records.resolve(run)
    if record.scheduler == "slurm":
        rows = _slurm_status_rows(record)
    else:
        with _cluster(nodes, record) as cluster:
            rows = records.run_status(record, cluster)
    if json_:
        typer.echo(json.dumps({"run_id": record.run_id, "state": record.state, "exit_code": record.exit_code,
                               "nodes": [json.loads(r.model_dump_json()) for r in rows]}, indent=2))
        return
    outcome = record.state + ("" if record.exit_code is None else f", exit {record.exit_code}")
    print_table(f"run {escape(record.run_id)} ({escape(record.job)}; {escape(outcome)})",
                ["node", "rank", "container state", "exit code", "started (UTC)", "finished (UTC)", "source"],
                [[escape(c) for c in row] for row in records.status_rows(rows)])
    if records.containers_ended(record, rows):
        out.print(f"every container has ended; `clusterctl stop {record.run_id}` records the outcome "
                  "and removes them", markup=False)
    if record.first_failure:
        f = record.first_failure
        out.print(f"first failure: {f.node}[{f.rank}] "
                  + ("stopped answering" if f.kind == "lost" else f"exited {f.exit_code}"), markup=False)


def _slurm_status_rows(record: records.RunRecord) -> list[records.NodeStatus]:
    """A Slurm run's nodes as recorded, each row naming the job's state in squeue now."""
    require_binaries("squeue", "scontrol", packages="slurm-client")
    state = slurm_submit.job_nodes(record.slurm_job, os.environ)[0] if record.slurm_job else ""
    note = f"Slurm job {record.slurm_job}: {state or 'not known to Slurm any more'}"
    return [records.NodeStatus(node=n.node, rank=n.rank, container=n.container, state=n.state,
                               exit_code=n.exit_code, started=n.started, finished=n.finished,
                               source="record", note=note) for n in record.nodes]


# --------------------------------------------------------------------------- stop

def stop(run: RunArg = None, nodes: RunNodesOption = None,
         grace: Annotated[int, typer.Option("--grace", min=0,
                                            help="Seconds between SIGTERM and SIGKILL.")] = 3) -> None:
    """Stop and remove a run's containers on every node (idempotent); their output is kept
    in runs/<run-id>/. Exit 1 when a node could not be reached."""
    record = records.resolve(run)
    if record.scheduler == "slurm":
        require_binaries("squeue", "scancel", packages="slurm-client")
        out.print(f"stop {record.run_id}: {slurm_submit.cancel(record)}", markup=False)
        return
    with _cluster(nodes, record) as cluster:
        results = supervise.stop_run(cluster, record, grace=grace)
    rows, failed = [], []
    for n in record.nodes:
        r = results[n.node]
        if r.error:
            failed.append(n.node)
            what = f"NOT STOPPED: {r.error}"
        elif not r.containers:
            what = "no container (already removed)"
        else:
            codes = ", ".join(str(c.exit_code) for c in r.containers)
            what = ("stopped and removed" if r.was_running else "removed (had exited)") + f", exit {codes}"
        rows.append([n.node, str(n.rank), n.container, what])
    print_table(f"stop {escape(record.run_id)}", ["node", "rank", "container", "result"],
                [[escape(c) for c in row] for row in rows])
    if failed:
        err.print(f"could not stop the run on {', '.join(failed)}; run `clusterctl stop "
                  f"{record.run_id}` again when the node answers", markup=False)
        raise typer.Exit(1)


# --------------------------------------------------------------------------- runs

def runs(json_: Annotated[bool, typer.Option("--json", help="The run records as JSON.")] = False) -> None:
    """List recorded runs, newest first."""
    found = records.list_runs()
    if json_:
        typer.echo(json.dumps([json.loads(r.model_dump_json()) for r in found], indent=2))
        return
    if not found:
        out.print(f"no runs recorded in {records.runs_dir().resolve()}", markup=False)
        return
    print_table("runs (newest first)", ["run", "job", "nodes", "state", "exit", "started (UTC)",
                                        "finished (UTC)", "first failure"],
                [[escape(c) for c in row] for row in records.summary_rows(found)])


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
    app.command("logs")(logs)
    app.command("status")(status)
    app.command("stop")(stop)
    app.command("runs")(runs)
