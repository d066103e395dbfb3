"""Push benchmark: by hand vs star vs relay vs relay+zstd, to 1, 2, 4 and 8 sandbox nodes.

For each node count it creates a fresh sandbox with every link shaped at
--bandwidth (each node's link and this machine's uplink, tc tbf) and measures,
for each way of pushing, three cases:

* cold   - the nodes have nothing: the whole image goes to every node;
* warm   - the same image again: every node is skipped, 0 image bytes
           (by hand has no skip: it would resend the whole image, not run);
* layer  - an image FROM the first with one new layer of --layer-mb random MB
           (by hand: not run, same reason).

The ways: ``by-hand`` is the loop people write, ``docker save IMAGE | ssh NODE
docker load`` one node after the other (OpenSSH, strict host keys); ``star`` is
clusterctl's push with this machine streaming to every node; ``relay`` has the
nodes forward the stream along a chain while they receive it; ``relay+zstd``
the same with zstd on the wire.  Printed per run: seconds, MB that left this
machine (the bridge's tx counter: every byte on the head's uplink, SSH framing
included), image MB clusterctl counted into its channels, T(N)/T(1) for the
same way and case, and T/(S/B) with S the image's size and B the shaped rate.
Under each relay row, from the push's own trace (``CLUSTERCTL_PUSH_TRACE``), where
its time went, phase after phase: plan (the last node's plan command done),
start (the nodes' relay commands started), hops up (every node-to-node ssh
logged in), head sends, to chain end (the last byte reaching the last node:
what waited in the hops' buffers) and load+results.

The image: by default one built here FROM scratch out of this machine's own
files under /usr (real binaries and text, so zstd has what real images give it),
--image-mb MB in 4 layers, so that by hand and star (which cost N x S/B) to 8
nodes fit the 25 minutes; --image REF pushes an image of yours instead.

How to run (root: the sandbox makes network namespaces and daemons)::

    sudo make bench-push          # or: sudo .venv/bin/python benchmarks/push.py
        [--nodes 1,2,4,8] [--bandwidth 16mbit] [--image-mb 32] [--image REF]
        [--ways by-hand,star,relay,relay+zstd] [--layer-mb 5] [--trace FILE]
        [--json FILE] [--plot FILE.png]

``--json FILE`` writes every printed row (nodes, way, case, seconds, mb_out, image_mb,
t_over_t1, t_over_ideal, result, and a relay's phases as ``where``) and the run's
conditions (date, host, cores, load average seen, bandwidth, B, image, S, S/B) in
benchmarks/plot.py's "push" shape; ``--plot`` draws them (push time against nodes).

Bad input (an image the engine lacks, a malformed --nodes/--bandwidth/--ways/
--layer-mb, --name or --subnet, not root, no engine) is one message saying what
is valid and exit status 2, before any sandbox is made.  The sandbox ("pbench"
on 10.213.77.0/24 unless --name/--subnet) and the images it built are removed at
the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import UserError

if __package__:                 # imported as benchmarks.push (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

WAYS = ("by-hand", "star", "relay", "relay+zstd")
CASES = ("cold", "warm", "layer")
FILE_ROOTS = ("/usr/lib", "/usr/share", "/usr/bin")


def derived_image(client, base: str, tag: str, size: int) -> distribute.SourceImage:
    """Build ``tag`` FROM ``base`` plus one layer of ``size`` random bytes."""
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        for name, data in (("payload", os.urandom(size)),
                           ("Dockerfile", f"FROM {base}\nCOPY payload /payload\n".encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ctx.seek(0)
    client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
    return distribute.source_image(client, tag)


def files_image(client, tag: str, total: int, layers: int = 4) -> distribute.SourceImage:
    """``tag``: FROM scratch, ``layers`` layers of this machine's regular files under /usr
    (walked in sorted order, so the same machine gives the same image), ``total`` bytes."""
    ctx = io.BytesIO()
    per_layer = total // layers
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        layer, size = 0, 0
        for path in _files():
            try:
                st = path.lstat()
                if not path.is_file() or path.is_symlink() or st.st_size > per_layer:
                    continue
                tar.add(str(path), arcname=f"l{layer}/{path.relative_to('/')}", recursive=False)
            except OSError:
                continue
            size += st.st_size
            if size >= per_layer:
                layer, size = layer + 1, 0
                if layer == layers:
                    break
        dockerfile = "FROM scratch\n" + "".join(f"COPY l{i}/ /\n" for i in range(layers))
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    ctx.seek(0)
    client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
    return distribute.source_image(client, tag)


def _files():
    for root in FILE_ROOTS:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                yield Path(dirpath) / name


def rate_bytes(text: str) -> float:
    """A tc rate (``32mbit``, ``4mbps``, ``500kbit``...) in bytes per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", text.lower())
    if not m:
        raise UserError(f'--bandwidth "{text}": give a rate like 32mbit, 100mbit or 4mbps')
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return value / 8 if m.group(3) == "bit" else value


