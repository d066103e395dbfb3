"""The Slurm backend: the job as one sbatch script (``srun`` starts a container per node:
``docker run`` or ``podman run``, or pyxis's ``--container-image``), submitted and followed through Slurm's
own clients.

The work is :mod:`clusterctl.run.slurm` (the script, its submission, following the job and
its task records); this module puts it behind the backend interface.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

from clusterctl.cluster import containers
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.runtime import node_runtime
from clusterctl.cluster.transport import Cluster
from clusterctl.code import snapshot as code_snapshot
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.core.imageref import check_image
from clusterctl.core.tools import require_binaries
from clusterctl.image.codeimage import code_tag
from clusterctl.run import launch as launching
from clusterctl.run import logs as logs_mod
from clusterctl.run import plan, records, request, supervise
from clusterctl.run import workspace as workspaces
from clusterctl.run.backends.base import Backend, BackendOption, Status, Ui
from clusterctl.run.backends.ssh import report, show_code
from clusterctl.run.jobs import Job
from clusterctl.run.slurm import conf as slurm_conf
from clusterctl.run.slurm import options as slurm_options
from clusterctl.run.slurm import script as slurm_script
from clusterctl.run.slurm import submit as slurm_submit
from clusterctl.run.slurm import tasks as slurm_tasks
from clusterctl.run.slurm import track as slurm_track
from clusterctl.run.slurm.client import in_queue


def slurm_env(record: records.RunRecord, note=None) -> dict[str, str]:
    """The Slurm clients' environment for a recorded Slurm run: SLURM_CONF, else the Slurm
    of the sandbox whose inventory the run used (exit 2 for a SLURM_CONF naming no file)."""
    return slurm_conf.slurm_env(record.inventory or None, note=note)


class SlurmBackend(Backend):
    name = "slurm"
    options = {
        "partition": BackendOption("--partition", "Slurm partition (--scheduler slurm)."),
        "nnodes": BackendOption("--nnodes", "Number of nodes Slurm allocates (--scheduler slurm; "
                                "or --nodes FILE).", kind="int"),
        "time": BackendOption("--time", "Slurm time limit, e.g. 30 or 1-12:00:00 (--scheduler "
                              "slurm)."),
        "container": BackendOption("--container", "docker (docker run on each node), podman "
                                   "(podman run on each node) or pyxis (srun --container-image); "
                                   "--scheduler slurm. Default: the inventory's node runtime, "
                                   "else docker."),
    }

    def check(self, req, others) -> None:
        super().check(req, others)
        if req.dry_run and req.json:
            raise UserError("--dry-run --json: with --scheduler slurm the plan is one sbatch script; "
                            "valid: --dry-run (prints it). Nothing was submitted.")
        if req.hang_timeout is not None:
            raise UserError("--hang-timeout: not available with --scheduler slurm yet; launch "
                            "follows the Slurm job to its end (Ctrl-C cancels it). Nothing was submitted.")

    def launch(self, req: request.LaunchRequest, ui: Ui) -> int:
        """``launch --scheduler slurm``: check everything, then print (``--dry-run``) or submit."""
        spec = request.job_of(req.job, req.given)
        inventory = load_inventory(req.nodes) if req.nodes is not None else None
        opts = req.scheduler_options
        left: list[str] = []
        if inventory is not None:
            # the nodes an SSH launch would start on (its dry run shows the same): spares and
            # nodes past the job's `nnodes` take no rank; Slurm allocates what --nodelist names
            chosen, _ = launching.first_nodes(spec, inventory)
            spare = {n.name for n in inventory.spares}
            why = {True: "spare: true", False: "past the job's nnodes"}
            left = [f"{n.name} ({why[n.name in spare]} in {inventory.path})"
                    for n in inventory.nodes if n.name not in chosen]
            inventory = replace(inventory, nodes=[n for n in inventory.nodes if n.name in chosen])
        options = slurm_options.check_options(
            nnodes=opts.get("nnodes"), partition=opts.get("partition"), time=opts.get("time"),
            container=slurm_options.container_mode(
                opts.get("container"),
                {n.name: node_runtime(n).name for n in inventory.nodes} if inventory else {},
                str(inventory.path) if inventory else ""),
            nodelist=[n.name for n in inventory.nodes] if inventory else ())
        if opts.get("nnodes") is not None:
            spec.check_node_count(opts["nnodes"], "--nnodes")
        if left:
            ui.note(f"note: {', '.join(left)} takes no rank on Slurm, and Slurm cannot swap it in: "
                    "the job names its nodes, so a requeued attempt waits for them; give --nnodes N "
                    "instead of --nodes for Slurm to choose")
        overrides = plan.parse_sets(req.sets, os.environ)
        run_id = records.check_run_id(req.run_id) if req.run_id else records.new_run_id(spec.name)
        image = req.image
        base = plan.image_of(spec, image)
        if base is not None:   # before a code layer is built on it, or a script names it
            check_image(base, "--image" if image else spec.where("image"))
        if spec.workdir is not None and base is not None:
            # Slurm's nodes start containers of an image: the code goes in as a thin layer
            if req.dry_run:     # the image it would build, by name (the tag is the tree's digest)
                snap = code_snapshot.take(spec.workdir, limit_bytes=spec.max_workdir_size
                                          or code_snapshot.DEFAULT_LIMIT_BYTES)
                if spec.requirements is not None:
                    base = _requirements_tag(base, spec.requirements, ui)
                image = code_tag(base, snap.digest)
                show_code(ui, snap)
            else:
                ws = workspaces.prepare(spec, base, log=ui.note)
                image = workspaces.code_image(ws, base, log=ui.note)
                ui.note(f"code: {workspaces.describe(ws)}, in image {image}")
        if req.dry_run:
            script = slurm_submit.render(spec, options, run_id=run_id, inventory=inventory,
                                         image=image, overrides=overrides)
            ui.echo(script.text)
            return 0
        env = slurm_conf.slurm_env(inventory.path if inventory else None, note=ui.note)
        require_binaries("sbatch", "squeue", "scontrol", "scancel", packages="slurm-client")

        def submitted(record: records.RunRecord) -> None:
            ui.note(f"run {record.run_id}: Slurm job {record.slurm_job} submitted "
                    f"(logs in {record.dir})")

        try:
            result = slurm_submit.submit(
                spec, options, inventory=inventory, image=image, overrides=overrides, run_id=run_id,
                detach=req.detach, handle_signals=True,
                stream=ui.stderr if req.json else ui.stdout, progress=ui.progress,
                argv=req.argv, on_submitted=submitted, env=env,
                on_note=lambda msg: ui.note(f"note: {msg}"))
        except KeyboardInterrupt:  # before the job was submitted (the push)
            ui.note("interrupted before anything was submitted")
            return supervise.INTERRUPTED_EXIT
        if req.detach and not req.json:
            rec = result.record
            ui.say(f"run {rec.run_id} submitted detached as Slurm job {rec.slurm_job}; follow it "
                   f"with `clusterctl logs {rec.run_id} --follow`, stop it with `clusterctl stop "
                   f"{rec.run_id}`")
            return 0
        report(ui, result, detach=False, json_=req.json)
        return result.exit_code

    def logs(self, record: records.RunRecord, ui: Ui, *, node: str | None, follow: bool,
             tail: int | None, nodes: Path | None) -> int:
        """A Slurm run's output: runs/<id>/merged.log once launch wrote it, else the job's own
        output file; ``follow`` streams it while the job runs, then prints the run's outcome
        and exits with the run's exit status."""
        going = record.state in ("starting", "running", "unknown")
        env: dict[str, str] = dict(os.environ)
        if going:
            env = slurm_env(record, note=ui.note)
            require_binaries("squeue", "scontrol", packages="slurm-client")
            slurm_track.settle(record, env, grace=0)   # fits task order, or it ended
            going = record.state in ("starting", "running", "unknown")
        sink = logs_mod.LogSink({n.node: n.rank for n in record.nodes}, stream=ui.stdout)
        if follow and going:
            stop = threading.Event()
            try:
                outcome, _info = slurm_track.follow(record, env, sink, stop_event=stop, node=node)
            except KeyboardInterrupt:     # leave the job running: this only followed it
                return supervise.INTERRUPTED_EXIT
            finally:
                sink.close()
            record = records.load(record.run_id)
            for line in supervise.summary_lines(outcome) if outcome and record.state == "failed" else []:
                ui.note(line)
            ui.note(f"run {record.run_id}: {request.run_outcome(record)}")
            return record.exit_code or 0
        shown = 0 if going else logs_mod.show_from_files(record, sink, node=node, tail=tail)
        if not shown:        # running, or detached: the job's own output file is the log
            for n, text in logs_mod.tail_per_node(
                    lambda: slurm_track.output_lines(record, node=node), tail):
                sink.write(n, text)
                shown += 1
            sink.flush()
        if not shown:
            ui.note(f"no output recorded for run {record.run_id} in {record.dir} yet")
        if follow:     # it had ended already: its outcome and exit status, as after following it
            ui.note(f"run {record.run_id}: {request.run_outcome(record)}")
            return record.exit_code or 0
        return 0

    def attach(self, record: records.RunRecord, ui: Ui) -> int:
        raise UserError(f"run {record.run_id} went through Slurm: follow it with "
                        f"`clusterctl logs {record.run_id} --follow`.")

    def status(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None) -> Status:
        """A Slurm run's nodes: the job as sacct (accounting) or scontrol tells it, each node's
        own exit code from its task's record; settled into the record once the job has ended."""
        env = slurm_env(record, note=ui.note)
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
            rows.append(records.NodeStatus(node=n.node, rank=n.rank, container=n.container,
                                           state=state, exit_code=code, started=n.started,
                                           finished=fin, stopped_by=n.stopped_by,
                                           source="task record" if t is not None else "record"))
        return Status(rows, note=note, extra={"slurm": note})

    def stop(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None, grace: int) -> int:
        env = slurm_env(record, note=ui.note)
        require_binaries("squeue", "scancel", "scontrol", packages="slurm-client")
        what = slurm_submit.cancel(record, env=env, by=f"clusterctl stop ({records.who()})")
        ui.say(f"stop {record.run_id}: {what}")
        left = _remove_leftovers(record, nodes, env, ui) if record.slurm_job else {}
        ui.say(f"run {record.run_id}: {request.run_outcome(records.load(record.run_id))}")
        for node, why in left.items():
            ui.note(f"{node}: a container of run {record.run_id} is still there: {why}; run "
                    f"`clusterctl stop {record.run_id}` again when the node answers")
        return 1 if left else 0

    def refresh(self, record: records.RunRecord) -> None:
        if shutil.which("squeue") is None or shutil.which("scontrol") is None:
            return
        if record.state in ("starting", "running", "unknown"):   # ended jobs get their outcome
            slurm_track.settle(record, slurm_env(record), grace=0)

    def recovery(self, job: Job) -> str:
        """The sbatch script's end that requeues the job after a failed step (empty without
        ``max_restarts``)."""
        return slurm_script.recovery_shell(job)


