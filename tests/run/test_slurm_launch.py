"""`clusterctl launch --scheduler slurm` on a real Slurm cluster (the session's ``slurm3``:
munged, slurmctld and a slurmd per sandbox node) with the real cpu image, through the
real CLI as a user runs it.  No fakes.

ddp-smoke across 3 nodes exits 0 with identical weights and every node's prefix; a
failing rank makes launch exit with that rank's own code (srun's would be 143); `stop`
and SIGTERM cancel a running job; `--detach --json` returns at once and `logs --follow`,
`status`, `runs`, `stop` take the run from there; a job scancelled by hand ends as
"stopped" (exit 143, who stopped it), not as failed.  The sandbox's Slurm keeps no
accounting, so status falls back to scontrol and the records, for real (sacct's own output
is parsed in tests/run/test_slurm_track.py).  After each: no job in squeue, no container
of the run on any node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

FAIL_RANK = str(Path(__file__).parents[1] / "fixtures" / "jobs" / "fail-rank.yaml")
CLI = [sys.executable, "-m", "clusterctl"]


@pytest.fixture
def slurm_env(slurm3, tmp_path):
    return slurm3.env(CLUSTERCTL_RUNS=str(tmp_path / "runs"))


def _launch(slurm3, env, job, *extra, timeout=600):   # the first launch pushes 1.4 GB
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


def test_unknown_partition_names_the_valid_ones_and_submits_nothing(slurm3, slurm_cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, "ddp-smoke", "--image", slurm_cpu_image, "--run-id", "sl-part",
                  "--partition", "sandbx", timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--partition 'sandbx' is not a partition" in res.stderr
    assert 'did you mean "sandbox"' in res.stderr and "valid: sandbox" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (Path(slurm_env["CLUSTERCTL_RUNS"]) / "sl-part").exists()   # nothing written
    _nothing_left(slurm3, "sl-part")


def test_ddp_smoke_through_slurm_on_3_nodes_identical_weights(slurm3, slurm_cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, "ddp-smoke", "--image", slurm_cpu_image, "--run-id", "sl-ddp")
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


def test_failing_rank_gives_its_own_exit_code_and_leaves_nothing(slurm3, slurm_cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, FAIL_RANK, "--image", slurm_cpu_image, "--run-id", "sl-fail")
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]   # srun's own: 143
    assert "FIRST FAILURE: node2[1] exited 3" in res.stderr
    assert "node2[1]| node rank 1 failing with exit status 3" in res.stdout
    rec = _record(slurm_env, "sl-fail")
    assert rec["first_failure"]["node"] == "node2" and rec["exit_code"] == 3
    job = slurm3.slurm("scontrol", "-o", "show", "job", rec["slurm_job"]).stdout
    assert "ExitCode=143:0" in job or "ExitCode=137:0" in job or not job  # what srun says instead
    _nothing_left(slurm3, "sl-fail")


def _job_output(env, run_id) -> str:
    return "".join(p.read_text() for p in (Path(env["CLUSTERCTL_RUNS"]) / run_id).glob("slurm-*.out"))


def _start_hanging(slurm3, cpu_image, env, run_id, *extra):
    proc = subprocess.Popen([*CLI, "launch", FAIL_RANK, "--set", "FAIL_RANK=99", "--image", cpu_image,
                             "--scheduler", "slurm", "--nodes", str(slurm3.inventory_path),
                             "--run-id", run_id, *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 600     # a launch that has to push the 1.2 GB image takes minutes
    while time.monotonic() < deadline:
        if _job_output(env, run_id).count("started") >= 3:
            return proc
        if proc.poll() is not None and (not extra or proc.returncode != 0):   # --detach returns
            break
        time.sleep(1)
    proc.kill()
    slurm3.slurm("scancel", "--name", run_id)     # a killed launch cannot scancel its job
    pytest.fail(f"the hanging job did not start on 3 nodes: {proc.communicate()}")


def test_stop_cancels_a_running_slurm_run(slurm3, slurm_cpu_image, slurm_env):
    proc = _start_hanging(slurm3, slurm_cpu_image, slurm_env, "sl-stop")
    stop = subprocess.run([*CLI, "stop", "sl-stop"], env=slurm_env, capture_output=True, text=True,
                          timeout=180)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "cancelled and ended" in stop.stdout
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]     # stopped, not a success
    assert "stopped by clusterctl stop (" in err, err[-2000:]
    rec = _record(slurm_env, "sl-stop")
    assert (rec["state"], rec["exit_code"]) == ("stopped", 143)
    assert rec["stopped_by"].startswith("clusterctl stop (") and rec["first_failure"] is None
    assert {(n["state"], n["stopped_by"]) for n in rec["nodes"]} == {("stopped", rec["stopped_by"])}
    _nothing_left(slurm3, "sl-stop")


def test_sigterm_to_launch_scancels_and_exits_143(slurm3, slurm_cpu_image, slurm_env):
    proc = _start_hanging(slurm3, slurm_cpu_image, slurm_env, "sl-term")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert _record(slurm_env, "sl-term")["state"] == "interrupted"
    _nothing_left(slurm3, "sl-term")


def _cli(env, *args, timeout=180):
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_scancel_by_hand_ends_the_run_as_stopped_not_failed(slurm3, slurm_cpu_image, slurm_env):
    proc = _start_hanging(slurm3, slurm_cpu_image, slurm_env, "sl-hand")
    job = _record(slurm_env, "sl-hand")["slurm_job"]
    assert slurm3.slurm("scancel", job).returncode == 0          # outside clusterctl
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    rec = _record(slurm_env, "sl-hand")
    assert (rec["state"], rec["exit_code"], rec["first_failure"]) == ("stopped", 143, None)
    # no accounting here: Slurm cannot tell who; with sacct it names the user
    assert rec["stopped_by"] == "scancel outside clusterctl (who: unknown, no accounting to tell)"
    assert "stopped by scancel outside clusterctl" in err
    assert all(n["state"] == "stopped" and n["exit_code"] in (137, 143) for n in rec["nodes"])
    row = next(line for line in _cli(slurm_env, "runs").stdout.splitlines() if "sl-hand" in line)
    assert "stopped" in row and "143" in row and "FAILED" not in row, row
    _nothing_left(slurm3, "sl-hand")


def test_detach_json_then_logs_follow_status_runs(slurm3, slurm_cpu_image, slurm_env):
    res = _launch(slurm3, slurm_env, FAIL_RANK, "--image", slurm_cpu_image, "--run-id", "sl-det",
                  "--detach", "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rec = json.loads(res.stdout)                   # the record, at once: the job may not run yet
    assert rec["detached"] and rec["slurm_job"] and rec["state"] == "running", rec
    assert "node2[1]|" not in res.stdout + res.stderr          # nothing followed

    follow = _cli(slurm_env, "logs", "sl-det", "--follow")     # to the job's true end
    assert follow.returncode == 3, follow.stdout[-3000:] + follow.stderr[-3000:]
    assert "node2[1]| node rank 1 failing with exit status 3" in follow.stdout
    assert re.search(r"^node1\[0\]\| node rank 0 of 3 started$", follow.stdout, re.M), follow.stdout
    assert "FIRST FAILURE: node2[1] exited 3" in follow.stderr
    assert "run sl-det: failed, exit 3" in follow.stderr

    st = json.loads(_cli(slurm_env, "status", "sl-det", "--json").stdout)
    assert (st["state"], st["exit_code"]) == ("failed", 3)
    codes = {n["node"]: n["exit_code"] for n in st["nodes"]}
    assert codes["node2"] == 3 and {codes["node1"], codes["node3"]} <= {137, 143}   # killed by srun
    table = _cli(slurm_env, "status", "sl-det").stdout
    assert "Slurm job " + rec["slurm_job"] in table and "no accounting" in table, table
    listed = {r["run_id"]: r for r in json.loads(_cli(slurm_env, "runs", "--json").stdout)}
    assert (listed["sl-det"]["state"], listed["sl-det"]["exit_code"]) == ("failed", 3)
    again = _cli(slurm_env, "logs", "sl-det", "--node", "node2")
    assert "node2[1]| node rank 1 failing with exit status 3" in again.stdout
    assert "node1[0]" not in again.stdout
    _nothing_left(slurm3, "sl-det")


def test_stop_a_detached_slurm_run_records_who_stopped_it(slurm3, slurm_cpu_image, slurm_env):
    proc = _start_hanging(slurm3, slurm_cpu_image, slurm_env, "sl-dstop", "--detach")
    assert proc.wait(timeout=60) == 0
    st = _cli(slurm_env, "status", "sl-dstop")
    assert "RUNNING (from scontrol; no accounting" in st.stdout and "running" in st.stdout, st.stdout
    logs = _cli(slurm_env, "logs", "sl-dstop")                   # from the job's output file
    assert logs.stdout.count("started") == 3, logs.stdout
    # a container of the run that no task removes (as when Slurm kills a task slow to end,
    # and its `docker rm` with it): stop removes it once the job has left the queue
    slurm3.node_docker("node2", "run", "-d", "--label", "io.clusterctl.run=sl-dstop", "--name",
                       "sl-dstop-left", slurm_cpu_image, "sleep", "600")
    stop = _cli(slurm_env, "stop", "sl-dstop")
    assert stop.returncode == 0 and "cancelled and ended" in stop.stdout, stop.stdout + stop.stderr
    rec = _record(slurm_env, "sl-dstop")
    assert (rec["state"], rec["exit_code"]) == ("stopped", 143), rec
    assert rec["stopped_by"].startswith("clusterctl stop (")
    assert "sl-dstop: stopped by clusterctl stop (" in stop.stdout
    _nothing_left(slurm3, "sl-dstop")


def test_launch_finds_the_sandboxs_own_slurm_without_slurm_conf(slurm3, slurm_cpu_image, slurm_env):
    env = {k: v for k, v in slurm_env.items() if k != "SLURM_CONF"}     # a newcomer exports nothing
    res = _launch(slurm3, env, "ddp-smoke", "--image", slurm_cpu_image, "--run-id", "sl-noconf")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    said = " ".join(res.stderr.split())
    assert f'using the Slurm of sandbox "{slurm3.name}": SLURM_CONF={slurm3.slurm_conf}' in said, said
    weights = set(re.findall(r"weights-sha256=([0-9a-f]{64})", res.stdout))
    assert len(weights) == 1, weights
    assert re.search(r"ddp-smoke OK: \d+ ranks on 3 nodes", res.stdout), res.stdout[-3000:]
    rec = _record(env, "sl-noconf")
    assert (rec["scheduler"], rec["state"], rec["exit_code"]) == ("slurm", "succeeded", 0)
    # the job ran through that sandbox's Slurm: its slurmctld knows the job id
    assert rec["slurm_job"] in slurm3.slurm("scontrol", "-o", "show", "job", rec["slurm_job"]).stdout
    # a later command of the run (its recorded inventory) finds the same Slurm
    st = _cli(env, "status", "sl-noconf", "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["state"] == "succeeded", st.stdout + st.stderr
    assert f'using the Slurm of sandbox "{slurm3.name}"' in st.stderr
    _nothing_left(slurm3, "sl-noconf")


def test_a_failed_attempt_requeues_the_job_and_the_run_ends_succeeded(slurm3, slurm_cpu_image, slurm_env,
                                                                      tmp_path):
    """max_restarts 1: attempt 0 fails on every node (CLUSTERCTL_ATTEMPT is 0), the script
    requeues its own job, launch follows it through PENDING, attempt 1 (SLURM_RESTART_COUNT 1)
    succeeds; run.json lists both attempts.  Slurm holds a requeued job for cred_expire
    (120 s here): the test starts it sooner (scontrol update StartTime=now, as root), but
    not within the second of the requeue: slurmctld kills a batch job whose new credential is
    not newer than the revoked one ("Job credential revoked")."""
    job = tmp_path / "requeue.yaml"
    job.write_text(textwrap.dedent("""\
        description: test job - fails in attempt 0, succeeds once requeued
        target: cpu
        nproc_per_node: 1
        max_restarts: 1
        command: [sh, -c, 'echo "attempt $CLUSTERCTL_ATTEMPT of $CLUSTERCTL_RUN_ID"; test "$CLUSTERCTL_ATTEMPT" -ge 1']
        """))
    proc = subprocess.Popen([*CLI, "launch", str(job), "--image", slurm_cpu_image, "--scheduler", "slurm",
                             "--nodes", str(slurm3.inventory_path), "--run-id", "sl-rq"],
                            env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    started = None
    try:
        deadline = time.monotonic() + 600          # the first launch of a session pushes the image
        while time.monotonic() < deadline and proc.poll() is None:
            rec_path = Path(slurm_env["CLUSTERCTL_RUNS"]) / "sl-rq" / "run.json"
            job_id = json.loads(rec_path.read_text()).get("slurm_job") if rec_path.exists() else None
            if job_id:
                shown = slurm3.slurm("scontrol", "-o", "show", "job", job_id).stdout
                if "Restarts=1" in shown and "JobState=PENDING" in shown:
                    started = started or time.monotonic()
                    if time.monotonic() - started > 3:
                        slurm3.slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now")
            time.sleep(0.5)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            slurm3.slurm("scancel", "--name", "sl-rq")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert started is not None, "the job was never requeued"
    for node, rank in (("node1", 0), ("node2", 1), ("node3", 2)):
        assert f"{node}[{rank}]| attempt 1 of sl-rq" in out, out[-3000:]
    assert "attempt 0 of sl-rq" in out              # launch followed attempt 0 too, and went on
    rec = _record(slurm_env, "sl-rq")
    assert (rec["state"], rec["exit_code"], rec["attempt"], rec["max_restarts"]) == ("succeeded", 0, 1, 1)
    first, last = rec["attempts"]
    assert (first["attempt"], first["state"], first["exit_code"]) == (0, "failed", 1), first
    assert first["then"] == "requeued: restart 1/1"
    assert (last["attempt"], last["state"], last["exit_code"]) == (1, "succeeded", 0), last
    assert [n["exit_code"] for n in rec["nodes"]] == [0, 0, 0]
    assert "Restarts=1" in slurm3.slurm("scontrol", "-o", "show", "job", rec["slurm_job"]).stdout
    said = _job_output(slurm_env, "sl-rq")         # srun's status: the highest code, here 143
    assert re.search(r"^\[clusterctl\] requeue: attempt 0 failed \(exit \d+\), restart 1/1$", said, re.M), said
    _nothing_left(slurm3, "sl-rq")