class Uplink:
    """Bytes this machine sent onto the sandbox bridge (its uplink), from the kernel."""

    def __init__(self, name: str) -> None:
        self.path = Path(f"/sys/class/net/cc-{name}/statistics/tx_bytes")

    def read(self) -> int:
        return int(self.path.read_text())


def by_hand(ref: str, inventory_path: Path) -> list[str]:
    """``docker save | ssh | docker load``, one node after the other; the failures."""
    inv = load_inventory(inventory_path)
    failed = []
    for node in inv.nodes:
        ssh = ["ssh", "-F", "/dev/null", "-T", "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=yes",
               "-o", f"UserKnownHostsFile={inv.ssh.known_hosts}",
               "-i", str(node.identity_file), "-p", str(node.port or 22),
               f"{node.user}@{node.host}", "docker", "load"]
        save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE,
                                env={**os.environ, "DOCKER_HOST": engine.engine_url() or ""})
        load = subprocess.run(ssh, stdin=save.stdout, capture_output=True, text=True)
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            failed.append(f"{node.name}: {load.stderr.strip()[-200:]}")
    return failed


def push(way: str, ref: str, inventory_path: Path) -> tuple[int, list[str]]:
    """One push the given way: (image bytes clusterctl counted, failures)."""
    if way == "by-hand":
        return 0, by_hand(ref, inventory_path)
    strategy = "star" if way == "star" else "relay"
    results = distribute.push_image(ref, load_inventory(inventory_path), strategy=strategy,
                                    compress=way == "relay+zstd")
    return (sum(r.head_bytes for r in results),
            [f"{r.node}: {r.error}" for r in results if not r.ok])


def phases(trace_text: str) -> dict[str, float] | None:
    """A relay push's phases from its trace (``CLUSTERCTL_PUSH_TRACE``), in seconds, one
    after the other (benchmarks/plot.py's PHASES), or None: not a relay push, or one that
    did not get that far."""
    at: dict[str, list[float]] = {}
    for line in trace_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        t, _node, phase = line.split(None, 2)
        at.setdefault(phase.split(" rc=")[0], []).append(float(t))
    try:
        marks = [0.0, max(at["plan-end"]), at["all-started"][0], at["all-ready"][0],
                 max(at["head-send-end"]), max(at["last-byte"]), at["relay-end"][-1]]
    except KeyError:
        return None
    return {name: round(b - a, 3)
            for name, a, b in zip(benchplot.PHASES, marks[:-1], marks[1:], strict=True)}


def where_time_went(trace_text: str) -> str:
    """One line from a push's trace (``CLUSTERCTL_PUSH_TRACE``): how long each phase of a
    relay took, one after the other - planning (every node's plan command), starting the
    nodes' commands, their hops logging in, the head sending, the last byte reaching the
    chain's end (what sits in each hop's buffers), and the loads' end with the results."""
    spans = phases(trace_text)
    if spans is None:
        return ""  # not a relay push, or one that did not get that far
    names = ("plan", "start", "hops up", "head sends", "to chain end", "load+results")
    return "where: " + "  ".join(f"{n} {v:.2f}" for n, v in zip(names, spans.values(), strict=True))


