"""Fault injection from outside a job: what ``clusterctl fault`` does, for tests, benchmarks
and users rehearsing failures on their own clusters.

Every fault hits ONE node of an inventory:

* ``kill``: SIGKILL the run's container on the node (``docker kill --signal KILL``);
* ``sigstop``: SIGSTOP one rank process inside it (default: the node's first rank; the
  process whose environment has ``RANK=R`` for ``--rank R``), found and stopped by
  :data:`STOP_SCRIPT` through ``docker exec CONTAINER python3 -c ...`` (as the hang
  watchdog reads the ranks' stacks), so the SSH user needs no more than docker;
* ``link-down`` / ``link-up``: the node's link at the sandbox's bridge goes down / up;
* ``engine-stop`` / ``engine-start``: the node's dockerd is SIGKILLed, as a crash (its
  containerd dies with it, the containers live on) / started again (without live-restore,
  Docker's default, the new dockerd stops the containers it finds running: exit 137).

The container of a run on a node is found by its labels (``io.clusterctl.run`` and
``io.clusterctl.node``, running), never by the name in the run record: a restarted run's
attempt K runs in ``<run>-<node>-a<K>``, and the fault hits whatever attempt runs now
(the highest ``io.clusterctl.attempt`` when two are running at once).  The last four
faults need a sandbox (:mod:`clusterctl.cluster.sandbox`): its inventory's node is mapped
to the sandbox's node by the inventory file the sandbox wrote and the node's address
(:func:`sandbox_node`); on a real cluster the refusal says what to run on the node instead.

Pure: :func:`parse_kind`, :func:`check_node`, :func:`check_options`, :func:`sandbox_node`,
:func:`not_sandbox_message`, :func:`pick_container`, :func:`parse_stop_output`,
:func:`rank_missing_message`, :func:`describe`, :class:`Injection`.  On the machines:
:func:`resolve` (the checks before anything is done), :func:`inject` (everything from the
CLI's arguments), :func:`kill_container`, :func:`stop_rank`, :func:`sandbox_fault`,
:func:`wait_gone`.

Each fault returns an :class:`Injection`: what was hit and ``time.time()`` when it was
done, so a benchmark measures recovery from that moment.  Errors: an unknown node, no
running container of the run there, a rank not there: UserError (exit 2); a node that
cannot be reached: NodeError naming it (exit 1).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from clusterctl.cluster.containers import (
    ATTEMPT_LABEL,
    NODE_LABEL,
    RUN_LABEL,
    ContainerState,
    state_from_inspect,
)
from clusterctl.cluster.inventory import Inventory, Node, load_inventory
from clusterctl.cluster.runtime import runtime_of
from clusterctl.cluster.transport import Cluster, NodeConnection, describe_error
from clusterctl.core.errors import EnvironmentProblem, NodeError, UserError, did_you_mean, one_of
from clusterctl.core.text import digits
from clusterctl.run import records

KILL, SIGSTOP = "kill", "sigstop"
LINK_DOWN, LINK_UP = "link-down", "link-up"
ENGINE_STOP, ENGINE_START = "engine-stop", "engine-start"

#: Every fault, in the order the help lists them.
KINDS: tuple[str, ...] = (KILL, SIGSTOP, LINK_DOWN, LINK_UP, ENGINE_STOP, ENGINE_START)
#: The faults that hit a run's container (they need a run: ``--run``, else the newest).
RUN_KINDS = frozenset({KILL, SIGSTOP})
#: The faults only a sandbox can inject (the head holds the node's link and its dockerd).
SANDBOX_KINDS = frozenset({LINK_DOWN, LINK_UP, ENGINE_STOP, ENGINE_START})

#: One line each, for the CLI's help and the docs.
KIND_HELP: dict[str, str] = {
    KILL: "SIGKILL the run's container on the node",
    SIGSTOP: "SIGSTOP one rank process in it (--rank R, default the node's first rank)",
    LINK_DOWN: "take the node's network link down (sandbox only)",
    LINK_UP: "bring it back up (sandbox only)",
    ENGINE_STOP: "SIGKILL the node's Docker engine, as a crash (sandbox only)",
    ENGINE_START: "start it again (sandbox only)",
}

#: What to do on a real cluster instead of a sandbox-only fault ({dev}: the node's interface).
REAL_CLUSTER: dict[str, str] = {
    LINK_DOWN: "`sudo ip link set {dev} down` on the node (from its console or another "
               "network: the SSH session that runs it goes down with the link), or shut its "
               "switch port",
    LINK_UP: "`sudo ip link set {dev} up` on the node (from its console), or open its switch port",
    ENGINE_STOP: "`sudo systemctl kill --signal=SIGKILL docker` on the node (a crash; "
                 "`sudo systemctl stop docker` stops it cleanly)",
    ENGINE_START: "`sudo systemctl start docker` on the node",
}

#: Seconds one ``docker`` command on the node may take.
COMMAND_TIMEOUT = 20.0


# --------------------------------------------------------------------------- pure parts

@dataclass(frozen=True)
class Injection:
    """One fault as it was injected: what was hit, and when (``at``: ``time.time()`` just
    after the action returned; ``requested``: just before it started)."""

    kind: str
    node: str
    target: str                 # in words: "container r1-node2", "link cctst-2h", ...
    action: str                 # what was done, in words
    at: float
    requested: float
    run_id: str | None = None
    container: str | None = None
    rank: int | None = None
    pid: int | None = None      # the rank process's pid in its container (sigstop)
    link: str | None = None     # the sandbox's host-side device of the node's link
    sandbox: str | None = None

    def record(self) -> dict:
        """For a benchmark's or a test's records (JSON-ready)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_kind(text: str) -> str:
    """``text`` as a fault kind, or UserError naming the valid ones."""
    kind = (text or "").strip().lower()
    if kind not in KINDS:
        raise UserError(f"unknown fault {text!r}{did_you_mean(kind, KINDS)}; valid: {one_of(KINDS)}.")
    return kind


