"""Node-to-node reachability (``clusterctl check --network``): can every node open the
connections a run makes between nodes, and which pair cannot?

The connections (docs/how-to/network.md lists every one, per feature):

* ``ssh``: each node to each other node's SSH port: the push relay and the tree log in from
  node to node;
* ``rendezvous``: each node to the master's ``master_port`` (MASTER_PORT: torchrun's c10d
  store, ``init_process_group``'s TCP store);
* ``collective``: each node to each other node on a port the kernel picks (gloo and NCCL
  listen on such ports and every rank connects to the others').

Three steps, each one SSH command per node: every node starts the listeners
(``scripts/net-listen.sh``: a port the kernel picks, and on the master the rendezvous port,
for the check's duration only, in the background), then every node connects to its targets
at once, each connect bounded by a timeout (``scripts/net-connect.sh``), then the listeners
are stopped (by their pid, which the first step printed).  Nothing is written on a node.
:func:`plan_probes` (which pairs; all of them up to :data:`ALL_PAIRS_UP_TO` nodes, then each
node to its next :data:`RING_PEERS` in the inventory's order, so every node is a source and a
destination) and :func:`read_connect` / :func:`findings` are pure.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.cluster import sshconfig
from clusterctl.core.errors import NodeError
from clusterctl.core.scripts import script_text
from clusterctl.core.text import digits

if TYPE_CHECKING:
    from clusterctl.cluster.transport import Cluster, NodeConnection

LISTEN = script_text("clusterctl.cluster", "net-listen.sh")
CONNECT = script_text("clusterctl.cluster", "net-connect.sh")

#: every ordered pair is probed up to this many nodes; above, each node its next RING_PEERS
ALL_PAIRS_UP_TO = 64
RING_PEERS = 16

#: what each kind of connection is for, in the finding's words
WHAT = {
    "ssh": "SSH between nodes (the push relay and the tree)",
    "rendezvous": "the rendezvous port (MASTER_PORT: every node to the master)",
    "collective": "the collective's own ports (gloo/NCCL: a port the kernel picks on each node)",
}


@dataclass(frozen=True)
class Endpoint:
    """A node as the others reach it."""

    name: str
    address: str
    ssh_port: int


@dataclass(frozen=True)
class Probe:
    src: str
    dst: str
    address: str
    port: int | None        # None: the destination's collective listener (known after it starts)
    kind: str               # ssh, rendezvous or collective


@dataclass(frozen=True)
class Blocked:
    src: str
    dst: str
    port: int
    why: str                # timeout, refused, unreachable, ...
    kind: str

    @property
    def message(self) -> str:
        return f"{self.src} -> {self.dst}:{self.port} blocked ({self.why}): {WHAT[self.kind]}"


def peers(names: Sequence[str], src: str) -> list[str]:
    """The nodes ``src`` probes: every other one up to :data:`ALL_PAIRS_UP_TO` nodes, else its
    next :data:`RING_PEERS` in order (wrapping), so each node is probed by as many (pure)."""
    others = [n for n in names if n != src]
    if len(names) <= ALL_PAIRS_UP_TO:
        return others
    i = list(names).index(src)
    return [names[(i + k) % len(names)] for k in range(1, RING_PEERS + 1)]


def plan_probes(nodes: Sequence[Endpoint], master: str, master_port: int | None) -> list[Probe]:
    """Every connection to try, in order: per source node its peers' SSH, the master's
    rendezvous port (from every other node), its peers' collective listeners (pure)."""
    by_name = {n.name: n for n in nodes}
    names = [n.name for n in nodes]
    out: list[Probe] = []
    for src in names:
        targets = peers(names, src)
        out += [Probe(src, d, by_name[d].address, by_name[d].ssh_port, "ssh") for d in targets]
        if master_port is not None and src != master:
            out.append(Probe(src, master, by_name[master].address, master_port, "rendezvous"))
        out += [Probe(src, d, by_name[d].address, None, "collective") for d in targets]
    return out


def read_listen(marker: str, stdout: str) -> tuple[int, str, int] | None:
    """net-listen.sh's line -> (collective port, rendezvous "PORT"/"busy"/"-", pid); None when
    it printed none."""
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == marker and parts[1] == "ports" and digits(parts[2]) \
                and digits(parts[4]):
            return int(parts[2]), parts[3], int(parts[4])
    return None


def read_connect(marker: str, stdout: str, count: int) -> dict[int, str]:
    """net-connect.sh's lines -> {target index: "ok" or why it was blocked} (pure)."""
    found: dict[int, str] = {}
    for line in stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] == marker and digits(parts[1]) and int(parts[1]) < count:
            found[int(parts[1])] = "ok" if parts[2] == "ok" else (parts[3] if len(parts) > 3 else "?")
    return found


