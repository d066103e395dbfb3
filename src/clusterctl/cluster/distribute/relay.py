"""Relay push: the head streams the image once per chain; each node forwards while it receives.

One job: run a :class:`~clusterctl.cluster.distribute.relayplan.RelayPlan` on
the nodes.  Contract: :func:`relay_push` - the nodes planned to receive
bytes, in rounds, each node verified by image ID; results as the star's
(:class:`~clusterctl.cluster.distribute.node.PushResult`, with ``source``).

On each node of a round, one command on the head's own SSH connection (so
the head sees every node's ``docker load`` result and exit status directly)::

    input | dd (counts bytes) | tee -p <fifo per child> | [zstd -dc |] docker load

where *input* is the channel's stdin on a chain's first node and a fifo in a
private temporary directory on the others (made by the command itself, mode
0700, named by the head with two random tokens; no command of its own before).  For every child
the node runs ``ssh child 'cat > DIR/in'`` reading its fifo, so bytes are
forwarded as they arrive (pipelined through pipe buffers of 64 KiB, never
stored).  ``tee -p`` keeps feeding the other outputs when one breaks, so a
node whose own ``docker load`` fails (its dockerd stopped) still feeds its
children; a child whose hop breaks is drained (``cat > /dev/null``), so it
never holds up its feeder.  Every hop's ``ssh`` logs in as soon as its node's
command starts (``cat fifo | ssh``: only ``cat`` waits for ``tee``), and the
head sends no byte before every node has said ``clusterctl-ready`` (its hop is
up): a hop that logs in once bytes flow leaves a backlog that links all at
rate B never catch up, so late logins used to add up along the chain (~1.2 s
per node, measured with ``CLUSTERCTL_PUSH_TRACE``).  The node tags (or
inspects) the image right after its own ``docker load``.

Node to node, authenticated, nothing left behind: the hop's ``ssh`` uses
agent forwarding requested on that one channel and answered by
:class:`~clusterctl.cluster.transport.agent.HopAgent` in this process,
which signs with the child's inventory key at most once per planned hop, only
for a login bound to a planned child's host key (OpenSSH 8.9 or later on the
nodes), and nothing after the round.  The child's host key is checked strictly against
a known_hosts file holding the key this machine verified for it.  Nothing is
installed: the temporary directory (fifos, known_hosts, process group ids)
is removed by the command itself when it ends and by the head after the
round; a node whose stream stalls for STALL seconds before it is complete
(its feeder or the head died, its link is down) or whose session with the
head is gone (the heartbeat on stderr fails to write) stops its own process
group, so nothing outlives a push for long, even when the head cannot reach it.

Failures: a node that stops answering (neither a keepalive answer nor any
line of its own, such as its heartbeat, arrives for LOST_AFTER s) or whose
command ends without feeding its children is named as failed; the nodes
below it in its chain that had not completed are stopped (their process
groups killed) and, as soon as their commands have
ended, fed again in a round of their own, as a new chain from the head
(:func:`~clusterctl.cluster.distribute.relayplan.cut_off` and
:func:`~clusterctl.cluster.distribute.relayplan.plan_refeed` decide which and
how), while the rest of the first round goes on: a node above the failure
whose hop to it hangs waits for that hop's ssh to give up (15 s) and must not
hold up the re-feed.  A lost node is not waited for: it is not cleaned up from
here (it stops itself: STALL, or its session with the head gone), and its
result says why it failed.  ``docker load`` registers nothing from a truncated
stream and a node tags only an image whose ID it verified, so no node keeps
half an image: the next push to it works.  Nothing of this costs a round trip
when nothing fails.
"""

from __future__ import annotations

import re
import secrets
import select
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import paramiko

