"""Launch a job: one ``docker run --net=host`` container per node, all or nothing.

``launch(job, inventory)`` is the whole command without the CLI:

0. check the input (job, ``--set``, image, secrets) without contacting anything
   (:func:`clusterctl.run.plan.check_inputs`, exit 2);
1. check before touching anything: preflight every node (SSH, docker, arch,
   disk, devices, interface) and that the master port is free on the master.
   Any problem -> :class:`PreflightFailed` (exit 2), a table of what is wrong
   where, nothing started.  Then the plan is made, once, with the interfaces
   preflight found and the local facts (:func:`local_facts`);
2. with a ``workdir`` (the user's project): its snapshot and requirements layer were made on
   this machine before any node was contacted (:mod:`clusterctl.run.workspace`); now every
   node gets the tree (:func:`clusterctl.code.sync.sync`, only what it lacks), mounted
   read-only at ``/workspace``; then the image goes to the nodes that lack it
   (:func:`clusterctl.cluster.distribute.push_image`);
3. start every node's container in parallel (the plan's argv over the node's
   SSH connection, secrets on stdin as an env file, never in argv).  If any
   node fails to start, the containers already started are removed again and
   :class:`StartFailed` is raised: all or nothing;
4. unless ``detach``: follow and supervise (:mod:`clusterctl.run.supervise`), then
   remove the run's containers (their logs and exit codes are in
   ``runs/<run-id>/`` by then).

A detached run's containers stay until ``clusterctl stop`` (which saves their
logs into ``runs/<run-id>/`` before removing them).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TextIO

from clusterctl.cluster import containers, distribute, engine, sshconfig
from clusterctl.cluster import preflight as pf
from clusterctl.cluster.registry import pull as registry_pull
from clusterctl.cluster.registry import push as registry_push
from clusterctl.cluster.transport import Cluster, CommandResult, NodeConnection, tree
from clusterctl.code import snapshot as code_snapshot
from clusterctl.code import sync as code_sync
from clusterctl.core.deadline import bounded
from clusterctl.core.errors import ClusterctlError, NodeError, UserError
from clusterctl.run import flight, jobs, logs, plan, records, recovery, supervise, watchdog
from clusterctl.run import workspace as workspaces
from clusterctl.run.jobs import Job

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory

START_TIMEOUT = 120.0  # seconds one node's `docker run -d` may take (it may create volumes, devices)


class PreflightFailed(UserError):
    """One or more nodes are not ready; nothing was started (exit 2).

    ``checks`` holds every node's preflight result, for a table of what is wrong where.
    """

    def __init__(self, checks) -> None:
        self.checks = list(checks)
        rows = "\n".join(f"  {c.node}: {why}" for c in self.checks for why in c.problems)
        super().__init__("preflight failed, nothing was started:\n" + rows)


class StartFailed(ClusterctlError):
    """A node could not start its container; the others were removed again (exit 1)."""

    def __init__(self, failures: Mapping[str, str], not_removed: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        self.not_removed = dict(not_removed)
        lines = [f"  {n}: {why}" for n, why in self.failures.items()]
        msg = "could not start the run on every node, so nothing runs (all or nothing):\n" + "\n".join(lines)
        if self.not_removed:
            msg += "\ncould NOT remove the containers already started on: " + ", ".join(
                f"{n} ({why})" for n, why in self.not_removed.items())
        super().__init__(msg)


@dataclass
class RunResult:
    """What ``launch`` returns."""

    run_id: str
    exit_code: int
    record: records.RunRecord
    outcome: supervise.Outcome | None = None  # None when detached

    @property
    def summary(self) -> list[str]:
        return supervise.summary_lines(self.outcome) if self.outcome else []


# --------------------------------------------------------------------------- facts and checks

def local_facts(inventory: Inventory) -> dict[str, object]:
    """What the plan needs to know that clusterctl can tell without contacting a node, as
    keyword arguments of :func:`clusterctl.run.plan.make_plan`: ``master_addr`` (the
    master's ssh-config ``HostName``, what the others connect to), ``addresses`` (each
    node's, where that is an IPv4 address: the containers' ``--add-host`` entries) and
    ``host_env`` (clusterctl's own environment, for listed secrets no layer sets)."""
    resolved = sshconfig.resolve_hosts(n.host for n in inventory.nodes)
    return {"master_addr": resolved[inventory.master.host],
            "addresses": {n.name: resolved[n.host] for n in inventory.nodes if _ipv4(resolved[n.host])},
            "host_env": dict(os.environ)}


def _ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def with_job_port(job: Job, inventory: Inventory, overrides: Mapping[str, str] | None = None):
    """The inventory with the master port the user pinned (:func:`clusterctl.run.plan.pinned_master_port`:
    ``--set MASTER_PORT``, the master's inventory env, the job's) as its ``master_port`` (the
    port preflight checks free on the master and the plan gives rank 0), else the inventory
    as it is (launch then chooses a free port from it up: :func:`master_port`)."""
    pinned = plan.pinned_master_port(job, inventory, overrides)
    if pinned is None or pinned.port == inventory.master_port:
        return inventory
    return replace(inventory, master_port=pinned.port)


def master_port(run_id: str, inventory: Inventory, master_addr: str, pinned: plan.PinnedPort | None,
                listening: Sequence[int], *, note: Callable[[str], None] = lambda _text: None) -> int:
    """The attempt's master port, taken under the runs directory's port lock
    (:func:`clusterctl.run.records.take_master_port`): the pinned one unless a run of this
    runs directory holds it (UserError naming that run and its user); else the first port
    from the inventory's up that nothing listens on (``listening``: the master's ports, as
    preflight read them) and no run holds (``note`` hears why, when it is not the first)."""
    node, first = inventory.master.name, inventory.master_port
    seen: dict[int, records.Holder] = {}

    def choose(held: Mapping[int, records.Holder]) -> int:
        seen.update(held)
        if pinned is not None:
            if pinned.port in held:
                raise UserError(records.held_message(pinned.port, node, held[pinned.port], pinned.where))
            return pinned.port
        return plan.choose_master_port(first, listening, {p: h.words() for p, h in held.items()},
                                       where=node)

    port = records.take_master_port(run_id, master_addr, choose, on_wait=note)
    if pinned is None and port != first:
        why = f"held by {seen[first].words()}" if first in seen else "in use there"
        note(f"master port {port} on {node}: {first} is {why}")
    return port


def hang_timeout_of(job: Job, given: float | None) -> float | None:
    """The run's hang timeout: ``--hang-timeout`` when given, else the job's ``hang_timeout``."""
    return given if given is not None else job.hang_timeout


def hang_settings(job: Job, hang: float | None) -> dict:
    """The watchdog's :class:`~clusterctl.run.supervise.Settings` for the run: ``hang`` (its
    hang timeout), the job's start timeout (default: the longer of ``hang`` and
    :data:`~clusterctl.run.jobs.HANG_START_DEFAULT`) and start line.  Pure."""
    start = job.hang_start_timeout or (max(hang, jobs.HANG_START_DEFAULT) if hang else None)
    return {"hang_timeout": hang, "hang_start_timeout": start, "hang_start_line": job.hang_start_line}


def watchdog_options(hang_timeout: float | None) -> tuple[str, ...]:
    """The ``docker run`` options the hang watchdog needs (none without a hang timeout)."""
    return watchdog.PTRACE_OPTIONS if hang_timeout else ()


def dry_run(job: Job, inventory: Inventory, *, run_id: str | None = None, image: str | None = None,
            overrides: Mapping[str, str] | None = None,
            hang_timeout: float | None = None,
            on_code: Callable[[code_snapshot.Snapshot], None] | None = None,
            workspace=None) -> list[plan.NodePlan]:
    """The plan ``launch`` would run, touching no node (interfaces: the inventory's only).
    With a workdir, the snapshot is taken (the same refusals as launch's) and handed to
    ``on_code``; each node's copy is shown at its ``code_dir`` (unexpanded).  ``workspace``
    (``--rerun``: the recorded code, from this machine's store): that tree, and its image
    when ``image`` is None, exactly as the rerun ships them; no snapshot is taken."""
    run_id = records.check_run_id(run_id) if run_id else records.new_run_id(job.name)
    inventory = with_job_port(job, inventory, overrides)
    inventory = attempt_inventory(inventory, first_nodes(job, inventory)[0])   # as launch: no spare
    code = None
    if workspace is not None:
        image = image or workspace.image
        digest = workspace.tree.digest
        code = plan.CodeMount(digest, {n.name: f"{n.code_dir}/trees/{digest.split(':')[-1]}"
                                       for n in inventory.nodes})
    elif job.workdir is not None:
        snap = code_snapshot.take(job.workdir, limit_bytes=job.max_workdir_size
                                  or code_snapshot.DEFAULT_LIMIT_BYTES)
        if job.requirements is not None:     # its lines are checked too (the engine is not asked)
            from clusterctl.image import deps
            deps.read_requirements(job.requirements)
        if on_code is not None:
            on_code(snap)
        code = plan.CodeMount(snap.digest, {n.name: f"{n.code_dir}/trees/{snap.digest.split(':')[-1]}"
                                            for n in inventory.nodes})
    return plan.make_plan(job, inventory, run_id=run_id, image=image, overrides=overrides,
                          extra_docker_args=watchdog_options(hang_timeout_of(job, hang_timeout)),
                          init_nodes=[n.name for n in inventory.nodes],   # as on nodes that have it
                          code=code, **local_facts(inventory))


def preflight(cluster: Cluster, devices: Mapping[str, Sequence[str]], *,
              image_ref: str | None = None, compare_image: bool = True,
              on_warning: Callable[[str, str], None] | None = None,
              choose_port: bool = False, wants_device: str | None = None,
              toolkit_version: str | None = None, processes: Mapping[str, int] | None = None
              ) -> tuple[dict[str, str], list[str], dict[str, str | None], list[int]]:
    """Check every node before anything starts; returns the interface found per node,
    the nodes that have Docker's init binary (their containers get ``--init``), each
    node's ID of ``image_ref`` (None: the node lacks it, or no ``image_ref``) and the ports
    something listens on on the master (``choose_port``: a busy master port is no problem,
    the caller chooses another from these; else it is one, naming who holds it).

    SSH, docker, arch, disk, the devices each node's container will get
    (``devices``: node -> ``--device`` specs, :func:`clusterctl.run.plan.node_devices` and
    :func:`~clusterctl.run.plan.job_devices`),
    the interface, the master port free on the master, and what must match across the
    nodes (:func:`clusterctl.cluster.preflight.apply_consistency`: ``image_ref``'s ID where
    given and ``compare_image``, Docker, kernel, driver, clock).  ``wants_device`` (the
    accelerator kind the job computes on: :func:`clusterctl.run.plan.job_device`) makes
    what the job cannot run without on a GPU or MLU node a problem (no driver, no container
    toolkit or CDI spec, a driver older than ``toolkit_version`` needs), and ``processes``
    (node -> ranks, :func:`clusterctl.run.plan.node_processes`) is compared with the node's
    devices (:func:`clusterctl.cluster.preflight.judge_processes`).  PreflightFailed naming
    every problem on every node (exit 2); ``on_warning(node, text)`` gets each warning (e.g.
    a clock skew).
    """
    host_paths = {node: [d.split(":", 1)[0] for d in specs] for node, specs in devices.items()}
    checks = pf.run_preflight(cluster, devices_for=lambda node: host_paths.get(node.name, []),
                              check_master_port=True, image_ref=image_ref,
                              compare_image=compare_image,
                              master_port_mode="choose" if choose_port else "pinned",
                              wants_device=wants_device, toolkit_version=toolkit_version)
    if processes:
        pf.judge_processes(checks, processes)
    if any(c.problems for c in checks):
        raise PreflightFailed(checks)
    for c in checks:
        for warning in c.warnings:
            if on_warning is not None:
                on_warning(c.node, warning)
    return (pf.interfaces(checks), pf.init_nodes(checks), {c.node: c.image_id for c in checks},
            checks[0].listening_ports or [])


# --------------------------------------------------------------------------- start

#: ``docker run -d ...`` (the arguments), then ``docker inspect`` of the container it started,
#: in one SSH channel (a channel costs this machine ~2 ms of CPU: issue 12).  A constant: the
#: argv arrives as positional parameters, its first the node's runtime (``docker``,
#: ``podman``), which inspects too; stdin (``--env-file /dev/stdin``) reaches docker run.
#: The inspect prints only name, state and labels: never the env (secrets), which would
#: otherwise cross every node of a tree on the way back.
_START_SCRIPT = ('c=$("$@") || exit; printf "%s\\n" "$c"; "$1" inspect --type container --format '
                 '\'[{"Name":{{json .Name}},"State":{{json .State}},"Config":{"Labels":{{json .Config.Labels}}}}]\' "$c"')


def start_all(cluster: Cluster, plans: Sequence[plan.NodePlan], *, timeout: float = START_TIMEOUT,
              last: bool = False) -> dict[str, containers.ContainerState | None]:
    """Start every node's container in parallel; all or nothing (StartFailed).  Returns each
    node's container state as ``docker inspect`` saw it just after the start (None: unknown).
    Through the tree when the inventory asks for it (:mod:`clusterctl.cluster.transport.tree`);
    ``last``: no tree call follows in this command (a detached launch), so the start ends
    the nodes' logins kept since preflight as it ends (no call of its own to end them)."""
    by_node = {p.node: p for p in plans}

    def started(node: str, r: CommandResult) -> containers.ContainerState | None:
        p = by_node[node]
        CommandResult(node, list(p.argv), r.exit_code, r.stdout, r.stderr).check()  # its words
        _, _, inspected = r.stdout.partition("\n")
        try:
            found = json.loads(inspected or "[]")
        except ValueError:
            return None
        return containers.state_from_inspect(node, found[0]) if found else None

    ran = tree.run_commands(cluster, {p.node: [tree.Command(("sh", "-c", _START_SCRIPT, "sh", *p.argv), p.stdin)]
                                      for p in plans}, timeout=timeout, last=last)
    results: dict[str, containers.ContainerState | None | NodeError] = {}
    for node, r in ran.items():
        try:
            results[node] = r if isinstance(r, NodeError) else started(node, r[0])
        except NodeError as e:
            results[node] = e
    failed = {n: r.reason for n, r in results.items() if isinstance(r, NodeError)}
    if failed:
        # "created but not started" containers exist too (a bad device, a port): remove on every node
        not_removed = containers.remove_run_containers(cluster, plans[0].run_id, list(by_node))
        raise StartFailed(failed, {n: w for n, w in not_removed.items() if n not in failed})
    return {n: r if isinstance(r, containers.ContainerState) else None for n, r in results.items()}


# --------------------------------------------------------------------------- the record

def new_record(job: Job, inventory: Inventory, plans: Sequence[plan.NodePlan], run_id: str, *,
               image_id: str | None, detached: bool, argv: Sequence[str] = ()
               ) -> records.RunRecord:
    """The run.json of a run about to start (env masked: secrets never reach the disk)."""
    first = plans[0]
    secrets = plan.secret_values(plans)  # `--set HF_TOKEN=...` is in clusterctl's own argv too
    return records.RunRecord(
        run_id=run_id, job=job.name, inventory=str(inventory.path.absolute()),
        image=first.image, image_id=image_id,
        master_addr=first.env.get("MASTER_ADDR"), master_port=int(first.env.get("MASTER_PORT", 0)) or None,
        detached=detached, argv=plan.mask_argv(argv, {k for p in plans for k in p.secrets}, secrets),
        nodes=[records.NodeRecord(node=p.node, host=p.host, rank=p.rank, container=p.container,
                               env=plan.mask_env(p.env, p.secrets), flight_dir=p.flight_dir)
               for p in plans],
    )


def record_outcome(record: records.RunRecord, outcome: supervise.Outcome) -> None:
    """Fill the record with how the run ended."""
    record.state = outcome.state
    record.exit_code = outcome.exit_code
    record.finished = records.utcnow()
    if outcome.state == "interrupted":
        record.stopped_by = stopped_by(outcome)
    record.hang = outcome.hang.record() if outcome.hang else None
    record.flight = {n: v for n, v in outcome.flight.items()}
    record.collective_errors = [f"{f.node}[{f.rank}]| {f.line}" for f in outcome.collective_errors]
    for n in record.nodes:
        st = outcome.containers.get(n.node)
        n.exit_code = outcome.exit_codes.get(n.node)
        if n.node in outcome.lost:
            n.state = "lost"
        elif st is not None:
            n.state, n.started, n.finished = st.status, st.started, st.finished
        if n.node in outcome.stopped:
            n.state, n.stopped_by = "stopped", stopped_by(outcome)
    f = outcome.first_failure
    if f is not None:
        record.first_failure = records.FailureRecord(
            node=f.node, rank=f.rank, kind=f.kind, exit_code=f.exit_code, time=f.when,
            reason=f.reason, last_lines=outcome.last_lines.get(f.node, []))


def stopped_by(outcome: supervise.Outcome) -> str:
    """Who stopped the containers launch's teardown stopped, in words for the record."""
    f = outcome.first_failure
    if outcome.state == "interrupted" or f is None:
        return f"clusterctl launch ({'Ctrl-C' if outcome.exit_code == supervise.INTERRUPTED_EXIT else 'SIGTERM'})"
    return f"clusterctl launch (fail-fast after {f.node}[{f.rank}] " + (
        "was lost)" if f.kind == "lost" else f"exited {f.exit_code})")


def mark_running(cluster: Cluster, record: records.RunRecord,
                 known: Mapping[str, containers.ContainerState | None] | None = None) -> None:
    """Record each container's start time (best effort, bounded: it is only for the record);
    ``known``: the states :func:`start_all` read already, only the others are inspected."""
    by_node = {n.node: n for n in record.nodes}
    known = {n: st for n, st in (known or {}).items() if st is not None and n in by_node}

    def inspect(conn: NodeConnection):
        return bounded(lambda: containers.inspect_containers(conn, [by_node[conn.name].container]), 10.0)

    missing = [n for n in by_node if n not in known]
    found = cluster.map(inspect, nodes=missing) if missing else {}
    for node, states in {**found, **{n: [st] for n, st in known.items()}}.items():
        if isinstance(states, list) and states:
            by_node[node].state, by_node[node].started = states[0].status, states[0].started
    record.state = "running"


# --------------------------------------------------------------------------- signals

@contextmanager
def stop_on_signals(sup_event: threading.Event, note: Callable[[str], None]):
    """SIGINT/SIGTERM set ``sup_event`` (the supervisor tears down) instead of raising.

    Only possible in the main thread; elsewhere the caller sets the event itself.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        note(signal.Signals(signum).name)
        sup_event.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --------------------------------------------------------------------------- launch

def launch(job: Job, inventory: Inventory, *, image: str | None = None,
           overrides: Mapping[str, str] | None = None,
           run_id: str | None = None, detach: bool = False,
           accept_new_host_keys: bool | None = None, stream: TextIO | None = None,
           color: bool | None = None, settings: supervise.Settings | None = None,
           stop_event: threading.Event | None = None, handle_signals: bool = False,
           push: bool = True, progress=None, argv: Sequence[str] = (),
           on_started: Callable[[records.RunRecord], None] | None = None,
           on_warning: Callable[[str, str], None] | None = None,
           hang_timeout: float | None = None,
           workspace: workspaces.Workspace | None = None,
           on_note: Callable[[str], None] | None = None,
           spec: dict | None = None, max_restarts: int | None = None,
           checkpoint: str | None = None, supervised: bool = False,
           resume: records.RunRecord | None = None,
           recheck: Callable[[object], Mapping[str, str]] | None = None) -> RunResult:
    """Run ``job`` on every node of ``inventory``; see the module docstring for the steps.

    ``stream``: where the merged log goes (default stdout; pass an
    ``io.StringIO()`` to keep it quiet - runs/<id>/ gets it anyway).
    ``stop_event``: set it to stop the run as Ctrl-C would (the library's way to
    interrupt); ``handle_signals``: SIGINT/SIGTERM set it (the CLI does this).
    ``on_started(record)`` is called once every container of an attempt runs; ``on_warning(node, text)``
    with each preflight warning (nodes that differ in Docker, kernel, driver; a clock
    skew).  Without ``push`` the nodes' copies of the image are compared by ID (with push,
    push itself makes every node's ID the local one).  ``hang_timeout`` (seconds; default:
    the job's ``hang_timeout``): the hang watchdog (:mod:`clusterctl.run.watchdog`); a
    followed run only.  A job with a ``workdir`` ships it (``workspace``: the code prepared
    already, e.g. a rerun's from :func:`clusterctl.run.workspace.rerun`; default: prepared
    here); ``on_note(text)`` hears what was shipped where, and each restart.  ``spec``: the
    job as given, kept in run.json for ``launch --rerun``.  ``max_restarts`` and
    ``checkpoint`` win over the job's keys: with restarts, a failed attempt is followed by
    another (:mod:`clusterctl.run.recovery` decides; spares replace excluded nodes).
    ``supervised``: this process is a detached run's supervisor (:mod:`clusterctl.run.detached`).
    ``resume``: the record of a run whose launch or supervisor died: its running attempt is
    followed again (its containers adopted, its logs rewritten whole from them) or, when it
    died between attempts, the next attempt starts; then as any run.  ``recheck(inventory)``:
    a check of the next attempt's nodes before each restart, besides preflight, returning
    the nodes to exclude and why (the CLI passes the bounded collective check for a job with
    ``collective_check``).
    Returns a RunResult whose ``exit_code`` is the job's true outcome.
    """
    hang = hang_timeout_of(job, hang_timeout)
    policy = recovery.Policy.of(job, max_restarts=max_restarts, checkpoint=checkpoint)
    if hang and detach:
        raise UserError("a hang timeout needs a followed run: clusterctl watches the output while "
                        "it follows it; leave out --detach (or the hang timeout).")
    if policy.recovers and detach:
        raise UserError("restarts need a followed run: clusterctl restarts the job while it "
                        "follows it; leave out --detach (or --max-restarts / max_restarts).")
    settings = replace(settings or supervise.Settings(), **hang_settings(job, hang))
    if policy.recovers:         # a lost node is noticed within seconds (issue 22: <= 10 s)
        settings = replace(settings, **RECOVERY_PROBES)
    run_id = resume.run_id if resume is not None else _fresh_run_id(run_id, job)
    inventory = with_job_port(job, inventory, overrides)
    if resume is not None:
        nodes_now, spares = resumed_nodes(resume), list(resume.spares)
    else:
        nodes_now, spares = first_nodes(job, inventory)
    stop_event = stop_event or threading.Event()
    first = attempt_inventory(inventory, nodes_now)
    facts = local_facts(first)
    # bad input (job, --set, image, secrets) is reported before any node is contacted
    ref = plan.check_inputs(job, first, run_id=run_id, image=image, overrides=overrides,
                            master_addr=facts["master_addr"], host_env=facts["host_env"],
                            extra_docker_args=watchdog_options(hang))
    note = on_note or (lambda _text: None)
    if workspace is None and job.workdir is not None:
        workspace = workspaces.prepare(job, ref, log=note)
    if workspace is not None:
        note(f"code: {workspaces.describe(workspace)}")
        if workspace.image:
            image = ref = workspace.image
    image_id = local_image_id(ref) if push else None
    pushed = None
    if push and inventory.registry is not None and resume is None:
        # the head pushes once; every node pulls by digest (and runs exactly that digest)
        pushed = registry_push.push(ref, inventory.registry)
        note(f"image {ref} pushed to {inventory.registry}: {pushed.reference}")
        image = ref = pushed.reference
    run = _Run(job=job, inventory=inventory, policy=policy, run_id=run_id, image=image, ref=ref,
               image_id=image_id, overrides=overrides, hang=hang, push=push, progress=progress,
               workspace=workspace, note=note, on_warning=on_warning,
               accept_new_host_keys=accept_new_host_keys, nodes=nodes_now, spares=spares,
               supervised=supervised, recheck=recheck, pushed=pushed, detach=detach)
    adopt = False
    if resume is not None:
        adopt = _take_over(run, resume)
    elif policy.checkpoint and policy.recovers:
        with Cluster(first, accept_new_host_keys=accept_new_host_keys) as c:
            run.marks.append(checkpoint_mark(c, policy.checkpoint))
    caught: list[str] = []
    with ExitStack() as signals:
        while True:
            if adopt:          # the running attempt of a resumed run: its containers run already
                cluster, plans = _adopted(run, resume)
            else:
                prepared = _prepare_attempt(run)
                if prepared is None:                 # not enough nodes passed their checks
                    return _end_without_attempt(run)
                cluster, plans = prepared
            with cluster:
                record = run.record if adopt else _record_attempt(run, plans, detach=detach, argv=argv,
                                                                  spec=spec)
                if handle_signals and not signals._exit_callbacks:
                    signals.enter_context(stop_on_signals(stop_event, caught.append))
                try:
                    if not adopt:
                        start_recorded(cluster, plans, record, last=detach)
                except StartFailed as e:
                    if run.attempt == 0 or not policy.recovers:
                        raise
                    outcome = None
                    end = recovery.AttemptEnd(run.attempt, "start-failed", 1, kind="check",
                                              lost=tuple(e.failures))
                else:
                    run.mark("running")
                    if on_started is not None:
                        on_started(record)
                    if detach and not stop_event.is_set():
                        return RunResult(run_id, 0, record)
                    outcome = follow(cluster, plans, record, stream=stream, color=color, settings=settings,
                                     stop_event=stop_event, interrupted=lambda: (caught or ["SIGINT"])[-1])
                    remove_finished(cluster, plans, outcome)
                    outcome.flight = flight.collect(cluster, record, skip=outcome.lost)
                    end = attempt_end(run.attempt, outcome)
                    if policy.checkpoint and policy.recovers and outcome.state not in ("succeeded",):
                        end = replace(end, checkpoint=checkpoint_mark(cluster, policy.checkpoint, outcome.lost))
            adopt = False
            result = _after_attempt(run, record, outcome, end)
            if result is not None:
                return result


def resumed_nodes(record: records.RunRecord) -> list[str]:
    """The nodes a resumed run goes on with: its attempt's, or, when it died between
    attempts, the next attempt's (the excluded ones replaced as recorded)."""
    if record.state == "restarting" and record.next_nodes:
        return list(record.next_nodes)
    return [n.node for n in record.nodes]


def _take_over(run: _Run, record: records.RunRecord) -> bool:
    """Fill ``run`` from a resumed record; True when its attempt is to be followed again
    (False: it died between attempts, the next one starts)."""
    run.record = record
    run.attempt = record.attempt
    run.excluded = dict(record.excluded)
    run.history = [recovery.AttemptEnd(**a.end) for a in record.attempts if a.end]
    run.marks = [record.checkpoint_start] if record.checkpoint_start is not None else []
    record.launcher = records.this_launcher()
    record.supervised = run.supervised
    if record.state == "restarting":
        run.attempt += 1
        run.note(f"resume {record.run_id}: it died between attempts; attempt {run.attempt} starts")
        return False
    run.note(f"resume {record.run_id}: following attempt {record.attempt} again")
    return True


def _adopted(run: _Run, record: records.RunRecord):
    """The open cluster and the plans (names, ranks, secrets to mask) of a running attempt
    taken over; its logs are rewritten whole from the containers while they are followed."""
    inv = attempt_inventory(run.inventory, [n.node for n in record.nodes])
    if record.master_port:     # the port the attempt was given (its env, as it runs)
        inv = replace(inv, master_port=record.master_port)
    cluster = Cluster(inv, accept_new_host_keys=run.accept_new_host_keys).__enter__()
    cluster.tree_reuse = True
    plans = plan.make_plan(run.job, inv, run_id=run.run_id, image=run.image, overrides=run.overrides,
                           extra_docker_args=watchdog_options(run.hang), **local_facts(inv),
                           attempt=plan.Attempt(run.attempt, tuple(run.excluded), run.policy.checkpoint))
    d = record.attempt_dir()
    for f in [d / records.MERGED_LOG, *(record.log_path(n.node) for n in record.nodes)]:
        f.unlink(missing_ok=True)
    record.save()
    return cluster, plans


#: The supervisor's probes of a run that may restart: a node that stops answering is
#: declared lost within about 6 s (the default's 15 s suits a run that ends at its first
#: failure, where a false alarm costs the run).
RECOVERY_PROBES = {"probe_interval": 1.0, "probe_timeout": 3.0, "lost_after": 5.0}


@dataclass
class _Run:
    """One launch's state across its attempts."""

    job: object
    inventory: object
    policy: recovery.Policy
    run_id: str
    image: str | None
    ref: str
    image_id: str | None
    overrides: Mapping[str, str] | None
    hang: float | None
    push: bool
    progress: object
    workspace: workspaces.Workspace | None
    note: Callable[[str], None]
    on_warning: Callable[[str, str], None] | None
    accept_new_host_keys: bool | None
    nodes: list[str]
    spares: list[str]
    attempt: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    history: list[recovery.AttemptEnd] = field(default_factory=list)
    marks: list[str | None] = field(default_factory=list)    # the checkpoint dir's newest file, at the start
    record: records.RunRecord | None = None
    times: dict[str, float] = field(default_factory=dict)    # phase -> epoch seconds, this attempt
    last_check_failure: dict[str, str] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)       # bytes of code sent per node, first attempt
    supervised: bool = False
    recheck: Callable[[object], Mapping[str, str]] | None = None
    pushed: registry_push.Pushed | None = None  # the image in the inventory's registry (nodes pull it)
    detach: bool = False

    def mark(self, phase: str) -> None:
        self.times[phase] = time.time()


