"""SSH transport: the one way clusterctl reaches a node.

Every remote operation (preflight, push, launch, logs) goes through a
:class:`Cluster`, which keeps ONE SSH connection per node for the whole command
and fans out over the nodes in parallel with a bounded thread pool.

Security rules enforced here, not by callers:

* Remote commands are argv lists. The only way a command string is made is
  :func:`command_line` (``shlex.join``), so no user value (label, env value,
  image name) can ever be interpreted by the remote shell. The remote login
  shell must be POSIX-compatible (sh, bash, dash, zsh), as for OpenSSH itself.
* Host keys are checked against ONE known_hosts file (the inventory's
  ``ssh.known_hosts``, else ``~/.ssh/known_hosts``). Fabric's default policy
  (``AutoAddPolicy``, which trusts any key) is replaced on every connection,
  gateways included. An unknown host is refused unless ``accept_new_host_keys``
  is set, which records the key like OpenSSH's ``StrictHostKeyChecking
  accept-new``. A CHANGED key is always an error.

Dead nodes: every connection sends an SSH keepalive every
:data:`KEEPALIVE_INTERVAL` seconds and sets ``TCP_USER_TIMEOUT`` to
:data:`DEAD_PEER_TIMEOUT` seconds, so a node that stops answering (power loss,
link down) breaks its connection after at most ~KEEPALIVE_INTERVAL +
DEAD_PEER_TIMEOUT seconds; a command waiting on it then fails with a
``NodeError`` saying the connection was lost, instead of hanging forever.
"""

from __future__ import annotations

import base64
import codecs
import errno
import fcntl
import hashlib
import logging
import math
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from fabric import Config, Connection

from clusterctl.core.errors import ClusterctlError, NodeError, UserError, did_you_mean

T = TypeVar("T")

# paramiko logs failures of its transport thread with full tracebacks (e.g. "Error
# reading SSH protocol banner"); with no handler anywhere, Python's last-resort
# handler would print them on stderr. Every such failure already reaches the user
# as a one-line NodeError, so they stay in the logging system (a -v handler on the
# root logger still sees them) and never reach the terminal by default.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_FANOUT = 32
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds between SSH keepalive messages on an idle connection.
KEEPALIVE_INTERVAL = 15
#: Seconds unacknowledged data (a keepalive at the latest) may stay in flight
#: before the kernel drops the connection (TCP_USER_TIMEOUT).
DEAD_PEER_TIMEOUT = 45
#: Channel receive window: large, so a push of a big image is not throttled by
#: round trips waiting for window adjustments.
WINDOW_SIZE = 16 * 1024 * 1024
_READ = 64 * 1024
_STDERR_TAIL = 800


def command_line(argv: Sequence[str | os.PathLike]) -> str:
    """The remote command string for ``argv``: ``shlex.join``, the only way one is made.

    A plain string is refused (it would be run by the shell as-is), as is a NUL
    byte (it cannot travel inside an SSH exec request).
    """
    if isinstance(argv, str | bytes):
        raise TypeError("a remote command must be an argv list, not a string")
    items = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
    if not items:
        raise ValueError("a remote command needs at least one argument")
    for a in items:
        if not isinstance(a, str):
            raise TypeError(f"remote command arguments must be strings, got {a!r}")
        if "\0" in a:
            raise ValueError(f"a remote command argument cannot contain a NUL byte: {a!r}")
    return shlex.join(items)


@dataclass
class CommandResult:
    """What one remote command did on one node (exit_code -1: killed by a signal)."""

    node: str
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> CommandResult:
        """Self when it exited 0, else NodeError(node, "<cmd> exited N: <stderr tail>")."""
        if self.exit_code != 0:
            raise NodeError(self.node, _exit_message(self.argv, self.exit_code, self.stderr))
        return self


def _exit_message(argv: Sequence[str], code: int, stderr: str) -> str:
    tail = stderr.strip()
    if len(tail) > _STDERR_TAIL:
        tail = "..." + tail[-_STDERR_TAIL:]
    msg = (f"`{_short(argv)}` was killed by a signal (no exit status)" if code == -1
           else f"`{_short(argv)}` exited {code}")
    return f"{msg}: {tail}" if tail else msg


def _short(argv: Sequence[str], limit: int = 120) -> str:
    line = command_line(argv)
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------- host keys

def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, what ``ssh-keygen -lf`` prints."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


