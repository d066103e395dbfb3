"""Run the collective check on the nodes: the only part of it that touches machines.

``run_check(inventory, ...)`` is ``clusterctl check --collective`` without the CLI:

1. the job: the given one (``--job``) or a bare one for the target/image, with its
   command replaced by ``python3 - CONFIG`` (the probe, :mod:`.incontainer.probe`, goes
   on the container's stdin, so any image with torch runs it) and one process per node;
   bad input is a UserError (exit 2) before any node is contacted
   (:func:`clusterctl.run.plan.check_inputs`);
2. preflight on every node (a node that fails it is named, nothing is started);
3. unless ``push=False``, the image goes where it is missing, as for launch;
4. the launch plan (:func:`clusterctl.run.plan.make_plan`: the same rank environment,
   interfaces, ``--add-host`` entries, target flags and devices as a launch), each
   node's ``docker run -i --rm`` started at once.  The first node whose container cannot
   start, or whose probe fails while the others still run, ends the check: the other
   containers are removed so nobody waits for a collective that cannot complete;
5. the outputs become :class:`~.model.Measurements`, :func:`~.model.decide` gives the
   verdict.

``Options.budget`` (seconds, default 45; None: no budget) bounds the whole check but the
image push (which depends on the image, not the nodes): what is left of it when the
containers start, less :data:`START_MARGIN` + :data:`END_MARGIN`, goes to the probe
(at least :data:`MIN_PROBE_BUDGET`), which fits its measurements in it and names what
it had not finished when its time was up (:mod:`.incontainer.probe`); the process
group's timeout is cut to it and the containers get :data:`END_MARGIN` more before they
are removed.  A slow node is then named within the budget instead of after the
``timeout`` (300 s): the library entry point for a launcher is
``run_check(inventory, job=job, options=Options(budget=60))``.  Nothing of the check stays on a node (``--rm``, and every container
   labelled with the check's id is removed at the end, whatever happened).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster import containers
from clusterctl.cluster import preflight as pf
from clusterctl.cluster.runtime import runtime_for
from clusterctl.cluster.transport import Cluster, NodeConnection
from clusterctl.core import accelerators
from clusterctl.core.errors import NodeError, UserError
from clusterctl.image import targets
from clusterctl.run import launch as launching
from clusterctl.run import plan, records
from clusterctl.run.collective import model
from clusterctl.run.jobs import Job

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory

#: Message sizes of the all-node all_reduce (bytes) and of each pair's.
DEFAULT_SIZES = (1 << 20, 4 << 20, 16 << 20)
DEFAULT_PAIR_BYTES = 4 << 20
DEFAULT_ITERS = 5
#: docker run exits 125 (docker itself failed), 126 (command cannot run), 127 (not found).
_DOCKER_START_CODES = (125, 126, 127)
#: the probe's exit status when its time was up (it printed what it had not finished)
BUDGET_STATUS = 4
DEFAULT_BUDGET = 45.0
#: seconds of the budget kept for starting the containers (docker run, python) and for
#: ending them (the probe's watchdog grace, the output coming back, the containers removed)
START_MARGIN, END_MARGIN = 3.0, 6.0
MIN_PROBE_BUDGET = 10.0


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    pair_bytes: int = DEFAULT_PAIR_BYTES
    pair_rounds: int | None = model.DEFAULT_PAIR_ROUNDS   # None: every pair (n - 1 rounds)
    iters: int = DEFAULT_ITERS
    timeout: float = 300.0            # seconds the containers may run
    collective_timeout: float = 120.0  # joining, and one collective (the process group's timeout)
    thresholds: model.Thresholds = model.Thresholds()
    push: bool = True
    backend: str | None = None        # default: the target's, gloo without a target
    budget: float | None = DEFAULT_BUDGET   # seconds for the whole check but the push; None: unbounded


@dataclass
class CheckResult:
    check_id: str
    image: str
    backend: str
    measurements: model.Measurements
    verdict: model.Verdict
    seconds: float
    preflight: list = None  # NodeCheck per node
    budget: float | None = None   # the probe's seconds (None: no budget)

    def to_json(self, thresholds: model.Thresholds) -> dict:
        return model.to_json(self.measurements, self.verdict, thresholds, check_id=self.check_id,
                             image=self.image, backend=self.backend, seconds=self.seconds,
                             budget_s=self.budget)


def probe_source() -> bytes:
    """The probe script fed to ``python3 -`` in every container."""
    return (resources.files("clusterctl.run.collective") / "incontainer" / "probe.py").read_bytes()


def check_job(*, job: Job | None, target: str | None, image: str | None) -> Job:
    """The job the check runs: ``job`` as given, else a bare one for ``target``/``image``."""
    if job is not None:
        if target is not None and job.target and target != job.target:
            raise UserError(f"--target {target} disagrees with job {job.name}'s target "
                            f"{job.target}; give one of them.")
        return job if target is None else replace(job, target=target)
    if target is None and image is None:
        raise UserError("check --collective needs what to run: --target T, --image REF or "
                        "--job JOB (e.g. --target cpu).")
    if target is not None:
        targets.get_target(target)  # UserError listing the known targets
    return Job(name="collective-check", path=Path("<check --collective>"), command=["python3"],
               target=target, image=image, nproc_per_node=1)


def backend_of(job: Job, given: str | None) -> str:
    if given:
        return given
    if job.target:
        backend = targets.get_target(job.target).backend
        if not backend:
            raise UserError(f"target {job.target} has no torch.distributed backend; valid: a "
                            "target with one (clusterctl targets), or --backend NAME.")
        return backend
    return accelerators.load().default_backend


def _backend_facts(backend: str) -> dict:
    """The accelerator table's facts the probe sets ``backend`` up with (device, module to
    import, where its version comes from); a backend the table lacks is a UserError."""
    table = accelerators.load()
    if backend not in table.backends:
        raise UserError(f"backend {backend!r} is not known; valid: {', '.join(table.backend_names())} "
                        f"(the backends of {accelerators.ACCELERATORS_FILE.name}).")
    return table.backends[backend].probe_config()


def config(n: int, backend: str, o: Options, budget: float | None = None) -> dict:
    """The probe's input; ``budget``: its seconds from its start (None: no budget), which
    also caps the process group's timeout."""
    cfg = {"backend": backend, **_backend_facts(backend), "sizes": list(o.sizes), "iters": o.iters,
           "rounds": [[list(p) for p in r] for r in model.pair_rounds(n, o.pair_rounds)],
           "pair_bytes": o.pair_bytes, "timeout": o.collective_timeout}
    if budget is not None:
        cfg["budget"] = round(budget, 1)
        cfg["timeout"] = round(min(o.collective_timeout, budget), 1)
    return cfg


