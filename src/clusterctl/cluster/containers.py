"""A run's containers on the nodes: every container command clusterctl runs on a node over SSH
to find, inspect, wait for, read, stop or remove them, each argv from the node's runtime
(:func:`clusterctl.cluster.runtime.runtime_of`: ``docker`` today; the shell scripts here still
spell ``docker`` themselves).

Containers of a run carry labels (:data:`RUN_LABEL`, :data:`JOB_LABEL`,
:data:`NODE_LABEL`, :data:`RANK_LABEL`) set by the launch plan; everything here
finds them by those labels or by name, on one node's connection
(:class:`clusterctl.cluster.transport.NodeConnection`) or on many nodes of a
``Cluster`` in parallel, each call bounded in time (a node whose link is down
never answers).  Nothing here knows about run records or merged logs.

Contract:

* one node: :func:`inspect_containers`, :func:`find_containers`,
  :func:`wait_container` (:class:`ContainerGone`), :func:`follow_logs`,
  :func:`fetch_logs`, :func:`exec_in_container` (the hang watchdog's stack dumps),
  :func:`copy_out` / :func:`remove_dir` (a run's mounted directory on the node),
  :func:`stop_node` (:class:`NodeStop`);
* many nodes: :func:`stop_containers` (given each node's :class:`StopChannel`, a stop is one
  line written on a channel opened while the run started), :func:`remove_run_containers`,
  :func:`stop_nodes` (``clusterctl stop``: through the tree from 16 nodes on);
* pure: :func:`parse_docker_time`, :func:`state_from_inspect`
  (:class:`ContainerState`), :func:`docker_logs_argv`, :func:`split_timestamp`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import BinaryIO

from pydantic import BaseModel

from clusterctl.cluster.runtime import ContainerRuntime, node_runtime, runtime_for, runtime_of
from clusterctl.cluster.transport import STREAM_WINDOW_SIZE, Cluster, NodeConnection, tree
from clusterctl.core.deadline import bounded
from clusterctl.core.errors import NodeError
from clusterctl.core.lines import LineSplitter
from clusterctl.core.scripts import script_text
from clusterctl.core.secretnames import ENV_NAME
from clusterctl.core.text import digits

LABEL_PREFIX = "io.clusterctl."
RUN_LABEL = f"{LABEL_PREFIX}run"
JOB_LABEL = f"{LABEL_PREFIX}job"
NODE_LABEL = f"{LABEL_PREFIX}node"
RANK_LABEL = f"{LABEL_PREFIX}rank"
ATTEMPT_LABEL = f"{LABEL_PREFIX}attempt"  # which attempt of the run (0: the first)

_DOCKER_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)\Z")
_GO_TIME = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d(?:\.\d+)?) ([+-]\d\d)(\d\d)(?: [A-Za-z]+)?")
_TIMESTAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z ?(.*)\Z", re.S)
_NO_SUCH = "no such container"   # docker: "No such container: X"; Podman: "... no such container"


def _gone(stderr: str) -> bool:
    """True when a runtime's ``stderr`` says the container does not exist (either runtime)."""
    return _NO_SUCH in stderr.lower()


# --------------------------------------------------------------------------- states

def parse_docker_time(value: str | None) -> datetime | None:
    """A runtime's container time -> aware datetime; None for its zero time or another form.
    Docker's is RFC 3339 with nanoseconds; Podman's ``{{.State.FinishedAt}}`` is Go's
    time.String() ("2026-11-29 05:36:38.684576814 +0000 UTC"), read as the same."""
    if not value or value.startswith("0001-01-01"):
        return None
    go = _GO_TIME.fullmatch(value)
    if go:
        value = f"{go[1]}T{go[2]}{go[3]}:{go[4]}"
    m = _DOCKER_TIME.match(value)
    if not m:
        return None
    frac = (m.group(2) or "0")[:6].ljust(6, "0")
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(f"{m.group(1)}.{frac}{tz}")


