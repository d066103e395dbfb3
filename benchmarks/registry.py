"""Registry benchmark: the cpu image to 4 and 8 nodes by registry pulls, by the relay, and both.

One sandbox of the largest node count with a registry (``sandbox up --registry``:
Distribution on this machine's bridge address, TLS) and every link shaped at
--bandwidth (each node's link and this machine's uplink, tc tbf: the head's link has
rate B like every node's).  For each node count N (the first N nodes), three ways of
getting the image onto every node:

* ``pull`` (a): this machine pushes the image to the registry (local: the registry is
  on this machine, not behind the shaped link), then every node ``docker pull``s it by
  digest (``registry/pull.py``): N copies of the registry's (gzip) layers cross the
  head's link;
* ``relay`` (b): ``clusterctl push`` without a registry, its defaults (strategy auto,
  zstd decided by measurement): the nodes forward the stream along a chain;
* ``registry+relay`` (c): ``clusterctl push`` with ``registry:`` in the inventory
  (``cli/push.py``'s ``_push_registry``): the push to the registry, the layers by the
  relay, then each node's ``docker pull REF@sha256:...``, which finds the image ID and
  fetches only the manifest.

and two cases:

* cold - the nodes have none of the image's layers (every image removed from their
  engines, ``image prune -a``) and the registry is empty (stopped, its storage removed,
  started again): the whole image goes everywhere;
* warm - an image FROM the first with one new layer of --layer-mb random MB (a fresh
  one per way, so the registry never has it yet); the nodes hold the first image, got
  the way (a) gets it (by pull: an engine that loaded a layer knows no registry digest
  for it) and the registry holds it.

The cold runs go relay, registry+relay, pull (so that the warm pull finds what pulls
left), then the warm runs pull, relay, registry+relay.  Measured per run: seconds until
every node holds the image (its image ID checked on the node; by digest for pull and
registry+relay), the bytes that crossed the head's link (the sandbox bridge's tx
counter: every byte this machine sent to a node, SSH and TLS framing included; the
push to the registry stays on this machine) as MB and as x S, and T/(S/B), with S the
image's size in the engine and B the shaped rate; for pull and registry+relay their
phases (registry s, relay s, pull s); and the share of this machine's cores that were
busy (every node's sshd, dockerd and ssh run on them: near 1.0, the run waited on the
CPU, not on the links).  After every node count: the ratios a/c and b/c (seconds and
head bytes, medians); at the end the goal: with a registry configured, 8 nodes cold
cost at most 1.3 x S/B of the head's link.

How to run (root: the sandbox makes network namespaces and daemons)::

    sudo make bench-registry      # or: sudo .venv/bin/python benchmarks/registry.py
        [--nodes 4,8] [--repeat 2] [--bandwidth 500mbit] [--image REF] [--layer-mb 5]
        [--budget 25] [--json FILE] [--plot FILE.png]

``--repeat`` runs every (node count, case, way) that many times, repeat after repeat,
each over every node count; ``--budget`` (minutes, sandbox time included) skips the runs
that would start after it (the last repeats first) and says so.  ``--json FILE`` writes
every printed row, the ratios, the goals and the run's conditions (date, host, cores,
load average seen, bandwidth, B, S, S/B, the registry's size of the image) in
benchmarks/plot.py's "registry" shape; ``--plot`` draws them.

Bad input (an image the engine lacks, a malformed --nodes/--bandwidth/--repeat/
--layer-mb/--budget, --name or --subnet, not root, no engine, no docker-registry) is
one message saying what is valid and exit status 2, before any sandbox is made.  The
sandbox ("brg" on 10.213.77.0/24 unless --name/--subnet), its registry and the images
the benchmark built or tagged are removed at the end, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.registry import pull as registry_pull
from clusterctl.cluster.registry import push as registry_push
from clusterctl.cluster.sandbox import registry as sandbox_registry
from clusterctl.cluster.transport import Cluster
from clusterctl.image import targets

if __package__:                 # imported as benchmarks.registry (the tests)
    from . import plot as benchplot
    from . import push as benchpush
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot
    import push as benchpush

WAYS = ("pull", "relay", "registry+relay")
LETTER = {"pull": "a", "relay": "b", "registry+relay": "c"}
#: the order of the runs for one node count: the warm pull needs nodes that pulled the base
ORDER = (("cold", "relay"), ("cold", "registry+relay"), ("cold", "pull"),
         ("warm", "pull"), ("warm", "relay"), ("warm", "registry+relay"))
GOAL = 1.3   # x S/B of the head's link, 8 nodes, with a registry configured


@dataclasses.dataclass
class Outcome:
    """One way, one run: seconds, its phases, the relay's wire, the failures."""

    seconds: float = 0.0
    registry_s: float | None = None
    relay_s: float | None = None
    pull_s: float | None = None
    wire: str | None = None
    failures: list[str] = dataclasses.field(default_factory=list)
    tagged: str | None = None     # the registry tag the push left in this machine's engine


