"""Benchmark: how fast `launch` gets a job running, and how fast it tears one down.

Prints two figures on a sandbox of real emulated nodes (own sshd + dockerd each):

* seconds from calling launch() to every container running, for 1, 2 and 4
  nodes (preflight + start; the image is already on the nodes, so no push),
  split into preflight-and-plan and start;
* seconds from a rank's failure (its container's FinishedAt on its node) to
  the last other container stopped, on 4 nodes.

Run as root (the sandbox creates network namespaces and daemons), with the
local engine up and an image that has python3 (default: the base target's tag,
which `make demo` builds on the way to the cpu image):

    sudo make bench-launch        # or: sudo .venv/bin/python benchmarks/launch.py
        [--image REF] [--repeat 3]

It creates its own sandbox (name "blaunch", 10.213.63.0/24; change with
--name/--subnet) and removes it at the end, also on failure or Ctrl-C.  Bad
input (an image the engine lacks, --repeat below 1, a malformed --name or
--subnet, not root, no engine) is one message saying what is valid and exit
status 2, before the sandbox is made.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from clusterctl.build import targets
from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import ClusterctlError
from clusterctl.run import launch, records, supervise
from clusterctl.run.jobs import load_job

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "fixtures" / "jobs" / "fail-rank.yaml"   # moved with the test fixtures


def inventory_for(full: Path, n: int, out: Path) -> Path:
    """The sandbox inventory cut to its first ``n`` nodes."""
    data = yaml.safe_load(full.read_text())
    data["nodes"] = data["nodes"][:n]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def time_to_running(inv_path: Path, image: str) -> tuple[float, float]:
    """(seconds to all running, of which preflight and plan) for one detached launch, then stop."""
    inventory = load_inventory(inv_path)
    job = load_job(JOB)
    marks: dict[str, float] = {}
    real_start = launch.start_all

    def timed_start(*a, **kw):
        marks["start"] = time.monotonic()
        return real_start(*a, **kw)

    launch.start_all = timed_start
    t0 = time.monotonic()
    try:
        result = launch.launch(job, inventory, image=image, overrides={"FAIL_RANK": "99"},
                               detach=True, push=False,
                               on_started=lambda rec: marks.setdefault("running", time.monotonic()))
    finally:
        launch.start_all = real_start
    with Cluster(inventory) as cluster:
        supervise.stop_run(cluster, result.record, grace=0)
    return marks["running"] - t0, marks["start"] - t0


def time_to_teardown(inv_path: Path, image: str) -> tuple[float, float]:
    """(failure -> last container stopped by node clocks, teardown call seconds), 4 nodes."""
    inventory = load_inventory(inv_path)
    last = str(len(inventory.nodes) - 1)
    result = launch.launch(load_job(JOB), inventory, image=image, push=False, stream=io.StringIO(),
                           overrides={"FAIL_RANK": last, "FAIL_AFTER": "4"})
    out = result.outcome
    assert out.first_failure is not None and out.exit_code == 3, supervise.summary_lines(out)
    stopped = [st.finished.timestamp() for n, st in out.containers.items()
               if st is not None and st.finished and n != out.first_failure.node]
    return max(stopped) - out.first_failure.time, out.teardown_seconds or 0.0


NODES = 4   # the sandbox's size: the teardown figure is taken on 4 nodes


def repeats(text: str) -> int:
    """``--repeat``: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f'"{text}": give a whole number of runs per figure, 1 or more')
    return int(text)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=targets.resolve("base").tag,
                    help="local image with python3 (default: the base target's tag)")
    ap.add_argument("--repeat", type=repeats, default=3, help="runs per figure")
    ap.add_argument("--name", default="blaunch", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.63.0/24", help="sandbox subnet")
    return ap


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before the sandbox exists (exit 2)."""
    sandbox.check_name(args.name)
    sandbox.parse_subnet(args.subnet, NODES)
    sandbox.require_environment("benchmarks/launch.py")
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)   # malformed values: argparse's usage message, exit 2
    try:
        check(args)
        return run(args)
    except ClusterctlError as e:       # what the CLI does: the message, never a traceback
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    os.environ["CLUSTERCTL_RUNS"] = str(tmp / "runs")
    try:
        print(f"sandbox {args.name}: {NODES} nodes ...", flush=True)
        sb = sandbox.up(NODES, name=args.name, subnet=args.subnet, inventory_path=tmp / "all.yaml")
        full = Path(sb.inventory_path)
        t = time.monotonic()
        with Cluster(load_inventory(full)) as cluster:
            launch.push_image(cluster, args.image)
        print(f"image {args.image} pushed to {NODES} nodes in {time.monotonic() - t:.1f}s (not counted)")
        print("\nlaunch -> all containers running (detached launch, image present):")
        print(f"{'nodes':>5} {'median s':>9} {'min s':>7} {'preflight+plan s':>17}")
        for n in (1, 2, 4):
            inv = inventory_for(full, n, tmp / f"n{n}.yaml")
            samples = [time_to_running(inv, args.image) for _ in range(args.repeat)]
            totals = [s[0] for s in samples]
            print(f"{n:>5} {statistics.median(totals):>9.2f} {min(totals):>7.2f} "
                  f"{statistics.median(s[1] for s in samples):>17.2f}", flush=True)
        print("\nrank failure -> last other container stopped (4 nodes):")
        for _ in range(args.repeat):
            node_clock, call = time_to_teardown(full, args.image)
            print(f"  {node_clock:.2f}s by the nodes' clocks (teardown call {call:.2f}s)", flush=True)
        print(f"\n(run records in {records.runs_dir()}, removed with the sandbox)")
    finally:
        sandbox.down(args.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