class ContainerState(BaseModel):
    """What ``docker inspect`` says about one container of a run, on one node."""

    node: str
    name: str
    status: str  # created | running | exited | dead | ... (docker's words)
    exit_code: int | None = None
    started: datetime | None = None
    finished: datetime | None = None
    rank: int | None = None

    @property
    def running(self) -> bool:
        return self.status in ("running", "restarting", "paused", "created")


def state_from_inspect(node: str, data: dict) -> ContainerState:
    """One element of ``docker inspect`` JSON -> ContainerState."""
    st = data.get("State") or {}
    labels = (data.get("Config") or {}).get("Labels") or {}
    status = st.get("Status", "unknown")
    rank = labels.get(RANK_LABEL)
    return ContainerState(
        node=node,
        name=data.get("Name", "").lstrip("/"),
        status=status,
        exit_code=None if status in ("running", "created", "restarting") else st.get("ExitCode"),
        started=parse_docker_time(st.get("StartedAt")),
        finished=parse_docker_time(st.get("FinishedAt")),
        rank=int(rank) if rank and digits(rank) else None,
    )


def env_from_inspect(data: dict) -> dict[str, str]:
    """A container's environment (``Config.Env``) from one element of ``docker inspect`` JSON:
    the values its run's secrets have, for masking its output on this machine (held in
    memory only, never shown or stored)."""
    items = (data.get("Config") or {}).get("Env") or []
    return {k: v for k, _, v in (str(item).partition("=") for item in items)}


def container_env(conn: NodeConnection, names: list[str], *, timeout: float | None = 20.0,
                  only: Collection[str] | None = None) -> dict[str, str]:
    """The environment of containers ``names`` on ``conn``'s node, merged (:func:`env_from_inspect`),
    only the variables ``only`` names when given; empty when none is there.  Over the node's
    own connection, as its output is; of the containers, only their environment is read."""
    if not names:
        return {}
    res = conn.run(runtime_of(conn).inspect(names, format="{{json .Config.Env}}"), timeout=timeout)
    env: dict[str, str] = {}
    for line in (res.stdout or "").splitlines():
        try:
            items = json.loads(line)
        except ValueError:
            continue
        if isinstance(items, list):
            env.update(env_from_inspect({"Config": {"Env": items}}))
    return env if only is None else {k: v for k, v in env.items() if k in only}


def inspect_containers(conn: NodeConnection, names: list[str], *,
                       timeout: float | None = 20.0) -> list[ContainerState]:
    """``docker inspect`` of ``names`` on ``conn``'s node (missing ones are left out)."""
    if not names:
        return []
    res = conn.run(runtime_of(conn).inspect(names), timeout=timeout)
    try:
        data = json.loads(res.stdout or "[]")
    except ValueError:
        data = []
    return [state_from_inspect(conn.node.name, d) for d in data]


#: ``docker inspect`` of the containers named after it, then their removal; ``REMOVED`` on
#: stderr says the removal worked (the inspect's JSON is on stdout either way).
_INSPECT_REMOVE = ('"$RT" inspect --type container "$@"; "$RT" rm --force "$@" >/dev/null 2>&1 '
                   '&& echo @@clusterctl-removed >&2')


def inspect_and_remove(conn: NodeConnection, names: list[str], *, timeout: float | None = 20.0
                       ) -> tuple[list[ContainerState], bool]:
    """The final states of ``names`` on ``conn``'s node and their removal, in one command
    (the end of a followed run): (states, whether they were removed)."""
    if not names:
        return [], True
    res = conn.run(["sh", "-c", runtime_of(conn).script(_INSPECT_REMOVE), "sh", *names], timeout=timeout)
    try:
        data = json.loads(res.stdout or "[]")
    except ValueError:
        data = []
    return [state_from_inspect(conn.node.name, d) for d in data], "@@clusterctl-removed" in res.stderr


def find_containers(conn: NodeConnection, run_id: str, *,
                    timeout: float | None = 20.0) -> list[ContainerState]:
    """The containers labelled ``io.clusterctl.run=<run_id>`` on ``conn``'s node, any state."""
    res = conn.run(runtime_of(conn).ps(labels={RUN_LABEL: run_id}), timeout=timeout, check=True)
    return inspect_containers(conn, res.stdout.split(), timeout=timeout)


