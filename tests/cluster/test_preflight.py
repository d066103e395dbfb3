"""Preflight through a real sshd on loopback (and the sandbox cluster for real NICs).

The loopback sshd sets DOCKER_HOST to the local engine, so `docker` over SSH
answers with the same daemon the test reads directly.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import uuid

import pytest

from clusterctl.cluster import preflight
from clusterctl.cluster.preflight import (
    COLUMNS,
    find_interface,
    interface_for,
    interfaces,
    listening_ports,
    parse_ip_addr,
    parse_proc_net_tcp,
    parse_ss,
    port_free,
    run_preflight,
    table_rows,
)
from clusterctl.cluster.transport import Cluster, NodeConnection
from clusterctl.core.errors import NodeError
from tests.fixtures.sshd import ENGINE_SOCKET, free_port, running_sshd


def _local_docker(*args: str) -> str:
    return subprocess.run(["docker", "-H", ENGINE_SOCKET, *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.docker
def test_preflight_reports_what_the_node_really_has(loopback_sshd):
    with Cluster(loopback_sshd.inventory(2)) as cluster:
        checks = run_preflight(cluster)
    assert [c.node for c in checks] == ["node1", "node2"]
    master = checks[0]
    assert master.problems == [] and master.ok and master.ssh
    assert master.docker_version == _local_docker("version", "--format", "{{.Server.Version}}")
    assert master.docker_root == _local_docker("info", "--format", "{{.DockerRootDir}}")
    assert master.arch == platform.machine()
    st = os.statvfs(master.docker_root)
    assert abs(master.free_bytes - st.f_bavail * st.f_frsize) < 2 * 1024**3  # others write too
    assert (master.address, master.interface) == ("127.0.0.1", "lo")
    assert (checks[1].address, checks[1].interface) == ("127.0.0.2", "lo")
    assert master.master_port == 29500 and checks[1].master_port is None
    assert interfaces(checks) == {"node1": "lo", "node2": "lo"}


@pytest.mark.docker
def test_preflight_is_two_ssh_channels_per_node_whatever_it_checks(loopback_sshd, base_image, monkeypatch):
    """Issue 12: a channel costs this machine ~2 ms of CPU; every check, master port and
    image ID included, rides on two (a node script and a docker script), not one each.
    The image is the base image (its fixture makes it where the engine has none), not
    whatever image an earlier test left."""
    image = base_image
    calls: list[tuple[str, list[str]]] = []
    real = NodeConnection.run

    def counted(self, argv, **kw):
        calls.append((self.name, list(argv)))
        return real(self, argv, **kw)

    monkeypatch.setattr(NodeConnection, "run", counted)
    with Cluster(loopback_sshd.inventory(2)) as cluster:
        checks = run_preflight(cluster, devices=["/dev/null"], image_ref=image)
    for node in ("node1", "node2"):
        assert len([argv for n, argv in calls if n == node]) == 2, calls
    master = checks[0]
    assert master.ok and master.master_port_free is True and master.free_bytes > 0
    assert master.image_id == _local_docker("image", "inspect", "--format", "{{.Id}}", image)
    assert master.kernel == platform.release() and abs(master.clock_offset) < 5
    assert master.init_binary == _local_docker("info", "--format", "{{.InitBinary}}")
    assert master.init is True and preflight.init_nodes(checks) == ["node1", "node2"]
    assert master.devices_checked and master.missing_devices == []


def test_the_init_check_finds_a_binary_on_the_path_or_not_at_all():
    """_INIT_SCRIPT as the node's sh runs it: the name is an argument, never shell text."""
    def found(name: str) -> bool:
        return subprocess.run(["sh", "-c", preflight._INIT_SCRIPT, "sh", name]).returncode == 0

    assert found("sh") and found("/bin/sh")
    assert not found("") and not found("clusterctl-no-such-init") and not found("/nonexistent/tini")
    assert not found("x; exit 0") and not found("$(exit 0)")


def test_the_script_sections_parse_back_exactly():
    out = ("\nT begin a\nline 1\nline 2\nT end a 0\n"
           "\nT begin b\n\nT end b 127\n")
    err = "\nT begin a\n\nT begin b\nsh: 1: docker: not found\n"
    assert preflight.parse_sections("T", out, err) == {
        "a": (0, "line 1\nline 2", ""), "b": (127, "", "sh: 1: docker: not found\n")}