def subset(inventory, n: int):
    """The inventory of its first ``n`` nodes (the sandbox is made once, for the most)."""
    return dataclasses.replace(inventory, nodes=inventory.nodes[:n])


def _push(ref: str, registry, out: Outcome):
    t = time.monotonic()
    pushed = registry_push.push(ref, registry)
    out.registry_s, out.tagged = time.monotonic() - t, pushed.tagged
    return pushed


def _pull(inventory, pushed, registry, names: list[str], out: Outcome) -> None:
    t = time.monotonic()
    with Cluster(inventory) as cluster:
        pulled = registry_pull.pull(cluster, pushed.reference, pushed.image_id,
                                    registry=registry.address,
                                    auth=registry_push.credentials(registry), nodes=names)
    out.pull_s = time.monotonic() - t
    out.failures += [f"{r.node}: {r.error}" for r in pulled if not r.ok]


def _wire(results) -> str | None:
    found = sorted({r.compression.split()[0] for r in results if r.compression})
    return ",".join(found) or None


def way_pull(ref: str, inventory) -> Outcome:
    """(a) push to the registry, then every node pulls by digest."""
    out = Outcome()
    t = time.monotonic()
    pushed = _push(ref, inventory.registry, out)
    _pull(inventory, pushed, inventory.registry, inventory.names, out)
    out.seconds = time.monotonic() - t
    return out


def way_relay(ref: str, inventory) -> Outcome:
    """(b) ``clusterctl push IMAGE --nodes INV`` without a registry: the CLI's defaults."""
    out = Outcome()
    t = time.monotonic()
    results = distribute.push_image(ref, dataclasses.replace(inventory, registry=None),
                                    strategy="auto", compress=None)
    out.seconds = out.relay_s = time.monotonic() - t
    out.wire = _wire(results)
    out.failures = [f"{r.node}: {r.error}" for r in results if not r.ok]
    return out


def way_registry_relay(ref: str, inventory) -> Outcome:
    """(c) what ``clusterctl push IMAGE --nodes INV`` does with ``registry:`` in the inventory
    (cli/push.py ``_push_registry``): push to the registry, relay the layers, pull by digest."""
    out = Outcome()
    t = time.monotonic()
    pushed = _push(ref, inventory.registry, out)
    t_relay = time.monotonic()
    relayed = distribute.push_image(ref, inventory, strategy="auto", compress=None)
    out.relay_s = time.monotonic() - t_relay
    out.wire = _wire(relayed)
    lost = {r.node for r in relayed if not r.ok}
    out.failures = [f"{r.node}: {r.error}" for r in relayed if not r.ok]
    _pull(inventory, pushed, inventory.registry, [n for n in inventory.names if n not in lost], out)
    out.seconds = time.monotonic() - t
    return out


RUN = {"pull": way_pull, "relay": way_relay, "registry+relay": way_registry_relay}


# --------------------------------------------------------------------------- state


def forget(name: str, nodes: int) -> None:
    """Every image out of every node's engine, and every layer with it: cold nodes."""
    def one(i: int) -> None:
        node = f"node{i}"
        ids = sandbox.node_docker(name, node, "images", "-aq").stdout.split()
        if ids:
            sandbox.node_docker(name, node, "image", "rm", "-f", *sorted(set(ids)))
        sandbox.node_docker(name, node, "image", "prune", "-af")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(1, nodes + 1)))