def first_nodes(job: Job, inventory: Inventory) -> tuple[list[str], list[str]]:
    """The nodes a fresh run starts on, in rank order, and its spares: the one choice launch
    makes and ``--dry-run`` shows (spares and a job's ``nnodes`` MIN:MAX applied)."""
    try:
        return recovery.initial_nodes([n.name for n in inventory.active], [n.name for n in inventory.spares],
                                      max_nodes=job.max_nodes, min_nodes=job.min_nodes)
    except recovery.NotEnoughNodes as e:
        raise UserError(f"{inventory.path}: {e}; nothing was started.") from None


def attempt_inventory(inventory: Inventory, names: Sequence[str]):
    """The inventory of one attempt: ``names`` in rank order (the first is the master)."""
    by_name = {n.name: n for n in inventory.nodes}
    nodes = [by_name[name].model_copy(update={"master": i == 0, "spare": False})
             for i, name in enumerate(names)]
    return replace(inventory, nodes=nodes)


def _prepare_attempt(run: _Run):
    """Check this attempt's nodes (and ship the code, push the image); nodes that fail their
    checks are replaced by spares, again and again, until a set passes.  Returns the open
    cluster and the plans, or None when not enough nodes are left (the run ends)."""
    while True:
        inv = attempt_inventory(run.inventory, run.nodes)
        cluster = Cluster(inv, accept_new_host_keys=run.accept_new_host_keys).__enter__()
        # shipping the code opens every node's own connection: then `ssh.tree: auto` sends
        # preflight and start on those too (the tree would only add).  A followed run goes
        # through the tree as a detached one does (run.treefollow)
        cluster.each_node_anyway = run.workspace is not None
        # preflight, start and, followed, the follow and the fail-fast stop: one login per
        # node for all of them (transport.tree: the nodes keep their logins to each other)
        cluster.tree_reuse = True
        try:
            plans = _check_and_plan(run, cluster)
            _collective_recheck(run, inv)
            return cluster, plans
        except (PreflightFailed, CollectiveFailed, PushFailed) as e:
            cluster.close()
            bad = _failed_nodes(e)
            if run.attempt == 0 and not run.spares:
                raise          # as without spares: a table of what is wrong where, exit 2
            run.note(f"attempt {run.attempt}: " + "; ".join(f"{n} {why}" for n, why in bad.items()))
            try:
                _replace(run, bad)
            except recovery.NotEnoughNodes as gone:
                if run.attempt == 0:
                    raise e from None
                run.last_check_failure = {"reason": str(gone)}
                return None
        except BaseException:
            cluster.close()
            raise


