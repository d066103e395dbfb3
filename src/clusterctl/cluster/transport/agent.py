"""A one-use SSH agent: lets nodes log in to the nodes next to them, and nothing more.

One job: answer the SSH agent protocol on channels that a node's sshd opens
back to this process when a node runs ``ssh`` to another node (agent
forwarding, requested only on the channels of one push relay
(:mod:`clusterctl.cluster.distribute.relay`) or one tree call
(:mod:`clusterctl.cluster.transport.tree`)).  Contract:
:class:`HopAgent` - ``handler`` (give it to ``Channel.request_forward_agent``),
``close()``; :func:`load_key`.

Why an agent in this process rather than a key installed on the nodes: nothing
is written to any node (no key file, no ``authorized_keys`` line that a crash
could leave behind), and the key never leaves this machine - a relay node can
only ask for signatures, and this agent gives at most ``budget`` of them (one
per hop the push or the tree planned) and none after ``close()``, so a node that is not
trusted cannot use the forwarding to log in anywhere else once its hops are up.
The agent holds the inventory's own key (the one this machine already logs in
with); it never talks to the user's ssh-agent.

Destinations (issue 24: the tree by default must be safe by default): the agent
signs only for a login to one of ``destinations``, the host keys this machine
already verified for the nodes the call planned as hops.  A node's ``ssh``
(OpenSSH 8.9 or later) binds each agent connection to the session it is
authenticating (``session-bind@openssh.com``, OpenSSH's PROTOCOL.agent: the
destination's host key, the session id, the host key's signature over that id,
and whether the connection is only being forwarded through that host).  The
agent checks the host key's signature, refuses a host key outside
``destinations`` and signs only userauth data whose session id is the one the
connection was last bound to for authentication, as OpenSSH's own
``ssh-add -h`` destination constraints do.  So a node holding the forwarded
socket can log in only to the planned nodes, never to another host this key
opens; a connection that was not bound (an ``ssh`` older than 8.9: RHEL 8 has
8.0) gets FAILURE, and that node's hop fails and it gets its own connection
from this machine.  Each refusal's reason is kept in :attr:`HopAgent.refused`.

Protocol (draft-miller-ssh-agent): uint32 length + payload; we answer
REQUEST_IDENTITIES (11) with IDENTITIES_ANSWER (12), SIGN_REQUEST (13) with
SIGN_RESPONSE (14), the session-bind EXTENSION (27) with SUCCESS (6), anything
else, unbound, or over budget with FAILURE (5).
"""

from __future__ import annotations

import base64
import struct
import threading
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import paramiko

_FAILURE = 5
_SUCCESS = 6
_REQUEST_IDENTITIES = 11
_IDENTITIES_ANSWER = 12
_SIGN_REQUEST = 13
_SIGN_RESPONSE = 14
_EXTENSION = 27
_SESSION_BIND = "session-bind@openssh.com"
_USERAUTH_REQUEST = 50
_HOSTBOUND = "publickey-hostbound-v00@openssh.com"
_MAX_BINDS = 16   # bindings per agent connection, as OpenSSH's ssh-agent
_RSA_SHA2_256 = 2
_RSA_SHA2_512 = 4
_MAX_MESSAGE = 256 * 1024


def host_key_blobs(known_hosts_lines: Iterable[str]) -> set[bytes]:
    """The host key blobs of known_hosts lines (``NAME TYPE BASE64``)."""
    return {base64.b64decode(fields[2]) for line in known_hosts_lines
            if len(fields := line.split()) >= 3}


def hop_destinations(hops: Iterable[tuple[str, str]]) -> dict[bytes, frozenset[str]]:
    """The ``destinations`` a :class:`HopAgent` takes: for each planned hop, given as (its
    known_hosts lines as this machine verified them, the user it logs in as), each host
    key blob -> the users a login to it may be signed for."""
    out: dict[bytes, set[str]] = {}
    for lines, user in hops:
        for blob in host_key_blobs(lines.splitlines()):
            out.setdefault(blob, set()).add(user)
    return {blob: frozenset(users) for blob, users in out.items()}


def load_key(path: str | Path) -> paramiko.PKey:
    """The private key at ``path`` (any type paramiko reads); OSError/SSHException when not."""
    return paramiko.PKey.from_path(Path(path).expanduser())


