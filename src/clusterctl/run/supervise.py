"""Follow a running job, fail fast, tear down, honour Ctrl-C.

The pain this module exists for (FIELD-NOTES §3): one node dies and the others
hang until a 30-minute NCCL/gloo timeout; a launcher reports success although a
peer failed; the rank that failed first is buried in the logs.  So:

* every node has a *waiter* (``docker wait`` over SSH: the exit code the moment
  the container ends) and a *prober* (a periodic ``docker inspect`` whose every
  call is bounded in time: a node whose link is down never answers, and nothing
  here may wait on it without a deadline);
* the first non-zero exit or lost node ends the follow; every other container
  of the run is stopped in parallel: SIGTERM, then SIGKILL after
  ``Settings.fail_grace`` (1 s: the run is doomed, see :class:`Settings`);
  Ctrl-C, SIGTERM and a hang give ``Settings.stop_grace`` (3 s).  Each node's
  stop is written on a channel opened while the run started
  (:class:`~clusterctl.cluster.containers.StopChannel`: a shell on the node
  waiting on its stdin), not a new SSH session; a new one only where that
  channel is missing or broke;
* with the tree on (:func:`clusterctl.cluster.transport.tree.enabled`: ``ssh.tree: true``,
  or ``auto`` from 16 nodes) all of that goes through ONE connection from this machine
  (:mod:`clusterctl.run.treefollow`): every node's output, ``docker wait`` and signs of life
  come through the tree, this machine probes only the tree's root, and the stop is one
  more tree call; a node the tree can no longer carry gets its own follower (from the line
  after the last that came), waiter and prober, as above;
* the failure reported is the one that happened FIRST by time - the
  container's own ``FinishedAt`` on its node, or a lost node's last sign of
  life - not the first one noticed, nor the first node in the inventory.

With a hang timeout (``Settings.hang_timeout``), the supervisor also watches the
merged output: when no rank has written a line for that long, the run is *hung*
(before the job has started - its first line, or the first line
``Settings.hang_start_line`` matches - the silence allowed is
``Settings.hang_start_timeout``: a slow start is not a hang, see :func:`silence`):
the caller's ``on_hang`` (:func:`clusterctl.run.watchdog.dump_stacks`) dumps and
compares every rank's stacks while the containers still run, then every container
is stopped.  Every line is also given to :class:`clusterctl.run.suspicious.Scanner`:
a run whose containers all exit 0 after a collective-library error in its output
is *suspicious*, not succeeded.

Exit status of a run: 0 when every container exited 0 and no collective error was
seen; the first failure's exit code; ``NODE_LOST_EXIT`` (255, as ssh reports a
lost connection) when the first failure is a node that stopped answering;
``HANG_EXIT`` (124) when the watchdog found the run hung; ``SUSPICIOUS_EXIT``
(125) when every container exited 0 but the output shows a collective-library
error; 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, after stopping every container.

Contract: :class:`Supervisor` (``run()`` -> :class:`Outcome`), the pure
:func:`failures_by_time` / :func:`first_failure` / :func:`run_exit_code` /
:func:`summary_lines`, and :func:`stop_run` (``clusterctl stop``).  The docker
commands on the nodes live in :mod:`clusterctl.cluster.containers`, the
deadlines in :mod:`clusterctl.core.deadline`.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial

from clusterctl.cluster.containers import (
    ContainerGone,
    ContainerState,
    NodeStop,
    StopChannel,
    inspect_and_remove,
    inspect_containers,
    stop_containers,
    stop_nodes,
    wait_container,
)
from clusterctl.cluster.runtime import runtime_of
from clusterctl.cluster.transport import Cluster, NodeConnection, sshd_answers, tree
from clusterctl.core import exitcodes
from clusterctl.core.deadline import bounded
from clusterctl.run import flight, hints, records, suspicious
from clusterctl.run.logs import (
    DRAIN_SECONDS,
    Merger,
    Source,
    keep_stopped_output,
    secret_names,
    start_followers,
    stop_redact,
)
from clusterctl.run.spool import Spool
from clusterctl.run.treefollow import TreeFollow
from clusterctl.run.watchdog import HANG_EXIT, HangReport

NODE_LOST_EXIT = exitcodes.NODE_LOST  # 255
INTERRUPTED_EXIT = exitcodes.INTERRUPTED  # 130
TERMINATED_EXIT = exitcodes.TERMINATED  # 143


def ping(conn: NodeConnection) -> None:
    """One SSH round trip answered by the node's sshd itself (no process is started there).

    A global request with want-reply (OpenSSH answers it even when it does not
    know it: REQUEST_FAILURE is an answer too); raises when the connection died.
    Unbounded by itself: call it through :func:`bounded`.
    """
    transport = conn.transport
    transport.global_request("keepalive@openssh.com", wait=True)
    if not transport.is_active():
        raise ConnectionError("the SSH connection was lost")


@dataclass(frozen=True)
class Failure:
    """A container that exited non-zero on its own, or a node that stopped answering."""

    node: str
    rank: int
    kind: str  # "exit" | "lost"
    exit_code: int
    time: float  # epoch seconds when it happened (node's FinishedAt / last sign of life)
    reason: str = ""

    @property
    def when(self) -> datetime:
        return datetime.fromtimestamp(self.time, timezone.utc)


def first_failure(failures) -> Failure | None:
    """The failure that happened first by time (ties: the lower rank)."""
    return min(failures, key=lambda f: (f.time, f.rank), default=None)


def failures_by_time(observed: list[Failure], states: dict[str, ContainerState | None],
                     ranks: dict[str, int], cut: float) -> list[Failure]:
    """Every failure of a run, each timed by the clock of record.

    ``observed``: failures noticed while following (exit events timed when the
    news arrived, lost nodes timed by their last sign of life).  ``states``: each
    node's container after the teardown (``docker inspect``).  An exit is timed
    by the container's own FinishedAt, so a rank that failed first on a slow
    node still comes first.  A container that exited non-zero on its own before
    ``cut`` (when the teardown began) but whose news had not arrived yet is a
    failure too; one that ended after ``cut`` was stopped by us and is not.
    """
    timed: list[Failure] = []
    for f in observed:
        st = states.get(f.node)
        if f.kind == "exit" and st is not None and st.finished is not None and not st.running:
            f = Failure(f.node, f.rank, f.kind, f.exit_code, st.finished.timestamp(), f.reason)
        timed.append(f)
    known = {f.node for f in observed}
    for node, st in states.items():
        if node in known or st is None or st.running or not st.exit_code or st.finished is None:
            continue
        if st.finished.timestamp() <= cut:
            timed.append(Failure(node, ranks.get(node, -1), "exit", st.exit_code, st.finished.timestamp()))
    return timed


def run_exit_code(first: Failure | None, interrupted: str | None = None) -> int:
    """The run's exit status (see the module docstring)."""
    if interrupted == "SIGINT":
        return INTERRUPTED_EXIT
    if interrupted == "SIGTERM":
        return TERMINATED_EXIT
    if first is None:
        return 0
    if first.kind == "lost":
        return NODE_LOST_EXIT
    return first.exit_code if 0 < first.exit_code < 256 else 1


