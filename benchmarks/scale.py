"""Scale benchmark: a chatty job on 16 sandbox nodes - clusterctl's memory, and every line.

Every node runs tests/fixtures/jobs/chatty.yaml: --rate numbered lines a second for
--seconds seconds (16 x 625 lines/s x 30 s = 300,000 lines, about 10,000 a second in
all).  Each run is ``clusterctl launch`` as a user runs it, in a process of its own
whose stdout this benchmark reads; every 0.5 s it samples that process's resident
memory (VmRSS; VmHWM, the kernel's peak, at the end) and threads.  The log merger is
not a process of its own: it is threads of the launch process (one ``docker logs -f``
stream per node feeding one bounded queue, one writer; clusterctl.run.logs), so the
process's memory is the merger's plus the rest of launch.

Runs, on one sandbox:

* ``keeps up``     - stdout read as fast as it comes;
* ``stalled``      - the reader does not read for --stall seconds at the start (a
                     terminal that cannot keep up, a paused pager), then reads all;
* ``stalled, unbounded`` - the same with the design before issue 12 (the same code with
                     the merge queue unbounded and the 16 MiB SSH window on the streams):
                     its memory grows with the backlog;
* ``by hand``      - the containers started by ``launch --detach``, then what people
                     do without clusterctl: one ``ssh NODE docker logs -f`` per node
                     (OpenSSH), all into one pipe; memory is the sum of the ssh clients.

For each: lines expected, received on stdout (per node by sequence number: missing,
duplicated, out of order), lines in runs/<id>/<node>.log and merged.log, peak and
steady memory (median of the samples after the first quarter), and ratios against
``keeps up``.  Also timed: the sandbox coming up and going down, the image push.

How to run (root: the sandbox makes network namespaces and daemons)::

    sudo make bench-scale         # or: sudo .venv/bin/python benchmarks/scale.py
        [--nodes 16] [--rate 625] [--seconds 30] [--stall 10] [--image REF]
        [--runs keeps-up,stalled,unbounded,by-hand] [--name bscale --subnet 10.213.66.0/24]
        [--json FILE] [--plot FILE.png]

``--json FILE`` writes every printed row (run, wall, exit, stdout, missing, duplicated,
out_of_order, garbled, node_log, merged, peak_mb, steady_mb, growth_mb, threads, note) and
the run's conditions (nodes, rate, seconds, stall, sandbox up/down and push seconds) in
benchmarks/plot.py's "scale" shape; ``--plot`` draws them (memory per run).

The nodes are network namespaces on THIS machine: their sshd, dockerd, the jobs and
clusterctl share its cores (say so next to any figure).  Bad input (an image the engine
lacks, a malformed number, --name or --subnet, not root, no engine) is one message
saying what is valid and exit status 2, before the sandbox is made.  The sandbox is
removed at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.image import targets
from clusterctl.run import launch, records, supervise
from clusterctl.run.jobs import load_job

if __package__:                 # imported as benchmarks.scale (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "fixtures" / "jobs" / "chatty.yaml"
RUNS = ("keeps-up", "stalled", "unbounded", "by-hand")
SAMPLE_EVERY = 0.5

# a merged line: "node3[2]| chatty node=2 seq=41 xxx..."; by hand there is no prefix
_PREFIXED = re.compile(r"^node(\d+)\[(\d+)\]\| (.*)\Z")
_CHATTY = re.compile(r"^chatty node=(\d+) seq=(\d+) x+\Z")

# "clusterctl launch" with the design before issue 12: the merge queue unbounded and the
# streams' SSH window as large as a push's (the same code otherwise)
_UNBOUNDED = ("import sys\n"
              "import clusterctl.run.logs as logs, clusterctl.cluster.containers as c\n"
              "from clusterctl.cluster.transport import WINDOW_SIZE\n"
              "logs.QUEUE_LINES, c.STREAM_WINDOW_SIZE = 0, WINDOW_SIZE\n"
              "from clusterctl.cli import main\n"
              "sys.argv[0] = 'clusterctl'\n"
              "main()\n")


# --------------------------------------------------------------------------- counting lines


@dataclass
class Tally:
    """Lines of the chatty job seen in one stream, per node rank."""

    expected: int                       # per node
    nodes: int
    seqs: dict[int, set[int]] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    duplicated: int = 0
    out_of_order: int = 0
    misattributed: int = 0              # prefix names another node than the line's own
    garbled: int = 0                    # neither a chatty line nor clusterctl's own text
    other: int = 0                      # clusterctl's own lines (run started, summary...)
    done: int = 0                       # each node's last line, "chatty done node=..."

    def add(self, text: str, prefix_rank: int | None = None) -> None:
        m = _CHATTY.match(text)
        if m is None:
            if text.startswith("chatty done node=") and " seq=" not in text:
                self.done += 1
            elif "chatty" in text or "seq=" in text or text.startswith("xx"):
                self.garbled += 1       # by hand: two nodes' output interleaved mid-line
            else:
                self.other += 1
            return
        rank, seq = int(m.group(1)), int(m.group(2))
        if prefix_rank is not None and prefix_rank != rank:
            self.misattributed += 1
        got = self.seqs.setdefault(rank, set())
        if seq in got:
            self.duplicated += 1
        got.add(seq)
        if seq < self.last.get(rank, -1):
            self.out_of_order += 1
        self.last[rank] = seq

    @property
    def received(self) -> int:
        return sum(len(s) for s in self.seqs.values())

    @property
    def missing(self) -> int:
        return self.expected * self.nodes - sum(len(s & set(range(self.expected)))
                                                for s in self.seqs.values())

    @property
    def clean(self) -> bool:
        return not (self.missing or self.duplicated or self.out_of_order or self.misattributed
                    or self.garbled)


def tally_files(run_dir: Path, nodes: list[str], expected: int) -> tuple[Tally, int]:
    """The per-node logs of runs/<id>/ (raw lines; node i's file holds rank i-1's) and the
    number of chatty lines in merged.log."""
    t = Tally(expected, len(nodes))
    for rank, node in enumerate(nodes):
        path = run_dir / f"{node}.log"
        if path.is_file():
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    t.add(line.rstrip("\n"), prefix_rank=rank)
    merged = 0
    if (run_dir / records.MERGED_LOG).is_file():
        with open(run_dir / records.MERGED_LOG, encoding="utf-8", errors="replace") as f:
            merged = sum(1 for line in f if "| chatty node=" in line and " seq=" in line)
    return t, merged


# --------------------------------------------------------------------------- memory


@dataclass
class Memory:
    """Samples of resident memory (MB) and threads of a set of processes, every 0.5 s."""

    rss: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    hwm: float = 0.0                    # the kernel's peak (VmHWM), summed over the processes
    first_line: int = 0                 # index of the first sample after the job's first line

    @property
    def peak(self) -> float:
        return max([self.hwm, *self.rss], default=0.0)

    @property
    def at_first_line(self) -> float:
        """When the job's first line arrived: clusterctl up, connected, streams open."""
        return self.rss[min(self.first_line, len(self.rss) - 1)] if self.rss else 0.0

    @property
    def growth(self) -> float:
        """Peak while the job printed and after, over the memory at its first line."""
        later = self.rss[self.first_line:]
        return max(later) - self.at_first_line if later else 0.0

    @property
    def steady(self) -> float:
        """Median from the job's first line on (start-up: imports, connections, the push check)."""
        tail = self.rss[self.first_line:]
        return statistics.median(tail) if tail else 0.0


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def sample(pids, stop: threading.Event, mem: Memory) -> None:
    """Sample the processes ``pids()`` names until ``stop``."""
    hwm: dict[int, float] = {}
    while not stop.is_set():
        rss, threads = 0.0, 0
        for pid in pids():
            st = _status(pid)
            if not st:
                continue
            rss += int(st.get("VmRSS", "0 kB").split()[0]) / 1024
            threads += int(st.get("Threads", "0").strip() or 0)
            hwm[pid] = int(st.get("VmHWM", "0 kB").split()[0]) / 1024
        if rss:
            mem.rss.append(rss)
            mem.threads.append(threads)
            mem.hwm = sum(hwm.values())
        stop.wait(SAMPLE_EVERY)


