"""Why an SSH operation failed, in one readable line (never a traceback).

Contract: :func:`describe_error` ``(exc, target=, known_hosts=, timeout=)`` -> str, for
every exception a connection or a command can raise (paramiko's, sockets', OS errors,
clusterctl's own).  Host-key failures are worded by :mod:`.hostkeys`.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import paramiko

from clusterctl.cluster.transport.hostkeys import describe_host_key_error
from clusterctl.core.errors import ClusterctlError


def describe_error(exc: BaseException, *, target: str = "", known_hosts: Path | None = None,
                   timeout: float | None = None) -> str:
    """A one-line, readable reason for an SSH failure (never a traceback).

    ``target`` is "user@host:port" for messages about the connection itself.
    """
    where = f" to {target}" if target else ""
    if isinstance(exc, ClusterctlError):
        return getattr(exc, "reason", exc.message)
    host_key = describe_host_key_error(exc, known_hosts)
    if host_key is not None:
        return host_key
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
