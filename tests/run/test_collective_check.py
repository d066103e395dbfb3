"""`clusterctl check --collective` on a real 4-node sandbox: real sshd + dockerd per node,
real torch.distributed (gloo) in the cpu image, links shaped with tc (tbf).

The sandbox's nodes share this machine's 2 cores, so every link is shaped (20mbit; the
slow node's to a tenth of that): the network, not the CPU, is what is measured.  The
sandbox is this module's own (4 nodes; the name and the third /24 after
CLUSTERCTL_TEST_SUBNET), removed after the module, also on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clusterctl.cluster import sandbox
from clusterctl.cluster.distribute import push_image
from clusterctl.cluster.inventory import load_inventory
from tests.fixtures.images import CPU_TEST_TAG
from tests.fixtures.sandbox import SandboxCluster, cluster_fields, held_sandbox, own_sandbox

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

NAME, SUBNET = own_sandbox("c", "d", 3)
FAST, SLOW = "20mbit", "2mbit"
#: small messages: a 2mbit link moves 250 kB/s
ARGS = ["--sizes", "64K,256K", "--pair-size", "256K", "--iters", "3", "--no-push"]


@pytest.fixture(scope="module")
def image(docker_client, request) -> str:
    """The cpu image: the one already built under the test tag, else built now."""
    try:
        docker_client.images.get(CPU_TEST_TAG)
        return CPU_TEST_TAG
    except Exception:  # noqa: BLE001 - not there: build it (the session fixture)
        return request.getfixturevalue("cpu_image")


@pytest.fixture(scope="module")
def sandbox4(image):
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    with held_sandbox(NAME, SUBNET, 4, slots=1) as sb:
        # the image on every node before the checks (which run with --no-push): one docker
        # load, the other nodes' stores hard-linked (the push is not this module's subject)
        SandboxCluster(**cluster_fields(sb)).load_image(image, [n.name for n in sb.nodes])
        for n in sb.nodes:
            sandbox.shape_link(sb.name, n.name, FAST)
        yield sb


def _check(sb, image, tmp_path, *extra):
    """The CLI as a user runs it (plain output); returns (exit code, output, saved JSON)."""
    saved = tmp_path / "collective.json"
    p = subprocess.run(
        [sys.executable, "-m", "clusterctl", "check", "--collective", "--nodes",
         str(sb.inventory_path), "--target", "cpu", "--image", image, *ARGS,
         "--save", str(saved), *extra],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "CLUSTERCTL_PLAIN": "1"})
    data = json.loads(saved.read_text()) if saved.exists() else None
    return p.returncode, p.stdout + p.stderr, data


def _left_on_nodes(sb) -> dict[str, str]:
    found = {}
    for n in sb.nodes:
        names = sandbox.node_docker(sb.name, n.name, "ps", "-a", "--format", "{{.Names}}").stdout
        if names.strip():
            found[n.name] = names.strip()
    return found


def test_all_healthy_passes_with_the_measured_bus_bandwidth(sandbox4, image, tmp_path):
    code, output, data = _check(sandbox4, image, tmp_path)
    assert code == 0, output
    assert data["ok"] and [n["status"] for n in data["nodes"]] == ["ok"] * 4
    # 20mbit = 2.5 MB/s per link: the measured figures are the shaped links' (not the CPU's)
    assert 0.2e6 < data["busbw"] < 3.2e6, data["busbw"]
    assert len(data["matrix"]) == 6 and all(0.2e6 < p["busbw"] < 3.2e6 for p in data["matrix"])
    assert {n["versions"]["torch"] for n in data["nodes"]} == {data["nodes"][0]["versions"]["torch"]}
    assert "PASS: all 4 nodes healthy" in output and "all_reduce  256 KiB across 4 nodes" in output
    assert "\x1b[" not in output  # plain when not a terminal
    assert _left_on_nodes(sandbox4) == {}


def test_a_node_on_a_tenth_of_the_bandwidth_is_named(sandbox4, image, tmp_path):
    sandbox.shape_link(sandbox4.name, "node3", SLOW)
    try:
        code, output, data = _check(sandbox4, image, tmp_path)
    finally:
        sandbox.shape_link(sandbox4.name, "node3", FAST)
    assert code == 1, output
    assert [(n["node"], n["status"]) for n in data["nodes"]] == [
        ("node1", "ok"), ("node2", "ok"), ("node3", "slow"), ("node4", "ok")]
    assert "FAIL: slow: node3" in output
    by_pair = {(p["a"], p["b"]): p["busbw"] for p in data["matrix"]}
    assert max(bw for (a, b), bw in by_pair.items() if "node3" in (a, b)) * 3 < \
        min(bw for (a, b), bw in by_pair.items() if "node3" not in (a, b))
    assert _left_on_nodes(sandbox4) == {}


def test_a_node_whose_container_cannot_start_is_named(sandbox4, image, tmp_path):
    # node2 loses the image's tag (kept under another so nothing has to be pushed again):
    # `docker run` there fails (no such image, no registry), the others are stopped
    keep = image.rsplit(":", 1)[0] + ":collective-test-keep"
    sandbox.node_docker(sandbox4.name, "node2", "tag", image, keep)
    sandbox.node_docker(sandbox4.name, "node2", "rmi", image)
    try:
        code, output, data = _check(sandbox4, image, tmp_path)
    finally:
        sandbox.node_docker(sandbox4.name, "node2", "tag", keep, image)
        sandbox.node_docker(sandbox4.name, "node2", "rmi", keep)
    assert code == 1, output
    assert [(n["node"], n["status"]) for n in data["nodes"]] == [
        ("node1", "not measured"), ("node2", "broken"), ("node3", "not measured"),
        ("node4", "not measured")]
    assert "FAIL: broken: node2" in output and "Unable to find image" in output
    assert _left_on_nodes(sandbox4) == {}


@pytest.mark.parametrize("args,words", [
    (["--sizes", "1M,huge"], ["--sizes", "'huge'", "valid"]),
    (["--min-busbw", "fast"], ["--min-busbw", "valid"]),
    (["--pair-rounds", "0"], ["--pair-rounds", "valid", "'all'"]),
    (["--pair-rounds", "every"], ["--pair-rounds", "valid"]),
    (["--backend", "mpi"], ["--backend", "valid: gloo"]),
    (["--target", "nosuch"], ["nosuch"]),
])
def test_bad_input_is_exit_2_before_any_node(args, words, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: a, host: 192.0.2.1}\n  - {name: b, host: 192.0.2.2}\n")
    p = subprocess.run([sys.executable, "-m", "clusterctl", "check", "--collective", "--nodes",
                        str(inv), "--image", "x:1", *args], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and all(w in p.stdout + p.stderr for w in words)


# --------------------------------------------------------------------------- consistency

_EDIT_TORCH_VERSION = (
    'f="$(python3 -c "import importlib.util, os; '
    "print(os.path.join(os.path.dirname(importlib.util.find_spec('torch').origin), 'version.py'))\")\"; "
    "sed -i \"s/^__version__ = .*/__version__ = '2.13.0+odd'/\" \"$f\"")


def test_alike_real_nodes_pass_the_consistency_check(sandbox4, image):
    from clusterctl.cluster import preflight
    from clusterctl.cluster.transport import Cluster

    with Cluster(load_inventory(sandbox4.inventory_path)) as cluster:
        checks = preflight.run_preflight(cluster, image_ref=image)
    assert all(c.ok and not c.warnings for c in checks), [(c.node, c.problems, c.warnings)
                                                          for c in checks]
    assert {c.kernel for c in checks} == {os.uname().release}
    # the ID the fixture pushed (the local tag may have moved since: the test tag is shared)
    pushed = sandbox.node_docker(sandbox4.name, "node1", "image", "inspect", "--format",
                                 "{{.Id}}", image).stdout.strip()
    assert pushed.startswith("sha256:") and {c.image_id for c in checks} == {pushed}
    assert len({c.docker_version for c in checks}) == 1
    # the nodes share this clock: the offset is within what the round trip can explain
    assert all(abs(c.clock_offset) <= c.clock_uncertainty + 0.01 for c in checks), \
        [(c.clock_offset, c.clock_uncertainty) for c in checks]
    assert all(c.image_versions is None for c in checks)   # same ID: nothing to look inside


def test_a_node_whose_image_has_another_torch_is_named(sandbox4, image, tmp_path):
    """A real difference: node4's copy of the image is changed (torch's version.py edited
    and committed under the same tag); `check --image` reads the versions inside."""
    sb, node = sandbox4, "node4"
    keep = image.rsplit(":", 1)[0] + ":collective-test-keep"
    sandbox.node_docker(sb.name, node, "tag", image, keep)
    sandbox.node_docker(sb.name, node, "run", "--name", "cc-odd-torch", "--net=none", image,
                        "sh", "-c", _EDIT_TORCH_VERSION)
    try:
        sandbox.node_docker(sb.name, node, "commit", "cc-odd-torch", image)
        p = subprocess.run([sys.executable, "-m", "clusterctl", "check", "--nodes",
                            str(sb.inventory_path), "--image", image], capture_output=True,
                           text=True, timeout=600, cwd=tmp_path,
                           env={**os.environ, "CLUSTERCTL_PLAIN": "1"})
    finally:
        sandbox.node_docker(sb.name, node, "rm", "-f", "cc-odd-torch", check=False)
        sandbox.node_docker(sb.name, node, "tag", keep, image)
        sandbox.node_docker(sb.name, node, "rmi", keep)
        sandbox.node_docker(sb.name, node, "image", "prune", "-f", check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    lines = [ln for ln in out.splitlines() if ln.startswith("node")]
    odd = [ln for ln in lines if "differs" in ln]
    assert odd and all(ln.startswith("node4: ") for ln in odd), out
    assert any("image ID" in ln for ln in odd)
    assert any("torch version in the image 2.13.0+odd differs from the other 3 nodes' 2.13.0"
               in ln for ln in odd), out
    assert "1 of 4 nodes not ready: node4" in out


def test_kernel_and_clock_differences_with_stand_in_facts(sandbox4):
    """Sandbox nodes share this machine's kernel and clock, so the differences here are
    STAND-IN facts: the real facts of the four nodes are read, then node2's kernel and
    node3's clock offset are replaced before the comparison."""
    from clusterctl.cluster import preflight
    from clusterctl.cluster.transport import Cluster

    with Cluster(load_inventory(sandbox4.inventory_path)) as cluster:
        checks = preflight.run_preflight(cluster)
    assert all(c.kernel and c.clock_offset is not None for c in checks)   # the real facts were read
    for c in checks:
        c.problems, c.warnings = [], []
    checks[1].kernel = "5.10.0-stand-in"
    # beyond what the real round trip can explain (on a loaded machine it took seconds)
    checks[2].clock_offset = checks[2].clock_uncertainty + 5.0
    preflight.apply_consistency(checks)
    assert [c.ok for c in checks] == [True] * 4   # warnings only: the nodes can still run
    assert checks[1].warnings == [f"kernel 5.10.0-stand-in differs from the other 3 nodes' "
                                  f"{os.uname().release}"]
    assert checks[2].warnings and f"clock is {checks[2].clock_offset:.1f} s ahead of this " \
        "machine's (more than 1 s" in checks[2].warnings[0]
    assert not checks[0].warnings and not checks[3].warnings