from clusterctl.cluster.distribute import trace, wire
from clusterctl.cluster.distribute.layerfilter import filter_save_stream
from clusterctl.cluster.distribute.node import (
    NodePlan,
    PushProgress,
    PushResult,
    confirm_on_node,
    load_failure,
    tag_for,
)
from clusterctl.cluster.distribute.relayplan import (
    RelayPlan,
    cut_off,
    failed_upstream,
    plan_refeed,
    plan_relay,
)
from clusterctl.cluster.distribute.savestream import SharedSave
from clusterctl.cluster.distribute.source import SourceImage
from clusterctl.cluster.distribute.tarstream import StreamError
from clusterctl.cluster.runtime import runtime_of
from clusterctl.cluster.transport.agent import HopAgent, hop_destinations, load_key
from clusterctl.cluster.transport.hopssh import HOP_KEX
from clusterctl.core.errors import NodeError
from clusterctl.core.scripts import script_text

if TYPE_CHECKING:
    from docker import DockerClient

    from clusterctl.cluster.transport import Cluster, NodeConnection

#: a node from which nothing arrives for this long (no keepalive answer, no heartbeat) is lost
LOST_AFTER = 10.0
#: a node whose stream stops for this long before it is complete stops itself (seconds)
STALL = 120
#: the head waits at most this long for every node's hop to be up before it sends (seconds)
READY_WAIT = 30.0
#: a node asked to stop whose command has not ended after this long is given up on
STOP_WAIT = 30.0
_SEND_ERRORS = (OSError, EOFError, paramiko.SSHException)

# Run on every node of a round with positional arguments:
#   DIR Z FED ID REF [PORT USER HOST KNOWN_HOST REMOTE_COMMAND]...   (a group of five per child)
# DIR: the node's own temporary directory, named by the head (the push's token and one of
# the node's own, both random) and made here, first (mkdir fails on any existing path, so it
# is never someone else's); Z: 1 when the stream is zstd-compressed;
# FED: 1 when a node feeds this one (through DIR/in), 0 when the head does (stdin);
# ID, REF: the image ID docker load must give, and the tag to give it ('' when pushed by ID):
# confirmed here right after the load, not in one more command from the head;
# KNOWN_HOST: the child's host key as this machine verified it (a known_hosts line).
NODE_SCRIPT = script_text("clusterctl.cluster", "relay-node.sh")

# Run on a fed node by its feeder's ssh: wait (30 s at most) for the node's own command to
# have made its input (its directory must be ours: never write into a path someone else made),
# note who we are (so the head can stop us), feed the fifo.
HOP_SCRIPT = script_text("clusterctl.cluster", "relay-hop.sh")

# Stop what is left of a node's part of a round (kill: its command never ended) and remove it.
CLEANUP_SCRIPT = script_text("clusterctl.cluster", "relay-cleanup.sh")

# After the last round, on every node the push still reaches: stop and remove whatever of this
# push ($1: its token) is left, whichever way a round ended (a command whose answer was lost,
# a cleanup that timed out).  A node the head cannot reach stops and cleans up itself ($STALL).
# (both sweeps have the same loop body: stop a part's processes, remove its directory;
# tests/core/test_scripts.py keeps the two files' bodies the same)
SWEEP_SCRIPT = script_text("clusterctl.cluster", "relay-sweep.sh")

# After a later round, on a node that succeeded in it: stop and remove what is left of its
# earlier rounds' parts ($@: their directories; a cleanup that timed out), only those (the
# other nodes' parts of this push may still run, and a sandbox's nodes share one /tmp).
SWEEP_DIRS_SCRIPT = script_text("clusterctl.cluster", "relay-sweep-dirs.sh")

_BYTES = re.compile(r"^(?:clusterctl-alive )?(\d+) bytes")
_HOP = re.compile(r"^clusterctl-hop (\d+) (\d+)\Z")
_CONFIRM = re.compile(r"^clusterctl-confirm (\d+)\Z")
_MARK = re.compile(r"^clusterctl-mark (\S+)\Z")
_LOADED = re.compile(r"Loaded image(?: ID)?: (sha256:[0-9a-f]{64})")  # Podman: no "ID"


