"""`clusterctl top` end to end on real parts without a sandbox: a recorded ssh run whose
containers are real (on the local engine the loopback sshd's sessions reach), so the node
read (one `sh` script a node: docker stats, docker logs, the GPU tools looked for), its
parsing, the rates, the idle marking and the Prometheus file are all exercised.

node1's container spins, printing a metrics line per step; node2's printed three lines a
while ago and sleeps; node3 is an address where nothing listens.  The ddp-smoke training on
the sandbox: tests/run/test_top_sandbox.py.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.run import records
from tests.fixtures.sshd import free_port
from tests.run.test_metrics import parse_exposition

BUSY = ('i=0; while true; do i=$((i+1)); echo "clusterctl-metrics {\\"rank\\": 0, \\"step\\": $i, '
        '\\"samples\\": $((i*8)), \\"loss\\": 0.5, \\"time\\": $(date +%s.%N)}"; j=0; '
        'while [ $j -lt 3000 ]; do j=$((j+1)); done; done')
QUIET = ('t=$(($(date +%s) - 100)); for i in 1 2 3; do echo "clusterctl-metrics {\\"rank\\": 1, '
         '\\"step\\": $i, \\"samples\\": $((i*8)), \\"time\\": $((t+i))}"; done; exec sleep 300')


def test_top_once_on_real_containers(loopback_sshd, docker_client, base_image, tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("CLUSTERCTL_NODES", raising=False)
    sshd = loopback_sshd
    inv = sshd.write_inventory(nodes=["node1", "node2", sshd.node("node3", 2, port=free_port())])
    tag = uuid.uuid4().hex[:8]
    containers = [docker_client.containers.run(base_image, ["sh", "-c", script], detach=True, remove=True,
                                               network_mode="none",  # docker0 may be gone
                                               name=f"clusterctl-top-test-{tag}-{r}",
                                               labels={"io.clusterctl.test": tag})
                  for r, script in enumerate((BUSY, QUIET, "exec sleep 300"))]
    try:
        rec = records.RunRecord(run_id="t1", job="ddp-smoke", inventory=str(inv), image=base_image,
                                state="running",
                                nodes=[records.NodeRecord(node=f"node{r + 1}", host="h", rank=r,
                                                          container=c.name) for r, c in enumerate(containers)])
        (tmp_path / "runs" / "t1").mkdir(parents=True)
        (tmp_path / "runs" / "t1" / records.RECORD_NAME).write_text(records.dump(rec))
        time.sleep(1.5)   # node1 steps a while
        prom = tmp_path / "t1.prom"
        t0 = time.monotonic()
        res = CliRunner().invoke(app, ["top", "--once", "--json", "--window", "10", "--timeout", "5",
                                       "--prometheus", str(prom)])   # no RUN: the newest running
        took = time.monotonic() - t0
        assert res.exit_code == 1, res.output   # node3 did not answer
        got = json.loads(res.output)
        rows = {r["node"]: r for r in got["nodes"]}
        print(f"top --once: {took:.2f}s, read {got['read_seconds']}s;", json.dumps(got, indent=1))
        assert got["run"] == "t1" and list(rows) == ["node1", "node2", "node3"]
        busy, quiet, down = rows["node1"], rows["node2"], rows["node3"]
        assert busy["error"] is None and busy["problems"] == [] and busy["cpu_percent"] > 20
        assert busy["memory_bytes"] > 0 and busy["memory_limit_bytes"] > busy["memory_bytes"]
        assert busy["steps_per_s"] > 1 and busy["samples_per_s"] == pytest.approx(8 * busy["steps_per_s"])
        assert busy["last_loss"] == 0.5 and not busy["idle"]
        assert quiet["steps_per_s"] == 0.0 and quiet["last_step"] == 3 and quiet["cpu_percent"] < 5
        assert quiet["idle"] and quiet["idle_why"] == "no step in the window while others step (last step 3)"
        assert down["error"].startswith("unreachable") and down["cpu_percent"] is None and not down["idle"]
        assert took < 20
        fam = parse_exposition(prom.read_text())
        assert {lab["node"]: v for lab, v in fam["clusterctl_run_node_up"]} == {"node1": 1, "node2": 1, "node3": 0}
        assert {lab["node"]: v for lab, v in fam["clusterctl_run_idle"]} == {"node1": 0, "node2": 1, "node3": 0}

        table = CliRunner().invoke(app, ["top", "t1", "--once", "--window", "10", "--timeout", "5"])
        assert table.exit_code == 1, table.output
        text = " ".join(table.output.split())
        assert "idle: no step in the window" in text and "unreachable" in text, table.output
    finally:
        for c in containers:
            c.remove(force=True)