def _remove_leftovers(record: records.RunRecord, nodes: Path | None, env: dict[str, str],
                      ui: Ui) -> dict[str, str]:
    """Once the job has left the queue: the run's containers that its tasks did not remove
    (Slurm kills a task that is slow to end, and with it the task's own `docker rm`),
    removed over SSH as the launch that follows a run does; node -> why one is still there.
    Nothing when the job is still ending, or when the run's nodes cannot be reached from
    here (another user's inventory): the tasks remove theirs."""
    if in_queue(record.slurm_job, env) is not False:
        return {}
    try:
        inventory = load_inventory(records.inventory_path(record, nodes))
    except (UserError, OSError) as e:
        ui.note(f"the run's containers are left to its tasks to remove: {str(e).splitlines()[0]}")
        return {}
    with Cluster(inventory) as cluster:
        return containers.remove_run_containers(cluster, record.run_id, [n.node for n in record.nodes])


def _requirements_tag(base: str, requirements: Path, ui: Ui) -> str:
    """The tag of the requirements layer a launch would build over ``base`` (its lines are
    checked; the engine is asked for the base's ID only, nothing is built)."""
    from clusterctl.image import deps
    from clusterctl.run import launch as launching
    reqs = deps.read_requirements(requirements)
    try:
        base_id = launching.local_image_id(base)
    except (UserError, OSError, ClusterctlError) as e:    # no engine, or it lacks the image
        ui.echo(f"# (the requirements layer over {base} is named once {base} is in this "
                f"machine's Docker engine: {str(e).splitlines()[0]})\n")
        return base
    return deps.deps_tag(base, base_id, deps.normalised(reqs))