class HopAgent:
    """Signs with ``key`` for at most ``budget`` logins to ``destinations`` (host key blob,
    as :meth:`paramiko.PKey.asbytes` gives it -> the users a login to that host may be
    signed for: :func:`hop_destinations`), until closed."""

    def __init__(self, key: paramiko.PKey, budget: int, destinations: Mapping[bytes, Collection[str]]) -> None:
        self.key = key
        self.budget = budget
        self.destinations = {blob: frozenset(users) for blob, users in destinations.items()}
        self.signed = 0
        self.refused: list[str] = []
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def handler(self, chan: paramiko.Channel) -> None:
        """Called by paramiko's transport thread for each forwarded-agent channel."""
        threading.Thread(target=self._serve, args=(chan,), name="push-agent", daemon=True).start()

    def _serve(self, chan: paramiko.Channel) -> None:
        binds: list[tuple[bytes, bytes, bool]] = []   # this connection's (host key, session id, forwarding)
        try:
            while True:
                head = _recv_exact(chan, 4)
                if head is None:
                    return
                (length,) = struct.unpack(">I", head)
                if length == 0 or length > _MAX_MESSAGE:
                    return
                body = _recv_exact(chan, length)
                if body is None:
                    return
                reply = self._answer(body, binds)
                chan.sendall(struct.pack(">I", len(reply)) + reply)
        except (OSError, EOFError, paramiko.SSHException):
            return
        finally:
            chan.close()

    def _answer(self, body: bytes, binds: list[tuple[bytes, bytes, bool]]) -> bytes:
        """The reply to one request on one agent connection, whose bindings so far are
        ``binds`` (appended to by a session-bind)."""
        kind = body[0]
        blob = self.key.asbytes()
        if kind == _REQUEST_IDENTITIES:
            with self._lock:
                if self._closed:
                    return bytes([_FAILURE])
            msg = paramiko.Message()
            msg.add_byte(bytes([_IDENTITIES_ANSWER]))
            msg.add_int(1)
            msg.add_string(blob)
            msg.add_string("clusterctl hop")
            return msg.asbytes()
        if kind == _EXTENSION:
            return self._bind(paramiko.Message(body[1:]), binds)
        if kind == _SIGN_REQUEST:
            req = paramiko.Message(body[1:])
            key_blob, data, flags = req.get_binary(), req.get_binary(), req.get_int()
            why = _unbound(data, binds, self.destinations)
            with self._lock:
                if self._closed or key_blob != blob or self.signed >= self.budget or why:
                    if why:
                        self.refused.append(why)
                    return bytes([_FAILURE])
                self.signed += 1
            algorithm = None
            if self.key.get_name() == "ssh-rsa":
                algorithm = ("rsa-sha2-512" if flags & _RSA_SHA2_512 else
                             "rsa-sha2-256" if flags & _RSA_SHA2_256 else None)
            sig = self.key.sign_ssh_data(data, algorithm) if algorithm else self.key.sign_ssh_data(data)
            msg = paramiko.Message()
            msg.add_byte(bytes([_SIGN_RESPONSE]))
            msg.add_string(sig.asbytes() if isinstance(sig, paramiko.Message) else sig)
            return msg.asbytes()
        return bytes([_FAILURE])

    def _bind(self, msg: paramiko.Message, binds: list[tuple[bytes, bytes, bool]]) -> bytes:
        """session-bind@openssh.com: record it when the host key is a destination and its
        signature over the session id holds; FAILURE otherwise (and for other extensions)."""
        try:
            if msg.get_text() != _SESSION_BIND:
                return bytes([_FAILURE])
            host_key, session_id, signature = msg.get_binary(), msg.get_binary(), msg.get_binary()
            forwarding = msg.get_boolean()
            why = None
            if len(binds) >= _MAX_BINDS:
                why = "too many session bindings on one agent connection"
            elif any(not fwd for _, _, fwd in binds):
                why = "a connection already bound for a login was bound again"
            elif host_key not in self.destinations:
                why = "a login to a host that is not one of the planned nodes"
            elif not _signed_by(host_key, session_id, signature):
                why = "a session binding whose host key signature does not hold"
        except (paramiko.SSHException, ValueError, TypeError, IndexError, struct.error) as e:
            why = f"a malformed session binding ({type(e).__name__})"
        if why:
            with self._lock:
                self.refused.append(why)
            return bytes([_FAILURE])
        binds.append((host_key, session_id, forwarding))
        return bytes([_SUCCESS])


def _unbound(data: bytes, binds: list[tuple[bytes, bytes, bool]],
             destinations: Mapping[bytes, frozenset[str]]) -> str | None:
    """Why userauth ``data`` may not be signed on a connection bound as ``binds``; None
    when it may: the connection was last bound for a login (not forwarding) and the
    data is that login's (its session id; the host key too, for the host-bound method),
    as a user planned for the bound host (``destinations``), to the ``ssh-connection``
    service."""
    if not binds:
        return ("a login whose ssh did not bind it to a destination "
                "(OpenSSH 8.9 or later binds; an older ssh cannot use this agent)")
    host_key, session_id, forwarding = binds[-1]
    if forwarding:
        return "a signature asked for on a connection bound only for forwarding"
    try:
        m = paramiko.Message(data)
        sid = m.get_binary()
        if sid != session_id or m.get_byte() != bytes([_USERAUTH_REQUEST]):
            return "a signature for another session than the bound one"
        user, service = m.get_text(), m.get_text()
        if user not in destinations.get(host_key, ()):
            return f"a login as {user[:64]!r}, not the user planned for the bound node"
        if service != "ssh-connection":
            return f"a login for the service {service[:64]!r}, not ssh-connection"
        method = m.get_text()
        m.get_boolean(), m.get_text(), m.get_binary()  # has signature, algorithm, public key
        if method == _HOSTBOUND and m.get_binary() != host_key:
            return "a host-bound login naming another host key than the bound one"
    except (paramiko.SSHException, ValueError, TypeError, IndexError, struct.error):
        return "data that is not a login request"
    return None


def _signed_by(host_key: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` (SSH wire form) is ``host_key``'s over ``data``."""
    try:
        kind = paramiko.Message(host_key).get_text()
        key = paramiko.PKey.from_type_string(kind, host_key)
        return bool(key.verify_ssh_sig(data, paramiko.Message(signature)))
    except Exception:   # any key type, encoding or crypto error: not a valid binding
        return False


def _recv_exact(chan: paramiko.Channel, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        piece = chan.recv(n - got)
        if not piece:
            return None
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)
