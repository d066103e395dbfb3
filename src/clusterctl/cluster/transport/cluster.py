"""All nodes of an inventory: one SSH connection per node, bounded parallel fan-out.

Every remote operation (preflight, push, launch, logs) goes through a
:class:`Cluster`, which keeps ONE connection per node for the whole command and
runs a function on many nodes at once with at most ``fanout`` threads; a failure on
one node becomes that node's NodeError while the others carry on.  ~/.ssh/config
(or the file given as ``ssh_config``) is read once, by :mod:`clusterctl.cluster.sshconfig`.

Contract: :class:`Cluster` (``connection``, ``map``, ``nodes``, ``close``; a context
manager), :data:`DEFAULT_FANOUT`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from clusterctl.cluster import sshconfig
from clusterctl.cluster.transport.connection import (
    DEAD_PEER_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    KEEPALIVE_INTERVAL,
    NodeConnection,
)
from clusterctl.cluster.transport.describe import describe_error
from clusterctl.cluster.transport.hostkeys import KnownHostsCache, default_known_hosts
from clusterctl.core.errors import NodeError, UserError, did_you_mean

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory, Node

T = TypeVar("T")

DEFAULT_FANOUT = 32


@dataclass
class _Settings:
    known_hosts: Path
    accept_new_host_keys: bool
    connect_timeout: float
    fanout: int
    command_timeout: float | None
    keepalive: int = KEEPALIVE_INTERVAL
    dead_peer_timeout: float = DEAD_PEER_TIMEOUT


class Cluster:
    """All nodes of an inventory: one connection per node, bounded parallel fan-out.

    Use as a context manager so every connection is closed at the end. Keyword
    arguments override the inventory's ``ssh`` settings (None: keep them).
    ``ssh_config`` replaces ~/.ssh/config (like ``ssh -F``); aliases, User,
    Port, IdentityFile and ProxyJump there are honoured (through Fabric).
    ``command_timeout`` applies to every command not given its own timeout.
    ``keepalive`` / ``dead_peer_timeout`` tune how fast a dead node is noticed.
    """

    def __init__(self, inventory: Inventory, *, fanout: int | None = None,
                 connect_timeout: float | None = None,
                 accept_new_host_keys: bool | None = None,
                 known_hosts: Path | str | None = None,
                 command_timeout: float | None = None,
                 keepalive: int = KEEPALIVE_INTERVAL,
                 dead_peer_timeout: float = DEAD_PEER_TIMEOUT,
                 ssh_config: Path | str | None = None) -> None:
        self.inventory = inventory
        ssh = getattr(inventory, "ssh", None)
        kh = known_hosts or getattr(ssh, "known_hosts", None) or default_known_hosts()
        self.settings = _Settings(
            known_hosts=Path(kh).expanduser(),
            accept_new_host_keys=bool(_pick(accept_new_host_keys, ssh, "accept_new_host_keys", False)),
            connect_timeout=float(_pick(connect_timeout, ssh, "connect_timeout",
                                        DEFAULT_CONNECT_TIMEOUT)),
            fanout=int(_pick(fanout, ssh, "fanout", DEFAULT_FANOUT)),
            command_timeout=command_timeout,
            keepalive=keepalive,
            dead_peer_timeout=dead_peer_timeout,
        )
        if self.settings.fanout < 1:
            raise UserError(f"fan-out must be at least 1, got {self.settings.fanout}")
        self._fabric_config = sshconfig.load_config(ssh_config)
        self._known_hosts = KnownHostsCache(self.settings.known_hosts)   # parsed once, not per node
        self._connections: dict[str, NodeConnection] = {}
        self._lock = threading.Lock()
        self.tree_memo: dict = {}   # what transport.tree works out once per command (hops)
        # the caller opens every node's own connection next anyway (a followed run, code to
        # ship): ``ssh.tree: auto`` then goes direct (transport.tree.enabled)
        self.each_node_anyway = False
        # the command makes several tree calls (launch): the nodes keep their logins to
        # each other from one call to the next (transport.tree: OpenSSH control masters)
        self.tree_reuse = False
        self.before_close: list[Callable[[], None]] = []   # run first by close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def nodes(self) -> list:
        return list(self.inventory.nodes)

    def _node(self, name_or_node) -> Any:
        name = getattr(name_or_node, "name", name_or_node)
        for n in self.inventory.nodes:
            if n.name == name:
                return n
        names = [n.name for n in self.inventory.nodes]
        raise UserError(f"no node named {name!r} in the inventory{did_you_mean(str(name), names)}")

    def connection(self, name) -> NodeConnection:
        """The node's connection, opened on first use. Raises NodeError naming the node."""
        node = self._node(name)
        with self._lock:
            conn = self._connections.get(node.name)
            if conn is None:
                s = self.settings
                conn = NodeConnection(
                    node, known_hosts=s.known_hosts, accept_new_host_keys=s.accept_new_host_keys,
                    connect_timeout=s.connect_timeout, command_timeout=s.command_timeout,
                    keepalive=s.keepalive, dead_peer_timeout=s.dead_peer_timeout,
                    fabric_config=self._fabric_config, known_hosts_cache=self._known_hosts)
                self._connections[node.name] = conn
        return conn.open()

    def ssh_lookup(self):
        """The ssh config's lookup (host -> its settings: hostname, user, port, proxyjump),
        as the connections read it; None when there is no config to read."""
        try:
            return self._fabric_config.base_ssh_config.lookup
        except AttributeError:
            return None

    def known_host_keys(self):
        """The host keys this command's known_hosts file holds (a copy, parsed once)."""
        return self._known_hosts.host_keys()

    def is_connected(self, name) -> bool:
        """Whether the node's connection is open now (never opens one)."""
        with self._lock:
            conn = self._connections.get(self._node(name).name)
        return conn is not None and conn.connected

    def map(self, fn: Callable[[NodeConnection], T],
            nodes: Iterable | None = None) -> dict[str, T | NodeError]:
        """Run fn(connection) on each node in parallel, at most ``fanout`` at a time.

        Returns {node name: result or NodeError} in inventory order. Any
        exception on a node (connecting included) becomes NodeError(node,
        readable reason); the other nodes carry on.
        """
        wanted = None if nodes is None else {self._node(n).name for n in nodes}
        targets = [n for n in self.inventory.nodes if wanted is None or n.name in wanted]
        if not targets:
            return {}

        def one(node: Node) -> T | NodeError:
            try:
                return fn(self.connection(node.name))
            except NodeError as e:
                return e if e.node == node.name else NodeError(node.name, e.message)
            except Exception as e:  # becomes a per-node reason, never a traceback
                return NodeError(node.name, describe_error(e))

        workers = min(self.settings.fanout, len(targets))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ssh")
        try:
            futures = {n.name: pool.submit(one, n) for n in targets}
            return {name: f.result() for name, f in futures.items()}
        except BaseException:
            # Ctrl-C: nodes not started yet are skipped and the caller gets control
            # back at once (to tear down) instead of waiting for every node.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=False)

    def close(self) -> None:
        hooks, self.before_close = self.before_close, []
        for hook in hooks:
            hook()
        with self._lock:
            conns, self._connections = list(self._connections.values()), {}
        for c in conns:
            c.close()



def _pick(explicit, ssh, attr: str, default):
    if explicit is not None:
        return explicit
    value = getattr(ssh, attr, None) if ssh is not None else None
    return default if value is None else value
