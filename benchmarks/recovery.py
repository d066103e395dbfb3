"""Benchmark: from an injected fault to every rank training again (launch --max-restarts).

On a sandbox of real emulated nodes (own sshd + dockerd each; they share this machine's
cores, 2 on the reference machine), ``ddp-smoke`` (torchrun + gloo, one rank per node,
a checkpoint after every step in a directory on this machine that every node's engine
mounts: shared storage, as on a real cluster) runs on N nodes with one spare more
(``spare: true``), with ``--max-restarts 2 --checkpoint DIR``.  Once the checkpoint
directory holds step --fault-step, one fault hits node2 (rank 1), from outside the job
(:mod:`clusterctl.run.faults`):

* ``kill``: its container gets SIGKILL (exit 137): a dead rank, restarted in place;
* ``link-down``: its link at the sandbox bridge goes down: a lost node, the spare takes
  rank 1;
* ``engine-stop``: its dockerd gets SIGKILL, as a crash: a lost node, the spare takes it;
* ``sigstop``: rank 1's process gets SIGSTOP: the others wait in their next all-reduce,
  the hang watchdog (``--hang-timeout``, these runs only) declares the hang; the timeout
  is part of the detection time.  By default it is 10 s: the watchdog's clock starts at
  the job's first step line (ddp-smoke's ``hang_start_line``), so the program's silent
  start (``import torch``, ``init_process_group``) has the start timeout instead.

Once every rank has trained a step after the restart, the run is stopped (as Ctrl-C
would: exit 130): what it is measured for is shown, its other steps (--steps, 30, enough
for a fault that goes unnoticed for a while) would only cost time.

Each run's phases, from the fault (``Injection.at``: ``time.time()`` once the fault was
done; for ``kill`` the container's FinishedAt when that is earlier, the kill landing
before ``docker kill`` returns over SSH), from the run record (``runs/<id>/run.json``:
``attempts[0].timings``, ``attempts[1].started`` and its nodes' container start times)
and from the run's output, each line stamped as it reaches the merged stream:

* ``detect``: fault -> clusterctl noticed it (``timings.noticed``);
* ``stop``: -> every container of the attempt stopped (``timings.stopped``; for a hang
  this includes the watchdog's stack dump);
* ``check+start``: -> the last container of attempt 1 started (the streams' last lines,
  the decision, the spare swapped in, preflight of the nodes again, the start); kept
  apart in the data as ``wrap-up`` (-> the decision's note), ``check`` (-> attempt 1's
  record: ``attempts[1].started``) and ``start``;
* ``resume``: -> every rank printed its first ``rank R step S/T`` line of attempt 1
  (torch imported, ``init_process_group``, the checkpoint loaded, one step trained); kept
  apart in the data as ``to_starting`` (-> every rank printed ``rank R starting``:
  torchrun imported torch and started the rank) and ``to_resumed`` (-> every rank printed
  ``resumed from step S``: the rank imported torch, ``init_process_group``, the
  checkpoint loaded), both from the last container's start;

and the totals ``running`` (fault -> every rank's container running again) and ``first
step`` (fault -> every rank trained its first step after the resume).  The program's own
start, from the last container of attempt 0 started to every rank's first step line of
attempt 0 (``import torch`` and ``init_process_group`` in every container, the first
step), is printed too: ``beyond start`` is ``first step`` minus its median at that node
count, the share a faster program start would not remove.

The by-hand way (``--by-hand N`` runs of each fault, at the largest node count only; 0:
none) is the previous design scripted with no human delay: the same run with
``--max-restarts 0`` (the run ends at its first failure, with the default probes: a lost
node after 15 s), the same fault at the same point, and as soon as that launch returns, a
new ``clusterctl launch`` process (the CLI, as a person would type it) with the same
checkpoint directory, on the same nodes, or (``link-down``, ``engine-stop``) on an
inventory with the spare in node2's place, written beforehand.  Its figure is fault ->
every rank's first step of the relaunch (then it gets SIGINT); a person noticing the
failure and typing the command adds minutes to it.

Run as root (the sandbox makes network namespaces and daemons) with the local engine up
and the cpu image built from this checkout (``make image TARGET=cpu``: its
``/opt/clusterctl/examples/ddp_smoke.py`` must checkpoint and resume)::

    sudo make bench-recovery      # or: sudo .venv/bin/python benchmarks/recovery.py
        [--nodes 4,8] [--repeat 3,2] [--faults kill,link-down,engine-stop,sigstop]
        [--by-hand 1] [--steps 30] [--fault-step 3] [--hang-timeout SECONDS] [--budget 30]
        [--bandwidth RATE] [--image REF] [--json FILE] [--plot FILE.png]

``--repeat`` gives the runs per fault at each node count of ``--nodes`` (one value: the
same for all).  ``--budget`` (minutes, sandbox time included) skips the runs that would
start after it (the runs go repeat after repeat, each over every node count, so it cuts
the last repeats) and says so.  Links are not shaped by default: a restart moves no data worth the name (the image
is on every node already, the checkpoint is on shared storage), what it costs is process
starts on 2 shared cores; ``--bandwidth`` shapes every link with ``tc`` all the same.

``--json FILE`` writes every run and the summary in benchmarks/plot.py's "recovery"
shape: ``runs`` (nodes, fault, way, run, the phases and totals, program_start, what
happened, the hang timeout), ``rows`` (per node count and fault: runs, median and worst of
each phase and total, beyond_start, the by-hand figures and the ratio), ``program_start``
(nodes, median, worst, runs), ``peers`` (published figures, transcribed) and ``goals``;
``--plot`` draws them.

It creates its own sandbox ("brc", 10.213.60.0/24; --name/--subnet) of the largest node
count + 1 nodes, one rank per node, pushes the image to it (not timed), and removes it at
the end, also on failure, Ctrl-C or SIGTERM.  Bad input (an image the engine lacks or whose
ddp_smoke.py cannot resume, malformed --nodes/--repeat/--faults/--name/--subnet, not root,
no engine) is one message saying what is valid and exit status 2, before the sandbox is
made.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image import targets
from clusterctl.run import faults, plan, records
from clusterctl.run import launch as launching
from clusterctl.run.jobs import load_job

if __package__:                 # imported as benchmarks.recovery (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

FAULTS = ("kill", "link-down", "engine-stop", "sigstop")
WAYS = ("recovery", "by-hand")
TARGET_NODE = "node2"          # rank 1: never the master (node1)
STEP = re.compile(r"\brank (\d+) step (\d+)/(\d+) loss=")
RESUMED = re.compile(r"\brank (\d+) resumed from step (\d+) of (\d+) \(attempt (\d+)\)")
STARTING = re.compile(r"\brank (\d+) starting \(pid \d+\)")
RUN_TIMEOUT = 420.0            # seconds one launch may take before the run is called failed
#: the phases of a restart, one after the other (seconds), as the table shows them
PHASES = ("detect", "stop", "check_start", "resume")
#: the finer split of check_start and of resume (cumulative from the last container's start:
#: every rank printed "starting" - torchrun imported torch, the rank began - and "resumed")
DETAIL = ("wrap_up", "check", "start", "to_starting", "to_resumed")
#: published figures of the peers (transcribed, not measured here): what, seconds, source
PEERS = (
    {"what": "nvidia-resiliency-ext, in-job restart (ft_launcher restarts the ranks in the "
             "same allocation)", "seconds": 60.0,
     "source": "about 1 min, as issue 22 quotes NVIDIA's figure; not measured here "
               "(https://nvidia.github.io/nvidia-resiliency-ext/)"},
    {"what": "AWS SageMaker HyperPod, checkpointless training (peer-to-peer state recovery)",
     "seconds": 105.0,
     "source": "about 1 min 45 s, as issue 22 quotes it; AWS's post 'Checkpointless training on "
               "Amazon SageMaker HyperPod' (Dec 2025): recovery under 2 minutes, from 15-30 minutes"},
)
GOALS = {"lost": 10.0, "dead": 1.0, "beyond": 30.0}
AUTO_HANG = 10.0               # seconds: the hang timeout of the sigstop runs (the "10 s or so")
HANG_RULE = ("sigstop runs only: 10 s; the watchdog's clock starts at ddp-smoke's first step line "
             "(the job's hang_start_line), so the silent program start needs no allowance")


# --------------------------------------------------------------------------- output, stamped

class Stamped(io.TextIOBase):
    """A stream for ``launch(stream=...)``: keeps each line with ``time.time()`` when it
    was written (LogSink writes one whole line per call)."""

    def __init__(self, on_line=None) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self.on_line = on_line
        self._part = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        now = time.time()
        with self._lock:
            self._part += text
            while "\n" in self._part:
                line, self._part = self._part.split("\n", 1)
                self.lines.append((now, line))
                if self.on_line is not None:
                    self.on_line(now, line)
        return len(text)

    def tail(self, n: int = 5) -> str:
        return " / ".join(line for _, line in self.lines[-n:])


def first_lines(lines: list[tuple[float, str]], after: float, before: float | None = None,
                pattern: re.Pattern = STEP) -> dict[int, float]:
    """rank -> time of its first line matching ``pattern`` (default: ``rank R step S/T``)
    in [after, before)."""
    out: dict[int, float] = {}
    for t, line in lines:
        if t < after or (before is not None and t >= before):
            continue
        m = pattern.search(line)
        if m and int(m.group(1)) not in out:
            out[int(m.group(1))] = t
    return out


def every_rank(found: dict[int, float], ranks: int) -> float | None:
    """The time the last of ``ranks`` ranks got there, None when one never did."""
    return max(found.values()) if len(found) == ranks else None


class StopAfterResume:
    """Sets ``stop`` (the run stops as on Ctrl-C) once every rank printed a step line after
    ``since()``: the run has shown what it is measured for, the rest of its steps would
    only cost time."""

    def __init__(self, ranks: int, since, stop) -> None:
        self.ranks, self.since, self.stop = ranks, since, stop
        self.seen: set[int] = set()

    def __call__(self, now: float, line: str) -> None:
        t = self.since()
        m = STEP.search(line)
        if t is None or m is None or now < t:
            return
        self.seen.add(int(m.group(1)))
        if len(self.seen) >= self.ranks:
            self.stop()


def resumed_from(lines: list[tuple[float, str]], first_attempt: int = 1) -> int | None:
    """The step the ranks resumed from (the lowest any rank names), in attempts from
    ``first_attempt`` on (a relaunch by hand is attempt 0 of a new run)."""
    steps = [int(m.group(2)) for _, line in lines
             if (m := RESUMED.search(line)) and int(m.group(4)) >= first_attempt]
    return min(steps) if steps else None


# --------------------------------------------------------------------------- one run's figures

def ts(value) -> float | None:
    return None if value is None else value.timestamp()


def last_start(nodes) -> float | None:
    starts = [ts(n.started) for n in nodes]
    return None if not starts or None in starts else max(starts)


def fault_time(kind: str, injected: dict, failure: float | None) -> float:
    """The fault's moment: ``at`` (the action done); a kill's container FinishedAt when it is
    within the action (the kill lands before ``docker kill`` returns over SSH)."""
    at, requested = injected["at"], injected.get("requested", injected["at"])
    if kind == "kill" and failure is not None and requested - 0.05 <= failure <= at:
        return failure
    return at


def rnd(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def recovery_figures(kind: str, injected: dict, rec: records.RunRecord, lines, notes, ranks: int) -> dict:
    """A restarted run's phases and totals (seconds) from its record and stamped output."""
    a0, a1 = rec.attempts[0], rec.attempts[1]
    timings = a0.timings
    t0 = fault_time(kind, injected, timings.get("failure"))
    noticed, stopped = timings.get("noticed"), timings.get("stopped")
    started1 = ts(a1.started)
    running0, running1 = last_start(a0.nodes), last_start(a1.nodes)
    decided = next((t for t, text in notes if text.startswith("attempt 0 ended")), None)
    step0 = every_rank(first_lines(lines, 0.0, started1), ranks)
    step1 = every_rank(first_lines(lines, started1), ranks)
    starting1 = every_rank(first_lines(lines, started1, pattern=STARTING), ranks)
    resumed1 = every_rank(first_lines(lines, started1, pattern=RESUMED), ranks)
    d = {
        "detect": noticed - t0 if noticed else None,
        "stop": stopped - noticed if stopped and noticed else None,
        "check_start": running1 - stopped if running1 and stopped else None,
        "resume": step1 - running1 if step1 and running1 else None,
        "wrap_up": decided - stopped if decided and stopped else None,
        "check": started1 - decided if decided else None,
        "start": running1 - started1 if running1 else None,
        "to_starting": starting1 - running1 if starting1 and running1 else None,
        "to_resumed": resumed1 - running1 if resumed1 and running1 else None,
        "running": running1 - t0 if running1 else None,
        "first_step": step1 - t0 if step1 else None,
        "program_start": step0 - running0 if step0 and running0 else None,
        "failure_before": t0 - timings["failure"] if timings.get("failure") else None,
    }
    return {k: rnd(v) for k, v in d.items()}