def probe_job(job: Job, n: int, backend: str, options: Options,
              budget: float | None = None) -> Job:
    """``job`` with the probe as its command (``python3 - CONFIG``), one process per node."""
    cfg = json.dumps(config(n, backend, options, budget), separators=(",", ":"))
    # the command is a template ({placeholders}): the JSON's own braces are doubled.
    # secrets=[]: the probe needs none, so a job's listed secrets need not be exported
    # (values named *TOKEN*, *KEY*... still never reach the container: container_argv)
    return replace(job, command=["python3", "-", cfg.replace("{", "{{").replace("}", "}}")],
                   nproc_per_node=1, secrets=[])


def container_argv(p: plan.NodePlan) -> list[str]:
    """The plan's ``docker run`` made interactive and self-removing, secrets left out (the
    probe needs none, so no env file on stdin: stdin carries the probe), in the node's
    runtime's words (the plan's argv starts with it: a runtime's name is its command)."""
    env = {k: v for k, v in p.env.items() if k not in p.secrets}
    argv = plan.docker_run_argv(name=p.container, labels=p.labels, options=[*p.hosts, *p.options],
                                env=env, secrets=(), image=p.image, command=p.command,
                                detach=False, runtime=runtime_for(p.argv[0]))
    return [*argv[:2], "-i", "--rm", *argv[2:]]