@dataclass
class Settings:
    """Timing knobs; defaults suit a LAN cluster (a lost node is declared within ~15 s)."""

    probe_interval: float = 2.0  # seconds between liveness probes (SSH round trips) of a node
    probe_timeout: float = 6.0  # one probe's deadline
    lost_after: float = 15.0  # no SSH answer for this long: the node is lost
    state_every: int = 5  # every Nth probe also reads the container state (backup for the waiter)
    stop_grace: int = 3  # `docker stop --time` on Ctrl-C / SIGTERM / hang: SIGTERM, then SIGKILL after this
    # `docker stop --time` when a rank failed (fail-fast): the run is doomed already (its
    # peers wait on a collective that can never complete), so the others get SIGTERM and a
    # short grace to flush, not the interactive stop's.  A program that ignores SIGTERM (a
    # python without a handler as the container's PID 1) costs exactly this long.
    fail_grace: int = 1
    stop_timeout: float = 20.0  # deadline of one node's stop call
    drain_timeout: float = 5.0  # after the end, wait for the streams' last lines until none came for this long
    hang_timeout: float | None = None  # no output from any rank for this long: the run is hung
    # before the job has started (the first line any rank writes, or the first one
    # hang_start_line matches), the silence allowed is this (None: hang_timeout)
    hang_start_timeout: float | None = None
    hang_start_line: str | None = None  # regex; None: any line but torchrun's own log lines