def _address(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@dataclass
class NetResult:
    blocked: list[Blocked]
    problems: dict[str, list[str]]        # node -> why it could not take part (no python3, ...)
    probes: int


def check_network(cluster: Cluster, endpoints: Sequence[Endpoint], *, master_port: int | None,
                  timeout: float = 3.0) -> NetResult:
    """Run the three steps on every node of ``endpoints`` (the first is the master)."""
    marker = "clusterctl-net-" + uuid.uuid4().hex[:12]
    names = [e.name for e in endpoints]
    master = names[0]
    probes = plan_probes(endpoints, master, master_port)
    per_src: dict[str, list[Probe]] = {}
    for p in probes:
        per_src.setdefault(p.src, []).append(p)
    longest = max((len(v) for v in per_src.values()), default=0)
    life = 30 + timeout * (2 + longest // 32)
    problems: dict[str, list[str]] = {}

    def listen(conn: NodeConnection):
        args = [marker, f"{life:g}"] + ([str(master_port)] if master_port and conn.name == master else [])
        r = conn.run(["sh", "-c", LISTEN, "sh", *args], timeout=30)
        found = read_listen(marker, r.stdout)
        if found is None:
            raise NodeError(conn.name, "network check: cannot start a listener: "
                            + ((r.stdout + r.stderr).strip().splitlines() or [f"exit {r.exit_code}"])[-1])
        return found

    listening = cluster.map(listen, names)
    ports: dict[str, int] = {}
    pids: dict[str, int] = {}
    for name, found in listening.items():
        if isinstance(found, NodeError):
            problems.setdefault(name, []).append(found.reason)
        else:
            ports[name], _, pids[name] = found
    try:
        def connect(conn: NodeConnection):
            mine = [p for p in per_src.get(conn.name, []) if p.port is not None or p.dst in ports]
            targets = [f"{_address(p.address)}:{p.port if p.port is not None else ports[p.dst]}"
                       for p in mine]
            if not targets:
                return mine, {}
            r = conn.run(["sh", "-c", CONNECT, "sh", marker, f"{timeout:g}", *targets],
                         timeout=timeout * (2 + len(targets) // 32) + 30)
            if r.exit_code == 127:
                raise NodeError(conn.name, "network check: no python3 on the node")
            return mine, read_connect(marker, r.stdout, len(targets))

        ran = cluster.map(connect, [n for n in names if n in ports])
    finally:
        stop = {n: p for n, p in pids.items()}
        if stop:
            cluster.map(lambda conn: conn.run(["sh", "-c", _STOP, "sh", str(stop[conn.name]), marker],
                                              timeout=30), list(stop))
    blocked: list[Blocked] = []
    for name, outcome in ran.items():
        if isinstance(outcome, NodeError):
            problems.setdefault(name, []).append(outcome.reason)
            continue
        mine, found = outcome
        blocked += findings(mine, found, ports)
    return NetResult(blocked, problems, len(probes))


#: Stop the listener $1 only when it is ours ($2 in its command line): a pid may be reused.
_STOP = ('cmd=$(tr "\\000" " " < "/proc/$1/cmdline" 2>/dev/null) || exit 0; '
         'case $cmd in *"$2"*) kill "$1";; esac; exit 0')


def findings(probes: Sequence[Probe], outcome: Mapping[int, str], ports: Mapping[str, int]) -> list[Blocked]:
    """The blocked connections among ``probes`` (``outcome``: read_connect's, by index; a probe
    with no answer is blocked "no answer") (pure)."""
    out = []
    for i, p in enumerate(probes):
        result = outcome.get(i, "no answer")
        if result != "ok":
            out.append(Blocked(p.src, p.dst, p.port if p.port is not None else ports.get(p.dst, 0),
                               result, p.kind))
    return out


def check_nodes(cluster: Cluster, checks: Sequence, *, timeout: float = 3.0) -> NetResult:
    """:func:`check_network` on the nodes preflight reached (``checks``: its NodeChecks, the
    master first), each address as launch gives it to the others (the ssh-config
    ``HostName``); each blocked pair becomes a problem of its source node, each node that
    could not take part a problem of its own."""
    reached = {c.node for c in checks if c.ssh}
    nodes = [n for n in cluster.inventory.nodes if n.name in reached]
    resolved = sshconfig.resolve_hosts(n.host for n in nodes)
    endpoints = [Endpoint(n.name, resolved[n.host], n.port) for n in nodes]
    master = cluster.inventory.nodes[0].name
    if len(endpoints) < 2:
        return NetResult([], {}, 0)
    result = check_network(cluster, endpoints, timeout=timeout,
                           master_port=cluster.inventory.master_port if endpoints[0].name == master else None)
    by_node = {c.node: c for c in checks}
    for b in result.blocked:
        by_node[b.src].problems.append(b.message)
    for name, reasons in result.problems.items():
        by_node[name].problems.extend(reasons)
    return result