def run_check(inventory: Inventory, *, job: Job | None = None, target: str | None = None,
              image: str | None = None, options: Options = Options(),
              accept_new_host_keys: bool | None = None, progress=None,
              note: Callable[[str], None] = lambda _: None) -> CheckResult:
    """The whole check; see the module docstring.  UserError (exit 2) for bad input."""
    started = time.monotonic()
    if options.budget is not None and not options.budget > 0:
        raise UserError(f"budget {options.budget!r}: valid: seconds above 0, or None (no budget)")
    n = len(inventory.nodes)
    if n < 2:
        raise UserError(f"{inventory.path}: check --collective needs at least 2 nodes; the "
                        f"inventory has {n}.")
    job = check_job(job=job, target=target, image=image)
    backend = backend_of(job, options.backend)
    check_id = records.new_run_id("collective-check")
    given = job
    job = probe_job(given, n, backend, options)
    facts = launching.local_facts(inventory)
    ref = plan.check_inputs(job, inventory, run_id=check_id, image=image,
                            master_addr=facts["master_addr"], host_env=facts["host_env"])
    with Cluster(inventory, accept_new_host_keys=accept_new_host_keys) as cluster:
        cluster.each_node_anyway = True   # the check's run is followed: a connection per node
        note(f"preflight on {n} nodes")
        extra = plan.job_devices(job)
        host_paths = {node.name: [d.split(":", 1)[0] for d in [*plan.node_devices(job, node), *extra]]
                      for node in inventory.nodes}
        checks = pf.run_preflight(cluster, devices_for=lambda node: host_paths.get(node.name, []),
                                  check_master_port=True, image_ref=None if options.push else ref)
        failed = {c.node: "; ".join(c.problems) for c in checks if c.problems}
        if failed:
            return _unmeasured(check_id, ref, backend, inventory, failed, "preflight", started, checks)
        pushed = 0.0
        if options.push:
            note(f"image {ref}: pushing where missing")
            t = time.monotonic()
            try:
                launching.push_image(cluster, ref, progress)
            except launching.PushFailed as e:
                return _unmeasured(check_id, ref, backend, inventory, e.failures, "push", started,
                                   checks)
            pushed = time.monotonic() - t
        budget, timeout = probe_budget(options, time.monotonic() - started - pushed)
        if budget is not None:
            job = probe_job(given, n, backend, options, budget)
        plans = plan.make_plan(job, inventory, run_id=check_id, image=image,
                               interfaces=pf.interfaces(checks), **facts)
        note(f"{len(model.pair_rounds(n, options.pair_rounds))} pair rounds, then all_reduce "
             f"on {n} nodes ({backend})"
             + (f", within {budget:.0f} s" if budget is not None else ""))
        try:
            reports = _run_all(cluster, plans, probe_source(), timeout, budget is not None)
        finally:
            containers.remove_run_containers(cluster, check_id, [p.node for p in plans])
    m = model.measure(reports)
    return CheckResult(check_id, ref, backend, m, model.decide(m, options.thresholds),
                       time.monotonic() - started, checks, budget)


def probe_budget(options: Options, spent: float) -> tuple[float | None, float]:
    """(the probe's seconds or None, the containers' timeout) once ``spent`` seconds of
    the budget are gone."""
    if options.budget is None:
        return None, options.timeout
    budget = max(MIN_PROBE_BUDGET, options.budget - spent - START_MARGIN - END_MARGIN)
    return budget, min(options.timeout, budget + START_MARGIN + END_MARGIN)


def _unmeasured(check_id, ref, backend, inventory: Inventory, failures: dict[str, str], step: str,
                started: float, checks) -> CheckResult:
    reports = [model.NodeReport(node.name, rank,
                                start_error=f"{step} failed: {failures[node.name]}"
                                if node.name in failures
                                else None, stopped=node.name not in failures)
               for rank, node in enumerate(inventory.nodes)]
    m = model.measure(reports)
    return CheckResult(check_id, ref, backend, m, model.decide(m, model.Thresholds()),
                       time.monotonic() - started, checks)


