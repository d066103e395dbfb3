"""Push benchmark: seconds and bytes of `push_image` to 1, 2 and 4 sandbox nodes.

For each node count it creates a fresh sandbox and measures three cases:

* cold   - the nodes have nothing: the whole image goes to every node;
* warm   - the same image again: every node is skipped, 0 image bytes;
* layer  - an image FROM the first with one new layer of --layer-mb random MB:
           only that layer (plus tar metadata) goes to each node.

How to run (root: the sandbox makes network namespaces and daemons; the local
engine must hold the image, e.g. built by `clusterctl build cpu`)::

    export DOCKER_HOST=unix:///run/clusterctl/engine/docker.sock
    python benchmarks/push.py --image clusterctl/cpu:seed [--nodes 1,2,4]
                              [--bandwidth 200mbit] [--layer-mb 5]

``--bandwidth`` shapes every node's link with tbf (FIELD-NOTES §1), e.g. to see
the layer case's gain at a cluster's real bandwidth.  The sandbox ("pbench" on
10.213.77.0/24 unless --name/--subnet) and the derived image are removed at
the end, also on failure or Ctrl-C.  Figures are noisy on a 2-core machine:
every node's sshd, dockerd and `docker load` share the same cores.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory


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


def timed_push(ref: str, inventory_path: Path) -> tuple[float, list[distribute.PushResult]]:
    start = time.monotonic()
    results = distribute.push_image(ref, load_inventory(inventory_path))
    return time.monotonic() - start, results


def report(nodes: int, case: str, seconds: float, results: list[distribute.PushResult]) -> None:
    sent = [r.bytes_sent for r in results]
    outcome = ", ".join(sorted({r.describe() for r in results}))
    print(f"{nodes:>5} {case:<6} {seconds:>8.1f} {sum(sent) / 1e6:>12.1f} "
          f"{max(sent) / 1e6:>14.1f} {sum(sent) / 1e6 / seconds:>9.1f}  {outcome}", flush=True)


def run(args: argparse.Namespace) -> int:
    client = engine.client()
    image = distribute.source_image(client, args.image)
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bench-"))
    inventory = tmp / "bench.yaml"
    changed = None
    print(f"image {image.ref}: {image.size / 1e6:.0f} MB, {len(image.diff_ids)} layers; "
          f"bandwidth {args.bandwidth or 'unshaped'}")
    print(f"{'nodes':>5} {'case':<6} {'seconds':>8} {'MB sent':>12} {'MB per node':>14} "
          f"{'MB/s':>9}  result")
    try:
        changed = derived_image(client, image.ref, "clusterctl-bench/push:layer",
                                int(args.layer_mb * 1024 * 1024))
        for n in args.nodes:
            sandbox.down(args.name)
            sandbox.up(n, name=args.name, subnet=args.subnet, bandwidth=args.bandwidth,
                       inventory_path=inventory)
            for case, ref in (("cold", image.ref), ("warm", image.ref), ("layer", changed.ref)):
                seconds, results = timed_push(ref, inventory)
                report(n, case, seconds, results)
                if not all(r.ok for r in results):
                    print("FAILED: " + "; ".join(f"{r.node}: {r.error}" for r in results
                                                 if not r.ok), file=sys.stderr)
                    return 1
        return 0
    finally:
        sandbox.down(args.name)
        if changed is not None:
            client.images.remove(changed.id, force=True)
        inventory.unlink(missing_ok=True)
        tmp.rmdir()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default="clusterctl/cpu:seed", help="local image to push")
    p.add_argument("--nodes", default="1,2,4",
                   type=lambda s: [int(x) for x in s.split(",")], help="node counts, e.g. 1,2,4")
    p.add_argument("--bandwidth", default=None, help="tbf rate per node link, e.g. 200mbit")
    p.add_argument("--layer-mb", type=float, default=5.0, help="size of the changed layer")
    p.add_argument("--name", default="pbench", help="sandbox name")
    p.add_argument("--subnet", default="10.213.77.0/24", help="sandbox subnet")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
