"""Fault injection (`clusterctl fault`, clusterctl.run.faults): the pure parts, then each fault
on the real 3-node sandbox with its effect checked on the node.

The sandbox tests start a plain container with a run's labels on node2 (the base image,
pushed once: it has python3, sleep and sh), with two "rank" processes (RANK=2 and RANK=3 in
their environment, under `--init` as launch starts them) and a minimal run record for it.
Each test restores what it broke (a link, a dockerd, an sshd) and removes its containers.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import distribute
from clusterctl.cluster.containers import ContainerState
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.sandbox import port_open
from clusterctl.core.errors import EnvironmentProblem, NodeError, UserError
from clusterctl.run import faults, records

runner = CliRunner()

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def cli(*args: str):
    return runner.invoke(app, ["fault", *args])


@pytest.fixture
def runs(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(d))
    monkeypatch.setenv("CLUSTERCTL_PLAIN", "1")
    monkeypatch.delenv("CLUSTERCTL_NODES", raising=False)
    return d


@pytest.fixture
def cluster_yaml(tmp_path):
    """A real cluster's inventory (no sandbox has these addresses)."""
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - {name: gpu1, host: 192.0.2.11}\n"
                    "  - {name: gpu2, host: 192.0.2.12, interface: ens5}\n")
    return path


def save_record(run_id: str, inventory, nodes: dict[str, str]) -> records.RunRecord:
    """A minimal run record: ``nodes`` maps node name -> host, in rank order."""
    rec = records.RunRecord(run_id=run_id, job="fault-test", inventory=str(inventory), image="img",
                            state="running", detached=True,
                            nodes=[records.NodeRecord(node=n, host=h, rank=i, container=f"{run_id}-{n}",
                                                      state="running")
                                   for i, (n, h) in enumerate(nodes.items())])
    rec.save()
    return rec


# --------------------------------------------------------------------------- pure parts

def test_kinds_parse_and_an_unknown_one_names_the_valid_ones():
    assert faults.parse_kind("kill") == "kill"
    assert faults.parse_kind(" Link-Down ") == "link-down"
    assert set(faults.KINDS) == faults.RUN_KINDS | faults.SANDBOX_KINDS
    with pytest.raises(UserError) as e:
        faults.parse_kind("link-dwn")
    assert 'did you mean "link-down"' in e.value.message
    assert "kill, sigstop, link-down, link-up, engine-stop or engine-start" in e.value.message
    assert e.value.exit_code == 2


def test_the_cli_offers_the_kinds_as_a_choice():
    res = cli("bogus", "--node", "n1")
    assert res.exit_code == 2
    assert "'bogus' is not one of 'kill', 'sigstop', 'link-down'" in res.output
    help_text = runner.invoke(app, ["fault", "--help"], env={"COLUMNS": "200"}).output
    assert "kill|sigstop|link-down|link-up|engine-stop|engine-start" in help_text


def test_options_that_do_not_go_with_the_kind_are_refused():
    faults.check_options("sigstop", rank=3, after=1.5)
    with pytest.raises(UserError, match="fault kill takes no --rank"):
        faults.check_options("kill", rank=1, after=None)
    with pytest.raises(UserError, match="--after -1"):
        faults.check_options("kill", rank=None, after=-1)


def test_an_unknown_node_is_exit_2_naming_the_inventorys_nodes(runs, cluster_yaml):
    res = cli("kill", "--node", "gpu3", "--nodes", str(cluster_yaml))
    assert res.exit_code == 2, res.output
    assert f"no node 'gpu3' in {cluster_yaml}" in res.output and "its nodes: gpu1 or gpu2" in res.output
    assert "Traceback" not in res.output


def test_a_sandbox_fault_on_a_real_cluster_is_refused_saying_what_to_do_there(runs, cluster_yaml):
    res = cli("link-down", "--node", "gpu2", "--nodes", str(cluster_yaml))
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "fault link-down needs a sandbox" in out and "gpu2 (192.0.2.12)" in out
    assert "`sudo ip link set ens5 down` on the node" in out      # its interface from the inventory
    assert "Nothing was done." in out
    inv = load_inventory(cluster_yaml)
    msg = faults.not_sandbox_message("engine-stop", inv.nodes[0], cluster_yaml)
    assert "systemctl kill --signal=SIGKILL docker" in msg and "systemctl stop docker" in msg
    assert "ip link set DEV up" in faults.not_sandbox_message("link-up", inv.nodes[0], cluster_yaml)
    with pytest.raises(UserError, match="needs a sandbox"):
        faults.resolve("engine-start", "gpu1", nodes=cluster_yaml, sandboxes=[])