# --------------------------------------------------------------------------- the budget

@pytest.fixture(scope="module")
def sandbox3_with_image(sandbox3, image):
    """The session's 3-node sandbox (``sandbox3``: 3 nodes, not the 4 of issue 22's figure,
    which benchmarks/collective.md measures), with the cpu image pushed and links unshaped."""
    results = push_image(image, load_inventory(sandbox3.inventory_path))
    assert all(r.ok for r in results), [r.describe() for r in results]
    return sandbox3


def _library_check(sb, image, **options):
    """``run_check`` as a launcher calls it (default sizes, pair size and budget)."""
    import time

    from clusterctl.run.collective import check

    t = time.monotonic()
    result = check.run_check(load_inventory(sb.inventory_path), target="cpu", image=image,
                             options=check.Options(push=False, **options))
    return result, time.monotonic() - t


def test_a_node_on_8mbit_is_named_within_60_s_by_the_default_budget(sandbox3_with_image, image):
    """Issue 22: a run that restarts re-checks its nodes; a slow node must be named within
    60 s.  Before the budget, the default check (1M,4M,16M all-node sizes, 4M pairs, 5
    iterations) took 305 s on 4 nodes with one at 8mbit.  The timing assertion is the
    requirement itself (with the default 45 s budget the slack is 15 s)."""
    sb = sandbox3_with_image
    healthy, healthy_s = _library_check(sb, image)
    print(f"\nhealthy 3 nodes: {healthy_s:.1f} s: {healthy.verdict.message}")
    assert healthy.verdict.ok, healthy.verdict.message
    sb.shape("node3", "8mbit")
    try:
        result, seconds = _library_check(sb, image)
    finally:
        sb.shape("node3", None)
    print(f"node3 at 8mbit: named in {seconds:.1f} s (check {result.seconds:.1f} s, probe "
          f"budget {result.budget:.0f} s): {result.verdict.message}")
    assert result.verdict.named == ["node3"], result.verdict.message
    assert seconds <= 60.0, f"{seconds:.1f} s to name the slow node (goal: 60 s)"
    assert _left_on_nodes(sb._sandbox) == {}


def test_a_budget_too_short_for_the_slow_pair_names_the_unfinished_pairs(sandbox3_with_image,
                                                                         image):
    """A pair all_reduce of 64M over 8mbit takes ~64 s: within a 30 s budget no pair with
    node3 finishes.  The check ends near its budget instead of waiting for the 300 s
    --timeout, and names the nodes of the pair cut short (node3's first round is with
    node2 and nothing after it ran: both are named, each as possibly healthy)."""
    sb = sandbox3_with_image
    sb.shape("node3", "8mbit")
    try:
        result, seconds = _library_check(sb, image, budget=30.0, pair_bytes=64 << 20,
                                         sizes=(1 << 20,))
    finally:
        sb.shape("node3", None)
    print(f"\nbudget 30 s, 64 MiB pairs: {seconds:.1f} s: {result.verdict.message}")
    v = result.verdict
    assert "node3" in v.named and not v.ok, v.message
    assert seconds <= 30.0 + 15.0
    reasons = {x.node: x.reason for x in v.nodes}
    assert "no pair finished within the budget" in reasons["node3"], reasons
    assert _left_on_nodes(sb._sandbox) == {}
