"""Relay push on a real 3-node sandbox: nodes forward the stream to each other over SSH.

Real parts only: the local engine, three namespaced nodes with their own sshd and
dockerd (fixture ``sandbox3``), the nodes' own ``ssh``/``tee``/``docker load``.
Images are built FROM scratch here (a few tens of MB of random bytes, so the
tests measure the relay and not the machine's disk).  Byte counts: what the head
wrote into SSH channels (``head_bytes``) and what each node's ``dd`` counted
arriving (``bytes_sent``).
"""

from __future__ import annotations

import glob
import hashlib
import os
import secrets
import threading
import time
import types

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import distribute
from clusterctl.cluster.distribute import relay
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import NodeError
from tests.fixtures.images import random_layers_image
from tests.fixtures.sandbox import SandboxCluster, cluster_fields, held_sandbox, own_sandbox

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

TAG = "clusterctl-test/relay"
MB = 1024 * 1024
#: tar headers, config, manifest and v1 json around the layers of a save stream
METADATA = 64 * 1024
runner = CliRunner()


def _build(client, tag: str, layers: list[int], base: str = "scratch") -> distribute.SourceImage:
    return random_layers_image(client, tag, layers, base)[0]


def _node_id(sandbox3, node: str, ref: str) -> str | None:
    r = sandbox3.node_docker(node, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def _forget(docker_client, sandbox3, *images) -> None:
    for image in images:
        for node in sandbox3.nodes:
            sandbox3.node_docker(node, "rmi", "-f", image.id, check=False)
        try:
            docker_client.images.remove(image.id, force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def scratch(docker_client, sandbox3):
    image = _build(docker_client, f"{TAG}:scratch", [12 * MB, 8 * MB, 4 * MB])
    yield image
    _forget(docker_client, sandbox3, image)


def test_relay_push_feeds_the_nodes_through_each_other_and_the_head_sends_once(
        sandbox3, scratch):
    image = scratch
    size = sum(int(s) for s in (12 * MB, 8 * MB, 4 * MB))
    authorized = sandbox3._sandbox.authorized_keys
    before = _digest(authorized)
    results = distribute.push_image(image.ref, load_inventory(sandbox3.inventory_path),
                                    strategy="relay")
    nodes = list(sandbox3.nodes)
    assert [r.node for r in results] == nodes
    for r in results:
        assert r.ok, f"{r.node}: {r.error}"
        assert (r.status, r.layers_sent) == ("full", 3)
        assert size <= r.bytes_sent <= size + METADATA, (r.node, r.bytes_sent)
    # a chain in inventory order: the head feeds node1 only
    assert [r.source for r in results] == ["head", nodes[0], nodes[1]]
    head = sum(r.head_bytes for r in results)
    assert size <= head <= size + METADATA, head  # about S, not 3 x S
    for node in nodes:
        assert _node_id(sandbox3, node, image.ref) == image.id
    # nothing left behind: no directory, no process, no key
    assert sandbox3.relay_leftovers() == []
    assert _digest(authorized) == before

    again = distribute.push_image(image.ref, load_inventory(sandbox3.inventory_path),
                                  strategy="relay")
    assert [(r.status, r.bytes_sent, r.head_bytes) for r in again] == [("skipped", 0, 0)] * 3


def _timeline(path) -> list[tuple[float, str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            t, node, phase = line.split(None, 2)
            rows.append((float(t), node, phase))
    return rows


def test_every_hop_is_up_before_the_head_sends_and_nodes_confirm_their_own_load(
        sandbox3, scratch, tmp_path, monkeypatch):
    """The chain's fixed cost does not grow with its length: every node's hop from its
    feeder logs in at the same time, before the first byte leaves the head (a hop that
    logged in only once its feeder was fed cost ~1 s per node), and each node tags the
    image right after its load (no extra command from the head); still nothing left."""
    path = tmp_path / "push.trace"
    monkeypatch.setenv("CLUSTERCTL_PUSH_TRACE", str(path))
    from clusterctl.cluster.transport import connection
    opened: dict[str, list[str]] = {}
    real = connection.NodeConnection._channel

    def counted(self, argv, *a, **kw):
        opened.setdefault(self.name, []).append(argv[3] if len(argv) > 3 else argv[0])
        return real(self, argv, *a, **kw)

    monkeypatch.setattr(connection.NodeConnection, "_channel", counted)
    results = distribute.push_image(scratch.ref, load_inventory(sandbox3.inventory_path),
                                    strategy="relay")
    monkeypatch.setattr(connection.NodeConnection, "_channel", real)
    assert all(r.ok for r in results), [(r.node, r.error) for r in results]
    # two commands per node, the plan and the relay command: the node's directory is made
    # by the relay command itself (a command of its own per node cost a session each)
    assert opened == {n: ["clusterctl-push-plan", "clusterctl-relay"] for n in sandbox3.nodes}
    rows = _timeline(path)
    nodes = list(sandbox3.nodes)
    send = [t for t, node, phase in rows if phase == "head-send-start"]
    assert len(send) == 1, rows
    ready = {node: t for t, node, phase in rows if phase == "ready"}
    assert sorted(ready) == sorted(nodes), rows
    assert max(ready.values()) <= send[0], rows
    assert sorted(node for _, node, phase in rows if phase == "confirmed rc=0") == sorted(nodes)
    for node in nodes:
        assert _node_id(sandbox3, node, scratch.ref) == scratch.id
    assert sandbox3.relay_leftovers() == []


@pytest.fixture
def parent_child(docker_client, sandbox3):
    parent = _build(docker_client, f"{TAG}:parent", [10 * MB])
    child = _build(docker_client, f"{TAG}:child", [3 * MB], base=parent.ref)
    yield parent, child
    _forget(docker_client, sandbox3, child, parent)


def test_nodes_that_have_some_layers_get_only_what_they_lack(sandbox3, parent_child):
    parent, child = parent_child
    nodes = list(sandbox3.nodes)
    for node in nodes:
        sandbox3.node_docker(node, "rmi", "-f", child.id, parent.id, check=False)
    distribute.push_image(parent.ref, load_inventory(sandbox3.inventory_path),
                          nodes=[nodes[1]], strategy="star")
    results = {r.node: r for r in distribute.push_image(
        child.ref, load_inventory(sandbox3.inventory_path), strategy="relay")}
    assert all(r.ok for r in results.values()), {n: r.error for n, r in results.items()}
    # node2 lacks one layer: a stream of its own from the head; node1 -> node3 a chain
    assert (results[nodes[1]].status, results[nodes[1]].layers_sent) == ("layers", 1)
    assert 3 * MB <= results[nodes[1]].bytes_sent <= 3 * MB + METADATA
    assert results[nodes[1]].source == "head"
    assert results[nodes[0]].source == "head" and results[nodes[2]].source == nodes[0]
    for node in (nodes[0], nodes[2]):
        assert 13 * MB <= results[node].bytes_sent <= 13 * MB + METADATA
    head = sum(r.head_bytes for r in results.values())
    assert 16 * MB <= head <= 16 * MB + 2 * METADATA
    for node in nodes:
        assert _node_id(sandbox3, node, child.ref) == child.id


class _Watch:
    """PushProgress that takes a node's link down once it has received ``after`` bytes."""

    def __init__(self, sandbox3, node: str, after: int) -> None:
        self.sandbox3, self.node, self.after = sandbox3, node, after
        self.got: dict[str, int] = {}
        self.plans: list[tuple[str, str]] = []
        self.fired = threading.Event()
        self._lock = threading.Lock()

    def started(self, node, plan):
        self.plans.append((node, plan))

    def sent(self, node, nbytes):
        with self._lock:
            self.got[node] = self.got.get(node, 0) + nbytes
            fire = node == self.node and self.got[node] >= self.after and not self.fired.is_set()
            if fire:
                self.fired.set()
        if fire:
            self.sandbox3.link_down(self.node)

    def finished(self, result):
        pass


@pytest.fixture
def slow_links(sandbox3):
    for node in sandbox3.nodes:
        sandbox3.shape(node, "80mbit")  # 10 MB/s: a 40 MB image streams for seconds
    yield
    for node in sandbox3.nodes:
        sandbox3.link_up(node)
        sandbox3.shape(node, None)


def test_relay_node_whose_link_dies_mid_stream_is_named_and_the_rest_finish(
        docker_client, sandbox3, slow_links, monkeypatch):
    # the cut-off node cannot be reached to clean up: it stops itself once its stream
    # has stalled this long (120 s by default; shorter here to keep the test short)
    monkeypatch.setattr(relay, "STALL", 60)
    image = _build(docker_client, f"{TAG}:failure", [24 * MB, 16 * MB])
    nodes = list(sandbox3.nodes)
    relay_node, downstream = nodes[1], nodes[2]
    # the node reports its bytes every 2 s: at 24mbit (3 MB/s) the 40 MB stream lasts over
    # 13 s, so the cut (at the first report past 8 MB) lands mid-stream on a busy machine too
    sandbox3.shape(relay_node, "24mbit")
    try:
        watch = _Watch(sandbox3, relay_node, after=8 * MB)
        t0 = time.monotonic()
        results = {r.node: r for r in distribute.push_image(
            image.ref, load_inventory(sandbox3.inventory_path), strategy="relay",
            progress=watch)}
        took = time.monotonic() - t0
        assert watch.fired.is_set(), "the relay node never got 8 MB: nothing was tested"
        assert not results[relay_node].ok
        assert "stopped answering" in results[relay_node].error
        assert results[nodes[0]].ok and results[downstream].ok, results
        assert results[downstream].source == "head"  # fed again, from elsewhere
        assert (downstream, "feeder " + relay_node + " failed: fed again from the head") in [
            (n, p) for n, p in watch.plans]
        assert _node_id(sandbox3, downstream, image.id) == image.id
        assert took < 120, took
        sandbox3.link_up(relay_node)
        sandbox3.shape(relay_node, "80mbit")
        # the next push reaches the node that failed: nothing half-loaded stays there
        result = runner.invoke(app, ["push", image.ref, "--strategy", "relay",
                                     "--nodes", str(sandbox3.inventory_path)])
        assert result.exit_code == 0, result.output
        assert _node_id(sandbox3, relay_node, image.ref) == image.id
        deadline = time.monotonic() + 120  # the lost node's own command ends and cleans up
        while sandbox3.relay_leftovers() and time.monotonic() < deadline:
            time.sleep(1)
        assert sandbox3.relay_leftovers() == []
    finally:
        _forget(docker_client, sandbox3, image)


def test_push_exit_status_is_1_and_names_the_failed_node(docker_client, sandbox3, scratch):
    nodes = list(sandbox3.nodes)
    down = nodes[1]
    for node in nodes:
        sandbox3.node_docker(node, "rmi", "-f", scratch.id, check=False)
    sandbox3.stop_sshd(down)
    try:
        result = runner.invoke(app, ["push", scratch.ref, "--strategy", "relay",
                                     "--nodes", str(sandbox3.inventory_path)])
    finally:
        sandbox3.start_sshd(down)
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert f"push failed on 1 of 3 node(s): {down}: " in text
    assert "Traceback" not in text
    for node in (nodes[0], nodes[2]):
        assert _node_id(sandbox3, node, scratch.ref) == scratch.id


def test_a_node_command_whose_answer_was_lost_leaves_nothing_on_that_node(
        docker_client, sandbox3, scratch, monkeypatch):
    """The node started its command (which makes the push's directory on the node) but the
    head never heard back (an answer lost, a timeout): the node is named, the others
    finish, and nothing of the push is left there, found by the push's own token."""
    nodes = list(sandbox3.nodes)
    victim = nodes[2]
    tokens: list[str] = []

    def token_hex(n):
        tokens.append(secrets.token_hex(n))
        return tokens[-1]

    monkeypatch.setattr(relay, "secrets", types.SimpleNamespace(token_hex=token_hex))
    made: list[str] = []
    real_start = relay._start

    def start(run, *args):
        if run.name != victim:
            return real_start(run, *args)
        real_exec = run.conn.exec_channel

        def exec_channel(argv, **kw):
            real_exec(argv, **kw)
            made.append(argv[4])  # the node's directory (see NODE_SCRIPT)
            deadline = time.monotonic() + 20
            while not glob.glob(argv[4]) and time.monotonic() < deadline:
                time.sleep(0.05)  # the node made it: there is something to leave behind
            raise NodeError(victim, "the answer to the relay command was lost (made by the test)")

        run.conn.exec_channel = exec_channel
        try:
            return real_start(run, *args)
        finally:
            del run.conn.exec_channel

    monkeypatch.setattr(relay, "_start", start)
    for node in nodes:
        sandbox3.node_docker(node, "rmi", "-f", scratch.id, check=False)
    results = {r.node: r for r in distribute.push_image(
        scratch.ref, load_inventory(sandbox3.inventory_path), strategy="relay")}
    assert made and made[0].startswith(f"/tmp/clusterctl-push.{tokens[0]}.")
    assert not results[victim].ok and "answer to the relay command was lost" in results[victim].error
    assert results[nodes[0]].ok and results[nodes[1]].ok, results
    assert glob.glob(f"/tmp/clusterctl-push.{tokens[0]}.*") == []
    assert _node_id(sandbox3, nodes[1], scratch.ref) == scratch.id
    assert sandbox3.relay_leftovers() == []


def test_a_node_slow_to_answer_keepalives_is_not_lost_while_its_heartbeat_arrives(
        docker_client, sandbox3, slow_links, monkeypatch):
    """A node's sshd that is slow to answer keepalives (32 `docker load`s on 2 shared cores
    made 10 of 32 nodes "stop answering" in a benchmark) is alive as long as its own lines
    (the byte count it sends every 2 s) arrive. Stood in here by sending no keepalive at
    all and judging a node lost after 5 s of silence: the 40 MB stream at 5 MB/s through
    the chain lasts 8 s, and every node must still end with the image."""
    monkeypatch.setattr(relay, "_ping", lambda run: None)
    monkeypatch.setattr(relay, "LOST_AFTER", 5.0)
    for node in sandbox3.nodes:
        sandbox3.shape(node, "40mbit")   # slow_links puts them back afterwards
    image = _build(docker_client, f"{TAG}:quiet", [24 * MB, 16 * MB])
    try:
        t0 = time.monotonic()
        results = {r.node: r for r in distribute.push_image(
            image.ref, load_inventory(sandbox3.inventory_path), strategy="relay")}
        took = time.monotonic() - t0
        assert all(r.ok for r in results.values()), {n: r.error for n, r in results.items()}
        assert took > 8.0, f"the push took {took:.1f}s: no silence longer than LOST_AFTER was tested"
        for node in sandbox3.nodes:
            assert _node_id(sandbox3, node, image.ref) == image.id, node
    finally:
        _forget(docker_client, sandbox3, image)


def test_unknown_strategy_is_exit_2(sandbox3):
    result = runner.invoke(app, ["push", "x", "--strategy", "tree",
                                 "--nodes", str(sandbox3.inventory_path)])
    assert result.exit_code == 2
    assert "--strategy 'tree': valid values are auto, star, relay" in " ".join(result.output.split())


# A chain of 4 (the lost node in the middle feeds two more): this module's own sandbox, its
# name and the sixth /24 after CLUSTERCTL_TEST_SUBNET's (sandbox3 and the others hold theirs).
NAME4, SUBNET4 = own_sandbox("r", "q", 5)


@pytest.fixture(scope="module")
def sandbox4():
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    # every link at 80mbit (10 MB/s, tc tbf, the sandbox's bandwidth option): a 28 MB
    # image streams for seconds, so a link can be cut mid-transfer deterministically
    with held_sandbox(NAME4, SUBNET4, 4, slots=1, bandwidth="80mbit") as sb:
        yield SandboxCluster(**cluster_fields(sb))


def test_a_middle_node_cut_mid_push_is_named_and_the_nodes_after_it_are_fed_again(
        docker_client, sandbox4, monkeypatch, tmp_path):
    """node1 -> node2 -> node3 -> node4; node2's link is cut once it has received 6 MB.
    node2 is named as lost (exit 1, the documented status of a push that failed on a node),
    node3 and node4 are fed again, from the head, and end with the image's ID; node2 keeps
    no half image and nothing of the push is left on any node."""
    # the cut-off node cannot be reached to clean up: it stops itself once its stream has
    # stalled this long (120 s by default; shorter here to keep the test short)
    monkeypatch.setattr(relay, "STALL", 30)
    trace_file = tmp_path / "push.trace"
    monkeypatch.setenv("CLUSTERCTL_PUSH_TRACE", str(trace_file))
    image = _build(docker_client, f"{TAG}:cut4", [16 * MB, 12 * MB])
    nodes = list(sandbox4.nodes)
    lost, after = nodes[1], nodes[2:]
    # the node reports its bytes every 2 s: at 80mbit the whole 28 MB streamed through it
    # before a loaded machine's first report reached the head (seen in CI). At 20mbit
    # (2.5 MB/s) the stream through the lost node lasts over 11 s, so the cut lands mid-stream.
    sandbox4.shape(lost, "20mbit")
    watch = _Watch(sandbox4, lost, after=6 * MB)
    from clusterctl.cli import push as push_cli  # the CLI's own display, watched as it goes
    real_started, real_sent = push_cli.PlainProgress.started, push_cli.PlainProgress.sent

    def started(self, node, plan):
        real_started(self, node, plan)
        watch.started(node, plan)

    def sent(self, node, nbytes):
        real_sent(self, node, nbytes)
        watch.sent(node, nbytes)

    monkeypatch.setattr(push_cli.PlainProgress, "started", started)
    monkeypatch.setattr(push_cli.PlainProgress, "sent", sent)
    try:
        t0 = time.monotonic()
        result = runner.invoke(app, ["push", image.ref, "--strategy", "relay", "--no-compress",
                                     "--nodes", str(sandbox4.inventory_path)])
        took = time.monotonic() - t0
        text = " ".join(result.output.split())
        print(result.output, trace_file.read_text())  # shown when the test fails
        assert watch.fired.is_set(), f"{lost} never got 6 MB: nothing was tested"
        assert result.exit_code == 1, text
        assert "Traceback" not in text
        assert f"push failed on 1 of 4 node(s): {lost}: the node stopped answering" in text
        # the nodes after it: fed again, from the head, and the display says after what
        assert (after[0], f"feeder {lost} failed: fed again from the head") in watch.plans
        assert (after[1], f"feeder {after[0]} cut off by {lost}: fed again from the head") \
            in watch.plans
        assert f"head (again: {lost} failed)" in text
        assert f"image on 3 of 4 node(s); without it: {lost}" in text
        for node in [nodes[0], *after]:
            assert _node_id(sandbox4, node, image.ref) == image.id, node
        assert took < 60, took
        # fed again at once, not after the rest of the first round: node1, whose hop into the
        # lost node hangs until its ssh gives up (15 s), was still running then
        rows = _timeline(trace_file)
        again_at = [t for t, node, phase in rows if node == after[0] and phase == "exec-start"][1]
        node1_end = [t for t, node, phase in rows if node == nodes[0]
                     and phase.startswith("command-ended")][0]
        assert again_at < node1_end, rows
    finally:
        sandbox4.link_up(lost)
        sandbox4.shape(lost, "80mbit")  # the module's sandbox as it was made
    try:
        # nothing of the push left (the cut-off node stopped itself), no half image on it
        deadline = time.monotonic() + 90
        while sandbox4.relay_leftovers() and time.monotonic() < deadline:
            time.sleep(1)
        assert sandbox4.relay_leftovers() == []
        assert _node_id(sandbox4, lost, image.id) is None
        again = runner.invoke(app, ["push", image.ref, "--nodes", str(sandbox4.inventory_path)])
        assert again.exit_code == 0, again.output
        assert _node_id(sandbox4, lost, image.ref) == image.id
        assert sandbox4.relay_leftovers() == []
    finally:
        _forget(docker_client, sandbox4, image)
