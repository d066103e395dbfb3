"""`clusterctl launch --scheduler slurm` on a real Slurm cluster (the session's ``slurm3``:
munged, slurmctld and a slurmd per sandbox node) with the real cpu image, through the
real CLI as a user runs it.  No fakes.

ddp-smoke across 3 nodes exits 0 with identical weights and every node's prefix; a
failing rank makes launch exit with that rank's own code (srun's would be 143); `stop`
and SIGTERM cancel a running job.  After each: no job in squeue, no container of the run
on any node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

FAIL_RANK = str(Path(__file__).parents[1] / "fixtures" / "jobs" / "fail-rank.yaml")
CLI = [sys.executable, "-m", "clusterctl"]


@pytest.fixture
def slurm_env(slurm3, tmp_path):
    return slurm3.env(CLUSTERCTL_RUNS=str(tmp_path / "runs"))


def _launch(slurm3, env, job, *extra, timeout=300):
    return subprocess.run([*CLI, "launch", job, "--scheduler", "slurm", "--nodes",
                           str(slurm3.inventory_path), *extra], env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _nothing_left(slurm3, run_id):
    queue = slurm3.slurm("squeue", "-h", "-o", "%i %j", check=True).stdout
    assert run_id not in queue, f"a Slurm job of {run_id} is still queued:\n{queue}"
    for node in slurm3.nodes:
        ps = slurm3.node_docker(node, "ps", "-a", "--format", "{{.Names}}").stdout
        assert run_id not in ps, f"{node} still has a container of {run_id}: {ps}"


def _record(env, run_id):
    return json.loads((Path(env["CLUSTERCTL_RUNS"]) / run_id / "run.json").read_text())


def test_unknown_partition_names_the_valid_ones_and_submits_nothing(slurm3, cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, "ddp-smoke", "--image", cpu_image, "--run-id", "sl-part",
                  "--partition", "sandbx", timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--partition 'sandbx' is not a partition" in res.stderr
    assert 'did you mean "sandbox"' in res.stderr and "valid: sandbox" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (Path(slurm_env["CLUSTERCTL_RUNS"]) / "sl-part").exists()   # nothing written
    _nothing_left(slurm3, "sl-part")


def test_ddp_smoke_through_slurm_on_3_nodes_identical_weights(slurm3, cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, "ddp-smoke", "--image", cpu_image, "--run-id", "sl-ddp")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for node, rank in (("node1", 0), ("node2", 1), ("node3", 2)):
        assert re.search(rf"^{node}\[{rank}\]\| ", res.stdout, re.M), f"no {node}[{rank}]| line"
    weights = set(re.findall(r"weights-sha256=([0-9a-f]{64})", res.stdout))
    assert len(weights) == 1, weights
    ok = re.search(r"ddp-smoke OK: (\d+) ranks on 3 nodes", res.stdout)
    assert ok, res.stdout[-3000:]
    assert len(re.findall(r"weights-sha256=", res.stdout)) == int(ok.group(1))   # every rank
    rec = _record(slurm_env, "sl-ddp")
    assert (rec["scheduler"], rec["state"], rec["exit_code"]) == ("slurm", "succeeded", 0)
    assert rec["slurm_job"] and [n["exit_code"] for n in rec["nodes"]] == [0, 0, 0]
    merged = (Path(slurm_env["CLUSTERCTL_RUNS"]) / "sl-ddp" / "merged.log").read_text()
    assert "node3[2]| " in merged
    # the containers know every node's name (--add-host), so c10d does not warn on each rank
    assert "hostname of the client socket cannot be retrieved" not in res.stdout
    _nothing_left(slurm3, "sl-ddp")


def test_failing_rank_gives_its_own_exit_code_and_leaves_nothing(slurm3, cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, FAIL_RANK, "--image", cpu_image, "--run-id", "sl-fail")
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]   # srun's own: 143
    assert "FIRST FAILURE: node2[1] exited 3" in res.stderr
    assert "node2[1]| node rank 1 failing with exit status 3" in res.stdout
    rec = _record(slurm_env, "sl-fail")
    assert rec["first_failure"]["node"] == "node2" and rec["exit_code"] == 3
    job = slurm3.slurm("scontrol", "-o", "show", "job", rec["slurm_job"]).stdout
    assert "ExitCode=143:0" in job or "ExitCode=137:0" in job or not job  # what srun says instead
    _nothing_left(slurm3, "sl-fail")


def _start_hanging(slurm3, cpu_image, env, run_id):
    proc = subprocess.Popen([*CLI, "launch", FAIL_RANK, "--set", "FAIL_RANK=99", "--image", cpu_image,
                             "--scheduler", "slurm", "--nodes", str(slurm3.inventory_path),
                             "--run-id", run_id], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    out = Path(env["CLUSTERCTL_RUNS"]) / run_id / "merged.log"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if out.is_file() and out.read_text().count("started") >= 3:
            return proc
        if proc.poll() is not None:
            break
        time.sleep(1)
    proc.kill()
    slurm3.slurm("scancel", "--name", run_id)     # a killed launch cannot scancel its job
    pytest.fail(f"the hanging job did not start on 3 nodes: {proc.communicate()}")


def test_stop_cancels_a_running_slurm_run(slurm3, cpu_image, slurm_env):
    proc = _start_hanging(slurm3, cpu_image, slurm_env, "sl-stop")
    stop = subprocess.run([*CLI, "stop", "sl-stop"], env=slurm_env, capture_output=True, text=True,
                          timeout=180)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "cancelled and ended" in stop.stdout
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (137, 143), out[-2000:] + err[-2000:]     # stopped, not a success
    _nothing_left(slurm3, "sl-stop")


def test_sigterm_to_launch_scancels_and_exits_143(slurm3, cpu_image, slurm_env):
    proc = _start_hanging(slurm3, cpu_image, slurm_env, "sl-term")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert _record(slurm_env, "sl-term")["state"] == "interrupted"
    _nothing_left(slurm3, "sl-term")