def _failed_nodes(e: ClusterctlError) -> dict[str, str]:
    """The nodes a failed check or push names, and why (a node lost in the middle of the
    relay push is one like a node failing preflight: a spare takes its rank).  Pure."""
    if isinstance(e, CollectiveFailed):
        return dict(e.bad)
    if isinstance(e, PushFailed):
        return {n: f"could not get the image: {why}" for n, why in e.failures.items()}
    return {c.node: "failed its checks: " + "; ".join(c.problems) for c in e.checks if c.problems}


class CollectiveFailed(ClusterctlError):
    """The collective re-check before a restart named nodes (slow or broken)."""

    def __init__(self, bad: Mapping[str, str]) -> None:
        self.bad = dict(bad)
        super().__init__("the collective check named: " + "; ".join(f"{n} {w}" for n, w in bad.items()))


def _collective_recheck(run: _Run, inv) -> None:
    """Before a restart, when the caller gave a ``recheck`` (a job with ``collective_check``:
    :func:`clusterctl.run.collective.check.recheck`, bounded): CollectiveFailed naming the
    nodes it found slow or broken."""
    if run.recheck is None or run.attempt == 0 or len(inv.nodes) < 2:
        return
    bad = run.recheck(inv)
    if bad:
        raise CollectiveFailed(bad)


