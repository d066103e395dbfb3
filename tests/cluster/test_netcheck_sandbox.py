"""check --network across real network namespaces (the sandbox's nodes): with one pair
blocked by a firewall rule inside a node's namespace (iptables, dropping new connections from
node1 to node3's SSH port), the check names exactly that pair and no other (the check
without a blocked pair passing is the network page's sandbox block)."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app

runner = CliRunner()


@pytest.mark.skipif(shutil.which("iptables") is None, reason="needs iptables (apt-get install iptables)")
def test_network_check_names_the_blocked_pair(sandbox3):
    names = list(sandbox3.nodes)
    src, dst = names[0], names[2]
    rule = ["-p", "tcp", "-s", sandbox3.nodes[src], "--dport", "22", "--syn", "-j", "DROP"]
    sandbox3.in_netns(dst, ["iptables", "-I", "INPUT", *rule], check=True)
    try:
        r = runner.invoke(app, ["check", "--nodes", str(sandbox3.inventory_path), "--network"])
    finally:
        sandbox3.in_netns(dst, ["iptables", "-D", "INPUT", *rule], check=True)
    assert r.exit_code == 1, r.output
    blocked = [line for line in r.output.splitlines() if " blocked " in line]
    assert blocked == [f"{src}: {src} -> {dst}:22 blocked (timeout): SSH between nodes (the push "
                       "relay and the tree)"], r.output
    assert "1 of 3 nodes not ready: " + src in r.output    # the others reached every peer
