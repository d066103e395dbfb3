"""Launch and teardown on 32 real sandbox nodes with the default path (issue 24, item 3).

32 nodes is the largest sandbox this suite brings up: each node is a network
namespace with its own sshd and dockerd, and all of them share this machine's cores
(2 on the reference machine), so a larger one would cost CI minutes for no new
behaviour.  The sandbox has its own name and the sixth /24 after
CLUSTERCTL_TEST_SUBNET, and is removed after the module, also on failure.  The image
is a tiny one made here from this machine's own ``sh`` and ``sleep`` and the libraries
they load (a few MB, unique to the run, removed after the module), pushed with the
real CLI: 32 nodes load it in seconds, where the 253 MB base image took 228 s on
2 cores.  The job is tests/fixtures/jobs/fail-rank-sh.yaml (fail-rank.yaml in sh).

What is checked, on every one of the 32 nodes, with the real CLI (no timing: the
figures are in benchmarks/launch.py and docs/benchmarks/launch.md):

* ``test_launch_and_fail_fast_teardown_on_thirty_two_nodes``: a foreground launch
  where the last rank fails.  Every rank starts and prints under its own node's
  prefix; the failing node is named; the 31 others are stopped by the fail-fast
  teardown (the record says so per node); launch exits with the rank's status; no
  container is left on any node.  And the whole run went through the tree by default
  (``ssh.tree: auto``; issue 24): this machine logged in to node1 only, once; every
  other node was logged in to from node1 alone, once per tree call (preflight, start,
  the follow that carried every line, exit status and final state, and the fail-fast
  stop for the 31 that were stopped), read from each node's own sshd log.
* ``test_detached_launch_and_stop_on_thirty_two_nodes``: ``launch --detach`` returns
  with all 32 running, then ``clusterctl stop`` removes every container, keeps every
  node's output and the record says stopped.  Both went through the tree by default
  (``ssh.tree: auto``, no key on the nodes: this machine signed each node-to-node login),
  read from each node's own sshd log: for the launch, node1's sshd logged one login, from
  this machine, every other node's two (preflight, start), both from node1; for the stop,
  one more each, the same way; none came from anywhere else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import containers
from clusterctl.run import records
from tests.fixtures import JOBS
from tests.fixtures.sandbox import (
    SandboxCluster,
    cluster_fields,
    held_sandbox,
    kept_login_dirs,
    own_sandbox,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

NODES = 32
NAME, SUBNET = own_sandbox("x", "y", 6)
FAIL_JOB = JOBS / "fail-rank-sh.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def shell_image(docker_client, tmp_path_factory) -> Iterator[str]:
    """An image FROM scratch with this machine's ``sh`` and ``sleep`` and the shared
    libraries they load (from ``ldd``), unique to this run; removed after the module."""
    root = tmp_path_factory.mktemp("shell-image") / "root"
    for tool in ("sh", "sleep"):
        path = Path(shutil.which(tool)).resolve()
        libs = re.findall(r"(/\S+) \(0x", subprocess.run(["ldd", str(path)], capture_output=True,
                                                       text=True, check=True).stdout)
        for src, dest in [(path, f"bin/{tool}"), *((Path(lib), lib.lstrip("/")) for lib in libs)]:
            (root / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(src).resolve(), root / dest)
    (root.parent / "Dockerfile").write_text("FROM scratch\nCOPY root/ /\nENV PATH=/bin\n")
    tag = f"clusterctl-test/shell-{uuid.uuid4().hex[:10]}:1"
    docker_client.images.build(path=str(root.parent), tag=tag, rm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def sandbox32(shell_image) -> SandboxCluster:
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    t0 = time.monotonic()
    with held_sandbox(NAME, SUBNET, NODES, slots=1) as sb:
        cluster = SandboxCluster(**cluster_fields(sb))
        up = time.monotonic() - t0
        res = runner.invoke(app, ["push", shell_image, "--nodes", str(cluster.inventory_path)])
        assert res.exit_code == 0, res.output[-3000:]
        print(f"\n{NODES}-node sandbox {NAME} ({SUBNET}) up in {up:.1f}s, {shell_image} pushed to "
              f"every node in {time.monotonic() - t0 - up:.1f}s (they share this machine's cores)")
        yield cluster


def login_sources(sb: SandboxCluster) -> dict[str, list[str]]:
    """Per node, the address of every login its own sshd has accepted so far, in order."""
    return {node: re.findall(r"Accepted publickey for \S+ from (\S+) ", sb.sshd_log(node))
            for node in sb.nodes}


def leftovers(sb: SandboxCluster) -> list[str]:
    """Containers on any node's own daemon, and what a relay push left (its /tmp directory,
    processes in the nodes' namespaces)."""
    return [f"{node}: container {i}" for node in sb.nodes
            for i in sb.node_docker(node, "ps", "-aq").stdout.split()] + sb.relay_leftovers()