# --------------------------------------------------------------------------- one run


@dataclass
class Result:
    name: str
    seconds: float
    exit_code: int
    stdout: Tally
    memory: Memory
    files: Tally | None = None
    merged: int = 0
    note: str = ""


def launch_argv(args, inv: Path, run_id: str, *, unbounded: bool) -> list[str]:
    head = [sys.executable, "-c", _UNBOUNDED] if unbounded else [sys.executable, "-m", "clusterctl"]
    return [*head, "launch", str(JOB), "--nodes", str(inv), "--image", args.image,
            "--run-id", run_id, "--set", f"CHATTY_RATE={args.rate}",
            "--set", f"CHATTY_SECONDS={args.seconds}"]


def run_launch(args, inv: Path, nodes: list[str], name: str, *, stall: float,
               unbounded: bool = False) -> Result:
    """``clusterctl launch`` in its own process; stdout read (after ``stall`` seconds)."""
    expected = int(args.rate * args.seconds)
    run_id = f"scale-{re.sub(r'[^a-z]+', '-', name)}-{int(time.time())}"
    env = benchplot.cli_env(os.environ, CLUSTERCTL_PLAIN="1")   # with its bytecode, as installed
    t0 = time.monotonic()
    with open(args.tmp / f"{name}.stderr", "w") as err:
        proc = subprocess.Popen(launch_argv(args, inv, run_id, unbounded=unbounded),
                                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                env=env, text=True, encoding="utf-8", errors="replace")
        mem, stop = Memory(), threading.Event()
        sampler = threading.Thread(target=sample, args=(lambda: [proc.pid], stop, mem), daemon=True)
        sampler.start()
        tally = Tally(expected, len(nodes))

        def take(line: str) -> None:
            m = _PREFIXED.match(line.rstrip("\n"))
            if m is None:
                tally.other += 1
            else:
                tally.add(m.group(3), prefix_rank=int(m.group(2)))

        try:
            for line in proc.stdout:     # up to the job's first line: clusterctl is up
                take(line)
                if tally.received:
                    break
            first_line = len(mem.rss)
            time.sleep(stall)            # then the reader stalls (or not)
            for line in proc.stdout:
                take(line)
            code = proc.wait()
        finally:
            stop.set()
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        sampler.join()
    seconds = time.monotonic() - t0
    mem.first_line = first_line
    files, merged = tally_files(records.runs_dir() / run_id, nodes, expected)
    return Result(name, seconds, code, tally, mem, files, merged)


