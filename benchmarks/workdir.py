"""Benchmark: a one-line edit of train.py until every rank runs it: launch --workdir, by hand, rsync.

On a sandbox of real emulated nodes (own sshd + dockerd each; they share this machine's
cores, 2 on the reference machine), every link shaped with ``tc`` at --bandwidth (each
node's link and this machine's uplink; default 1gbit) so that the network, not the CPU,
is what a transfer costs, and a generated project of --files files (2-20 KB each, in 50
package directories, the same content for the same --seed) plus a train.py that imports
one module of it, prints its VALUE line and exits, it measures, at each node count of
--nodes, three ways of getting an edit onto every node:

* ``workdir``: ``clusterctl launch --target cpu --workdir DIR --nodes INV -- python
  train.py`` (the head snapshots the tree, each node gets only the changed files over one
  SSH command, mounted read-only at /workspace);
* ``by-hand``: the loop people write without it: a Dockerfile ``FROM`` the cpu image with
  ``COPY . /workspace``, ``docker build``, ``clusterctl push``, then ``clusterctl launch`` of a
  job (target cpu, the same torchrun command) naming that image;
* ``rsync``: ``rsync -a --delete`` of the directory to every node in parallel (over SSH to
  each node's address, so every byte crosses that node's link), then ``clusterctl launch``
  of a job with ``mounts: [DIR_ON_NODE:/workspace:ro]`` and the same command.

Each way first ships the tree once (``cold``: nothing of the project on the nodes, nor in
the head's code store), then --repeat times edits one line of train.py (a new VALUE) and
runs it.  The time is from the edit until the launch command has printed every rank's line
with the new value: train.py does nothing else, so this is, to within the program's own
start (torchrun and an ``import torch`` in each container), the time until every rank runs
the new code; the launch runs to the end (the end-to-end time is kept too).  Then the same
with a no-op program (``true``, no torchrun): the way's own share of the loop, edit to
exit; and, for ``workdir``, the no-op launched again on the unchanged tree.

Bytes per node, three figures: what the way itself says it sent (``workdir``: run.json's
``code.sent``, the largest node; ``by-hand``: the image layers the cpu image lacks, what push
sends; ``rsync``: its ``--stats`` "Total bytes sent", the largest node), and what the busiest
node's link carried during the whole loop (the host side of its veth: SSH of preflight, the
code or image, the start: everything).

Before the sandbox: the walk and hashing of the tree (``clusterctl.code.snapshot.take``),
warm and cold (every file's pages dropped with ``posix_fadvise(DONTNEED)`` after a sync;
directory entries stay cached), and the payload a one-line edit, an unchanged tree and the
whole tree would send (``clusterctl.code.sync.payload``), with no node involved.

Run as root (the sandbox makes network namespaces and daemons) with the local engine up,
the cpu image built (``make demo`` builds it) and rsync installed::

    sudo make bench-workdir       # or: sudo .venv/bin/python benchmarks/workdir.py
        [--nodes 1,4,16] [--repeat 3] [--bandwidth 1gbit] [--files 2000] [--seed 1]
        [--ways workdir,by-hand,rsync] [--image REF] [--snapshot-only]
        [--json FILE] [--plot FILE.png]

``--snapshot-only`` measures only the walk, the hashing and the payloads (no root, no
sandbox).  ``--json FILE`` writes every printed row and the run's conditions in
benchmarks/plot.py's "workdir" shape: ``snapshot`` (case, files, mb, median, worst, runs,
how), ``delta`` (what, bytes), ``rows`` (nodes, way, program, cold, median, worst,
each_run, ranks_exit, bytes_node, cold_bytes_node, link_node, phases, result), ``ratios``
(nodes, program, what, value) and ``goals`` (what, limit, value, met); ``--plot`` draws them.

It creates its own sandbox ("bwd", 10.213.77.0/24; change with --name/--subnet) with the
largest node count of --nodes and one rank per node (``slots: 1``; --slots), pushes the
image to it unshaped (not timed), shapes the links, and removes it at the end, also on
failure or Ctrl-C.  When that many nodes cannot be brought up, it says so and goes on with
the largest count of --nodes that can.  Bad input (an image the engine lacks, a malformed
--nodes/--bandwidth/--ways/--name/--subnet, not root, no engine, no rsync) is one message
saying what is valid and exit status 2, before the sandbox is made.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.code import snapshot, store
from clusterctl.code import sync as code_sync
from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image import targets
from clusterctl.run.jobs import TORCHRUN_PREFIX

if __package__:                 # imported as benchmarks.workdir (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

WAYS = ("workdir", "by-hand", "rsync")
PROGRAMS = ("python", "no-op", "no-op, unchanged")
DIRS = 50
#: the line of train.py each edit rewrites, and how a rank prints it
VALUE_LINE = re.compile(r'^VALUE = "[^"]*"$', re.MULTILINE)
TRAIN_PY = '''"""The workdir benchmark's program: import one module of the project, print, exit."""
import os