def test_devices_are_checked_as_data_never_as_shell(loopback_sshd, tmp_path):
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    hostile = f"/dev/x $(touch {marker})"
    inv = loopback_sshd.inventory([loopback_sshd.node("n", devices=["/dev/null"])])
    with Cluster(inv) as cluster:
        [check] = run_preflight(cluster, devices=["/dev/zero", "/dev/clusterctl-none", hostile],
                                image_ref=f"x$(touch {marker})'\"`touch {marker}`")
    assert check.image_id is None   # an image ref is data too
    assert check.devices == ["/dev/null", "/dev/zero", "/dev/clusterctl-none", hostile]
    assert check.missing_devices == ["/dev/clusterctl-none", hostile]
    assert any("missing devices: /dev/clusterctl-none" in p for p in check.problems)
    assert not marker.exists()
    assert table_rows([check])[0][COLUMNS.index("devices")] == "2/4 present"


def test_free_disk_is_compared_with_the_required_size(loopback_sshd):
    with Cluster(loopback_sshd.inventory(1)) as cluster:
        [small] = run_preflight(cluster, required_bytes=1024)
        [huge] = run_preflight(cluster, required_bytes=small.free_bytes + 1024**5)
    assert small.ok
    assert len(huge.problems) == 1 and "free at" in huge.problems[0] and "need" in huge.problems[0]


def test_port_free_sees_ipv4_and_ipv6_listeners_on_the_node(loopback_sshd):
    port = free_port()
    with Cluster(loopback_sshd.inventory(1)) as cluster:
        conn = cluster.connection("node1")
        assert port_free(conn, port)
        for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as s:
                s.bind((addr, port))
                assert port_free(conn, port)  # bound but not listening yet
                s.listen()
                assert not port_free(conn, port)
                assert port in listening_ports(conn)
        assert port_free(conn, port)


def test_busy_master_port_is_a_problem_on_the_master_only(loopback_sshd):
    port = free_port()
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
        s.listen()
        with Cluster(loopback_sshd.inventory(2, master_port=port)) as cluster:
            checks = run_preflight(cluster)
            assert run_preflight(cluster, check_master_port=False)[0].ok
    assert checks[0].master_port_free is False
    assert checks[0].problems == [f"master port {port} is already in use on the master "
                                  "(another job? set master_port in the inventory)"]
    assert checks[1].ok


def test_inventory_interface_is_verified_to_exist(loopback_sshd):
    nodes = [loopback_sshd.node("given", 0, interface="lo"),
             loopback_sshd.node("wrong", 1, interface="clusterctl9")]
    with Cluster(loopback_sshd.inventory(nodes)) as cluster:
        good, bad = run_preflight(cluster)
        assert find_interface(cluster.connection("given")) == "lo"
        with pytest.raises(NodeError) as e:
            find_interface(cluster.connection("wrong"))
    assert good.ok and good.interface == "lo" and good.address is None
    assert bad.interface is None
    # (the list of interfaces that follows may change meanwhile: others create sandboxes)
    reason = "interface 'clusterctl9' (from the inventory) does not exist on the node; it has "
    assert len(bad.problems) == 1 and bad.problems[0].startswith(reason)
    assert str(e.value).startswith("wrong: " + reason)
    assert "lo" in bad.problems[0]  # lists what exists
    assert table_rows([bad])[0][COLUMNS.index("interface")] == "FAILED"


def test_unreachable_node_is_a_row_with_the_reason_and_the_others_are_checked(loopback_sshd):
    nodes = [loopback_sshd.node("up", 0),
             loopback_sshd.node("down", 1, port=free_port("127.0.0.2"))]
    with Cluster(loopback_sshd.inventory(nodes), connect_timeout=5) as cluster:
        up, down = run_preflight(cluster)
    assert up.ok
    assert not down.ssh and down.docker_version is None
    assert down.problems[0].startswith("connection refused")
    row = table_rows([down])[0]
    assert row[:3] == ["down", "127.0.0.2", "FAILED"] and row[-1] == down.problems[0]


