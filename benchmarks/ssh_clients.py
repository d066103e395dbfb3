"""Benchmark: what one node's SSH costs the head, by SSH client (issue 24: measure before
choosing how a launch reaches many nodes).

Prints, on a sandbox of real emulated nodes (own sshd each; the nodes share this
machine's cores), the CPU seconds THIS machine spends per node to log in and run
``--commands`` commands (3 by default: a launch's preflight and start channels), all
nodes at once, for four clients alternated in the same run:

* ``clusterctl``: clusterctl's own transport (:class:`~clusterctl.cluster.transport.Cluster`:
  Fabric + paramiko, strict host keys), one connection per node and one channel per command;
* ``paramiko``: a bare ``paramiko.SSHClient`` doing the same (no Fabric, no checks beyond
  the host key): the floor of the library clusterctl uses;
* ``openssh``: OpenSSH's client with connection multiplexing, its own defaults: one master
  (``ssh -M -N``) per node, each command a new ``ssh`` process through its ControlPath,
  then ``-O exit``;
* ``openssh-kex``: the same with ``KexAlgorithms`` set as the tree's node-to-node hops set
  it (:data:`clusterctl.cluster.transport.hopssh.HOP_KEX`: the defaults without sntrup761).

Head CPU is this process's own (all threads) plus its children's (the ``ssh`` processes,
from ``getrusage(RUSAGE_CHILDREN)``), over the span of the logins and commands; none of
the nodes' sshd.  OpenSSH's commands start once their master's socket exists, which this
process polls every 2 ms (under 1 ms of CPU per node, counted against OpenSSH).  Nothing here is bandwidth-bound, so the links are not shaped.

Run as root (the sandbox creates network namespaces and daemons):

    sudo make bench-ssh        # or: sudo .venv/bin/python benchmarks/ssh_clients.py
        [--nodes 1,8,16,32] [--repeat 3] [--commands 3] [--json FILE] [--plot FILE.png]

It creates its own sandbox (name "bssh", 10.213.67.0/24; change with --name/--subnet) and
removes it at the end, also on failure or Ctrl-C.  Bad input (--repeat or --commands
below 1, bad --nodes, a malformed --name or --subnet, an output in a directory that does
not exist, not root, no ``ssh`` client) is one message saying what is valid and exit
status 2, before the sandbox is made.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import yaml

from clusterctl.cluster import sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.cluster.transport.hopssh import HOP_KEX
from clusterctl.core.tools import require_binaries

if __package__:                 # imported as benchmarks.ssh_clients (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

CLIENTS = ("clusterctl", "paramiko", "openssh", "openssh-kex")


def head_cpu() -> float:
    """CPU seconds of this process (every thread) and of its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Nodes:
    """What every client needs of the sandbox: each node's address, the key, known_hosts."""

    def __init__(self, inventory_path: Path) -> None:
        self.inventory_path = inventory_path
        data = yaml.safe_load(inventory_path.read_text())
        self.hosts = [n["host"] for n in data["nodes"]]
        self.key = str(data["defaults"]["identity_file"])
        self.known_hosts = str(data["ssh"]["known_hosts"])
        self.user = data["defaults"].get("user", "root")


def via_clusterctl(nodes: Nodes, n: int, commands: int, tmp: Path) -> None:
    data = yaml.safe_load(nodes.inventory_path.read_text())
    data["nodes"] = data["nodes"][:n]
    path = tmp / f"inventory-{n}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with Cluster(load_inventory(path)) as cluster:
        cluster.map(lambda conn: [conn.run(["true"], check=True) for _ in range(commands)])


