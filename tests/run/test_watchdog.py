"""The hang watchdog and suspicious success, on the real 3-node sandbox with the real cpu image.

A real ddp-smoke training (6 torch ranks over gloo, 3 nodes) in which global rank 3 stops
itself with SIGSTOP mid-training: the other five wait in the collective for ever, no
rank writes anything, and `launch --hang-timeout` must dump every rank's stacks with the
real py-spy in the image, save them, name rank 3, stop everything and exit 124.  And a
real gloo error that every process swallows (exit 0): the run is suspicious, exit 125.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import Cluster
from clusterctl.run import records
from clusterctl.run.flight import collect
from clusterctl.run.jobs import load_job
from clusterctl.run.launch import new_record
from clusterctl.run.plan import make_plan
from tests.fixtures import JOBS
from tests.run.test_launch import cli, run_containers

# seconds: the job's hang_start_line starts the clock at its first step line, so the silent
# start (torchrun and 6 ranks import torch on 2 shared cores: 30-60 s) has the start
# timeout (5 min) and this need only exceed the silence between two steps
HANG_TIMEOUT = 15


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_rank_that_stops_itself_is_found_named_and_the_run_torn_down(clean_nodes, cpu_image,  # noqa: F811
                                                                       runs_dir):  # noqa: F811
    sb = clean_nodes
    t0 = time.monotonic()
    res = cli("launch", "ddp-smoke", "--nodes", str(sb.inventory_path), "--image", cpu_image,
              "--hang-timeout", f"{HANG_TIMEOUT}s",
              "--set", "DDP_SMOKE_PROGRESS=1", "--set", "DDP_SMOKE_STEPS=300",
              "--set", "DDP_SMOKE_STEP_SECONDS=0.05", "--set", "DDP_SMOKE_STOP_RANK=3",
              "--set", "DDP_SMOKE_STOP_STEP=5", "--set", "DDP_SMOKE_TIMEOUT=900")
    took = time.monotonic() - t0
    print(res.output)
    print(f"hung run: launch returned after {took:.1f}s")
    assert res.exit_code == 124, res.output
    assert "rank 3 stops itself (SIGSTOP) before step 5" in res.output

    rec = records.list_runs()[0]
    assert rec.state == "hung" and rec.exit_code == 124 and rec.hang_timeout == HANG_TIMEOUT
    hang = rec.hang
    # detected within the timeout plus 5 s of the last line any rank wrote
    silent = (datetime.fromisoformat(hang["detected"]) - datetime.fromisoformat(hang["last_output"]))
    print(f"silence before the hang was declared: {silent.total_seconds():.1f}s "
          f"(timeout {HANG_TIMEOUT}s); stacks dumped in {hang['dump_seconds']:.1f}s")
    assert HANG_TIMEOUT <= silent.total_seconds() <= HANG_TIMEOUT + 5
    # the stopped rank, and only it, is named; the stopped process is seen as stopped
    assert [(o["node"], o["rank"]) for o in hang["odd_ranks"]] == [("node2", 3)], hang
    assert hang["odd_ranks"][0]["state"].startswith("T"), hang
    assert "node2 rank 3" in res.output and "ranks not with the majority" in res.output
    # one stack file per rank; the stopped one shows where it stopped, the others the collective
    stacks = rec.dir / "stacks"
    assert sorted(p.name for p in stacks.iterdir()) == sorted(
        f"node{r // 2 + 1}-rank{r}.txt" for r in range(6))
    stopped = (stacks / "node2-rank3.txt").read_text()
    assert "stop_here (ddp_smoke.py" in stopped and "T (stopped)" in stopped, stopped
    for r in (0, 1, 2, 4, 5):
        text = (stacks / f"node{r // 2 + 1}-rank{r}.txt").read_text()
        assert "train (ddp_smoke.py" in text and "stop_here" not in text, text
        assert "backward" in text, text   # DDP waits for the gradient all_reduce in backward()
    # nothing left running: no container of the run on any node (a stopped process included)
    for node in sb.nodes:
        assert run_containers(sb, node, rec.run_id) == [], node


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_exit_0_after_a_real_gloo_error_is_suspicious(clean_nodes, cpu_image, runs_dir):  # noqa: F811
    sb = clean_nodes
    res = cli("launch", str(JOBS / "collective-error.yaml"), "--nodes", str(sb.inventory_path),
              "--image", cpu_image)
    print(res.output)
    assert "leaves without a word" in res.output and "carries on as if nothing happened" in res.output
    assert res.exit_code == 125, res.output
    rec = records.list_runs()[0]
    assert rec.state == "suspicious" and rec.exit_code == 125
    assert [n.exit_code for n in rec.nodes] == [0, 0, 0]      # every process exited 0
    assert rec.collective_errors and all("caught:" in line for line in rec.collective_errors)
    assert "SUSPICIOUS: every container exited 0" in res.output
    for node in sb.nodes:
        assert run_containers(sb, node, rec.run_id) == [], node


@pytest.mark.sandbox
def test_flight_recorder_dumps_are_collected_and_removed_from_the_nodes_written_by_hand_no_gpu(
        sandbox3, runs_dir):  # noqa: F811
    """No GPU here, so no rank of a nccl job can write a flight recorder dump: the files a rank
    would write are put into each node's run directory by hand (over the node's real sshd),
    then the collection (launch's after a followed run, stop's after a detached one) copies
    them into runs/<id>/flight/<node>/ and leaves nothing on the node."""
    sb = sandbox3
    inv = load_inventory(sb.inventory_path)
    plans = make_plan(load_job("ddp-smoke-nccl"), inv, run_id="fr-test-1")
    rec = new_record(load_job("ddp-smoke-nccl"), inv, plans, "fr-test-1", image_id=None, detached=False)
    with Cluster(inv) as cluster:
        for p in plans[:2]:   # node3's rank wrote nothing
            cluster.connection(p.node).run(
                ["sh", "-c", 'mkdir -p "$1" && printf "trace of %s" "$2" > "$1/nccl_trace_rank_$3"',
                 "sh", p.flight_dir, p.node, str(p.rank * 2)], check=True)
        kept = collect(cluster, rec)
        left = {p.node: cluster.connection(p.node).run(["test", "-e", p.flight_dir.rsplit("/", 2)[0]]).exit_code
                for p in plans}
    assert kept == {"node1": ["nccl_trace_rank_0"], "node2": ["nccl_trace_rank_2"], "node3": []}
    assert (rec.dir / "flight" / "node2" / "nccl_trace_rank_2").read_text() == "trace of node2"
    assert not (rec.dir / "flight" / "node3").exists()
    assert left == {"node1": 1, "node2": 1, "node3": 1}   # the run's directory is gone from every node
