"""Benchmark: seconds from `clusterctl check --collective` to its verdict, at 2, 4 and 8 nodes.

On a sandbox of real emulated nodes (own sshd + dockerd each) with the cpu image
(torch + gloo), every node link shaped with tbf (default 20mbit, both directions) so
that the network, not the shared CPU, is what the all_reduce measures; one node's link
is shaped to a tenth of that, and the check must name it (a benchmark of a check that
finds nothing proves little).  Per node count it prints:

* seconds to the verdict (run_check: preflight, containers, all-node all_reduce at
  each size, the pair rounds (3 by default), verdict), split into the time until the slowest
  container had torch loaded and the time spent measuring;
* the verdict, which must name the slow node (with an absolute --min-busbw at half the
  healthy link's rate, since with 2 nodes there is only one pair to compare);
* the previous design, every pair (``--pair-rounds all``: n-1 rounds), where that is more
  than the default 3 rounds (from 5 nodes), run right after on the same links;
* the by-hand way for comparison: finding the node by running one 2-node all_reduce
  per pair, one pair after another (what an engineer with nccl-tests/torchrun does),
  measured once for one pair here and multiplied by the n(n-1)/2 pairs.

Run as root with the local engine up and the cpu image built (`make demo` builds it):

    sudo .venv/bin/python benchmarks/collective.py [--image clusterctl/cpu:2.13.0]
        [--nodes 2,4,8] [--bandwidth 20mbit] [--name bcoll --subnet 10.213.65.0/24]
        [--json FILE] [--plot FILE.png]

``--json FILE`` writes the printed figures and the run's conditions in benchmarks/plot.py's
"collective" shape: ``pair`` (the one 2-node check: seconds, verdict) and per node count
nodes, verdict_s, torch_up_s, measuring_s, all_pairs_s (null: the same as 3 rounds),
by_hand_s, vs_all, vs_hand, verdict, busbw and reference (bytes/s); ``--plot`` draws them.

It creates its own sandbox (name "bcoll", 10.213.65.0/24 by default) and removes it
at the end, also on failure or Ctrl-C; pushing the image to the nodes is not counted.
Bad input (an image the engine lacks, a malformed --nodes/--bandwidth/--name/--subnet,
not root, no engine) is one message and exit status 2, before the sandbox is made.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.core.errors import UserError
from clusterctl.image import targets
from clusterctl.run import launch
from clusterctl.run.collective import check as collective
from clusterctl.run.collective import model

if __package__:                 # imported as benchmarks.collective (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

SIZES = (64 << 10, 256 << 10)      # small: a slow link moves ~250 kB/s
PAIR_BYTES = 256 << 10


def inventory_for(full: Path, n: int, out: Path) -> Path:
    data = yaml.safe_load(full.read_text())
    data["nodes"] = data["nodes"][:n]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def one_check(inv_path: Path, image: str, min_busbw: float | None = None,
              pair_rounds: int | None = model.DEFAULT_PAIR_ROUNDS
              ) -> tuple[collective.CheckResult, float]:
    options = collective.Options(sizes=SIZES, pair_bytes=PAIR_BYTES, iters=3, push=False,
                                 thresholds=model.Thresholds(min_busbw=min_busbw),
                                 pair_rounds=pair_rounds)
    t0 = time.monotonic()
    result = collective.run_check(load_inventory(inv_path), target="cpu", image=image,
                                  options=options)
    return result, time.monotonic() - t0


def node_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 2 or counts[-1] > 16:
        raise argparse.ArgumentTypeError(f'"{text}": give node counts from 2 to 16, e.g. 2,4,8')
    return counts


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=targets.resolve("cpu").tag,
                    help="local image with torch (default: the cpu target's tag)")
    ap.add_argument("--nodes", type=node_counts, default=[2, 4, 8], help="node counts, e.g. 2,4,8")
    ap.add_argument("--bandwidth", default="20mbit", help="tbf rate of every node link")
    ap.add_argument("--name", default="bcoll", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.65.0/24", help="sandbox subnet")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="write the figures and the run's conditions as JSON (benchmarks/plot.py)")
    ap.add_argument("--plot", default=None, metavar="FILE.png",
                    help="draw them: seconds to the verdict against nodes (benchmarks/plot.py)")
    return ap


def check(args: argparse.Namespace) -> None:
    sandbox.check_name(args.name)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    sandbox.check_bandwidth(args.bandwidth)
    try:
        rate_bytes(args.bandwidth)
    except argparse.ArgumentTypeError as e:
        raise UserError(str(e)) from None
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/collective.py")
    distribute.source_image(engine.client(), args.image)


def rate_bytes(rate: str) -> float:
    """tc's '20mbit' -> bytes/s."""
    digits = "".join(c for c in rate if c.isdigit() or c == ".")
    bits = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    octets = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}   # tc: bytes per second
    unit = rate[len(digits):].lower()
    if unit in bits:
        return float(digits) * bits[unit] / 8
    if unit in octets:
        return float(digits) * octets[unit]
    raise argparse.ArgumentTypeError(f'--bandwidth "{rate}": valid: e.g. 20mbit, 500kbit, 1gbit')


def tenth(rate: str) -> str:
    """'20mbit' -> '2mbit' (tc's units)."""
    digits = "".join(c for c in rate if c.isdigit() or c == ".")
    unit = rate[len(digits):]
    return f"{float(digits) / 10:g}{unit}"