def test_the_sandbox_is_found_by_its_inventory_file_or_the_nodes_address(tmp_path):
    a = faults.SandboxRef("a", "/x/a.yaml", {"node1": "10.1.0.11", "node2": "10.1.0.12"})
    b = faults.SandboxRef("b", "/x/b.yaml", {"node1": "10.2.0.11"})
    assert faults.sandbox_node("/x/a.yaml", "10.1.0.12", [b, a]) == ("a", "node2")
    assert faults.sandbox_node("/x/../x/b.yaml", "10.2.0.11", [a, b]) == ("b", "node1")
    assert faults.sandbox_node("/elsewhere/copy.yaml", "10.2.0.11", [a, b]) == ("b", "node1")
    assert faults.sandbox_node("/x/a.yaml", "10.9.0.1", [a, b]) is None
    assert faults.sandbox_node("/x/a.yaml", "10.1.0.11", []) is None
    inv = tmp_path / "sbx.yaml"
    inv.write_text("nodes:\n  - {name: node1, host: 10.1.0.11}\n  - {name: node2, host: 10.1.0.12}\n")
    if faults.os.geteuid() == 0:
        target = faults.resolve("link-down", "node2", nodes=inv, sandboxes=[a])
        assert (target.sandbox, target.node.name, target.run_id) == (("a", "node2"), "node2", None)
    else:
        with pytest.raises(EnvironmentProblem, match="needs root"):
            faults.resolve("link-down", "node2", nodes=inv, sandboxes=[a])


def test_a_sandbox_fault_without_inventory_or_run_says_what_to_give(runs):
    res = cli("link-up", "--node", "node1")
    assert res.exit_code == 2
    assert "fault link-up needs the inventory: give --nodes FILE" in res.output


def test_the_inventory_defaults_to_the_runs(runs, cluster_yaml):
    save_record("r1", cluster_yaml, {"gpu1": "192.0.2.11", "gpu2": "192.0.2.12"})
    target = faults.resolve("kill", "gpu2")
    assert target.run_id == "r1" and target.node.host == "192.0.2.12"
    with pytest.raises(UserError, match="no node 'gpu9'"):
        faults.resolve("sigstop", "gpu9", run_id="r1")
    with pytest.raises(UserError, match="no run 'r2'"):
        faults.resolve("kill", "gpu1", run_id="r2")


def _state(name: str, status: str, minutes: int = 0) -> ContainerState:
    return ContainerState(node="n", name=name, status=status, started=T0 + timedelta(minutes=minutes))


def test_the_running_container_is_the_newest_attempt_whatever_its_name():
    found = [(_state("r-n", "exited"), 0), (_state("r-n-a1", "running", 1), 1),
             (_state("r-n-a2", "running", 2), 2)]
    assert faults.pick_container(found, run_id="r", node="n").name == "r-n-a2"
    assert faults.pick_container(found[:2], run_id="r", node="n").name == "r-n-a1"
    with pytest.raises(UserError) as e:
        faults.pick_container(found[:1], run_id="r", node="n")
    assert "no running container of run r on n" in e.value.message and e.value.exit_code == 2
    assert "io.clusterctl.node=n" in e.value.message


def test_what_the_stop_script_prints_is_read_and_a_missing_rank_named():
    out = ('{"ranks": [{"pid": 7, "rank": 2, "state": "S", "cmd": "x"}, {"pid": 9, "rank": 3, '
           '"state": "S", "cmd": "y"}], "pid": null, "rank": null, "state": "", "init": false}')
    result = faults.parse_stop_output(out)
    assert result.pid is None and len(result.ranks) == 2
    msg = faults.rank_missing_message(result, container="c", node="n", rank=5)
    assert msg.startswith("no process of rank 5 in container c on n; the ranks there: 2 or 3.")
    empty = faults.parse_stop_output('{"ranks": [], "pid": null}')
    assert "no rank process in container c" in faults.rank_missing_message(
        empty, container="c", node="n", rank=None)
    with pytest.raises(ValueError):
        faults.parse_stop_output("OCI runtime exec failed")