def empty_registry(sb) -> None:
    """The sandbox's registry with nothing stored: stopped, its storage removed, started
    again (its in-memory blob cache goes with the process)."""
    sandbox_registry.stop(sb.name)
    shutil.rmtree(sb.registry_storage, ignore_errors=True)
    sandbox_registry.start(sb)


def stored_size(sb, reference: str) -> int | None:
    """Bytes the registry stores of the image ``reference`` (HOST:PORT/NAME@DIGEST): its
    manifest's config and layers (gzip, as the engine pushed them), read over TLS."""
    repo_digest = reference.split("/", 1)[1]
    repo, digest = repo_digest.split("@")
    ctx = ssl.create_default_context(cafile=str(sb.registry_ca))
    conn = http.client.HTTPSConnection(sb.head_ip, sb.registry_port, context=ctx, timeout=10)
    try:
        conn.request("GET", f"/v2/{repo}/manifests/{digest}", headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                      "application/vnd.oci.image.manifest.v1+json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        manifest = json.loads(resp.read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    return manifest["config"]["size"] + sum(layer["size"] for layer in manifest.get("layers", []))


# --------------------------------------------------------------------------- rows


class Cpu:
    """The share of this machine's cores that were busy between two reads (/proc/stat):
    near 1.0, the run waited on the CPU (every node shares these cores), not on the links."""

    def __init__(self) -> None:
        self.last = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]       # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    def busy(self) -> float:
        now = self._read()
        busy, total = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return busy / total if total else 0.0


def row(n: int, way: str, case: str, out: Outcome, head: int, size: int, ideal: float,
        run: int, cpu_busy: float | None = None) -> dict:
    """One printed row as the JSON holds it."""
    def r1(v):
        return None if v is None else round(v, 2)

    return {"nodes": n, "way": way, "case": case, "seconds": round(out.seconds, 2),
            "head_mb": round(head / 1e6, 1), "x_s": round(head / size, 3),
            "t_over_ideal": round(out.seconds / ideal, 2), "registry_s": r1(out.registry_s),
            "relay_s": r1(out.relay_s), "pull_s": r1(out.pull_s), "wire": out.wire,
            "cpu_busy": r1(cpu_busy), "run": run,
            "result": "ok" if not out.failures else "FAILED: " + "; ".join(out.failures)[:300]}


def ratios(rows: list[dict]) -> list[dict]:
    """a/c and b/c per node count and case, from the medians of the runs that succeeded."""
    found = []
    ok = [r for r in rows if r["result"] == "ok"]
    for n in sorted({r["nodes"] for r in ok}):
        for case in ("cold", "warm"):
            med = {}
            for way in WAYS:
                mine = [r for r in ok if (r["nodes"], r["case"], r["way"]) == (n, case, way)]
                if mine:
                    med[way] = (statistics.median(r["seconds"] for r in mine),
                                statistics.median(r["head_mb"] for r in mine))
            if "registry+relay" not in med:
                continue
            c_s, c_b = med["registry+relay"]
            for way in ("pull", "relay"):
                if way not in med:
                    continue
                s, b = med[way]
                letter = LETTER[way]
                if c_s:
                    found.append({"nodes": n, "case": case, "what": f"{letter}/c seconds",
                                  "value": round(s / c_s, 2)})
                if c_b:
                    found.append({"nodes": n, "case": case, "what": f"{letter}/c head bytes",
                                  "value": round(b / c_b, 2)})
    return found


def goals(rows: list[dict], nodes: int = 8) -> list[dict]:
    """The issue's goal, at ``nodes`` cold with a registry configured (registry+relay):
    what the head's link carries (x S: its time in S/B) and the whole wall time (x S/B);
    and the pull way's link cost, the 8 x S/B the goal rules out."""
    def med(way: str, key: str):
        values = [r[key] for r in rows if (r["nodes"], r["case"], r["way"]) == (nodes, "cold", way)
                  and r["result"] == "ok" and r.get(key) is not None]
        return round(statistics.median(values), 2) if values else None

    found = []
    for what, way, key in (
            (f"{nodes} nodes cold, push with a registry: head link busy (bytes / S, in S/B)",
             "registry+relay", "x_s"),
            (f"{nodes} nodes cold, push with a registry: wall time (x S/B)", "registry+relay",
             "t_over_ideal"),
            (f"{nodes} nodes cold, every node pulls: head link busy (bytes / S, in S/B)", "pull",
             "x_s")):
        value = med(way, key)
        found.append({"what": what, "limit": GOAL, "value": value,
                      "met": None if value is None else value <= GOAL})
    return found