def _replace(run: _Run, exclude: Mapping[str, str]) -> dict[str, str]:
    """Exclude nodes for the rest of the run; spares take their ranks (NotEnoughNodes)."""
    nodes, spares, swaps = recovery.replace_nodes(run.nodes, run.spares, exclude,
                                                  min_nodes=run.policy.min_nodes)
    run.excluded.update(exclude)
    run.nodes, run.spares = nodes, spares
    for old, new in swaps.items():
        run.note(f"{new} (spare) takes the place of {old} (rank {run.nodes.index(new)})")
    return swaps


def _check_and_plan(run: _Run, cluster: Cluster) -> list[plan.NodePlan]:
    """Preflight (code shipped meanwhile, spares readied in the first attempt), the plan,
    and the image pushed where it is missing."""
    job, inv = run.job, cluster.inventory
    extra = plan.job_devices(job)
    facts = local_facts(inv)
    pinned = plan.pinned_master_port(job, inv, run.overrides)
    if pinned is not None:      # a run of this runs directory holds it: say which, before any check
        held = records.port_holders(facts["master_addr"], skip_run=run.run_id).get(pinned.port)
        if held is not None:
            raise UserError(records.held_message(pinned.port, inv.master.name, held, pinned.where))
    warm = bool(run.attempt == 0 and run.policy.recovers and run.spares)
    device, toolkit = plan.job_device(job)
    # the code travels while preflight checks the nodes (a copy on a node is a cache:
    # when preflight fails, nothing was started all the same)
    # (leaving the pool waits for the sync, also when preflight raises)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="ship-code") as pool:
        shipping = pool.submit(ship_code, cluster, run.workspace, run.note) if run.workspace else None
        warming = pool.submit(_spares_code, run) if warm and run.workspace else None
        # with push, preflight's docker channel also reads each node's ID of the image, so
        # push skips the nodes that have it without a channel of its own (issue 12)
        interfaces, init_nodes, node_ids, listening = preflight(
            cluster, {n.name: [*plan.node_devices(job, n), *extra] for n in inv.nodes},
            image_ref=run.ref, compare_image=not run.push, on_warning=run.on_warning,
            choose_port=pinned is None, wants_device=device,
            toolkit_version=toolkit if run.image is None else None,   # the target's own image
            processes=plan.node_processes(job, inv, run.overrides) if device else None)
        code, sent = shipping.result() if shipping is not None else (None, {})
        if warming is not None:
            warming.result()
    run.mark("checked")
    if run.attempt == 0:
        run.sent = sent
    port = master_port(run.run_id, inv, facts["master_addr"], pinned, listening, note=run.note)
    inv = replace(inv, master_port=port)
    plans = plan.make_plan(job, inv, run_id=run.run_id, image=run.image, interfaces=interfaces,
                           overrides=run.overrides, extra_docker_args=watchdog_options(run.hang),
                           init_nodes=init_nodes, code=code, **facts,
                           attempt=plan.Attempt(run.attempt, tuple(run.excluded), run.policy.checkpoint))
    if run.attempt == 0:
        for name in plan.unmasked_secrets(plans):
            run.note(f"warning: secret {name} is not masked in output: its value is shorter than "
                     f"{plan.MASK_MIN_CHARS} characters, a number or an address, which masking "
                     "would rewrite everywhere (it still reaches the containers only through "
                     "the env file)")
    if run.push:
        have = [n for n, i in node_ids.items() if i is not None and i == run.image_id]
        if run.pushed is not None:   # from the registry, by digest (spares too: hot spares)
            _pull_image(run, [*run.nodes, *(run.spares if warm else [])], have)
        elif warm:   # the spares get the image in the same relay chain, so they are hot spares
            _push_with_spares(run, plans[0].image, have)
        else:
            push_image(cluster, plans[0].image, run.progress, have=have)
    return plans