def test_the_line_printed_names_the_fault_the_target_and_the_time():
    at = datetime(2026, 1, 1, 12, 0, 1, 234000, tzinfo=timezone.utc).timestamp()
    inj = faults.Injection("kill", "node2", "container r1-node2", "SIGKILL", at, at - 0.1,
                           run_id="r1", container="r1-node2")
    assert faults.describe(inj) == "fault: kill on node2 (container r1-node2) at 12:00:01.234 UTC"
    assert inj.record()["container"] == "r1-node2" and "pid" not in inj.record()


def test_a_node_that_does_not_answer_is_exit_1_naming_it(runs, tmp_path):
    inv = tmp_path / "closed.yaml"   # nothing listens on port 1: refused at once
    inv.write_text(f"ssh: {{known_hosts: {tmp_path / 'kh'}, connect_timeout: 3}}\n"
                   "nodes:\n  - {name: far, host: 127.0.0.1, port: 1}\n")
    save_record("r1", inv, {"far": "127.0.0.1"})
    res = cli("kill", "--node", "far")
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error: far: cannot be reached over SSH (") and "no fault was injected" in res.output
    assert "Traceback" not in res.output


# --------------------------------------------------------------------------- on the sandbox

@pytest.fixture(scope="module")
def base_on_node2(sandbox3, base_image):
    """The base image (python3, sh, sleep) on node2, pushed once."""
    [result] = distribute.push_image(base_image, load_inventory(sandbox3.inventory_path), nodes=["node2"])
    assert result.status != "failed", result.error
    return base_image


@pytest.fixture
def ranked(sandbox3, base_on_node2, runs):
    """A running container of a fresh run on node2, labelled as launch labels attempt 1 of a
    restarted run (named after it, not as its record says), with two rank processes, and
    the run's record; removed after the test."""
    sb = sandbox3
    run_id = f"fault-{uuid.uuid4().hex[:6]}"
    name = f"{run_id}-node2-a1"
    sb.node_docker("node2", "run", "-d", "--init", "--name", name,
                   "--label", f"io.clusterctl.run={run_id}", "--label", "io.clusterctl.node=node2",
                   "--label", "io.clusterctl.rank=1", "--label", "io.clusterctl.attempt=1",
                   base_on_node2, "sh", "-c", "RANK=3 sleep 600 & RANK=2 sleep 600 & wait")
    save_record(run_id, sb.inventory_path, dict(sb.nodes))
    try:
        yield run_id, name
    finally:
        sb.node_docker("node2", "rm", "--force", name, check=False)


def _rank_pids(sb, container: str) -> dict[int, tuple[int, str]]:
    """rank -> (pid, state) of the container's processes with RANK, read from /proc in it."""
    script = ("import os\nfor p in os.listdir('/proc'):\n if p.isdigit() and int(p) != os.getpid():\n"
              "  try:\n   env=open('/proc/%s/environ'%p,'rb').read().split(b'\\0')\n"
              "   st=[l for l in open('/proc/%s/status'%p) if l.startswith('State:')][0]\n"
              "  except OSError: continue\n"
              "  r=[e[5:].decode() for e in env if e.startswith(b'RANK=')]\n"
              "  if r: print(r[0], p, st.split(':',1)[1].strip())\n")
    out = sb.node_docker("node2", "exec", container, "python3", "-c", script).stdout
    return {int(r): (int(p), st) for r, p, st in (line.split(None, 2) for line in out.splitlines())}


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_kill_sigkills_the_runs_container_found_by_its_labels(sandbox3, ranked):
    run_id, name = ranked
    t0 = time.monotonic()
    res = cli("kill", "--node", "node2")      # the newest run, its recorded inventory
    took = time.monotonic() - t0
    print(f"kill: {took:.2f}s")
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"fault: kill on node2 (container {name}) at ") and " UTC" in res.output
    def state() -> list[str]:
        return sandbox3.node_docker("node2", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}",
                                    name).stdout.split()

    deadline = time.monotonic() + 10
    while state()[0] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state() == ["exited", "137"]
    again = cli("kill", "--node", "node2", "--run", run_id)   # nothing runs there now
    assert again.exit_code == 2 and f"no running container of run {run_id} on node2" in again.output


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_sigstop_stops_the_nodes_first_rank_or_the_rank_asked_for(sandbox3, ranked):
    run_id, name = ranked
    before = _rank_pids(sandbox3, name)
    assert sorted(before) == [2, 3] and all(not st.startswith("T") for _, st in before.values())
    t0 = time.monotonic()
    first = faults.inject("sigstop", "node2", run_id=run_id)
    print(f"sigstop: {time.monotonic() - t0:.2f}s")
    assert (first.rank, first.pid, first.container) == (2, before[2][0], name)
    assert first.requested <= first.at <= time.time()
    now = _rank_pids(sandbox3, name)
    assert now[2][1].startswith("T") and not now[3][1].startswith("T"), now
    res = cli("sigstop", "--node", "node2", "--rank", "3", "--run", run_id)
    assert res.exit_code == 0, res.output
    assert f"(container {name}, rank 3, pid {before[3][0]})" in res.output
    assert _rank_pids(sandbox3, name)[3][1].startswith("T")
    res = cli("sigstop", "--node", "node2", "--rank", "7")
    assert res.exit_code == 2 and "no process of rank 7" in res.output and "ranks there: 2 or 3" in res.output