@dataclass
class _NodeRun:
    """One node's part in one round."""

    name: str
    conn: object
    dir: str
    zstd: bool
    known_host: str = ""
    children: list[str] = field(default_factory=list)
    chan: paramiko.Channel | None = None
    received: int = 0
    head_bytes: int = 0
    exit_code: int | None = None
    lost: str | None = None           # why the node counts as lost
    unreachable: bool = False         # lost because it stopped answering: not waited for
    stdout: str = ""
    stderr_tail: list[str] = field(default_factory=list)
    hop_failed: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    last_pong: float = field(default_factory=time.monotonic)
    killed: float | None = None      # when the head asked the node to stop
    ready: threading.Event = field(default_factory=threading.Event)  # its hop is up
    confirmed: int | None = None     # exit status of the tag (or inspect) after its load


def relay_push(cluster: Cluster, client: DockerClient, image: SourceImage, plans: dict[str, NodePlan],
               streaming: list[str], layout: dict[str, str] | None, progress: PushProgress,
               *, compress: bool | None = False, width: int = 1,
               shared: Callable[[list[str]], SharedSave] | None = None,
               open_stream: Callable[[], Iterator[bytes]] | None = None) -> dict[str, PushResult]:
    """Bring the image to every node in ``streaming`` through relay chains, in rounds.

    A round's starved nodes (fed through a node that failed) are fed again from
    the head by a round of their own, started as soon as their commands have ended;
    every round finishes at least the first node of each chain, so the rounds end.
    Every node in ``streaming`` has a result: the image verified, or why not.
    ``compress`` None: decided by :func:`~clusterctl.cluster.distribute.wire.decide` (a measurement).  ``shared``:
    the head's stream for a round's chain roots (default: one ``docker save``);
    ``open_stream``: the same bytes, for the compression measurement's sample."""
    shared = shared or (lambda names: SharedSave(client, image.id, names))
    results: dict[str, PushResult] = {}
    why = "--compress" if compress else "--no-compress"
    if compress is None:  # measured: the link into the first node, zstd on the image here
        try:
            compress, why = wire.decide(cluster.connection(streaming[0]), client, image.id,
                                        open_stream=open_stream)
        except (NodeError, OSError, subprocess.SubprocessError) as e:
            compress, why = False, f"not measured: {e}"
    for name in streaming:
        plans[name].result.compression = f"{'zstd' if compress else 'none'} ({why})"
    trace.mark("head", f"compression decided: {compress}")
    token = secrets.token_hex(6)
    lost: set[str] = set()
    swept: set[str] = set()  # nodes whose part of this push is already swept
    try:
        _round(cluster, shared, image, plans, list(streaming), layout, progress,
               compress=compress, width=width, round_no=1, results=results,
               token=token, lost=lost, swept=swept)
    finally:
        reachable = [n for n in streaming
                     if n not in lost and n not in swept and cluster.is_connected(n)]
        cluster.map(lambda conn: _sweep(conn, token), reachable)
        trace.mark("head", "relay-end")
    return results


