"""run.top: idle marking, the samples kept between refreshes, a snapshot's JSON and
Prometheus text, which run `top` reads (fast tier; the nodes are read for real in
tests/run/test_top_sandbox.py)."""

from __future__ import annotations

import json
from collections import deque
from datetime import UTC, datetime, timedelta

import pytest

from clusterctl.cluster import nodetop
from clusterctl.core.errors import UserError
from clusterctl.core.nodestats import GpuUse
from clusterctl.run import metrics, records
from clusterctl.run import top as run_top
from clusterctl.run.metrics import NodeMetrics, Rates
from tests.run.test_metrics import parse_exposition

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def node(name: str, rank: int, *, steps: float | None = 2.0, cpu: float | None = 90.0,
         gpu: float | None = None, error: str | None = None) -> NodeMetrics:
    return NodeMetrics(node=name, rank=rank, rates=Rates(steps, None if steps is None else steps * 64, 10, 0.5),
                       cpu_percent=cpu, memory_bytes=1 << 30,
                       gpus=() if gpu is None else (GpuUse(0, gpu, 1 << 30, 80 << 30),), error=error)


def test_the_marker_is_the_same_in_the_node_read_and_in_metrics():
    assert nodetop.METRICS_MARKER == metrics.MARKER


def test_mark_idle_a_node_that_stopped_stepping():
    got = run_top.mark_idle({"n1": node("n1", 0), "n2": node("n2", 1, steps=0.0, cpu=95.0),
                             "n3": node("n3", 2)})
    assert [n for n, m in got.items() if m.idle] == ["n2"]
    assert got["n2"].idle_why == "no step in the window while others step (last step 10)"


def test_mark_idle_by_cpu_when_the_steps_are_in_lockstep():
    """DDP keeps every rank at the same step rate: a rank that sleeps while the others
    compute is seen by its CPU."""
    got = run_top.mark_idle({"n1": node("n1", 0, cpu=97.0), "n2": node("n2", 1, cpu=0.4),
                             "n3": node("n3", 2, cpu=88.0)})
    assert [n for n, m in got.items() if m.idle] == ["n2"]
    assert got["n2"].idle_why == "CPU 0.4% while others work"


def test_mark_idle_by_accelerator_utilization():
    got = run_top.mark_idle({"n1": node("n1", 0, gpu=99.0, cpu=30.0), "n2": node("n2", 1, gpu=0.0, cpu=30.0)})
    assert got["n2"].idle and got["n2"].idle_why == "accelerators at 0% while others work"
    assert not got["n1"].idle


@pytest.mark.parametrize("nodes", [
    {"n1": node("n1", 0, cpu=1.0), "n2": node("n2", 1, cpu=2.0)},          # all quiet: nobody idle
    {"n1": node("n1", 0, steps=0.0), "n2": node("n2", 1, steps=0.0)},      # all stopped
    {"n1": node("n1", 0, cpu=1.0)},                                         # alone
    {"n1": node("n1", 0, cpu=1.0, steps=None), "n2": node("n2", 1, error="timeout")},  # the busy one is down
])
def test_mark_idle_needs_another_node_working(nodes):
    assert not any(m.idle for m in run_top.mark_idle(nodes).values())


def test_a_node_that_did_not_answer_is_not_idle_but_named():
    got = run_top.mark_idle({"n1": node("n1", 0), "n2": NodeMetrics("n2", 1, error="timeout: no answer")})
    assert not got["n2"].idle and got["n2"].error == "timeout: no answer"


def line(rank: int, step: int, t: float) -> str:
    return f'clusterctl-metrics {{"rank": {rank}, "step": {step}, "samples": {step * 8}, "time": {t}}}'


def test_keep_samples_across_refreshes_without_counting_a_line_twice():
    kept: dict = {}
    first = run_top.keep_samples(kept, [line(0, s, 100 + s) for s in range(5)] + ["noise"])
    assert [s.step for s in first] == [0, 1, 2, 3, 4]
    again = run_top.keep_samples(kept, [line(0, s, 100 + s) for s in range(2, 8)]
                                 + [line(1, 1, 103)])
    assert [(s.rank, s.step) for s in again] == [(0, s) for s in range(8)] + [(1, 1)]
    assert metrics.rates([s for s in again if s.rank == 0]).steps_per_s == pytest.approx(1.0)
    restart = run_top.keep_samples(kept, [line(0, 1, 200)])   # a new attempt: step 1, later time
    assert restart[8].step == 1 and restart[8].time == 200 and restart[9].rank == 1