def check_options(kind: str, *, rank: int | None, after: float | None) -> None:
    """The options that go with ``kind``: --rank only with sigstop, --after not negative."""
    if rank is not None and kind != SIGSTOP:
        raise UserError(f"--rank picks the process sigstop stops; fault {kind} takes no --rank.")
    if rank is not None and rank < 0:
        raise UserError(f"--rank {rank}: a global rank is 0 or more.")
    if after is not None and not after >= 0:
        raise UserError(f"--after {after}: seconds to wait before the fault, 0 or more.")


def check_node(inventory: Inventory, node: str):
    """The inventory's node named ``node``, or UserError naming the inventory's nodes."""
    for n in inventory.nodes:
        if n.name == node:
            return n
    names = [n.name for n in inventory.nodes]
    raise UserError(f"no node {node!r} in {inventory.path}{did_you_mean(node, names)}; its nodes: "
                    f"{one_of(names)}.")


@dataclass(frozen=True)
class SandboxRef:
    """A sandbox as its state file records it: its name, inventory file and nodes' addresses."""

    name: str
    inventory: str | None
    nodes: dict[str, str] = field(default_factory=dict)   # sandbox node name -> its address


def sandbox_node(inventory_path: str | os.PathLike, host: str,
                 sandboxes: Sequence[SandboxRef]) -> tuple[str, str] | None:
    """(sandbox, node) whose node ``host`` (an inventory node's address) is: first among the
    sandboxes whose recorded inventory is ``inventory_path`` (the file ``sandbox up`` wrote),
    then any sandbox with a node at that address (a copy of its inventory); None when
    ``host`` is no node of a sandbox on this machine."""
    want = os.path.normpath(os.fspath(inventory_path))
    own = [sb for sb in sandboxes if sb.inventory and os.path.normpath(sb.inventory) == want]
    for sb in [*own, *(sb for sb in sandboxes if sb not in own)]:
        for name, ip in sb.nodes.items():
            if ip == host:
                return sb.name, name
    return None


def not_sandbox_message(kind: str, node: Node, inventory_path) -> str:
    """Why a sandbox-only fault cannot be injected on ``node`` and what to do on a real node."""
    dev = node.interface or "DEV"
    where = "" if node.interface else " (DEV: the interface that holds the node's address, e.g. eth0)"
    return (f"fault {kind} needs a sandbox: clusterctl takes a sandbox node's link down or "
            f"kills its Docker engine from this machine, and {node.name} ({node.host}) of "
            f"{inventory_path} is not a node of any sandbox on this machine (`clusterctl sandbox "
            f"status` lists them). On a real node do it there: {REAL_CLUSTER[kind].format(dev=dev)}{where}. "
            "Nothing was done.")