class ContainerGone(Exception):
    """The container no longer exists on its node (someone removed it)."""


def wait_container(conn: NodeConnection, name: str) -> int | None:
    """Block until ``name`` ends on ``conn``'s node (``docker wait``): its exit code.

    None when docker could not tell (the caller reads the state another way);
    ContainerGone when the container does not exist.  Unbounded: the container
    may run for days, so call it from a thread of its own.
    """
    res = conn.run(runtime_of(conn).wait(name))
    if res.exit_code == 0 and res.stdout.strip():
        return int(res.stdout.split()[-1])
    if _gone(res.stderr):
        raise ContainerGone(name)
    return None


# --------------------------------------------------------------------------- output

def docker_logs_argv(container: str, *, follow: bool = False, tail: int | None = None,
                     timestamps: bool = False, since: str | None = None,
                     runtime: ContainerRuntime | None = None) -> list[str]:
    """The container's output (``runtime``: the node's, default the default runtime's)."""
    return (runtime or runtime_for()).logs(container, follow=follow, tail=tail, since=since,
                                           timestamps=timestamps)


def split_timestamp(line: str) -> tuple[str, str]:
    """A ``docker logs --timestamps`` line -> (sortable key, text).

    Docker trims trailing zeros of the nanoseconds (RFC 3339 nano), so the raw
    strings do not sort; the key pads the fraction to nine digits.
    """
    m = _TIMESTAMPED.match(line)
    if not m:
        return "", line
    return f"{m.group(1)}.{(m.group(2) or '').ljust(9, '0')}", m.group(3)


def follow_logs(conn: NodeConnection, container: str, on_line: Callable[[str], None], *,
                tail: int | None = None, keep_whole: Sequence[str] = ()) -> None:
    """Stream ``docker logs --follow`` of ``container`` to ``on_line`` until it ends.

    A small SSH window (STREAM_WINDOW_SIZE): while ``on_line`` waits (the merged
    output's backpressure), at most that much output waits here; the rest stays in the
    container's log on the node.  ``keep_whole``: strings a cut of a very long line must not
    split (the run's secrets, masked line by line downstream)."""
    conn.stream(docker_logs_argv(container, follow=True, tail=tail, runtime=runtime_of(conn)), on_line,
                window_size=STREAM_WINDOW_SIZE, keep_whole=keep_whole)


def follow_logs_after(conn: NodeConnection, container: str, on_line: Callable[[str], None], *, after: str,
                      skip: int = 0, keep_whole: Sequence[str] = ()) -> None:
    """:func:`follow_logs` resumed: only the lines after the one whose timestamp key
    (:func:`split_timestamp`) is ``after``, the ``skip`` lines with exactly that key having
    come already (docker's ``--since`` includes its own instant).  ``after`` "": from the
    first line.  A followed run whose node falls back from the tree to its own connection
    goes on this way, each line once."""
    left = [skip]

    def take(line: str) -> None:
        key, text = split_timestamp(line)
        if key and after and key <= after:
            if key < after or left[0] > 0:
                left[0] -= key == after
                return
        on_line(text)
    since = f"{after}Z" if after else None
    conn.stream(docker_logs_argv(container, follow=True, timestamps=True, since=since,
                                 runtime=runtime_of(conn)), take,
                window_size=STREAM_WINDOW_SIZE, keep_whole=keep_whole)


def fetch_logs(conn: NodeConnection, container: str, *, tail: int | None = None,
               on_line: Callable[[str, str], None] | None = None) -> list[tuple[str, str]]:
    """(timestamp key, text) of every line a container wrote so far, both streams.  With
    ``on_line`` each goes to it as it arrives and none is kept (the list is empty): the
    output of a long run may not fit in memory."""
    lines: list[tuple[str, str]] = []
    take = on_line or (lambda key, text: lines.append((key, text)))

    def on_chunk(chunk: str) -> None:
        for x in chunk.splitlines():
            take(*split_timestamp(x))
    conn.stream(docker_logs_argv(container, tail=tail, timestamps=True, runtime=runtime_of(conn)), on_chunk)
    return lines