def json_document(rows: list[dict], conditions_: dict, command: str) -> dict:
    """The run's rows, ratios, goals and conditions as one checked document (plot.py's
    "registry" shape)."""
    return benchplot.document("registry", command, conditions_, rows=rows,
                              ratios=ratios(rows), goals=goals(rows, max(r["nodes"] for r in rows)))


def print_row(r: dict) -> None:
    def s(v, width=8, digits=1):
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"

    print(f"{r['nodes']:>5} {r['case']:<5} {r['run']:>3} {r['way']:<15} {r['seconds']:>8.1f} "
          f"{r['t_over_ideal']:>6.2f} {r['head_mb']:>8.1f} {r['x_s']:>7.3f} {s(r['registry_s'])} "
          f"{s(r['relay_s'])} {s(r['pull_s'])} {r['wire'] or '-':<5} {s(r['cpu_busy'], 4, 2)} "
          f"{r['result'][:120]}", flush=True)


# --------------------------------------------------------------------------- the run


def plan_runs(args: argparse.Namespace) -> list[tuple[int, int, str, str]]:
    """(repeat, nodes, case, way) in the order they run: repeat after repeat, each over
    every node count (small first), each in ORDER.  --budget cuts the last ones first."""
    return [(rep, n, case, way) for rep in range(1, args.repeat + 1) for n in args.nodes
            for case, way in ORDER]