def _attempt(labels: dict) -> int:
    value = str((labels or {}).get(ATTEMPT_LABEL, "0"))
    return int(value) if digits(value) else 0


def pick_container(found: Iterable[tuple[ContainerState, int]], *, run_id: str, node: str) -> ContainerState:
    """The running container of ``run_id`` on ``node`` among ``found`` ((state, attempt) of
    the containers with the run's and node's labels): the highest attempt, the newest start
    between equals; UserError when none runs."""
    running = [(c, a) for c, a in found if c.status == "running"]
    if not running:
        raise UserError(f"no running container of run {run_id} on {node} (found by the labels "
                        f"{RUN_LABEL}={run_id} and {NODE_LABEL}={node}): the run ended there, or "
                        "it is between attempts; `clusterctl status` shows its containers. "
                        "Nothing was done.")
    floor = datetime.min.replace(tzinfo=timezone.utc)
    return max(running, key=lambda ca: (ca[1], ca[0].started or floor))[0]


#: Runs in the container (``docker exec CONTAINER python3 -c STOP_SCRIPT WANT``): finds the
#: rank processes (a process with RANK in its environment whose parent has another RANK or
#: none: torchrun's workers, not their DataLoader workers; Docker's init, PID 1 under
#: ``--init``, never), picks rank WANT ("-": the lowest), SIGSTOPs it and waits up to 2 s
#: for its state to read T.  PID 1 without an init is left to ``docker kill`` (a signal from
#: inside the container never stops its init).  Prints one JSON object.  Python >= 3.6.
STOP_SCRIPT = r'''
import json, os, signal, sys, time


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def state(pid):
    for line in (read("/proc/%d/status" % pid) or "").splitlines():
        if line.startswith("State:"):
            return line.split(":", 1)[1].strip()
    return ""


def proc(pid):
    status = read("/proc/%d/status" % pid) or ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    env = {}
    for item in (read("/proc/%d/environ" % pid, "rb") or b"").split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key == b"RANK":
            env["RANK"] = value.decode("utf-8", "replace")
    argv = (read("/proc/%d/cmdline" % pid, "rb") or b"").split(b"\0")
    return {"pid": pid, "ppid": int(fields.get("PPid", "0").strip() or 0),
            "state": fields.get("State", "?").strip(), "rank": env.get("RANK"),
            "cmd": " ".join(a.decode("utf-8", "replace") for a in argv if a)[:200],
            "exe": os.path.basename(argv[0].decode("utf-8", "replace")) if argv and argv[0] else ""}


want = sys.argv[1] if len(sys.argv) > 1 else "-"
me = os.getpid()
procs = {}
for name in os.listdir("/proc"):
    if name.isdecimal() and int(name) != me:
        info = proc(int(name))
        if info["cmd"]:
            procs[info["pid"]] = info
if procs.get(1, {}).get("exe") in ("docker-init", "tini", "tini-static"):
    del procs[1]
ranks = [p for p in procs.values() if p["rank"] is not None and p["rank"].isdecimal()
         and procs.get(p["ppid"], {}).get("rank") != p["rank"]]
ranks.sort(key=lambda p: (int(p["rank"]), p["pid"]))
out = {"ranks": [{"pid": p["pid"], "rank": int(p["rank"]), "state": p["state"], "cmd": p["cmd"]}
                 for p in ranks], "pid": None, "rank": None, "state": "", "init": False}
pick = ranks[:1] if want == "-" else [p for p in ranks if p["rank"] == want][:1]
if pick:
    p = pick[0]
    out.update(pid=p["pid"], rank=int(p["rank"]))
    if p["pid"] == 1:
        out["init"] = True
    else:
        os.kill(p["pid"], signal.SIGSTOP)
        deadline = time.time() + 2
        while not state(p["pid"]).startswith("T") and time.time() < deadline:
            time.sleep(0.01)
        out["state"] = state(p["pid"])
sys.stdout.write(json.dumps(out))
'''