def _pull_image(run: _Run, nodes: Sequence[str], have: Sequence[str]) -> None:
    """Every node of ``nodes`` that lacks the image by digest gets it: its layers through the
    relay push (the head's link carries the image once, not once per node), then a pull by
    digest from the inventory's registry, which then finds the image ID present and fetches
    only the manifest (:func:`clusterctl.cluster.registry.pull.pull`).  PushFailed naming
    a run's node that could not (a spare is only named)."""
    progress = run.progress or distribute.NoProgress()
    for node in have:
        progress.started(node, "skip: same image ID")
        progress.finished(distribute.PushResult(node, "skipped"))
    rest = [n for n in nodes if n not in set(have)]
    if not rest:
        return
    registry = run.inventory.registry
    failed: dict[str, str] = {}
    with Cluster(attempt_inventory(run.inventory, rest), accept_new_host_keys=run.accept_new_host_keys) as c:
        try:
            push_image(c, run.pushed.image, progress)
        except PushFailed as e:
            failed.update(e.failures)
        results = registry_pull.pull(c, run.pushed.reference, run.pushed.image_id,
                                     registry=registry.address, auth=registry_push.credentials(registry),
                                     nodes=[n for n in rest if n not in failed], progress=progress)
    failed.update({r.node: r.error or r.describe() for r in results if not r.ok})
    for node in [n for n in failed if n in set(run.spares)]:
        run.note(f"spare {node}: the image could not be pulled now ({failed.pop(node)}); it is when needed")
    if failed:
        raise PushFailed(failed)