def _terminated(signum, _frame) -> None:
    """SIGTERM ends the benchmark as Ctrl-C does: the sandbox and images are removed."""
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    signal.signal(signal.SIGTERM, _terminated)
    client = engine.client()
    image = distribute.source_image(client, args.image)
    rate = benchpush.rate_bytes(args.bandwidth)
    ideal = image.size / rate
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bench-registry-"))
    inventory_path = tmp / "sandbox.yaml"
    loads = benchplot.Loads()
    rows: list[dict] = []
    built: list[str] = []      # images this run made or tagged in this machine's engine
    extra: dict = {"image": image.ref, "layers": len(image.diff_ids), "layer_mb": args.layer_mb,
                   "repeat": args.repeat}
    code = 0
    try:
        most = max(args.nodes)
        t = time.monotonic()
        sb = sandbox.up(most, name=args.name, subnet=args.subnet, bandwidth=args.bandwidth,
                        inventory_path=inventory_path, with_registry=True)
        extra["sandbox_up_s"] = round(time.monotonic() - t, 1)
        inventory = load_inventory(inventory_path)
        uplink = benchpush.Uplink(args.name)
        print(f"image {image.ref}: S = {image.size / 1e6:.0f} MB in {len(image.diff_ids)} layers; "
              f"links shaped at {args.bandwidth} (B = {rate / 1e6:.2f} MB/s); S/B = {ideal:.1f} s; "
              f"registry {sb.registry}; sandbox of {most} nodes up in {extra['sandbox_up_s']:.0f} s",
              flush=True)
        print(f"{'nodes':>5} {'case':<5} {'run':>3} {'way':<15} {'seconds':>8} {'xS/B':>6} "
              f"{'head MB':>8} {'head xS':>7} {'registry':>8} {'relay':>8} {'pull':>8} wire  {'cpu':>4} "
              "result",
              flush=True)
        skipped = []
        for rep, n, case, way in plan_runs(args):
            if time.monotonic() - start > args.budget * 60:
                skipped.append(f"{n} nodes {case} {way} #{rep}")
                continue
            if case == "cold":
                forget(args.name, most)
                if way != "relay":
                    empty_registry(sb)
                ref = image.ref
            else:
                ref = f"clusterctl-bench/registry:warm-{rep}-{n}-{way.replace('+', '-')}"
                benchpush.derived_image(client, image.ref, ref, int(args.layer_mb * 1024 * 1024))
                built.append(ref)
            before, cpu = uplink.read(), Cpu()
            out = RUN[way](ref, subset(inventory, n))
            head, busy = uplink.read() - before, cpu.busy()
            if out.tagged:
                built.append(out.tagged)
                if "registry_mb" not in extra and case == "cold" and not out.failures:
                    pushed = client.images.get(out.tagged)
                    digests = [d for d in pushed.attrs.get("RepoDigests") or []
                               if d.startswith(sb.registry + "/")]
                    stored = stored_size(sb, digests[0]) if digests else None
                    if stored:
                        extra["registry_mb"] = round(stored / 1e6, 1)
                        print(f"{'':>5} the registry stores {stored / 1e6:.0f} MB of it "
                              f"({stored / image.size:.2f} x S: gzip)", flush=True)
            rows.append(row(n, way, case, out, head, image.size, ideal, rep, busy))
            print_row(rows[-1])
            loads.sample()
            if out.failures:
                code = 1
        if skipped:
            extra["note"] = (f"--budget {args.budget:g} min reached: {len(skipped)} run(s) skipped "
                             f"({', '.join(skipped)})")
            print(extra["note"], flush=True)
        if rows:
            doc = json_document(rows, _conditions(args, image, rate, ideal, extra, loads, start),
                                benchplot.command_line())
            print(benchplot.table({**doc, "rows": []}), flush=True)   # the ratios and the goals
            for g in doc["goals"]:
                verdict = "-" if g["met"] is None else ("met" if g["met"] else "MISSED")
                print(f"goal: {g['what']}: {g['value']} (limit {g['limit']:g}): {verdict}", flush=True)
        return code
    finally:
        # what was measured is written and everything removed: not to be cut short by a
        # second Ctrl-C or a SIGTERM
        saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if rows and (args.json or args.plot):   # also what a failed or stopped run measured
                doc = json_document(rows, _conditions(args, image, rate, ideal, extra, loads, start),
                                    benchplot.command_line())
                benchplot.save(doc, args.json, args.plot)
        finally:
            sandbox.down(args.name)
            for ref in reversed(built):
                try:   # a registry tag of an image with other tags: only the tag goes
                    client.images.remove(ref, force=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            shutil.rmtree(tmp, ignore_errors=True)
            for s, handler in saved.items():
                signal.signal(s, handler)


def _conditions(args, image, rate: float, ideal: float, extra: dict, loads, start: float) -> dict:
    return benchplot.conditions(
        loads, bandwidth=args.bandwidth, bytes_per_second=rate,
        image_mb=round(image.size / 1e6, 1), ideal_seconds=round(ideal, 2),
        wall_min=round((time.monotonic() - start) / 60, 1), **extra)


# --------------------------------------------------------------------------- input


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f'"{text}": give a number above 0')
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default=targets.resolve("cpu").tag,
                   help="local image to distribute (default: the cpu target's image)")
    p.add_argument("--nodes", default=[4, 8], type=benchplot.node_counts("4,8"), help="node counts, e.g. 4,8")
    p.add_argument("--repeat", default=2, type=benchplot.positive_int,
                   help="runs of every (node count, case, way)")
    p.add_argument("--bandwidth", default="500mbit", help="tbf rate per link, e.g. 500mbit")
    p.add_argument("--layer-mb", type=benchpush.megabytes, default=5.0,
                   help="size of the warm case's new layer")
    p.add_argument("--budget", default=25.0, type=positive_float,
                   help="minutes; runs that would start later are skipped")
    p.add_argument("--name", default="brg", help="sandbox name")
    p.add_argument("--subnet", default="10.213.77.0/24", help="sandbox subnet")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write every row, the ratios, the goals and the run's conditions as JSON "
                        "(benchmarks/plot.py)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the rows: seconds and head-link bytes against nodes (benchmarks/plot.py)")
    return p


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before a sandbox exists (UserError: exit 2)."""
    sandbox.check_name(args.name)
    sandbox.check_bandwidth(args.bandwidth)
    benchpush.rate_bytes(args.bandwidth)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/registry.py")
    sandbox_registry.require_registry()
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