def exec_in_container(conn: NodeConnection, container: str, argv: list[str], *, timeout: float = 60.0):
    """``docker exec CONTAINER argv...`` on the node (argv, no shell); the CommandResult, unchecked."""
    return conn.run(runtime_of(conn).exec(container, argv), timeout=timeout)


def copy_out(conn: NodeConnection, path: str, *, timeout: float = 60.0) -> bytes | None:
    """The files under directory ``path`` on the node as a base64 tar (None when it does not
    exist); used to collect what containers wrote into a mounted directory."""
    res = conn.run(["sh", "-c", 'test -d "$1" || exit 3; tar -C "$1" -cf - . | base64 -w0', "sh", path],
                   timeout=timeout)
    if res.exit_code == 3:
        return None
    res.check()
    return res.stdout.strip().encode("ascii")


def remove_dir(conn: NodeConnection, path: str, *, timeout: float = 30.0) -> None:
    """``rm -rf PATH`` on the node (argv; the caller passes a path it made and checked with
    :func:`path_problem`)."""
    conn.run(["rm", "-rf", "--", path], timeout=timeout, check=True)


#: ``sh -c PATH_CHECK sh TOP PATH``: why PATH may not be acted on (exit 4), or nothing.
_PATH_CHECK = script_text("clusterctl.cluster", "path-check.sh")


def path_problem(conn: NodeConnection, top: str, path: str, *, timeout: float = 30.0) -> str | None:
    """Why ``path`` (a directory clusterctl derived under ``top`` on a node other users may
    share) must not be read or removed: a part of it below ``top`` is a link, not a
    directory, another user's, or writable by others without the sticky bit (someone else
    could have planted or could swap it); None when it is safe or not there."""
    res = conn.run(["sh", "-c", _PATH_CHECK, "sh", top, path], timeout=timeout)
    if res.exit_code == 4:
        return res.stdout.strip() or f"{path}: refused"
    res.check()
    return None


# --------------------------------------------------------------------------- stop and remove

def _last_line(res) -> str:
    text = res.stderr.strip()
    return text.splitlines()[-1] if text else f"exit {res.exit_code}"


#: The stop channel's shell (:class:`StopChannel`): it waits on its stdin; a line that is a
#: whole number of seconds runs ``docker stop --time <it> <container>`` in its place (exec:
#: the channel's exit status and stderr are docker's).  EOF (clusterctl ended or lost its
#: connection, the channel was closed) or any other line ends it with status
#: :data:`_NOT_STOPPED` and stops NOTHING.  Constant text: the container is ``$1``, the
#: grace arrives as data and is used only after the digits check.  (Signalling the init
#: directly from here, before the docker CLI starts, was measured too: no clear gain at 16
#: nodes on 2 shared cores, so not kept.)
_STOP_SCRIPT = ('IFS= read -r g || exit 97; case $g in ""|*[!0-9]*) exit 97;; esac; '
                'exec "$RT" stop --time "$g" "$1"')
_NOT_STOPPED = 97
_SEND_TIMEOUT = 2.0  # seconds one stop line may wait to be written (a stalled connection)


