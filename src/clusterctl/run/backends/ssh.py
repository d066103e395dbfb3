"""The SSH backend: one ``docker run --net=host`` container per node, started over SSH, the
merged output followed here (or by a supervisor process of its own with ``--detach``).

The work is :mod:`clusterctl.run.launch` (preflight, push, start, follow, restarts),
:mod:`clusterctl.run.supervise` (fail fast, stop), :mod:`clusterctl.run.detached` (the
supervisor of a detached run) and :mod:`clusterctl.run.logs`; this module puts them behind
the backend interface and says what happened through the :class:`~.base.Ui`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from clusterctl.cluster import preflight
from clusterctl.cluster.inventory import Inventory, load_inventory
from clusterctl.cluster.registry.reference import split_tag
from clusterctl.cluster.transport import Cluster
from clusterctl.code.ignore import shown
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.run import detached, plan, records, recovery, request, supervise
from clusterctl.run import launch as launching
from clusterctl.run import logs as logs_mod
from clusterctl.run.backends.base import Backend, Interrupted, Status, Ui
from clusterctl.run.jobs import Job


def _cluster(nodes: Path | None, record: records.RunRecord) -> Cluster:
    """The nodes of ``record``'s run: ``--nodes``, else the inventory recorded with it."""
    return Cluster(load_inventory(records.inventory_path(record, nodes)))


def show_code(ui: Ui, snap) -> None:
    """What a dry run would ship, before the plan (a comment line, as the plan's own)."""
    ui.echo(f"# code: {shown(str(snap.root))} -> /workspace: {snap.file_count} files, {snap.total_bytes} "
            f"bytes, {snap.digest}\n")
    for left in snap.left_out:
        ui.echo(f"# code: left out {shown(left.path)}: {left.why}; to ship it, name it: "
                f'"{shown(left.allow_line)}" in .clusterctlignore\n')


def report(ui: Ui, result: launching.RunResult, *, detach: bool, json_: bool) -> None:
    """A launch's end as a person reads it (or its record, ``--json``)."""
    rec = result.record
    if json_:
        ui.echo(records.dump(rec) + "\n")
        return
    if detach:
        ui.say(f"run {rec.run_id} started detached on {len(rec.nodes)} nodes; follow it with "
               f"`clusterctl logs {rec.run_id} --follow`, stop it with `clusterctl stop {rec.run_id}`")
        return
    for line in result.summary:
        ui.note(line)
    for node, kept in sorted(rec.flight.items()):
        what = (f"{len(kept)} file(s) in {rec.dir / 'flight' / node}" if isinstance(kept, list) and kept
                else "no dump" if isinstance(kept, list) else kept)
        ui.note(f"flight recorder, {node}: {what}")
    verdict = {"succeeded": "succeeded", "interrupted": "interrupted", "hung": "HUNG",
               "suspicious": "SUSPICIOUS", "stopped": f"stopped by {rec.stopped_by}"}.get(rec.state, "FAILED")
    ui.note(f"run {rec.run_id} {verdict} (exit {result.exit_code}); record: {rec.dir}")