class HostKeyUnknown(paramiko.SSHException):
    """The node's host key is not in known_hosts and accepting new keys was not asked for."""

    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: Path) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key
        self.known_hosts = known_hosts


class HostKeyChanged(paramiko.SSHException):
    """The node offered a different key than the one recorded for it."""

    def __init__(self, hostname: str, got: paramiko.PKey, expected: paramiko.PKey,
                 known_hosts: Path) -> None:
        super().__init__(f"host key changed for {hostname}")
        self.hostname = hostname
        self.got = got
        self.expected = expected
        self.known_hosts = known_hosts


_known_hosts_lock = threading.Lock()


def _load_host_keys(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path.exists():
        keys.load(str(path))
    return keys


def record_host_key(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Append ``hostname``'s key to ``path`` (like OpenSSH accept-new), safely under concurrency.

    The file is re-read under a lock first: when another connection recorded a
    key for the same host meanwhile, the same key is not written twice and a
    different one is a changed key (HostKeyChanged).
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _known_hosts_lock, open(path, "a+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            existing = _load_host_keys(path).lookup(hostname)
            if existing is not None:
                same = existing.get(key.get_name())
                if same == key:
                    return
                raise HostKeyChanged(hostname, key, same or list(existing.values())[0], path)
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:
                fh.seek(fh.tell() - 1)
                last = fh.read(1)
                if last != "\n":
                    fh.write("\n")
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or record them when accept-new was asked for.

    Only called by paramiko when known_hosts has NO key for the host; a key
    that differs from a recorded one never reaches this policy (paramiko raises
    BadHostKeyException), so accept-new can never paper over a changed key.
    """

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client, hostname, key):
        if not self.accept_new:
            raise HostKeyUnknown(hostname, key, self.known_hosts)
        record_host_key(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


# --------------------------------------------------------------------------- errors

def describe_error(exc: BaseException, *, target: str = "", known_hosts: Path | None = None,
                   timeout: float | None = None) -> str:
    """A one-line, readable reason for an SSH failure (never a traceback).

    ``target`` is "user@host:port" for messages about the connection itself.
    """
    where = f" to {target}" if target else ""
    if isinstance(exc, ClusterctlError):
        return getattr(exc, "reason", exc.message)
    if isinstance(exc, HostKeyUnknown):
        return (f"host key unknown: {exc.hostname} offered {exc.key.get_name()} key "
                f"{fingerprint(exc.key)}, which is not in {exc.known_hosts}. Check the "
                "fingerprint on the node (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
                "accept it with --accept-new-host-keys (or `ssh: {accept_new_host_keys: true}` "
                "in the inventory), which records it in that file")
    if isinstance(exc, HostKeyChanged | paramiko.BadHostKeyException):
        got = getattr(exc, "got", None) or exc.key
        expected = getattr(exc, "expected", None) or exc.expected_key
        kh = getattr(exc, "known_hosts", None) or known_hosts
        host = exc.hostname
        return (f"host key CHANGED for {host}: it offered {fingerprint(got)} but {kh} records "
                f"{fingerprint(expected)}. This can be a man-in-the-middle attack; if the node "
                f"was reinstalled, remove the old key with `ssh-keygen -R '{host}' -f {kh}` and "
                "reconnect (accepting new host keys never replaces a changed one)")
    if isinstance(exc, paramiko.PasswordRequiredException):
        return f"the private key for the connection{where} is encrypted; load it into ssh-agent"
    if isinstance(exc, paramiko.BadAuthenticationType):
        return (f"authentication failed{where}: the server allows only "
                f"{', '.join(exc.allowed_types)}; clusterctl uses keys (identity_file or ssh-agent)")
    if isinstance(exc, paramiko.AuthenticationException):
        return (f"authentication failed{where}: no key was accepted "
                "(check the node's user and identity_file, or ssh-agent)")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errs = list(exc.errors.values())
        if errs and all(getattr(e, "errno", None) == errno.ECONNREFUSED for e in errs):
            return f"connection refused{where} (is sshd running and listening on that port?)"
        return f"cannot connect{where}: {'; '.join(str(e) for e in errs) or exc}"
    if isinstance(exc, socket.gaierror):
        of = f" of {target}" if target else ""
        return f"cannot resolve the host name{of}: {exc.strerror or exc}"
    if isinstance(exc, TimeoutError | socket.timeout):
        after = f" after {timeout:g}s" if timeout else ""
        return f"connection{where} timed out{after}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused{where} (is sshd running and listening on that port?)"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"cannot read {exc.filename}: no such file"
    if isinstance(exc, PermissionError) and exc.filename:
        return f"cannot read {exc.filename}: permission denied"
    if isinstance(exc, paramiko.SSHException):
        text = str(exc) or type(exc).__name__
        if "banner" in text.lower():
            return f"no SSH server answered{where} ({text})"
        if text in ("No existing session", "Negotiation failed."):  # handshake cut short
            after = f" within {timeout:g}s" if timeout else ""
            return f"the SSH handshake{where} did not complete{after} (is an SSH server there?)"
        return f"ssh error{where}: {text}"
    if isinstance(exc, OSError):
        return f"network error{where}: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- one node

class NodeConnection:
    """One node's SSH connection, opened once and reused by every command on it.

    Safe to use from several threads at once (each command is its own SSH
    channel on the shared connection).
    """

    def __init__(self, node, *, known_hosts: Path, accept_new_host_keys: bool = False,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 command_timeout: float | None = None,
                 keepalive: int = KEEPALIVE_INTERVAL,
                 dead_peer_timeout: float = DEAD_PEER_TIMEOUT,
                 fabric_config: Config | None = None) -> None:
        self.node = node
        self.known_hosts = Path(known_hosts)
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self.dead_peer_timeout = dead_peer_timeout
        self._config = fabric_config
        self._conn: Connection | None = None
        self._lock = threading.Lock()

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
                changed = HostKeyChanged(_host_key_name(conn.host, conn.port), e.key,
                                         e.expected_key, self.known_hosts)
                raise NodeError(self.name, describe_error(changed)) from None
            except Exception as e:  # every failure becomes a readable NodeError
                _close_fabric(conn)
                raise NodeError(self.name, describe_error(
                    e, target=target, known_hosts=self.known_hosts,
                    timeout=self.connect_timeout)) from None
            self._tune(conn.transport)
            self._conn = conn
            return self

    def _fabric_connection(self) -> Connection:
        """A Fabric Connection honouring ~/.ssh/config, with OUR host-key checking."""
        node = self.node
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": self.connect_timeout,
            "auth_timeout": self.connect_timeout,
        }
        if node.identity_file:
            connect_kwargs["key_filename"] = [str(node.identity_file)]
        conn = Connection(
            node.host,
            user=node.user or None,
            port=_explicit_port(node),
            config=self._config or Config(),
            connect_timeout=max(1, math.ceil(self.connect_timeout)),
            connect_kwargs=connect_kwargs,
        )
        _secure(conn, self.known_hosts, self.accept_new_host_keys)
        return conn

    def _tune(self, transport: paramiko.Transport) -> None:
        transport.set_keepalive(self.keepalive)
        sock = transport.sock
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

    # -- commands --------------------------------------------------------------------

    def _channel(self, argv: Sequence[str]) -> paramiko.Channel:
        cmd = command_line(argv)
        transport = self.transport
        try:
            chan = transport.open_session(window_size=WINDOW_SIZE, timeout=self.connect_timeout)
            chan.exec_command(cmd)
        except Exception as e:
            raise NodeError(self.name, f"cannot start `{_short(argv)}`: "
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
               on_stderr_line: Callable[[str], None] | None = None) -> int:
        """Run argv, calling ``on_line`` with each output line (no newline) as it arrives.

        stdout and stderr lines both go to ``on_line`` unless ``on_stderr_line``
        is given. Returns the exit status (no check: the caller decides).
        """
        argv = [os.fspath(a) for a in argv]
        chan = self._channel(argv)
        chan.shutdown_write()
        out = _LineSplitter(on_line)
        err = _LineSplitter(on_stderr_line or on_line)
        try:
            return self._pump(chan, argv, self._timeout(timeout), out.feed, err.feed)
        finally:
            out.flush()
            err.flush()

    def exec_channel(self, argv: Sequence[str]) -> paramiko.Channel:
        """Start argv and hand back the raw paramiko Channel, for piping bytes (push).

        Write with ``chan.sendall(data)``; send EOF (the remote command sees its
        stdin end) with ``chan.shutdown_write()``. Then ``wait_channel(chan)``
        drains stdout/stderr and returns a CommandResult with the exit status
        (or read ``chan.recv(n)`` / ``chan.recv_stderr(n)`` yourself and call
        ``chan.recv_exit_status()``, which blocks until the command exited).
        A command that writes a lot must be read while you write, or it blocks
        once the SSH window is full. Close the channel when done.
        """
        return self._channel([os.fspath(a) for a in argv])

    def wait_channel(self, chan: paramiko.Channel, argv: Sequence[str] = ("<channel>",), *,
                     timeout: float | None = None, check: bool = False) -> CommandResult:
        """Finish a channel from exec_channel: send EOF, collect output and exit status."""
        argv = [os.fspath(a) for a in argv]
        if not chan.closed:
            try:
                chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass
        out, err = bytearray(), bytearray()
        code = self._pump(chan, argv, self._timeout(timeout), out.extend, err.extend)
        result = CommandResult(self.name, argv, code, _decode(out), _decode(err))
        return result.check() if check else result

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
                                        f"`{_short(argv)}` (the node stopped answering)")
                    return code
                if drained and chan.closed:
                    raise NodeError(self.name, f"connection lost while running `{_short(argv)}` "
                                    "(no exit status)")
                if not chan.get_transport().is_active():
                    raise NodeError(self.name, f"connection lost while running `{_short(argv)}`")
                wait = 1.0
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        send_signal(chan, "TERM")
                        raise NodeError(self.name, f"`{_short(argv)}` timed out after {timeout:g}s")
                if chan.eof_received:
                    chan.status_event.wait(wait)  # output done, the exit status follows
                else:
                    select.select([chan], [], [], wait)
        finally:
            chan.close()

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    def _close_quietly(self) -> None:
        if self._conn is not None:
            _close_fabric(self._conn)
            self._conn = None


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


def _host_key_name(host: str, port: int) -> str:
    """How known_hosts (and paramiko) name a host: bare on port 22, else [host]:port."""
    return host if port == 22 else f"[{host}]:{port}"


def _explicit_port(node) -> int | None:
    """The node's port, or None when it was left at the default so ~/.ssh/config may set it."""
    fields_set = getattr(node, "model_fields_set", None)
    if node.port != 22 or fields_set is None or "port" in fields_set:
        return node.port
    return None


def _secure(conn: Connection, known_hosts: Path, accept_new: bool) -> None:
    """Give conn (and any ProxyJump gateway) a client that checks OUR known_hosts only.

    Fabric creates its SSHClient with AutoAddPolicy (trust any key); it is
    replaced here by a client that has no system host keys loaded at all.
    """
    client = paramiko.SSHClient()
    if known_hosts.exists():
        client.get_host_keys().load(str(known_hosts))
    client.set_missing_host_key_policy(KnownHostsPolicy(known_hosts, accept_new))
    conn.client = client
    if isinstance(conn.gateway, Connection):
        _secure(conn.gateway, known_hosts, accept_new)


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


class _LineSplitter:
    """Turn chunks of bytes into complete decoded lines for a callback."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""

    def feed(self, data: bytes) -> None:
        self.pending += self.decoder.decode(data)
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.on_line(line.removesuffix("\r"))

    def flush(self) -> None:
        self.pending += self.decoder.decode(b"", final=True)
        if self.pending:
            self.on_line(self.pending.removesuffix("\r"))
            self.pending = ""


# --------------------------------------------------------------------------- the cluster

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

    def __init__(self, inventory, *, fanout: int | None = None,
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
        self._fabric_config = _fabric_config(ssh_config)
        self._connections: dict[str, NodeConnection] = {}
        self._lock = threading.Lock()

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
                    fabric_config=self._fabric_config)
                self._connections[node.name] = conn
        return conn.open()

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

        def one(node) -> T | NodeError:
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
        with self._lock:
            conns, self._connections = list(self._connections.values()), {}
        for c in conns:
            c.close()


def _fabric_config(ssh_config: Path | str | None) -> Config:
    """Fabric's config, parsing ~/.ssh/config (or ``ssh_config``) once for all nodes."""
    try:
        if ssh_config:
            path = Path(ssh_config).expanduser()
            if not path.is_file():
                raise UserError(f"ssh config {path} does not exist; valid: a readable ssh_config file")
            return Config(runtime_ssh_path=str(path))
        return Config()
    except UserError:
        raise
    except Exception as e:  # paramiko's ConfigParseError, an unreadable file
        where = ssh_config or "~/.ssh/config (or /etc/ssh/ssh_config)"
        raise UserError(f"cannot read the ssh config {where}: {e}; valid: OpenSSH ssh_config "
                        "syntax (man ssh_config)") from None


def _pick(explicit, ssh, attr: str, default):
    if explicit is not None:
        return explicit
    value = getattr(ssh, attr, None) if ssh is not None else None
    return default if value is None else value
