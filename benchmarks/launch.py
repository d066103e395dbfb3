"""Benchmark: how fast `launch` gets a job running, and how fast it tears one down.

Prints, on a sandbox of real emulated nodes (own sshd + dockerd each; the nodes
share this machine's cores, 2 on the reference machine, so every figure that waits
on them grows with node count for that reason alone):

* launch -> every container running at 1, 4, 8 and 16 nodes (detached, the image
  already on the nodes, so no push; after one launch on every node that is not
  counted, since a node's first container of an image starts cold), with the two
  kinds of work kept apart:

  - host work: CPU seconds of the clusterctl process itself (all its threads:
    ``time.process_time``), for preflight+plan and for the start calls.  This is the
    honest figure for "work on the machine running clusterctl": it does not count
    the nodes' sshd, docker CLI and dockerd, which in the sandbox run on the same
    cores but are not clusterctl's work;
  - wall seconds of each phase, which is mostly waiting on the nodes (node work);
  - node CPU: every other process's CPU seconds on this machine over the same span
    (/proc/stat less the clusterctl process's own), i.e. the nodes' sshd, docker CLI,
    dockerd, runc and the containers' start.  Divided by the cores, it is the wall time
    the nodes' work alone needs here, whatever the head does;
  - dispatch: from the first to the last node's start command asked for by this process
    (direct designs): how long the head takes to get every node going.  Small against
    the wall, the head is not what the wall waits on;

  each for four designs (:data:`DESIGNS`), alternated in the same run, with T(16)/T(1)
  (the tree designs against the 1-node direct figure: one node has no tree to make):
  ``direct``, one SSH connection per node (``tree: false``, the previous default); ``old``, the same with
  paramiko's 0.1 s reader wake-up per connection (the design before it);
  ``tree-agent`` and ``tree-key``, ``ssh: {tree: true}`` (one connection from here, the
  nodes reach each other: :mod:`clusterctl.cluster.transport.tree`), each node-to-node
  login signed here (agent forwarding) or with the nodes' own key (``node_identity_file``;
  the sandbox's nodes share this machine's files, so its key serves as theirs);
* the same host work for the whole ``clusterctl launch --detach`` process (imports
  included: what a user's machine spends on one command), from its rusage, for the
  direct and both tree designs and the default (:data:`PROCESS_DESIGNS`), and the same
  for the ``clusterctl stop`` process that then tears that run down;
* rank failure -> last other container stopped, at 4 and 16 nodes, split into
  detection (the failing container's FinishedAt to the follow loop seeing it) and the
  stop calls (every other node stopped in parallel), for three designs alternated, all
  with the 1 s fail-fast grace (``Settings.fail_grace``):

  - ``new``: each node's stop is one line written on a channel opened while the run
    started (``containers.StopChannel``: a shell on the node waiting on its stdin, which
    then runs ``docker stop``); also printed: from the line written to that node's
    container finished (node clock = this machine's in the sandbox), median and slowest
    node, i.e. the node's own ``docker stop`` work;
  - ``channel``: the design before it: ``docker stop`` on a new SSH channel per node
    (each pays a session start on the node), ``docker run --init`` (tini as PID 1 passes
    SIGTERM on to the python rank, which ends at once);
  - ``old``: no ``--init`` either (python as the container's PID 1 ignores SIGTERM, so
    each stop costs the whole grace).

  ``--teardown-only`` measures only these (no launch or whole-process figures),
  ``--launch-only`` only the others;
* with ``--followed-only`` (and nothing else): the whole followed ``clusterctl launch``
  process, not detached, of a run whose last rank fails after 3 s (launch, every node's
  output followed, the fail-fast stop, every final state read, every container removed),
  CPU and wall, for the default (``tree: auto``: from 16 nodes the follow goes through the
  tree too), ``default-each`` (the same before the nodes kept their logins from one tree
  call to the next) and ``direct`` (a connection per node, the previous default for a
  followed run);
* with ``--process-only``: only the whole ``launch --detach`` and ``stop`` processes.

Run as root (the sandbox creates network namespaces and daemons), with the
local engine up and an image that has python3 (default: the base target's tag,
which `make demo` builds on the way to the cpu image):

    sudo make bench-launch        # or: sudo .venv/bin/python benchmarks/launch.py
        [--image REF] [--job JOB.yaml] [--repeat 2] [--nodes 1,4,8,16]
        [--teardown-only | --launch-only | --followed-only | --process-only]
        [--json FILE] [--plot FILE.png]

``--json FILE`` writes every printed row and the run's conditions in benchmarks/plot.py's
"launch" shape: ``launch`` (nodes, design, host_cpu, cpu_pre, cpu_start, wall, wall_pre,
wall_start, node_cpu, node_cpu_per_node_ms, node_floor, dispatch, stop_host_cpu, stop_wall:
medians), ``process`` (nodes, design, cpu, wall), ``teardown`` (nodes, design,
stopped, detection, stop_calls, lines_first/lines_last, line_median/line_max, each_run,
load_average) and ``ratios`` (the T(hi)/T(lo) lines); ``--plot`` draws them.

It creates its own sandbox (name "blaunch", 10.213.63.0/24; change with
--name/--subnet) and removes it at the end, also on failure or Ctrl-C.  Bad
input (an image the engine lacks, a --job that is not a valid job, --repeat below 1, bad --nodes, a malformed
--name or --subnet, not root, no engine) is one message saying what is valid and
exit status 2, before the sandbox is made.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from clusterctl.cluster import containers, distribute, engine, sandbox
from clusterctl.cluster import preflight as pf
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster, connection
from clusterctl.core.errors import ClusterctlError
from clusterctl.image import targets
from clusterctl.run import launch, records, supervise
from clusterctl.run.jobs import load_job

if __package__:                 # imported as benchmarks.launch (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "fixtures" / "jobs" / "fail-rank.yaml"   # moved with the test fixtures
OLD_READER_WAKEUP = 0.1    # paramiko's own (Transport._active_check_timeout), the previous design
SHARED = "(nodes share this machine's cores)"


def inventory_for(full: Path, n: int, out: Path, design_name: str = "direct") -> Path:
    """The sandbox inventory cut to its first ``n`` nodes, with the ``ssh:`` settings of
    ``design_name`` (:data:`DESIGNS`)."""
    data = yaml.safe_load(full.read_text())
    data["nodes"] = data["nodes"][:n]
    if design_name.startswith("tree"):
        data["ssh"]["tree"] = True
    elif not design_name.startswith("default"):   # direct and old: a connection per node
        data["ssh"]["tree"] = False
    if design_name == "tree-key":
        # the sandbox's nodes share this machine's files, so its key is also "on the nodes"
        data["ssh"]["node_identity_file"] = str(data["defaults"]["identity_file"])
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


#: The launch designs, alternated in one run: ``direct`` (one SSH connection per node, as
#: without ``ssh.tree``), ``old`` (the same with paramiko's 0.1 s reader wake-up, the design
#: before it), ``tree-agent`` (``ssh: {tree: true}``: one connection, nodes reach each other,
#: each node-to-node login signed here through agent forwarding) and ``tree-key``
#: (``node_identity_file`` too: the nodes log in to each other with their own key).
DESIGNS = ("direct", "old", "tree-agent", "tree-key")
#: The whole-process designs: ``default`` is the inventory as ``sandbox up`` writes it
#: (``ssh.tree`` left at ``auto``: ``launch --detach`` goes direct below 16 nodes and through
#: the tree, signed here, from 16 on); ``direct`` is the previous default (``tree: false``).
#: ``default-each`` is the default as it was before the nodes kept their logins from one
#: tree call to the next (each tree call logs in to every node again: preflight and start).
PROCESS_DESIGNS = ("direct", "default", "default-each", "tree-agent", "tree-key")

#: ``clusterctl`` as the ``-each`` designs run it: the previous tree, whose every call logs
#: in to each node anew (no Cluster keeps the nodes' logins: ``tree_reuse`` stays False)
EACH_CALL_LOGS_IN = (
    "import runpy\n"
    "from clusterctl.cluster.transport.cluster import Cluster\n"
    "Cluster.tree_reuse = property(lambda self: False, lambda self, value: None)\n"
    "runpy.run_module('clusterctl', run_name='__main__', alter_sys=True)\n")


def clusterctl(design_name: str) -> list[str]:
    """The argv that runs ``clusterctl`` as ``design_name`` has it."""
    if design_name.endswith("-each"):
        return [sys.executable, "-c", EACH_CALL_LOGS_IN]
    return [sys.executable, "-m", "clusterctl"]


@contextmanager
def design(old: bool):
    """The transport as the previous design had it (``old``) or as it is now."""
    saved = connection.READER_WAKEUP
    connection.READER_WAKEUP = OLD_READER_WAKEUP if old else saved
    try:
        yield
    finally:
        connection.READER_WAKEUP = saved


@dataclass
class Launch:
    wall: float          # launch() called -> every container running
    wall_pre: float      # of which preflight + plan
    cpu: float           # CPU seconds of this process over the same span
    cpu_pre: float       # of which preflight + plan
    node_cpu: float      # CPU seconds of everything else on this machine then: the nodes' work
    dispatch: float | None   # first to last node's start command sent here (direct designs)
    stop_cpu: float | None = None    # CPU s of this process for the stop after it (stop_run)
    stop_wall: float | None = None   # and its wall

    @property
    def wall_start(self) -> float:
        return self.wall - self.wall_pre

    @property
    def cpu_start(self) -> float:
        return self.cpu - self.cpu_pre


def time_to_running(inv_path: Path, image: str, job_path: Path = JOB) -> Launch:
    """One detached launch, timed by wall clock and by this process's CPU, then stopped."""
    inventory = load_inventory(inv_path)
    job = load_job(job_path)
    marks: dict[str, tuple[float, float]] = {}
    machine: dict[str, float] = {}   # this machine's busy CPU seconds (all processes)
    real_start = launch.start_all

    def timed_start(*a, **kw):
        marks["start"] = (time.monotonic(), time.process_time())
        return real_start(*a, **kw)

    def running(_record) -> None:
        marks.setdefault("running", (time.monotonic(), time.process_time()))
        machine.setdefault("running", benchplot.busy_cpu_seconds())

    sent: list[float] = []   # when each start command's channel was asked for, here
    real_channel = connection.NodeConnection._channel

    def traced_channel(self, argv, *a, **kw):
        if len(argv) > 2 and argv[2] == launch._START_SCRIPT:
            sent.append(time.monotonic())
        return real_channel(self, argv, *a, **kw)

    launch.start_all = timed_start
    connection.NodeConnection._channel = traced_channel
    t0, c0, m0 = time.monotonic(), time.process_time(), benchplot.busy_cpu_seconds()
    try:
        result = launch.launch(job, inventory, image=image, overrides={"FAIL_RANK": "99"},
                               detach=True, push=False, on_started=running)
    finally:
        launch.start_all = real_start
        connection.NodeConnection._channel = real_channel
    s0, sc0 = time.monotonic(), time.process_time()
    with Cluster(inventory) as cluster:   # the teardown's own part: the Cluster's connections too
        supervise.stop_run(cluster, result.record, grace=0)
    stop_wall, stop_cpu = time.monotonic() - s0, time.process_time() - sc0
    (t1, c1), (ts, cs), m1 = marks["running"], marks["start"], machine["running"]
    return Launch(t1 - t0, ts - t0, c1 - c0, cs - c0, node_cpu=max(0.0, (m1 - m0) - (c1 - c0)),
                  dispatch=max(sent) - min(sent) if len(sent) > 1 else None,
                  stop_cpu=stop_cpu, stop_wall=stop_wall)


