"""check --network's planner and readers (pure), and its two node scripts run for real here
on loopback listeners (the whole check across real network namespaces, with a pair blocked
by a firewall rule, is tests/cluster/test_netcheck_sandbox.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from clusterctl.cluster import netcheck as nc


def _nodes(n: int) -> list[nc.Endpoint]:
    return [nc.Endpoint(f"node{i}", f"10.0.0.{i}", 22) for i in range(1, n + 1)]


def test_plan_every_pair_ssh_and_collective_and_the_rendezvous_to_the_master():
    probes = nc.plan_probes(_nodes(3), "node1", 29500)
    assert [(p.src, p.dst, p.port, p.kind) for p in probes if p.src == "node2"] == [
        ("node2", "node1", 22, "ssh"), ("node2", "node3", 22, "ssh"),
        ("node2", "node1", 29500, "rendezvous"),
        ("node2", "node1", None, "collective"), ("node2", "node3", None, "collective")]
    assert not any(p.kind == "rendezvous" for p in probes if p.src == "node1")
    assert len(probes) == 3 * 2 * 2 + 2
    assert not any(p.kind == "rendezvous" for p in nc.plan_probes(_nodes(3), "node1", None))


def test_plan_above_the_all_pairs_limit_is_a_ring_every_node_probed_as_often():
    nodes = _nodes(nc.ALL_PAIRS_UP_TO + 36)
    probes = [p for p in nc.plan_probes(nodes, "node1", 29500) if p.kind == "ssh"]
    assert len(probes) == len(nodes) * nc.RING_PEERS
    into = {n.name: sum(p.dst == n.name for p in probes) for n in nodes}
    assert set(into.values()) == {nc.RING_PEERS}
    assert nc.peers([n.name for n in nodes], "node100")[:2] == ["node1", "node2"]


def test_readers_and_findings_name_the_blocked_pair():
    assert nc.read_listen("M", "noise\nM ports 41234 29500 812\n") == (41234, "29500", 812)
    assert nc.read_listen("M", "M ports x y z\n") is None
    assert nc.read_connect("M", "M 0 ok\nM 1 blocked timeout\nX 2 ok\nM 9 ok\n", 3) == {0: "ok", 1: "timeout"}
    probes = nc.plan_probes(_nodes(3), "node1", 29500)
    mine = [p for p in probes if p.src == "node1"]
    found = nc.findings(mine, {0: "ok", 1: "timeout", 2: "ok"}, {"node2": 40001, "node3": 40002})
    assert [b.message for b in found] == [
        "node1 -> node3:22 blocked (timeout): SSH between nodes (the push relay and the tree)",
        "node1 -> node3:40002 blocked (no answer): the collective's own ports (gloo/NCCL: a port "
        "the kernel picks on each node)"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scripts_on_real_loopback_listeners():
    """The node scripts as sh runs them on a node: the listener answers on its ports and is
    gone after the stop; a port nobody listens on is named refused."""
    rendezvous = _free_port()
    r = subprocess.run(["sh", "-c", nc.LISTEN, "sh", "MK", "20", str(rendezvous)],
                       capture_output=True, text=True, timeout=20)
    port, rdv, pid = nc.read_listen("MK", r.stdout)
    assert rdv == str(rendezvous)
    try:
        closed = _free_port()
        r = subprocess.run(["sh", "-c", nc.CONNECT, "sh", "MK", "2", f"127.0.0.1:{port}",
                            f"127.0.0.1:{rendezvous}", f"127.0.0.1:{closed}"],
                           capture_output=True, text=True, timeout=20)
        assert nc.read_connect("MK", r.stdout, 3) == {0: "ok", 1: "ok", 2: "refused"}
        busy = subprocess.run(["sh", "-c", nc.LISTEN, "sh", "MK2", "5", str(rendezvous)],
                              capture_output=True, text=True, timeout=20)
        held = nc.read_listen("MK2", busy.stdout)
        subprocess.run(["sh", "-c", nc._STOP, "sh", str(held[2]), "MK2"], timeout=10, check=True)
        assert held[1] == "busy"       # held: someone answers for it
    finally:
        subprocess.run(["sh", "-c", nc._STOP, "sh", str(pid), "MK"], timeout=10, check=True)
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