def row(n: int, seconds: float, ready: float, done: float, every: float | None, by_hand: float,
        verdict: str, busbw: float | None, reference: float | None) -> dict:
    """One printed row as the JSON holds it (seconds; bus bandwidths in bytes/s)."""
    return {"nodes": n, "verdict_s": round(seconds, 3), "torch_up_s": round(ready, 3),
            "measuring_s": round(done - ready, 3),
            "all_pairs_s": round(every, 3) if every is not None else None,
            "by_hand_s": round(by_hand, 3),
            "vs_all": round(every / seconds, 3) if every is not None else None,
            "vs_hand": round(by_hand / seconds, 3), "verdict": verdict,
            "busbw": busbw, "reference": reference}


def json_document(pair: dict, rows: list[dict], args: argparse.Namespace, push_seconds: float,
                  command: str, conditions: dict) -> dict:
    """The run's figures and conditions as one checked document (plot.py's "collective" shape)."""
    return benchplot.document("collective", command, {
        **conditions, "bandwidth": args.bandwidth, "slow_bandwidth": tenth(args.bandwidth),
        "image": args.image, "push_seconds": round(push_seconds, 1)}, pair=pair, rows=rows)


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-collective-"))
    os.environ["CLUSTERCTL_RUNS"] = str(tmp / "runs")
    most = max(args.nodes)
    rows: list[dict] = []
    pair: dict = {}
    pushed = 0.0
    loads = benchplot.Loads()
    try:
        print(f"sandbox {args.name}: {most} nodes, every link {args.bandwidth} "
              f"(the slow node's {tenth(args.bandwidth)}) ...", flush=True)
        sb = sandbox.up(most, name=args.name, subnet=args.subnet, inventory_path=tmp / "all.yaml",
                        slots=1)
        full = Path(sb.inventory_path)
        t = time.monotonic()
        with Cluster(load_inventory(full)) as cluster:
            launch.push_image(cluster, args.image)
        pushed = time.monotonic() - t
        print(f"image {args.image} pushed to {most} nodes in {time.monotonic() - t:.0f}s "
              "(not counted)", flush=True)
        for node in sb.nodes:
            sandbox.shape_link(sb.name, node.name, args.bandwidth)
        # an absolute floor at half the healthy link's rate: with 2 nodes the relative test has
        # nothing to compare (one pair), as a site would set --min-busbw from its NICs
        floor = rate_bytes(args.bandwidth) / 2
        pair_result, pair_seconds = one_check(inventory_for(full, 2, tmp / "pair.yaml"), args.image)
        print(f"one 2-node check (the by-hand way's unit): {pair_seconds:.1f}s, "
              f"{pair_result.verdict.message}", flush=True)
        pair = {"seconds": round(pair_seconds, 3), "verdict": pair_result.verdict.message}
        print(f"\n{'nodes':>5} {'verdict s':>10} {'torch up s':>11} {'measuring s':>12} "
              f"{'all pairs s':>12} {'by hand s':>10} {'vs all':>7} {'vs hand':>8}  verdict")
        for n in args.nodes:
            slow = f"node{n}"   # the last node of this cut
            sandbox.shape_link(sb.name, slow, tenth(args.bandwidth))
            every: float | None = None
            try:
                inv = inventory_for(full, n, tmp / f"n{n}.yaml")
                result, seconds = one_check(inv, args.image, min_busbw=floor)
                if len(model.round_robin(n)) > model.DEFAULT_PAIR_ROUNDS:
                    previous, every = one_check(inv, args.image, min_busbw=floor, pair_rounds=None)
                    if previous.verdict.named != result.verdict.named:
                        print(f"{'':>5} every pair named {previous.verdict.named}", flush=True)
            finally:
                sandbox.shape_link(sb.name, slow, args.bandwidth)
            reports = result.measurements.reports.values()
            ready = max((r.timeline.get("versions", 0.0) for r in reports), default=0.0)
            done = max((r.timeline.get("done", 0.0) for r in reports), default=0.0)
            by_hand = pair_seconds * n * (n - 1) / 2
            named = result.verdict.named
            flag = "" if named == [slow] or (n == 2 and slow in named) else \
                "  (DID NOT NAME the slow node)"
            all_s = f"{every:>12.1f}" if every is not None else f"{'(= 3 rounds)':>12}"
            vs_all = f"{every / seconds:>6.1f}x" if every is not None else f"{'-':>7}"
            print(f"{n:>5} {seconds:>10.1f} {ready:>11.1f} {done - ready:>12.1f} {all_s} "
                  f"{by_hand:>10.0f} {vs_all} {by_hand / seconds:>7.1f}x  {result.verdict.message}{flag}",
                  flush=True)
            rows.append(row(n, seconds, ready, done, every, by_hand, result.verdict.message + flag,
                            result.verdict.busbw if result.measurements.world else None,
                            result.verdict.reference if result.measurements.world else None))
            loads.sample()
            if result.measurements.world:
                print(f"{'':>5} all-node busbw {model.fmt_rate(result.verdict.busbw)}, "
                      f"median node's best pair {model.fmt_rate(result.verdict.reference)}",
                      flush=True)
    finally:
        if rows and (args.json or args.plot):
            doc = json_document(pair, rows, args, pushed, benchplot.command_line(),
                                benchplot.conditions(loads))
            benchplot.save(doc, args.json, args.plot)
        sandbox.down(args.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
