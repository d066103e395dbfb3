"""Runs that survive failures, on the real 3-node sandbox, through the real CLI.

Faults come from outside the job (a node's link cut, a rank's exit), real torchrun and
gloo processes train ddp-smoke with a checkpoint directory on the host (every sandbox
node's engine sees this machine's files: shared storage, as on a real cluster), and the
run resumed on the spare must end with the weights of a run that lost nothing.  The
cheap rules (crash loop, no spare, shrinking) use a shell command instead of torch.
Timings are printed, never asserted; the figures are in docs/benchmarks/recovery.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core import exitcodes
from clusterctl.run import faults, records

runner = CliRunner()
pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

DIGEST = re.compile(r"weights-sha256=([0-9a-f]{64})")


def inventory(sb, tmp_path: Path, *, spare: str | None) -> Path:
    """The sandbox's inventory, ``spare`` marked as a hot spare (None: every node active)."""
    data = yaml.safe_load(sb.inventory_path.read_text())
    for node in data["nodes"]:
        if node["name"] == spare:
            node["spare"] = True
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def shell_job(tmp_path: Path, script: str, **keys) -> Path:
    """A job whose command is ``sh -c SCRIPT`` on every node (no torch: fast)."""
    job = {"target": "cpu", "command": ["sh", "-c", script], **keys}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def smoke(inv: Path, image: str, checkpoint: Path, *extra: str):
    t0 = time.monotonic()
    res = runner.invoke(app, ["launch", "ddp-smoke", "--nodes", str(inv), "--image", image,
                              "--nproc-per-node", "1", "--checkpoint", str(checkpoint),
                              "--set", "DDP_SMOKE_STEPS=8", "--set", "DDP_SMOKE_STEP_SECONDS=1",
                              "--set", "DDP_SMOKE_TIMEOUT=60", *extra])
    print(f"ddp-smoke {' '.join(extra)}: {time.monotonic() - t0:.1f}s")
    return res