def _round(cluster: Cluster, shared, image, plans, names, layout, progress, *, compress, width,
           round_no, results, token, lost, swept, chains: RelayPlan | None = None,
           earlier: dict[str, list[str]] | None = None) -> None:
    """One round: ``chains`` (None: planned here from what each node needs) fed from the
    head; nodes cut off by a failure are fed again by a round of their own, started as
    soon as their commands have ended (not when this round ends), and waited for here."""
    earlier = {} if earlier is None else earlier  # node -> its directories of earlier rounds
    runs: dict[str, _NodeRun] = {}
    prepared = cluster.map(lambda conn: _prepare(conn, plans[conn.name], token), names)
    for name in names:
        value = prepared[name]
        if isinstance(value, NodeError):
            plans[name].fail(value)
            results[name] = plans[name].finish(progress)
        else:
            runs[name] = value
    if not runs:
        return
    if chains is None:
        plan = plan_relay({n: frozenset(plans[n].send or ()) for n in runs}, width=width)
    else:
        plan = chains.keep(runs)
    zstd = bool(compress) and all(r.zstd for r in runs.values())
    agents: list[HopAgent] = []
    refeeds: list[threading.Thread] = []
    failures: list[BaseException] = []
    dispatched: set[str] = set()

    def refeed(batch: list[str]) -> None:
        """Feed ``batch`` (cut off, their commands ended) again, from the head, now."""
        dead = _dead(plan, runs)
        cut = dispatched | set(batch)  # their hops broke because they were stopped
        broken = {(f, c) for f, c in dead["broken"] if f not in cut}
        for name in batch:
            earlier.setdefault(name, []).append(runs[name].dir)
            cause = failed_upstream(plan, name, lost=dead["lost"], broken=broken) \
                or plan.feeder(name)
            feeder = plan.feeder(name)
            why = (f"feeder {feeder} failed" if cause == feeder
                   else f"feeder {feeder} cut off by {cause}")
            plans[name].result.refed_after = cause
            progress.started(name, f"{why}: fed again from the head")
        dispatched.update(batch)

        def again() -> None:
            try:
                cluster.map(lambda conn: _cleanup(runs[conn.name]), batch)
                _round(cluster, shared, image, plans, batch, layout, progress,
                       compress=compress, width=width, round_no=round_no + 1, results=results,
                       token=token, lost=lost, swept=swept, chains=plan_refeed(plan, batch),
                       earlier=earlier)
            except BaseException as e:  # noqa: BLE001 - raised again by the round that started it
                failures.append(e)

        thread = threading.Thread(target=again, daemon=True, name=f"relay-round-{round_no + 1}")
        thread.start()
        refeeds.append(thread)

    try:
        for name in plan.nodes:
            run = runs[name]
            run.children = plan.children(name)
            feeder = plan.feeder(name)
            via = "head" if feeder is None else feeder
            note = f", retry {round_no}" if round_no > 1 else ""
            plans[name].result.source = via
            progress.started(name, f"{len(plans[name].send or ())} of {len(image.diff_ids)} "
                             f"layers from {via}{' (zstd)' if zstd else ''}{note}")
        # start the leaves first, so that every fifo has its reader before data flows
        for name in reversed(plan.nodes):
            _start(runs[name], runs, plan.feeder(name) is not None, agents, zstd, image)
        readers = [threading.Thread(target=_read, args=(runs[n], progress), daemon=True,
                                    name=f"relay-read-{n}") for n in plan.nodes]
        pingers = [threading.Thread(target=_ping, args=(runs[n],), daemon=True,
                                    name=f"relay-ping-{n}") for n in plan.nodes]
        for t in readers + pingers:
            t.start()
        sender = threading.Thread(target=_send_all, daemon=True, name="relay-send",
                                  args=(shared, image, plan, runs, plans, layout, progress, zstd))
        sender.start()
        trace.mark("head", "all-started")
        starved = _watch(plan, runs, refeed)
        trace.mark("head", "watch-end")
        sender.join(timeout=60)  # a send blocked on a lost node is abandoned (daemon thread)
        for t in readers:
            t.join(timeout=60)
    finally:
        for agent in agents:
            agent.close()
        # a node that succeeded ended its command, whose trap removed its directory: it is
        # swept below, at the same time as the others finish; the rest are stopped here,
        # but for the nodes fed again (their new round did that first) and the nodes that
        # stopped answering (not waited for: each stops itself, see the module's text)
        stop = [n for n, run in runs.items()
                if not _succeeded(run) and n not in dispatched and not run.unreachable]
        for name in [n for n, run in runs.items() if run.unreachable]:
            threading.Thread(target=_cleanup, args=(runs[name],), daemon=True,
                             name=f"relay-cleanup-{name}").start()
        cluster.map(lambda conn: _cleanup(runs[conn.name]), stop)
        lost.update(name for name, run in runs.items() if run.lost)
    finishing = [name for name in plan.nodes if name not in starved]
    # A node that succeeded in the first round had one directory of this push, which its
    # command's exit trap removed with nothing left running (the command waits for its
    # children): no sweep.  After a later round an earlier round's directory may be left
    # (its cleanup timed out): swept now, by name (the rest of this push may still run).
    # What is left per node (that sweep, a confirmation its own command could not give)
    # is a command on its own connection: all at once, not
    # one node after the other (0.3-2 s each on a busy node); a lost node's answers at once
    succeeded = [n for n in plan.nodes if _succeeded(runs[n]) and n not in starved]
    sweeping = succeeded if round_no > 1 else []
    with ThreadPoolExecutor(max_workers=max(1, min(len(finishing) + len(sweeping),
                                                   cluster.settings.fanout)),
                            thread_name_prefix="relay-finish") as pool:
        sweeps = [pool.submit(_sweep, runs[n].conn, token, earlier.get(n, ()))
                  for n in sweeping]
        done = pool.map(lambda n: _finish(runs[n], image, plans[n], progress), finishing)
        results.update(zip(finishing, done, strict=True))
        for future in sweeps:
            future.result()
    swept.update(succeeded)
    for thread in refeeds:
        thread.join()
    if failures:
        raise failures[0]


