"""`sandbox up --slurm`: a real Slurm cluster (Debian's slurm-wlm and munge) on sandbox nodes.

The cluster tests run on the session's ``slurm3`` (tests/fixtures/slurm.py): real
munged, slurmctld and one slurmd per node in the node's network namespace.  The
conf rendering tests are pure and fast.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import sandbox
from clusterctl.cluster.sandbox import slurm
from clusterctl.core.errors import NodeError
from tests.fixtures.sandbox import TEST_NAME, TEST_SUBNET

runner = CliRunner()

# --------------------------------------------------------------------------- rendering (pure)

GOLDEN_CONF = """\
# slurm.conf of sandbox gold, written by `clusterctl sandbox up --slurm`.
# Every daemon and client reads it through SLURM_CONF; `sandbox down` removes it.
ClusterName=ccgold
SlurmctldHost=headhost(10.213.7.1)
SlurmctldPort=31790
SlurmdPort=31791
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=/run/clusterctl/sandbox/gold/slurm/munge/munge.sock
StateSaveLocation=/run/clusterctl/sandbox/gold/slurm/ctld
SlurmctldPidFile=/run/clusterctl/sandbox/gold/slurm/ctld/slurmctld.pid
SlurmctldLogFile=/run/clusterctl/sandbox/gold/slurm/ctld/slurmctld.log
SlurmdSpoolDir=/run/clusterctl/sandbox/gold/slurm/spool/%n
SlurmdPidFile=/run/clusterctl/sandbox/gold/slurm/spool/%n/slurmd.pid
SlurmdLogFile=/run/clusterctl/sandbox/gold/slurm/spool/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=/run/clusterctl/sandbox/gold/slurm/task_prolog
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=30
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# one slurmd per sandbox node, in the node's network namespace
NodeName=node1 NodeAddr=10.213.7.11 CPUs=1 State=UNKNOWN
NodeName=node2 NodeAddr=10.213.7.12 CPUs=1 State=UNKNOWN
PartitionName=sandbox Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
"""

GOLDEN_PROLOG = """\
#!/bin/sh
# TaskProlog of sandbox gold: a task uses its node's own Docker engine.
case "$SLURMD_NODENAME" in
  node1) echo 'export DOCKER_HOST=unix:///run/clusterctl/sandbox/gold/node1/docker.sock' ;;
  node2) echo 'export DOCKER_HOST=unix:///run/clusterctl/sandbox/gold/node2/docker.sock' ;;
