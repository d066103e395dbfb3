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

Protocol (draft-miller-ssh-agent): uint32 length + payload; we answer
REQUEST_IDENTITIES (11) with IDENTITIES_ANSWER (12) and SIGN_REQUEST (13) with
SIGN_RESPONSE (14), anything else or over budget with FAILURE (5).
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import paramiko

_FAILURE = 5
_REQUEST_IDENTITIES = 11
_IDENTITIES_ANSWER = 12
_SIGN_REQUEST = 13
_SIGN_RESPONSE = 14
_RSA_SHA2_256 = 2
_RSA_SHA2_512 = 4
_MAX_MESSAGE = 256 * 1024


def load_key(path: str | Path) -> paramiko.PKey:
    """The private key at ``path`` (any type paramiko reads); OSError/SSHException when not."""
    return paramiko.PKey.from_path(Path(path).expanduser())


class HopAgent:
    """Signs with ``key`` for at most ``budget`` logins, until closed."""

    def __init__(self, key: paramiko.PKey, budget: int) -> None:
        self.key = key
        self.budget = budget
        self.signed = 0
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def handler(self, chan: paramiko.Channel) -> None:
        """Called by paramiko's transport thread for each forwarded-agent channel."""
        threading.Thread(target=self._serve, args=(chan,), name="push-agent", daemon=True).start()

    def _serve(self, chan: paramiko.Channel) -> None:
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
                reply = self._answer(body)
                chan.sendall(struct.pack(">I", len(reply)) + reply)
        except (OSError, EOFError, paramiko.SSHException):
            return
        finally:
            chan.close()

    def _answer(self, body: bytes) -> bytes:
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
            msg.add_string("clusterctl push relay")
            return msg.asbytes()
        if kind == _SIGN_REQUEST:
            req = paramiko.Message(body[1:])
            key_blob, data, flags = req.get_binary(), req.get_binary(), req.get_int()
            with self._lock:
                if self._closed or key_blob != blob or self.signed >= self.budget:
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


def _recv_exact(chan: paramiko.Channel, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        piece = chan.recv(n - got)
        if not piece:
            return None
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)
