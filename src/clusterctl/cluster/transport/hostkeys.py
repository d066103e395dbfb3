"""Host keys: every SSH connection checks the node's key against ONE known_hosts file.

The file is the inventory's ``ssh.known_hosts``, else :func:`default_known_hosts`.
Fabric's default policy (``AutoAddPolicy``, which trusts any key) is replaced on
every connection, gateways included (:func:`secure`).  An unknown host is refused
(:class:`HostKeyUnknown`) unless accepting new keys was asked for, which records
the key like OpenSSH's ``StrictHostKeyChecking accept-new``
(:func:`record_host_key`).  A CHANGED key (:class:`HostKeyChanged`) is always an error.

The file is read as OpenSSH reads it (:func:`load_known_hosts`), not with paramiko's
loader, which gives up on the whole file at the first line it cannot parse: a line that
is not a key is skipped; ``@revoked`` keys are honoured (never accepted for any host,
also not with accept-new: :class:`HostKeyRevoked`); ``@cert-authority`` lines (host
certificates, which clusterctl does not verify) are named in the message of a host that
has no plain key, with the way to add one.

Contract: :func:`fingerprint`, :func:`default_known_hosts`, :func:`host_key_name`,
:func:`record_host_key`, :class:`KnownHostsPolicy`, :class:`KnownHostsCache`, :func:`secure`,
:func:`describe_host_key_error`.  Imports nothing else of the transport package.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shlex
import threading
from pathlib import Path

import paramiko
from fabric import Connection


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, what ``ssh-keygen -lf`` prints."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def host_key_name(host: str, port: int) -> str:
    """How known_hosts (and paramiko) name a host: bare on port 22, else [host]:port."""
    return host if port == 22 else f"[{host}]:{port}"


class HostKeyUnknown(paramiko.SSHException):
    """The node's host key is not in known_hosts and accepting new keys was not asked for."""

    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: Path) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key
        self.known_hosts = known_hosts


class HostKeyRevoked(paramiko.SSHException):
    """The node offered a key that known_hosts marks ``@revoked``."""

    def __init__(self, hostname: str, key: paramiko.PKey, known_hosts: Path) -> None:
        super().__init__(f"revoked host key for {hostname}")
        self.hostname = hostname
        self.key = key
        self.known_hosts = known_hosts