esac
"""


@pytest.fixture
def gold(monkeypatch) -> sandbox.Sandbox:
    monkeypatch.setenv("CLUSTERCTL_STATE", "/run/clusterctl")
    return sandbox.Sandbox(name="gold", subnet="10.213.7.0/24", node_count=2, slurm=True)


def test_slurm_conf_renders_to_the_fixed_text(gold):
    assert sandbox.render_slurm_conf(gold, "headhost") == GOLDEN_CONF
    assert gold.slurm_conf == "/run/clusterctl/sandbox/gold/slurm/slurm.conf"


def test_task_prolog_points_each_node_at_its_own_docker_socket(gold):
    assert slurm.render_task_prolog(gold) == GOLDEN_PROLOG
    assert gold.nodes[0].docker_host in GOLDEN_PROLOG  # the socket the node's dockerd serves


def test_hosts_file_names_each_node_before_the_machines_own_lines(gold):
    machine = "127.0.0.1\tlocalhost\n10.0.0.9\tnode1 # the machine's own node1\n"
    assert slurm.render_hosts(gold, machine) == (
        "# /etc/hosts of sandbox gold's Slurm jobs (`clusterctl sandbox up --slurm`)\n"
        "10.213.7.11\tnode1\n10.213.7.12\tnode2\n# this machine's /etc/hosts:\n"
        "127.0.0.1\tlocalhost\n10.0.0.9\tnode1 # the machine's own node1\n")


def test_task_prolog_of_a_podman_sandbox_also_gives_each_task_its_nodes_podman(monkeypatch):
    """Without the node's CONTAINERS_CONF a task's `podman` is the machine's default one:
    a Slurm job on Podman nodes then found no pushed image ("short-name ... did not
    resolve"), seen with `launch --scheduler slurm --container podman` on this sandbox."""
    monkeypatch.setenv("CLUSTERCTL_STATE", "/run/clusterctl")
    sb = sandbox.Sandbox(name="gold", subnet="10.213.7.0/24", node_count=2, slurm=True, runtime="podman")
    prolog = slurm.render_task_prolog(sb)
    assert prolog.splitlines()[1] == "# TaskProlog of sandbox gold: a task uses its node's own Docker engine and Podman."
    for node in sb.nodes:
        line = next(x for x in prolog.splitlines() if x.startswith(f"  {node.name})"))
        for name, value in {"DOCKER_HOST": node.docker_host, **node.podman_env}.items():
            assert f"echo 'export {name}={value}'" in line, line
    assert "podman" not in slurm.render_task_prolog(sandbox.Sandbox(name="gold", subnet="10.213.7.0/24",
                                                                    node_count=2, slurm=True))


def test_slurm_conf_path_is_none_without_slurm():
    assert sandbox.Sandbox(name="x", subnet="10.213.7.0/24", node_count=1).slurm_conf is None


def test_ports_differ_between_sandbox_subnets_and_stay_below_the_ephemeral_range():
    seen = set()
    for third in range(256):
        ctld, slurmd = slurm.ports(f"10.213.{third}.0/24")
        assert 1024 < ctld < slurmd < 32768
        seen |= {ctld, slurmd}
    assert len(seen) == 512


def test_up_slurm_without_the_packages_names_them_and_starts_nothing(tmp_path, monkeypatch):
    """A real PATH holding every tool the sandbox needs but none of Slurm's or munge's."""
    if os.geteuid() != 0:
        pytest.skip("sandbox up needs root before it looks for Slurm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dockerd", "sshd", "ssh-keygen", "ip", "tc", "iptables", "nsenter"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    name = "zzqnoslm"
    r = runner.invoke(app, ["sandbox", "up", "--nodes", "1", "--name", name, "--slurm",
                            "--subnet", "10.213.250.0/24", "--inventory", str(tmp_path / "i.yaml")])
    msg = " ".join(r.output.split())
    assert r.exit_code == 2, msg
    assert "munged, mungekey, slurmctld, slurmd, sinfo, scontrol, srun not found" in msg
    assert "apt-get install -y munge slurm-wlm" in msg and "Traceback" not in msg
    assert not (sandbox.state_base() / name).exists() and not (tmp_path / "i.yaml").exists()


# --------------------------------------------------------------------------- a real cluster


def _lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    """srun -l output: task number -> its line."""
    assert result.returncode == 0, result.stderr
    return dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)


@pytest.mark.sandbox
@pytest.mark.slow
def test_every_task_runs_on_its_own_node_with_its_hostname(slurm3):
    out = _lines(slurm3.slurm("srun", "-N3", "-l", "hostname"))
    assert out == {"0": "node1", "1": "node2", "2": "node3"}


@pytest.mark.sandbox
@pytest.mark.slow
def test_every_task_has_its_nodes_own_address(slurm3):
    out = _lines(slurm3.slurm("srun", "-N3", "-l", "ip", "-4", "-o", "addr", "show", "eth0"))
    addrs = {task: re.search(r"inet ([0-9.]+)/", line).group(1) for task, line in out.items()}
    assert addrs == {"0": slurm3.nodes["node1"], "1": slurm3.nodes["node2"],
                     "2": slurm3.nodes["node3"]}


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_task_resolves_every_nodes_slurm_name_and_the_machines_hosts_stay_as_they_were(slurm3):
    """TorchX's dist.ddp on Slurm gives torchrun rank 0's node by its Slurm name
    (SLURM_JOB_NODELIST_HET_GROUP_0): without the names resolving, every rank waits on a
    rendezvous at a host that is not found (tried: torchx 0.7.0 on this sandbox)."""
    before = Path("/etc/hosts").read_bytes()
    out = _lines(slurm3.slurm("srun", "-N3", "-l", "getent", "hosts", "node1"))
    assert {task: line.split() for task, line in out.items()} == \
        {str(i): [slurm3.nodes["node1"], "node1"] for i in range(3)}
    out = _lines(slurm3.slurm("srun", "-N1", "-w", "node1", "-l", "getent", "hosts", "node3"))
    assert out["0"].split() == [slurm3.nodes["node3"], "node3"]
    assert Path("/etc/hosts").read_bytes() == before     # the binding stayed in slurmd's namespace


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_step_uses_its_own_nodes_docker_engine(slurm3):
    # --export=PATH: the task gets DOCKER_HOST from the TaskProlog alone, not from here
    out = _lines(slurm3.slurm("srun", "-N3", "-l", "--export=PATH", "docker", "info",
                              "--format", "{{.ID}}", DOCKER_HOST="unix:///nonexistent.sock"))
    want = {str(i): slurm3.node_docker(f"node{i + 1}", "info", "--format", "{{.ID}}").stdout.strip()
            for i in range(3)}
    assert out == want
    assert len(set(want.values())) == 3


@pytest.mark.sandbox
@pytest.mark.slow
def test_sbatch_then_scancel_ends_the_job_and_its_steps_within_seconds(slurm3):
    marker = f"slurm3-sleep-{time.monotonic_ns()}"
    job = slurm3.slurm("sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap",
                       f"srun bash -c 'exec -a {marker} sleep 300'", check=True).stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(_pids(marker)) < 2:
        time.sleep(0.2)
    assert len(_pids(marker)) == 2, slurm3.slurm("squeue").stdout
    started = time.monotonic()
    slurm3.slurm("scancel", job, check=True)
    while time.monotonic() - started < 10 and (_pids(marker) or _job_listed(slurm3, job)):
        time.sleep(0.1)
    assert not _pids(marker), "a step of the cancelled job is still running"
    assert not _job_listed(slurm3, job)
    assert time.monotonic() - started < 10
    steps = slurm3.slurm("squeue", "-h", "-s", "-j", job, "-o", "%i %T").stdout.strip()
    assert steps == "", f"steps left: {steps}"


def _pids(marker: str) -> list[int]:
    """Processes whose command line starts with ``marker`` (exec -a renames sleep)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().startswith(marker.encode()):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def _job_listed(slurm3, job: str) -> bool:
    """True while the job is pending, running or completing (squeue -j shows ended ones too)."""
    state = slurm3.slurm("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
    return state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


@pytest.mark.sandbox
@pytest.mark.slow
def test_status_reports_slurm_and_each_nodes_state(slurm3):
    (st,) = sandbox.status(slurm3.name)
    assert st.slurm_conf == slurm3.slurm_conf and st.slurm_running
    assert {n.name: n.slurm_state for n in st.nodes} == dict.fromkeys(slurm3.nodes, "idle")
    result = runner.invoke(app, ["sandbox", "status", "--name", slurm3.name])
    assert result.exit_code == 0, result.output
    assert "Slurm running" in result.output and "idle" in result.output


# --------------------------------------------------------------------------- life cycle

# A sandbox of its own (taking it down must not disturb slurm3): the third /24 after the
# test subnet (the first is test_sandbox's life-cycle sandbox, the second slurm3's).
LIFE_NAME = TEST_NAME[:7] + ("k" if TEST_NAME[:7] + "k" != TEST_NAME else "j")
_net = ipaddress.IPv4Network(TEST_SUBNET)
LIFE_SUBNET = str(ipaddress.IPv4Network(
    f"{_net.network_address + 3 * _net.num_addresses}/{_net.prefixlen}"))


def _daemon_pids(name: str) -> list[int]:
    return sorted(sandbox.processes_using(sandbox.state_base() / name / "slurm"))


@pytest.mark.sandbox
@pytest.mark.slow
def test_up_slurm_adds_to_a_running_sandbox_and_down_removes_all_even_after_a_crash(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root")
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("slurm-wlm and munge are not installed")
    inventory = str(tmp_path / "life.yaml")
    sandbox.down(LIFE_NAME)
    try:
        sb = sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=inventory)
        assert sb.slurm_conf is None and _daemon_pids(LIFE_NAME) == []

        # added to the running sandbox; the CLI prints what a user needs
        result = runner.invoke(app, ["sandbox", "up", "--nodes", "1", "--name", LIFE_NAME,
                                     "--subnet", LIFE_SUBNET, "--inventory", inventory, "--slurm"])
        assert result.exit_code == 0, result.output
        sb = sandbox.load(LIFE_NAME)
        assert f"export SLURM_CONF={sb.slurm_conf}" in result.output
        assert "partition sandbox" in result.output
        env = {**os.environ, "SLURM_CONF": sb.slurm_conf}
        hostname = subprocess.run(["srun", "-N1", "hostname"], capture_output=True, text=True,
                                  env=env, timeout=60)
        assert hostname.stdout.strip() == "node1", hostname.stderr
        pids = _daemon_pids(LIFE_NAME)
        assert len(pids) >= 3  # munged, slurmctld, slurmd

        # idempotent, and a later `up` without --slurm keeps it
        assert sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=inventory,
                          with_slurm=True).slurm_conf == sb.slurm_conf
        assert sandbox.up(1, name=LIFE_NAME, subnet=LIFE_SUBNET,
                          inventory_path=inventory).slurm_conf == sb.slurm_conf
        assert _daemon_pids(LIFE_NAME) == pids

        # grown: the new node joins (the Slurm cluster restarts with the new conf)
        sandbox.up(2, name=LIFE_NAME, subnet=LIFE_SUBNET, inventory_path=inventory)
        hostnames = subprocess.run(["srun", "-N2", "hostname"], capture_output=True, text=True,
                                   env=env, timeout=60)
        assert sorted(hostnames.stdout.split()) == ["node1", "node2"], hostnames.stderr

        # a crash: a job step running, pidfiles and the state file lost
        marker = f"life-sleep-{time.monotonic_ns()}"
        subprocess.run(["sbatch", "--output=/dev/null", "--wrap",
                        f"srun bash -c 'exec -a {marker} sleep 300'"],
                       check=True, capture_output=True, env=env, timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _pids(marker):
            time.sleep(0.2)
        assert _pids(marker)
        slurm_dir = Path(sb.slurm_conf).parent
        for pidfile in slurm_dir.rglob("*.pid"):
            pidfile.unlink()
        (sb.dir / "sandbox.json").unlink()
    finally:
        assert sandbox.down(LIFE_NAME)
    assert _daemon_pids(LIFE_NAME) == [] and not _pids(marker)
    assert not (sandbox.state_base() / LIFE_NAME).exists()
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(sandbox.state_base() / LIFE_NAME) not in left
    assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                            text=True).stdout.split() if LIFE_NAME in ns]


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_node_that_does_not_register_is_named_after_the_timeout(slurm3):
    """A fourth node the controller was never told of stays unregistered: the wait says so."""
    sb = sandbox.load(slurm3.name)
    bigger = dataclasses.replace(sb, node_count=4)
    with pytest.raises(NodeError) as e:
        slurm._wait_idle(bigger, timeout=1.0)
    assert e.value.node == "node4"
    assert "did not come up within 1s" in e.value.message
    assert "node4 is not registered" in e.value.message and "slurmd.log" in e.value.message
