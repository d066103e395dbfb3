"""`clusterctl shell` and `clusterctl port-forward`: which container (node rank 0 by default,
--rank, --node), and bad input refused before any node is contacted, naming what there is
(exit 2).  The terminal and the forward on real nodes: tests/run/test_shell_sandbox.py."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.portforward import PortSpec, parse_spec
from clusterctl.core.errors import UserError
from clusterctl.run import interactive, records
from tests.fixtures import INVENTORIES

INVENTORY = INVENTORIES / "good_full.yaml"


def _record(run_id: str, state: str = "running", **kw) -> records.RunRecord:
    nodes = [records.NodeRecord(node=f"node{r + 1}", host="h", rank=r, container=f"{run_id}-c{r}")
             for r in (1, 0)]                    # not in rank order: the default is rank 0, not the first
    return records.RunRecord(run_id=run_id, job="ddp-smoke", inventory=str(INVENTORY), image="x",
                             state=state, nodes=nodes, **kw)


@pytest.fixture
def runs(monkeypatch, tmp_path):
    """Recorded runs in a runs dir of the test's: r1 running (ranks 0, 1 on node1, node2), f1
    failed, s1 a running Slurm run."""
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("CLUSTERCTL_NODES", raising=False)
    for rec in (_record("r1"), _record("f1", "failed", exit_code=3),
                _record("s1", scheduler="slurm", slurm_job="42")):
        (tmp_path / "runs" / rec.run_id).mkdir(parents=True)
        (tmp_path / "runs" / rec.run_id / records.RECORD_NAME).write_text(records.dump(rec))


@pytest.mark.parametrize("kwargs, expected", [
    ({}, ("node1", 0, "r1-c0")),
    ({"rank": 1}, ("node2", 1, "r1-c1")),
    ({"node": "node1"}, ("node1", 0, "r1-c0")),
    ({"node": "node2"}, ("node2", 1, "r1-c1")),
])
def test_the_container_is_node_rank_0_s_unless_a_rank_or_node_is_named(runs, kwargs, expected):
    got = interactive.place(records.load("r1"), load_inventory(INVENTORY), **kwargs)
    assert (got.node, got.rank, got.container) == expected


@pytest.mark.parametrize("text, spec", [
    ("8888", PortSpec(8888, 8888)), ("8888:18888", PortSpec(8888, 18888)), ("1:0", PortSpec(1, 0)),
    (" 6006 ", PortSpec(6006, 6006)), ("65535:65535", PortSpec(65535, 65535)),
])
def test_port_specs(text, spec):
    assert parse_spec(text) == spec


@pytest.mark.parametrize("text, why", [
    ("", "is not a port spec"), ("http", "is not a port spec"), ("80:", "is not a port spec"),
    (":80", "is not a port spec"), ("80:81:82", "is not a port spec"), ("-1", "is not a port spec"),
    ("0", "the node's port 0 is out of range"), ("65536", "the node's port 65536 is out of range"),
    ("80:70000", "the local port 70000 is out of range"), ("123456", "is not a port spec"),
])
def test_a_bad_port_spec_names_what_is_valid(text, why):
    with pytest.raises(UserError) as e:
        parse_spec(text)
    assert why in e.value.message and "valid: PORT or PORT:LOCAL" in e.value.message
    assert "1-65535" in e.value.message


@pytest.mark.parametrize("args, message", [
    (["shell", "r1", "--rank", "5"], "--rank 5: run r1 has no rank 5; valid: 0 or 1"),
    (["shell", "r1", "--node", "node3"], "run r1 has no node 'node3'"),
    (["shell", "r1", "--node", "node1", "--rank", "1"], "give --rank N or --node NAME, not both"),
    (["shell", "f1"], "run f1 is not running: it is failed (exit 3), so it has no container to enter; "
                      "running: s1, r1."),     # newest first
    (["shell", "s1"], "run s1 ran through slurm (job 42)"),
    (["shell", "nosuchrun"], "no run 'nosuchrun'"),
    (["shell", "--nodes", str(INVENTORY), "node9"], "--node node9: inventory"),
    (["shell", "--nodes", str(INVENTORY), "r1"], "('r1' is a run: `clusterctl shell r1` opens a shell"),
    (["shell", "--nodes", str(INVENTORY), "--rank", "1", "node1"], "--rank and --node choose a run's"),
    (["port-forward", "r1", "http"], "port 'http' is not a port spec; valid: PORT or PORT:LOCAL"),
    (["port-forward", "r1", "8888:99999"], "the local port 99999 is out of range"),
    (["port-forward", "r1", "1", "2"], "unexpected extra argument"),
    (["port-forward"], "no port to forward: give [RUN] PORT[:LOCAL]"),
    (["port-forward", "r1", "8888", "--rank", "2"], "--rank 2: run r1 has no rank 2; valid: 0 or 1"),
    (["port-forward", "f1", "8888"], "run f1 is not running: it is failed (exit 3)"),
])
def test_bad_input_is_named_and_exits_2(runs, args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_a_local_port_in_use_is_named_before_any_node_is_contacted(runs):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        # node1's host (good_full.yaml) is not reachable from here: the port is checked first
        result = CliRunner().invoke(app, ["port-forward", "r1", f"8888:{port}"])
    assert result.exit_code == 2, result.output
    assert (f"local port {port} on 127.0.0.1 is in use; give another as PORT:LOCAL (8888:0: any "
            "free port)") in " ".join(result.output.split()), result.output