def row(n: int, way: str, case: str, seconds: float, out: int, counted: int, ratio: float,
        ideal: float, ok: bool, where: dict[str, float] | None = None) -> dict:
    """One printed row as the JSON holds it (bytes as MB, like the table)."""
    return {"nodes": n, "way": way, "case": case, "seconds": round(seconds, 3),
            "mb_out": round(out / 1e6, 2), "image_mb": round(counted / 1e6, 2),
            "t_over_t1": round(ratio, 3), "t_over_ideal": round(seconds / ideal, 3),
            "result": "ok" if ok else "FAILED", "where": where}


def json_document(rows: list[dict], image: distribute.SourceImage | None, image_size: int,
                  layers: int, bandwidth: str, layer_mb: float, command: str,
                  conditions: dict) -> dict:
    """The run's rows and conditions as one checked document (plot.py's "push" shape)."""
    rate = rate_bytes(bandwidth)
    return benchplot.document("push", command, {
        **conditions, "bandwidth": bandwidth, "bytes_per_second": rate,
        "image": image.ref if image else None, "image_mb": round(image_size / 1e6, 2),
        "layers": layers, "ideal_seconds": round(image_size / rate, 2),
        "layer_mb": layer_mb}, rows=rows)


def forget(name: str, nodes: int, *images: distribute.SourceImage) -> None:
    """Remove the images from every node (each node's own daemon, from this machine)."""
    for i in range(1, nodes + 1):
        for image in images:
            sandbox.node_docker(name, f"node{i}", "rmi", "-f", image.id, check=False)