def _spares_code(run: _Run) -> None:
    """Give the spares the code before they are needed (best effort: a spare that cannot take
    it now gets it when it must take a rank)."""
    with Cluster(attempt_inventory(run.inventory, run.spares),
                 accept_new_host_keys=run.accept_new_host_keys) as spares:
        failed = {n: r.reason for n, r in code_sync.sync(spares, run.workspace.tree).items()
                  if isinstance(r, NodeError)}
    for node, why in failed.items():
        run.note(f"spare {node}: the code could not be put there now ({why}); it is when needed")


def _push_with_spares(run: _Run, ref: str, have: Sequence[str]) -> None:
    """Push to the run's nodes and its spares at once; a spare that fails is only named
    (it is checked again when it must take a rank), a run's node that fails fails the push."""
    inv = attempt_inventory(run.inventory, [*run.nodes, *run.spares])
    with Cluster(inv, accept_new_host_keys=run.accept_new_host_keys) as both:
        try:
            push_image(both, ref, run.progress, have=have)
        except PushFailed as e:
            mine = {n: why for n, why in e.failures.items() if n not in set(run.spares)}
            if mine:
                raise PushFailed(mine) from None
            for node, why in e.failures.items():
                run.note(f"spare {node}: the image could not be put there now ({why}); it is when needed")