@dataclass
class Outcome:
    """How a followed run ended."""

    exit_code: int
    state: str  # succeeded | failed | interrupted
    first_failure: Failure | None
    failures: list[Failure]
    exit_codes: dict[str, int | None]
    containers: dict[str, ContainerState | None]
    lost: list[str] = field(default_factory=list)
    not_stopped: dict[str, str] = field(default_factory=dict)  # node -> why it could not be stopped
    teardown_seconds: float | None = None
    last_lines: dict[str, list[str]] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)  # nodes whose container the teardown stopped
    hang: HangReport | None = None  # the watchdog found the run hung
    collective_errors: list[suspicious.Finding] = field(default_factory=list)
    flight: dict[str, list[str] | str] = field(default_factory=dict)  # node -> flight recorder dumps kept
    # where the time from a failure to the teardown went (epoch seconds, this machine's
    # clock): when the follow loop saw the end, and when the stop calls returned
    noticed_at: float | None = None
    stopped_at: float | None = None
    removed: list[str] = field(default_factory=list)  # nodes whose container was removed at the end
    known_causes: dict[str, hints.Hint] = field(default_factory=dict)  # node -> its first hints line


@dataclass(frozen=True)
class _Event:
    kind: str  # "exit" | "lost" | "state"
    node: str
    exit_code: int | None = None
    at: float = field(default_factory=time.time)
    reason: str = ""
    state: ContainerState | None = None


#: Log lines torchrun (and its rendezvous) writes itself before the ranks run the job:
#: they do not say the job has started (glog style, ``W1126 09:23:57.245 77
#: torch/distributed/run.py:...``, and c10d's ``[W1126 09:23:57.245 socket.cpp:207] [c10d]``).
LAUNCHER_LOG = re.compile(r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/"
                          r"|\[[IWEF]\d{4} [\d:.]+ [^\]]*\] \[c10d\])")


def starts_clock(text: str, start_line: re.Pattern | None) -> bool:
    """Whether the output line ``text`` says the job has started: it matches ``start_line``
    (searched anywhere in the line), or without one, it is not a launcher's own log line.
    Pure."""
    if start_line is not None:
        return start_line.search(text) is not None
    return LAUNCHER_LOG.match(text) is None


def allowed_silence(settings: Settings, *, started: bool) -> float | None:
    """The silence the hang watchdog allows: ``hang_timeout`` once the job has started,
    ``hang_start_timeout`` (default: ``hang_timeout``) before.  None: no watchdog.  Pure."""
    if not settings.hang_timeout:
        return None
    if started:
        return settings.hang_timeout
    return settings.hang_start_timeout or settings.hang_timeout


def silence(now: float, last_output: float, *, started: bool, settings: Settings) -> float | None:
    """How long the run has been silent when that is at least what the watchdog allows
    (:func:`allowed_silence`): the run is hung; None while it is not.  Pure."""
    limit = allowed_silence(settings, started=started)
    silent = now - last_output
    return silent if limit and silent >= limit else None


