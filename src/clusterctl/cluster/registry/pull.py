"""Nodes pull an image from a registry by digest.

Each node runs one command: ``docker pull REFERENCE`` (``HOST/NAME@sha256:...``: the
engine checks the manifest's digest itself) and prints the image ID it now holds, which
must be the ID of this machine's image.  When this machine's Docker config has
credentials for the registry (``docker login``), they travel on the command's stdin into
a config file in a fresh private directory (``mktemp -d``, mode 0700) that the same
command removes on every exit path (``trap``): nothing is left on the node, and the node
user's own Docker config is neither read nor changed.  The reference is the script's
argument, never part of its text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from clusterctl.cluster.distribute.node import PushResult
from clusterctl.cluster.registry.push import classify
from clusterctl.cluster.runtime import ContainerRuntime, runtime_for, runtime_of
from clusterctl.core.errors import NodeError
from clusterctl.core.scripts import script_text

if TYPE_CHECKING:
    from clusterctl.cluster.transport import Cluster, NodeConnection

#: ``sh -c PULL_SCRIPT sh REFERENCE WITH_AUTH``: pull, then print the image ID.
PULL_SCRIPT = script_text("clusterctl.cluster", "pull-image.sh")

PULL_TIMEOUT = 1800.0  # seconds: a large image over a slow link


def pull_argv(reference: str, with_auth: bool, runtime: ContainerRuntime | None = None) -> list[str]:
    """The node command, in ``runtime``'s words (default: docker; pure)."""
    return ["sh", "-c", (runtime or runtime_for()).script(PULL_SCRIPT), "sh", reference,
            "1" if with_auth else "0"]


def pull(cluster: Cluster, reference: str, image_id: str, *, registry: str, auth: dict | None = None,
         nodes: Iterable[str] | None = None, progress=None,
         timeout: float = PULL_TIMEOUT) -> list[PushResult]:
    """Every node of ``nodes`` (default: all) pulls ``reference``; a result per node,
    ``pulled`` or ``failed`` with the reason (the registry's failure as that node met it,
    or an image ID other than ``image_id``)."""
    stdin = json.dumps(auth).encode() if auth else None

    def one(conn: NodeConnection) -> PushResult:
        t0 = time.monotonic()
        if progress is not None:
            progress.started(conn.name, f"pull from {registry}")
        r = conn.run(pull_argv(reference, auth is not None, runtime_of(conn)), stdin=stdin, timeout=timeout)
        seconds = time.monotonic() - t0
        if not r.ok:
            why = classify(registry, r.stderr.strip() or r.stdout.strip() or f"exit {r.exit_code}",
                           where=f"node {conn.name}")
            return PushResult(conn.name, "failed", seconds=seconds, error=why, source=registry)
        got = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if got != image_id:
            return PushResult(conn.name, "failed", seconds=seconds, source=registry,
                              error=f"pulled {reference} but holds image {got[:19] or '?'}, not "
                                    f"this machine's {image_id[:19]}")
        return PushResult(conn.name, "pulled", seconds=seconds, source=registry)

    results = []
    for node, got in cluster.map(one, nodes=nodes).items():
        if isinstance(got, NodeError):
            got = PushResult(node, "failed", error=got.message, source=registry)
        if progress is not None:
            progress.finished(got)
        results.append(got)
    return results
