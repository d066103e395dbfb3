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

The package, lowest layer first (each module imports only those above it):

- ``commands``: argv -> command line, :class:`CommandResult`;
- ``hostkeys``: known_hosts checking and recording, fingerprints, host-key messages;
- ``describe``: any SSH failure as one readable line;
- ``connection``: :class:`NodeConnection` (run, stream, raw channels, dead-peer
  detection) and :func:`send_signal`;
- ``hopssh``: the OpenSSH client options of node-to-node hops that are about cost
  (:data:`~clusterctl.cluster.transport.hopssh.HOP_KEX`);
- ``agent``: :class:`~clusterctl.cluster.transport.agent.HopAgent`, the one-use agent that
  signs node-to-node logins (push relay, tree);
- ``cluster``: :class:`Cluster`, one connection per node and the bounded fan-out;
- ``tree``: :func:`~clusterctl.cluster.transport.tree.run_commands`, every node's commands
  through one connection (the nodes reach each other), when the inventory asks.

Contract: ``Cluster``, ``NodeConnection``, ``CommandResult``, ``command_line``,
``send_signal``, ``describe_error``, the host-key names (``fingerprint``,
``default_known_hosts``, ``HostKeyUnknown``, ``HostKeyChanged``, ``record_host_key``,
``KnownHostsPolicy``) and the tuning constants.
"""

from clusterctl.cluster.transport.cluster import DEFAULT_FANOUT, Cluster
from clusterctl.cluster.transport.commands import CommandResult, command_line
from clusterctl.cluster.transport.connection import (
    DEAD_PEER_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    KEEPALIVE_INTERVAL,
    STREAM_WINDOW_SIZE,
    WINDOW_SIZE,
    NodeConnection,
    send_signal,
    sshd_answers,
)
from clusterctl.cluster.transport.describe import describe_error
from clusterctl.cluster.transport.hostkeys import (
    HostKeyChanged,
    HostKeyUnknown,
    KnownHostsPolicy,
    default_known_hosts,
    fingerprint,
    record_host_key,
)

__all__ = [
    "DEAD_PEER_TIMEOUT", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_FANOUT", "KEEPALIVE_INTERVAL",
    "STREAM_WINDOW_SIZE", "WINDOW_SIZE", "Cluster", "CommandResult", "HostKeyChanged", "HostKeyUnknown",
    "KnownHostsPolicy", "NodeConnection", "command_line", "default_known_hosts",
    "describe_error", "fingerprint", "record_host_key", "send_signal", "sshd_answers",
]