#: The followed designs (``--followed-only``): the whole ``clusterctl launch`` process of a run
#: followed to its end as a user runs it (not detached): the last rank fails after 3 s, so
#: it is launch, every node's output followed, the fail-fast stop of the others, every final
#: state read and every container removed.  ``default``: ``ssh.tree`` at ``auto`` (through
#: the tree from 16 nodes, follow included: run.treefollow); ``direct``: ``tree: false``, a
#: connection per node for all of it (the previous default for a followed run);
#: ``default-each``: the default before the nodes kept their logins from one tree call to
#: the next (preflight, start, follow and stop each logged in to every node).
FOLLOWED_DESIGNS = ("direct", "default", "default-each")


def followed_process(inv_path: Path, image: str, env: dict[str, str], job: Path, nodes: int,
                     design_name: str = "default") -> tuple[float, float]:
    """(CPU s, wall s) of one whole followed ``clusterctl launch`` process (see
    :data:`FOLLOWED_DESIGNS`); it must end with the failing rank's status, 3."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run([*clusterctl(design_name), "launch", str(job), "--nodes", str(inv_path),
                          "--image", image, "--set", f"FAIL_RANK={nodes - 1}", "--set", "FAIL_AFTER=3"],
                         capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 3:
        raise ClusterctlError(f"clusterctl launch exited {res.returncode}, not 3: "
                              f"{(res.stderr or res.stdout).strip()[-400:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def process_cpu(inv_path: Path, image: str, env: dict[str, str], job: Path = JOB,
                design_name: str = "default") -> tuple[float, float, float, float]:
    """(CPU s, wall s) of a whole ``clusterctl launch --detach`` process, then the same of
    the ``clusterctl stop RUN --grace 0`` process that tears the run down (teardown as a user
    runs it: every container stopped, its output saved, removed)."""
    def timed(argv: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        res = subprocess.run([*clusterctl(design_name), *argv], capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if res.returncode != 0:
            raise ClusterctlError(f"clusterctl {argv[0]} exited {res.returncode}: {res.stderr.strip()[-400:]}")
        return res, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall

    res, cpu, wall = timed(["launch", str(job), "--nodes", str(inv_path), "--image", image,
                            "--set", "FAIL_RANK=99", "--detach", "--json"])
    run_id = yaml.safe_load(res.stdout)["run_id"]
    _, stop_cpu, stop_wall = timed(["stop", run_id, "--nodes", str(inv_path), "--grace", "0"])
    return cpu, wall, stop_cpu, stop_wall


@dataclass
class Teardown:
    node_clock: float    # failing container's FinishedAt -> last other container's FinishedAt
    detection: float     # failing container's FinishedAt -> the follow loop saw it
    stop_calls: float    # the parallel stop calls
    # new design: each node's stop line written -> its container's FinishedAt, over the nodes
    line_median: float | None = None
    line_max: float | None = None
    to_first_line: float | None = None   # the follow loop saw the failure -> first line written
    to_last_line: float | None = None    # ... -> last line written


TEARDOWN_DESIGNS = ("new", "channel", "old")


@contextmanager
def teardown_design(name: str, lines: dict[str, float]):
    """The teardown as ``name`` has it (see the module docstring); ``lines`` gets, for the new
    design, each container's time (this machine's clock) its stop line was written."""
    saved_init, saved_open, saved_send = pf.init_nodes, containers.StopChannel.open, containers.StopChannel.send

    def no_channel(self, connect):   # the stop then takes a new channel, as before
        return False

    def timed_send(self, grace):
        ok = saved_send(self, grace)
        lines[self.container] = time.time()
        return ok

    if name == "old":
        pf.init_nodes = lambda checks: []
    if name in ("old", "channel"):
        containers.StopChannel.open = no_channel
    else:
        containers.StopChannel.send = timed_send
    try:
        yield
    finally:
        pf.init_nodes, containers.StopChannel.open, containers.StopChannel.send = \
            saved_init, saved_open, saved_send


def time_to_teardown(inv_path: Path, image: str, design_name: str, job: Path = JOB) -> Teardown:
    """A followed run whose last rank fails after 4 s; where the teardown's time went.

    Detection compares a node's clock with this machine's: in the sandbox they are the
    same clock (the nodes are namespaces of this machine)."""
    inventory = load_inventory(inv_path)
    last = str(len(inventory.nodes) - 1)
    lines: dict[str, float] = {}
    with teardown_design(design_name, lines):
        result = launch.launch(load_job(job), inventory, image=image, push=False, stream=io.StringIO(),
                               overrides={"FAIL_RANK": last, "FAIL_AFTER": "4"})
    out = result.outcome
    assert out.first_failure is not None and out.exit_code == 3, supervise.summary_lines(out)
    finished = {n: st.finished.timestamp() for n, st in out.containers.items()
                if st is not None and st.finished and n != out.first_failure.node}
    failed = out.first_failure.time
    noticed = out.noticed_at or failed
    t = Teardown(max(finished.values()) - failed, noticed - failed, out.teardown_seconds or 0.0)
    names = {r.node: r.container for r in result.record.nodes}
    per_node = [finished[n] - lines[names[n]] for n in finished if names.get(n) in lines]
    if per_node:
        t.line_median, t.line_max = med(per_node), max(per_node)
        t.to_first_line, t.to_last_line = min(lines.values()) - noticed, max(lines.values()) - noticed
    return t


def repeats(text: str) -> int:
    """``--repeat``: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f'"{text}": give a whole number of runs per figure, 1 or more')
    return int(text)