def _dead(plan: RelayPlan, runs: dict[str, _NodeRun]) -> dict:
    """What failed so far, as :func:`cut_off` and :func:`failed_upstream` take it."""
    return {"lost": {n for n in plan.nodes if runs[n].lost},
            "broken": {(n, c) for n in plan.nodes for c in runs[n].hop_failed}}


# --------------------------------------------------------------------------- on the nodes

def _hop_target(conn: NodeConnection) -> tuple[str, str, str]:
    """(port, user, host) the head reached the node at: the address its feeder dials."""
    user, _, rest = conn.target.partition("@")
    host, _, port = rest.rpartition(":")
    return port, user, host


def _prepare(conn: NodeConnection, plan: NodePlan, token: str) -> _NodeRun:
    """The node's part of a round, before its command starts: the directory it will make
    (named here: the push's token and one of its own, both random) and its host key as
    this machine verified it, which its feeder's hop checks.  Nothing runs on the node:
    its command makes the directory itself (there was a command of its own per node for
    that, one more SSH session each: ~0.1 s per node on the sandbox's shared cores)."""
    key = conn.transport.get_remote_server_key()
    port, _, host = _hop_target(conn)
    name = host if port == "22" else f"[{host}]:{port}"
    return _NodeRun(conn.name, conn, f"/tmp/clusterctl-push.{token}.{secrets.token_hex(5)}",
                    plan.zstd, known_host=f"{name} {key.get_name()} {key.get_base64()}")


def _start(run: _NodeRun, runs: dict[str, _NodeRun], fed: bool, agents: list[HopAgent],
           zstd: bool, image: SourceImage) -> None:
    script = NODE_SCRIPT.replace("$STALL", str(int(STALL))).replace("$HOP_KEX", HOP_KEX).replace(
        "$TRACE", "1" if trace.enabled() else "0")
    argv = ["sh", "-c", runtime_of(run.conn).script(script), "clusterctl-relay",
            run.dir, "1" if zstd else "0", "1" if fed else "0", image.id, tag_for(image)]
    agent = None
    for child in run.children:
        port, user, host = _hop_target(runs[child].conn)
        argv += [port, user, host, runs[child].known_host, _command(["sh", "-c", HOP_SCRIPT, "clusterctl-relay-in",
                                             runs[child].dir])]
    if run.children:
        key_file = getattr(runs[run.children[0]].conn.node, "identity_file", None)
        try:
            agent = HopAgent(load_key(key_file), budget=len(run.children),
                             destinations=hop_destinations((runs[c].known_host, _hop_target(runs[c].conn)[1])
                                                           for c in run.children))
        except (OSError, TypeError, paramiko.SSHException) as e:
            raise NodeError(run.name, f"relay needs the inventory's identity_file for "
                            f"{run.children[0]} to log in from {run.name}: {e}") from None
        agents.append(agent)
    try:
        trace.mark(run.name, "exec-start")
        run.chan = run.conn.exec_channel(argv, forward_agent=agent.handler if agent else None)
        trace.mark(run.name, "exec-end")
    except NodeError as e:
        run.lost = e.reason
        run.done.set()


