"""The sandbox cluster: real network namespaces, a bridge, per-node sshd and dockerd.

Most tests use the session's ``sandbox3``.  The life-cycle tests (grow, crash,
down) use a second sandbox of their own, so that taking it down never disturbs
``sandbox3`` that other test modules share; it also shows that two sandboxes
coexist and that ``down NAME`` touches only its own.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import dockerd, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from tests.fixtures import REPO
from tests.fixtures.sandbox import TEST_NAME, TEST_SUBNET

pytestmark = pytest.mark.sandbox

runner = CliRunner()

# The life-cycle sandbox: the test sandbox's name with a suffix, the next subnet.
LIFE_NAME = (TEST_NAME[:7] + "l") if TEST_NAME[-1:] != "l" else TEST_NAME[:7] + "m"
_net = ipaddress.IPv4Network(TEST_SUBNET)
LIFE_SUBNET = str(ipaddress.IPv4Network(f"{_net.network_address + _net.num_addresses}/{_net.prefixlen}"))


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root")


def _cli(*args: str):
    return runner.invoke(app, list(args))


def _message(result) -> str:
    """The CLI's output with rich's line folding undone, for substring checks."""
    return " ".join((result.output or "").split())


# --------------------------------------------------------------------------- sandbox3


def test_every_node_answers_ssh_with_strict_host_keys_and_runs_its_own_daemon(sandbox3):
    inv = load_inventory(sandbox3.inventory_path)
    assert [n.name for n in inv.nodes] == ["node1", "node2", "node3"]
    assert [n.host for n in inv.nodes] == list(sandbox3.nodes.values())
    assert inv.ssh.known_hosts == sandbox3.known_hosts and not inv.ssh.accept_new_host_keys
    assert {n.interface for n in inv.nodes} == {"eth0"} and {n.slots for n in inv.nodes} == {2}

    with Cluster(inv) as cluster:
        got = cluster.map(lambda c: c.run(["docker", "info", "--format", "{{.ID}}"], check=True).stdout.strip())
    over_ssh = {node: got[node] for node in sandbox3.nodes}
    assert all(isinstance(v, str) and v for v in over_ssh.values()), over_ssh
    local = {node: sandbox3.node_docker(node, "info", "--format", "{{.ID}}").stdout.strip()
             for node in sandbox3.nodes}
    assert over_ssh == local  # docker over SSH talks to that node's daemon ...
    assert len(set(local.values())) == 3  # ... and every node has its own
    engine_id = subprocess.run(["docker", "info", "--format", "{{.ID}}"], capture_output=True,
                               text=True).stdout.strip()
    assert engine_id not in local.values()


def test_each_node_has_a_home_of_its_own_not_this_machines_dotfiles(sandbox3):
    """Over SSH a node's user gets its own empty $HOME (0700), as on a fresh node: bash
    sources ~/.bashrc before every command sshd starts, and this machine's own (pyenv
    here) cost 90 ms per command, more than the commands clusterctl sends."""
    sb = sandbox.load(TEST_NAME)
    with Cluster(load_inventory(sandbox3.inventory_path)) as cluster:
        got = cluster.map(lambda c: c.run(["sh", "-c", 'printf "%s\\n" "$HOME"; cd && pwd'],
                                          check=True).stdout.split())
    for name in sandbox3.nodes:
        home = sb.node(name).home
        assert got[name] == [str(home)] * 2, got
        assert home.is_dir() and home.stat().st_mode & 0o777 == 0o700
    assert len({tuple(v) for v in got.values()}) == len(sandbox3.nodes) == 3 and str(Path.home()) not in str(got)


def test_a_wrong_host_key_is_refused(sandbox3, tmp_path):
    """Strict checking is really on: node1's address paired with node2's key fails."""
    lines = sandbox3.known_hosts.read_text().splitlines()
    node1_ip, node2_ip = sandbox3.nodes["node1"], sandbox3.nodes["node2"]
    node2_key = next(line for line in lines if line.startswith(node2_ip + " ")).split(" ", 1)[1]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{node1_ip} {node2_key}\n")
    client = paramiko.SSHClient()
    client.load_host_keys(str(wrong))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        client.connect(node1_ip, username="root", key_filename=str(sandbox3.key),
                       look_for_keys=False, allow_agent=False, timeout=10)
    client.close()

    right = paramiko.SSHClient()
    right.load_host_keys(str(sandbox3.known_hosts))
    right.set_missing_host_key_policy(paramiko.RejectPolicy())
    right.connect(node1_ip, username="root", key_filename=str(sandbox3.key),
                  look_for_keys=False, allow_agent=False, timeout=10)
    _, stdout, _ = right.exec_command("ip -o -4 addr show dev eth0")
    assert f" {node1_ip}/" in stdout.read().decode()
    right.close()


def test_password_login_is_refused(sandbox3):
    """Key-only: the server offers no password or keyboard-interactive method."""
    transport = paramiko.Transport((sandbox3.nodes["node1"], 22))
    transport.start_client(timeout=10)
    try:
        with pytest.raises(paramiko.BadAuthenticationType) as e:
            transport.auth_password("root", "root")
        assert e.value.allowed_types == ["publickey"]
    finally:
        transport.close()


def test_image_stores_are_separate(sandbox3, tmp_path):
    """An image loaded into node1 exists there only."""
    tar = tmp_path / "rootfs.tar"
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "marker").write_text("node1 only\n")
    subprocess.run(["tar", "-C", str(tmp_path / "root"), "-cf", str(tar), "."], check=True)
    tag = "clusterctl-test/sandbox-store:node1"
    sandbox3.node_docker("node1", "import", str(tar), tag)
    try:
        assert sandbox3.node_docker("node1", "image", "inspect", tag, check=False).returncode == 0
        for other in ("node2", "node3"):
            r = sandbox3.node_docker(other, "image", "inspect", tag, check=False)
            assert r.returncode != 0 and "No such image" in r.stderr
    finally:
        sandbox3.node_docker("node1", "rmi", tag, check=False)


def test_nodes_reach_each_other_and_the_head_reaches_every_node(sandbox3):
    node1_ip, node2_ip = sandbox3.nodes["node1"], sandbox3.nodes["node2"]
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{sandbox3.netns('node2')}", sys.executable, "-c",
         "import socket,sys\n"
         "s=socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)\n"
         "print(s.getsockname()[1], flush=True)\n"
         "c, addr = s.accept(); c.sendall(addr[0].encode()); c.close()\n",
         node2_ip],
        stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        client = sandbox3.in_netns("node1", [
            sys.executable, "-c",
            "import socket,sys\n"
            "s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
            "print(s.recv(100).decode())\n",
            node2_ip, port], capture_output=True, text=True, timeout=30)
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == node1_ip  # node2 saw node1's own address
    finally:
        server.kill()
        server.wait()
    for ip in sandbox3.nodes.values():
        with socket.create_connection((ip, 22), timeout=5) as s:
            assert s.recv(4).startswith(b"SSH-")
    # traffic stays on the bridge: no way out of a node's namespace
    routes = sandbox3.in_netns("node1", ["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert "default" not in routes


def test_up_again_keeps_what_runs(sandbox3):
    sb = sandbox.load(sandbox3.name)
    before = {n.name: (dockerd.read_pid(n.daemon.pidfile), dockerd.read_pid(n.sshd_pidfile))
              for n in sb.nodes}
    text = Path(sandbox3.inventory_path).read_text()
    keys = sandbox3.known_hosts.read_text()
    again = sandbox.up(3, name=sb.name, subnet=sb.subnet, slots=sb.slots,
                       inventory_path=sb.inventory_path)
    after = {n.name: (dockerd.read_pid(n.daemon.pidfile), dockerd.read_pid(n.sshd_pidfile))
             for n in again.nodes}
    assert after == before and all(all(p) for p in after.values())
    assert Path(sandbox3.inventory_path).read_text() == text
    assert sandbox3.known_hosts.read_text() == keys
    rules = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    assert rules.count(f"-i {sb.bridge} -o {sb.bridge} -j ACCEPT") == 1


def test_stop_and_start_sshd_and_link_helpers(sandbox3):
    ip = sandbox3.nodes["node3"]
    sandbox3.stop_sshd("node3")
    try:
        assert not sandbox.port_open(ip)
        assert sandbox3.node_docker("node3", "info", "--format", "{{.ID}}").stdout.strip()
    finally:
        sandbox3.start_sshd("node3")
    assert sandbox.port_open(ip)
    sandbox3.link_down("node3")
    try:
        assert not sandbox.port_open(ip, timeout=2)
    finally:
        sandbox3.link_up("node3")
    deadline = time.monotonic() + 10
    while not sandbox.port_open(ip) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sandbox.port_open(ip)


def test_status_lists_the_nodes(sandbox3):
    r = _cli("sandbox", "status", "--name", sandbox3.name)
    assert r.exit_code == 0, r.output
    for node, ip in sandbox3.nodes.items():
        row = next(line for line in r.output.splitlines() if f" {node} " in line)
        assert ip in row and sandbox3.netns(node) in row
        assert re.search(r"\bup\b.*\bup\b", row), row  # sshd up, dockerd up
    every = _cli("sandbox", "status")
    assert every.exit_code == 0 and f"sandbox {sandbox3.name}: {sandbox3.subnet}" in every.output
    assert sandbox3.name in sandbox.names()
    st = sandbox.status(sandbox3.name)[0]
    assert st.subnet == sandbox3.subnet and st.bridge_exists
    assert all(n.images is not None for n in st.nodes)


# --------------------------------------------------------------------------- life cycle


def _traces(name: str) -> list[str]:
    """Everything of sandbox ``name`` still on the machine, described; empty when clean."""
    left = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"netns {line.split()[0]}" for line in netns.splitlines()
             if line.startswith(f"cc-{name}-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [f"link {m}" for m in re.findall(rf"\d+: (cc-?{name}[-\w]*)[@:]", links)]
    rules = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    left += [f"rule {line}" for line in rules.splitlines() if f"cc-{name} " in line]
    state, data = sandbox.state_base() / name, sandbox.data_base() / name
    left += [f"dir {p}" for p in (state, data) if p.exists()]
    lock = sandbox.state_base() / f".{name}.lock"
    left += [f"lock file {lock}"] if lock.exists() else []
    left += [f"process {p}" for p in sandbox.processes_using(state)]
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {line.split()[4]}" for line in mounts
             if line.split()[4].startswith((f"{state}/", f"{data}/")) or line.split()[4] in (str(state), str(data))]
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if backing.read_text().strip().startswith(f"{data}/"):
            left += [f"loop device {backing.parent.parent.name} of {backing.read_text().strip()}"]
    return left


@pytest.fixture
def life_sandbox(tmp_path, sandbox3):
    """A second sandbox for life-cycle tests; removed after the test whatever happens.
    (Asking for sandbox3 holds the session's claim on the test names.)"""
    sandbox.down(LIFE_NAME)
    try:
        yield tmp_path / "life.yaml"
    finally:
        sandbox.down(LIFE_NAME)


def _gone(pid: int, wait: float = 5.0) -> bool:
    """True once ``pid`` has exited (a zombie waiting for init to reap it counts as exited)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _start_container(name: str, node: str, tmp_path: Path) -> int:
    """A `sleep` container (its own network namespace) on a node's daemon; returns its host pid.

    The image is a tar of symlinks into /usr, which is bind-mounted from this machine:
    no registry and no base image needed."""
    root = tmp_path / "img"
    root.mkdir()
    for link in ("bin", "lib", "lib64", "sbin"):
        (root / link).symlink_to(f"usr/{link}")
    subprocess.run(["tar", "-C", str(root), "-cf", str(tmp_path / "img.tar"), "."], check=True)
    sandbox.node_docker(name, node, "import", str(tmp_path / "img.tar"), "cc-test/usr:1", check=True)
    cid = sandbox.node_docker(name, node, "run", "-d", "--net=none", "-v", "/usr:/usr:ro",
                              "cc-test/usr:1", "sleep", "600", check=True).stdout.strip()
    pid = sandbox.node_docker(name, node, "inspect", "--format", "{{.State.Pid}}", cid,
                              check=True).stdout.strip()
    return int(pid)


def test_up_grow_shape_crash_and_down_leave_nothing(life_sandbox, sandbox3, tmp_path):
    inv = life_sandbox
    r = _cli("sandbox", "up", "--nodes", "2", "--name", LIFE_NAME, "--subnet", LIFE_SUBNET,
             "--bandwidth", "100mbit", "--inventory", str(inv))
    assert r.exit_code == 0, r.output
    sb = sandbox.load(LIFE_NAME)
    assert str(inv) in _message(r)
    for node in sb.nodes:
        assert node.ip in r.output
        images = sandbox.node_docker(LIFE_NAME, node.name, "images", "-q", check=True).stdout
        assert images.strip() == ""  # a fresh node has an empty image store of its own
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", node.veth], capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
    assert "tbf" in subprocess.run(["tc", "qdisc", "show", "dev", sb.bridge], capture_output=True, text=True).stdout
    assert len(load_inventory(inv).nodes) == 2

    node1 = sb.node("node1")
    pid1 = dockerd.read_pid(node1.daemon.pidfile)
    for count in (4, 3):  # grow, then shrink: node4 goes away completely
        r = _cli("sandbox", "up", "--nodes", str(count), "--name", LIFE_NAME, "--subnet", LIFE_SUBNET,
                 "--inventory", str(inv))
        assert r.exit_code == 0, r.output
    grown = sandbox.load(LIFE_NAME)
    node4 = sandbox.node_for(LIFE_NAME, grown.network, 4)
    assert not any(t.endswith((node4.netns, node4.veth)) or node4.name in t for t in _traces(LIFE_NAME))
    assert not sandbox.port_open(node4.ip, timeout=1)
    assert [n.name for n in load_inventory(inv).nodes] == ["node1", "node2", "node3"]
    assert dockerd.read_pid(node1.daemon.pidfile) == pid1  # kept, not restarted
    assert len(grown.known_hosts_path.read_text().splitlines()) == 3
    assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", node1.veth],
                                       capture_output=True, text=True).stdout  # unshaped now

    # a crash-like state: a container whose daemon is killed hard (with its containerd),
    # sshd killed, a stray process left in a namespace
    container_pid = _start_container(LIFE_NAME, "node1", tmp_path)
    daemon_pid = dockerd.read_pid(node1.daemon.pidfile)
    for pid in [*_children(daemon_pid), daemon_pid]:
        os.kill(pid, 9)
    os.kill(dockerd.read_pid(grown.node("node2").sshd_pidfile), 9)
    stray = subprocess.Popen(["nsenter", f"--net=/run/netns/{grown.node('node3').netns}",
                              "sleep", "600"])
    time.sleep(0.5)
    r = _cli("sandbox", "status", "--name", LIFE_NAME)
    assert r.exit_code == 0
    rows = {line.split()[1]: line for line in r.output.splitlines() if re.search(r"\bnode\d\b", line)}
    assert re.search(r"\bup\b\s*\S\s*down\b", rows["node1"]), rows["node1"]  # sshd up, dockerd down

    r = _cli("sandbox", "down", "--name", LIFE_NAME)
    assert r.exit_code == 0, r.output
    stray.wait(timeout=10)
    assert _gone(container_pid)
    assert not list(Path("/sys/fs/cgroup").glob(f"*/clusterctl/{LIFE_NAME}"))
    assert _traces(LIFE_NAME) == []
    assert not inv.exists()
    # the other sandbox was not touched
    assert all(sandbox.port_open(ip) for ip in sandbox3.nodes.values())
    assert _traces(sandbox3.name)  # still up


def test_a_small_data_root_is_a_disk_of_its_own_and_down_after_a_crash_removes_it(life_sandbox):
    """limit_data_root: the node's dockerd on a loop-mounted ext4 of the size asked for;
    undone, the node's own store is back; after a crash (dockerd killed, its bind mount
    stacked on the loop mount, the state file lost) down leaves no mount and no loop device."""
    sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=life_sandbox)
    node = sandbox.load(LIFE_NAME).node("node1")
    root = node.daemon.data_root
    sandbox.node_docker(LIFE_NAME, "node1", "volume", "create", "mine", check=True)
    sandbox.limit_data_root(LIFE_NAME, "node1", "64M")
    st = os.statvfs(root)
    assert 48 << 20 <= st.f_blocks * st.f_frsize <= 64 << 20  # ext4 keeps some for itself
    assert sandbox.node_docker(LIFE_NAME, "node1", "info", "--format", "{{.DockerRootDir}}",
                               check=True).stdout.strip() == str(root)
    assert sandbox.node_docker(LIFE_NAME, "node1", "volume", "ls", "-q", check=True).stdout.split() == []
    assert any(t.startswith("loop device") for t in _traces(LIFE_NAME))
    sandbox.limit_data_root(LIFE_NAME, "node1", None)
    assert not any(t.startswith("loop device") for t in _traces(LIFE_NAME))
    assert not sandbox.storage.image_file(node).exists()
    assert sandbox.node_docker(LIFE_NAME, "node1", "volume", "ls", "-q", check=True).stdout.split() == ["mine"]

    sandbox.limit_data_root(LIFE_NAME, "node1", "64M")
    assert sandbox.kill_dockerd(LIFE_NAME, "node1")
    (sandbox.state_base() / LIFE_NAME / "sandbox.json").unlink()
    assert sandbox.down(LIFE_NAME)
    assert _traces(LIFE_NAME) == []


def test_down_cleans_debris_without_a_state_file(life_sandbox):
    """After a lost /run (reboot, crash) down still finds netns, veths, bridge, rule by name."""
    sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=life_sandbox)
    (sandbox.state_base() / LIFE_NAME / "sandbox.json").unlink()
    st = sandbox.status(LIFE_NAME)
    assert st and st[0].subnet is None and [n.name for n in st[0].nodes] == ["node1"]
    assert sandbox.down(LIFE_NAME)
    assert _traces(LIFE_NAME) == []


def test_up_repairs_a_node_whose_namespace_was_deleted(life_sandbox):
    """Daemons (and the veth pair) outlive `ip netns del` in an orphaned namespace, still
    answering on their sockets; up replaces them with ones in the node's new namespace."""
    sb = sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=life_sandbox)
    node = sb.node("node1")
    old = dockerd.read_pid(node.daemon.pidfile), dockerd.read_pid(node.sshd_pidfile)
    subprocess.run(["ip", "netns", "del", node.netns], check=True)
    assert not any(sandbox.in_netns(pid, node.netns) for pid in old)
    sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=life_sandbox)
    new = dockerd.read_pid(node.daemon.pidfile), dockerd.read_pid(node.sshd_pidfile)
    assert all(new) and set(new).isdisjoint(old)
    assert all(sandbox.in_netns(pid, node.netns) for pid in new)
    assert all(_gone(pid) for pid in old)
    assert sandbox.port_open(node.ip)
    assert sandbox.down(LIFE_NAME) and _traces(LIFE_NAME) == []