def _run_all(cluster: Cluster, plans: Sequence[plan.NodePlan], script: bytes,
             timeout: float, budgeted: bool = False) -> list[model.NodeReport]:
    """Every node's container at once; the first that fails stops the others."""
    failed = threading.Event()
    lock = threading.Lock()
    ended: set[str] = set()   # nodes whose docker run has returned

    def stop_others(me: str) -> None:
        """Remove the other nodes' containers until each one's docker run has returned: a
        container still being created when the first removal came would otherwise start
        and wait for its missing peer until the collective timeout."""
        with lock:
            if failed.is_set():
                return
            failed.set()

        def keep_removing() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    others = {p.node: p.container for p in plans
                              if p.node != me and p.node not in ended}
                if not others:
                    return
                containers.stop_containers(cluster, others, grace=0, remove=True)
                time.sleep(1.0)

        threading.Thread(target=keep_removing, name="collective-stop", daemon=True).start()

    def one(conn: NodeConnection) -> model.NodeReport:
        try:
            return run_one(conn)
        finally:
            with lock:
                ended.add(conn.name)

    def run_one(conn: NodeConnection) -> model.NodeReport:
        p = next(p for p in plans if p.node == conn.name)
        begun = time.monotonic()
        partial: list[str] = []
        try:
            res = _run_keeping_output(conn, container_argv(p), script, timeout, partial)
        except NodeError as e:
            late = time.monotonic() - begun >= timeout
            report = model.NodeReport(p.node, p.rank)
            if late and budgeted and partial:
                # what the probe printed until then counts; its time was up where it was
                report = model.parse_probe_output(p.node, p.rank, "".join(partial))
                report.out_of_budget = report.out_of_budget or (
                    f"{_last_phase(report)} (its container still ran when the budget's "
                    f"{timeout:.0f} s were spent)")
                return report
            if late:  # the container ran: the check's time was up
                report.error = f"no result within --timeout {timeout:g} s"
            elif failed.is_set():
                report.stopped = True
            else:
                report.start_error = f"container could not start: {e.reason}"
            if not failed.is_set():
                stop_others(p.node)
            return report
        report = model.parse_probe_output(p.node, p.rank, res.stdout + res.stderr)
        report.exit_code = res.exit_code
        if failed.is_set() and not report.done:
            report.stopped = True   # removed because another node failed first
            return report
        if res.exit_code in _DOCKER_START_CODES and not report.versions:
            report.start_error = (f"container could not start: docker run exited {res.exit_code}"
                                  + _docker_reason(res.stderr))
        if res.exit_code != 0 and not failed.is_set() and not (
                res.exit_code == BUDGET_STATUS and report.out_of_budget):
            stop_others(p.node)   # its time being up is not a failure: the others end alike
        return report

    results = cluster.map(one, nodes=[p.node for p in plans])
    reports = []
    for p in plans:
        r = results[p.node]
        if isinstance(r, NodeError):
            r = model.NodeReport(p.node, p.rank, start_error=f"container could not start: {r.reason}")
        reports.append(r)
    return reports


def _run_keeping_output(conn: NodeConnection, argv: list[str], stdin: bytes, timeout: float,
                        partial: list[str]):
    """``conn.run(argv, stdin=..., timeout=...)``, except that what the command printed
    before a timeout or a lost connection is in ``partial`` when NodeError is raised."""
    chan = conn.exec_channel(argv)
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    try:
        chan.sendall(stdin)
        chan.shutdown_write()
        while True:
            busy = False
            if chan.recv_ready():
                out.extend(chan.recv(1 << 16))
                busy = True
            if chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(1 << 16))
                busy = True
            if busy:
                continue
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                break
            if time.monotonic() >= deadline:
                partial[:] = [out.decode(errors="replace"), "\n", err.decode(errors="replace")]
                raise NodeError(conn.name, f"the probe's container timed out after {timeout:g}s")
            time.sleep(0.05)
        code = chan.recv_exit_status()
    except (OSError, EOFError) as e:
        partial[:] = [out.decode(errors="replace"), "\n", err.decode(errors="replace")]
        raise NodeError(conn.name, f"connection lost while running the probe: {e}") from None
    finally:
        chan.close()
    return _Result(code, out.decode(errors="replace"), err.decode(errors="replace"))


@dataclass
class _Result:
    exit_code: int
    stdout: str
    stderr: str


def _last_phase(r: model.NodeReport) -> str:
    """Where a probe that printed no ``budget`` record was, from what it printed."""
    if r.world:
        return "world"
    if r.joined is not None:
        return "a pair round"
    return "join" if r.versions else "import"


def _docker_reason(stderr: str) -> str:
    """': <what docker said>' without its "Run 'docker run --help'" hint, at most 2 lines."""
    lines = [ln.strip() for ln in stderr.splitlines()
             if ln.strip() and not ln.strip().startswith("Run 'docker run --help'")]
    text = "; ".join(lines[-2:])
    return f": {text[:400]}" if text else ""


#: Seconds the re-check between a run's attempts may take (issue 22: a slow node is named
#: within 60 s).
RECHECK_BUDGET = 60.0


def recheck(inventory: Inventory, *, job: Job, image: str | None, accept_new_host_keys: bool | None = None,
            note: Callable[[str], None] = lambda _: None) -> dict[str, str]:
    """The collective check before a restart (``launch`` with a job's ``collective_check``):
    the job's image already on the nodes, bounded to :data:`RECHECK_BUDGET`; the nodes it
    names slow or broken, with why."""
    result = run_check(inventory, job=job, image=image,
                       options=Options(budget=RECHECK_BUDGET, push=False),
                       accept_new_host_keys=accept_new_host_keys)
    note(f"collective check {result.seconds:.1f}s: {result.verdict.message}")
    named = set(result.verdict.named)
    return {v.node: f"named {v.status} by the collective check: {v.reason}"
            for v in result.verdict.nodes if v.node in named}