def _record_attempt(run: _Run, plans: Sequence[plan.NodePlan], *, detach: bool, argv: Sequence[str],
                    spec: dict | None) -> records.RunRecord:
    """The run's record with this attempt in it (made at the first attempt), saved."""
    fresh = new_record(run.job, run.inventory, plans, run.run_id, image_id=run.image_id,
                       detached=detach, argv=argv)
    record = run.record
    if record is None:
        record = run.record = fresh
        if not detach:   # a later command can tell that this process died without an outcome
            record.launcher = records.this_launcher()
        record.hang_timeout = run.hang
        if run.pushed is not None:
            record.registry, record.image_digest = str(run.inventory.registry), run.pushed.digest
        if run.workspace is not None:
            record.code = workspaces.code_record(run.workspace, run.sent)
        record.spec = spec
        record.max_restarts = run.policy.max_restarts
        record.checkpoint = run.policy.checkpoint
        record.supervised = run.supervised
        record.checkpoint_start = run.marks[0] if run.marks else None
    else:
        record.nodes, record.master_addr, record.master_port = fresh.nodes, fresh.master_addr, fresh.master_port
        record.state, record.exit_code, record.finished, record.first_failure = "starting", None, None, None
    record.attempt = run.attempt
    record.excluded = dict(run.excluded)
    record.spares = list(run.spares)
    if run.policy.recovers or run.attempt:
        record.attempts.append(records.AttemptRecord(attempt=run.attempt, master_addr=fresh.master_addr,
                                                     nodes=[n.model_copy() for n in record.nodes]))
    record.save()
    return record


def attempt_end(attempt: int, outcome: supervise.Outcome) -> recovery.AttemptEnd:
    """How an attempt ended, for :func:`clusterctl.run.recovery.decide`."""
    f = outcome.first_failure
    if outcome.state == "hung":
        odd = tuple(sorted({o.stack.node for o in (outcome.hang.odd if outcome.hang else [])}))
        return recovery.AttemptEnd(attempt, "hung", outcome.exit_code, kind="hang", blamed=odd,
                                   lost=tuple(outcome.lost))
    if f is None:
        return recovery.AttemptEnd(attempt, outcome.state, outcome.exit_code, lost=tuple(outcome.lost))
    last = outcome.last_lines.get(f.node, [])
    return recovery.AttemptEnd(attempt, outcome.state, outcome.exit_code, node=f.node, kind=f.kind,
                               last_line=last[-1] if last else "", lost=tuple(outcome.lost))


def _after_attempt(run: _Run, record: records.RunRecord, outcome: supervise.Outcome | None,
                   end: recovery.AttemptEnd) -> RunResult | None:
    """Record how the attempt ended and decide: the RunResult when the run ends, else None
    (the next attempt's nodes are set)."""
    run.history.append(end)
    if outcome is not None:
        record_outcome(record, outcome)
    else:
        record.state, record.exit_code, record.finished = "start-failed", 1, records.utcnow()
    decision = recovery.decide(run.history, run.policy, excluded=run.excluded,
                               initial_checkpoint=run.marks[0] if run.marks else None)
    swaps: dict[str, str] = {}
    if decision.action == "restart":
        try:
            swaps = _replace(run, decision.exclude)
        except recovery.NotEnoughNodes as e:
            decision = recovery.Decision("end", recovery.NOT_ENOUGH_NODES, f"not enough nodes: {e}",
                                         exclude=decision.exclude)
            run.excluded.update(decision.exclude)
    else:
        run.excluded.update(decision.exclude)
    if record.attempts:
        a = record.attempts[-1]
        a.state, a.exit_code, a.finished = record.state, record.exit_code, record.finished
        a.nodes = [n.model_copy() for n in record.nodes]
        a.first_failure = record.first_failure
        a.ended = _ended_words(end)
        a.then = decision.reason if decision.action == "end" else decision.reason
        a.excluded, a.replaced, a.checkpoint = dict(decision.exclude), swaps, end.checkpoint
        a.timings = _timings(end, outcome)
        a.end = dataclasses.asdict(end)
    record.excluded = dict(run.excluded)
    record.spares = list(run.spares)
    if decision.action == "end":
        _clean_excluded(run)
        if run.policy.recovers and decision.exit_code != record.exit_code:
            record.state = "failed"
        record.exit_code = decision.exit_code
        if run.attempt or decision.exit_code in (recovery.RESTARTS_EXHAUSTED, recovery.CRASH_LOOP,
                                                 recovery.NOT_ENOUGH_NODES):
            record.note = decision.reason
        record.save()
        if run.attempt or run.policy.recovers:
            run.note(f"run {run.run_id}: {decision.reason} (exit {decision.exit_code})")
        return RunResult(run.run_id, decision.exit_code, record, outcome)
    record.state = "restarting"      # between attempts: nothing runs, the run goes on
    record.next_nodes = list(run.nodes)
    record.save()
    run.attempt += 1
    run.times = {}
    run.note(f"attempt {run.attempt - 1} ended ({_ended_words(end)}): {decision.reason}; "
             f"attempt {run.attempt} on {', '.join(run.nodes)}")
    return None


def _clean_excluded(run: _Run) -> None:
    """At the end of a run: what it left on the nodes it excluded while their containers ran
    (a link cut, an engine dead; such a node may answer again by now) is removed, best
    effort and bounded; what could not be is named (``clusterctl stop RUN`` later)."""
    known = {n.name for n in run.inventory.nodes}
    nodes = [n for n in run.excluded if n in known]
    if not nodes:
        return
    try:
        with Cluster(attempt_inventory(run.inventory, nodes), connect_timeout=5.0,
                     accept_new_host_keys=run.accept_new_host_keys) as c:
            left = containers.remove_run_containers(c, run.run_id, nodes, timeout=5.0)
    except ClusterctlError as e:
        left = dict.fromkeys(nodes, str(e))
    for node, why in left.items():
        run.note(f"{node} (excluded): this run's containers there could not be removed now "
                 f"({why}); `clusterctl stop {run.run_id} --nodes ...` removes them when it answers")


def _end_without_attempt(run: _Run) -> RunResult:
    """The run ends because the nodes left after a failure did not pass their checks."""
    _clean_excluded(run)
    record = run.record
    reason = "not enough nodes: " + run.last_check_failure.get("reason", "")
    if record.attempts:
        record.attempts[-1].then += f"; then {reason}"
    record.state, record.exit_code, record.note = "failed", recovery.NOT_ENOUGH_NODES, reason
    record.excluded, record.finished = dict(run.excluded), records.utcnow()
    record.save()
    run.note(f"run {run.run_id}: {reason} (exit {recovery.NOT_ENOUGH_NODES})")
    return RunResult(run.run_id, recovery.NOT_ENOUGH_NODES, record, None)


def _ended_words(end: recovery.AttemptEnd) -> str:
    if end.state == "succeeded":
        return "succeeded"
    if end.kind == "lost":
        return f"{end.node} lost"
    if end.kind == "hang":
        return "hung" + (f" (odd: {', '.join(end.blamed)})" if end.blamed else "")
    if end.kind == "check":
        return f"start failed on {', '.join(end.lost)}"
    if end.node:
        return f"{end.node} {records.describe_exit(end.exit_code)}"
    return f"{end.state} (exit {end.exit_code})"