def _command(argv: list[str]) -> str:
    """The one place a hop's remote command line is made: argv, every value quoted."""
    return shlex.join(argv)


def _read(run: _NodeRun, progress: PushProgress) -> None:
    """Follow one node's command: bytes received (dd), hop failures, docker load's output."""
    chan = run.chan
    if chan is None:
        return
    out, err = bytearray(), ""
    try:
        while True:
            # whatever the node sends (its heartbeat and byte count every 2 s, docker load's
            # output) is a sign of life as good as a keepalive's answer: a node whose sshd
            # answers keepalives late while 32 `docker load`s share its cores (seen on the
            # 32-node sandbox) is not lost while its own lines still arrive
            while chan.recv_ready():
                out.extend(chan.recv(65536))
                run.last_pong = time.monotonic()
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536).decode("utf-8", "replace")
                run.last_pong = time.monotonic()
                *lines, err = re.split(r"[\r\n]", err)
                for line in lines:
                    _note(run, line.strip(), progress)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                if chan.eof_received or chan.closed:
                    break
            if not chan.get_transport().is_active():
                run.lost = run.lost or "the connection was lost (the node stopped answering)"
                run.unreachable = True
                break
            if run.lost:
                break
            if chan.eof_received:
                chan.status_event.wait(0.2)
            else:
                select.select([chan], [], [], 0.5)
        if err.strip():
            _note(run, err.strip(), progress)
        code = chan.recv_exit_status() if chan.exit_status_ready() else None
        if code == -1 and not chan.get_transport().is_active():
            run.lost = run.lost or "the connection was lost (the node stopped answering)"
            run.unreachable = True
        run.exit_code = code
    except _SEND_ERRORS as e:
        run.lost = run.lost or f"the connection broke: {e}"
    finally:
        run.stdout = out.decode("utf-8", "replace")
        chan.close()
        trace.mark(run.name, f"command-ended rc={run.exit_code}")
        run.done.set()


def _note(run: _NodeRun, line: str, progress: PushProgress) -> None:
    if not line:
        return
    m = _BYTES.match(line)
    if m:
        n = int(m.group(1))
        if n > run.received:
            progress.sent(run.name, n - run.received)
            run.received = n
        return
    if line == "clusterctl-ready":
        trace.mark(run.name, "ready")
        run.ready.set()
        return
    m = _CONFIRM.match(line)
    if m:
        run.confirmed = int(m.group(1))
        trace.mark(run.name, f"confirmed rc={run.confirmed}")
        return
    m = _MARK.match(line)
    if m:
        trace.mark(run.name, m.group(1))
        return
    m = _HOP.match(line)
    if m:
        trace.mark(run.name, f"hop{m.group(1)}-end rc={m.group(2)}")
        i, code = int(m.group(1)), int(m.group(2))
        if code != 0 and 0 < i <= len(run.children):
            run.hop_failed.append(run.children[i - 1])
        return
    if line.startswith("clusterctl-alive") or re.match(r"^\d+\+\d+ records (in|out)\Z", line):
        return
    run.stderr_tail = (run.stderr_tail + [line])[-5:]


def _ping(run: _NodeRun) -> None:
    """Keepalive round trips on the node's connection while its command runs."""
    try:
        transport = run.conn.transport
    except NodeError:
        return
    while not run.done.is_set() and transport.is_active():
        transport.global_request("keepalive@openssh.com", wait=True)
        run.last_pong = time.monotonic()
        run.done.wait(1.0)


# --------------------------------------------------------------------------- from the head

def _send_all(shared, image, plan: RelayPlan, runs, plans, layout, progress, zstd) -> None:
    _wait_ready(plan, runs)
    roots = [r for r in plan.roots if runs[r].chan is not None]
    source = shared(roots)
    threads = [threading.Thread(target=_send_root, daemon=True, name=f"relay-head-{r}",
                                args=(runs[r], image, plans[r], source, layout, progress, zstd))
               for r in roots]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        source.close()