def run(args: argparse.Namespace) -> int:
    client = engine.client()
    built: list[distribute.SourceImage] = []
    if args.image:
        image = distribute.source_image(client, args.image)
    else:
        image = files_image(client, "clusterctl-bench/push:files", int(args.image_mb * 1e6))
        built.append(image)
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bench-"))
    inventory = tmp / "bench.yaml"
    rate = rate_bytes(args.bandwidth)
    ideal = image.size / rate
    uplink = Uplink(args.name)
    print(f"image {image.ref}: S = {image.size / 1e6:.0f} MB in {len(image.diff_ids)} layers; "
          f"links shaped at {args.bandwidth} (B = {rate / 1e6:.2f} MB/s); S/B = {ideal:.1f} s")
    print(f"{'nodes':>5} {'way':<11} {'case':<6} {'seconds':>8} {'MB out':>8} {'image MB':>9} "
          f"{'T(N)/T(1)':>10} {'T/(S/B)':>8}  result", flush=True)
    first: dict[tuple[str, str], float] = {}
    rows: list[dict] = []
    loads = benchplot.Loads()
    try:
        changed = derived_image(client, image.ref, "clusterctl-bench/push:layer",
                                int(args.layer_mb * 1024 * 1024))
        built.append(changed)
        for n in args.nodes:
            sandbox.down(args.name)
            sandbox.up(n, name=args.name, subnet=args.subnet, bandwidth=args.bandwidth,
                       inventory_path=inventory)
            for way in args.ways:
                forget(args.name, n, changed, image)
                for case in CASES:
                    if way == "by-hand" and case != "cold":
                        continue
                    ref = changed.ref if case == "layer" else image.ref
                    trace_file = tmp / "push.trace"
                    trace_file.unlink(missing_ok=True)
                    os.environ["CLUSTERCTL_PUSH_TRACE"] = str(trace_file)
                    before = uplink.read()
                    start = time.monotonic()
                    counted, failures = push(way, ref, inventory)
                    seconds = time.monotonic() - start
                    os.environ.pop("CLUSTERCTL_PUSH_TRACE", None)
                    out = uplink.read() - before
                    ratio = seconds / first.setdefault((way, case), seconds)
                    print(f"{n:>5} {way:<11} {case:<6} {seconds:>8.1f} {out / 1e6:>8.1f} "
                          f"{counted / 1e6:>9.1f} {ratio:>10.2f} {seconds / ideal:>8.2f}  "
                          f"{'ok' if not failures else 'FAILED'}", flush=True)
                    rows.append(row(n, way, case, seconds, out, counted, ratio, ideal, not failures))
                    loads.sample()
                    if trace_file.exists():
                        text = trace_file.read_text()
                        trace_file.unlink()
                        if args.trace:  # the whole timeline, node by node, to read by eye
                            with open(args.trace, "a", encoding="utf-8") as f:
                                f.write(f"# {n} nodes, {way}, {case}\n{text}")
                        where = where_time_went(text) if way.startswith("relay") else ""
                        if where:
                            print(f"{'':>5} {where}", flush=True)
                            rows[-1]["where"] = phases(text)
                    if failures:
                        print("FAILED: " + "; ".join(failures), file=sys.stderr)
                        return 1
        return 0
    finally:
        if rows and (args.json or args.plot):   # also what a failed or stopped run measured
            doc = json_document(rows, image, image.size, len(image.diff_ids), args.bandwidth,
                                args.layer_mb, benchplot.command_line(), benchplot.conditions(loads))
            benchplot.save(doc, args.json, args.plot)
        sandbox.down(args.name)
        for image_ in reversed(built):
            try:
                client.images.remove(image_.id, force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        inventory.unlink(missing_ok=True)
        (tmp / "push.trace").unlink(missing_ok=True)
        tmp.rmdir()


def node_counts(text: str) -> list[int]:
    """``--nodes``: node counts separated by commas, each from 1 to the sandbox's maximum."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or not all(1 <= n <= sandbox.MAX_NODES for n in counts):
        raise argparse.ArgumentTypeError(
            f'"{text}": give node counts from 1 to {sandbox.MAX_NODES} separated by commas, e.g. 1,2,4')
    return counts


def ways(text: str) -> list[str]:
    """``--ways``: some of by-hand, star, relay, relay+zstd, separated by commas."""
    chosen = text.split(",")
    if not chosen or not all(w in WAYS for w in chosen):
        raise argparse.ArgumentTypeError(f'"{text}": give some of {",".join(WAYS)}')
    return chosen


def megabytes(text: str) -> float:
    """``--layer-mb`` / ``--image-mb``: a size in MB above 0."""
    try:
        mb = float(text)
    except ValueError:
        mb = 0.0
    if not mb > 0 or mb == float("inf"):
        raise argparse.ArgumentTypeError(f'"{text}": give a size in MB above 0, e.g. 5 or 0.5')
    return mb


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default=None,
                   help="local image to push (default: one built from this machine's files)")
    p.add_argument("--image-mb", type=megabytes, default=32.0,
                   help="size of the image built when --image is not given")
    p.add_argument("--nodes", default=[1, 2, 4, 8], type=node_counts,
                   help="node counts, e.g. 1,2,4,8")
    p.add_argument("--ways", default=list(WAYS), type=ways, help=",".join(WAYS))
    p.add_argument("--bandwidth", default="16mbit", help="tbf rate per link, e.g. 16mbit")
    p.add_argument("--layer-mb", type=megabytes, default=5.0, help="size of the changed layer")
    p.add_argument("--name", default="pbench", help="sandbox name")
    p.add_argument("--subnet", default="10.213.77.0/24", help="sandbox subnet")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="append every push's whole timeline (node, phase, seconds) to FILE")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write every row and the run's conditions as JSON (benchmarks/plot.py)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the rows: push time against nodes (benchmarks/plot.py)")
    return p


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before a sandbox exists (UserError: exit 2).
    The image is checked by run(), on the engine, before its sandbox is made."""
    sandbox.check_name(args.name)
    sandbox.check_bandwidth(args.bandwidth)
    rate_bytes(args.bandwidth)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/push.py")


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
