"""`clusterctl exec --nodes` on the real 3-node sandbox: outputs folded as `clush -b` folds
them, each node's exit status, exit 1 when one failed, and a node that does not answer in
time named as a timeout instead of waited on."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.hostlist import fold

pytestmark = pytest.mark.sandbox


def _on(ip: str, then: str, otherwise: str) -> str:
    """A command doing ``then`` on the node with address ``ip``, ``otherwise`` elsewhere (the
    sandbox's nodes share this machine's files and hostname: their addresses differ)."""
    return f'case "$(ip -o -4 addr show)" in *"inet {ip}/"*) {then};; *) {otherwise};; esac'


def _inventory(sb, tmp_path, mode: str) -> str:
    """The sandbox's inventory, with every node on its own connection or through the tree
    (``ssh.tree: true``, one node below another: node1 -> node2 -> node3)."""
    if mode == "direct":
        return str(sb.inventory_path)
    data = yaml.safe_load(sb.inventory_path.read_text())
    data["ssh"].update({"tree": True, "tree_width": 1})
    path = tmp_path / "tree.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("mode", ["direct", "tree"])
def test_exec_folds_outputs_names_failures_and_does_not_wait_on_a_slow_node(sandbox3, tmp_path, mode):
    sb = sandbox3
    names, ips = list(sb.nodes), list(sb.nodes.values())
    inventory = _inventory(sb, tmp_path, mode)
    runner = CliRunner()

    # the last node says something else and exits 3: two groups, the largest first
    res = runner.invoke(app, ["exec", "--nodes", inventory, "--",
                              _on(ips[-1], "echo odd; exit 3", "echo same")])
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[:4] == [f"---------------- {fold(names[:-1])} (exit 0)", "same",
                         f"---------------- {names[-1]} (exit 3)", "odd"], res.output
    assert lines[-1] == f"---------------- 2 of 3 nodes exited 0; not: {names[-1]}", res.output

    # the middle node sleeps past --timeout: named as a timeout within seconds, the others' results kept
    started = time.monotonic()
    res = runner.invoke(app, ["exec", "--nodes", inventory, "--timeout", "2", "--json",
                              "--", _on(ips[1], "sleep 30", "echo ok")])
    took = time.monotonic() - started
    assert res.exit_code == 1, res.output
    got = {o["node"]: (o["status"], o["exit_code"], o["output"]) for o in json.loads(res.output)}
    assert got == {names[0]: ("exit 0", 0, "ok\n"), names[1]: ("timeout", 124, ""),
                   names[2]: ("exit 0", 0, "ok\n")}, got
    assert took < 10, took

    # every node fine: exit 0, one group; --node narrows
    res = runner.invoke(app, ["exec", "--nodes", inventory, "--node", names[0],
                              "--node", names[2], "--", "echo", "hello"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"---------------- {fold([names[0], names[2]])} (exit 0)", "hello",
                                       "---------------- 2 of 2 nodes exited 0"], res.output