@dataclass
class Run:
    """One measured run: its figures, and in words what happened."""

    nodes: int
    fault: str
    way: str
    run: int
    figures: dict = field(default_factory=dict)
    ended: str = ""
    replaced: dict = field(default_factory=dict)
    resumed_from: int | None = None
    result: str = "ok"
    hang_timeout: float | None = None

    def row(self) -> dict:
        f = self.figures
        return {"nodes": self.nodes, "fault": self.fault, "way": self.way, "run": self.run,
                **{k: f.get(k) for k in (*PHASES, *DETAIL, "exit", "running", "first_step",
                                          "program_start", "failure_before")},
                "ended": self.ended or None, "replaced": self.replaced or None,
                "resumed_from": self.resumed_from, "hang_timeout": self.hang_timeout,
                "result": self.result}


# --------------------------------------------------------------------------- the sandbox's runs

class Bench:
    """The sandbox, the inventories and the two ways of running one fault."""

    def __init__(self, args: argparse.Namespace, sb: sandbox.Sandbox, tmp: Path, full: Path) -> None:
        self.args, self.sb, self.tmp = args, sb, tmp
        self.full = yaml.safe_load(full.read_text())
        self.names = [n["name"] for n in self.full["nodes"]]
        # the code imported here, with its bytecode as installed (benchplot.cli_env)
        self.env = benchplot.cli_env(os.environ, DOCKER_HOST=engine.engine_url() or "",
                                     CLUSTERCTL_RUNS=os.environ["CLUSTERCTL_RUNS"], CLUSTERCTL_PLAIN="1")
        self.sets = [f"DDP_SMOKE_STEPS={args.steps}", "DDP_SMOKE_STEP_SECONDS=1",
                     "DDP_SMOKE_PROGRESS=1", "DDP_SMOKE_TIMEOUT=120"]
        self.counter = 0
        self.program: dict[int, list[float]] = {}     # nodes -> program starts measured so far

    def inventory(self, n: int, *, spare_in: str | None = None) -> Path:
        """Nodes 1..n active, node n+1 a spare; ``spare_in``: the spare written in that
        node's place instead (the by-hand relaunch), the node left out."""
        data = json.loads(json.dumps(self.full))
        nodes = data["nodes"][:n + 1]
        if spare_in is None:
            nodes[n]["spare"] = True
            name = f"inv-{n}.yaml"
        else:
            i = next(i for i, node in enumerate(nodes) if node["name"] == spare_in)
            nodes[i] = nodes.pop(n)
            name = f"inv-{n}-without-{spare_in}.yaml"
        data["nodes"] = nodes
        path = self.tmp / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def _ids(self, prefix: str) -> tuple[str, Path]:
        self.counter += 1
        run_id = f"{prefix}-{self.counter:02d}"
        ck = self.tmp / "checkpoints" / run_id
        ck.mkdir(parents=True)
        return run_id, ck

    def _injector(self, kind: str, inv: Path, run_id: str, ck: Path, out: dict) -> threading.Thread:
        """A thread that injects ``kind`` on node2 once ``ck`` holds step --fault-step."""
        def go() -> None:
            deadline = time.monotonic() + RUN_TIMEOUT
            while latest_step(ck) < self.args.fault_step:
                if time.monotonic() > deadline or out.get("cancel"):
                    out["error"] = f"step {self.args.fault_step} never checkpointed"
                    return
                time.sleep(0.05)
            try:
                inj = faults.inject(kind, TARGET_NODE, nodes=inv, run_id=run_id if kind in faults.RUN_KINDS else None)
                out["injection"] = inj.record()
            except ClusterctlError as e:
                out["error"] = f"fault {kind}: {e.message}"

        t = threading.Thread(target=go, name=f"fault-{kind}", daemon=True)
        t.start()
        return t

    def hang_timeout(self, kind: str, n: int) -> float | None:
        """The watchdog only where the fault needs it (sigstop): --hang-timeout, else 10 s.
        The watchdog's clock starts at ddp-smoke's first step line (the job's
        ``hang_start_line``; DDP_SMOKE_PROGRESS=1 prints one per step), so the timeout
        only has to exceed the silence between two steps, not the program's silent start
        (torchrun's and the ranks' ``import torch``, ``init_process_group``), which has
        the start timeout (5 min).  ``n``: kept for the callers (the rule no longer
        depends on the node count)."""
        if kind != "sigstop":
            return None
        if self.args.hang_timeout is not None:
            return self.args.hang_timeout
        return AUTO_HANG

    def _launch(self, kind: str, inv: Path, run_id: str, ck: Path, max_restarts: int, stream: Stamped,
                notes: list, stop: threading.Event | None = None):
        job = load_job("ddp-smoke", {"nproc_per_node": 1})
        return launching.launch(
            job, load_inventory(inv), image=self.args.image, overrides=plan.parse_sets(self.sets),
            run_id=run_id, stream=stream, color=False, hang_timeout=self.hang_timeout(kind, len(job_nodes(inv))),
            max_restarts=max_restarts, checkpoint=str(ck), stop_event=stop,
            on_note=lambda text: notes.append((time.time(), text)))

    def recovery(self, n: int, kind: str, rep: int) -> Run:
        run = Run(n, kind, "recovery", rep, hang_timeout=self.hang_timeout(kind, n))
        inv = self.inventory(n)
        run_id, ck = self._ids(f"brc{n}-{kind}")
        notes: list[tuple[float, str]] = []
        out: dict = {}
        stop = threading.Event()
        restarted = StopAfterResume(n, lambda: next((t for t, text in notes if text.startswith("attempt 0 ended")),
                                                    None), stop.set)
        stream = Stamped(on_line=restarted)
        thread = self._injector(kind, inv, run_id, ck, out)
        try:
            result = self._launch(kind, inv, run_id, ck, 2, stream, notes, stop)
        except ClusterctlError as e:
            run.result = f"FAILED: launch: {e.message}"[:300]
            return run
        finally:
            out["cancel"] = True
            thread.join(timeout=30)
            self.heal(kind, n)
        rec = result.record
        if "injection" not in out:
            run.result = f"FAILED: {out.get('error') or 'no fault injected'}; exit {result.exit_code}"
            return run
        run.ended = "; ".join(f"{a.ended} -> {a.then}" for a in rec.attempts if a.ended)
        run.replaced = {k: v for a in rec.attempts for k, v in a.replaced.items()}
        run.resumed_from = resumed_from(stream.lines)
        if len(rec.attempts) < 2:
            run.result = f"FAILED: no restart (exit {result.exit_code}): {stream.tail()}"[:300]
            return run
        run.figures = recovery_figures(kind, out["injection"], rec, stream.lines, notes, n)
        if run.figures.get("program_start") is not None:
            self.program.setdefault(n, []).append(run.figures["program_start"])
        if run.figures.get("first_step") is None or len(rec.attempts) > 2:
            # a second restart (a false hang, a rank that did not come back) is no figure of one
            run.result = f"FAILED: exit {result.exit_code} after {len(rec.attempts)} attempts: {stream.tail(3)}"[:300]
        return run

    def by_hand(self, n: int, kind: str, rep: int) -> Run:
        """The previous design and a person with no delay: the run ends at its first
        failure; at once a new ``clusterctl launch`` from the checkpoint (the spare in the
        lost node's place)."""
        run = Run(n, kind, "by-hand", rep, hang_timeout=self.hang_timeout(kind, n))
        inv = self.inventory(n)
        run_id, ck = self._ids(f"bh{n}-{kind}")
        again = self.inventory(n, spare_in=TARGET_NODE) if kind in ("link-down", "engine-stop") else inv
        stream, notes, out = Stamped(), [], {}
        thread = self._injector(kind, inv, run_id, ck, out)
        relaunch = None
        try:
            try:
                result = self._launch(kind, inv, run_id, ck, 0, stream, notes)
            except ClusterctlError as e:
                run.result = f"FAILED: launch: {e.message}"[:300]
                return run
            exited = time.time()
            out["cancel"] = True
            thread.join(timeout=30)
            if "injection" not in out:
                run.result = f"FAILED: {out.get('error') or 'no fault injected'}; exit {result.exit_code}"
                return run
            relaunch = self.cli_launch(kind, again, f"{run_id}-again", ck)
        finally:
            out["cancel"] = True
            thread.join(timeout=30)
            self.heal(kind, n)
        outcome = result.outcome
        failure = result.record.first_failure.time.timestamp() if result.record.first_failure else None
        if outcome is not None and outcome.hang is not None:
            failure = outcome.hang.last_output
        t0 = fault_time(kind, out["injection"], failure)
        run.ended = (f"{result.record.state} (exit {result.exit_code}); relaunch exit {relaunch['rc']}"
                     + (" (stopped after its first step)" if relaunch["interrupted"] else ""))
        run.resumed_from = resumed_from(relaunch["lines"], first_attempt=0)
        try:
            rec2 = records.load(f"{run_id}-again")
            running = last_start(rec2.nodes)
        except (ClusterctlError, OSError, ValueError):
            running = None
        step = every_rank(first_lines(relaunch["lines"], 0.0), n)
        starting = every_rank(first_lines(relaunch["lines"], 0.0, pattern=STARTING), n)
        resumed = every_rank(first_lines(relaunch["lines"], 0.0, pattern=RESUMED), n)
        noticed = outcome.noticed_at if outcome else None
        stopped = outcome.stopped_at if outcome else None
        run.figures = {k: rnd(v) for k, v in {
            "detect": noticed - t0 if noticed else None,
            "stop": stopped - noticed if stopped and noticed else None,
            "exit": exited - t0,
            "check_start": running - exited if running else None,
            "resume": step - running if step and running else None,
            "running": running - t0 if running else None,
            "first_step": step - t0 if step else None,
            "to_starting": starting - running if starting and running else None,
            "to_resumed": resumed - running if resumed and running else None,
            "failure_before": t0 - failure if failure else None}.items()}
        if step is None:
            run.result = f"FAILED: relaunch exit {relaunch['rc']}: {relaunch['tail']}"[:300]
        return run

    def cli_launch(self, kind: str, inv: Path, run_id: str, ck: Path) -> dict:
        """``clusterctl launch`` as a person types it, every output line stamped."""
        argv = [sys.executable, "-m", "clusterctl", "launch", "ddp-smoke", "--nodes", str(inv),
                "--image", self.args.image, "--nproc-per-node", "1", "--checkpoint", str(ck),
                "--run-id", run_id]
        hang = self.hang_timeout(kind, len(job_nodes(inv)))
        if hang:
            argv += ["--hang-timeout", f"{hang:g}s"]
        for s in self.sets:
            argv += ["--set", s]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                             stdin=subprocess.DEVNULL)
        ranks = len(job_nodes(inv))
        stepped: set[int] = set()
        interrupted = False
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        lines: list[tuple[float, str]] = []
        buf = b""
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            if time.monotonic() > deadline:
                p.kill()
                break
            if not sel.select(timeout=1.0):
                continue
            data = os.read(p.stdout.fileno(), 65536)
            now = time.time()
            if not data:
                break
            buf += data
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                lines.append((now, raw.decode(errors="replace")))
                m = STEP.search(lines[-1][1])
                if m:
                    stepped.add(int(m.group(1)))
                if len(stepped) >= ranks and not interrupted:   # what it is measured for: shown
                    p.send_signal(signal.SIGINT)
                    interrupted = True
        rc = p.wait()
        sel.close()
        p.stdout.close()
        return {"rc": rc, "interrupted": interrupted, "lines": lines,
                "tail": " / ".join(line for _, line in lines[-3:])}

    def heal(self, kind: str, n: int) -> None:
        """After a run: node2's link up or its engine started again, and every container of
        a run on the sandbox's nodes removed."""
        inv = self.inventory(n)
        try:
            if kind == "link-down":
                faults.inject("link-up", TARGET_NODE, nodes=inv)
            elif kind == "engine-stop":
                faults.inject("engine-start", TARGET_NODE, nodes=inv)
        except ClusterctlError as e:
            print(f"  (healing {TARGET_NODE} after {kind}: {e.message})", flush=True)
        for node in self.names:
            found = sandbox.node_docker(self.sb.name, node, "ps", "-aq", "--filter",
                                        "label=io.clusterctl.run").stdout.split()
            if found:
                sandbox.node_docker(self.sb.name, node, "rm", "--force", *found)