def test_a_node_that_cannot_start_is_named_and_down_still_cleans_up(life_sandbox):
    sandbox.up(2, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=life_sandbox)
    node2 = sandbox.load(LIFE_NAME).node("node2")
    dockerd.stop(node2.daemon)
    shutil.rmtree(node2.daemon.data_root)
    node2.daemon.data_root.write_text("not a directory\n")  # dockerd cannot have its data-root
    r = _cli("sandbox", "up", "--nodes", "2", "--name", LIFE_NAME, "--subnet", LIFE_SUBNET,
             "--inventory", str(life_sandbox))
    msg = _message(r)
    assert r.exit_code == 1 and msg.startswith("error: node2: ") and "Traceback" not in msg, msg
    assert str(node2.daemon.data_root) in msg
    node1 = sandbox.load(LIFE_NAME).node("node1")
    assert dockerd.socket_answers(node1.daemon.socket)  # the healthy node was not touched
    assert sandbox.down(LIFE_NAME) and _traces(LIFE_NAME) == []


def test_down_of_an_unknown_sandbox_says_so():
    _needs_root()
    r = _cli("sandbox", "down", "--name", "zzqnone")
    assert r.exit_code == 0 and "no sandbox" in r.output


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("args", "words"), [
    (["--nodes", "2", "--subnet", "10.213.7.0/33"], ["--subnet", "10.213.0.0/24"]),
    (["--nodes", "2", "--subnet", "10.213.7.5/24"], ["host bits"]),
    (["--nodes", "2", "--subnet", "8.8.8.0/24"], ["not a private range"]),
    (["--nodes", "5", "--subnet", "10.213.7.0/28"], ["room for 4 node(s)"]),
    (["--nodes", "0"], ["--nodes 0", "1 to"]),
    (["--nodes", "2", "--name", "Bad-Name"], ["sandbox name", "lowercase"]),
    (["--nodes", "2", "--name", "muchtoolong"], ["1 to 8 characters"]),
    (["--nodes", "2", "--bandwidth", "fast"], ["--bandwidth", "200mbit"]),
    (["--nodes", "2", "--slots", "0"], ["--slots 0"]),
])
def test_bad_input_is_refused_before_anything_starts(args, words, tmp_path):
    _needs_root()
    inv = tmp_path / "inv.yaml"
    r = _cli("sandbox", "up", "--name", "zzqbad", *args, "--inventory", str(inv))
    assert r.exit_code == 2, r.output
    msg = _message(r)
    assert "Traceback" not in msg
    for w in words:
        assert w in msg, msg
    assert not inv.exists() and _traces("zzqbad") == []