@dataclass(frozen=True)
class StopResult:
    """What :data:`STOP_SCRIPT` found and did in one container."""

    ranks: list[dict]
    pid: int | None
    rank: int | None
    state: str
    init: bool


def parse_stop_output(text: str) -> StopResult:
    """STOP_SCRIPT's JSON -> StopResult; ValueError when it is no such JSON."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), list):
        raise ValueError("not the stop script's output")
    return StopResult([r for r in data["ranks"] if isinstance(r, dict)], data.get("pid"),
                      data.get("rank"), str(data.get("state") or ""), bool(data.get("init")))


def rank_missing_message(result: StopResult, *, container: str, node: str, rank: int | None) -> str:
    """Why no rank process was stopped in ``container`` (the ranks that are there)."""
    if not result.ranks:
        return (f"no rank process in container {container} on {node} (no process with RANK in "
                "its environment: the job may still be starting, e.g. torchrun importing torch). "
                "Nothing was done.")
    there = sorted({r.get("rank") for r in result.ranks if isinstance(r.get("rank"), int)})
    return (f"no process of rank {rank} in container {container} on {node}; the ranks there: "
            f"{one_of(there)}. Nothing was done.")


def describe(inj: Injection) -> str:
    """``fault: kill on node2 (container X) at 12:00:01.234 UTC``: the CLI's line."""
    clock = datetime.fromtimestamp(inj.at, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    return f"fault: {inj.kind} on {inj.node} ({inj.target}) at {clock} UTC"


# --------------------------------------------------------------------------- on the machines

def _running(conn: NodeConnection, run_id: str, node: str) -> list[tuple[ContainerState, int]]:
    """(state, attempt) of every running container with the run's and the node's labels."""
    runtime = runtime_of(conn)
    ids = conn.run(runtime.ps(labels={RUN_LABEL: run_id, NODE_LABEL: node}, status="running", all=False),
                   timeout=COMMAND_TIMEOUT, check=True).stdout.split()
    if not ids:
        return []
    res = conn.run(runtime.inspect(ids), timeout=COMMAND_TIMEOUT)
    try:
        data = json.loads(res.stdout or "[]")
    except ValueError:
        data = []
    return [(state_from_inspect(node, d), _attempt((d.get("Config") or {}).get("Labels") or {}))
            for d in data if isinstance(d, dict)]


def _last_line(res) -> str:
    text = (res.stderr or res.stdout or "").strip()
    return text.splitlines()[-1] if text else f"exit {res.exit_code}"


def kill_container(conn: NodeConnection, run_id: str) -> Injection:
    """SIGKILL the running container of ``run_id`` on ``conn``'s node."""
    node = conn.name
    container = pick_container(_running(conn, run_id, node), run_id=run_id, node=node).name
    requested = time.time()
    res = conn.run(runtime_of(conn).kill(container, signal="KILL"), timeout=COMMAND_TIMEOUT)
    at = time.time()
    if res.exit_code != 0:
        raise NodeError(node, f"`docker kill --signal KILL {container}` failed: {_last_line(res)}")
    return Injection(KILL, node, f"container {container}", "SIGKILL to the container (docker kill)",
                     at, requested, run_id=run_id, container=container)


def stop_rank(conn: NodeConnection, run_id: str, rank: int | None = None) -> Injection:
    """SIGSTOP rank ``rank`` (None: the node's first) in the run's container on ``conn``'s node."""
    node = conn.name
    container = pick_container(_running(conn, run_id, node), run_id=run_id, node=node).name
    requested = time.time()
    res = conn.run(runtime_of(conn).exec(container, ["python3", "-c", STOP_SCRIPT,
                                                     "-" if rank is None else str(rank)]),
                   timeout=COMMAND_TIMEOUT)
    at = time.time()
    try:
        result = parse_stop_output(res.stdout)
    except ValueError:
        why = _last_line(res)
        if res.exit_code in (126, 127) or "executable file not found" in why:
            why = f"no python3 in the container to find the rank process ({why})"
        raise NodeError(node, f"docker exec in {container} failed: {why}") from None
    if result.pid is None:
        raise UserError(rank_missing_message(result, container=container, node=node, rank=rank))
    how = "SIGSTOP from inside the container (docker exec)"
    if result.init:      # the rank is the container's PID 1: only a signal from outside stops it
        res = conn.run(runtime_of(conn).kill(container, signal="STOP"), timeout=COMMAND_TIMEOUT)
        at = time.time()
        if res.exit_code != 0:
            raise NodeError(node, f"`docker kill --signal STOP {container}` failed: {_last_line(res)}")
        how = "SIGSTOP to the container's PID 1 (docker kill --signal STOP)"
    elif not result.state.startswith("T"):
        raise NodeError(node, f"rank {result.rank} (pid {result.pid} in {container}) got SIGSTOP "
                              f"but its state is {result.state or 'unknown'}, not T (stopped)")
    return Injection(SIGSTOP, node, f"container {container}, rank {result.rank}, pid {result.pid}",
                     how, at, requested, run_id=run_id, container=container, rank=result.rank,
                     pid=result.pid)


def recorded_sandboxes() -> list[SandboxRef]:
    """The sandboxes on this machine, from their state files (nothing is asked)."""
    from clusterctl.cluster import sandbox  # the sandbox package: only for the sandbox faults

    return [SandboxRef(sb.name, str(Path(sb.inventory_path).resolve()) if sb.inventory_path else None,
                       {n.name: n.ip for n in sb.nodes}) for sb in sandbox.recorded()]


def sandbox_fault(kind: str, sandbox_name: str, sandbox_node_name: str, *, node: str | None = None) -> Injection:
    """Inject a sandbox-only fault on a sandbox's node (``node``: its name in the inventory)."""
    from clusterctl.cluster import dockerd, sandbox

    sb_node = sandbox.load(sandbox_name).node(sandbox_node_name)
    node = node or sandbox_node_name
    requested = time.time()
    if kind in (LINK_DOWN, LINK_UP):
        sandbox.set_link(sandbox_name, sandbox_node_name, up=kind == LINK_UP)
        at = time.time()
        return Injection(kind, node, f"link {sb_node.veth} of sandbox {sandbox_name}",
                         f"`ip link set {sb_node.veth} {'up' if kind == LINK_UP else 'down'}` "
                         "(the node's side of the sandbox bridge)", at, requested,
                         link=sb_node.veth, sandbox=sandbox_name)
    target = f"dockerd of sandbox {sandbox_name}"
    containerd = sb_node.daemon.exec_root / "containerd" / "containerd.pid"
    if kind == ENGINE_STOP:
        pid, containerd_pid = dockerd.read_pid(sb_node.daemon.pidfile), _pid_in(containerd)
        killed = sandbox.kill_dockerd(sandbox_name, sandbox_node_name)
        at = time.time()
        wait_gone(containerd_pid)   # so that an engine-start right after works
        what = (f"SIGKILL to dockerd (pid {pid}), as a crash: its containerd goes with it, the "
                "containers live on" if killed else "no dockerd was running: nothing killed")
        return Injection(kind, node, target + (f", pid {pid}" if killed else ""), what, at, requested,
                         sandbox=sandbox_name)
    if kind == ENGINE_START:
        pid = _pid_in(containerd)
        if pid is not None and _proc_state(pid) == "Z":
            wait_gone(pid)
        sandbox.restart_dockerd(sandbox_name, sandbox_node_name)
        at = time.time()
        return Injection(kind, node, target, f"dockerd started; it answers on {sb_node.docker_host}",
                         at, requested, sandbox=sandbox_name)
    raise UserError(f"fault {kind} is no sandbox fault; those are {one_of(sorted(SANDBOX_KINDS))}.")


def _proc_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``Z``: a zombie), None when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _pid_in(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_gone(pid: int | None, *, timeout: float = 10.0, alive_for: float = 2.0) -> bool:
    """Wait until process ``pid`` is gone, zombie included; True then.  One still running
    (not a zombie) after ``alive_for`` seconds is taken to live on (False).

    A node dockerd's own containerd dies with it (dockerd starts it with a parent-death
    signal; the containers' shims live on) and stays a zombie until this machine's init
    reaps it; a dockerd started meanwhile takes the zombie for a live containerd, waits for
    its socket and fails ("timeout waiting for containerd to start")."""
    if pid is None:
        return True
    start = time.monotonic()
    while (state := _proc_state(pid)) is not None:
        waited = time.monotonic() - start
        if waited > timeout or (state != "Z" and waited > alive_for):
            return False
        time.sleep(0.02)
    return True


@dataclass(frozen=True)
class Target:
    """What a fault will hit, checked before anything is done: the inventory and its node,
    the run (a container fault), the sandbox and its node (a sandbox fault)."""

    kind: str
    inventory: object
    node: object
    run_id: str | None = None
    sandbox: tuple[str, str] | None = None


def resolve(kind: str, node: str, *, nodes: str | os.PathLike | None = None, run_id: str | None = None,
            rank: int | None = None, after: float | None = None,
            sandboxes: Sequence[SandboxRef] | None = None) -> Target:
    """Check everything that needs no node: the kind and options, the run (a container
    fault: ``run_id``, else the newest run), the inventory (``nodes``, else the run's), the
    node in it, and for a sandbox fault the sandbox it belongs to (UserError otherwise) and
    root.  ``sandboxes``: the sandboxes to look in (default: those recorded on this machine)."""
    kind = parse_kind(kind)
    check_options(kind, rank=rank, after=after)
    if nodes is not None:      # a typo in the node fails before the run is looked for
        inventory = load_inventory(nodes)
        target_node = check_node(inventory, node)
    record = None
    if kind in RUN_KINDS or nodes is None:
        if kind not in RUN_KINDS and run_id is None and not records.list_runs():
            raise UserError(f"fault {kind} needs the inventory: give --nodes FILE (or set "
                            "CLUSTERCTL_NODES), or --run RUN_ID to use the one recorded with a run.")
        record = records.resolve(run_id)
    if nodes is None:
        if not record.inventory:
            raise UserError(f"run {record.run_id} recorded no inventory; give --nodes FILE.")
        inventory = load_inventory(records.inventory_path(record))
        target_node = check_node(inventory, node)
    found = None
    if kind in SANDBOX_KINDS:
        found = sandbox_node(Path(inventory.path).resolve(), target_node.host,
                             recorded_sandboxes() if sandboxes is None else sandboxes)
        if found is None:
            raise UserError(not_sandbox_message(kind, target_node, inventory.path))
        if os.geteuid() != 0:
            raise EnvironmentProblem(f"fault {kind} on a sandbox node needs root, as the sandbox "
                                     "does (it sets the node's link or signals its dockerd); run "
                                     "it with sudo. Nothing was done.")
    return Target(kind, inventory, target_node, run_id=record.run_id if kind in RUN_KINDS else None,
                  sandbox=found)


def inject(kind: str, node: str, *, nodes: str | os.PathLike | None = None, run_id: str | None = None,
           rank: int | None = None, after: float | None = None, cluster: Cluster | None = None,
           sleep=time.sleep) -> Injection:
    """Inject fault ``kind`` on ``node`` (everything ``clusterctl fault`` does).

    Everything that can be checked is checked first (:func:`resolve`), and for a container
    fault the node's SSH connection is opened; then ``after`` seconds pass; then the
    container is looked up (the attempt running THEN) and hit.  ``cluster``: a
    :class:`~clusterctl.cluster.transport.Cluster` of the inventory to use (else one is
    opened and closed here)."""
    target = resolve(kind, node, nodes=nodes, run_id=run_id, rank=rank, after=after)
    if target.kind in SANDBOX_KINDS:
        if after:
            sleep(after)
        sb_name, sb_node = target.sandbox
        return sandbox_fault(target.kind, sb_name, sb_node, node=target.node.name)

    own = cluster is None
    cluster = cluster or Cluster(target.inventory)
    name = target.node.name
    try:
        try:
            conn = cluster.connection(name)
        except NodeError as e:
            raise NodeError(name, f"cannot be reached over SSH ({e.reason}); no fault was "
                                  "injected") from None
        if after:
            sleep(after)
        try:
            if target.kind == KILL:
                return kill_container(conn, target.run_id)
            return stop_rank(conn, target.run_id, rank)
        except UserError:
            raise
        except NodeError as e:
            raise NodeError(name, f"fault {target.kind} failed: {e.reason}") from None
        except Exception as e:  # noqa: BLE001 - an SSH failure: one line naming the node
            raise NodeError(name, f"fault {target.kind} failed: {describe_error(e)}") from None
    finally:
        if own:
            cluster.close()
