"""The sandbox network: bridge, per-node netns and veth pair, forward rule, shaping, links.

The head (this machine) holds ``.1`` on bridge ``cc-<name>``; node i is netns
``cc-<name>-node<i>`` with ``eth0`` (the peer of host-side veth ``cc<name>-<i>h``)
at ``.1x``.  A root-namespace dockerd may set the FORWARD policy to DROP, so one
ACCEPT rule for the bridge is inserted.  Shaping uses ``tbf`` (netem is
unavailable): ``--bandwidth`` shapes what flows towards a node (its host-side
veth) and what this machine sends (the bridge), the model of a head with an
uplink of that rate pushing to nodes with links of that rate.

Contract: :func:`ensure_bridge`, :func:`ensure_node_network`, :func:`shape`,
:func:`remove_node_network`, :func:`remove_bridge`, :func:`set_link`, :func:`shape_link`,
:func:`check_subnet_free`, :func:`free_subnet`, :func:`netns_list`, :func:`links`,
:func:`link_exists`.  Imports the model and processes of the sandbox package.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess

from clusterctl.cluster.sandbox.model import INTERFACE, Sandbox, SandboxNode, load
from clusterctl.cluster.sandbox.processes import netns_pids, run, terminate
from clusterctl.core.errors import UserError


def netns_list() -> list[str]:
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def link_exists(dev: str, netns: str | None = None) -> bool:
    argv = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", dev]
    return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL).returncode == 0


def links() -> list[str]:
    return [line.split(":")[1].strip().split("@")[0]
            for line in run(["ip", "-o", "link", "show"]).splitlines()]


# --------------------------------------------------------------------------- subnet


def _networks_in_use(own_bridge: str) -> list[tuple[ipaddress.IPv4Network, str]]:
    """IPv4 networks of addresses and routes on this machine, except on ``own_bridge``."""
    used = []
    for line in run(["ip", "-o", "-4", "addr", "show"]).splitlines():
        parts = line.split()
        dev, cidr = parts[1], parts[3]
        if dev != own_bridge:
            used.append((ipaddress.IPv4Interface(cidr).network, f"address {cidr} on interface {dev}"))
    for line in run(["ip", "-o", "-4", "route", "show"]).splitlines():
        parts = line.split()
        if parts[0] == "default" or "dev" not in parts:
            continue
        dev = parts[parts.index("dev") + 1]
        try:
            dst = ipaddress.IPv4Network(parts[0], strict=False)
        except ValueError:  # a route type word (unreachable, blackhole ...), not a network
            continue
        if dev != own_bridge:
            used.append((dst, f"route {parts[0]} via {dev}"))
    return used


def free_subnet(used: list[tuple[ipaddress.IPv4Network, str]],
                pool: str = "10.213.0.0/16") -> ipaddress.IPv4Network | None:
    """The first /24 of ``pool`` that overlaps nothing in ``used``."""
    for candidate in ipaddress.IPv4Network(pool).subnets(new_prefix=24):
        if not any(candidate.overlaps(net) for net, _ in used):
            return candidate
    return None


def check_subnet_free(sb: Sandbox) -> None:
    """Refuse a subnet that overlaps an address or route on another interface (another
    sandbox's bridge, docker0, the machine's own LAN) and suggest one that is free."""
    used = _networks_in_use(sb.bridge)
    for net, what in used:
        if net.overlaps(sb.network):
            m = re.search(r"(?:on interface|via) cc-([a-z0-9]+)\Z", what)
            owner = f' (sandbox "{m.group(1)}")' if m else ""
            free = free_subnet(used)
            hint = f", e.g. `--subnet {free}`" if free else ""
            raise UserError(f"--subnet {sb.subnet} overlaps the {what}{owner}; pick a free "
                            f"private network{hint}.")


# --------------------------------------------------------------------------- bridge and nodes


def _forward_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def _iptables(op: str, rule: list[str], *, check: bool = True) -> bool:
    """``iptables -w OP rule``: -w waits for the xtables lock (other sandboxes, dockerd)."""
    if not check:
        return subprocess.run(["iptables", "-w", op, *rule], capture_output=True,
                              stdin=subprocess.DEVNULL).returncode == 0
    run(["iptables", "-w", op, *rule])
    return True


def ensure_bridge(sb: Sandbox) -> None:
    if not link_exists(sb.bridge):
        run(["ip", "link", "add", sb.bridge, "type", "bridge"])
    head = f"{sb.head_ip}/{sb.network.prefixlen}"
    run(["ip", "addr", "replace", head, "dev", sb.bridge])
    run(["ip", "link", "set", sb.bridge, "up"])
    rule = _forward_rule(sb.bridge)
    if not _iptables("-C", rule, check=False):
        _iptables("-I", rule)


def remove_bridge(bridge: str) -> bool:
    """Delete the bridge and its forward rule(s); True when a forward rule was still there."""
    if link_exists(bridge):
        run(["ip", "link", "del", bridge], check=False)
    found = False
    rule = _forward_rule(bridge)
    while _iptables("-C", rule, check=False):
        found = True
        _iptables("-D", rule)
    return found


def ensure_node_network(sb: Sandbox, node: SandboxNode) -> None:
    """netns, veth pair (peer created inside as eth0), address, links up; keeps what exists."""
    if node.netns not in netns_list():
        run(["ip", "netns", "add", node.netns], node=node.name)
    if not (link_exists(node.veth) and link_exists(INTERFACE, node.netns)):
        # missing or half-made (a crash; a netns deleted under a live pair): make it afresh
        if link_exists(node.veth):
            run(["ip", "link", "del", node.veth], node=node.name)
        if link_exists(INTERFACE, node.netns):
            run(["ip", "-n", node.netns, "link", "del", INTERFACE], node=node.name)
        run(["ip", "link", "add", node.veth, "type", "veth",
             "peer", "name", INTERFACE, "netns", node.netns], node=node.name)
    run(["ip", "link", "set", node.veth, "master", sb.bridge, "up"], node=node.name)
    run(["ip", "-n", node.netns, "addr", "replace", f"{node.ip}/{sb.network.prefixlen}",
         "dev", INTERFACE], node=node.name)
    run(["ip", "-n", node.netns, "link", "set", INTERFACE, "up"], node=node.name)
    run(["ip", "-n", node.netns, "link", "set", "lo", "up"], node=node.name)


def remove_node_network(node: SandboxNode) -> None:
    """Kill what is left in the node's netns, then delete the netns and the host-side veth."""
    if node.netns in netns_list():
        terminate(netns_pids(node.netns))
        run(["ip", "netns", "del", node.netns], check=False)
    if link_exists(node.veth):
        run(["ip", "link", "del", node.veth], check=False)


def shape(dev: str, rate: str | None, node: str | None = None) -> None:
    """tbf on ``dev`` (the rate the far end receives at), or no shaping when rate is None."""
    if rate:
        run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
             "burst", "64kb", "latency", "50ms"], node=node)
    else:
        run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)


def shape_link(name: str, node: str, rate: str | None) -> None:
    """Shape one node's link in BOTH directions (what reaches it: its host-side veth; what
    it sends: its own eth0) to ``rate`` (tbf, e.g. ``20mbit``), or unshape it (None): a
    node with a slow NIC or cable, for the collective check's tests and benchmark."""
    n = load(name).node(node)
    shape(n.veth, rate, node=n.name)
    if rate:
        run(["tc", "-n", n.netns, "qdisc", "replace", "dev", INTERFACE, "root", "tbf", "rate",
             rate, "burst", "64kb", "latency", "50ms"], node=n.name)
    else:
        run(["tc", "-n", n.netns, "qdisc", "del", "dev", INTERFACE, "root"], check=False)


def set_link(name: str, node: str, up: bool) -> None:
    """Take a node's link down (cable pulled at the switch) or back up: for failure tests."""
    n = load(name).node(node)
    run(["ip", "link", "set", n.veth, "up" if up else "down"], node=n.name)