def _timings(end: recovery.AttemptEnd, outcome: supervise.Outcome | None) -> dict[str, float]:
    """Epoch seconds of the attempt's end: the failure (by its node's clock or last sign of
    life), when it was noticed, and when every container was stopped."""
    out: dict[str, float] = {}
    if outcome is None:
        return out
    if outcome.first_failure is not None:
        out["failure"] = outcome.first_failure.time
    if outcome.hang is not None:
        out["failure"] = outcome.hang.last_output
    if outcome.noticed_at is not None:
        out["noticed"] = outcome.noticed_at
    if outcome.stopped_at is not None:
        out["stopped"] = outcome.stopped_at
    return out


#: The newest file under the checkpoint directory, as ``<mtime> <size> <path>`` (one line;
#: empty when there is none).  A constant: the directory arrives as ``$1``.
_NEWEST = 'find "$1" -type f -printf "%T@ %s %P\\n" 2>/dev/null | sort -n | tail -n 1'


def checkpoint_mark(cluster: Cluster, directory: str, skip: Sequence[str] = ()) -> str | None:
    """What is newest in the checkpoint ``directory`` (``<mtime> <size> <path>``, "" when it
    holds nothing), read on the first node of ``cluster`` that answers (None: none could tell)."""
    for node in cluster.inventory.nodes:
        if node.name in skip:
            continue
        try:
            conn = cluster.connection(node.name)
            r = bounded(lambda conn=conn: conn.run(["sh", "-c", _NEWEST, "sh", directory], timeout=20), 25.0)
            return r.stdout.strip()
        except Exception:  # noqa: BLE001 - the next node may answer
            continue
    return None


def _fresh_run_id(run_id: str | None, job: Job) -> str:
    """A valid run id not recorded yet (the given one, checked, or a new one)."""
    run_id = records.check_run_id(run_id) if run_id else records.new_run_id(job.name)
    if (records.run_path(run_id) / records.RECORD_NAME).exists():
        raise UserError(f"run id {run_id!r} is already recorded in {records.run_path(run_id)}; "
                        "choose another --run-id (or leave it out for a new one).")
    return run_id


def start_recorded(cluster: Cluster, plans: Sequence[plan.NodePlan], record: records.RunRecord, *,
                   last: bool = False) -> None:
    """start_all, with the outcome (start-failed, or each container's start time) in run.json."""
    try:
        started = start_all(cluster, plans, last=last)
    except StartFailed:
        record.state, record.exit_code, record.finished = "start-failed", 1, records.utcnow()
        record.save()
        raise
    mark_running(cluster, record, started)
    record.save()


def local_image_id(ref: str) -> str:
    """The local engine's ID of ``ref``; UserError (exit 2) when the engine does not have it."""
    return distribute.source_image(engine.client(), ref).id


class CodeFailed(ClusterctlError):
    """The project could not be put on some node; nothing was started (exit 1)."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        super().__init__("could not put the code on every node, nothing was started:\n"
                         + "\n".join(f"  {n}: {why}" for n, why in self.failures.items()))


def ship_code(cluster: Cluster, ws: workspaces.Workspace, note: Callable[[str], None]
              ) -> tuple[plan.CodeMount, dict[str, int]]:
    """Put the workspace's tree on every node (only what each lacks); the mount for the plan
    and the bytes sent to each node.  CodeFailed naming every node that did not get it."""
    results = code_sync.sync(cluster, ws.tree)
    failed = {n: r.reason for n, r in results.items() if isinstance(r, NodeError)}
    if failed:
        raise CodeFailed(failed)
    hows = sorted({r.how for r in results.values()})
    note(f"code {ws.tree.short} on {len(results)} node(s): " + ", ".join(
        f"{sum(1 for r in results.values() if r.how == h)} {h}" for h in hows)
        + f", {max(r.sent for r in results.values())} bytes sent at most to one node")
    return (plan.CodeMount(ws.tree.digest, {n: r.path for n, r in results.items()}),
            {n: r.sent for n, r in results.items()})


class PushFailed(ClusterctlError):
    """The image could not be put on some node; nothing was started (exit 1)."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        super().__init__("could not put the image on every node, nothing was started:\n"
                         + "\n".join(f"  {n}: {why}" for n, why in self.failures.items()))


def push_image(cluster: Cluster, ref: str, progress=None, have: Sequence[str] = ()) -> None:
    """Put ``ref`` on every node that lacks it (only missing layers travel); PushFailed otherwise.

    ``have``: nodes known to hold ``ref`` with the local image ID already (preflight read
    it): reported as skipped without asking them again."""
    progress = progress or distribute.NoProgress()
    for node in have:
        progress.started(node, "skip: same image ID")
        progress.finished(distribute.PushResult(node, "skipped"))
    rest = [n.name for n in cluster.nodes if n.name not in set(have)]
    if not rest:
        return
    results = distribute.push_image(ref, cluster, progress=progress, nodes=rest)
    failed = {r.node: r.error or r.describe() for r in results if not r.ok}
    if failed:
        raise PushFailed(failed)


def follow(cluster: Cluster, plans: Sequence[plan.NodePlan], record: records.RunRecord, *,
           stream: TextIO | None, color: bool | None, settings: supervise.Settings | None,
           stop_event: threading.Event, interrupted: Callable[[], str]) -> supervise.Outcome:
    """Merge every node's output to ``stream`` and runs/<id>/, supervise until the end."""
    sink = logs.LogSink({p.node: p.rank for p in plans}, run_dir=record.attempt_dir(),
                        stream=sys.stdout if stream is None else stream, color=color,
                        redact=plan.secret_values(plans))
    sources = [logs.Source(p.node, p.rank, p.container) for p in plans]

    def on_hang(silent_for: float, last_output: float, starting: bool) -> watchdog.HangReport:
        return watchdog.dump_stacks(cluster, sources, record.attempt_dir(),
                                    timeout=supervise.allowed_silence(settings, started=not starting),
                                    silent_for=silent_for, last_output=last_output, image=plans[0].image,
                                    starting=starting, start_line=settings.hang_start_line)

    sup = supervise.Supervisor(cluster, sources, logs.Merger(sink), settings=settings,
                               stop_event=stop_event, stop_reason=interrupted, on_hang=on_hang,
                               remove_at_end=True)
    try:
        return sup.run()
    except BaseException:
        # whatever broke the follow, no container of the run may outlive it
        containers.remove_run_containers(cluster, record.run_id, [p.node for p in plans])
        raise
    finally:
        sink.close()


def remove_finished(cluster: Cluster, plans: Sequence[plan.NodePlan], outcome: supervise.Outcome) -> None:
    """Remove the run's containers on every node still reachable that the end of the follow
    did not remove already (logs are in runs/ now)."""
    done = set(outcome.lost) | set(outcome.removed)    # removed already when their end was read
    reachable = {p.node: p.container for p in plans if p.node not in done}
    if not reachable:
        return
    problems = containers.stop_containers(cluster, reachable, grace=0, remove=True)
    for node, why in problems.items():
        outcome.not_stopped.setdefault(node, f"container not removed: {why}")