def via_paramiko(nodes: Nodes, n: int, commands: int, tmp: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(nodes.key)

    def one(host: str) -> None:
        client = paramiko.SSHClient()
        client.load_host_keys(nodes.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(host, username=nodes.user, pkey=key, look_for_keys=False, allow_agent=False,
                       timeout=30)
        try:
            for _ in range(commands):
                chan = client.get_transport().open_session()
                chan.exec_command("true")
                if chan.recv_exit_status() != 0:
                    raise RuntimeError(f"{host}: true failed")
                chan.close()
        finally:
            client.close()
    _each(one, nodes.hosts[:n])


def openssh(kex: str | None) -> Callable[[Nodes, int, int, Path], None]:
    def via_openssh(nodes: Nodes, n: int, commands: int, tmp: Path) -> None:
        base = ["ssh", "-F", "/dev/null", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={nodes.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "IdentitiesOnly=yes", "-i", nodes.key, "-o", "LogLevel=ERROR",
                *(["-o", f"KexAlgorithms={kex}"] if kex else []), "-l", nodes.user]

        def one(host: str) -> None:
            sock = tmp / f"m.{secrets.token_hex(6)}"   # a path of its own: never another's socket
            ctl = [*base, "-o", f"ControlPath={sock}"]
            master = subprocess.Popen([*ctl, "-M", "-N", host], stdin=subprocess.DEVNULL)
            try:
                wait_for_socket(sock, master, host)
                for _ in range(commands):
                    r = subprocess.run([*ctl, "-o", "ControlMaster=no", host, "true"],
                                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
                    if r.returncode != 0:
                        raise RuntimeError(f"{host}: {r.stderr.decode(errors='replace').strip()}")
                subprocess.run([*ctl, "-O", "exit", host], capture_output=True, timeout=30)
            finally:
                try:
                    master.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    master.kill()
                    master.wait()
        _each(one, nodes.hosts[:n])
    return via_openssh


def wait_for_socket(sock: Path, master: subprocess.Popen, host: str, timeout: float = 60) -> None:
    """Until the master's ControlPath exists (it binds it once logged in): a command sent
    before then would log in on its own, which is not what multiplexing costs."""
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if master.poll() is not None:
            raise RuntimeError(f"{host}: the ssh master exited {master.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host}: the ssh master was not ready after {timeout:g} s")
        time.sleep(0.002)


WAYS: dict[str, Callable[[Nodes, int, int, Path], None]] = {
    "clusterctl": via_clusterctl, "paramiko": via_paramiko,
    "openssh": openssh(None), "openssh-kex": openssh(HOP_KEX)}


def _each(fn, items) -> None:
    """fn over items, all at once (as a launch reaches its nodes); the first failure raised."""
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        for f in [pool.submit(fn, item) for item in items]:
            f.result()


def measure(client: str, nodes: Nodes, n: int, commands: int, tmp: Path) -> tuple[float, float]:
    """(head CPU s, wall s) of one round: ``n`` nodes, each a login and ``commands`` commands."""
    c0, t0 = head_cpu(), time.monotonic()
    WAYS[client](nodes, n, commands, tmp)
    return head_cpu() - c0, time.monotonic() - t0


def rows_for(results: dict[tuple[int, str], list[tuple[float, float]]]) -> list[dict]:
    """Medians per (nodes, client), with the CPU per node and the ratio to clusterctl's."""
    rows = []
    for (n, client), runs in sorted(results.items(), key=lambda kv: (kv[0][0], CLIENTS.index(kv[0][1]))):
        cpu = statistics.median(r[0] for r in runs)
        rows.append({"nodes": n, "client": client, "cpu": round(cpu, 4),
                     "cpu_per_node_ms": round(cpu / n * 1000, 2),
                     "wall": round(statistics.median(r[1] for r in runs), 4),
                     "each_run": [round(r[0], 4) for r in runs]})
    base = {r["nodes"]: r["cpu"] for r in rows if r["client"] == "clusterctl"}
    for r in rows:
        if base.get(r["nodes"]):
            r["over_clusterctl"] = round(r["cpu"] / base[r["nodes"]], 2)
    return rows


def versions() -> dict:
    r = subprocess.run(["ssh", "-V"], capture_output=True, text=True)
    return {"openssh": (r.stderr or r.stdout).strip().split(",")[0], "paramiko": paramiko.__version__}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=benchplot.node_counts("1,8,16,32"), default=[1, 8, 16, 32],
                    help="node counts (default 1,8,16,32)")
    ap.add_argument("--repeat", type=benchplot.positive_int, default=3, help="rounds per figure and client")
    ap.add_argument("--commands", type=benchplot.positive_int, default=3,
                    help="commands per node after its login (default 3: a launch's channels)")
    ap.add_argument("--name", default="bssh", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.67.0/24", help="sandbox subnet")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the rows and conditions as JSON")
    ap.add_argument("--plot", default=None, metavar="FILE.png", help="draw head CPU per node against nodes")
    return ap


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before the sandbox exists (exit 2)."""
    sandbox.check_name(args.name)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/ssh_clients.py")
    require_binaries("ssh", packages="openssh-client")


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ssh-"))
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    loads = benchplot.Loads()
    try:
        print(f"sandbox {args.name}: {max(args.nodes)} nodes, sharing this machine's "
              f"{os.cpu_count()} cores ...", flush=True)
        sb = sandbox.up(max(args.nodes), name=args.name, subnet=args.subnet,
                        inventory_path=tmp / "all.yaml")
        nodes = Nodes(Path(sb.inventory_path))
        for client in CLIENTS:          # not counted: every node's first login of each client
            measure(client, nodes, max(args.nodes), 1, tmp)
        print(f"\nhead CPU per node: a login and {args.commands} commands, all nodes at once; "
              f"median of {args.repeat}, clients alternated")
        print(f"{'nodes':>5} " + " ".join(f"{c:>22}" for c in CLIENTS))
        for n in args.nodes:
            for _ in range(args.repeat):
                for client in CLIENTS:
                    results.setdefault((n, client), []).append(measure(client, nodes, n, args.commands, tmp))
            loads.sample()
            mine = {r["client"]: r for r in rows_for(results) if r["nodes"] == n}
            print(f"{n:>5} " + " ".join(
                f"{mine[c]['cpu_per_node_ms']:7.2f} ms ({mine[c].get('over_clusterctl', 0):4.2f}x) {mine[c]['wall']:4.2f}s"
                for c in CLIENTS), flush=True)
        print("\n(ms of head CPU per node, (x clusterctl's), wall s of the round)")
    finally:
        if results and (args.json or args.plot):
            doc = benchplot.document("ssh_clients", benchplot.command_line(), {
                **benchplot.conditions(loads), "repeat": args.repeat, "commands": args.commands,
                **versions()}, rows=rows_for(results))
            benchplot.save(doc, args.json, args.plot)
        sandbox.down(args.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
