"""A node's TCP port on this machine, over SSH: ``clusterctl port-forward``.

One job: :class:`Forwarder` - a listening socket on ``127.0.0.1:LOCAL`` here; each
connection to it becomes a ``direct-tcpip`` channel of the node's SSH connection
(:meth:`~clusterctl.cluster.transport.NodeConnection.tcp_channel`, through the ProxyJump
~/.ssh/config names, as every connection to the node), which the node's sshd connects to
the port as seen from the node: ``127.0.0.1`` first (a server on the loopback only, as
TensorBoard and Jupyter start, is reached), then the node's own address (a server bound to
that address only).  A container run with ``--net=host`` listens on the node's ports, so a
rank's port is its node's.  Bytes go both ways until either side closes; each connection
has a thread of its own.  A connection the node cannot make (nothing listens there yet) is
closed here and said through ``on_event``; the forward goes on.

:func:`parse_spec` reads ``PORT[:LOCAL]`` (pure).

Contract: :func:`parse_spec` -> :class:`PortSpec`, :class:`Forwarder` (``bind``, ``port``,
``url``, ``serve``, ``close``), :data:`LISTEN`.
"""

from __future__ import annotations

import contextlib
import errno
import re
import select
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterctl.core.errors import NodeError, UserError

if TYPE_CHECKING:
    import paramiko

    from clusterctl.cluster.transport import NodeConnection

#: the address the local end listens on: this machine only
LISTEN = "127.0.0.1"
_SPEC = re.compile(r"^(\d{1,5})(?::(\d{1,5}))?\Z")
_VALID = ("PORT or PORT:LOCAL: the port on the node (1-65535), then the port on this "
          "machine's 127.0.0.1 (1-65535, 0: any free one; default PORT)")
_READ = 64 * 1024


@dataclass(frozen=True)
class PortSpec:
    """The node's ``remote`` port, reached here at ``local`` (0: a free port chosen)."""

    remote: int
    local: int


def parse_spec(text: str) -> PortSpec:
    """``PORT`` or ``PORT:LOCAL`` -> PortSpec; UserError naming what is valid otherwise."""
    m = _SPEC.match(text.strip())
    if not m:
        raise UserError(f"port {text!r} is not a port spec; valid: {_VALID}.")
    remote = int(m.group(1))
    local = remote if m.group(2) is None else int(m.group(2))
    if not 1 <= remote <= 65535:
        raise UserError(f"port {text!r}: the node's port {remote} is out of range; valid: {_VALID}.")
    if not 0 <= local <= 65535:
        raise UserError(f"port {text!r}: the local port {local} is out of range; valid: {_VALID}.")
    return PortSpec(remote, local)


class Forwarder:
    """``spec.remote`` of a node, at ``LISTEN:spec.local`` here: :meth:`bind` listens (no node
    needed yet), :meth:`serve` forwards over a node's connection.  ``hosts``: where the node
    connects, in order (the first that accepts is kept); ``on_event``: a line for each
    connection that could not be made."""

    def __init__(self, spec: PortSpec, *, hosts: Sequence[str] = ("127.0.0.1",),
                 on_event: Callable[[str], None] = lambda line: None) -> None:
        self.spec = spec
        self.hosts = list(dict.fromkeys(hosts))
        self.on_event = on_event
        self._sock: socket.socket | None = None
        self._closed = threading.Event()

    def bind(self) -> int:
        """Listen here (before any node is contacted); the local port.  UserError naming the
        port when it is taken or not allowed."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((LISTEN, self.spec.local))
            sock.listen(16)
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"local port {self.spec.local} on {LISTEN} is in use; give another "
                                f"as PORT:LOCAL ({self.spec.remote}:0: any free port).") from None
            raise UserError(f"cannot listen on {LISTEN}:{self.spec.local}: {e.strerror}; give "
                            f"another local port as PORT:LOCAL (ports under 1024 need root)."
                            ) from None
        sock.settimeout(0.5)
        self._sock = sock
        return self.port

    @property
    def port(self) -> int:
        assert self._sock is not None, "bind() first"
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{LISTEN}:{self.port}/"

    def serve(self, conn: NodeConnection, stop: threading.Event | None = None) -> None:
        """Forward every connection to ``conn``'s node until ``stop`` is set, :meth:`close` is
        called or the connection dies (NodeError naming the node).  Ctrl-C
        (KeyboardInterrupt) in the calling thread ends it too."""
        if self._sock is None:
            self.bind()
        stop = stop or threading.Event()
        conn.open()
        try:
            while not stop.is_set() and not self._closed.is_set():
                if not conn.connected:
                    raise NodeError(conn.name, "connection lost: the forward ended")
                try:
                    client, _ = self._sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self._closed.is_set():
                        break
                    raise
                threading.Thread(target=self._one, args=(conn, client), daemon=True,
                                 name=f"forward-{self.spec.remote}").start()
        finally:
            self.close()

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()

    def _one(self, conn: NodeConnection, client: socket.socket) -> None:
        try:
            origin = client.getpeername()[:2]
            chan = self._open(conn, origin)
        except NodeError as e:
            self.on_event(f"{e.message}")
            client.close()
            return
        except OSError:
            client.close()
            return
        _pipe(client, chan)

    def _open(self, conn: NodeConnection, origin: tuple[str, int]) -> paramiko.Channel:
        failed: list[NodeError] = []
        for host in list(self.hosts):
            try:
                chan = conn.tcp_channel(host, self.spec.remote, origin=origin)
            except NodeError as e:
                failed.append(e)
                continue
            if host != self.hosts[0]:
                self.hosts.remove(host)
                self.hosts.insert(0, host)       # the address that accepts, first from now on
            return chan
        if len(failed) == 1:
            raise failed[0]
        raise NodeError(conn.name, "; ".join(e.reason for e in failed))


def _pipe(client: socket.socket, chan: paramiko.Channel) -> None:
    """Bytes both ways between a local connection and its channel, until both sides ended."""
    client_open, chan_open = True, True
    try:
        while client_open or chan_open:
            watched = ([client] if client_open else []) + ([chan] if chan_open else [])
            ready, _, _ = select.select(watched, [], [], 5.0)
            if client in ready:
                data = _recv(client)
                if data:
                    chan.sendall(data)
                else:
                    client_open = False
                    with contextlib.suppress(OSError, EOFError):
                        chan.shutdown_write()
            if chan in ready:
                data = chan.recv(_READ)
                if data:
                    client.sendall(data)
                else:
                    chan_open = False
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_WR)
            if chan.closed and not chan.recv_ready():
                break
    except (OSError, EOFError):
        pass
    finally:
        chan.close()
        client.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(_READ)
    except (ConnectionResetError, TimeoutError):
        return b""


__all__ = ["LISTEN", "Forwarder", "PortSpec", "parse_spec"]
