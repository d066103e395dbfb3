"""A local sandbox cluster: N emulated nodes on this Linux machine.

Each node is a network namespace with its own address on a bridge (the head,
this machine, holds ``.1``; nodes ``.11``, ``.12``, ...), its own sshd (key-only,
a client key and host keys generated for the sandbox) and its own Docker daemon
with its own image store.  ``clusterctl`` then treats the nodes exactly like a
real cluster reached over SSH: push, preflight and launch need no special case.

Recipe and traps: FIELD-NOTES.md §1 "Emulated nodes".  Every kernel object is
named from the sandbox name, so several sandboxes with distinct names and subnets
coexist and ``down NAME`` touches only its own.

The package, lowest layer first (each module imports only those above it):

- ``model``: the name rule, names/addresses/paths derived from it, the state file;
- ``processes``: host tools, a node's dockerd in its netns, pidfiles, cgroups, killing;
- ``network``: bridge, netns, veth pairs, forward rule, tc shaping, link up/down;
- ``sshd``: keys, each node's sshd, the sandbox's known_hosts;
- ``storage``: a node's data root on a small loop-mounted file system; unmounting, loop devices;
- ``inventory_file``: the inventory ``up`` writes and ``down`` removes;
- ``slurm``: ``up --slurm``'s Slurm cluster: slurm.conf (pure), munged, slurmctld, a slurmd per node;
- ``registry``: ``up --registry``'s image registry: CA and TLS certificate, htpasswd, config
  (pure), the docker-registry process, its CA under /etc/docker/certs.d;
- ``lifecycle``: validation, locking, ``up``, ``down``, ``status``.

Contract (what the CLI, benchmarks and tests use): ``up``, ``down``, ``status``,
``load``, ``names``, ``recorded`` (the state files only); failure-test helpers
``stop_sshd``, ``start_sshd``,
``set_link``, ``shape_link``, ``node_docker``, ``port_open``, ``kill_dockerd``,
``restart_dockerd``, ``limit_data_root``; the model ``Sandbox``/``SandboxNode``
and the defaults ``DEFAULT_NAME``, ``DEFAULT_SUBNET``, ``DEFAULT_INVENTORY``; for Slurm
(``up(..., with_slurm=True)``): ``Sandbox.slurm_conf`` (the path for ``SLURM_CONF``),
``SLURM_PARTITION``, ``slurm_node_states``, ``render_slurm_conf``; for the registry
(``up(..., with_registry=True, registry_auth=..., registry_port=...)``): ``Sandbox.registry``
(``HOST:PORT``), ``Sandbox.registry_ca``, ``Sandbox.registry_password_file``,
``Sandbox.registry_up()``, ``REGISTRY_USER``, ``REGISTRY_DEFAULT_PORT``, ``REGISTRY_CERTS_D``,
``registry_trust_files``, ``registry_login_command``.
"""

from clusterctl.cluster.sandbox.inventory_file import (
    INVENTORY_MARKER,
    inventory_text,
    write_inventory,
)
from clusterctl.cluster.sandbox.lifecycle import (
    NodeStatus,
    SandboxStatus,
    check_bandwidth,
    check_nodes,
    check_slots,
    down,
    names,
    parse_subnet,
    require_environment,
    status,
    up,
)
from clusterctl.cluster.sandbox.model import (
    DEFAULT_INVENTORY,
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    INTERFACE,
    MAX_NODES,
    NODE_OFFSET,
    SSH_USER,
    Sandbox,
    SandboxNode,
    check_name,
    data_base,
    load,
    node_for,
    recorded,
    state_base,
)
from clusterctl.cluster.sandbox.network import free_subnet, set_link, shape_link
from clusterctl.cluster.sandbox.processes import (
    CGROUP_ROOT,
    NODE_DOCKERD_ARGS,
    in_netns,
    kill_dockerd,
    node_docker,
    processes_using,
    restart_dockerd,
)
from clusterctl.cluster.sandbox.registry import CERTS_D as REGISTRY_CERTS_D
from clusterctl.cluster.sandbox.registry import DEFAULT_PORT as REGISTRY_DEFAULT_PORT
from clusterctl.cluster.sandbox.registry import USER as REGISTRY_USER
from clusterctl.cluster.sandbox.registry import login_command as registry_login_command
from clusterctl.cluster.sandbox.registry import trust_files as registry_trust_files
from clusterctl.cluster.sandbox.slurm import PARTITION as SLURM_PARTITION
from clusterctl.cluster.sandbox.slurm import node_states as slurm_node_states
from clusterctl.cluster.sandbox.slurm import render_conf as render_slurm_conf
from clusterctl.cluster.sandbox.sshd import port_open, sshd_running, start_sshd, stop_sshd
from clusterctl.cluster.sandbox.storage import limit_data_root

__all__ = [
    "CGROUP_ROOT", "DEFAULT_INVENTORY", "DEFAULT_NAME", "DEFAULT_SUBNET", "INTERFACE",
    "INVENTORY_MARKER", "MAX_NODES", "NODE_DOCKERD_ARGS", "NODE_OFFSET", "SSH_USER",
    "NodeStatus", "REGISTRY_CERTS_D", "REGISTRY_DEFAULT_PORT", "REGISTRY_USER", "SLURM_PARTITION", "Sandbox", "SandboxNode", "SandboxStatus",
    "check_bandwidth", "check_name", "check_nodes", "check_slots", "data_base", "down",
    "free_subnet", "in_netns", "inventory_text", "kill_dockerd", "limit_data_root", "load", "names",
    "node_docker", "node_for", "recorded",
    "parse_subnet", "port_open", "processes_using", "registry_login_command",
    "registry_trust_files", "render_slurm_conf", "require_environment",
    "restart_dockerd",
    "set_link", "shape_link", "slurm_node_states",
    "sshd_running", "start_sshd", "state_base", "status", "stop_sshd", "up", "write_inventory",
]