def job_nodes(inv: Path) -> list[str]:
    """The active nodes of an inventory file (the spare left out)."""
    return [n["name"] for n in yaml.safe_load(inv.read_text())["nodes"] if not n.get("spare")]


def latest_step(checkpoint: Path) -> int:
    try:
        return int(json.loads((checkpoint / "latest").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


# --------------------------------------------------------------------------- rows

def med(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def worst(values: list[float]) -> float | None:
    return round(max(values), 2) if values else None


def summary_rows(runs: list[dict], program: dict[int, float]) -> list[dict]:
    """Per node count and fault: median and worst of the recovery runs' phases and totals,
    the by-hand median and the ratio."""
    out = []
    keys = sorted({(r["nodes"], r["fault"]) for r in runs},
                  key=lambda k: (k[0], FAULTS.index(k[1]) if k[1] in FAULTS else 9))
    for n, kind in keys:
        ok = [r for r in runs if (r["nodes"], r["fault"], r["way"]) == (n, kind, "recovery")
              and r["result"] == "ok"]
        hand = [r for r in runs if (r["nodes"], r["fault"], r["way"]) == (n, kind, "by-hand")
                and r["result"] == "ok"]
        failed = [r for r in runs if (r["nodes"], r["fault"]) == (n, kind) and r["result"] != "ok"]
        if not ok and not hand:
            continue
        row: dict = {"nodes": n, "fault": kind, "runs": len(ok)}
        for k in (*PHASES, *DETAIL, "running", "first_step"):
            vals = [r[k] for r in ok if r.get(k) is not None]
            row[k] = med(vals)
            row[f"{k}_worst"] = worst(vals)
        first = row.get("first_step")
        row["beyond_start"] = round(first - program[n], 2) if first is not None and n in program else None
        row["beyond_start_worst"] = (round(row["first_step_worst"] - program[n], 2)
                                     if row.get("first_step_worst") is not None and n in program else None)
        row["by_hand"] = med([r["first_step"] for r in hand if r.get("first_step") is not None])
        row["by_hand_exit"] = med([r["exit"] for r in hand if r.get("exit") is not None])
        row["by_hand_detect"] = med([r["detect"] for r in hand if r.get("detect") is not None])
        row["by_hand_runs"] = len(hand)
        row["by_hand_over"] = (round(row["by_hand"] / first, 2)
                               if row["by_hand"] is not None and first else None)
        hangs = sorted({r["hang_timeout"] for r in ok if r.get("hang_timeout")})
        if hangs:
            row["hang_timeout"] = hangs[-1]
        what = sorted({(r.get("ended") or "").split(" -> ")[0] for r in ok})
        what = [w + (f" (hang timeout {'/'.join(f'{h:g}' for h in hangs)} s)" if w.startswith("hung") and hangs
                     else "") for w in what]
        spare = sorted({f"{a} -> {b}" for r in ok for a, b in (r.get("replaced") or {}).items()})
        row["what"] = "; ".join(w for w in what if w) + (f"; spare: {', '.join(spare)}" if spare else
                                                         "; restarted in place" if ok else "")
        if failed:
            row["failed"] = len(failed)
        out.append({k: v for k, v in row.items() if v is not None})
    return out


def program_rows(runs: list[dict]) -> list[dict]:
    out = []
    for n in sorted({r["nodes"] for r in runs}):
        vals = [r["program_start"] for r in runs if r["nodes"] == n and r.get("program_start") is not None]
        if vals:
            out.append({"nodes": n, "median": med(vals), "worst": worst(vals), "runs": len(vals)})
    return out


def goal_rows(rows: list[dict]) -> list[dict]:
    """The issue's goals, each against the worst and median measured (None: not measured)."""
    goals = []
    for n in sorted({r["nodes"] for r in rows}):
        mine = {r["fault"]: r for r in rows if r["nodes"] == n and r.get("runs")}
        lost = [mine[k] for k in ("link-down", "engine-stop") if k in mine]
        if lost:
            value = max(r["detect_worst"] for r in lost)
            goals.append({"what": f"detection of a lost node (link-down, engine-stop), worst, {n} nodes",
                          "limit": GOALS["lost"], "value": value, "met": value <= GOALS["lost"]})
        if "kill" in mine:
            value = mine["kill"]["detect_worst"]
            goals.append({"what": f"detection of a dead rank (kill), worst, {n} nodes",
                          "limit": GOALS["dead"], "value": value, "met": value <= GOALS["dead"]})
    big = max((r["nodes"] for r in rows), default=None)
    for r in rows:
        if r["nodes"] == big and r.get("beyond_start") is not None:
            goals.append({"what": f"fault -> every rank training again beyond the program's start, "
                                  f"{r['fault']}, {big} nodes (median)",
                          "limit": GOALS["beyond"], "value": r["beyond_start"],
                          "met": r["beyond_start"] <= GOALS["beyond"]})
    return goals


def kept_runs(prior: dict, faults: list[str], nodes: list[int]) -> list[dict]:
    """``--merge FILE``: the runs of FILE that this run does not measure again (another
    fault, or another node count).  Pure."""
    return [r for r in prior.get("runs", []) if r["fault"] not in faults or r["nodes"] not in nodes]


def json_document(runs: list[dict], args: argparse.Namespace, extra: dict, command: str,
                  conditions: dict) -> dict:
    if getattr(args, "merge", None) is not None:
        prior = json.loads(args.merge.read_text())
        kept = kept_runs(prior, args.faults, args.nodes)
        runs = [*kept, *runs]
        merged = (f"{len(kept)} run(s) of other faults or node counts kept from {args.merge.name} "
                  f"({prior.get('conditions', {}).get('date', '?')}: {prior.get('command', '?')})")
        extra = {**extra, "note": "; ".join(t for t in (extra.get("note"), merged) if t)}
    prog = program_rows([r for r in runs if r["way"] == "recovery"])
    program = {p["nodes"]: p["median"] for p in prog}
    rows = summary_rows(runs, program)
    return benchplot.document("recovery", command, {
        **conditions, "hang_timeout": args.hang_timeout, "steps": args.steps,
        "hang_timeout_rule": None if args.hang_timeout is not None else HANG_RULE,
        "fault_step": args.fault_step, "image": args.image, "bandwidth": args.bandwidth,
        **extra}, runs=runs, rows=rows, program_start=prog, peers=list(PEERS),
        goals=goal_rows(rows))


# --------------------------------------------------------------------------- the run

def print_run(r: dict) -> None:
    def s(v):
        return "-" if v is None else f"{v:6.2f}"

    print(f"{r['nodes']:>5} {r['fault']:<12} {r['way']:<9} {r['run']:>3} {s(r.get('detect'))} "
          f"{s(r.get('stop'))} {s(r.get('check_start'))} {s(r.get('resume'))} {s(r.get('running'))} "
          f"{s(r.get('first_step'))} {s(r.get('program_start'))}  {r['result'][:70]}  "
          f"{(r.get('ended') or '')[:90]}", flush=True)


def plan_runs(args: argparse.Namespace) -> list[tuple[int, str, str, int]]:
    """(nodes, fault, way, run) in the order they run: repeat after repeat, each over every
    node count (small first) and every fault; the by-hand runs at the largest count only,
    right after its first repeat.  --budget cuts the last repeats first."""
    order = []
    big = max(args.nodes)
    reps = dict(zip(args.nodes, args.repeat, strict=True))
    for rep in range(1, max(args.repeat) + 1):
        for n in args.nodes:
            if rep > reps[n]:
                continue
            order += [(n, kind, "recovery", rep) for kind in args.faults]
            if n == big and rep == 1:
                for hand in range(1, args.by_hand + 1):
                    order += [(n, kind, "by-hand", hand) for kind in args.faults]
    return order


def mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def _terminated(signum, _frame) -> None:
    """SIGTERM (``timeout``, a CI job's end) ends the benchmark as Ctrl-C does: the run's
    containers and the sandbox are removed on the way out."""
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    signal.signal(signal.SIGTERM, _terminated)
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bench-recovery-"))
    os.environ["CLUSTERCTL_RUNS"] = str(tmp / "runs")
    os.environ["CLUSTERCTL_PLAIN"] = "1"
    loads = benchplot.Loads()
    runs: list[dict] = []
    extra: dict = {"spares": 1}
    code = 0
    try:
        total = max(args.nodes) + 1
        inventory = tmp / "sandbox.yaml"
        t = time.monotonic()
        sb = sandbox.up(total, name=args.name, subnet=args.subnet, slots=1, bandwidth=args.bandwidth,
                        inventory_path=inventory)
        extra["sandbox_up_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        results = distribute.push_image(args.image, load_inventory(inventory), strategy="relay")
        failed = [f"{r.node}: {r.error}" for r in results if not r.ok]
        if failed:
            raise UserError(f"pushing {args.image} to the sandbox failed: " + "; ".join(failed))
        extra["push_s"] = round(time.monotonic() - t, 1)
        print(f"sandbox {args.name}: {total} nodes up in {extra['sandbox_up_s']:.0f} s; image {args.image} "
              f"on every node in {extra['push_s']:.0f} s (not counted); {mem_available_mb():,} MB "
              "of memory available", flush=True)
        bench = Bench(args, sb, tmp, inventory)
        low_mem = mem_available_mb()
        print(f"{'nodes':>5} {'fault':<12} {'way':<9} {'run':>3} {'detect':>6} {'stop':>6} {'chk+st':>6} "
              f"{'resume':>6} {'runnin':>6} {'1st st':>6} {'prog':>6}  result  what happened", flush=True)
        skipped = []
        for n, kind, way, rep in plan_runs(args):
            if time.monotonic() - start > args.budget * 60:
                skipped.append(f"{n} nodes {kind} {way} #{rep}")
                continue
            r = (bench.recovery if way == "recovery" else bench.by_hand)(n, kind, rep).row()
            runs.append(r)
            print_run(r)
            loads.sample()
            low_mem = min(low_mem, mem_available_mb())
            if r["result"] != "ok":
                code = 1
        if skipped:
            extra["note"] = (f"--budget {args.budget:g} min reached: {len(skipped)} run(s) skipped "
                             f"({', '.join(skipped)})")
            print(extra["note"], flush=True)
        extra["mem_available_min_mb"] = low_mem
        doc = json_document(runs, args, extra, benchplot.command_line(), benchplot.conditions(loads))
        print(benchplot.table(doc), flush=True)
        for g in doc["goals"]:
            verdict = "met" if g["met"] else "MISSED"
            print(f"goal: {g['what']}: {g['value']} (limit {g['limit']:g}): {verdict}")
        return code
    finally:
        # what was measured is written and the sandbox removed: not to be cut short by a
        # second Ctrl-C or a SIGTERM
        saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            extra["wall_min"] = round((time.monotonic() - start) / 60, 1)
            if (args.json or args.plot) and runs:   # also what a failed or stopped run measured
                doc = json_document(runs, args, extra, benchplot.command_line(), benchplot.conditions(loads))
                benchplot.save(doc, args.json, args.plot)
        finally:
            sandbox.down(args.name)
            shutil.rmtree(tmp, ignore_errors=True)
            for s, handler in saved.items():
                signal.signal(s, handler)


# --------------------------------------------------------------------------- input

def node_counts(text: str) -> list[int]:
    """``--nodes``: active node counts (2 or more) separated by commas; one spare more each."""
    try:
        counts = sorted({int(x) for x in text.split(",")})
    except ValueError:
        counts = []
    if not counts or not all(2 <= n < sandbox.MAX_NODES for n in counts):
        raise argparse.ArgumentTypeError(
            f'"{text}": give node counts from 2 to {sandbox.MAX_NODES - 1} separated by commas, e.g. 4,8 '
            "(each gets one spare more)")
    return counts


def repeats(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(v >= 1 for v in values):
        raise argparse.ArgumentTypeError(f'"{text}": give runs per fault, 1 or more, e.g. 3,2 (one per '
                                         "--nodes count, or one for all)")
    return values


def fault_kinds(text: str) -> list[str]:
    chosen = list(dict.fromkeys(text.split(",")))
    if not chosen or not all(k in FAULTS for k in chosen):
        raise argparse.ArgumentTypeError(f'"{text}": give some of {",".join(FAULTS)}')
    return chosen


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f'"{text}": give a whole number, 0 or more')
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f'"{text}": give a number above 0')
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default=[4, 8], type=node_counts, help="active node counts, e.g. 4,8")
    p.add_argument("--repeat", default=[3, 2], type=repeats, help="runs per fault at each node count, e.g. 3,2")
    p.add_argument("--faults", default=list(FAULTS), type=fault_kinds, help=",".join(FAULTS))
    p.add_argument("--by-hand", default=1, type=non_negative,
                   help="runs of the by-hand way (fail-fast, then a relaunch) per fault, at the largest node count")
    p.add_argument("--steps", default=30, type=int,
                   help="ddp-smoke's training steps (DDP_SMOKE_STEPS); a run is stopped once every "
                        "rank trained a step after the restart")
    p.add_argument("--fault-step", default=3, type=int, help="inject once this step is checkpointed")
    p.add_argument("--hang-timeout", default=None, type=positive_float,
                   help="seconds of silence that are a hang (sigstop runs only; default: auto, "
                        "10 s or 1.5 x the slowest program start seen + 5 s)")
    p.add_argument("--budget", default=30.0, type=positive_float,
                   help="minutes; runs that would start later are skipped")
    p.add_argument("--bandwidth", default=None, help="shape every link with tc at this rate (default: unshaped)")
    p.add_argument("--image", default=targets.resolve("cpu").tag, help="the cpu target's image")
    p.add_argument("--name", default="brc", help="sandbox name")
    p.add_argument("--subnet", default="10.213.60.0/24", help="sandbox subnet")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write every run, the summary and the run's conditions as JSON (benchmarks/plot.py)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the phases of each fault's restart (benchmarks/plot.py)")
    p.add_argument("--merge", default=None, type=Path, metavar="FILE.json",
                   help="keep FILE's runs of the faults and node counts not measured now (to "
                        "measure one fault again without the others)")
    return p


#: run in the image: its ddp_smoke.py must checkpoint and resume (the cpu image built from
#: an older checkout cannot, and every run would fail after minutes)
RESUME_CHECK = ("import sys; text = open('/opt/clusterctl/examples/ddp_smoke.py').read(); "
                "sys.exit(0 if 'resumed from step' in text and 'CLUSTERCTL_CHECKPOINT_DIR' in text else 3)")


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before a sandbox exists (UserError: exit 2)."""
    benchplot.check_outputs(args.json, args.plot)
    if len(args.repeat) == 1:
        args.repeat = args.repeat * len(args.nodes)
    if len(args.repeat) != len(args.nodes):
        raise UserError(f"--repeat {','.join(map(str, args.repeat))}: give one count, or one per --nodes "
                        f"count ({len(args.nodes)})")
    if not 1 <= args.fault_step < args.steps:
        raise UserError(f"--fault-step {args.fault_step}: give a step from 1 to --steps - 1 ({args.steps - 1}): "
                        "the run must have steps left to resume")
    sandbox.check_name(args.name)
    if args.bandwidth:
        sandbox.check_bandwidth(args.bandwidth)
    sandbox.parse_subnet(args.subnet, max(args.nodes) + 1)
    sandbox.require_environment("benchmarks/recovery.py")
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image
    env = {**os.environ, "DOCKER_HOST": engine.engine_url() or os.environ.get("DOCKER_HOST", "")}
    res = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", args.image,
                          "-c", RESUME_CHECK],
                         capture_output=True, text=True, env=env, timeout=120)
    if res.returncode != 0:
        raise UserError(f"image {args.image}: its /opt/clusterctl/examples/ddp_smoke.py does not checkpoint "
                        "and resume (built from an older checkout?): rebuild it with `make image TARGET=cpu` "
                        f"or give --image REF{(': ' + res.stderr.strip()[-200:]) if res.returncode != 3 else ''}")


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