class SshBackend(Backend):
    name = "ssh"
    leaves_containers = True
    only_note = "an SSH launch runs on the nodes of --nodes FILE (the first `nnodes` of them when the job has that key)."

    # ------------------------------------------------------------------ launch

    def prepare(self, req: request.LaunchRequest, ui: Ui) -> request.Prepared:
        if req.resume is not None:
            return request.resumed(req, ui.note)
        if req.rerun is not None:
            return request.rerun(req, ui.note)
        return request.fresh(req)

    def launch(self, req: request.LaunchRequest, ui: Ui) -> int:
        """An SSH launch: the dry run's plan, or the run and its outcome."""
        prepared = self.prepare(req, ui)
        req = prepared.request
        job, inventory = prepared.job, prepared.inventory
        overrides = plan.parse_sets(req.sets, os.environ)
        if req.run_id and prepared.resume is None:
            records.check_run_id(req.run_id)
        if req.dry_run:
            plans = launching.dry_run(job, inventory, run_id=req.run_id, image=prepared.image,
                                      overrides=overrides, hang_timeout=req.hang_timeout,
                                      on_code=None if req.json else (lambda snap: show_code(ui, snap)),
                                      workspace=prepared.workspace)
            if inventory.registry is not None and plans and not req.json:
                # launch pushes first, then every node runs the registry's digest of it
                tagged = inventory.registry.tagged(plans[0].image)
                ui.echo(f"# image: {plans[0].image} is pushed to {inventory.registry} at launch "
                        f"({tagged}); every node pulls it and runs it by digest "
                        f"({split_tag(tagged)[0]}@sha256:...), not the name below\n")
            ui.echo(plan.render_dry_run(plans, json=req.json))
            return 0
        settings = supervise.Settings(fail_grace=req.fail_grace)
        if req.detach and (launching.hang_timeout_of(job, req.hang_timeout) or job.max_restarts
                           or job.retry_on_exit or prepared.resume is not None):
            return self._supervised(prepared, overrides, settings, ui)
        try:
            result = self._launch(prepared, overrides, settings, ui, detach=req.detach, json_=req.json)
        except Interrupted as e:
            return e.exit_code
        report(ui, result, detach=req.detach, json_=req.json)
        return result.exit_code

    def _supervised(self, prepared: request.Prepared, overrides, settings, ui: Ui) -> int:
        """``launch --detach`` of a run clusterctl must keep watching (restarts, a hang
        watchdog): a supervisor process of its own follows it (:mod:`clusterctl.run.detached`);
        this process shows its log until the containers run, then returns."""
        req = prepared.request
        run_id = req.run_id or records.new_run_id(prepared.job.name)
        if prepared.resume is None and records.run_path(run_id).exists():
            raise UserError(f"run id {run_id!r} is already recorded in {records.run_path(run_id)}; "
                            "choose another --run-id (or leave it out for a new one).")
        fixed = replace(prepared, request=replace(req, run_id=run_id))

        def follow() -> int:
            try:
                result = self._launch(fixed, overrides, settings, ui, detach=False, json_=False,
                                      supervised=True)
            except Interrupted as e:
                return e.exit_code
            except ClusterctlError as e:
                ui.note(f"error: {e}")
                return e.exit_code
            report(ui, result, detach=False, json_=False)
            return result.exit_code

        started = detached.start(run_id, follow, show=ui.note)
        if started.exit_code is not None:
            ui.note(f"run {run_id}: the supervisor ended (exit {started.exit_code}) before the run "
                    f"ran; its log: {started.log}")
            return started.exit_code
        rec = started.record
        if req.json:
            ui.echo(records.dump(rec) + "\n")
            return 0
        ui.say(f"run {run_id} is {rec.state} detached, supervised by pid {started.pid} (restarts "
               f"and checks go on with this terminal closed; its log: {started.log}); follow it with "
               f"`clusterctl attach {run_id}`, stop it with `clusterctl stop {run_id}`")
        return 0

    def _launch(self, prepared: request.Prepared, overrides, settings, ui: Ui, *, detach: bool,
                json_: bool, supervised: bool = False) -> launching.RunResult:
        req, job = prepared.request, prepared.job

        def started(record: records.RunRecord) -> None:
            ui.note(f"run {record.run_id}: {len(record.nodes)} containers running "
                    f"(logs in {record.dir})")

        try:
            return launching.launch(
                job, prepared.inventory, image=prepared.image, overrides=overrides,
                run_id=req.run_id, detach=detach,
                accept_new_host_keys=req.accept_new_host_keys or None, handle_signals=True,
                stream=ui.stderr if json_ else ui.stdout, progress=ui.progress,
                argv=req.argv, on_started=started, hang_timeout=req.hang_timeout,
                settings=settings, workspace=prepared.workspace, spec=prepared.record_spec,
                supervised=supervised, resume=prepared.resume,
                recheck=_recheck(job, prepared.image, req.accept_new_host_keys, ui),
                on_note=ui.note,
                on_warning=lambda node, text: ui.note(f"{node}: warning: {text}"))
        except launching.PreflightFailed as e:
            ui.table("preflight", preflight.COLUMNS, preflight.table_rows(e.checks), stderr=True)
            raise
        except KeyboardInterrupt:  # before any container existed (preflight, push)
            ui.note("interrupted before anything was started")
            raise Interrupted(supervise.INTERRUPTED_EXIT) from None

    # ------------------------------------------------------------------ after the start

    def logs(self, record: records.RunRecord, ui: Ui, *, node: str | None, follow: bool,
             tail: int | None, nodes: Path | None) -> int:
        sink = logs_mod.LogSink({n.node: n.rank for n in record.nodes}, stream=ui.stdout)
        if records.may_have_containers(record):
            with _cluster(nodes, record) as cluster:
                sources, unreachable = logs_mod.live_containers(cluster, record, node=node)
                if sources:
                    for n, why in unreachable.items():
                        ui.note(f"{n}: not answering ({why}); its recorded log: {record.log_path(n)}")
                    try:
                        if follow:
                            logs_mod.follow_from_nodes(cluster, sources, sink, tail=tail)
                        else:
                            logs_mod.show_from_nodes(cluster, sources, sink, tail=tail)
                    except KeyboardInterrupt:
                        return supervise.INTERRUPTED_EXIT
                    return 0
        if not logs_mod.show_from_files(record, sink, node=node, tail=tail):
            ui.note(f"no output recorded for run {record.run_id} in {record.dir}")
        return 0

    def attach(self, record: records.RunRecord, ui: Ui) -> int:
        try:
            final = detached.attach(record.run_id, ui.stdout, note=ui.note)
        except KeyboardInterrupt:
            ui.note(f"stopped following; run {record.run_id} goes on (`clusterctl attach "
                    f"{record.run_id}` again)")
            return supervise.INTERRUPTED_EXIT
        for line in records.attempt_lines(final):
            ui.note(line)
        ui.note(f"run {final.run_id}: {request.run_outcome(final)}")
        return final.exit_code or 0

    def status(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None) -> Status:
        orphaned = records.launcher_died(record)
        with _cluster(nodes, record) as cluster:
            rows = records.run_status(record, cluster)
        # what the nodes say now becomes the record: ended containers give the outcome;
        # a run whose launch died without one is "unknown" until they have ended
        if not records.record_ended(record, rows) and orphaned:
            records.mark_unknown_if_orphaned(record)
        return Status(rows)

    def stop(self, record: records.RunRecord, ui: Ui, *, nodes: Path | None, grace: int) -> int:
        by = f"clusterctl stop ({records.who()})"
        if (record.supervised or record.attempts) and detached.ask_to_stop(record, timeout=grace + 60.0):
            ui.say(f"run {record.run_id}: its supervisor (pid {record.launcher.pid}) stopped it")
            record = records.load(record.run_id)   # no restart follows; the rest is cleaned below
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
        ui.table(f"stop {record.run_id}", ["node", "rank", "container", "result"], rows)
        ui.say(f"run {record.run_id}: {request.run_outcome(record)}")
        if failed:
            ui.note(f"could not stop the run on {', '.join(failed)}; run `clusterctl stop "
                    f"{record.run_id}` again when the node answers")
            return 1
        return 0

    def refresh(self, record: records.RunRecord) -> None:
        records.mark_unknown_if_orphaned(record)            # a followed run whose launch died

    def recovery(self, job: Job) -> recovery.Policy:
        return recovery.Policy.of(job)


def _recheck(job: Job, image, accept_new_host_keys, ui: Ui):
    """A job with ``collective_check``: the bounded collective check before each restart."""
    if not job.collective_check:
        return None
    from clusterctl.run.collective import check as collective

    def run(inventory: Inventory) -> dict[str, str]:
        return collective.recheck(inventory, job=job, image=image,
                                  accept_new_host_keys=accept_new_host_keys or None, note=ui.note)
    return run


def _stopped_words(c, was_running: bool, grace: int) -> str:
    """One container's end in words: who ended it, with its real exit code or signal."""
    code = records.describe_exit(c.exit_code) or "exit code unknown"
    if not was_running:
        return f"removed (had exited by itself), {code}"
    how = ("SIGTERM, then SIGKILL after the " f"{grace}s grace" if c.exit_code == 137
           else "SIGTERM")
    return f"stopped and removed ({how}), {code}"
