"""`clusterctl exec`: bad input is refused before any node is contacted, naming what is wrong
(exit 2).  The command on real nodes: tests/cluster/test_exec_sandbox.py."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.run import records
from tests.fixtures import INVENTORIES

INVENTORY = INVENTORIES / "good_full.yaml"


@pytest.fixture
def runs(monkeypatch, tmp_path):
    """A recorded ssh run on node1 and node2 (ranks 0, 1) and a Slurm run, in a runs dir of the test's."""
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("CLUSTERCTL_NODES", raising=False)
    for run_id, scheduler in (("r1", "ssh"), ("s1", "slurm")):
        rec = records.RunRecord(run_id=run_id, job="ddp-smoke", inventory=str(INVENTORY), image="x",
                                scheduler=scheduler, slurm_job="42" if scheduler == "slurm" else None,
                                state="running",
                                nodes=[records.NodeRecord(node=f"node{r + 1}", host="h", rank=r,
                                                          container=f"c{r}") for r in range(2)])
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / records.RECORD_NAME).write_text(records.dump(rec))


@pytest.mark.parametrize("args, message", [
    (["exec", "--nodes", str(INVENTORY)], "no command to run: put it after --"),
    (["exec", "--nodes", str(INVENTORY), "--"], "no command to run: put it after --"),
    (["exec", "--", "uptime"], "nothing to run on: give --nodes FILE"),
    (["exec", "--nodes", str(INVENTORY), "--node", "nodeX", "--", "uptime"],
     "--node nodeX: inventory"),
    (["exec", "--nodes", str(INVENTORY), "--rank", "99", "--", "uptime"], "has no rank 99; valid: 0, 1"),
    (["exec", "r1", "--rank", "5", "--", "uptime"], "--rank 5: run r1 has no rank 5; valid: 0 or 1"),
    (["exec", "r1", "--node", "node3", "--", "uptime"], "run r1 has no node 'node3'"),
    (["exec", "s1", "--", "uptime"], "run s1 ran through slurm (job 42)"),
    (["exec", "nosuchrun", "--", "uptime"], "nosuchrun"),
])
def test_bad_input_is_named_and_exits_2(runs, args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_a_run_s_container_gets_the_runtime_s_exec_of_the_command(runs):
    from clusterctl.cluster.inventory import load_inventory
    from clusterctl.run.execute import targets
    got = targets(records.resolve("r1"), load_inventory(INVENTORY), ["echo", "$RANK"], ranks=[1])
    assert [(t.node, t.rank, t.argv) for t in got] == [
        ("node2", 1, ("docker", "exec", "c1", "sh", "-c", "echo $RANK"))]


@pytest.mark.parametrize("mode", ["direct", "tree"])
def test_on_real_sshd_outputs_fold_and_each_node_s_end_is_named(loopback_sshd, monkeypatch, mode):
    """Four nodes on a real sshd (each at its own loopback address, which the command reads
    from $SSH_CONNECTION) and one whose port nothing listens on: the same output once, the
    odd ones out after it, a timeout named within seconds, an unreachable node named; the
    same through the tree (``ssh.tree: true``: the four through one connection)."""
    from clusterctl.cluster.transport import tree
    from tests.fixtures.sshd import free_port
    sshd = loopback_sshd
    nodes = [sshd.node(f"node{i + 1}", i) for i in range(4)] + [
        sshd.node("node5", 4, port=free_port(sshd.hosts[4]))]
    inv = sshd.write_inventory(nodes=nodes, ssh={"connect_timeout": 3, "tree": mode == "tree",
                                                 "tree_width": 2})
    seen, real = [], tree.run_commands
    monkeypatch.setattr(tree, "run_commands", lambda *a, **k: real(*a, **k, on_tree=seen.append))
    by_address = (f'case "$SSH_CONNECTION" in *" {sshd.hosts[1]} "*) sleep 30;; '
                  f'*" {sshd.hosts[3]} "*) echo odd; exit 3;; *) echo same;; esac')
    started = time.monotonic()
    res = CliRunner().invoke(app, ["exec", "--nodes", str(inv), "--timeout", "2", "--", by_address])
    took = time.monotonic() - started
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[:5] == ["---------------- node[1,3] (exit 0)", "same", "---------------- node2 (timeout)",
                         "---------------- node4 (exit 3)", "odd"], res.output
    assert lines[5].startswith("---------------- node5 (unreachable: "), res.output
    assert lines[-1] == "---------------- 2 of 5 nodes exited 0; not: node[2,4-5]", res.output
    assert took < 12, took
    went = seen[0]["tree"] if mode == "tree" else seen[0]["direct"]
    assert {"node1", "node2", "node3", "node4"} <= set(went), seen

    res = CliRunner().invoke(app, ["exec", "--nodes", str(inv), "--rank", "0", "--rank", "2", "--json",
                                   "--", "echo", "$((6 * 7))"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == [
        {"node": n, "rank": r, "status": "exit 0", "exit_code": 0, "output": "42\n", "cut": False,
         "error": None} for n, r in (("node1", 0), ("node3", 2))]


def test_output_over_the_cap_is_cut_and_said(loopback_sshd, monkeypatch):
    from clusterctl.cluster import execute
    monkeypatch.setattr(execute, "OUTPUT_CAP", 10)
    inv = loopback_sshd.write_inventory(nodes=1)
    res = CliRunner().invoke(app, ["exec", "--nodes", str(inv), "--", "seq 1 100000; echo end >&2; exit 5"])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines() == ["---------------- node1 (exit 5)", "1", "2", "3", "4", "5",
                                       "(output cut at 1 MiB on node1)",
                                       "---------------- 0 of 1 nodes exited 0; not: node1"], res.output


def test_in_a_run_each_container_runs_the_command(loopback_sshd, docker_client, base_image, runs, tmp_path):
    """A recorded ssh run whose two containers are real (on the engine the loopback sshd's
    sessions talk to): the command runs inside each (its own hostname), `--rank` narrows."""
    import uuid
    sshd = loopback_sshd
    inv = sshd.write_inventory(nodes=2)
    tag = uuid.uuid4().hex[:8]
    containers = [docker_client.containers.run(base_image, ["sleep", "300"], detach=True, remove=True,
                                               network_mode="none",  # docker0 may be gone
                                               name=f"clusterctl-exec-test-{tag}-{r}",
                                               hostname=f"box{r}", labels={"io.clusterctl.test": tag})
                  for r in range(2)]
    try:
        rec = records.RunRecord(run_id="x1", job="ddp-smoke", inventory=str(inv), image=base_image,
                                state="running",
                                nodes=[records.NodeRecord(node=f"node{r + 1}", host="h", rank=r,
                                                          container=c.name) for r, c in enumerate(containers)])
        (tmp_path / "runs" / "x1").mkdir(parents=True)
        (tmp_path / "runs" / "x1" / records.RECORD_NAME).write_text(records.dump(rec))
        res = CliRunner().invoke(app, ["exec", "x1", "--", "echo in $(hostname); test $(hostname) = box0"])
        assert res.exit_code == 1, res.output
        assert res.output.splitlines() == ["---------------- node1 (exit 0)", "in box0",
                                           "---------------- node2 (exit 1)", "in box1",
                                           "---------------- 1 of 2 nodes exited 0; not: node2"], res.output
        res = CliRunner().invoke(app, ["exec", "x1", "--rank", "1", "--json", "--", "hostname"])
        assert res.exit_code == 0, res.output
        assert [(o["node"], o["rank"], o["output"]) for o in json.loads(res.output)] == [("node2", 1, "box1\n")]
    finally:
        for c in containers:
            c.remove(force=True)