def test_a_subnet_in_use_by_another_sandbox_is_refused(sandbox3, tmp_path):
    r = _cli("sandbox", "up", "--nodes", "1", "--name", "zzqover", "--subnet", sandbox3.subnet,
             "--inventory", str(tmp_path / "inv.yaml"))
    msg = _message(r)
    assert r.exit_code == 2, msg
    assert f'interface cc-{sandbox3.name} (sandbox "{sandbox3.name}")' in msg
    suggested = re.search(r"--subnet (\S+)`", msg).group(1)
    assert not ipaddress.IPv4Network(suggested).overlaps(ipaddress.IPv4Network(sandbox3.subnet))
    assert _traces("zzqover") == [] and not (tmp_path / "inv.yaml").exists()


def test_another_live_sandboxs_inventory_is_not_overwritten(sandbox3):
    before = Path(sandbox3.inventory_path).read_text()
    r = _cli("sandbox", "up", "--nodes", "1", "--name", "zzqinv", "--subnet", LIFE_SUBNET,
             "--inventory", str(sandbox3.inventory_path))
    assert r.exit_code == 2 and f'inventory of sandbox "{sandbox3.name}"' in _message(r)
    assert Path(sandbox3.inventory_path).read_text() == before and _traces("zzqinv") == []


def test_an_inventory_not_ours_is_not_overwritten(tmp_path):
    _needs_root()
    inv = tmp_path / "mine.yaml"
    inv.write_text("nodes: [{host: example}]\n")
    r = _cli("sandbox", "up", "--nodes", "1", "--name", "zzqinv", "--subnet", LIFE_SUBNET,
             "--inventory", str(inv))
    assert r.exit_code == 2 and "not written by" in _message(r)
    assert inv.read_text() == "nodes: [{host: example}]\n" and _traces("zzqinv") == []


