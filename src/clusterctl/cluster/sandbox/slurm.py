"""A real Slurm cluster on a sandbox: munged and slurmctld on the head, one slurmd per node.

Recipe and traps: FIELD-NOTES.md §4 "A real Slurm cluster whose nodes are network
namespaces".  Debian's slurm-wlm and munge packages; one private munged (its own
key and socket: the namespaces share the file system) serves every daemon and
client; an own slurm.conf under ``<sandbox dir>/slurm/`` with ports derived from
the subnet, so two sandboxes' controllers (both in the root namespace, listening on
all addresses) never collide.  Each slurmd runs in its node's netns AND its own UTS
namespace (``hostname nodeX``), started with ``nsenter --net=...`` (``ip netns exec``
remounts /sys, and slurmd then finds no cgroups), and its own mount namespace (slave
propagation: the machine's mounts still reach it, its own reach nothing) in which the
sandbox's ``hosts`` file is bound over /etc/hosts: a job resolves ``node1``... to the
nodes' addresses, as on a real cluster (TorchX's and torchrun's rendezvous name rank 0's
node by its Slurm name), while the machine's /etc/hosts stays as it is and two sandboxes'
``node1`` never collide.  slurmd's own environment does not
reach job steps: a TaskProlog prints ``export DOCKER_HOST=...`` so that a task uses
its node's own Docker engine.  No accounting: no sacct.

Everything lives under one directory, and every daemon names it on its command
line, so ``stop`` finds them by pidfile and, after a crash, by that path.

Contract: :data:`PARTITION`, :func:`ports`, :func:`render_conf` and
:func:`render_task_prolog`, :func:`render_hosts` (pure), :func:`start` (idempotent), :func:`stop`,
:func:`cancel_jobs`,
:func:`node_states`, :func:`running`, :func:`require_slurm`.
Imports the model and processes of the sandbox package.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

from clusterctl.cluster import dockerd
from clusterctl.cluster.sandbox.model import Sandbox, SandboxNode, state_base
from clusterctl.cluster.sandbox.processes import (
    in_netns,
    processes_using,
    run,
    stop_pid,
    terminate,
)
from clusterctl.core.errors import EnvironmentProblem, NodeError
from clusterctl.core.tools import require_binaries

PARTITION = "sandbox"
PORT_BASE = 12000  # below Linux's ephemeral range (32768-60999): 12000 + 2 * (0..9999)

# binary -> Debian package that provides it (`apt-get install slurm-wlm munge`)
_TOOLS = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sinfo": "slurm-wlm",
    "scontrol": "slurm-wlm",
    "srun": "slurm-wlm",
}


def require_slurm() -> None:
    """EnvironmentProblem naming every missing Slurm/munge program and its package."""
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        require_binaries(*missing, packages=" ".join(sorted({_TOOLS[t] for t in missing})))


# --------------------------------------------------------------------------- paths


def _dir(name: str) -> Path:
    return state_base() / name / "slurm"


class _Paths:
    """The files of a sandbox's Slurm, all under ``<sandbox dir>/slurm/``."""

    def __init__(self, name: str) -> None:
        self.dir = _dir(name)
        self.conf = self.dir / "slurm.conf"
        self.task_prolog = self.dir / "task_prolog"
        self.hosts = self.dir / "hosts"
        self.munge_dir = self.dir / "munge"
        self.munge_key = self.munge_dir / "munge.key"
        self.munge_socket = self.munge_dir / "munge.sock"
        self.munged_pid = self.munge_dir / "munged.pid"
        self.munged_log = self.munge_dir / "munged.log"
        self.ctld_dir = self.dir / "ctld"
        self.ctld_pid = self.ctld_dir / "slurmctld.pid"
        self.ctld_log = self.ctld_dir / "slurmctld.log"
        self.spool = self.dir / "spool"

    def node_dir(self, node: str) -> Path:
        return self.spool / node

    def slurmd_pid(self, node: str) -> Path:
        return self.node_dir(node) / "slurmd.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.node_dir(node) / "slurmd.log"


# --------------------------------------------------------------------------- rendering (pure)


def ports(subnet: str) -> tuple[int, int]:
    """(SlurmctldPort, SlurmdPort) derived from the subnet: distinct for sandboxes whose
    /24s differ (sandboxes on one machine never share a subnet)."""
    net = ipaddress.IPv4Network(subnet)
    k = (int(net.network_address) >> 8) % 10000
    return PORT_BASE + 2 * k, PORT_BASE + 2 * k + 1