class StopChannel:
    """One node's stop, opened before it is needed: a ``sh`` on the node waiting on the
    channel's stdin, so stopping the container is one line written on an open channel
    instead of a new SSH session (a session's start on a busy node cost 0.1 to 0.66 s of
    the fail-fast teardown: issue 12), then the usual ``docker stop`` on the node.

    Single use.  :meth:`open` (from a thread of its own: it may wait on the node), then
    either :meth:`send` and :meth:`result` (or :meth:`stop`, both) or :meth:`close`; the
    node's shell ends either way (EOF on its stdin never stops the container: a crashed or
    disconnected clusterctl leaves the run running).  Nothing here is the only way to stop:
    :meth:`result` answers None whenever the channel cannot be trusted to have stopped it,
    and the caller then uses a new channel (:func:`stop_containers` does).
    """

    def __init__(self, container: str) -> None:
        self.container = container
        self.conn = None
        self._chan = None
        self._lock = threading.Lock()
        self._done = False  # send() or close() called: a channel opened later is closed at once
        self._sent = None  # (channel, grace) once the line was written

    @property
    def argv(self) -> list[str]:
        return self.argv_for(runtime_for())

    def argv_for(self, runtime: ContainerRuntime) -> list[str]:
        """The waiting shell's argv on a node of ``runtime``."""
        return ["sh", "-c", runtime.script(_STOP_SCRIPT), "sh", self.container]

    def open(self, connect: Callable[[], object]) -> bool:
        """Start the waiting shell on the connection ``connect()`` gives; False when that
        failed or the stopper was used or closed meanwhile (its stop then uses a new channel)."""
        try:
            conn = connect()
            chan = conn.exec_channel(self.argv_for(runtime_of(conn)))
        except Exception:  # noqa: BLE001 - no pre-opened channel: stop() says None
            return False
        with self._lock:
            if not self._done:
                self.conn, self._chan = conn, chan
                return True
        _close_channel(chan)
        return False

    def send(self, grace: int) -> bool:
        """Write the stop line (quick: no round trip); False when the channel was not open or
        broke (then :meth:`result` says None and the caller stops the container another way).
        The teardown writes every node's line first, then waits for them all."""
        with self._lock:
            chan, self._chan, self._done = self._chan, None, True
        if chan is None or self.conn is None:
            return False
        if chan.closed or chan.exit_status_ready():  # its shell is gone (should not happen)
            _close_channel(chan)
            return False
        try:
            chan.settimeout(_SEND_TIMEOUT)
            chan.sendall(f"{int(grace)}\n".encode("ascii"))
        except Exception:  # noqa: BLE001 - broken channel or connection: a new channel
            _close_channel(chan)
            return False
        self._sent = (chan, int(grace))
        return True

    def result(self, *, timeout: float):
        """After :meth:`send`: wait for the node's ``docker stop``; its CommandResult, or None
        when no line was sent, the channel broke or timed out, or its shell stopped nothing."""
        sent, self._sent = self._sent, None
        if sent is None:
            return None
        chan, grace = sent
        argv = runtime_of(self.conn).stop([self.container], grace=grace)
        try:
            res = self.conn.wait_channel(chan, argv, timeout=timeout)
        except Exception:  # noqa: BLE001 - broken channel or connection, a timeout: a new channel
            _close_channel(chan)
            return None
        return None if res.exit_code == _NOT_STOPPED else res

    def stop(self, grace: int, *, timeout: float):
        """:meth:`send` then :meth:`result`."""
        self.send(grace)
        return self.result(timeout=timeout)

    def close(self) -> None:
        """Close the channel unused: the node's shell reads EOF and ends, stopping nothing."""
        with self._lock:
            chan, self._chan, self._done = self._chan, None, True
        if chan is not None:
            _close_channel(chan)


def _close_channel(chan) -> None:
    try:
        chan.close()
    except Exception:  # noqa: BLE001 - already gone with its connection
        pass


