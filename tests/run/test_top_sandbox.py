"""`clusterctl top` on the real 3-node sandbox: a detached ddp-smoke training (real torchrun and
gloo in the cpu image) with rank 1 slowed: it sleeps its step pause while ranks 0 and 2 spend
theirs computing (DDP_SMOKE_BUSY), as a rank stalled on its data would while the others work.

`top --once --json` must show every node's container CPU and memory (docker stats on each
node's own engine) and step rates (the metrics lines every rank prints), mark node2 idle and
not the others, and write the Prometheus text file; with node3's link cut it must name node3
as not answering within its --timeout and still show the two others.  Timings are printed.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.run import faults
from tests.run.test_metrics import parse_exposition

runner = CliRunner()
pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]


def top_once(run_id: str, *extra: str) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    res = runner.invoke(app, ["top", run_id, "--once", "--json", *extra])
    took = time.monotonic() - t0
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.output.strip().splitlines()[-1]), took


def test_top_shows_each_node_and_marks_the_idle_one(clean_nodes, cpu_image, runs_dir, tmp_path):
    sb = clean_nodes
    [n1, n2, n3] = list(sb.nodes)
    run_id = f"top-{uuid.uuid4().hex[:6]}"
    res = runner.invoke(app, [
        "launch", "ddp-smoke", "--nodes", str(sb.inventory_path), "--image", cpu_image,
        "--nproc-per-node", "1", "--detach", "--run-id", run_id,
        "--set", "DDP_SMOKE_STEPS=100000", "--set", "DDP_SMOKE_STEP_SECONDS=0.3",
        "--set", "DDP_SMOKE_BUSY=1", "--set", "DDP_SMOKE_SLOW_RANK=1",
        "--set", "DDP_SMOKE_METRICS=1", "--set", "DDP_SMOKE_TIMEOUT=60"])
    assert res.exit_code == 0, res.output
    prom = tmp_path / "textfile" / "clusterctl.prom"
    try:
        deadline = time.monotonic() + 180
        # torch imports and the rendezvous first: until every rank has stepped for longer than
        # the 10 s window (0.3 s a step), so that no rank's CPU counts its start (node2's did: 9.9%)
        while True:
            code, got, took = top_once(run_id, "--prometheus", str(prom), "--window", "10")
            rows = {r["node"]: r for r in got["nodes"]}
            if all((r["steps_per_s"] or 0) > 0 and r["cpu_percent"] is not None
                   and (r["last_step"] or 0) >= 50 for r in rows.values()) \
                    and rows[n1]["cpu_percent"] > 25 and rows[n3]["cpu_percent"] > 25:
                break
            assert time.monotonic() < deadline, json.dumps(got, indent=1)
            time.sleep(2)
        print(f"top --once --json: {took:.2f}s, nodes read in {got['read_seconds']}s")
        print(json.dumps(got, indent=1))
        assert code == 0 and list(rows) == [n1, n2, n3]
        assert [rows[n]["rank"] for n in (n1, n2, n3)] == [0, 1, 2]
        for r in rows.values():
            assert r["error"] is None and r["problems"] == [], r
            assert r["memory_bytes"] > 10 << 20 and r["memory_limit_bytes"] > r["memory_bytes"]
            assert r["last_step"] > 0 and r["samples_per_s"] == pytest.approx(64 * r["steps_per_s"])
            assert r["gpu_tool"] is None and r["gpus"] == []   # the sandbox has no GPU tools
        # DDP keeps the ranks in lockstep: the same step rate, but node2 sleeps while the others work
        assert rows[n2]["cpu_percent"] < 5.0, rows[n2]
        assert rows[n2]["idle"] is True and rows[n2]["idle_why"].startswith("CPU "), rows[n2]
        assert not rows[n1]["idle"] and not rows[n3]["idle"]

        fam = parse_exposition(prom.read_text())
        assert {lab["node"]: v for lab, v in fam["clusterctl_run_idle"]} == {n1: 0, n2: 1, n3: 0}
        assert {lab["run"] for lab, _ in fam["clusterctl_run_steps_per_second"]} == {run_id}

        # a node that does not answer is named after --timeout (+2 s), the others still shown
        faults.inject("link-down", n3, nodes=sb.inventory_path, run_id=run_id)
        try:
            code, got, took = top_once(run_id, "--timeout", "3")
        finally:
            faults.inject("link-up", n3, nodes=sb.inventory_path, run_id=run_id)
        rows = {r["node"]: r for r in got["nodes"]}
        print(f"with {n3}'s link down: {took:.2f}s: {rows[n3]['error']}")
        assert code == 1 and rows[n3]["error"] and rows[n3]["cpu_percent"] is None
        assert rows[n1]["error"] is None and rows[n1]["cpu_percent"] is not None
        assert took < 20, took
    finally:
        stopped = runner.invoke(app, ["stop", run_id])
        assert stopped.exit_code == 0, stopped.output
