"""One node's SSH connection: opened once, reused by every command, and noticed when it dies.

Commands run as argv (:func:`.commands.command_line` makes the only command
string), each on its own channel of the shared connection, with output collected,
streamed line by line, or piped raw (:meth:`NodeConnection.exec_channel`).  Host
keys are checked by :mod:`.hostkeys` on every connection, gateways included.

Dead nodes: every connection sends an SSH keepalive every
:data:`KEEPALIVE_INTERVAL` seconds and sets ``TCP_USER_TIMEOUT`` to
:data:`DEAD_PEER_TIMEOUT` seconds, so a node that stops answering (power loss,
link down) breaks its connection after at most ~KEEPALIVE_INTERVAL +
DEAD_PEER_TIMEOUT seconds; a command waiting on it then fails with a
``NodeError`` saying the connection was lost, instead of hanging forever.

Contract: :class:`NodeConnection` (``open``, ``run``, ``stream``, ``exec_channel``,
``terminal_channel``, ``tcp_channel``, ``wait_channel``, ``close``, ``target``,
``peer_address``, ``sshd_address``, ``transport``),
:func:`send_signal`, :func:`sshd_answers` (a fresh TCP connection gets sshd's banner).
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
from fabric import Config, Connection

from clusterctl.cluster.transport.commands import CommandResult, command_line, short
from clusterctl.cluster.transport.describe import describe_error
from clusterctl.cluster.transport.hostkeys import (
    HostKeyChanged,
    KnownHostsCache,
    host_key_name,
    secure,
)
from clusterctl.core.errors import NodeError
from clusterctl.core.lines import LineSplitter

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Node

# paramiko logs failures of its transport thread with full tracebacks (e.g. "Error
# reading SSH protocol banner"); with no handler anywhere, Python's last-resort
# handler would print them on stderr. Every such failure already reaches the user
# as a one-line NodeError, so they stay in the logging system (a -v handler on the
# root logger still sees them) and never reach the terminal by default.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def aead_first(ciphers: Sequence[str]) -> tuple[str, ...]:
    """``ciphers`` with AES-GCM first, the others after in their order."""
    gcm = tuple(c for c in ciphers if c.endswith("-gcm@openssh.com"))
    return gcm + tuple(c for c in ciphers if c not in gcm)


class AeadFirstTransport(paramiko.Transport):
    """paramiko's Transport asking for AES-GCM first: paramiko prefers AES-CTR with an HMAC,
    whose tag it compares byte by byte in Python on every packet it reads; with GCM the tag
    is checked inside ``cryptography``.  Measured here on a real paramiko pair, both ends in
    one process: 35 to 45% less CPU per small packet (the lines, heartbeats and agent
    requests every node sends) and 15% less per MB of bulk data.  A server that offers no
    GCM (OpenSSH has offered it since 6.2) gets AES-CTR, as before."""

    _preferred_ciphers = aead_first(paramiko.Transport._preferred_ciphers)


DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds between SSH keepalive messages on an idle connection.
KEEPALIVE_INTERVAL = 15
#: Seconds unacknowledged data (a keepalive at the latest) may stay in flight
#: before the kernel drops the connection (TCP_USER_TIMEOUT).
DEAD_PEER_TIMEOUT = 45
#: Channel receive window: large, so a push of a big image is not throttled by
#: round trips waiting for window adjustments.
WINDOW_SIZE = 16 * 1024 * 1024
#: ... but a stream that lives as long as a run (``docker logs -f`` of every node) gets
#: a small one: while its reader waits, the node holds the output, not clusterctl
#: (16 nodes x 16 MiB would be 256 MiB here).  256 KiB still moves 250 MB/s at 1 ms RTT.
STREAM_WINDOW_SIZE = 256 * 1024
#: How often (seconds) a connection's reader thread wakes while nothing arrives.
#: paramiko's default is 0.1 s, only to look at flags that closing sets (and to send
#: keepalives, every KEEPALIVE_INTERVAL); data, EOF and a broken connection wake it at
#: once.  Ten wake-ups a second per node were the largest host cost of a launch that
#: grows with node count and wall time (16 idle connections: ~0.01 CPU-s per second).
READER_WAKEUP = 1.0
_READ = 64 * 1024


class NodeConnection:
    """One node's SSH connection, opened once and reused by every command on it.

    Safe to use from several threads at once (each command is its own SSH
    channel on the shared connection).
    """

    def __init__(self, node: Node, *, known_hosts: Path, accept_new_host_keys: bool = False,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 command_timeout: float | None = None,
                 keepalive: int = KEEPALIVE_INTERVAL,
                 dead_peer_timeout: float = DEAD_PEER_TIMEOUT,
                 fabric_config: Config | None = None,
                 known_hosts_cache: KnownHostsCache | None = None) -> None:
        self.node = node
        self.known_hosts = Path(known_hosts)
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self.dead_peer_timeout = dead_peer_timeout
        self._config = fabric_config
        self._known_hosts_cache = known_hosts_cache
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._close_when_open = False   # close() came while an open() was still connecting

    # -- connecting ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def connected(self) -> bool:
        t = self._conn.transport if self._conn is not None else None
        return t is not None and t.is_active()

    @property
    def target(self) -> str:
        """user@host:port as actually used (after ~/.ssh/config), for messages."""
        c = self._conn or self._fabric_connection()
        return f"{c.user}@{c.host}:{c.port}"

    def open(self) -> NodeConnection:
        """Connect (once; again only if the connection died). Raises NodeError with the reason."""
        with self._lock:
            if self.connected:
                return self
            self._close_quietly()
            self._close_when_open = False
            try:
                conn = self._fabric_connection()
            except Exception as e:  # e.g. `Port abc` for this host in ~/.ssh/config
                raise NodeError(self.name, f"cannot use the ssh config for {self.node.host!r}: "
                                f"{describe_error(e)}") from None
            target = f"{conn.user}@{conn.host}:{conn.port}"
            try:
                conn.open()
            except paramiko.BadHostKeyException as e:  # name it as known_hosts does
                _close_fabric(conn)
                changed = HostKeyChanged(host_key_name(conn.host, conn.port), e.key,
                                         e.expected_key, self.known_hosts)
                raise NodeError(self.name, describe_error(changed)) from None
            except Exception as e:  # every failure becomes a readable NodeError
                _close_fabric(conn)
                raise NodeError(self.name, describe_error(
                    e, target=target, known_hosts=self.known_hosts,
                    timeout=self.connect_timeout)) from None
            if self._close_when_open:   # closed meanwhile: nothing may stay open after close()
                _close_fabric(conn)
                raise NodeError(self.name, "the connection was closed while it was being opened")
            self._tune(conn.transport)
            self._conn = conn
            return self

    def _fabric_connection(self) -> Connection:
        """A Fabric Connection honouring ~/.ssh/config, with OUR host-key checking."""
        node = self.node
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": self.connect_timeout,
            "auth_timeout": self.connect_timeout,
            "transport_factory": AeadFirstTransport,
        }
        if node.identity_file:
            connect_kwargs["key_filename"] = [str(node.identity_file)]
        conn = Connection(
            node.host,
            user=node.user or None,
            port=_explicit_port(node),
            config=_own_config(self._config),
            connect_timeout=max(1, math.ceil(self.connect_timeout)),
            connect_kwargs=connect_kwargs,
        )
        secure(conn, self.known_hosts, self.accept_new_host_keys, self._known_hosts_cache)
        return conn

    def _tune(self, transport: paramiko.Transport) -> None:
        transport.set_keepalive(self.keepalive)
        sock = transport.sock
        try:  # after the handshake: paramiko set 0.1 s on the socket when it started
            sock.settimeout(READER_WAKEUP)
        except (OSError, AttributeError):  # a ProxyCommand's pipe has no timeout to set
            pass
        if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                int((self.keepalive + self.dead_peer_timeout) * 1000))
            except OSError:
                pass

    @property
    def transport(self) -> paramiko.Transport:
        self.open()
        assert self._conn is not None
        return self._conn.transport

    @property
    def peer_address(self) -> str | None:
        """The IP address this connection reached (None through a gateway/ProxyCommand)."""
        sock = self.transport.sock
        if isinstance(sock, socket.socket):
            return sock.getpeername()[0]
        return None

    def sshd_address(self) -> tuple[str, int] | None:
        """(IP address, port) of the sshd this connection reached, for :func:`sshd_answers`
        (None through a gateway/ProxyCommand, where no direct connection is possible)."""
        sock = self.transport.sock
        if isinstance(sock, socket.socket):
            host, port = sock.getpeername()[:2]
            return host, port
        return None

    # -- commands --------------------------------------------------------------------

    def _channel(self, argv: Sequence[str], forward_agent: Callable | None = None,
                 window_size: int = WINDOW_SIZE) -> paramiko.Channel:
        cmd = command_line(argv)
        transport = self.transport
        try:
            chan = transport.open_session(window_size=window_size, timeout=self.connect_timeout)
            if forward_agent is not None:
                chan.request_forward_agent(forward_agent)
            chan.exec_command(cmd)
        except Exception as e:
            raise NodeError(self.name, f"cannot start `{short(argv)}`: "
                            + describe_error(e, target=self.target)) from None
        return chan

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = False,
            stdin: bytes | None = None) -> CommandResult:
        """Run argv on the node and collect its output.

        ``stdin`` is sent then closed (EOF); without it the command's stdin is
        closed at once, so a command reading stdin never hangs. ``timeout``
        (default: the cluster's command timeout) raises NodeError and asks the
        remote command to stop. ``check=True`` raises NodeError on a non-zero exit.
        """
        argv = [os.fspath(a) for a in argv]
        chan = self._channel(argv)
        out, err = bytearray(), bytearray()
        feeder = _start_feeding(chan, stdin)
        code = self._pump(chan, argv, self._timeout(timeout), out.extend, err.extend)
        if feeder is not None:
            feeder.join(timeout=1)
        result = CommandResult(self.name, argv, code, _decode(out), _decode(err))
        return result.check() if check else result

    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], *,
               timeout: float | None = None,
               on_stderr_line: Callable[[str], None] | None = None,
               window_size: int = WINDOW_SIZE, keep_whole: Sequence[str] = ()) -> int:
        """Run argv, calling ``on_line`` with each output line (no newline) as it arrives.

        stdout and stderr lines both go to ``on_line`` unless ``on_stderr_line``
        is given. Returns the exit status (no check: the caller decides).
        ``window_size``: the channel's receive window, the most output that waits
        here, unread, while ``on_line`` blocks (the node's command then waits):
        :data:`STREAM_WINDOW_SIZE` bounds what a long-lived stream can hold.
        A line longer than ``core.lines.MAX_LINE`` characters comes in pieces of at most that
        size, never cut inside one of the ``keep_whole`` strings (the secrets a log sink masks).
        """
        argv = [os.fspath(a) for a in argv]
        chan = self._channel(argv, window_size=window_size)
        chan.shutdown_write()
        out = LineSplitter(on_line, keep_whole=keep_whole)
        err = LineSplitter(on_stderr_line or on_line, keep_whole=keep_whole)
        try:
            return self._pump(chan, argv, self._timeout(timeout), out.feed, err.feed)
        finally:
            out.flush()
            err.flush()

    def exec_channel(self, argv: Sequence[str], *,
                     forward_agent: Callable[[paramiko.Channel], None] | None = None,
                     window_size: int = WINDOW_SIZE) -> paramiko.Channel:
        """Start argv and hand back the raw paramiko Channel, for piping bytes (push).

        Write with ``chan.sendall(data)``; send EOF (the remote command sees its
        stdin end) with ``chan.shutdown_write()``. Then ``wait_channel(chan)``
        drains stdout/stderr and returns a CommandResult with the exit status
        (or read ``chan.recv(n)`` / ``chan.recv_stderr(n)`` yourself and call
        ``chan.recv_exit_status()``, which blocks until the command exited).
        A command that writes a lot must be read while you write, or it blocks
        once the SSH window is full. Close the channel when done.

        ``forward_agent``: agent forwarding for this channel only, answered by
        this handler (called with each agent channel the node opens back; the
        push relay's one-push agent), never by the user's ssh-agent.
        ``window_size``: as for :meth:`stream` (:data:`STREAM_WINDOW_SIZE` for a channel
        that lives as long as a run).
        """
        return self._channel([os.fspath(a) for a in argv], forward_agent, window_size=window_size)

    def terminal_channel(self, argv: Sequence[str] | None, *, term: str, width: int,
                         height: int) -> paramiko.Channel:
        """Start argv (None: the login shell) on a pseudo-terminal of the node's sshd, of type
        ``term`` and ``width`` x ``height`` characters, as ``ssh -t`` does (``clusterctl
        shell``): its input and output are the terminal's, raw bytes both ways; resize it
        with ``chan.resize_pty``, its exit status from ``chan.recv_exit_status()``."""
        cmd = None if argv is None else command_line([os.fspath(a) for a in argv])
        transport = self.transport
        try:
            chan = transport.open_session(window_size=STREAM_WINDOW_SIZE, timeout=self.connect_timeout)
            chan.get_pty(term=term, width=width, height=height)
            if cmd is None:
                chan.invoke_shell()
            else:
                chan.exec_command(cmd)
        except Exception as e:
            what = "a login shell" if argv is None else f"`{short(argv)}`"
            raise NodeError(self.name, f"cannot start {what} on a terminal: "
                            + describe_error(e, target=self.target)) from None
        return chan

    def tcp_channel(self, host: str, port: int, *,
                    origin: tuple[str, int] = ("127.0.0.1", 0)) -> paramiko.Channel:
        """A TCP connection the node's sshd makes to ``host:port`` as seen from the node
        (``direct-tcpip``, as ``ssh -L`` does), carried on this connection: raw bytes both
        ways.  NodeError saying why when the sshd refuses it or nothing listens there."""
        transport = self.transport
        try:
            return transport.open_channel("direct-tcpip", (host, port), origin,
                                          window_size=STREAM_WINDOW_SIZE, timeout=self.connect_timeout)
        except paramiko.ChannelException as e:
            why = _OPEN_FAILURES.get(e.code, e.text or f"refused (code {e.code})")
            raise NodeError(self.name, f"cannot connect to {host}:{port} there: {why}") from None
        except Exception as e:
            raise NodeError(self.name, f"cannot connect to {host}:{port} there: "
                            + describe_error(e, target=self.target)) from None

    def wait_channel(self, chan: paramiko.Channel, argv: Sequence[str] = ("<channel>",), *,
                     timeout: float | None = None, check: bool = False) -> CommandResult:
        """Finish a channel from exec_channel: send EOF, collect output and exit status."""
        argv = [os.fspath(a) for a in argv]
        out, err = bytearray(), bytearray()
        code = self.pump_channel(chan, argv, out.extend, err.extend, timeout=timeout)
        result = CommandResult(self.name, argv, code, _decode(out), _decode(err))
        return result.check() if check else result

    def pump_channel(self, chan: paramiko.Channel, argv: Sequence[str],
                     on_out: Callable[[bytes], None], on_err: Callable[[bytes], None], *,
                     timeout: float | None = None) -> int:
        """Finish a channel from exec_channel as its output comes: send EOF, hand each piece
        of stdout / stderr to the callbacks, return the exit status (NodeError as in
        ``run``)."""
        if not chan.closed:
            try:
                chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass
        return self._pump(chan, [os.fspath(a) for a in argv], self._timeout(timeout), on_out, on_err)

    def _timeout(self, timeout: float | None) -> float | None:
        return self.command_timeout if timeout is None else timeout

    def _pump(self, chan: paramiko.Channel, argv: Sequence[str], timeout: float | None,
              on_out: Callable[[bytes], None], on_err: Callable[[bytes], None]) -> int:
        """Move output to the callbacks until the command exited; return its exit status.

        Raises NodeError on timeout (after asking the command to stop) and when
        the connection dies (keepalive / TCP_USER_TIMEOUT noticed a dead node).
        -1 means the command ended without an exit status (killed by a signal).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                while chan.recv_ready():
                    on_out(chan.recv(_READ))
                while chan.recv_stderr_ready():
                    on_err(chan.recv_stderr(_READ))
                drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                if drained and chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    code = chan.recv_exit_status()
                    if code == -1 and not chan.get_transport().is_active():
                        # paramiko closes every channel with status -1 when the connection dies
                        raise NodeError(self.name, f"connection lost while running "
                                        f"`{short(argv)}` (the node stopped answering)")
                    return code
                if drained and chan.closed:
                    raise NodeError(self.name, f"connection lost while running `{short(argv)}` "
                                    "(no exit status)")
                if not chan.get_transport().is_active():
                    raise NodeError(self.name, f"connection lost while running `{short(argv)}`")
                wait = 1.0
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        send_signal(chan, "TERM")
                        raise NodeError(self.name, f"`{short(argv)}` timed out after {timeout:g}s")
                if chan.eof_received:
                    chan.status_event.wait(wait)  # output done, the exit status follows
                else:
                    select.select([chan], [], [], wait)
        finally:
            chan.close()

    def close(self) -> None:
        """Close the connection.  Never waits for an open() still connecting (a node that does
        not answer takes connect_timeout to fail): that open() closes what it opens."""
        if not self._lock.acquire(blocking=False):
            self._close_when_open = True
            return
        try:
            self._close_quietly()
        finally:
            self._lock.release()

    def _close_quietly(self) -> None:
        if self._conn is not None:
            _close_fabric(self._conn)
            self._conn = None


#: why a node's sshd refused a ``direct-tcpip`` channel, by RFC 4254's reason code
_OPEN_FAILURES = {
    1: "its sshd does not allow TCP forwarding (AllowTcpForwarding, PermitOpen in its sshd_config)",
    2: "nothing accepts connections there (connection refused)",
    3: "its sshd does not know TCP forwarding (unknown channel type)",
    4: "its sshd has no resources left for another channel",
}


def send_signal(chan: paramiko.Channel, name: str = "TERM") -> None:
    """Ask sshd to send signal ``name`` to the channel's command (RFC 4254 6.9), best effort.

    paramiko has no API for the "signal" channel request, so it is built here.
    OpenSSH honours it only for non-root logins (it needs privilege separation,
    which root sessions skip): a timed-out command run as root may keep
    running, so whoever starts long-lived things (containers) stops them by name.
    """
    try:
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string("signal")
        m.add_boolean(False)
        m.add_string(name)
        chan.transport._send_user_message(m)
    except Exception:  # the channel or connection is already gone: nothing to stop
        pass



def _own_config(shared: Config | None) -> Config:
    """A Fabric Config of its own for one Connection, sharing ``shared``'s parsed ssh config.

    Its own: Fabric writes into the config it is given, and one shared by parallel
    connects raced (seen once in ~8 pushes: "No attribute or config key found for
    'authentication'").  Not ``shared.clone()``: Fabric's clone re-reads the ssh config
    files into the ORIGINAL config each time, which then holds every entry once more, so
    every clone deep-copied a longer list: the n-th connection of a command cost ~n x
    0.3 ms of CPU here (issue 12).  Given the parsed object, Fabric reads no file.
    """
    if shared is None:
        return Config()
    return Config(ssh_config=shared.base_ssh_config)


def _explicit_port(node: Node) -> int | None:
    """The node's port, or None when it was left at the default so ~/.ssh/config may set it."""
    fields_set = getattr(node, "model_fields_set", None)
    if node.port != 22 or fields_set is None or "port" in fields_set:
        return node.port
    return None



def _close_fabric(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:
        pass


def _start_feeding(chan: paramiko.Channel, data: bytes | None) -> threading.Thread | None:
    """Send ``data`` then EOF on chan, in a thread so output is read meanwhile (no deadlock)."""
    if data is None:
        chan.shutdown_write()
        return None

    def feed() -> None:
        try:
            chan.sendall(data)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command exited early; its exit status tells the story

    t = threading.Thread(target=feed, name="ssh-stdin", daemon=True)
    t.start()
    return t


def _decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def sshd_answers(address: tuple[str, int], timeout: float, *, connect_timeout: float | None = None) -> bool:
    """Whether the sshd at ``address`` answers a fresh TCP connection with its banner
    (``SSH-...``) within ``timeout`` seconds; the connection is closed at once (no login,
    nothing started on the node).  ``connect_timeout`` (default ``timeout``) bounds the
    TCP handshake alone: the node's kernel answers it at once when the link is up, while
    sshd may take longer to send its banner on a busy node.

    A sign of life that does not wait behind an established connection: after a short
    link outage TCP retransmits on that connection with exponential backoff (0.2, 0.4 ...
    6.4, 12.8 s), so its next round trip can come many seconds after the link is back,
    while a new connection's first SYN goes out at once."""
    try:
        with socket.create_connection(address, timeout=connect_timeout or timeout) as sock:
            deadline = time.monotonic() + timeout
            got = b""
            while len(got) < 4 and time.monotonic() < deadline:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(4 - len(got))
                if not chunk:
                    return False
                got += chunk
            return got == b"SSH-"
    except OSError:
        return False