def _wait_ready(plan: RelayPlan, runs: dict[str, _NodeRun]) -> None:
    """Until every node of the round is ready (its hop from its feeder is up), has ended or
    failed, or READY_WAIT passed: all hops connect at once, before any byte flows."""
    deadline = time.monotonic() + READY_WAIT

    def settled(name: str) -> bool:
        run, feeder = runs[name], plan.feeder(name)
        if run.ready.is_set() or run.done.is_set() or run.lost or run.chan is None:
            return True
        return feeder is not None and (runs[feeder].lost is not None or runs[feeder].done.is_set()
                                       or name in runs[feeder].hop_failed)

    while time.monotonic() < deadline and not all(settled(n) for n in plan.nodes):
        time.sleep(0.02)
    trace.mark("head", "all-ready")


def _send_root(run: _NodeRun, image, plan: NodePlan, source: SharedSave, layout, progress,
               zstd: bool) -> None:
    chan = run.chan
    stream: Iterable[bytes] = filter_save_stream(source.chunks(run.name), image,
                                                 plan.send or set(), layout=layout,
                                                 stats=plan.stats)
    trace.mark(run.name, "head-send-start")
    try:
        for piece in (_zstd(stream) if zstd else stream):
            chan.sendall(piece)
            run.head_bytes += len(piece)
    except _SEND_ERRORS as e:
        run.lost = run.lost or f"sending the image failed: {e}"
    except StreamError as e:
        run.lost = run.lost or f"the local image stream broke: {e}"
        chan.close()
    finally:
        source.detach(run.name)
        trace.mark(run.name, "head-send-end")
        try:
            chan.shutdown_write()
        except _SEND_ERRORS:
            pass