def render_conf(sb: Sandbox, hostname: str) -> str:
    """The sandbox's slurm.conf (pure: the sandbox, this machine's hostname -> text)."""
    p = _Paths(sb.name)
    ctld_port, slurmd_port = ports(sb.subnet)
    lines = [
        f"# slurm.conf of sandbox {sb.name}, written by `clusterctl sandbox up --slurm`.",
        "# Every daemon and client reads it through SLURM_CONF; `sandbox down` removes it.",
        f"ClusterName=cc{sb.name}",
        f"SlurmctldHost={hostname}({sb.head_ip})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={p.munge_socket}",
        f"StateSaveLocation={p.ctld_dir}",
        f"SlurmctldPidFile={p.ctld_pid}",
        f"SlurmctldLogFile={p.ctld_log}",
        f"SlurmdSpoolDir={p.spool}/%n",
        f"SlurmdPidFile={p.spool}/%n/slurmd.pid",
        f"SlurmdLogFile={p.spool}/%n/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        f"TaskProlog={p.task_prolog}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "ReturnToService=2",
        "KillWait=30",   # Slurm's default: TERM, then KILL 30 s later
        "MailProg=/bin/true",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "# one slurmd per sandbox node, in the node's network namespace",
    ]
    lines += [f"NodeName={n.name} NodeAddr={n.ip} CPUs=1 State=UNKNOWN" for n in sb.nodes]
    lines.append(f"PartitionName={PARTITION} Nodes={_node_range(sb.nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _node_range(nodes: list[SandboxNode]) -> str:
    return ",".join(n.name for n in nodes)


def render_task_prolog(sb: Sandbox) -> str:
    """The TaskProlog: each task's DOCKER_HOST is its own node's engine (slurmd's environment
    does not reach job steps).  Sockets are the nodes' (model: node dir / docker.sock).  On a
    Podman sandbox also the node's Podman configuration (its storage), as its sshd gives it:
    without it a task's ``podman`` is the machine's default one, which holds no pushed image."""
    lines = [
        "#!/bin/sh",
        f"# TaskProlog of sandbox {sb.name}: a task uses its node's own Docker engine"
        + (" and Podman." if sb.runtime == "podman" else "."),
        'case "$SLURMD_NODENAME" in',
    ]
    for n in sb.nodes:
        env = {"DOCKER_HOST": n.docker_host, **(n.podman_env if sb.runtime == "podman" else {})}
        echoes = "; ".join(f"echo {shlex.quote(f'export {k}={v}')}" for k, v in env.items())
        lines.append(f"  {n.name}) {echoes} ;;")
    lines += ["esac", ""]
    return "\n".join(lines)


def render_hosts(sb: Sandbox, machine_hosts: str) -> str:
    """The /etc/hosts a job on the sandbox's Slurm sees (pure): each node's Slurm name at its
    address, then the machine's own lines (the first match wins, so a name the machine also
    maps resolves to the sandbox's node)."""
    own = [f"{n.ip}\t{n.name}" for n in sb.nodes]
    return "\n".join([f"# /etc/hosts of sandbox {sb.name}'s Slurm jobs (`clusterctl sandbox up --slurm`)",
                      *own, "# this machine's /etc/hosts:", machine_hosts.rstrip("\n"), ""])


# --------------------------------------------------------------------------- processes


def _env(p: _Paths) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(p.conf)}


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True, env=env)


def _tail(path: Path, n: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _wait_pidfile(proc: subprocess.Popen, pidfile: Path, what: str, log: Path,
                  timeout: float = 20.0, node: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dockerd.read_pid(pidfile) is not None:
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    why = (f"exited with status {proc.returncode}" if proc.poll() is not None
           else f"wrote no pidfile {pidfile} within {timeout:.0f}s")
    msg = f"{what} {why}; last lines of {log}:\n{_tail(log)}"
    raise NodeError(node, msg) if node else EnvironmentProblem(msg)


def _ensure_munged(p: _Paths) -> None:
    p.munge_dir.mkdir(parents=True, exist_ok=True)
    p.munge_dir.chmod(0o755)  # munged: the socket's directory must be searchable by all
    if not p.munge_key.exists():
        run(["mungekey", "--create", f"--keyfile={p.munge_key}"])
    p.munge_key.chmod(0o600)
    if dockerd.read_pid(p.munged_pid) is not None and p.munge_socket.exists():
        return
    stop_pid(p.munged_pid)
    for f in (p.munge_socket, p.munge_socket.with_name(p.munge_socket.name + ".lock")):
        f.unlink(missing_ok=True)
    proc = _spawn(["munged", "-F", f"--key-file={p.munge_key}", f"--socket={p.munge_socket}",
                   f"--pid-file={p.munged_pid}", f"--log-file={p.munged_log}",
                   f"--seed-file={p.munge_dir / 'munged.seed'}"],
                  p.munge_dir / "munged.out", dict(os.environ))
    _wait_pidfile(proc, p.munged_pid, "munged", p.munged_log)
    deadline = time.monotonic() + 10
    while not p.munge_socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _ensure_ctld(p: _Paths) -> None:
    if dockerd.read_pid(p.ctld_pid) is not None:
        return
    p.ctld_dir.mkdir(parents=True, exist_ok=True)
    proc = _spawn(["slurmctld", "-D", "-f", str(p.conf)], p.ctld_dir / "slurmctld.out", _env(p))
    _wait_pidfile(proc, p.ctld_pid, "slurmctld", p.ctld_log)


def _ensure_slurmd(p: _Paths, node: SandboxNode) -> None:
    pid = dockerd.read_pid(p.slurmd_pid(node.name))
    if pid is not None and in_netns(pid, node.netns):
        return
    stop_pid(p.slurmd_pid(node.name))
    p.node_dir(node.name).mkdir(parents=True, exist_ok=True)
    # its own UTS namespace: `hostname` in a task says nodeX, as on a real cluster; its own
    # mount namespace: the sandbox's hosts file is the task's /etc/hosts
    script = f"mount --bind {shlex.quote(str(p.hosts))} /etc/hosts && " \
             f"hostname {shlex.quote(node.name)} && exec slurmd -D -N {shlex.quote(node.name)} " \
             f"-f {shlex.quote(str(p.conf))}"
    proc = _spawn(["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "--mount",
                   "--propagation", "slave", "sh", "-c", script],
                  p.node_dir(node.name) / "slurmd.out", _env(p))
    _wait_pidfile(proc, p.slurmd_pid(node.name), "slurmd", p.slurmd_log(node.name), node=node.name)


def node_states(name: str) -> dict[str, str]:
    """Slurm's state of each node (``idle``, ``alloc``, ``down*`` ...); {} when slurmctld does
    not answer."""
    p = _Paths(name)
    if not p.conf.exists() or shutil.which("sinfo") is None:
        return {}
    try:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                           env=_env(p), stdin=subprocess.DEVNULL, timeout=15)
    except subprocess.TimeoutExpired:
        return {}
    if r.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in r.stdout.splitlines() if len(line.split()) == 2)


