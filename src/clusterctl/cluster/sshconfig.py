"""The user's OpenSSH client config (``~/.ssh/config``, or a file like ``ssh -F``), read through
Fabric: the one place clusterctl loads it.

Contract:

* :func:`load_config` ``(ssh_config=None)`` -> Fabric ``Config`` (the SSH
  transport connects with it: aliases, User, Port, IdentityFile, ProxyJump);
  UserError (exit 2) when the file is missing or unreadable;
* :func:`resolve_host` ``(host, ssh_config=None)`` -> the address other nodes
  use for ``host``: its ``HostName`` there, else ``host`` itself (an unreadable
  config leaves the host as written: the transport reports that config);
  :func:`resolve_hosts` the same for many hosts, reading the config once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from fabric import Config

from clusterctl.core.errors import UserError


def load_config(ssh_config: str | os.PathLike | None = None) -> Config:
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


def resolve_host(host: str, ssh_config: str | os.PathLike | None = None) -> str:
    """The address other nodes use for ``host``: its ssh-config ``HostName``, else itself.

    Reads ~/.ssh/config, or ``ssh_config`` (like ``ssh -F``), with
    :func:`load_config`: the same loading the transport connects with.
    """
    return resolve_hosts([host], ssh_config)[host]


def resolve_hosts(hosts: Iterable[str], ssh_config: str | os.PathLike | None = None) -> dict[str, str]:
    """{host: its ssh-config ``HostName``, else itself} for each of ``hosts`` (config read once)."""
    hosts = list(hosts)
    try:
        lookup = load_config(ssh_config).base_ssh_config.lookup
        return {h: lookup(h).get("hostname") or h for h in hosts}
    except Exception:  # noqa: BLE001 - an unreadable ssh config leaves the hosts as written
        return {h: h for h in hosts}