def _zstd(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The stream compressed by the local zstd binary (level 1, all cores), as it goes."""
    binary = shutil.which("zstd")
    if binary is None:
        raise StreamError("zstd is not installed on this machine (Debian package zstd)")
    proc = subprocess.Popen([binary, "-1", "-T0", "-q", "-c"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    failure: list[BaseException] = []

    def feed() -> None:
        try:
            for chunk in chunks:
                proc.stdin.write(chunk)
        except BaseException as e:  # noqa: BLE001 - handed to the reader below
            failure.append(e)
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    feeder = threading.Thread(target=feed, daemon=True, name="zstd-feed")
    feeder.start()
    try:
        while piece := proc.stdout.read1(1 << 20):
            yield piece
    finally:
        proc.stdout.close()
        feeder.join(timeout=30)
        proc.wait(timeout=30)
    if failure:
        raise failure[0] if isinstance(failure[0], StreamError) else StreamError(str(failure[0]))


# --------------------------------------------------------------------------- watching

def _watch(plan: RelayPlan, runs: dict[str, _NodeRun],
           refeed: Callable[[list[str]], None] | None = None) -> set[str]:
    """Wait for every node's command; name lost nodes and stop those fed through them.

    Returns the starved nodes: fed through a node that was lost or a hop that
    broke, to be fed again.  A node whose own load failed (say its dockerd
    stopped) still feeds its children (``tee -p``): they are not starved.
    ``refeed`` gets the starved nodes as soon as all of them have ended (once
    each), while the others still run."""
    starved: list[str] = []
    handed: set[str] = set()

    def cut() -> None:  # chain order: a starved node starves the rest of its chain
        dead = _dead(plan, runs)
        for name in cut_off(plan, lost=dead["lost"] | set(starved), broken=dead["broken"],
                            completed={n for n in plan.nodes if _succeeded(runs[n])}):
            if name not in starved:
                starved.append(name)
                _stop(runs[name])

    def hand_over() -> None:
        batch = [n for n in starved if n not in handed]
        if refeed is not None and batch and all(runs[n].done.is_set() for n in batch):
            handed.update(batch)
            refeed(batch)

    while not all(runs[n].done.is_set() for n in plan.nodes):
        now = time.monotonic()
        for name in plan.nodes:
            run = runs[name]
            if not run.done.is_set() and run.lost is None and now - run.last_pong > LOST_AFTER:
                run.lost = f"the node stopped answering for {LOST_AFTER:.0f}s"
                run.unreachable = True
                trace.mark(name, "lost")
                _close_later(run)
            if not run.done.is_set() and run.killed is not None and now - run.killed > STOP_WAIT:
                run.lost = run.lost or f"its command did not stop within {STOP_WAIT:.0f}s"
                _close_later(run)
        cut()
        hand_over()
        # the next check when a node's command ends (not up to 0.5 s after the last one did)
        pending = [runs[n] for n in plan.nodes if not runs[n].done.is_set()]
        if pending:
            pending[-1].done.wait(0.5)
    cut()  # a feed that ended early fails the load: fed again, not failed
    hand_over()
    return set(starved)


def _close_later(run: _NodeRun) -> None:
    """Close a lost node's channel without blocking the watch (its socket may be full)."""
    chan = run.chan
    if chan is None:
        return

    def close() -> None:
        try:
            chan.close()
        except _SEND_ERRORS:
            pass  # the connection is already gone

    threading.Thread(target=close, daemon=True, name=f"relay-close-{run.name}").start()


def _succeeded(run: _NodeRun) -> bool:
    return run.done.is_set() and run.lost is None and run.exit_code == 0


def _stop(run: _NodeRun) -> None:
    """Kill a starved node's command (it waits for a feed that will not come)."""
    if run.done.is_set() or run.killed is not None:
        return
    run.killed = time.monotonic()

    def kill() -> None:
        try:
            run.conn.run(["sh", "-c", CLEANUP_SCRIPT, "clusterctl-relay-stop", run.dir, "kill"],
                         timeout=30)
        except NodeError:
            pass

    threading.Thread(target=kill, daemon=True, name=f"relay-stop-{run.name}").start()


def _cleanup(run: _NodeRun) -> None:
    mode = "rm" if run.done.is_set() and run.exit_code is not None else "kill"
    trace.mark(run.name, "cleanup-start")
    try:
        run.conn.run(["sh", "-c", CLEANUP_SCRIPT, "clusterctl-relay-cleanup", run.dir, mode],
                     timeout=30)
    except NodeError:
        pass  # a lost node: its command removes its directory itself when it ends
    trace.mark(run.name, "cleanup-end")


def _sweep(conn: NodeConnection, token: str, dirs=None) -> None:
    """Whatever of this push is left on the node; with ``dirs``, only those directories."""
    trace.mark(conn.name, "sweep-start")
    argv = (["sh", "-c", SWEEP_SCRIPT, "clusterctl-relay-sweep", token] if dirs is None else
            ["sh", "-c", SWEEP_DIRS_SCRIPT, "clusterctl-relay-sweep", *dirs])
    try:
        conn.run(argv, timeout=30)
    except NodeError:
        pass  # lost since: its own command stops and cleans up after STALL seconds
    trace.mark(conn.name, "sweep-end")


def _finish(run: _NodeRun, image: SourceImage, plan: NodePlan,
            progress: PushProgress) -> PushResult:
    result = plan.result
    result.head_bytes += run.head_bytes
    result.bytes_sent = run.received
    result.layers_sent = plan.stats.layers_sent if result.source == "head" else len(plan.send or ())
    trace.mark(run.name, "confirm-start")
    try:
        if run.lost:
            raise NodeError(run.name, run.lost)
        if run.exit_code != 0:
            raise load_failure(run.conn, run.exit_code, "\n".join(run.stderr_tail))
        m = _LOADED.search(run.stdout)
        loaded = m.group(1) if m else None
        if loaded != image.id:
            raise NodeError(run.name, f"docker load produced image {loaded or '(no ID printed)'}, "
                            f"not {image.id}")
        if run.confirmed != 0:  # its command did not tag it (or could not): ask, for the reason
            confirm_on_node(run.conn, image)
    except NodeError as e:
        plan.fail(e)
    return _done(plan, progress)


def _done(plan: NodePlan, progress: PushProgress) -> PushResult:
    result = plan.result
    trace.mark(result.node, f"done {result.status}")
    result.seconds = time.monotonic() - plan.start
    progress.finished(result)
    return result

