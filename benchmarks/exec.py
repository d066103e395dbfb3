"""Benchmark: a short command on every node, ``clusterctl exec`` against pdsh, ClusterShell
and a loop of ``ssh`` (issue 43: "at 16 and 32 nodes the head's cost stays flat").

Prints, on a sandbox of real emulated nodes (own sshd each; the nodes share this
machine's cores), the CPU seconds THIS machine spends and the wall time for one command
(``--command``, default ``uname -r``) on N nodes, each way started as the user types it
(a new process: its start-up counts), ways alternated in the same run:

* ``clusterctl``: ``clusterctl exec --nodes INV -- CMD``, one connection per node from the
  head, output folded as ``clush -b`` folds it;
* ``clusterctl-eager``: ``clusterctl exec`` as it started before the CLI loaded commands
  lazily: every command's module imported first (the previous design, measured in the
  same run);
* ``clusterctl-tree``: the same inventory with ``ssh.tree: true`` (the head reaches a few
  nodes, they reach the rest: :mod:`clusterctl.cluster.transport`);
* ``pdsh``: ``pdsh -R ssh -f 64 -w HOSTS CMD`` (Debian's pdsh: one OpenSSH client process
  per node, 64 at a time; the peer most sites use);
* ``clush``: ``clush -b -f 64 -w HOSTS CMD`` (Debian's clustershell: ``-b`` folds identical
  output, as ``clusterctl exec`` does);
* ``by-hand``: ``for h in HOSTS; do ssh $h CMD; done`` in bash: the way before any tool.

Every way uses the same key, known_hosts (strict) and user; pdsh, clush and the loop through
one ``ssh_config`` file. Head CPU is this process's children (``getrusage(RUSAGE_CHILDREN)``:
each way's process and its ``ssh`` children), over the span of one command; never the nodes'
sshd. Each way's output is checked: every node answered with the command's output.

Run as root (the sandbox creates network namespaces and daemons):

    sudo make bench-exec        # or: sudo .venv/bin/python benchmarks/exec.py
        [--nodes 1,8,16,32] [--repeat 3] [--command 'uname -r'] [--json FILE] [--plot FILE.png]

It creates its own sandbox (name "bexec", 10.213.69.0/24; change with --name/--subnet) and
removes it at the end, also on failure or Ctrl-C.  Bad input (--repeat below 1, bad
--nodes, a malformed --name or --subnet, an output in a directory that does not exist, not
root, pdsh, clush or ssh missing) is one message saying what is valid and exit status 2,
before the sandbox is made.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from clusterctl.cluster import sandbox
from clusterctl.core.tools import require_binaries

if __package__:                 # imported as benchmarks.exec (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

WAYS = ("clusterctl", "clusterctl-eager", "clusterctl-tree", "pdsh", "clush", "by-hand")
#: the previous design's start-up: every command module imported before the command runs
EAGER = ("import clusterctl.cli as c\n"
         "for m in dict.fromkeys(c.COMMANDS.values()):\n    c.registered(m)\n"
         "c.main()")
FANOUT = 64


def children_cpu() -> float:
    """CPU seconds of this process's waited-for children (each way's process tree)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


class Nodes:
    """The sandbox's nodes as each way needs them: inventories (direct, tree), an ssh_config."""

    def __init__(self, inventory_path: Path, tmp: Path) -> None:
        self.data = yaml.safe_load(inventory_path.read_text())
        self.hosts = [n["host"] for n in self.data["nodes"]]
        self.tmp = tmp
        self.config = tmp / "ssh_config"
        user = self.data["defaults"].get("user", "root")
        self.config.write_text(
            "Host *\n"
            f"  User {user}\n  IdentityFile {self.data['defaults']['identity_file']}\n"
            "  IdentitiesOnly yes\n  BatchMode yes\n  StrictHostKeyChecking yes\n"
            f"  UserKnownHostsFile {self.data['ssh']['known_hosts']}\n"
            "  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n")

    def inventory(self, n: int, tree: bool) -> Path:
        data = {**self.data, "nodes": self.data["nodes"][:n], "ssh": {**self.data["ssh"]}}
        if tree:
            data["ssh"]["tree"] = True
        path = self.tmp / f"inventory-{n}{'-tree' if tree else ''}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def argv_for(way: str, nodes: Nodes, n: int, command: str) -> tuple[list[str], dict[str, str]]:
    """The command line (and environment) a user of ``way`` types for ``n`` nodes."""
    hosts = nodes.hosts[:n]
    env = dict(os.environ)
    if way in ("clusterctl", "clusterctl-eager", "clusterctl-tree"):
        inv = nodes.inventory(n, tree=way == "clusterctl-tree")
        start = ["-c", EAGER] if way == "clusterctl-eager" else ["-m", "clusterctl"]
        return [sys.executable, *start, "exec", "--nodes", str(inv), "--", command], \
            benchplot.cli_env(env)
    if way == "pdsh":
        env.update(PDSH_RCMD_TYPE="ssh", PDSH_SSH_ARGS=f"-F {nodes.config} %h")
        return ["pdsh", "-f", str(FANOUT), "-w", ",".join(hosts), command], env
    if way == "clush":
        return ["clush", "-b", "-f", str(FANOUT), "-o", f"-F {nodes.config}", "-w", ",".join(hosts),
                command], env
    loop = "; ".join(f"ssh -F {shlex.quote(str(nodes.config))} {h} {shlex.quote(command)}" for h in hosts)
    return ["bash", "-c", loop], env