class KnownHosts(paramiko.HostKeys):
    """paramiko's HostKeys, plus what its loader cannot hold: the ``@revoked`` keys and the
    host patterns of ``@cert-authority`` lines (with their line numbers)."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked: set[tuple[str, str]] = set()          # (key type, base64)
        self.cert_authorities: list[tuple[list[str], int]] = []

    def copy(self) -> KnownHosts:
        out = KnownHosts()
        out._entries = [paramiko.hostkeys.HostKeyEntry(list(e.hostnames), e.key) for e in self._entries]
        out.revoked = set(self.revoked)
        out.cert_authorities = list(self.cert_authorities)
        return out

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return (key.get_name(), key.get_base64()) in self.revoked

    def ca_lines_for(self, hostname: str) -> list[int]:
        """The line numbers of ``@cert-authority`` lines whose patterns match ``hostname``."""
        import fnmatch

        name = hostname.strip("[").split("]")[0]
        found = []
        for patterns, line in self.cert_authorities:
            positive = [p for p in patterns if not p.startswith("!")]
            negative = [p[1:] for p in patterns if p.startswith("!")]
            if (any(fnmatch.fnmatchcase(n, p) for p in positive for n in (hostname, name))
                    and not any(fnmatch.fnmatchcase(n, p) for p in negative for n in (hostname, name))):
                found.append(line)
        return found


def load_known_hosts(path: Path) -> KnownHosts:
    """``path`` read as OpenSSH reads it (see the module docstring); empty when it is missing."""
    keys = KnownHosts()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return keys
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError, TypeError,
                IndexError, UnicodeError):
            entry = None
        if entry is None or entry.key is None:
            continue              # not a key line: OpenSSH skips it too
        if marker == "@revoked":
            keys.revoked.add((entry.key.get_name(), entry.key.get_base64()))
        elif marker == "@cert-authority":
            keys.cert_authorities.append((list(entry.hostnames), number))
        elif marker is None:
            keys._entries.append(entry)
    if keys.revoked:              # a revoked key is no host's key, whatever other lines say
        keys._entries = [e for e in keys._entries if not keys.is_revoked(e.key)]
    return keys


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


def _load_host_keys(path: Path) -> KnownHosts:
    return load_known_hosts(path)


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

    def __init__(self, known_hosts: Path, accept_new: bool, keys: KnownHosts | None = None) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.keys = keys if keys is not None else load_known_hosts(known_hosts)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey):
        if self.keys.is_revoked(key):
            raise HostKeyRevoked(hostname, key, self.known_hosts)
        if not self.accept_new:
            raise HostKeyUnknown(hostname, key, self.known_hosts)
        record_host_key(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


class KnownHostsCache:
    """One known_hosts file, parsed once for all the connections of a command.

    Parsing the file for every connection cost each connection time that grows with the
    file (every line's key decoded): O(nodes x lines) for a command (issue 12).  Each
    connection gets its own copy (:meth:`host_keys`), entries included, so what one adds
    never changes another's.  A key recorded by another connection after the parse is
    still found: :func:`record_host_key` re-reads the file under its lock before writing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._parsed: paramiko.HostKeys | None = None
        self._lock = threading.Lock()

    def host_keys(self) -> KnownHosts:
        with self._lock:
            if self._parsed is None:
                self._parsed = _load_host_keys(self.path)
            parsed = self._parsed
        return parsed.copy()


def known_hosts_index(host_keys: paramiko.HostKeys):
    """name -> [(key type, base64 key)] as known_hosts holds them for that name (a
    ``host_key_name``), in O(1) for plain entries; hashed entries (``|1|...``) are matched
    one by one, as OpenSSH does, only when the plain ones have nothing for the name."""
    plain: dict[str, list[tuple[str, str]]] = {}
    hashed = False
    for e in host_keys._entries:
        for name in e.hostnames:
            if name.startswith("|1|"):
                hashed = True
            elif e.key is not None:
                plain.setdefault(name, []).append((e.key.get_name(), e.key.get_base64()))

    def lookup(name: str) -> list[tuple[str, str]]:
        if name in plain or not hashed:
            return plain.get(name, [])
        found = host_keys.lookup(name)
        return [(kind, key.get_base64()) for kind, key in (found or {}).items()]
    return lookup


def secure(conn: Connection, known_hosts: Path, accept_new: bool,
           cache: KnownHostsCache | None = None) -> None:
    """Give conn (and any ProxyJump gateway) a client that checks OUR known_hosts only.

    Fabric creates its SSHClient with AutoAddPolicy (trust any key); it is
    replaced here by a client that has no system host keys loaded at all.
    ``cache``: the file parsed once for many connections (else it is read here).
    """
    client = paramiko.SSHClient()
    keys = cache.host_keys() if cache is not None and cache.path == known_hosts else load_known_hosts(known_hosts)
    client._host_keys = keys
    client.set_missing_host_key_policy(KnownHostsPolicy(known_hosts, accept_new, keys))
    conn.client = client
    if isinstance(conn.gateway, Connection):
        secure(conn.gateway, known_hosts, accept_new, cache)


def describe_host_key_error(exc: BaseException, known_hosts: Path | None = None) -> str | None:
    """The one-line reason for an unknown or changed host key; None for any other error."""
    if isinstance(exc, HostKeyRevoked):
        return (f"host key REVOKED: {exc.hostname} offered {exc.key.get_name()} key "
                f"{fingerprint(exc.key)}, which {exc.known_hosts} marks @revoked; it is never "
                "accepted. Give the node a new host key, or remove the @revoked line if the key "
                "is trusted again")
    if isinstance(exc, HostKeyUnknown):
        ca = load_known_hosts(exc.known_hosts).ca_lines_for(exc.hostname)
        via_ca = (f" ({exc.known_hosts} line{'s' if len(ca) > 1 else ''} "
                  f"{', '.join(map(str, ca))} trust{'' if len(ca) > 1 else 's'} host certificates "
                  f"from a @cert-authority for it; clusterctl checks plain host keys only: add "
                  f"the node's key, e.g. `ssh-keyscan -t ed25519 {shlex.quote(str(exc.hostname))} >> "
                  f"{shlex.quote(str(exc.known_hosts))}` after checking its fingerprint)") if ca else ""
        return (f"host key unknown: {exc.hostname} offered {exc.key.get_name()} key "
                f"{fingerprint(exc.key)}, which is not in {exc.known_hosts}{via_ca}. Check the "
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
                f"was reinstalled, remove the old key with `ssh-keygen -R {shlex.quote(str(host))} -f "
                f"{shlex.quote(str(kh))}` and "
                "reconnect (accepting new host keys never replaces a changed one)")
    return None