@pytest.mark.sandbox
@pytest.mark.slow
def test_link_down_silences_the_node_until_link_up(sandbox3, runs):
    sb, ip = sandbox3, sandbox3.nodes["node3"]
    assert port_open(ip)
    try:
        res = cli("link-down", "--node", "node3", "--nodes", str(sb.inventory_path))
        assert res.exit_code == 0, res.output
        assert res.output.startswith("fault: link-down on node3 (link ")
        assert not port_open(ip, timeout=1.0)
        res = cli("link-up", "--node", "node3", "--nodes", str(sb.inventory_path), "--after", "0.2")
        assert res.exit_code == 0, res.output
        deadline = time.monotonic() + 10
        while not port_open(ip) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert port_open(ip)
    finally:
        sb.link_up("node3")


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_engine_stop_kills_the_nodes_dockerd_and_engine_start_brings_it_back(sandbox3, runs):
    sb = sandbox3
    try:
        stopped = faults.inject("engine-stop", "node3", nodes=sb.inventory_path)
        assert stopped.sandbox == sb.name and "SIGKILL to dockerd" in stopped.action
        assert sb.node_docker("node3", "version", check=False).returncode != 0
        t0 = time.monotonic()
        res = cli("engine-start", "--node", "node3", "--nodes", str(sb.inventory_path))
        print(f"engine-start: {time.monotonic() - t0:.2f}s")
        assert res.exit_code == 0, res.output
        assert sb.node_docker("node3", "info", check=False).returncode == 0
    finally:
        sb.restart_dockerd("node3")


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_node_whose_sshd_is_down_is_exit_1_and_nothing_is_done(sandbox3, ranked):
    run_id, name = ranked
    sandbox3.stop_sshd("node2")
    try:
        with pytest.raises(NodeError) as e:
            faults.inject("kill", "node2", run_id=run_id)
        assert e.value.node == "node2" and e.value.exit_code == 1
        assert "cannot be reached over SSH" in e.value.message
    finally:
        sandbox3.start_sshd("node2")
    assert sandbox3.node_docker("node2", "inspect", "-f", "{{.State.Status}}", name).stdout.strip() == "running"


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_sigstop_of_a_rank_that_is_the_containers_pid_1_is_sent_from_outside(sandbox3, base_on_node2, runs):
    """Without --init the rank may be PID 1, which no signal from inside its container stops."""
    sb = sandbox3
    run_id = f"fault-{uuid.uuid4().hex[:6]}"
    name = f"{run_id}-node2"
    sb.node_docker("node2", "run", "-d", "--name", name, "-e", "RANK=4",
                   "--label", f"io.clusterctl.run={run_id}", "--label", "io.clusterctl.node=node2",
                   base_on_node2, "sleep", "600")
    try:
        save_record(run_id, sb.inventory_path, dict(sb.nodes))
        done = faults.inject("sigstop", "node2")
        assert (done.rank, done.pid) == (4, 1) and "docker kill --signal STOP" in done.action
        assert _rank_pids(sb, name)[4][1].startswith("T")
    finally:
        sb.node_docker("node2", "rm", "--force", name, check=False)
