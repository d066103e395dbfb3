"""Submit a rendered sbatch script to a real Slurm and follow it to its true end.

``submit(job, options, ...)`` is ``launch --scheduler slurm`` without the CLI:

1. render the script (:mod:`clusterctl.run.slurm.script`) and check the cluster
   (:func:`check_cluster`: Slurm new enough, ``--partition`` known); in docker mode with an
   inventory, push the image to its nodes first (clusterctl's own push); with
   ``--nnodes`` only Slurm picks the nodes, so the image must already be on them
   (``on_note`` says so).  An inventory with ``registry:``: the script names the image by
   digest as this machine pushed it there (exit 2 when it was not:
   :func:`clusterctl.cluster.registry.lookup.pinned_reference`); in docker mode each node
   gets it as an SSH launch does (its layers over the relay push, then a pull by digest,
   :func:`clusterctl.cluster.registry.pull.pull`), so it holds ``REPO@sha256:...``; pyxis
   pulls it itself;
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
   on a node afterwards is removed (nothing is left running);
6. with ``max_restarts`` the job requeues itself after a failed attempt
   (:mod:`clusterctl.run.slurm.script`): following goes on through every attempt, the
   outcome is the last one's, and run.json lists them all (``attempts``).

``detach=True`` returns right after sbatch accepted the job (``--detach``): ``status``,
``logs [--follow]``, ``stop`` and ``runs`` take it from there
(:mod:`clusterctl.run.slurm.track`).  A job cancelled from outside (scancel by hand, its
time limit) ends as "stopped", exit 143, with who stopped it where Slurm or clusterctl
knows.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TextIO

from clusterctl.cluster import containers
from clusterctl.cluster.inventory import Inventory
from clusterctl.cluster.registry import lookup
from clusterctl.cluster.registry import pull as registry_pull
from clusterctl.cluster.registry import push as registry_push
from clusterctl.cluster.registry.reference import digest_of
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import ClusterctlError, UserError, did_you_mean, one_of
from clusterctl.core.text import digits
from clusterctl.run import launch as launching
from clusterctl.run import logs, plan, records, recovery, supervise
from clusterctl.run.jobs import Job
from clusterctl.run.slurm import script as slurm_script
from clusterctl.run.slurm import track
from clusterctl.run.slurm.client import (  # noqa: F401 - the readers are part of this API too
    CLIENT_TIMEOUT,
    in_queue,
    job_nodes,
    missing_conf,
    parse_label,
    scontrol_fields,
    slurm_client,
)
from clusterctl.run.slurm.options import SlurmOptions
from clusterctl.run.slurm.tasks import TaskRecord, outcome_of, read_task_records  # noqa: F401

SCRIPT_NAME = "sbatch.sh"
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


# --------------------------------------------------------------------------- the cluster first

#: The oldest Slurm clusterctl submits to. The sandbox (Debian bookworm) runs 22.05;
#: 20.11 is the oldest release whose srun/sbatch options the script uses unchanged
#: (--kill-on-bad-exit, --label, --parsable, scontrol show hostnames all predate it).
MIN_SLURM = (20, 11)


def parse_slurm_version(text: str) -> tuple[int, int] | None:
    """``sbatch --version``'s ``slurm 22.05.8`` (or ``slurm-wlm 22.05.8``) -> (22, 5)."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and digits(parts[0]) and digits(parts[1]):
            return int(parts[0]), int(parts[1])
    return None