class Supervisor:
    """Follows one run's containers until they all succeed, one fails, a node is lost or stop."""

    def __init__(self, cluster: Cluster, sources: list[Source], merger: Merger, *,
                 settings: Settings | None = None, stop_event: threading.Event | None = None,
                 stop_reason: Callable[[], str] | None = None,
                 on_hang: Callable[[float, float, bool], HangReport] | None = None,
                 remove_at_end: bool = False) -> None:
        """``on_hang(silent_for, last_output, starting)``: called once when the run is found
        hung (:func:`silence`; ``starting``: before the job had started), before the
        teardown; returns what it found.
        ``remove_at_end``: the command that reads each container's final state also removes
        it (the launch removes them anyway; one command per node less at the end of a run);
        :attr:`Outcome.removed` names the nodes where that worked."""
        self.remove_at_end = remove_at_end
        self._removed: set[str] = set()
        self.cluster = cluster
        self.sources = {s.node: s for s in sources}
        self.merger = merger
        self.settings = settings or Settings()
        self.stop_event = stop_event or threading.Event()
        # why stop_event was set: "SIGINT" (exit 130, the default) or "SIGTERM" (exit 143)
        self.stop_reason = stop_reason or (lambda: "SIGINT")
        self._events: queue.Queue[_Event] = queue.Queue()
        self._done = threading.Event()  # tells probers to end
        self._exit_codes: dict[str, int] = {}
        self._failures: list[Failure] = []
        self._lost: set[str] = set()
        self.on_hang = on_hang
        self._last_output = time.time()  # the containers are running: the silence starts now
        self._started_at: float | None = None  # the first line that says the job has started
        self._start_line = re.compile(self.settings.hang_start_line) if self.settings.hang_start_line else None
        self._hung_for: float | None = None
        self._hung_starting = False  # hung before the job had started
        self._collective: list[suspicious.Finding] = []
        self._scanner = suspicious.Scanner()
        self._hints = hints.FirstHints()  # node -> its first line with a known cause
        self._stoppers: dict[str, StopChannel] = {}  # node -> its pre-opened stop channel
        # the follow through the tree (issue 24), when the tree is on: one connection from here
        self._tree: TreeFollow | None = None
        self._followers: dict[str, threading.Thread] = {}
        merger.sink.observers.append(self._observe)

    def _observe(self, node: str, rank: int, text: str) -> None:
        """Every output line: it ends the silence, and may show a collective-library error."""
        self._last_output = time.time()
        if self._started_at is None and starts_clock(text, self._start_line):
            self._started_at = self._last_output
        if len(self._collective) < suspicious.KEEP:
            library = self._scanner.classify(node, text)
            if library is not None:
                self._collective.append(suspicious.Finding(node, rank, library, text))
        self._hints.see(node, rank, text)

    # --- threads -------------------------------------------------------------------------

    def _news(self, ev: _Event) -> None:
        """Queue an event and wake the follow loop at once (it waits for output lines)."""
        self._events.put(ev)
        self.merger.wake()

    def _wait(self, src: Source) -> None:
        """Waiter: ``docker wait`` returns the exit code as soon as the container ends.

        When it ends without one while the node still answers, the node's Docker engine
        is asked: an engine that no longer answers (it died; the container may even run on
        without it, unseen and unstoppable) makes the node lost, as a cut link does."""
        while not self._done.is_set():
            try:
                code = wait_container(self.cluster.connection(src.node), src.container)
            except ContainerGone:
                self._news(_Event("exit", src.node, exit_code=NODE_LOST_EXIT,
                                  reason="the container was removed on the node by someone else"))
                return
            except Exception:  # noqa: BLE001 - the prober judges an unreachable node
                return
            if code is not None:
                self._news(_Event("exit", src.node, exit_code=code))
                return
            why = self._engine_gone(src.node)
            if why is not None:
                self._news(_Event("lost", src.node, reason=f"its Docker engine does not answer ({why})"))
                return

    def _engine_gone(self, node: str) -> str | None:
        """Why the node's engine is gone (three tries over ~2 s), or None when it answers."""
        def ask():
            conn = self.cluster.connection(node)
            return conn.run(runtime_of(conn).version(), timeout=5)
        why = None
        for _ in range(3):
            if self._done.is_set():
                return None
            try:
                r = bounded(ask, self.settings.probe_timeout + 5, name=f"engine-{node}")
            except Exception:  # noqa: BLE001 - the node itself may be gone: the prober says so
                return None
            if r.exit_code == 0 and r.stdout.strip():
                return None
            why = (r.stderr.strip().splitlines() or [f"docker version exit {r.exit_code}"])[-1][:200]
            self._done.wait(0.7)
        return why

    def _probe(self, src: Source, seen: float | None = None) -> None:
        """Prober: a bounded SSH round trip every probe_interval; silence means lost.

        Liveness is judged at the SSH level (:func:`ping`, answered by sshd
        itself; when it goes unanswered, sshd's banner on a fresh TCP connection,
        so a link flap shorter than ``lost_after`` is no failure even while TCP
        backs off on the established connection), never by a docker command: a busy node's dockerd may take many
        seconds to answer ``docker inspect``, and that must not kill a healthy
        run.  Every ``state_every`` probes the container state is read too, as a
        backup for the waiter (its news is lost if its channel broke); that read
        may be slow or fail without consequence.  ``seen``: the node's last sign of life
        before this prober (a node taken off the tree): when its first probe goes
        unanswered, its silence is counted from then.
        """
        s = self.settings
        last_ok = seen or time.time()
        silent_since: float | None = None  # when the first unanswered probe was sent
        reason = ""
        address: list[tuple[str, int] | None] = [None]  # the node's sshd, for a fresh connection
        answered = threading.Event()
        outstanding: list[threading.Thread] = []

        def round_trip() -> None:
            try:
                conn = self.cluster.connection(src.node)
                ping(conn)
                address[0] = conn.sshd_address() or address[0]
                answered.set()
            except Exception as e:  # noqa: BLE001 - any failure to answer counts as silence
                nonlocal reason
                reason = str(e) or e.__class__.__name__

        n = 0
        while not self._done.is_set():
            n += 1
            sent = time.time()
            if not any(t.is_alive() for t in outstanding):  # one round trip at a time per node
                outstanding[:] = [threading.Thread(target=round_trip, name=f"ping-{src.node}", daemon=True)]
                answered.clear()
                outstanding[0].start()
            if answered.wait(s.probe_timeout if silent_since is None else 0):
                last_ok, silent_since, seen = time.time(), None, None
            else:
                silent_since = silent_since or min(sent, seen or sent)   # seen: its first silence only
                reason = reason or f"no reply within {s.probe_timeout:g}s"
                # After a link flap the established connection answers only at TCP's next
                # retransmission (its backoff doubles: 3, 6, 12 s ...); sshd's banner on a
                # fresh connection, tried every probe_interval / 4, is a sign of life as good
                # as a round trip, so a flap shorter than lost_after is no failure.
                if address[0] is not None and sshd_answers(address[0], s.probe_timeout,
                                                            connect_timeout=max(0.2, s.probe_interval / 4)):
                    last_ok, silent_since, seen = time.time(), None, None
            if silent_since is not None and self._tree is not None and \
                    self._tree.seen.get(src.node, 0) > silent_since:   # it spoke through the tree
                last_ok, silent_since, seen = self._tree.seen[src.node], None, None
            if silent_since is not None and time.time() - silent_since >= s.lost_after:
                self._news(_Event("lost", src.node, at=last_ok, reason=(
                    f"no reply for {time.time() - silent_since:.0f}s ({reason})")))
                return
            if n % s.state_every == 0 and silent_since is None:
                self._check_state(src)
            self._done.wait(s.probe_interval if silent_since is None else max(0.05, s.probe_interval / 4))

    # --- main loop -----------------------------------------------------------------------

    def run(self) -> Outcome:
        """Follow to the end and tear down on failure or stop; returns the Outcome."""
        if len(self.sources) > 1 and tree.enabled(self.cluster):
            self._start_tree()
        else:
            self._followers = start_followers(self.cluster, self.sources.values(), self.merger)
            for src in self.sources.values():
                self._watch(src)
                # the node's stop, opened now (see StopChannel): the teardown then writes one
                # line per node instead of starting an SSH session on each
                stopper = self._stoppers[src.node] = StopChannel(src.container)
                threading.Thread(target=stopper.open, args=(partial(self.cluster.connection, src.node),),
                                 name=f"stopchan-{src.node}", daemon=True).start()
        try:
            try:
                self._follow()
            finally:
                self._done.set()
            return self._finish(self._followers)
        finally:
            if self._tree is not None:
                self._tree.close()
            for stopper in self._stoppers.values():   # unused ones: their shells read EOF, end
                stopper.close()

    def _watch(self, src: Source, *, probe: bool = True, seen: float | None = None) -> None:
        """The node's own waiter and (``probe``) liveness prober (``seen``: see :meth:`_probe`)."""
        threading.Thread(target=self._wait, args=(src,), name=f"wait-{src.node}", daemon=True).start()
        if probe:
            threading.Thread(target=self._probe, args=(src, seen), name=f"probe-{src.node}",
                             daemon=True).start()

    def _start_tree(self) -> None:
        """The follow through the tree (:mod:`clusterctl.run.treefollow`): one tree call for
        every node's output and end, and this machine's own liveness probe of the tree's
        root only (its one connection); a node the tree loses goes on on its own connection."""
        self._tree = TreeFollow(
            self.cluster, {n: src.container for n, src in self.sources.items()}, self.merger.put,
            remove=self.remove_at_end, keep_whole=self.merger.sink.redact,
            heartbeat=self.settings.probe_interval,
            on_exit=lambda node, code: self._news(_Event("exit", node, exit_code=code)),
            on_state=lambda node, st: self._news(_Event("state", node, state=st)),
            on_fallback=self._fall_back)
        self._followers = {"(tree)": self._tree.start()}
        root = next(iter(self.sources.values()))
        threading.Thread(target=self._probe, args=(root,), name=f"probe-{root.node}", daemon=True).start()
        threading.Thread(target=self._tree_liveness, name="tree-liveness", daemon=True).start()

    def _tree_liveness(self) -> None:
        """A node whose signs of life stopped coming through the tree (each node sends one
        every ``probe_interval``) for ``lost_after`` less one probe's time is taken off it:
        this machine probes it itself, counting the silence from its last sign of life
        (:meth:`_probe`), so a lost node is named about ``lost_after`` after it went silent,
        as without the tree, and a node only the tree lost goes on."""
        s = self.settings
        quiet = max(2 * s.probe_interval, s.lost_after - s.probe_timeout)
        while not self._done.wait(s.probe_interval):
            for node, silent in self._tree.silent(quiet).items():
                self._tree.fall_back(node, f"no sign of life through the tree for {silent:.0f}s")

    def _fall_back(self, node: str, after: str, skip: int, why: str, seen: float) -> None:
        """The tree can no longer bring ``node``: its own follower (from the line after the
        last that came), waiter and prober (silence counted from ``seen``, its last sign of
        life through the tree), as without the tree (the root has its prober already)."""
        if self._done.is_set():
            return
        src = self.sources[node]
        self._followers[node] = start_followers(self.cluster, [src], self.merger,
                                                after={node: (after, skip)})[node]
        self._watch(src, probe=node != next(iter(self.sources)), seen=seen)

    def _follow(self) -> None:
        while True:
            self.merger.drain(timeout=0.1, budget=DRAIN_SECONDS)
            self._handle_events()
            if self.stop_event.is_set() or self._failures:
                return
            if len(self._exit_codes) == len(self.sources):
                return  # everyone exited 0
            hung = silence(time.time(), self._last_output, started=self._started_at is not None,
                           settings=self.settings)
            if hung is not None:
                self._hung_for, self._hung_starting = hung, self._started_at is None
                return  # hung: nobody wrote anything for the silence allowed

    def _check_state(self, src: Source) -> None:
        """Backup exit detection: the container's state, read in the background."""
        def read() -> None:
            try:
                states = inspect_containers(self.cluster.connection(src.node), [src.container],
                                            timeout=self.settings.probe_timeout * 3)
            except Exception:  # noqa: BLE001 - slow or failing: the next round tries again
                return
            if states:  # nothing found may just be a busy daemon: the waiter sees a removal
                self._news(_Event("state", src.node, state=states[0]))

        threading.Thread(target=read, name=f"state-{src.node}", daemon=True).start()

    def _handle_events(self) -> None:
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                return
            self._handle(ev)

    def _handle(self, ev: _Event) -> None:
        src = self.sources[ev.node]
        if ev.node in self._exit_codes or ev.node in self._lost:
            return
        if ev.kind == "state":
            st = ev.state
            if st is None or st.running or st.exit_code is None:
                return
            ev = _Event("exit", ev.node, exit_code=st.exit_code, at=(st.finished or datetime.now(timezone.utc)).timestamp())
        if ev.kind == "exit":
            self._exit_codes[ev.node] = ev.exit_code
            if ev.exit_code != 0:
                self._failures.append(Failure(src.node, src.rank, "exit", ev.exit_code, ev.at, ev.reason))
        elif ev.kind == "lost":
            self._lost.add(ev.node)
            self._failures.append(Failure(src.node, src.rank, "lost", NODE_LOST_EXIT, ev.at, ev.reason))

    # --- the end -------------------------------------------------------------------------

    def _finish(self, followers: dict[str, threading.Thread]) -> Outcome:
        s = self.settings
        cut = time.time()  # containers that ended before this ended on their own
        hang = None
        if self._hung_for is not None and self.on_hang is not None:
            try:  # while the ranks still run; whatever goes wrong, the run is still torn down
                hang = self.on_hang(self._hung_for, self._last_output, self._hung_starting)
            except Exception as e:  # noqa: BLE001 - reported in the summary, never a traceback
                hang = HangReport(timeout=allowed_silence(s, started=not self._hung_starting) or 0.0,
                                  silent_for=self._hung_for, last_output=self._last_output,
                                  detected=time.time(), starting=self._hung_starting,
                                  start_line=s.hang_start_line, error=str(e) or e.__class__.__name__)
        teardown = bool(self._failures) or self.stop_event.is_set() or self._hung_for is not None
        not_stopped: dict[str, str] = {}
        to_stop: list[str] = []
        t0 = time.monotonic()
        if teardown:
            to_stop = [n for n in self.sources if n not in self._exit_codes and n not in self._lost]
            fail_fast = self._hung_for is None and not self.stop_event.is_set()
            not_stopped = stop_containers(self.cluster, {n: self.sources[n].container for n in to_stop},
                                          grace=s.fail_grace if fail_fast else s.stop_grace,
                                          timeout=s.stop_timeout, ready=dict(self._stoppers))
        teardown_seconds = time.monotonic() - t0 if teardown else None
        stopped_at = time.time() if teardown else None
        self._join(followers, s.drain_timeout)
        states = self._final_states()
        # News that arrives now is about containers we stopped (or late news that
        # failures_by_time finds from the states): exit codes only, no failures.
        self._events = queue.Queue()
        ranks = {n: src.rank for n, src in self.sources.items()}
        failures = failures_by_time(self._failures, states, ranks, cut)
        first = first_failure(failures)
        for f in failures:
            if f.kind == "exit":
                self._exit_codes.setdefault(f.node, f.exit_code)
        interrupted = self.stop_reason() if self.stop_event.is_set() else None
        code = run_exit_code(first, interrupted)
        exit_codes = {n: self._exit_codes.get(n, st.exit_code if st else None) for n, st in states.items()}
        state = "interrupted" if interrupted else ("succeeded" if code == 0 else "failed")
        if self._hung_for is not None and not interrupted:
            # what the stopped containers did after the hang was declared is our teardown
            code, state, first, failures = HANG_EXIT, "hung", None, []
        elif code == 0 and not interrupted and self._collective:
            code, state = suspicious.SUSPICIOUS_EXIT, "suspicious"
        for n in self._lost:
            not_stopped.setdefault(n, "node unreachable: its container may still be running")
        failed_first = {f.node for f in failures if f.time <= cut}
        return Outcome(code, state, first, failures, exit_codes, states, sorted(self._lost),
                       not_stopped, teardown_seconds,
                       {n: list(d) for n, d in self.merger.sink.last.items()},
                       [n for n in to_stop if n not in failed_first],
                       hang, list(self._collective), noticed_at=cut, stopped_at=stopped_at,
                       removed=sorted(self._removed), known_causes=dict(self._hints.found))

    def _join(self, followers: dict[str, threading.Thread], timeout: float) -> None:
        """Write the log streams' last lines (a lost node's never come).

        The streams may still hold a backlog when the containers have ended (the merged
        output is written more slowly than the nodes printed: a chatty job, a slow
        terminal; the backpressure of :class:`~clusterctl.run.logs.Merger` kept it on the
        nodes), so this waits as long as lines keep coming, and gives up on the streams
        only after ``timeout`` seconds in which none arrived."""
        def pending() -> list:
            # (a copy: a node falling back from the tree adds its follower meanwhile); the
            # tree's call is pending while it still carries a node not lost (a lost node's
            # hop lingers until its ssh gives up: nothing more of it comes that way)
            alive = [t for node, t in list(followers.items())
                     if node not in self._lost and node != "(tree)" and t.is_alive()]
            if self._tree is not None and followers.get("(tree)") is not None and \
                    followers["(tree)"].is_alive() and self._tree.carrying() - self._lost:
                alive.append(followers["(tree)"])
            return alive
        last_line = time.monotonic()
        while pending() and time.monotonic() - last_line < timeout:
            if self.merger.drain(timeout=0.05, budget=DRAIN_SECONDS):
                last_line = time.monotonic()
        # the rest of the queue: the streams have ended, or are silent
        while self.merger.drain(budget=DRAIN_SECONDS):
            pass

    def _final_states(self) -> dict[str, ContainerState | None]:
        """Every reachable node's container state at the end (bounded; lost nodes: None)."""
        reachable = [n for n in self.sources if n not in self._lost]

        def read(conn: NodeConnection, names) -> list[ContainerState]:
            if not self.remove_at_end:
                return inspect_containers(conn, names, timeout=self.settings.probe_timeout)
            found, removed = inspect_and_remove(conn, names, timeout=self.settings.probe_timeout)
            if removed:
                self._removed.add(conn.name)
            return found

        def one(node: str) -> ContainerState | None:
            found = bounded(lambda: read(self.cluster.connection(node), [self.sources[node].container]),
                            self.settings.probe_timeout, name=f"final-{node}")
            return found[0] if found else None

        states: dict[str, ContainerState | None] = dict.fromkeys(self.sources)
        if self._tree is not None:   # read (and removed) through the tree as each one ended
            states.update(self._tree.states)
            self._removed.update(self._tree.removed)
            reachable = [n for n in reachable if n not in self._tree.states]
        with ThreadPoolExecutor(max_workers=max(1, len(reachable))) as pool:
            futures = {n: pool.submit(_quiet, one, n) for n in reachable}
            for n, fut in futures.items():
                states[n] = fut.result()
        return states