def test_keep_samples_is_bounded():
    kept: dict = {}
    run_top.keep_samples(kept, [line(0, s, s) for s in range(1000)], keep=10)
    assert isinstance(kept[0], deque) and [s.step for s in kept[0]] == list(range(990, 1000))


def snapshot() -> run_top.Snapshot:
    nodes = run_top.mark_idle({"n1": node("n1", 0, gpu=90.0), "n2": node("n2", 1, steps=0.0),
                               "n3": NodeMetrics("n3", 2, error="unreachable: connection refused")})
    return run_top.Snapshot(run_id="ddp-smoke-x", time=1764369000.0, read_s=1.25, nodes=nodes,
                            problems={"n1": ("container 1234: gone",)},
                            gpu_tools={"n1": "nvidia-smi", "n2": None, "n3": None})


def test_snapshot_json():
    got = json.loads(json.dumps(snapshot().as_json()))
    assert got["run"] == "ddp-smoke-x" and got["read_seconds"] == 1.25
    rows = {r["node"]: r for r in got["nodes"]}
    assert rows["n2"]["idle"] is True and rows["n2"]["idle_why"].startswith("no step")
    assert rows["n1"]["gpus"] == [{"index": 0, "util_percent": 90.0, "memory_used_bytes": 1 << 30,
                                   "memory_total_bytes": 80 << 30}]
    assert rows["n1"]["gpu_tool"] == "nvidia-smi" and rows["n1"]["problems"] == ["container 1234: gone"]
    assert rows["n3"]["error"] == "unreachable: connection refused" and rows["n3"]["cpu_percent"] is None


def test_write_prometheus_atomically_and_it_parses(tmp_path):
    path = tmp_path / "textfile" / "clusterctl.prom"
    run_top.write_prometheus(path, snapshot())
    fam = parse_exposition(path.read_text())
    assert {labels["node"]: v for labels, v in fam["clusterctl_run_idle"]} == {"n1": 0, "n2": 1, "n3": 0}
    assert {labels["node"]: v for labels, v in fam["clusterctl_run_node_up"]}["n3"] == 0
    assert [p.name for p in path.parent.iterdir()] == ["clusterctl.prom"]  # no temp file left


def rec(run_id: str, minutes: int, state: str, uid: int | None = None, **kw) -> records.RunRecord:
    r = records.RunRecord(run_id=run_id, job="ddp-smoke", inventory="/x/inv.yaml", image="img:1",
                          started=T0 + timedelta(minutes=minutes), state=state,
                          nodes=[records.NodeRecord(node="node1", host="h", rank=0, container="c1")], **kw)
    r.save()
    return r


def test_newest_running_is_the_callers_newest_running_run(runs_dir):
    rec("old-running", 1, "running")
    rec("newer-failed", 5, "failed")
    assert run_top.newest_running().run_id == "old-running"


def test_newest_running_says_when_none_runs(runs_dir):
    rec("done", 1, "succeeded")
    with pytest.raises(UserError, match="none of your runs is running: the newest, done, is succeeded"):
        run_top.newest_running()


def test_where_refuses_a_slurm_run_and_a_node_missing_from_the_inventory(runs_dir, tmp_path):
    from clusterctl.cluster.inventory import load_inventory
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: node1\n    host: 10.0.0.1\n")
    inventory = load_inventory(inv)
    ssh_run = rec("r1", 1, "running")
    assert [(w.node, w.rank, w.container) for w in run_top.where(ssh_run, inventory)] == [("node1", 0, "c1")]
    with pytest.raises(UserError, match="ran through slurm"):
        run_top.where(rec("r2", 2, "running", scheduler="slurm"), inventory)
    other = rec("r3", 3, "running")
    other.nodes[0].node = "node9"
    with pytest.raises(UserError, match=r"node\(s\) node9 are not in inventory"):
        run_top.where(other, inventory)