def _chosen(args: argparse.Namespace, designs: tuple[str, ...]) -> tuple[str, ...]:
    """``designs``, only those ``--designs`` names when it is given."""
    wanted = getattr(args, "designs", None)
    return tuple(d for d in designs if not wanted or d in wanted)


def design_names(text: str) -> list[str]:
    known = set(PROCESS_DESIGNS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or any(n not in known for n in names):
        raise argparse.ArgumentTypeError(f"designs are a comma-separated list of {', '.join(PROCESS_DESIGNS)}")
    return names


def node_counts(text: str) -> list[int]:
    """``--nodes``: comma-separated whole numbers from 1 to 64, 1 first (the ratios' base)."""
    parts = text.split(",")
    if not all(p.isdigit() and 1 <= int(p) <= 64 for p in parts) or parts[0] != "1":
        raise argparse.ArgumentTypeError(f'"{text}": give node counts like 1,4,8,16 '
                                         "(whole numbers 1 to 64, starting with 1)")
    return sorted({int(p) for p in parts})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=targets.resolve("base").tag,
                    help="local image with python3 (default: the base target's tag)")
    ap.add_argument("--repeat", type=repeats, default=2, help="runs per figure and design")
    ap.add_argument("--nodes", type=node_counts, default=[1, 4, 8, 16],
                    help="node counts for the launch figures (default 1,4,8,16)")
    ap.add_argument("--name", default="blaunch", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.63.0/24", help="sandbox subnet")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--teardown-only", action="store_true",
                      help="only the failure -> teardown figures (at 4 nodes and the largest of --nodes)")
    only.add_argument("--followed-only", action="store_true",
                      help="measure only the whole followed launch (FOLLOWED_DESIGNS)")
    only.add_argument("--launch-only", action="store_true",
                      help="only the launch and whole-process figures (no teardown figures)")
    only.add_argument("--process-only", action="store_true",
                      help="only the whole `launch --detach` and `stop` processes (PROCESS_DESIGNS)")
    ap.add_argument("--designs", type=design_names, default=None, metavar="A,B",
                    help="with --process-only: only these of PROCESS_DESIGNS (default: all)")
    ap.add_argument("--job", type=Path, default=JOB, metavar="JOB.yaml",
                    help="the job launched (FAIL_RANK and FAIL_AFTER as tests/fixtures/jobs/fail-rank.yaml "
                         "takes them; fail-rank-sh.yaml for an image without python)")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="write every row and the run's conditions as JSON (benchmarks/plot.py)")
    ap.add_argument("--plot", default=None, metavar="FILE.png",
                    help="draw the rows: host CPU, wall and teardown against nodes (benchmarks/plot.py)")
    return ap


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before the sandbox exists (exit 2)."""
    sandbox.check_name(args.name)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/launch.py")
    load_job(args.job)   # a job that is not there or not valid: its own message
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


def med(values) -> float:
    return statistics.median(list(values))


def launch_row(n: int, design_name: str, runs: list[Launch], cores: int | None = None) -> dict:
    """One printed launch row (medians over ``runs``) as the JSON holds it; ``cores``: this
    machine's (default), which the nodes' CPU is spread over."""
    return {"nodes": n, "design": design_name,
            **{k: round(med(getattr(x, k) for x in runs), 4)
               for k in ("cpu", "cpu_pre", "cpu_start", "wall", "wall_pre", "wall_start", "node_cpu")},
            **_node_split(n, med(x.node_cpu for x in runs), cores or os.cpu_count() or 1),
            **({"dispatch": round(med(x.dispatch for x in runs), 4)}
               if all(x.dispatch is not None for x in runs) else {}),
            **({"stop_host_cpu": round(med(x.stop_cpu for x in runs), 4),
                "stop_wall": round(med(x.stop_wall for x in runs), 4)}
               if all(x.stop_cpu is not None and x.stop_wall is not None for x in runs) else {})}


def _node_split(n: int, node_cpu: float, cores: int) -> dict:
    """The nodes' CPU per node (ms) and spread over this machine's cores (s): the least
    wall their work alone needs here."""
    return {"node_cpu_per_node_ms": round(node_cpu / n * 1000, 1), "node_floor": round(node_cpu / cores, 4)}


def teardown_row(n: int, design_name: str, runs: list[Teardown], load: tuple[float, ...]) -> dict:
    """One printed teardown row (medians over ``runs``, and each run's figure)."""
    first = runs[0].line_median is not None
    return {"nodes": n, "design": design_name, "stopped": round(med(x.node_clock for x in runs), 4),
            "detection": round(med(x.detection for x in runs), 4),
            "stop_calls": round(med(x.stop_calls for x in runs), 4),
            **({k: round(med(getattr(x, k) for x in runs), 4)
                for k in ("to_first_line", "to_last_line", "line_median", "line_max")} if first else {}),
            "each_run": [round(x.node_clock, 4) for x in runs],
            "load_average": [round(v, 2) for v in load]}


def json_document(results: dict[str, list[dict]], args: argparse.Namespace, command: str,
                  conditions: dict) -> dict:
    """The run's rows and conditions as one checked document (plot.py's "launch" shape).
    ``results``: "launch" rows as :func:`launch_row` makes them, "process", "teardown"
    (:func:`teardown_row`) and "ratios"."""
    rename = {"cpu": "host_cpu", "to_first_line": "lines_first", "to_last_line": "lines_last"}
    lists = {key: [{rename.get(k, k) if key != "process" else k: v for k, v in r.items()}
                   for r in results.get(key, [])]
             for key in ("launch", "process", "teardown", "ratios")}
    return benchplot.document("launch", command, {
        **conditions, "repeat": args.repeat, "image": args.image,
        "fail_grace": supervise.Settings.fail_grace}, **lists)


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    os.environ["CLUSTERCTL_RUNS"] = str(tmp / "runs")
    size = max(args.nodes)
    results: dict[str, list[dict]] = {"launch": [], "process": [], "teardown": [], "ratios": []}
    loads = benchplot.Loads()
    try:
        print(f"sandbox {args.name}: {size} nodes, sharing this machine's {os.cpu_count()} cores ...", flush=True)
        sb = sandbox.up(size, name=args.name, subnet=args.subnet, inventory_path=tmp / "all.yaml")
        full = Path(sb.inventory_path)
        t = time.monotonic()
        for attempt in range(1, 4):
            # 32 `docker load`s on this machine's 2 cores can starve a node's sshd and its
            # heartbeat for over 10 s (the push then names it as lost): the push is set-up,
            # not measured, and a second one sends only to the nodes that lack the image
            try:
                with Cluster(load_inventory(full)) as cluster:
                    launch.push_image(cluster, args.image)
                break
            except launch.PushFailed as e:
                if attempt == 3:
                    raise
                print(f"push attempt {attempt} failed on {', '.join(sorted(e.failures))}; again", flush=True)
        print(f"image {args.image} pushed to {size} nodes in {time.monotonic() - t:.1f}s (not counted)")
        invs = {name: {n: inventory_for(full, n, tmp / f"n{n}-{name}.yaml", name) for n in args.nodes}
                for name in (*DESIGNS, "default", "default-each")}
        if args.followed_only:
            followed(args, invs, results)
        elif not args.teardown_only:
            if not args.process_only:
                launches(args, invs, results)
                loads.sample()
            whole_process(args, invs, results)
            loads.sample()
        if not (args.launch_only or args.followed_only or args.process_only):
            teardowns(args, full, invs["direct"], results)
        print(f"\n(run records in {records.runs_dir()}, removed with the sandbox)")
    finally:
        if any(results.values()) and (args.json or args.plot):
            doc = json_document(results, args, benchplot.command_line(), benchplot.conditions(loads))
            benchplot.save(doc, args.json, args.plot)
        sandbox.down(args.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def launches(args: argparse.Namespace, invs: dict[str, dict[int, Path]],
             results: dict[str, list[dict]]) -> None:
    print(f"\nlaunch -> all containers running (detached, image present), median of {args.repeat};"
          f"\nhost = CPU s of the clusterctl process (all threads); wall = mostly waiting on the nodes {SHARED};"
          "\nnode CPU = the rest of this machine's CPU over the same span (the nodes' sshd, docker, containers);"
          "\ndispatch = first to last node's start command sent from here (direct designs)")
    print(f"{'nodes':>5} {'design':>10} {'host CPU s':>10} {'preflight+plan':>14} {'start':>6}"
          f" {'wall s':>7} {'preflight+plan':>14} {'start':>6} {'node CPU s':>10} {'dispatch s':>10}")
    got: dict[tuple[int, str], list[Launch]] = {}
    counts = sorted(invs["direct"])
    # not counted: every node's first container of the image starts cold (its layers
    # mounted the first time), which would make whichever run came first the slow one
    warm = time_to_running(invs["direct"][counts[-1]], args.image, args.job)
    print(f"(warm-up on {counts[-1]} nodes, not counted: wall {warm.wall:.2f}s)", flush=True)
    for n in counts:
        names = DESIGNS if n > 1 else ("direct", "old")   # one node: no tree to make
        for _ in range(args.repeat):
            for name in names:   # alternated: every design sees the same load
                with design(name == "old"):
                    got.setdefault((n, name), []).append(time_to_running(invs[name][n], args.image, args.job))
        for name in names:
            s = got[(n, name)]
            print(f"{n:>5} {name:>10} {med(x.cpu for x in s):>10.3f} "
                  f"{med(x.cpu_pre for x in s):>14.3f} {med(x.cpu_start for x in s):>6.3f} "
                  f"{med(x.wall for x in s):>7.2f} {med(x.wall_pre for x in s):>14.2f} "
                  f"{med(x.wall_start for x in s):>6.2f} {med(x.node_cpu for x in s):>10.2f} "
                  f"{_dispatch(s):>10}", flush=True)
            results["launch"].append(launch_row(n, name, s))
    lo, hi = counts[0], counts[-1]
    base = {"old": got[(lo, "old")]}
    for name in DESIGNS:
        a, b = base.get(name, got[(lo, "direct")]), got.get((hi, name))
        if b is None:
            continue
        for what, attr in (("host_cpu", "cpu"), ("cpu_pre", "cpu_pre"), ("cpu_start", "cpu_start"),
                           ("wall", "wall")):
            results["ratios"].append({"design": name, "what": what, "nodes": [lo, hi], "value": round(
                med(getattr(x, attr) for x in b) / med(getattr(x, attr) for x in a), 3)})
        print(f"T({hi})/T({lo}) {name}: host CPU {med(x.cpu for x in b) / med(x.cpu for x in a):.1f}x"
              f" (preflight+plan {med(x.cpu_pre for x in b) / med(x.cpu_pre for x in a):.1f}x,"
              f" start {med(x.cpu_start for x in b) / med(x.cpu_start for x in a):.1f}x),"
              f" wall {med(x.wall for x in b) / med(x.wall for x in a):.1f}x {SHARED}")
    print("\nthe stop after each launch, in this process (supervise.stop_run: every container "
          "stopped, its output saved, removed), median:\nnodes     design  CPU s  wall s")
    for (n, name), s in got.items():
        if all(x.stop_cpu is not None for x in s):
            print(f"{n:>5} {name:>10} {med(x.stop_cpu for x in s):>6.3f} {med(x.stop_wall for x in s):>7.2f}")
    if hi > 1:
        print(f"host CPU at {hi} nodes against direct: " + ", ".join(
            f"{name} {med(x.cpu for x in got[(hi, name)]) / med(x.cpu for x in got[(hi, 'direct')]):.2f}"
            for name in DESIGNS if name != "direct"))


def _dispatch(runs: list[Launch]) -> str:
    """The median first-to-last start command sent, or "-" (one node, or through the tree)."""
    got = [x.dispatch for x in runs if x.dispatch is not None]
    return f"{med(got):.3f}" if len(got) == len(runs) else "-"


def whole_process(args: argparse.Namespace, invs: dict[str, dict[int, Path]],
                  results: dict[str, list[dict]]) -> None:
    print("\nwhole `clusterctl launch --detach` process (imports included), then `clusterctl stop`'s, "
          f"median of {args.repeat}:\n{'nodes':>5} {'design':>10} {'CPU s':>6} {'wall s':>7} "
          f"{'stop CPU s':>11} {'stop wall s':>12}")
    env = benchplot.cli_env(os.environ, CLUSTERCTL_PLAIN="1")   # with its bytecode, as installed
    cpu = {}
    counts = sorted(invs["direct"])
    for n in counts:
        for name in (_chosen(args, PROCESS_DESIGNS) if n > 1 else ("direct",)):
            s = [process_cpu(invs[name][n], args.image, env, args.job, name) for _ in range(args.repeat)]
            cpu[(n, name)] = med(x[0] for x in s)
            row = {"nodes": n, "design": name, "cpu": round(cpu[(n, name)], 4),
                   "wall": round(med(x[1] for x in s), 4), "stop_cpu": round(med(x[2] for x in s), 4),
                   "stop_wall": round(med(x[3] for x in s), 4)}
            print(f"{n:>5} {name:>10} {row['cpu']:>6.2f} {row['wall']:>7.2f} {row['stop_cpu']:>11.2f} "
                  f"{row['stop_wall']:>12.2f}", flush=True)
            results["process"].append(row)
    lo, hi = counts[0], counts[-1]
    results["ratios"] += [{"design": name, "what": "process_cpu", "nodes": [lo, hi],
                           "value": round(cpu[(hi, name)] / cpu[(lo, "direct")], 3)}
                          for name in PROCESS_DESIGNS if (hi, name) in cpu]
    stops = {(r["nodes"], r["design"]): r["stop_cpu"] for r in results["process"]}
    results["ratios"] += [{"design": name, "what": "stop_cpu", "nodes": [lo, hi],
                           "value": round(stops[(hi, name)] / stops[(lo, "direct")], 3)}
                          for name in PROCESS_DESIGNS if (hi, name) in stops]
    print(f"T({hi})/T({lo}): CPU " + ", ".join(
        f"{name} {cpu[(hi, name)] / cpu[(lo, 'direct')]:.2f}x" for name in PROCESS_DESIGNS
        if (hi, name) in cpu))


def followed(args: argparse.Namespace, invs: dict[str, dict[int, Path]],
             results: dict[str, list[dict]]) -> None:
    print("\nwhole followed `clusterctl launch` process (imports included; the last rank fails after 3 s: "
          f"launch, follow, fail-fast stop, final states, removal), median of {args.repeat}:\n"
          f"{'nodes':>5} {'design':>18} {'CPU s':>6} {'wall s':>7}")
    env = benchplot.cli_env(os.environ, CLUSTERCTL_PLAIN="1")
    counts = sorted(invs["direct"])
    got: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for n in counts:
        names = FOLLOWED_DESIGNS if n > 1 else ("direct",)   # one node: the same either way
        for _ in range(args.repeat):
            for name in names:   # alternated: every design sees the same load
                got.setdefault((n, name), []).append(followed_process(invs[name][n], args.image, env,
                                                                      args.job, n, name))
        for name in FOLLOWED_DESIGNS:   # one node's figure is both designs' (no tree to take)
            s = got[(n, name if n > 1 else "direct")]
            row = {"nodes": n, "design": f"followed {name}", "cpu": round(med(x[0] for x in s), 4),
                   "wall": round(med(x[1] for x in s), 4)}
            print(f"{n:>5} {row['design']:>18} {row['cpu']:>6.2f} {row['wall']:>7.2f}", flush=True)
            results["process"].append(row)
    lo, hi = counts[0], counts[-1]
    base = med(x[0] for x in got[(lo, "direct")])
    for name in FOLLOWED_DESIGNS:
        if (hi, name) in got:
            value = med(x[0] for x in got[(hi, name)]) / base
            results["ratios"].append({"design": f"followed {name}", "what": "process_cpu", "nodes": [lo, hi],
                                      "value": round(value, 3)})
            print(f"T({hi})/T({lo}) followed {name}: CPU {value:.2f}x", flush=True)


def teardowns(args: argparse.Namespace, full: Path, invs: dict[int, Path],
              results: dict[str, list[dict]]) -> None:
    print("\nrank failure -> last other container stopped (node clocks), median of "
          f"{args.repeat}, fail-fast grace {supervise.Settings.fail_grace}s;\nnew: each stop one line "
          "on a channel opened at the start; channel: docker stop on a new SSH channel per node "
          "(--init); old: no --init either (python as PID 1 ignores SIGTERM)")
    print(f"{'nodes':>5} {'design':>7} {'failure->stopped s':>18} {'detection s':>11} {'stop calls s':>12}"
          f" {'noticed->lines written s':>24} {'line->stopped s median':>22} {'slowest node':>12}")
    for n in sorted({min(4, max(invs)), max(invs)}):
        inv = invs.get(n) or inventory_for(full, n, full.parent / f"n{n}.yaml")
        got: dict[str, list[Teardown]] = {}
        for _ in range(args.repeat):
            for name in TEARDOWN_DESIGNS:   # alternated: every design sees the same load
                got.setdefault(name, []).append(time_to_teardown(inv, args.image, name, args.job))
        load = os.getloadavg()
        for name in TEARDOWN_DESIGNS:
            s = got[name]
            line = ""
            if s[0].line_median is not None:
                written = f"{med(x.to_first_line for x in s):.3f}-{med(x.to_last_line for x in s):.3f}"
                line = (f" {written:>24} {med(x.line_median for x in s):>22.2f}"
                        f" {med(x.line_max for x in s):>12.2f}")
            print(f"{n:>5} {name:>7} {med(x.node_clock for x in s):>18.2f} "
                  f"{med(x.detection for x in s):>11.2f} {med(x.stop_calls for x in s):>12.2f}{line}", flush=True)
            results["teardown"].append(teardown_row(n, name, s, load))
        print("      each run (failure->stopped s): " + "; ".join(
            f"{name} " + " ".join(f"{x.node_clock:.2f}" for x in got[name]) for name in TEARDOWN_DESIGNS)
            + f"; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