def stop_containers(cluster: Cluster, containers: dict[str, str], *, grace: int = 3,
                    timeout: float = 20.0, remove: bool = False,
                    ready: dict[str, StopChannel] | None = None) -> dict[str, str]:
    """Stop (``remove``: and remove) each node's container in parallel, each call bounded.

    ``containers``: node name -> container name.  Returns node -> reason for
    every node where that could not be done; a container already gone counts as
    done (stopping is idempotent).  ``ready``: node -> its :class:`StopChannel`, opened
    while the run started (a stop, not a removal): the stop is written there; where that
    channel is missing, broken or its ``docker stop`` failed, the stop runs on a new channel
    as without it, so a stop is never lost.
    """
    if not ready and not remove and len(containers) > 1 and tree.enabled(cluster):
        return _stop_containers_through_tree(cluster, containers, grace, timeout)
    # every pre-opened channel's line first, from this thread: a thread per node to start
    # before its line goes out cost up to tenths of a second at 16 nodes on a busy machine
    sent = {n: p for n, p in (ready or {}).items() if n in containers and not remove and p.send(grace)}

    def one(node: str, name: str) -> str | None:
        def call():
            if node in sent:
                res = sent[node].result(timeout=timeout / 2)
                if res is not None and (res.exit_code == 0 or _gone(res.stderr)):
                    return res
            conn = cluster.connection(node)
            runtime = runtime_of(conn)
            if remove and grace:
                conn.run(runtime.stop([name], grace=grace), timeout=timeout)
            argv = runtime.rm([name]) if remove else runtime.stop([name], grace=grace)
            return conn.run(argv, timeout=timeout)

        res = bounded(call, timeout, name=f"stop-{node}")
        if res.exit_code != 0 and not _gone(res.stderr):
            return _last_line(res)
        return None

    problems: dict[str, str] = {}
    if not containers:
        return problems
    with ThreadPoolExecutor(max_workers=len(containers)) as pool:
        futures = {n: pool.submit(one, n, c) for n, c in containers.items()}
        for node, fut in futures.items():
            try:
                why = fut.result()
            except Exception as e:  # noqa: BLE001 - reported by node name
                why = str(e) or e.__class__.__name__
            if why:
                problems[node] = why
    return problems


def _stop_containers_through_tree(cluster: Cluster, containers: dict[str, str], grace: int,
                                  timeout: float) -> dict[str, str]:
    """:func:`stop_containers` of a run followed through the tree (no channel per node was
    opened beforehand): one more tree call, and each node the tree did not bring back is
    stopped on its own connection (:func:`~clusterctl.cluster.transport.tree.run_commands`)."""
    runtimes = {node.name: node_runtime(node) for node in cluster.nodes if node.name in containers}
    got = tree.run_commands(cluster, {n: [tree.Command(tuple(runtimes[n].stop([c], grace=grace)))]
                                      for n, c in containers.items()}, timeout=timeout)
    problems: dict[str, str] = {}
    for node, r in got.items():
        if not isinstance(r, list):
            problems[node] = getattr(r, "reason", str(r))
        elif r[0].exit_code != 0 and not _gone(r[0].stderr):
            problems[node] = _last_line(r[0])
    return problems


def remove_run_containers(cluster: Cluster, run_id: str, nodes: list[str], *,
                          timeout: float = 30.0) -> dict[str, str]:
    """Remove every container labelled with ``run_id`` on ``nodes`` (any state); node -> problem.

    By label, not by name: when a start failed because a container of that NAME
    already existed, that container is someone else's and must stay.
    """
    def one(conn: NodeConnection) -> None:
        def call():
            runtime = runtime_of(conn)
            found = conn.run(runtime.ps(labels={RUN_LABEL: run_id}, no_trunc=False),
                             timeout=timeout, check=True).stdout.split()
            if found:
                conn.run(runtime.rm(found), timeout=timeout, check=True)
        bounded(call, timeout * 2, name=f"remove-{conn.name}")

    return {n: getattr(r, "reason", str(r)) for n, r in cluster.map(one, nodes=nodes).items()
            if r is not None}


@dataclass
class NodeStop:
    """What :func:`stop_node` did on one node."""

    node: str
    containers: list[ContainerState] = field(default_factory=list)  # final states, before removal
    was_running: list[str] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)  # (timestamp key, text), without on_line
    error: str | None = None  # the node could not be reached / the containers not removed
    # the containers' environment (their inspect before the stop): the secrets' values, to
    # mask their output before it is saved; never shown or stored
    env: dict[str, str] = field(default_factory=dict, repr=False)