@pytest.mark.parametrize("where", ["dir", "/proc/sys/clusterctl/inv.yaml"])
def test_an_unwritable_inventory_path_is_refused_before_anything_starts(where, tmp_path):
    _needs_root()
    path = str(tmp_path) if where == "dir" else where
    r = _cli("sandbox", "up", "--nodes", "1", "--name", "zzqinv", "--subnet", LIFE_SUBNET,
             "--inventory", path)
    msg = _message(r)
    assert r.exit_code == 2, msg
    assert "--inventory" in msg and path in msg and "Traceback" not in msg
    assert _traces("zzqinv") == []


def test_a_missing_tool_is_named_with_its_package(tmp_path, monkeypatch):
    """PATH without dockerd and sshd: the message names both and the apt-get line."""
    _needs_root()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "tc", "iptables", "nsenter", "ssh-keygen"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bin_dir))
    r = _cli("sandbox", "up", "--nodes", "1", "--name", "zzqpath", "--subnet", LIFE_SUBNET,
             "--inventory", str(tmp_path / "inv.yaml"))
    monkeypatch.undo()
    msg = _message(r)
    assert r.exit_code == 2, msg
    assert "dockerd" in msg and "sshd" in msg
    assert "apt-get install -y docker.io openssh-server" in msg
    assert "iproute2" not in msg
    assert _traces("zzqpath") == [] and not (tmp_path / "inv.yaml").exists()