def running(name: str) -> bool:
    """True when the sandbox's munged and slurmctld run."""
    p = _Paths(name)
    return dockerd.read_pid(p.munged_pid) is not None and dockerd.read_pid(p.ctld_pid) is not None


def _wait_idle(sb: Sandbox, timeout: float) -> None:
    p = _Paths(sb.name)
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(sb.name)
        if all(states.get(n.name) in ("idle", "mix", "alloc") for n in sb.nodes):
            return
        time.sleep(0.2)
    late = [n for n in sb.nodes if states.get(n.name) not in ("idle", "mix", "alloc")]
    n = late[0]
    said = ", ".join(f"{m.name} is {states.get(m.name, 'not registered')}" for m in late)
    raise NodeError(n.name, f"slurmd did not come up within {timeout:.0f}s (Slurm says: {said}); "
                            f"see {p.slurmd_log(n.name)} and {p.ctld_log}")


def start(sb: Sandbox, timeout: float = 60.0) -> None:
    """munged, slurmctld and every node's slurmd, then wait until every node is idle.

    Idempotent: running daemons are kept when the conf is unchanged; a changed conf
    (nodes added or removed) restarts the Slurm cluster (its jobs are lost)."""
    require_slurm()
    p = _Paths(sb.name)
    conf = render_conf(sb, socket.gethostname())
    if p.conf.exists() and p.conf.read_text() != conf:
        stop(sb.name, keep_key=True)
    p.dir.mkdir(parents=True, exist_ok=True)
    p.spool.mkdir(exist_ok=True)
    p.conf.write_text(conf)
    p.task_prolog.write_text(render_task_prolog(sb))
    p.task_prolog.chmod(0o755)
    try:
        machine_hosts = Path("/etc/hosts").read_text(errors="replace")
    except OSError:
        machine_hosts = ""
    p.hosts.write_text(render_hosts(sb, machine_hosts))
    p.hosts.chmod(0o644)
    _ensure_munged(p)
    _ensure_ctld(p)
    for node in sb.nodes:
        _ensure_slurmd(p, node)
    _wait_idle(sb, timeout)


def cancel_jobs(name: str) -> None:
    """Cancel every job of sandbox ``name``'s Slurm (nothing when its controller is down)."""
    _cancel_all(_Paths(name))


def _cancel_all(p: _Paths) -> None:
    """Cancel every job of this Slurm cluster while its controller still answers, so that no
    step outlives its slurmd (``down`` also kills what is left in each node's netns)."""
    if dockerd.read_pid(p.ctld_pid) is None or not all(map(shutil.which, ("squeue", "scancel"))):
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                              env=_env(p), stdin=subprocess.DEVNULL, timeout=10).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True, env=_env(p),
                           stdin=subprocess.DEVNULL, timeout=10)


def stop(name: str, keep_key: bool = False) -> bool:
    """Stop every Slurm daemon of sandbox ``name`` (job steps die with their node's netns, or
    here with slurmd) and remove its files; True when something was there."""
    p = _Paths(name)
    found = p.dir.exists()
    _cancel_all(p)
    pidfiles = sorted(p.spool.glob("*/slurmd.pid")) if p.spool.is_dir() else []
    for pidfile in [*pidfiles, p.ctld_pid, p.munged_pid]:
        found = stop_pid(pidfile, timeout=5.0) or found
    left = processes_using(p.dir)  # after a crash: pidfiles gone, daemons still naming the dir
    terminate(left, grace=3.0)
    found = found or bool(left)
    if keep_key:
        for child in p.dir.iterdir() if p.dir.is_dir() else []:
            if child != p.munge_dir:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        for child in p.munge_dir.iterdir() if p.munge_dir.is_dir() else []:
            if child != p.munge_key:
                child.unlink()
    else:
        shutil.rmtree(p.dir, ignore_errors=True)
    return found