def test_launch_and_fail_fast_teardown_on_thirty_two_nodes(sandbox32, shell_image, runs_dir):
    sb = sandbox32
    assert len(sb.nodes) == NODES
    last = NODES - 1
    before, kept_before = login_sources(sb), kept_login_dirs()
    res = runner.invoke(app, ["launch", str(FAIL_JOB), "--nodes", str(sb.inventory_path), "--image", shell_image,
                              "--set", f"FAIL_RANK={last}", "--set", "FAIL_AFTER=10"])
    out = res.output
    assert res.exit_code == 3, out[-5000:]

    # every rank started, under its own node's prefix (node rank r runs on node r+1)
    for r, node in enumerate(sb.nodes):
        assert f"{node}[{r}]| node rank {r} of {NODES} started" in out, (node, out[-5000:])
    summary = out[out.index("FIRST FAILURE"):]
    assert summary.startswith(f"FIRST FAILURE: node{NODES}[{last}] exited 3"), summary
    assert f"node rank {last} failing with exit status 3" in summary   # its last lines

    record = records.list_runs()[0]
    assert record.state == "failed" and record.exit_code == 3
    assert record.first_failure.node == f"node{NODES}" and record.first_failure.rank == last
    assert [n.node for n in record.nodes] == list(sb.nodes)
    stopped = [n.node for n in record.nodes if n.state == "stopped"]
    assert stopped == list(sb.nodes)[:last], [(n.node, n.state) for n in record.nodes]
    assert {n.stopped_by for n in record.nodes[:last]} == {
        f"clusterctl launch (fail-fast after node{NODES}[{last}] exited 3)"}
    assert leftovers(sb) == []

    # one login from this machine (to node1) for the whole run; one per other node from
    # node1, kept for all the run's tree calls (preflight, start, follow, stop, close)
    after = login_sources(sb)
    first = next(iter(sb.nodes))
    new_logins = {node: after[node][len(before[node]):] for node in sb.nodes}
    assert new_logins == {node: [sb.head_ip] if node == first else [sb.nodes[first]]
                          for node in sb.nodes}, new_logins
    assert kept_login_dirs() - kept_before == set()


def test_detached_launch_and_stop_on_thirty_two_nodes(sandbox32, shell_image, runs_dir):
    sb = sandbox32
    inv = str(sb.inventory_path)
    before, kept_before = login_sources(sb), kept_login_dirs()
    res = runner.invoke(app, ["launch", str(FAIL_JOB), "--nodes", inv, "--image", shell_image,
                              "--set", "FAIL_RANK=99", "--detach", "--json"])
    assert res.exit_code == 0, res.output[-3000:]
    # the default (tree: auto) at 32 nodes: this machine logged in to node1 only, node1 to the others
    after = login_sources(sb)
    first = next(iter(sb.nodes))
    new_logins = {node: after[node][len(before[node]):] for node in sb.nodes}
    # (two tree calls, preflight and start, over the head's one connection to node1; node1
    # kept its logins from one to the next and ended them with the start)
    assert new_logins == {node: [sb.head_ip] if node == first else [sb.nodes[first]]
                          for node in sb.nodes}, new_logins
    assert kept_login_dirs() - kept_before == set()
    run_id = json.loads(res.stdout)["run_id"]   # the push and start lines go to stderr
    for node in sb.nodes:   # launch has returned: every node's container is running
        names = sb.node_docker(node, "ps", "--filter", f"label={containers.RUN_LABEL}={run_id}",
                               "--format", "{{.State}}").stdout.split()
        assert names == ["running"], (node, names)

    res = runner.invoke(app, ["stop", run_id])
    assert res.exit_code == 0, res.output[-3000:]
    assert leftovers(sb) == []
    # the stop went through the tree too: one login from here (to node1), one per other node
    # from node1, and every node's output came back whole into runs/<id>/
    stopped = login_sources(sb)
    stop_logins = {node: stopped[node][len(after[node]):] for node in sb.nodes}
    assert stop_logins == {node: [sb.head_ip] if node == first else [sb.nodes[first]]
                           for node in sb.nodes}, stop_logins
    for rank, node in enumerate(sb.nodes):
        text = (runs_dir / run_id / f"{node}.log").read_text()
        assert text.splitlines() == [f"node rank {rank} of {NODES} started"], (node, text)
    record = records.load(run_id)
    assert record.state == "stopped", record.state
    assert all(n.state == "stopped" for n in record.nodes), [(n.node, n.state) for n in record.nodes]