def _quiet(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - an unreachable node has no state; the caller reports it
        return None


def summary_lines(outcome: Outcome, *, tail: int = 20) -> list[str]:
    """The end-of-run report: the first failure (node, rank, exit code, its last lines), then the rest."""
    first = outcome.first_failure
    if outcome.state == "hung":
        lines = outcome.hang.summary_lines() if outcome.hang else ["HANG: no rank wrote output "
                                                                    "for the hang timeout"]
        return lines + [f"every container of the run was stopped{_teardown_note(outcome)}; "
                        f"exit status {HANG_EXIT} means hung"] + _not_stopped_lines(outcome)
    if outcome.state == "suspicious":
        return suspicious.summary_lines(outcome.collective_errors)
    if first is None:
        if outcome.state == "interrupted":
            return ["run interrupted: every container of the run was stopped"
                    + _teardown_note(outcome)] + _not_stopped_lines(outcome)
        return []
    when = first.when.strftime("%H:%M:%S.%f")[:-3]
    if first.kind == "lost":
        head = (f"FIRST FAILURE: {first.node}[{first.rank}] stopped answering (last seen {when} UTC): "
                f"{first.reason}; exit status {NODE_LOST_EXIT} means a lost node")
    else:
        head = f"FIRST FAILURE: {first.node}[{first.rank}] exited {first.exit_code} at {when} UTC"
    lines = [head]
    last = outcome.last_lines.get(first.node, [])[-tail:]
    if last:
        lines.append(f"last {len(last)} lines of {first.node}[{first.rank}]:")
        lines += [f"  {t}" for t in last]
    lines += hints.hint_lines(outcome.known_causes.get(first.node), last)
    others = [f for f in sorted(outcome.failures, key=lambda f: f.time) if f is not first and f.node != first.node]
    if others:
        lines.append("then: " + ", ".join(
            f"{f.node}[{f.rank}] " + ("lost" if f.kind == "lost" else f"exited {f.exit_code}") for f in others))
    lines.append("every other container of the run was stopped" + _teardown_note(outcome))
    return lines + _not_stopped_lines(outcome)


def _teardown_note(outcome: Outcome) -> str:
    return "" if outcome.teardown_seconds is None else f" (teardown {outcome.teardown_seconds:.1f}s)"


def _not_stopped_lines(outcome: Outcome) -> list[str]:
    return [f"NOT STOPPED on {node}: {why}" for node, why in sorted(outcome.not_stopped.items())]


# --- `clusterctl stop`: stop and remove a run's containers everywhere, keep their logs -------

def stop_run(cluster: Cluster, record: records.RunRecord, *, grace: int = 3, timeout: float = 30.0,
             by: str | None = None) -> dict[str, NodeStop]:
    """Stop and remove ``record``'s containers on every node (idempotent), then update runs/.

    Each node's output is saved to ``runs/<id>/<node>.log`` first (when launch
    was not following it) so ``clusterctl logs`` still works after the
    containers are gone; flight recorder dumps (nccl) are collected into
    ``runs/<id>/flight/<node>/`` and the run's directory on the node removed.  A node that
    does not answer within ``timeout`` is reported in its NodeStop.error.  ``by``: who
    stops it, for the record.  A run whose launch was killed (the record says running, its
    launch process is gone) gets its logs rewritten whole from the containers: the launch's
    files end where it died.
    """
    orphaned = records.launcher_died(record) or record.state == "unknown"
    names = {n.name for n in cluster.inventory.nodes}
    targets = [n.node for n in record.nodes if n.node in names]

    with Spool() as spool:      # the containers' output, on disk while it is merged
        results: dict[str, NodeStop] = {}
        stopped = stop_nodes(cluster, record.run_id, targets, grace=grace, timeout=timeout,
                             writer=spool.writer, secret_names=secret_names(record)) if targets else {}
        for node, r in stopped.items():
            results[node] = r if isinstance(r, NodeStop) else NodeStop(node, error=getattr(r, "reason", str(r)))
        for n in record.nodes:
            results.setdefault(n.node, NodeStop(n.node, error="not in this inventory"))
        keep_stopped_output(record, spool, [n for n, r in results.items() if r.containers],
                            replace=orphaned,
                            redact=stop_redact(record, {n: r.env for n, r in results.items()}))
    record.flight.update(flight.collect(cluster, record, skip=[n for n, r in results.items() if r.error]))
    records.record_stop(record, {n: r.containers for n, r in results.items()},
                        was_running=any(r.was_running for r in results.values()), by=by,
                        stopped={n: r.was_running for n, r in results.items()})
    return results