def test_a_node_without_a_docker_daemon_still_reports_the_rest(tmp_path):
    with running_sshd(env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}) as sshd, \
            Cluster(sshd.inventory(1)) as cluster:
        [check] = run_preflight(cluster)
    assert check.ssh and check.docker_version is None and check.free_bytes is None
    assert check.problems[0].startswith("Docker daemon not answering")
    assert "no-daemon.sock" in check.problems[0]
    assert check.arch == platform.machine() and check.interface == "lo"


def test_every_local_address_maps_back_to_its_interface():
    """interface_for() against this machine's real `ip -o addr show`."""
    addresses = parse_ip_addr(subprocess.run(["ip", "-o", "addr", "show"], check=True,
                                             capture_output=True, text=True).stdout)
    assert any(a.interface == "lo" for a in addresses)
    for a in addresses:
        if not a.address.ip.is_link_local:  # the same fe80:: may sit on several links
            assert interface_for(str(a.address.ip), addresses) == a.interface
    assert interface_for("127.0.0.9", addresses) == "lo"  # in lo's /8, routed locally
    assert interface_for("203.0.113.77", addresses) is None


def test_parsers_read_the_formats_of_ip_ss_and_proc():
    ip_text = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
               "5: eth0@if6    inet 10.213.0.11/24 brd 10.213.0.255 scope global eth0\\ ...\n"
               "5: eth0@if6    inet6 fe80::1%eth0/64 scope link \\ ...\n")
    addrs = parse_ip_addr(ip_text)
    assert [a.interface for a in addrs] == ["lo", "eth0", "eth0"]
    assert interface_for("10.213.0.11", addrs) == "eth0"
    assert interface_for("::ffff:10.213.0.11", addrs) == "eth0"
    assert parse_ss("LISTEN 0 128 0.0.0.0:22 0.0.0.0:*\nLISTEN 0 4096 [::]:29500 [::]:*\n"
                    "LISTEN 0 5 *:8080 *:*\n") == {22, 29500, 8080}
    proc = ("  sl  local_address rem_address   st tx_queue\n"
            "   0: 00000000:0016 00000000:0000 0A 00000000:00000000\n"
            "   1: 0100007F:7339 0100007F:B804 01 00000000:00000000\n"
            "   0: 00000000000000000000000000000000:7539 00000000000000000000000000000000:0000 0A 0\n")
    assert parse_proc_net_tcp(proc) == {22, 0x7539}


@pytest.mark.sandbox
@pytest.mark.slow
def test_preflight_on_the_sandbox_finds_each_nodes_own_nic_and_daemon(sandbox3):
    """The sandbox inventory names eth0; here it is left out so preflight must find it."""
    from clusterctl.cluster.inventory import load_inventory

    inventory = load_inventory(sandbox3.inventory_path)
    inventory.nodes = [n.model_copy(update={"interface": None}) for n in inventory.nodes]
    with Cluster(inventory) as cluster:
        checks = run_preflight(cluster)
    assert [c.node for c in checks] == list(sandbox3.nodes)
    for c in checks:
        assert c.problems == [], c
        assert c.address == sandbox3.nodes[c.node]  # the node's own address, not the head's
        assert c.interface == "eth0"  # the veth end inside the node's namespace
        own = sandbox3.node_docker(c.node, "info", "--format", "{{.DockerRootDir}}").stdout.strip()
        assert c.docker_root == own  # each node reports its OWN daemon
    assert len({c.docker_root for c in checks}) == len(checks)


def test_a_node_too_slow_for_preflight_is_named_with_what_timed_out(loopback_sshd):
    with Cluster(loopback_sshd.inventory(1)) as cluster:
        [check] = run_preflight(cluster, timeout=0.005)
    assert check.ssh and not check.ok
    # the two scripts run at once; which of them times out first depends on the machine's load
    assert any(re.fullmatch(r"preflight's (docker|node) checks \([a-z, ]+\): timed out after 0\.01s", p)
               for p in check.problems), check.problems
    assert not any("sec()" in p for p in check.problems), check.problems   # no script text