def latest_step(checkpoint: Path) -> int:
    try:
        return json.loads((checkpoint / "latest").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


@pytest.fixture(scope="module")
def reference(sandbox3, cpu_image, tmp_path_factory):
    """The weights of the job when nothing is lost (2 nodes, the third a spare, as below)."""
    tmp = tmp_path_factory.mktemp("reference")
    os.environ["CLUSTERCTL_RUNS"] = str(tmp / "runs")
    try:
        res = smoke(inventory(sandbox3, tmp, spare=list(sandbox3.nodes)[2]), cpu_image, tmp / "ck",
                    "--max-restarts", "1")
    finally:
        os.environ.pop("CLUSTERCTL_RUNS", None)
    assert res.exit_code == 0, res.output
    want = set(DIGEST.findall(res.output))
    assert len(want) == 1, res.output
    return want


def inject(sb, kind: str, node: str) -> None:
    """The fault, from outside the job, as `clusterctl fault` injects it (the run: the newest)."""
    faults.inject(kind, node, nodes=sb.inventory_path)


def heal(sb, kind: str, node: str) -> None:
    again = {"link-down": "link-up", "engine-stop": "engine-start"}.get(kind)
    if again:
        faults.inject(again, node, nodes=sb.inventory_path)


#: the hang watchdog for the sigstop fault: its clock starts at ddp-smoke's first step line
#: (the job's hang_start_line; DDP_SMOKE_PROGRESS=1 prints one per step), so the silent
#: start needs no allowance here and a stopped rank is found 15 s after the last step line
SIGSTOP_HANG = ("--hang-timeout", "15s", "--set", "DDP_SMOKE_PROGRESS=1")


@pytest.mark.parametrize("fault", ["link-down", "engine-stop", "kill", "sigstop"])
def test_a_fault_from_outside_ends_in_a_run_with_the_uninterrupted_weights(
        clean_nodes, cpu_image, runs_dir, tmp_path, reference, fault):
    """link-down and engine-stop lose node2: node3 (the spare) takes its rank; a killed
    container (a signal blames no node) restarts in place; a SIGSTOPped rank (a hang: the
    watchdog names node2's rank once, fewer than exclude_after times) restarts in place too.
    Every rank resumes from the checkpoint and the final weights are those of the run that
    lost nothing."""
    sb = clean_nodes
    [n1, n2, n3] = list(sb.nodes)
    inv = inventory(sb, tmp_path, spare=n3)
    checkpoint = tmp_path / "ck"
    cut: list[float] = []

    def strike() -> None:
        deadline = time.monotonic() + 240
        while latest_step(checkpoint) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        cut.append(time.time())
        inject(sb, fault, n2)

    t = threading.Thread(target=strike, daemon=True)
    t.start()
    try:
        res = smoke(inv, cpu_image, checkpoint, "--max-restarts", "2",
                    *(SIGSTOP_HANG if fault == "sigstop" else ()))
    finally:
        t.join(timeout=30)
        heal(sb, fault, n2)
    assert cut, "the run never checkpointed step 3"
    assert res.exit_code == 0, res.output
    rec = records.list_runs()[0]
    assert [a.attempt for a in rec.attempts] == [0, 1]
    if fault in ("kill", "sigstop"):
        assert rec.attempts[0].ended == (f"{n2} exit 137 (SIGKILL)" if fault == "kill"
                                         else f"hung (odd: {n2})") and rec.excluded == {}, rec.attempts[0]
        assert [(n.node, n.rank) for n in rec.attempts[1].nodes] == [(n1, 0), (n2, 1)]
    else:
        assert rec.attempts[0].ended == f"{n2} lost" and rec.attempts[0].replaced == {n2: n3}
        assert list(rec.excluded) == [n2]
        assert [(n.node, n.rank) for n in rec.attempts[1].nodes] == [(n1, 0), (n3, 1)]
    # the second attempt resumed from a checkpoint (not from step 0) on every rank ...
    resumed = re.findall(r"rank (\d) resumed from step (\d+) of 8 \(attempt 1\)", res.output)
    assert sorted(r for r, _ in resumed) == ["0", "1"] and all(int(s) >= 3 for _, s in resumed), res.output
    # ... and ends with exactly the weights of the run that lost nothing
    assert set(DIGEST.findall(res.output.split("attempt 1 on")[-1])) == reference, res.output
    timings = rec.attempts[0].timings
    print(f"{fault}: -> noticed {timings['noticed'] - cut[0]:.1f}s, -> stopped "
          f"{timings['stopped'] - cut[0]:.1f}s; attempt 1 started "
          f"{rec.attempts[1].started.timestamp() - cut[0]:.1f}s after the fault")
    # goal 10 s (a hang: the hang timeout, 15 s, and the stacks' dump); slack for a busy CI
    assert timings["noticed"] - cut[0] <= (15.0 + 10.0 if fault == "sigstop" else 10.0) + 5.0, timings


def test_a_crash_that_repeats_is_a_crash_loop_and_stops_itself(clean_nodes, cpu_image, runs_dir, tmp_path):
    sb = clean_nodes
    job = shell_job(tmp_path, 'if [ "$NODE_RANK" = 1 ]; then echo "cannot open data.bin"; exit 3; fi; sleep 30',
                    max_restarts=5, exclude_after=2)
    res = runner.invoke(app, ["launch", str(job), "--nodes", str(inventory(sb, tmp_path, spare=None)),
                              "--image", cpu_image])
    assert res.exit_code == exitcodes.CRASH_LOOP, res.output
    rec = records.list_runs()[0]
    assert len(rec.attempts) == 2 and rec.state == "failed"
    assert "the same failure 2 times in a row" in rec.note and "cannot open data.bin" in rec.note
    assert "crash loop" in res.output


def test_without_a_spare_the_run_ends_clearly_or_shrinks_when_the_job_allows(
        clean_nodes, cpu_image, runs_dir, tmp_path):
    sb = clean_nodes
    [_, n2, _] = list(sb.nodes)
    script = ('echo "attempt $CLUSTERCTL_ATTEMPT nnodes $NNODES excluded=$CLUSTERCTL_EXCLUDED_NODES"; '
              'if [ "$CLUSTERCTL_ATTEMPT" = 0 ] && [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 2')
    inv = inventory(sb, tmp_path, spare=None)
    # no spare, no nnodes: n2 is excluded (exclude_after 1) and nothing can take its rank
    job = shell_job(tmp_path, script, max_restarts=2, exclude_after=1)
    res = runner.invoke(app, ["launch", str(job), "--nodes", str(inv), "--image", cpu_image])
    assert res.exit_code == exitcodes.NOT_ENOUGH_NODES, res.output
    rec = records.list_runs()[0]
    assert list(rec.excluded) == [n2] and "no spare is left" in rec.note and "needs 3" in rec.note
    # nnodes 2:3: it goes on with the two nodes left
    job = shell_job(tmp_path, script, max_restarts=2, exclude_after=1, nnodes="2:3")
    res = runner.invoke(app, ["launch", str(job), "--nodes", str(inv), "--image", cpu_image])
    assert res.exit_code == 0, res.output
    rec = records.list_runs()[0]
    assert [len(a.nodes) for a in rec.attempts] == [3, 2]
    assert f"attempt 1 nnodes 2 excluded={n2}" in res.output
    # the attempts' logs are kept apart, and `logs --attempt` shows each
    first = runner.invoke(app, ["logs", rec.run_id, "--attempt", "0"])
    assert "attempt 0 nnodes 3" in first.output and "attempt 1" not in first.output
    status = runner.invoke(app, ["status", rec.run_id])
    assert "attempt 0: " in status.output and f"excluded: {n2}" in status.output, status.output


def clusterctl(*args: str, **kw):
    """The real command, in a process of its own (a supervisor forks from it)."""
    return subprocess.run([sys.executable, "-m", "clusterctl", *args], capture_output=True,
                          text=True, timeout=300, **kw)


def test_a_detached_run_is_supervised_attach_follows_it_and_resume_takes_it_over(
        clean_nodes, cpu_image, runs_dir, tmp_path):
    sb = clean_nodes
    script = ('echo "attempt $CLUSTERCTL_ATTEMPT rank $NODE_RANK FOO=$FOO"; sleep 6; '
              'if [ "$CLUSTERCTL_ATTEMPT" = 0 ] && [ "$NODE_RANK" = 1 ]; then echo broke; exit 3; fi')
    job = shell_job(tmp_path, script, max_restarts=2)
    inv = inventory(sb, tmp_path, spare=None)
    # 1. detached: the launching process returns once the containers run; the supervisor
    # (its own session: no terminal to lose) restarts the run and attach follows it to the end
    started = clusterctl("launch", str(job), "--nodes", str(inv), "--image", cpu_image,
                         "--set", "FOO=bar", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"run (\S+) is running detached, supervised by pid (\d+)", started.stdout)
    assert run_id, started.stdout
    rid, pid = run_id.group(1), int(run_id.group(2))
    assert os.getsid(pid) == pid          # a session of its own
    attached = clusterctl("attach", rid)
    assert attached.returncode == 0, attached.stderr
    assert "attempt 1 rank 1 FOO=bar" in attached.stdout and "succeeded, exit 0" in attached.stderr
    assert [a.state for a in records.load(rid).attempts] == ["failed", "succeeded"]

    # 2. the supervisor killed (SIGKILL) mid-attempt: the containers run on, findable; attach
    # says nobody follows; launch --resume takes the run over and restarts it as it would have
    started = clusterctl("launch", str(job), "--nodes", str(inv), "--image", cpu_image,
                         "--set", "FOO=bar", "--detach")
    rid, pid = re.search(r"run (\S+) is running detached, supervised by pid (\d+)", started.stdout).groups()
    os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while records.launcher_gone(records.load(rid).launcher) is not True and time.monotonic() < deadline:
        time.sleep(0.1)
    lost = clusterctl("attach", rid)
    assert lost.returncode == 1 and f"launch --resume {rid}" in lost.stderr, lost.stderr
    resumed = clusterctl("launch", "--resume", rid)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rec = records.load(rid)
    assert [a.state for a in rec.attempts] == ["failed", "succeeded"] and rec.state == "succeeded"
    assert "attempt 1 rank 1 FOO=bar" in resumed.stdout       # its --set carried over
    # the adopted attempt's log was rewritten whole from the containers
    assert "attempt 0 rank 1 FOO=bar" in (rec.dir / "merged.log").read_text()