@pytest.mark.parametrize("command", [["up", "--nodes", "1"], ["down"]])
def test_not_root_is_refused_with_a_message(command, tmp_path):
    """Run as nobody in a subprocess (root cannot be dropped inside this process); it keeps
    only the capability to read files, since the interpreter may live under /root."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run as another user")
    repo = REPO
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
         "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
         sys.executable, "-m", "clusterctl", "sandbox", *command, "--name", "zzqroot",
         *(["--inventory", str(tmp_path / "inv.yaml")] if command[0] == "up" else [])],
        capture_output=True, text=True, cwd="/", timeout=60,
        env={**os.environ, "PYTHONPATH": str(repo), "HOME": "/nonexistent"})
    assert r.returncode == 2, r.stderr
    assert "needs root" in r.stderr and "sudo" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "inv.yaml").exists()


def test_inventory_yaml_is_commented_and_complete(sandbox3):
    text = Path(sandbox3.inventory_path).read_text()
    assert text.startswith(f"{sandbox.INVENTORY_MARKER} {sandbox3.name}\n")
    data = yaml.safe_load(text)
    assert set(data) == {"ssh", "defaults", "nodes"}
    for entry in data["nodes"]:
        assert set(entry) == {"name", "host", "port", "user", "identity_file", "slots", "interface",
                              "code_dir"}
        assert entry["identity_file"] == str(sandbox3.key)
        # the nodes share this machine's files: each keeps its project copies apart
        assert entry["code_dir"] == str(sandbox.data_base() / sandbox3.name / entry["name"] / "code")