#: ``clusterctl stop`` on one node, in ONE command (it was six: find, inspect, stop, logs,
#: inspect, rm, each an SSH channel, about 1 ms of this machine's CPU and an sshd session on
#: the node apiece).  $1 a random token that marks the sections on stdout, $2 the run's label
#: filter, $3 the grace.  stdout: "@@T before" + the inspect JSON of the run's containers;
#: per container "@@T logs ID" + its output (both streams, timestamped); "@@T after" + the
#: final inspect JSON; "@@T removed" or "@@T rm-failed LAST-WORDS".  Nothing when the node has
#: none of the run's containers.  A marker may follow a last log line that has no newline.
_STOP_RUN_SCRIPT = script_text("clusterctl.cluster", "containers-stop-run.sh")


class _StopReader:
    """Reads :data:`_STOP_RUN_SCRIPT`'s output a line at a time (from the node's own
    channel or from the tree), the containers' lines to ``take`` as they come, and makes
    the node's :class:`NodeStop` from its exit status."""

    def __init__(self, node: str, token: str, on_line: Callable[[str, str], None] | None) -> None:
        self.result = NodeStop(node)
        self.take = on_line or (lambda key, text: self.result.lines.append((key, text)))
        self.marker = f"@@{token} "
        self.json_of: dict[str, list[str]] = {"before": [], "after": []}
        self.section, self.removed, self.rm = "", False, None
        self.errors: deque[str] = deque(maxlen=20)   # the script's own stderr: its last words

    def line(self, text: str) -> None:
        at = text.find(self.marker)
        if at < 0:
            if self.section == "logs":
                self.take(*split_timestamp(text))
            elif self.section in self.json_of:
                self.json_of[self.section].append(text)
            return
        if at > 0 and self.section == "logs":        # a last line without its newline
            self.take(*split_timestamp(text[:at]))
        word, _, rest = text[at + len(self.marker):].partition(" ")
        self.section = word
        if word == "removed":
            self.removed = True
        elif word == "rm-failed":
            self.rm = rest.strip()

    def finish(self, code: int) -> NodeStop:
        result = self.result
        if code != 0:
            why = next((e for e in reversed(self.errors) if e.strip()), f"exit status {code}")
            raise NodeError(result.node, f"could not stop the run's containers: {why.strip()}")
        inspected = _inspected(self.json_of["before"])
        before = [state_from_inspect(result.node, d) for d in inspected]
        result.env = {k: v for d in inspected for k, v in env_from_inspect(d).items()}
        result.was_running = [c.name for c in before if c.running]
        if not before:
            return result
        result.containers = _states(result.node, self.json_of["after"])
        if not self.removed:
            result.error = f"docker rm failed: {self.rm or 'no answer'}"
        return result


def _stop_argv(run_id: str, token: str, grace: int, runtime: ContainerRuntime | None = None,
               secret_names: Collection[str] = ()) -> list[str]:
    """The stop script's argv; of the containers' environment only ``secret_names`` (the
    run's masked variables: their values mask the output) leave the node (names that are
    not identifiers are dropped: they go into the node's ``grep -E``)."""
    script = (runtime or runtime_for()).script(_STOP_RUN_SCRIPT)
    names = "|".join(sorted(n for n in secret_names if ENV_NAME.match(n)))
    return ["sh", "-c", script, "sh", token, f"label={RUN_LABEL}={run_id}", str(grace), names]


def stop_node(conn: NodeConnection, run_id: str, *, grace: int = 3, timeout: float = 30.0,
              on_line: Callable[[str, str], None] | None = None,
              secret_names: Collection[str] = ()) -> NodeStop:
    """On one node: find the run's containers by label, stop them, read their output (to
    ``on_line`` as it comes, else into ``lines``) and final states, remove them; one
    command (:data:`_STOP_RUN_SCRIPT`), its output read as it comes (a long run's output is
    never held whole)."""
    token = secrets.token_hex(8)
    reader = _StopReader(conn.name, token, on_line)
    code = conn.stream(_stop_argv(run_id, token, grace, runtime_of(conn), secret_names), reader.line,
                       on_stderr_line=reader.errors.append, timeout=timeout * 2 + grace)
    return reader.finish(code)


