"""Benchmark: what ``clusterctl top`` costs a running training (issue 43: "goal < 1%").

A ddp-smoke training runs detached on the nodes of ``--nodes`` (real torchrun and gloo in the
cpu image, one rank a node), its steps compute-bound (``DDP_SMOKE_BUSY=1``: each step spends
``--step`` seconds computing, so anything else taking CPU from a rank shows in its step rate).
The benchmark then alternates phases of ``--phase`` seconds: ``off`` (nothing reads the
nodes) and ``on`` (``clusterctl top RUN --json --interval 2`` running as a user starts it, a
process of its own, its output thrown away), ``--repeat`` times each.  At the end the
training's metrics lines are read once from every node, and each phase's step rate is rank
0's steps in the phase over its seconds (the first and last second of each phase left out).

Prints per phase the step rate, then the mean rate of the ``on`` phases against the ``off``
ones (the cost, in %), the spread of the ``off`` phases (the noise it is to be read against),
and the CPU seconds ``top``'s process took per refresh on this machine.

It creates its own sandbox (name "btop", 10.213.71.0/24, ``--count`` nodes, default 2),
pushes ``--image`` to it (default clusterctl/cpu:test, the tests' cpu image: its ddp_smoke.py
must know DDP_SMOKE_BUSY) and removes it at the end, also on failure or Ctrl-C; or it uses
the nodes of ``--nodes INVENTORY``, which must have the image already.  Run as root:

    sudo make bench-top        # or: sudo .venv/bin/python benchmarks/top.py
        [--count 2] [--phase 20] [--repeat 3] [--step 0.1] [--image TAG] [--json FILE]

On the sandbox the nodes and this machine share the same cores, so top's own CPU on the head
competes with the ranks: an upper bound of the cost on a cluster whose head is its own machine.
Bad input (a missing inventory, --phase under 5, --repeat or --count under 1, an image without
the hook) is one message and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from clusterctl.cluster import distribute, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.nodetop import read_nodes
from clusterctl.cluster.transport.cluster import Cluster
from clusterctl.run import records
from clusterctl.run import top as run_top
from clusterctl.run.metrics import parse_line

CLUSTERCTL = [sys.executable, "-m", "clusterctl"]


def children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def launch(inventory: Path, image: str, step: float, run_id: str) -> None:
    argv = [*CLUSTERCTL, "launch", "ddp-smoke", "--nodes", str(inventory), "--image", image,
            "--nproc-per-node", "1", "--detach", "--run-id", run_id,
            "--set", "DDP_SMOKE_STEPS=1000000", "--set", f"DDP_SMOKE_STEP_SECONDS={step}",
            "--set", "DDP_SMOKE_BUSY=1", "--set", "DDP_SMOKE_METRICS=1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"launch failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def wait_stepping(run_id: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = subprocess.run([*CLUSTERCTL, "top", run_id, "--once", "--json"], capture_output=True,
                             text=True, timeout=120)
        if got.returncode == 0:
            rows = json.loads(got.stdout.strip().splitlines()[-1])["nodes"]
            if all((r["steps_per_s"] or 0) > 0 for r in rows):
                return
        time.sleep(3)
    raise SystemExit(f"run {run_id}: the ranks did not step within {timeout:g} s")


def rank0_samples(run_id: str) -> list:
    """Every metrics line of rank 0, read once from the nodes at the end (one command a node)."""
    record = records.load(run_id)
    inventory = load_inventory(record.inventory)
    where = run_top.where(record, inventory)
    with Cluster(inventory) as cluster:
        got = read_nodes(cluster, where[:1], timeout=60, log_lines=1_000_000, keep=1_000_000)
    read = got[where[0].node]
    if read.error:
        raise SystemExit(f"reading {where[0].node}: {read.error}")
    return [s for s in (parse_line(x) for x in read.metric_lines) if s is not None and s.rank == 0]


def rate(samples: list, start: float, end: float) -> float:
    inside = [s for s in samples if start + 1 <= s.time <= end - 1]
    if len(inside) < 2:
        return float("nan")
    return (inside[-1].step - inside[0].step) / (inside[-1].time - inside[0].time)


def has_hook(image: str) -> bool:
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "grep", image,
                           "-q", "DDP_SMOKE_BUSY", "/opt/clusterctl/examples/ddp_smoke.py"],
                          capture_output=True, timeout=120)
    return done.returncode == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=Path, help="an inventory whose nodes have the image (default: "
                                              "a sandbox of --count nodes, made and removed here)")
    p.add_argument("--count", type=int, default=2, help="nodes of the sandbox made here")
    p.add_argument("--name", default="btop", help="sandbox name")
    p.add_argument("--subnet", default="10.213.71.0/24", help="sandbox subnet")
    p.add_argument("--image", default=os.environ.get("CLUSTERCTL_TEST_CPU_TAG", "clusterctl/cpu:test"))
    p.add_argument("--phase", type=float, default=20.0, help="seconds of each phase")
    p.add_argument("--repeat", type=int, default=3, help="off/on pairs")
    p.add_argument("--step", type=float, default=0.1, help="seconds each step computes")
    p.add_argument("--json", type=Path, help="write the figures here too")
    a = p.parse_args()
    if (a.nodes is not None and not a.nodes.is_file()) or a.phase < 5 or a.repeat < 1 or a.step <= 0 \
            or a.count < 1:
        print("benchmarks/top.py: --nodes must be an inventory file, --phase >= 5, --repeat >= 1, "
              "--count >= 1, --step > 0", file=sys.stderr)
        return 2
    if a.nodes is not None:
        return measure(a, a.nodes)
    sandbox.require_environment("benchmarks/top.py")
    if not has_hook(a.image):
        print(f"benchmarks/top.py: image {a.image} lacks DDP_SMOKE_BUSY in its ddp_smoke.py: rebuild it "
              "(the tests' cpu image fixture, or `make image TARGET=cpu` and --image)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-top-"))
    try:
        t = time.monotonic()
        sandbox.up(a.count, name=a.name, subnet=a.subnet, slots=1, inventory_path=tmp / "sandbox.yaml")
        up_s = time.monotonic() - t
        t = time.monotonic()
        failed = [f"{r.node}: {r.error}" for r in distribute.push_image(
            a.image, load_inventory(tmp / "sandbox.yaml"), strategy="relay") if not r.ok]
        if failed:
            raise SystemExit("pushing the image failed: " + "; ".join(failed))
        print(f"sandbox {a.name}: {a.count} nodes up in {up_s:.0f} s, image pushed in "
              f"{time.monotonic() - t:.0f} s (not counted)", flush=True)
        return measure(a, tmp / "sandbox.yaml")
    finally:
        sandbox.down(a.name)
        shutil.rmtree(tmp, ignore_errors=True)


def measure(a: argparse.Namespace, inventory: Path) -> int:
    os.environ.setdefault("CLUSTERCTL_RUNS", tempfile.mkdtemp(prefix="bench-top-runs-"))
    run_id = f"bench-top-{uuid.uuid4().hex[:6]}"
    launch(inventory, a.image, a.step, run_id)
    phases: list[dict] = []
    try:
        wait_stepping(run_id)
        for i in range(a.repeat):
            for kind in ("off", "on"):
                start = time.time()
                if kind == "off":
                    time.sleep(a.phase)
                    phases.append({"kind": kind, "start": start, "end": time.time()})
                    continue
                cpu0 = children_cpu()
                proc = subprocess.Popen([*CLUSTERCTL, "top", run_id, "--json", "--interval", "2"],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
                time.sleep(a.phase)
                proc.terminate()
                out, _ = proc.communicate(timeout=30)
                refreshes = len(out.splitlines())
                phases.append({"kind": kind, "start": start, "end": time.time(), "refreshes": refreshes,
                               "top_cpu_s": children_cpu() - cpu0})
            print(f"pair {i + 1}/{a.repeat} done", flush=True)
        samples = rank0_samples(run_id)
    finally:
        subprocess.run([*CLUSTERCTL, "stop", run_id], capture_output=True, timeout=300)
    for ph in phases:
        ph["steps_per_s"] = rate(samples, ph["start"], ph["end"])
        extra = (f", top: {ph['refreshes']} refreshes, {ph['top_cpu_s']:.2f} s CPU"
                 if ph["kind"] == "on" else "")
        print(f"{ph['kind']:>3}: {ph['steps_per_s']:.3f} steps/s{extra}")
    off = [ph["steps_per_s"] for ph in phases if ph["kind"] == "off"]
    on = [ph["steps_per_s"] for ph in phases if ph["kind"] == "on"]
    cost = (statistics.mean(off) - statistics.mean(on)) / statistics.mean(off) * 100
    noise = (max(off) - min(off)) / statistics.mean(off) * 100
    ons = [ph for ph in phases if ph["kind"] == "on"]
    per_refresh = sum(ph["top_cpu_s"] for ph in ons) / max(1, sum(ph["refreshes"] for ph in ons))
    nodes = len(load_inventory(inventory).nodes)
    print(f"{nodes} nodes, step {a.step:g} s computing, phases of {a.phase:g} s x {a.repeat}")
    print(f"step rate without top {statistics.mean(off):.3f}/s, with top {statistics.mean(on):.3f}/s: "
          f"cost {cost:+.2f}% (off phases spread {noise:.2f}%)")
    print(f"top's own CPU on this machine: {per_refresh * 1000:.0f} ms per refresh "
          f"(a refresh every 2 s: {per_refresh / 2 * 100:.1f}% of one core)")
    if a.json:
        a.json.write_text(json.dumps({"nodes": nodes, "step": a.step, "phase": a.phase, "phases": phases,
                                      "cost_percent": cost, "noise_percent": noise,
                                      "top_cpu_per_refresh_s": per_refresh}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