def measure(way: str, nodes: Nodes, n: int, command: str, expect: str) -> tuple[float, float]:
    """(head CPU s, wall s) of one command on ``n`` nodes by ``way``; RuntimeError when a node
    did not answer with ``expect``."""
    argv, env = argv_for(way, nodes, n, command)
    c0, t0 = children_cpu(), time.monotonic()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=600)
    wall, cpu = time.monotonic() - t0, children_cpu() - c0
    if r.returncode != 0 or not answered(way, r.stdout, n, expect):
        raise RuntimeError(f"{way} on {n} nodes: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return cpu, wall


def answered(way: str, out: str, n: int, expect: str) -> bool:
    """Whether ``out`` shows ``expect`` from every one of ``n`` nodes: once per node (pdsh,
    the loop), or once under a header naming all of them (clusterctl, clush -b)."""
    if way in ("pdsh", "by-hand"):
        return sum(1 for line in out.splitlines() if line.endswith(expect)) == n
    return expect in out and out.count(expect) == 1


def rows_for(results: dict[tuple[int, str], list[tuple[float, float]]]) -> list[dict]:
    """Medians per (nodes, way), CPU per node, and each over clusterctl's at the same count."""
    rows = []
    for (n, way), runs in sorted(results.items(), key=lambda kv: (kv[0][0], WAYS.index(kv[0][1]))):
        cpu = statistics.median(r[0] for r in runs)
        rows.append({"nodes": n, "way": way, "cpu": round(cpu, 4),
                     "cpu_per_node_ms": round(cpu / n * 1000, 2),
                     "wall": round(statistics.median(r[1] for r in runs), 4),
                     "each_run": [round(r[0], 4) for r in runs]})
    base = {r["nodes"]: r for r in rows if r["way"] == "clusterctl"}
    for r in rows:
        b = base.get(r["nodes"])
        if b and b["cpu"]:
            r["cpu_over_clusterctl"] = round(r["cpu"] / b["cpu"], 2)
        if b and b["wall"]:
            r["wall_over_clusterctl"] = round(r["wall"] / b["wall"], 2)
    return rows


def versions() -> dict:
    out = {}
    for name, argv in (("pdsh", ["pdsh", "-V"]), ("clush", ["clush", "--version"]), ("openssh", ["ssh", "-V"])):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            out[name] = (r.stdout + r.stderr).strip().splitlines()[0][:80]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            pass
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=benchplot.node_counts("1,8,16,32"), default=[1, 8, 16, 32],
                    help="node counts (default 1,8,16,32)")
    ap.add_argument("--repeat", type=benchplot.positive_int, default=3, help="rounds per figure and way")
    ap.add_argument("--command", default="uname -r", help="the command every node runs (default uname -r)")
    ap.add_argument("--name", default="bexec", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.69.0/24", help="sandbox subnet")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the rows and conditions as JSON")
    ap.add_argument("--plot", default=None, metavar="FILE.png", help="draw head CPU and wall against nodes")
    return ap


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before the sandbox exists (exit 2)."""
    sandbox.check_name(args.name)
    sandbox.parse_subnet(args.subnet, max(args.nodes))
    benchplot.check_outputs(args.json, args.plot)
    sandbox.require_environment("benchmarks/exec.py")
    require_binaries("ssh", packages="openssh-client")
    require_binaries("pdsh", packages="pdsh")
    require_binaries("clush", packages="clustershell")


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-exec-"))
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    loads = benchplot.Loads()
    expect = subprocess.run(["bash", "-c", args.command], capture_output=True, text=True).stdout.strip()
    try:
        print(f"sandbox {args.name}: {max(args.nodes)} nodes, sharing this machine's "
              f"{os.cpu_count()} cores ...", flush=True)
        sb = sandbox.up(max(args.nodes), name=args.name, subnet=args.subnet,
                        inventory_path=tmp / "all.yaml")
        nodes = Nodes(Path(sb.inventory_path), tmp)
        for way in WAYS:                # not counted: every node's first login of each way
            measure(way, nodes, max(args.nodes), args.command, expect)
        print(f"\n`{args.command}` on every node, a new process per way as typed; median of "
              f"{args.repeat}, ways alternated")
        print(f"{'nodes':>5} " + " ".join(f"{w:>26}" for w in WAYS))
        for n in args.nodes:
            for _ in range(args.repeat):
                for way in WAYS:
                    results.setdefault((n, way), []).append(measure(way, nodes, n, args.command, expect))
            loads.sample()
            mine = {r["way"]: r for r in rows_for(results) if r["nodes"] == n}
            print(f"{n:>5} " + " ".join(
                f"{mine[w]['cpu']:6.3f}s cpu {mine[w]['wall']:6.3f}s wall" for w in WAYS), flush=True)
        print("\n(head CPU s and wall s of one command on every node)")
        for r in rows_for(results):
            if r["way"] != "clusterctl":
                print(f"{r['nodes']:>3} nodes {r['way']:>16}: CPU x{r.get('cpu_over_clusterctl', 0):.2f}, "
                      f"wall x{r.get('wall_over_clusterctl', 0):.2f} clusterctl's")
    finally:
        if results and (args.json or args.plot):
            doc = benchplot.document("exec", benchplot.command_line(), {
                **benchplot.conditions(loads), "repeat": args.repeat, "command": args.command,
                "fanout": FANOUT, **versions()}, rows=rows_for(results))
            benchplot.save(doc, args.json, args.plot)
        sandbox.down(args.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