def run_by_hand(args, sb, inv: Path, nodes: list[str]) -> Result:
    """Containers started by ``launch --detach``; then one ``ssh NODE docker logs -f``
    per node into one shared pipe, read here; then ``stop`` removes the containers."""
    expected = int(args.rate * args.seconds)
    inventory = load_inventory(inv)
    t0 = time.monotonic()
    started = launch.launch(load_job(JOB), inventory, image=args.image, detach=True, push=False,
                            overrides={"CHATTY_RATE": str(args.rate),
                                       "CHATTY_SECONDS": str(args.seconds)})
    read_fd, write_fd = os.pipe()
    procs = []
    address = {x.name: x.ip for x in sb.nodes}
    try:
        for n in started.record.nodes:
            ip = address[n.node]
            procs.append(subprocess.Popen(
                ["ssh", "-F", "/dev/null", "-i", str(sb.key_path), "-o", "BatchMode=yes",
                 "-o", f"UserKnownHostsFile={sb.known_hosts_path}", "-o", "StrictHostKeyChecking=yes",
                 "-o", "LogLevel=ERROR", f"root@{ip}", "docker", "logs", "-f", n.container],
                stdout=write_fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        os.close(write_fd)
        mem, stop = Memory(), threading.Event()
        sampler = threading.Thread(target=sample, args=(lambda: [p.pid for p in procs], stop, mem),
                                   daemon=True)
        sampler.start()
        tally = Tally(expected, len(nodes))
        with open(read_fd, encoding="utf-8", errors="replace") as f:
            for line in f:
                tally.add(line.rstrip("\n"))
        codes = [p.wait() for p in procs]
        stop.set()
        sampler.join()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait()
        with Cluster(inventory) as cluster:
            supervise.stop_run(cluster, started.record, grace=0)
    return Result("by hand", time.monotonic() - t0, max(codes, default=0), tally, mem,
                  note=f"{len(procs)} ssh clients into one pipe")


# --------------------------------------------------------------------------- report


def report(results: list[Result], args) -> None:
    expected = int(args.rate * args.seconds) * args.nodes
    print(f"\n{args.nodes} nodes x {args.rate:g} lines/s x {args.seconds:g} s = {expected:,} lines "
          f"(~{args.rate * args.nodes:,.0f} lines/s in all); the nodes and clusterctl share this "
          f"machine's {os.cpu_count()} cores")
    print(f"{'run':<20} {'wall s':>7} {'exit':>4} {'stdout':>8} {'missing':>7} {'dup':>4} "
          f"{'order':>5} {'garbled':>7} {'node.log':>8} {'merged':>8} {'peak MB':>8} "
          f"{'steady MB':>9} {'growth MB':>9} {'threads':>7}")
    for r in results:
        files = f"{r.files.received:,}" if r.files else "-"
        merged = f"{r.merged:,}" if r.files else "-"
        print(f"{r.name:<20} {r.seconds:>7.1f} {r.exit_code:>4} {r.stdout.received:>8,} "
              f"{r.stdout.missing:>7,} {r.stdout.duplicated:>4} {r.stdout.out_of_order:>5} "
              f"{r.stdout.garbled + r.stdout.misattributed:>7} {files:>8} {merged:>8} "
              f"{r.memory.peak:>8.1f} {r.memory.steady:>9.1f} {r.memory.growth:>9.1f} "
              f"{max(r.memory.threads, default=0):>7}")
    print("(growth: peak after the job's first line arrived minus the memory then; "
          "steady: median over the same samples)")
    base = next((r for r in results if r.name == "keeps up"), None)
    if base is not None and base.memory.peak:
        print("\nratios against 'keeps up' (same sandbox, same run):")
        for r in results:
            if r is not base:
                print(f"  {r.name:<20} peak memory x{r.memory.peak / base.memory.peak:.2f}, "
                      f"growth {r.memory.growth:+.1f} MB vs {base.memory.growth:+.1f} MB, "
                      f"wall x{r.seconds / base.seconds:.2f}" + (f"  ({r.note})" if r.note else ""))
    for r in results:
        problems = [] if r.stdout.clean else [f"stdout: {r.stdout.missing} missing, "
                                              f"{r.stdout.duplicated} duplicated, "
                                              f"{r.stdout.out_of_order} out of order, "
                                              f"{r.stdout.garbled} garbled, "
                                              f"{r.stdout.misattributed} under another node's prefix"]
        if r.files is not None and (not r.files.clean or r.merged != expected):
            problems.append(f"runs/: {r.files.missing} missing, {r.files.duplicated} duplicated "
                            f"in the node logs; {r.merged:,} of {expected:,} in merged.log")
        if problems:
            print(f"  LINES LOST OR DAMAGED in '{r.name}': " + "; ".join(problems))


def row(r: Result) -> dict:
    """One printed row as the JSON holds it."""
    return {"run": r.name, "wall": round(r.seconds, 3), "exit": r.exit_code,
            "stdout": r.stdout.received, "missing": r.stdout.missing,
            "duplicated": r.stdout.duplicated, "out_of_order": r.stdout.out_of_order,
            "garbled": r.stdout.garbled + r.stdout.misattributed,
            "node_log": r.files.received if r.files else None,
            "merged": r.merged if r.files else None,
            "peak_mb": round(r.memory.peak, 2), "steady_mb": round(r.memory.steady, 2),
            "growth_mb": round(r.memory.growth, 2), "threads": max(r.memory.threads, default=0),
            "note": r.note or None}


def json_document(rows: list[dict], args, timings: dict[str, float], command: str,
                  conditions: dict) -> dict:
    """The run's rows and conditions as one checked document (plot.py's "scale" shape)."""
    return benchplot.document("scale", command, {
        **conditions, "nodes": args.nodes, "rate": args.rate, "seconds": args.seconds,
        "stall": args.stall, "image": args.image,
        **{k: round(v, 2) for k, v in timings.items()}}, rows=rows)


# --------------------------------------------------------------------------- main


def positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f'"{text}": give a number above 0')
        return value
    return parse


def run_names(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in RUNS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f'"{text}": give some of {",".join(RUNS)}, comma-separated')
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=positive(int), default=16, help="sandbox nodes (1 process each)")
    ap.add_argument("--rate", type=positive(float), default=625.0, help="lines a second per node")
    ap.add_argument("--seconds", type=positive(float), default=30.0, help="how long each node prints")
    ap.add_argument("--stall", type=positive(float), default=10.0,
                    help="seconds the reader does not read in the stalled runs")
    ap.add_argument("--runs", type=run_names, default=list(RUNS), help=",".join(RUNS))
    ap.add_argument("--image", default=targets.resolve("base").tag,
                    help="local image with python3 (default: the base target's tag)")
    ap.add_argument("--name", default="bscale", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.66.0/24", help="sandbox subnet")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="write every row and the run's conditions as JSON (benchmarks/plot.py)")
    ap.add_argument("--plot", default=None, metavar="FILE.png",
                    help="draw the rows: memory per run (benchmarks/plot.py)")
    return ap


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before the sandbox exists (exit 2)."""
    sandbox.check_name(args.name)
    sandbox.check_nodes(args.nodes)
    sandbox.parse_subnet(args.subnet, args.nodes)
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/scale.py")
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


def run(args: argparse.Namespace) -> int:
    args.tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    os.environ["CLUSTERCTL_RUNS"] = str(args.tmp / "runs")
    inv = args.tmp / "inventory.yaml"
    results: list[Result] = []
    timings: dict[str, float] = {}
    loads = benchplot.Loads()
    try:
        t = time.monotonic()
        sb = sandbox.up(args.nodes, name=args.name, subnet=args.subnet, slots=1, inventory_path=inv)
        timings["sandbox_up_s"] = time.monotonic() - t
        print(f"sandbox {args.name}: {args.nodes} nodes up in {time.monotonic() - t:.1f}s", flush=True)
        nodes = [n.name for n in sb.nodes]
        t = time.monotonic()
        with Cluster(load_inventory(inv)) as cluster:
            launch.push_image(cluster, args.image)
        timings["push_s"] = time.monotonic() - t
        print(f"image {args.image} pushed to {args.nodes} nodes in {time.monotonic() - t:.1f}s",
              flush=True)
        for name in args.runs:
            print(f"run: {name} ...", flush=True)
            if name == "keeps-up":
                results.append(run_launch(args, inv, nodes, "keeps up", stall=0))
            elif name == "stalled":
                results.append(run_launch(args, inv, nodes, "stalled", stall=args.stall))
            elif name == "unbounded":
                results.append(run_launch(args, inv, nodes, "stalled, unbounded",
                                          stall=args.stall, unbounded=True))
            else:
                results.append(run_by_hand(args, sb, inv, nodes))
            loads.sample()
        report(results, args)
    finally:
        t = time.monotonic()
        sandbox.down(args.name)
        timings["sandbox_down_s"] = time.monotonic() - t
        print(f"\nsandbox {args.name} down in {time.monotonic() - t:.1f}s")
        shutil.rmtree(args.tmp, ignore_errors=True)
        if results and (args.json or args.plot):
            doc = json_document([row(r) for r in results], args, timings,
                                benchplot.command_line(), benchplot.conditions(loads))
            benchplot.save(doc, args.json, args.plot)
    bad = [r for r in results if r.name != "by hand" and (r.exit_code or not r.stdout.clean)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