def check_cluster(options: SlurmOptions, env: Mapping[str, str]) -> None:
    """Before anything is pushed, written or submitted: the Slurm is new enough and knows
    ``--partition``. UserError (exit 2) naming what is wrong and what would work."""
    res = slurm_client(["sbatch", "--version"], env=env)
    version = parse_slurm_version(res.stdout) if res.returncode == 0 else None
    conf = missing_conf(res.stderr) if version is None else None
    if conf is not None or version is None and "failed to fetch config" in res.stderr:
        # no conf file and no configless slurmctld (a SLURM_CONF naming no file never gets
        # here: slurm_env refuses it before any client runs)
        raise UserError("the Slurm clients find no slurm.conf ("
                        + (f"{conf} does not exist" if conf else "none at their default path, and no "
                           "configless slurmctld in DNS")
                        + "); valid: SLURM_CONF=<the path of the cluster's slurm.conf>, or "
                        "--nodes with the inventory of a sandbox with Slurm (`clusterctl sandbox "
                        "up --nodes 2 --slurm` writes inventories/sandbox.yaml). "
                        "Nothing was submitted.")
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
    if not digits(job_id):
        raise ValueError(f"sbatch printed {parsable.strip()!r}, not a job id")
    return job_id


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
    (the containers' ``--add-host`` entries); with its ``registry:``, the image pinned by
    digest there (:func:`pinned_image`). UserError (exit 2) on unusable input."""
    host_env = dict(os.environ if env is None else env)
    image = pinned_image(job, inventory, image)
    addresses = launching.local_facts(inventory)["addresses"] if inventory is not None else None
    return slurm_script.render_script(job, options, run_id=run_id,
                                      run_dir=records.run_path(run_id).resolve(),
                                      inventory=inventory, image=image, overrides=overrides,
                                      host_env=host_env, addresses=addresses)


def pinned_image(job: Job, inventory: Inventory | None, image: str | None) -> str | None:
    """The image the script names: with an inventory's ``registry:``, the job's (or
    ``image``) as pushed there, by digest (UserError naming the push command when it was
    not); else ``image`` as given (None: the job's)."""
    registry = inventory.registry if inventory is not None else None
    if registry is None:
        return image
    local = plan.image_of(job, image)
    if local is None:
        return image        # the plan says what is missing
    return lookup.pinned_reference(local, registry)


def submit(job: Job, options: SlurmOptions, *, inventory: Inventory | None = None,
           image: str | None = None, overrides: Mapping[str, str] | None = None,
           run_id: str | None = None, detach: bool = False, stream: TextIO | None = None, color: bool | None = None,
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
    if options.container != "pyxis":      # docker, podman: clusterctl puts the image on the nodes
        if inventory is not None and push and inventory.registry is not None and digest_of(script.image):
            _pull_pinned(inventory, plan.image_of(job, image) or script.image, script.image, progress)
        elif inventory is not None and push:
            launching.local_image_id(script.image)          # UserError when not here
            with Cluster(inventory) as cluster:
                launching.push_image(cluster, script.image, progress)
        elif inventory is None:
            note(f"--nnodes: Slurm chooses the nodes, so clusterctl cannot push {script.image} to "
                 "them; it must already be on every node of the partition (a node without it "
                 "fails with exit 125). Give --nodes FILE to have it pushed.")
    for rule in recovery.RULES:      # exit-code rules Slurm cannot say (the script's comments)
        codes = ", ".join(map(str, rule.codes_of(job))) if rule.slurm.says is None else ""
        if codes and rule.action == "not-counted" and job.max_restarts:
            note(f"{rule.label} ({codes}): Slurm counts every requeue (SLURM_RESTART_COUNT), so on "
                 f"Slurm these codes use up max_restarts ({job.max_restarts}) like any failure.")
        elif codes and rule.action == "not-counted":
            note(f"{rule.label} ({codes}) without max_restarts: on Slurm every requeue counts, so "
                 "the job is not requeued; give max_restarts N.")
        elif codes and job.max_restarts:
            note(f"{rule.label} ({codes}): not on Slurm: {rule.slurm.why}.")
    record = _new_record(job, script, inventory, argv)
    records.own_run_dir(run_id)
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
    record.detached = detach
    if not detach:   # a later command can tell that this process died without an outcome
        record.launcher = records.this_launcher()
    record.save()
    if on_submitted is not None:
        on_submitted(record)
    if detach:
        return SlurmResult(run_id, 0, record, None, job_id, "")
    sig = _Signals()

    def on_stop() -> str:
        slurm_client(["scancel", job_id], env=base_env)
        return (sig.caught or ["SIGINT"])[-1]

    sink = logs.LogSink({n.node: n.rank for n in record.nodes}, run_dir=run_dir,
                        stream=sys.stdout if stream is None else stream, color=color,
                        redact=script.environment.values())
    try:
        with launching.stop_on_signals(stop_event, sig.caught.append) if handle_signals else nullcontext():
            outcome, info = track.follow(record, base_env, sink, stop_event=stop_event, on_stop=on_stop,
                                         cancel_wait=CANCEL_WAIT)
    finally:
        sink.close()
    assert outcome is not None      # on_stop always gives a reason: the follow ran to the end
    if inventory is not None:
        with Cluster(inventory) as cluster:
            left = containers.remove_run_containers(cluster, run_id, inventory.names)
        for node, why in left.items():
            outcome.not_stopped[node] = f"container not removed: {why}"
    record = records.load(run_id)
    return SlurmResult(run_id, outcome.exit_code, record, outcome, job_id, info.state)


def _pull_pinned(inventory: Inventory, local: str, reference: str, progress) -> None:
    """Every node gets ``reference`` (the image pinned in the inventory's registry) as an SSH
    launch gives it: the layers of ``local`` over the relay push, then a pull by digest,
    which fetches only the manifest.  PushFailed naming each node that could not."""
    image_id = launching.local_image_id(reference)          # UserError when not here
    registry = inventory.registry
    failed: dict[str, str] = {}
    with Cluster(inventory) as cluster:
        try:
            launching.push_image(cluster, local, progress)
        except launching.PushFailed as e:
            failed.update(e.failures)
        results = registry_pull.pull(cluster, reference, image_id, registry=registry.address,
                                     auth=registry_push.credentials(registry),
                                     nodes=[n for n in inventory.names if n not in failed],
                                     progress=progress)
    failed.update({r.node: r.error or r.describe() for r in results if not r.ok})
    if failed:
        raise launching.PushFailed(failed)


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
        argv=[plan.mask_text(a, secrets) for a in argv], nodes=nodes,
        max_restarts=job.max_restarts, checkpoint=job.checkpoint)


def cancel(record: records.RunRecord, *, env: Mapping[str, str] | None = None,
           wait: float = CANCEL_WAIT, by: str | None = None) -> str:
    """``clusterctl stop`` for a Slurm run: say who stops it (:data:`track.STOP_REQUEST`),
    ``scancel`` its job and wait (bounded) until it left the queue; the tasks stop their
    containers and record it.  A detached run (nobody follows it) is settled here: its
    record gets "stopped" and who stopped it.  Returns what happened in words; UserError
    when the record has no job id, ClusterctlError when scancel fails."""
    if not record.slurm_job:
        raise UserError(f"run {record.run_id} has no Slurm job id in {record.dir / records.RECORD_NAME} "
                        "(sbatch never accepted it): there is nothing to cancel.")
    env = dict(os.environ if env is None else env)
    if in_queue(record.slurm_job, env) is False:
        track.settle(record, env)
        return f"Slurm job {record.slurm_job} had already ended ({record.state})"
    track.request_stop(record, by or f"clusterctl stop ({records.who()})")
    res = slurm_client(["scancel", record.slurm_job], env=env)
    if res.returncode != 0:
        raise ClusterctlError(f"scancel {record.slurm_job} failed: {res.stderr.strip() or res.returncode}; "
                              f"run `clusterctl stop {record.run_id}` again.")
    deadline = time.monotonic() + wait
    while in_queue(record.slurm_job, env) is not False:
        if time.monotonic() > deadline:
            return f"Slurm job {record.slurm_job} cancelled, still ending after {wait:.0f}s"
        time.sleep(0.5)
    # the launch following it records the outcome; a detached (or orphaned) run is ours to settle
    deadline = time.monotonic() + track.END_GRACE
    while True:
        fresh = records.load(record.run_id)
        following = not fresh.detached and records.launcher_gone(fresh.launcher) is False
        if fresh.state not in ("starting", "running", "unknown") or not following:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    track.settle(fresh, env)
    return f"Slurm job {record.slurm_job} cancelled and ended"