def stop_nodes(cluster: Cluster, run_id: str, nodes: Sequence[str], *, grace: int = 3, timeout: float = 30.0,
               writer: Callable[[str], Callable[[str, str], None]] | None = None,
               secret_names: Collection[str] = ()) -> dict[str, NodeStop | NodeError]:
    """:func:`stop_node` on every node of ``nodes`` at once: through the tree when it is on
    (:func:`clusterctl.cluster.transport.tree.enabled`: one connection from this machine,
    whatever the node count), else, and for each node the tree did not bring back whole, on
    the node's own connection.  ``writer(node)`` gives the callback for that node's lines
    (default: into ``NodeStop.lines``).  Through the tree a node's output waits in a file
    here (never in memory) until it came whole, so a node that falls back to its own
    connection is read once, not twice; its containers are removed only after their output
    was written towards this machine, as on its own connection."""
    results: dict[str, NodeStop | NodeError] = {}
    take = writer or (lambda node: None)
    if tree.enabled(cluster) and len(nodes) > 1:
        results.update(_stop_through_tree(cluster, run_id, nodes, grace, timeout, take, secret_names))

    def one(conn: NodeConnection) -> NodeStop:
        return bounded(lambda: stop_node(conn, run_id, grace=grace, timeout=timeout,
                                         on_line=take(conn.name), secret_names=secret_names),
                       timeout * 2 + grace, name=f"stop-{conn.name}")

    rest = [n for n in nodes if n not in results]
    if rest:
        results.update(cluster.map(one, nodes=rest))
    return {n: results[n] for n in nodes}


def _stop_through_tree(cluster: Cluster, run_id, nodes, grace, timeout,
                       take, secret_names: Collection[str] = ()) -> dict[str, NodeStop | NodeError]:
    token = secrets.token_hex(8)
    inventory_nodes = {n.name: n for n in cluster.nodes}
    commands = {n: [tree.Command(tuple(_stop_argv(run_id, token, grace, node_runtime(inventory_nodes[n]),
                                                  secret_names)))]
                for n in nodes}
    with tempfile.TemporaryDirectory(prefix="clusterctl-stop-") as scratch:
        files: dict[str, BinaryIO] = {}
        errs: dict[str, bytearray] = {}

        def sink(node: str, _k: int, stream: str, data: bytes) -> None:
            if stream == "out":
                if node not in files:
                    files[node] = open(os.path.join(scratch, str(len(files))), "w+b")  # noqa: SIM115
                files[node].write(data)
            else:
                err = errs.setdefault(node, bytearray())
                err.extend(data[:max(0, 64 * 1024 - len(err))])   # its words: the first 64 KiB

        try:
            ran = tree.run_through_tree(cluster, commands, sink,
                                        timeout=timeout * 2 + grace)
        except NodeError as e:   # the first node cannot be reached: named once, the others direct
            return {e.node: e}
        done: dict[str, NodeStop | NodeError] = {}
        try:
            for node, (code,) in ran.codes.items():
                reader = _StopReader(node, token, take(node))
                for text in bytes(errs.get(node, b"")).decode("utf-8", "replace").splitlines():
                    reader.errors.append(text)
                lines = LineSplitter(reader.line)
                f = files.get(node)
                if f is not None:
                    f.seek(0)
                    while piece := f.read(1 << 16):
                        lines.feed(piece)
                lines.flush()
                try:
                    done[node] = reader.finish(code)
                except NodeError as e:
                    done[node] = e
        finally:
            for f in files.values():
                f.close()
        return done


def _inspected(lines: list[str]) -> list[dict]:
    """:data:`_STOP_RUN_SCRIPT`'s inspect section -> ``docker inspect``-shaped dicts (Name,
    State, Config.Labels, Config.Env): a JSON object line per container, then a JSON string
    line per variable of it the script let through (the secret names'); anything else is
    skipped."""
    data: list[dict] = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            config = value.get("Config") if isinstance(value.get("Config"), dict) else {}
            data.append({**value, "Config": {**config, "Env": []}})
        elif isinstance(value, str) and data:
            data[-1]["Config"]["Env"].append(value)
    return data


def _states(node: str, lines: list[str]) -> list[ContainerState]:
    return [state_from_inspect(node, d) for d in _inspected(lines)]
