"""Push benchmark: seconds and bytes of `push_image` to 1, 2 and 4 sandbox nodes.

For each node count it creates a fresh sandbox and measures three cases:

* cold   - the nodes have nothing: the whole image goes to every node;
* warm   - the same image again: every node is skipped, 0 image bytes;
* layer  - an image FROM the first with one new layer of --layer-mb random MB:
           only that layer (plus tar metadata) goes to each node.

How to run (root: the sandbox makes network namespaces and daemons; the local
engine must hold the image: the default is the tag `clusterctl build --target cpu`
gives, i.e. what `make demo` builds)::

    sudo make bench-push          # or: sudo .venv/bin/python benchmarks/push.py
        [--image REF] [--nodes 1,2,4] [--bandwidth 200mbit] [--layer-mb 5]

Bad input (an image the engine lacks, a malformed --nodes/--bandwidth/--layer-mb,
--name or --subnet, not root, no engine) is one message saying what is valid and
exit status 2, before any sandbox is made.

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

from clusterctl.build import targets
from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import ClusterctlError


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


def megabytes(text: str) -> float:
    """``--layer-mb``: a size in MB above 0."""
    try:
        mb = float(text)
    except ValueError:
        mb = 0.0
    if not mb > 0 or mb == float("inf"):
        raise argparse.ArgumentTypeError(f'"{text}": give a size in MB above 0, e.g. 5 or 0.5')
    return mb


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default=targets.resolve("cpu").tag,
                   help="local image to push (default: the cpu target's tag, what `make demo` builds)")
    p.add_argument("--nodes", default=[1, 2, 4], type=node_counts, help="node counts, e.g. 1,2,4")
    p.add_argument("--bandwidth", default=None, help="tbf rate per node link, e.g. 200mbit")
    p.add_argument("--layer-mb", type=megabytes, default=5.0, help="size of the changed layer")
    p.add_argument("--name", default="pbench", help="sandbox name")
    p.add_argument("--subnet", default="10.213.77.0/24", help="sandbox subnet")
    return p


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before a sandbox exists (UserError: exit 2).
    The image is checked by run(), on the engine, before its sandbox is made."""
    sandbox.check_name(args.name)
    sandbox.check_bandwidth(args.bandwidth)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    sandbox.require_environment("benchmarks/push.py")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)   # malformed values: argparse's usage message, exit 2
    try:
        check(args)
        return run(args)
    except ClusterctlError as e:       # what the CLI does: the message, never a traceback
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