from pkg00 import mod01

VALUE = "{value}"
print(f"workdir-bench value={{VALUE}} rank={{os.environ.get('RANK', '?')}} {{mod01.NAME}};", flush=True)
'''
RUN_TIMEOUT = 600.0    # seconds one command of a loop may take before the run is called failed
KIB = 1024


# --------------------------------------------------------------------------- the project

def make_tree(root: Path, files: int, seed: int) -> int:
    """``files`` Python files of 2-20 KB in :data:`DIRS` packages (``pkg00/mod01.py``...), the
    same bytes for the same ``seed``, plus train.py; the bytes written."""
    rng = random.Random(seed)
    words = ["loss", "grad", "step", "batch", "layer", "weight", "scale", "token", "mask", "rank",
             "shard", "optim", "sched", "warmup", "decay", "embed", "head", "block", "norm", "proj"]
    total = 0
    per_dir = -(-files // DIRS)
    made = 0
    for d in range(DIRS):
        pkg = root / f"pkg{d:02d}"
        pkg.mkdir(parents=True, exist_ok=True)
        for i in range(per_dir):
            if made == files:
                break
            name = "__init__.py" if i == 0 else f"mod{i:02d}.py"
            size = rng.randint(2048, 20480)
            lines = [f'NAME = "pkg{d:02d}.{name[:-3]}"\n']
            while sum(map(len, lines)) < size:
                a, b = rng.sample(words, 2)
                k = rng.randint(0, 9999)
                lines.append(f"\n\ndef {a}_{b}_{k}(x, y={rng.random():.6f}):\n"
                             f"    # {rng.choice(words)} {rng.choice(words)} {k * 7 % 1013}\n"
                             f"    return x * {rng.random():.6f} + y - {rng.randint(1, 999)}\n")
            text = "".join(lines)
            (pkg / name).write_text(text)
            total += len(text)
            made += 1
    (root / "train.py").write_text(TRAIN_PY.format(value="start"))
    return total + len(TRAIN_PY)


def edit(root: Path, value: str) -> None:
    """Rewrite train.py's VALUE line: the one-line edit."""
    path = root / "train.py"
    text = path.read_text()
    new, count = VALUE_LINE.subn(f'VALUE = "{value}"', text)
    assert count == 1, "train.py lost its VALUE line"
    path.write_text(new)


def drop_pages(root: Path) -> None:
    """Every file's pages out of the page cache (written back first)."""
    os.sync()
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def snapshot_rows(root: Path, runs: int = 5) -> list[dict]:
    """The walk and hashing of the tree (``snapshot.take``), cold and warm: median and worst."""
    rows = []
    files = mb = 0
    for case in ("cold", "warm"):
        times = []
        snapshot.take(root)                       # warm-up (and the warm case's page cache)
        for _ in range(runs):
            if case == "cold":
                drop_pages(root)
            t = time.perf_counter()
            snap = snapshot.take(root)
            times.append(time.perf_counter() - t)
            files, mb = snap.file_count, snap.total_bytes / 1e6
        how = ("each file's pages dropped (posix_fadvise DONTNEED after sync), directory entries "
               "cached" if case == "cold" else "everything in the page cache")
        rows.append(snapshot_row(case, files, mb, times, how))
    return rows


def snapshot_row(case: str, files: int, mb: float, times: list[float], how: str) -> dict:
    return {"case": case, "files": files, "mb": round(mb, 2),
            "median": round(statistics.median(times), 4), "worst": round(max(times), 4),
            "runs": len(times), "how": how}


def delta_rows(root: Path, cache: Path) -> list[dict]:
    """Payload bytes (``sync.payload``: the drop list and the gzip'd tar a node gets) for a
    one-line edit and for the whole tree, with no node involved (a node that has the tree
    already is sent nothing: the no-op on the unchanged tree shows it)."""
    saved = os.environ.get("CLUSTERCTL_CACHE")
    os.environ["CLUSTERCTL_CACHE"] = str(cache)     # the store the payloads are read from
    try:
        before = store.save(snapshot.take(root))
        edit(root, "delta" + uuid.uuid4().hex[:8])
        after = store.save(snapshot.take(root))
        edit_bytes = len(code_sync.payload(after, before.entries)[0])
        whole = len(code_sync.payload(after, None)[0])
    finally:
        if saved is None:
            os.environ.pop("CLUSTERCTL_CACHE", None)
        else:
            os.environ["CLUSTERCTL_CACHE"] = saved
    return [{"what": "one-line edit", "bytes": edit_bytes},
            {"what": "whole tree (a node with none of it)", "bytes": whole}]


# --------------------------------------------------------------------------- one command, timed

@dataclass
class Timed:
    """One command of a loop: when (seconds since the edit) each stderr line, the last rank's
    line with the new value, and the exit came."""

    rc: int
    exit_s: float
    ranks_s: float | None = None
    err: list[tuple[float, str]] = field(default_factory=list)
    out: str = ""

    def at(self, pattern: str) -> float | None:
        for t, line in self.err:
            if re.search(pattern, line):
                return t
        return None


def timed(argv: list[str], env: dict[str, str], t0: float, value: str | None = None,
          ranks: int = 0) -> Timed:
    """Run ``argv``; stamp its output against ``t0`` (the edit); with ``value``, the time the
    ``ranks``-th distinct rank printed ``value=VALUE``."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         stdin=subprocess.DEVNULL)
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, "out")
    sel.register(p.stderr, selectors.EVENT_READ, "err")
    bufs = {"out": b"", "err": b""}
    result = Timed(rc=-1, exit_s=0.0)
    seen: set[str] = set()
    pattern = re.compile(rf"value={re.escape(value)} rank=(\d+) ") if value else None
    out_parts: list[str] = []
    deadline = time.monotonic() + RUN_TIMEOUT
    live = 2
    while live:
        left = deadline - time.monotonic()
        if left <= 0:
            p.kill()
            break
        for key, _ in sel.select(timeout=min(left, 5.0)):
            data = os.read(key.fileobj.fileno(), 65536)
            now = time.monotonic() - t0
            if not data:
                sel.unregister(key.fileobj)
                live -= 1
                continue
            bufs[key.data] += data
            while b"\n" in bufs[key.data]:
                raw, bufs[key.data] = bufs[key.data].split(b"\n", 1)
                line = raw.decode(errors="replace")
                if key.data == "err":
                    result.err.append((now, line))
                    continue
                out_parts.append(line)
                if pattern is not None:
                    seen.update(pattern.findall(line))
                    if result.ranks_s is None and len(seen) >= ranks:
                        result.ranks_s = now
    result.rc = p.wait()
    result.exit_s = time.monotonic() - t0
    result.out = "\n".join(out_parts)
    return result


def failure(what: str, t: Timed) -> str:
    tail = " / ".join(line for _, line in t.err[-3:]) or t.out[-300:]
    return f"{what} exited {t.rc}: {tail[-400:]}".replace("|", "/")


# --------------------------------------------------------------------------- one measured loop

@dataclass
class Measure:
    """One loop of one way: the figure (edit -> every rank printed the new value; for a no-op,
    edit -> exit), the end, bytes, and where the time went."""

    seconds: float
    exit_s: float
    payload: int | None          # bytes the way says it sent, the largest node
    link: int                    # bytes the busiest node's link carried, the whole loop
    phases: dict[str, float]
    ok: bool = True
    error: str = ""


class Links:
    """Bytes each node received: the host side of its veth (tx), from the kernel."""

    def __init__(self, sb: sandbox.Sandbox, n: int) -> None:
        self.paths = [Path(f"/sys/class/net/{node.veth}/statistics/tx_bytes") for node in sb.nodes[:n]]

    def read(self) -> list[int]:
        return [int(p.read_text()) for p in self.paths]


class Bench:
    """The sandbox, the project and the commands of every way."""

    def __init__(self, args: argparse.Namespace, sb: sandbox.Sandbox, tmp: Path, project: Path,
                 full_inventory: Path) -> None:
        self.args, self.sb, self.tmp, self.project = args, sb, tmp, project
        self.full_inventory = full_inventory
        self.cli = [sys.executable, "-m", "clusterctl"]
        # the code imported here, with its bytecode as installed (benchplot.cli_env)
        self.env = benchplot.cli_env(os.environ, DOCKER_HOST=engine.engine_url() or "",
                                     CLUSTERCTL_RUNS=str(tmp / "runs"))
        self.tag = f"clusterctl-bench/workdir-{args.name}:hand"
        key, known = sb.key_path, sb.known_hosts_path
        self.ssh = (f"ssh -F /dev/null -i {key} -o UserKnownHostsFile={known} "
                    "-o StrictHostKeyChecking=yes -o BatchMode=yes")
        self.jobs = self._write_jobs()
        self.base_layers = len(engine.client().images.get(args.image).history())

    def _write_jobs(self) -> dict[tuple[str, str], Path]:
        python = [*TORCHRUN_PREFIX, "/workspace/train.py"]
        mount = f"{sandbox.data_base() / self.sb.name}/{{node_name}}/rsync-work:/workspace:ro"
        jobs = {}
        for way, extra in (("by-hand", {}), ("rsync", {"mounts": [mount]})):
            for program, command in (("python", python), ("no-op", ["true"])):
                path = self.tmp / f"{way}-{program}.yaml"
                path.write_text(yaml.safe_dump({"target": "cpu", **extra, "command": command},
                                               sort_keys=False))
                jobs[(way, program)] = path
        return jobs

    def inventory(self, n: int) -> Path:
        data = yaml.safe_load(self.full_inventory.read_text())
        data["nodes"] = data["nodes"][:n]
        path = self.tmp / f"inventory-{n}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def node_dir(self, i: int) -> Path:
        return sandbox.data_base() / self.sb.name / f"node{i}"

    def forget(self, n: int) -> None:
        """Nothing of the project on the nodes or in the head's code store: the cold case."""
        for i in range(1, n + 1):
            for sub in ("code", "rsync-work"):
                shutil.rmtree(self.node_dir(i) / sub, ignore_errors=True)
        shutil.rmtree(self.tmp / "cache", ignore_errors=True)

    # ----------------------------------------------------------------- the ways

    def loop(self, way: str, n: int, program: str) -> Measure:
        """Edit (unless the program is the unchanged no-op), then the way's commands; timed."""
        value = uuid.uuid4().hex[:12]
        links = Links(self.sb, n)
        before = links.read()
        t0 = time.monotonic()
        if program != "no-op, unchanged":
            edit(self.project, value)
        try:
            m = getattr(self, way.replace("-", "_"))(n, program, value, t0)
        except RunFailed as e:
            m = Measure(time.monotonic() - t0, time.monotonic() - t0, None, 0, {}, ok=False,
                        error=str(e))
        m.link = max(b - a for a, b in zip(before, links.read(), strict=True))
        return m

    def _launch_figure(self, t: Timed, program: str) -> float:
        if program == "python":
            if t.ranks_s is None:
                raise RunFailed(f"not every rank printed the new value: {failure('launch', t)}")
            return t.ranks_s
        return t.exit_s

    def workdir(self, n: int, program: str, value: str, t0: float) -> Measure:
        run_id = f"bwd-{value}"
        command = ["python", "train.py"] if program == "python" else ["true"]
        argv = [*self.cli, "launch", "--target", "cpu", "--workdir", str(self.project),
                "--nodes", str(self.inventory(n)), "--run-id", run_id, "--", *command]
        env = {**self.env, "CLUSTERCTL_CACHE": str(self.tmp / "cache")}
        t = timed(argv, env, t0, value if program == "python" else None, n * self.args.slots)
        if t.rc != 0:
            raise RunFailed(failure("clusterctl launch --workdir", t))
        record = json.loads((self.tmp / "runs" / run_id / "run.json").read_text())
        sent = (record.get("code") or {}).get("sent") or {}
        code, shipped, running = t.at(r"^code: "), t.at(r"^code \w+ on \d+ node"), t.at(r"containers running")
        phases = {"snapshot": code, "ship": _minus(shipped, code), "start": _minus(running, shipped)}
        if program == "python":
            phases["ranks"] = _minus(t.ranks_s, running)
        phases["end"] = _minus(t.exit_s, t.ranks_s if program == "python" else running)
        return Measure(self._launch_figure(t, program), t.exit_s, max(sent.values(), default=0), 0,
                       _rounded(phases))

    def by_hand(self, n: int, program: str, value: str, t0: float) -> Measure:
        dockerfile = self.tmp / "Dockerfile.hand"
        dockerfile.write_text(f"FROM {self.args.image}\nCOPY . /workspace\nWORKDIR /workspace\n")
        build = timed(["docker", "build", "-q", "-f", str(dockerfile), "-t", self.tag, str(self.project)],
                      self.env, t0)
        if build.rc != 0:
            raise RunFailed(failure("docker build", build))
        inv = str(self.inventory(n))
        push = timed([*self.cli, "push", self.tag, "--nodes", inv], self.env, t0)
        if push.rc != 0:
            raise RunFailed(failure("clusterctl push", push))
        t = timed([*self.cli, "launch", str(self.jobs[("by-hand", program)]), "--nodes", inv,
                   "--image", self.tag], self.env, t0, value if program == "python" else None,
                  n * self.args.slots)
        if t.rc != 0:
            raise RunFailed(failure("clusterctl launch", t))
        history = engine.client().images.get(self.tag).history()
        layer = sum(h.get("Size") or 0 for h in history[:len(history) - self.base_layers])
        figure = self._launch_figure(t, program)
        phases = {"build": build.exit_s, "push": push.exit_s - build.exit_s,
                  "launch": figure - push.exit_s}
        return Measure(figure, t.exit_s, layer, 0, _rounded(phases))

    def rsync(self, n: int, program: str, value: str, t0: float) -> Measure:
        procs = []
        for i, node in enumerate(self.sb.nodes[:n], start=1):
            dest = f"root@{node.ip}:{self.node_dir(i) / 'rsync-work'}/"
            procs.append(subprocess.Popen(
                ["rsync", "-a", "--delete", "--stats", "-e", self.ssh, f"{self.project}/", dest],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        sent = []
        for p in procs:
            out, err = p.communicate(timeout=RUN_TIMEOUT)
            if p.returncode != 0:
                raise RunFailed(f"rsync exited {p.returncode}: {err.strip()[-300:]}")
            m = re.search(r"Total bytes sent: ([\d,.]+)", out)
            sent.append(int(m.group(1).replace(",", "").replace(".", "")) if m else 0)
        synced = time.monotonic() - t0
        t = timed([*self.cli, "launch", str(self.jobs[("rsync", program)]), "--nodes",
                   str(self.inventory(n))], self.env, t0, value if program == "python" else None,
                  n * self.args.slots)
        if t.rc != 0:
            raise RunFailed(failure("clusterctl launch", t))
        figure = self._launch_figure(t, program)
        return Measure(figure, t.exit_s, max(sent), 0, _rounded({"rsync": synced, "launch": figure - synced}))


class RunFailed(Exception):
    """One loop that did not get every rank running the new value."""


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _rounded(phases: dict[str, float | None]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in phases.items() if v is not None}


# --------------------------------------------------------------------------- rows

def row(n: int, way: str, program: str, cold: Measure | None, runs: list[Measure]) -> dict:
    """One printed row as the JSON holds it: the cold loop's figure, median and worst of the
    repeats (seconds), bytes per node (median of the repeats), and where the time went."""
    ok = [m for m in runs if m.ok]

    def med(xs):
        return round(statistics.median(xs), 3) if xs else None

    phases: dict[str, float] = {}
    for key in dict.fromkeys(k for m in ok for k in m.phases):
        values = [m.phases[key] for m in ok if key in m.phases]
        phases[key] = round(statistics.median(values), 2)
    payloads = [m.payload for m in ok if m.payload is not None]
    failed = [m.error for m in [*runs, *([cold] if cold else [])] if not m.ok]
    return {"nodes": n, "way": way, "program": program,
            "cold": round(cold.seconds, 3) if cold and cold.ok else None,
            "median": med([m.seconds for m in ok]) if ok else 0.0,
            "worst": round(max(m.seconds for m in ok), 3) if ok else None,
            "each_run": [round(m.seconds, 3) for m in ok],
            "ranks_exit": med([m.exit_s for m in ok]) if program == "python" else None,
            "bytes_node": int(statistics.median(payloads)) if payloads else None,
            "cold_bytes_node": cold.payload if cold and cold.ok else None,
            "link_node": int(statistics.median([m.link for m in ok])) if ok else None,
            "phases": phases or None,
            "result": "ok" if not failed else "FAILED: " + failed[0][:300]}


def ratio_rows(rows: list[dict]) -> list[dict]:
    """by-hand / workdir and rsync / workdir, medians, per node count and program."""
    by = {(r["nodes"], r["way"], r["program"]): r for r in rows if r["result"] == "ok"}
    out = []
    for (n, way, program), r in by.items():
        if way != "workdir":
            continue
        for other in ("by-hand", "rsync"):
            o = by.get((n, other, program))
            if o and r["median"]:
                out.append({"nodes": n, "program": program, "what": f"{other} / workdir",
                            "value": round(o["median"] / r["median"], 2)})
    return out


def goal_rows(rows: list[dict], delta: list[dict]) -> list[dict]:
    """The issue's goals, each against what was measured (value None: not measured here)."""
    by = {(r["nodes"], r["way"], r["program"]): r for r in rows if r["result"] == "ok"}

    def figure(n, program, key="median"):
        r = by.get((n, "workdir", program))
        return None if r is None else r.get(key)

    edit_bytes = next((d["bytes"] for d in delta if d["what"] == "one-line edit"), None)
    goals = [("workdir's own share (no-op after an edit, edit to exit), 4 nodes", 4, "no-op", 3.0, "median"),
             ("workdir's own share (no-op after an edit, edit to exit), 16 nodes", 16, "no-op", 5.0, "median"),
             ("no-op job end to end (unchanged tree), 4 nodes", 4, "no-op, unchanged", 2.0, "median"),
             ("bytes per node for a one-line edit (run.json code.sent, largest node)", None,
              "no-op", 64 * KIB, "bytes_node"),
             ("bytes per node for an unchanged tree", None, "no-op, unchanged", 0, "bytes_node")]
    out = []
    for what, n, program, limit, key in goals:
        if n is None:     # the largest over every node count measured
            values = [r[key] for (_, way, p), r in by.items() if way == "workdir" and p == program
                      and r.get(key) is not None]
            if program == "no-op":
                values += [r[key] for (_, way, p), r in by.items() if way == "workdir"
                           and p == "python" and r.get(key) is not None]
            value = max(values) if values else None
        else:
            value = figure(n, program, key)
        out.append({"what": what, "limit": limit, "value": value,
                    "met": None if value is None else value <= limit})
    if edit_bytes is not None:
        out.append({"what": "payload of a one-line edit in the tree (sync.payload, no node)",
                    "limit": 64 * KIB, "value": edit_bytes, "met": edit_bytes <= 64 * KIB})
    return out


def snapshot_goals(snap: list[dict]) -> list[dict]:
    warm = next((r for r in snap if r["case"] == "warm"), None)
    if warm is None:
        return []
    return [{"what": f"walk and hashing of the {warm['files']:,}-file tree, warm (median)",
             "limit": 0.5, "value": warm["median"], "met": warm["median"] <= 0.5}]


def json_document(snap: list[dict], delta: list[dict], rows: list[dict], args: argparse.Namespace,
                  extra: dict, command: str, conditions: dict) -> dict:
    """The run's rows and conditions as one checked document (plot.py's "workdir" shape)."""
    return benchplot.document("workdir", command, {
        **conditions, "bandwidth": args.bandwidth, "files": args.files, "repeat": args.repeat,
        "image": args.image, "slots": args.slots, "seed": args.seed, **extra},
        snapshot=snap, delta=delta, rows=rows, ratios=ratio_rows(rows),
        goals=snapshot_goals(snap) + (goal_rows(rows, delta) if rows else []))


# --------------------------------------------------------------------------- the run

def print_row(r: dict) -> None:
    def s(v):
        return "-" if v is None else f"{v:.2f}"

    def b(v):
        return "-" if v is None else f"{v:,}"

    where = " ".join(f"{k} {v:.2f}" for k, v in (r["phases"] or {}).items())
    print(f"{r['nodes']:>5} {r['way']:<8} {r['program']:<17} {s(r['cold']):>7} {s(r['median']):>7} "
          f"{s(r['worst']):>7} {b(r['bytes_node']):>12} {b(r['cold_bytes_node']):>12} "
          f"{b(r['link_node']):>12}  {r['result'][:60]}  {where}", flush=True)


def hold(args: argparse.Namespace, inventory: Path) -> sandbox.Sandbox:
    """The sandbox with the largest node count that comes up (unshaped for now)."""
    for n in sorted(args.nodes, reverse=True):
        try:
            sb = sandbox.up(n, name=args.name, subnet=args.subnet, slots=args.slots,
                            inventory_path=inventory)
        except ClusterctlError as e:
            print(f"a sandbox of {n} nodes did not come up ({e.message}); trying fewer", flush=True)
            sandbox.down(args.name)
            continue
        avail = mem_available_mb()
        if avail < 1024 and n > min(args.nodes):
            print(f"{n} nodes leave {avail} MB of memory available; trying fewer", flush=True)
            sandbox.down(args.name)
            continue
        return sb
    raise UserError(f"no sandbox of {min(args.nodes)} node(s) came up")


def mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bench-workdir-"))
    project = tmp / "project"
    loads = benchplot.Loads()
    snap: list[dict] = []
    delta: list[dict] = []
    rows: list[dict] = []
    extra: dict = {}
    counts = list(args.nodes)
    code = 0
    try:
        size = make_tree(project, args.files, args.seed)
        print(f"project: {args.files:,} files + train.py, {size / 1e6:.1f} MB (seed {args.seed})", flush=True)
        snap = snapshot_rows(project)
        delta = delta_rows(project, tmp / "delta-cache")
        print(f"{'walk+hash':<10} {'files':>6} {'MB':>6} {'median s':>9} {'worst s':>8}", flush=True)
        for r in snap:
            print(f"{r['case']:<10} {r['files']:>6} {r['mb']:>6.1f} {r['median']:>9.3f} {r['worst']:>8.3f}  "
                  f"({r['how']})")
        for d in delta:
            print(f"payload, {d['what']}: {d['bytes']:,} bytes", flush=True)
        if not args.snapshot_only:
            inventory = tmp / "sandbox.yaml"
            sb = hold(args, inventory)
            if sb.node_count < max(args.nodes):
                counts = [n for n in args.nodes if n <= sb.node_count]
                extra["note"] = (f"{max(args.nodes)} nodes could not be held on this machine: "
                                 f"measured at {','.join(map(str, counts))}")
                print(extra["note"], flush=True)
            t = time.monotonic()
            results = distribute.push_image(args.image, load_inventory(inventory), strategy="relay")
            failed = [f"{r.node}: {r.error}" for r in results if not r.ok]
            if failed:
                raise UserError(f"pushing {args.image} to the sandbox failed: " + "; ".join(failed))
            extra["push_s"] = round(time.monotonic() - t, 1)
            print(f"image {args.image} on {sb.node_count} nodes in {extra['push_s']:.0f} s (unshaped, "
                  f"not counted); links now shaped at {args.bandwidth}; "
                  f"{mem_available_mb():,} MB of memory available", flush=True)
            sb = sandbox.up(sb.node_count, name=args.name, subnet=args.subnet, slots=args.slots,
                            bandwidth=args.bandwidth, inventory_path=inventory)
            extra["nodes_held"] = sb.node_count
            bench = Bench(args, sb, tmp, project, inventory)
            low_mem = mem_available_mb()
            print(f"{'nodes':>5} {'way':<8} {'program':<17} {'cold s':>7} {'median':>7} {'worst':>7} "
                  f"{'bytes/node':>12} {'cold bytes':>12} {'link bytes':>12}  result  where (median s)",
                  flush=True)
            for n in counts:
                bench.forget(n)
                # the cold loop: the first ship of the whole tree, with the program
                cold = {(w, "python"): bench.loop(w, n, "python") for w in args.ways}
                runs: dict[tuple[str, str], list[Measure]] = {
                    (w, p): [] for w in args.ways
                    for p in (PROGRAMS if w == "workdir" else PROGRAMS[:2])}
                for _ in range(args.repeat):
                    for w in args.ways:          # the ways alternated: drift hits them alike
                        for p in PROGRAMS[:2]:
                            runs[(w, p)].append(bench.loop(w, n, p))
                        if w == "workdir":
                            runs[(w, PROGRAMS[2])].append(bench.loop(w, n, PROGRAMS[2]))
                    loads.sample()
                    low_mem = min(low_mem, mem_available_mb())
                for (w, p), measured in runs.items():
                    rows.append(row(n, w, p, cold.get((w, p)), measured))
                    print_row(rows[-1])
                    if rows[-1]["result"] != "ok":
                        code = 1
            extra["mem_available_min_mb"] = low_mem
            for r in ratio_rows(rows):
                print(f"{r['nodes']:>5} {r['program']:<17} {r['what']}: {r['value']:.2f}x")
        for g in snapshot_goals(snap) + (goal_rows(rows, delta) if rows else []):
            verdict = "not measured" if g["met"] is None else ("met" if g["met"] else "MISSED")
            print(f"goal: {g['what']}: {g['value']} (limit {g['limit']:g}): {verdict}")
        return code
    finally:
        if (args.json or args.plot) and (snap or rows):   # also what a failed or stopped run measured
            doc = json_document(snap, delta, rows, args, extra, benchplot.command_line(),
                                benchplot.conditions(loads))
            benchplot.save(doc, args.json, args.plot)
        if not args.snapshot_only:
            sandbox.down(args.name)
            try:
                engine.client().images.remove(f"clusterctl-bench/workdir-{args.name}:hand", force=True)
            except Exception:  # noqa: BLE001 - never built, or gone
                pass
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- input

def ways(text: str) -> list[str]:
    """``--ways``: some of workdir, by-hand, rsync, separated by commas."""
    chosen = list(dict.fromkeys(text.split(",")))
    if not chosen or not all(w in WAYS for w in chosen):
        raise argparse.ArgumentTypeError(f'"{text}": give some of {",".join(WAYS)}')
    return chosen


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default=[1, 4, 16], type=benchplot.node_counts("1,4,16"), help="node counts, e.g. 1,4,16")
    p.add_argument("--repeat", default=3, type=benchplot.positive_int, help="edit -> run loops per figure, after the cold one")
    p.add_argument("--bandwidth", default="1gbit", help="tbf rate per link, e.g. 1gbit")
    p.add_argument("--files", default=2000, type=benchplot.positive_int, help="files in the generated project")
    p.add_argument("--seed", default=1, type=int, help="seed of the generated project's content")
    p.add_argument("--ways", default=list(WAYS), type=ways, help=",".join(WAYS))
    p.add_argument("--image", default=targets.resolve("cpu").tag,
                   help="the cpu target's image (FROM of the by-hand Dockerfile)")
    p.add_argument("--slots", default=1, type=benchplot.positive_int, help="ranks per node")
    p.add_argument("--name", default="bwd", help="sandbox name")
    p.add_argument("--subnet", default="10.213.77.0/24", help="sandbox subnet")
    p.add_argument("--snapshot-only", action="store_true",
                   help="only the walk, the hashing and the payloads (no root, no sandbox)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write every row and the run's conditions as JSON (benchmarks/plot.py)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the rows: seconds and bytes per node against nodes (benchmarks/plot.py)")
    return p


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before a sandbox exists (UserError: exit 2)."""
    benchplot.check_outputs(args.json, args.plot)
    if args.snapshot_only:
        return
    sandbox.check_name(args.name)
    sandbox.check_bandwidth(args.bandwidth)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    sandbox.require_environment("benchmarks/workdir.py")
    missing = [tool for tool, way in (("rsync", "rsync"), ("docker", "by-hand"))
               if way in args.ways and shutil.which(tool) is None]
    if missing:
        raise UserError(f"{', '.join(missing)} not found: install it (apt-get install -y "
                        f"{' '.join('rsync' if t == 'rsync' else 'docker.io' for t in missing)}) "
                        "or leave its way out of --ways")
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
