"""examples/ddp_smoke.py for real: torchrun, gloo, 2 nodes x 2 processes.

The two "nodes" are two ``--net=host`` containers on the local engine, started
from the ``ddp-smoke`` job's own plan (node ranks 0 and 1, master 127.0.0.1,
GLOO_SOCKET_IFNAME=lo), so the job file, the plan, the cpu image (built from
this checkout, examples/ copied to /opt/clusterctl/examples) and the script are
tested together.  The negative tests prove the weight check can fail; a run killed
mid-training and started again with its checkpoint directory must end with the weights
of a run never interrupted.  The script's checkpoint file helpers are also tested
directly (no Docker, no torch needed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import textwrap
import uuid

import pytest

from clusterctl.cluster import engine
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport import command_line
from clusterctl.run.jobs import load_job
from clusterctl.run.plan import Attempt, make_plan, parse_sets
from tests.fixtures import REPO

RANK_LINE = re.compile(r"^rank (\d+)/(\d+) node=(\d+) local_rank=(\d+) "
                       r"weights-sha256=([0-9a-f]{64}) steps=(\d+) loss0=(\S+)$", re.M)


def real(test):
    """A test that runs the script in containers on the local engine."""
    return pytest.mark.docker(pytest.mark.slow(test))


@pytest.fixture
def smoke_image(request):
    """The cpu target image (torch + gloo)."""
    return request.getfixturevalue("cpu_image")


def new_run_id() -> str:
    return f"smoketest-{uuid.uuid4().hex[:8]}"


def remove_run(docker_client, rid: str) -> None:
    """Remove every container of run ``rid``."""
    for c in docker_client.containers.list(all=True, filters={"label": f"io.clusterctl.run={rid}"}):
        c.remove(force=True)


@pytest.fixture
def run_id(docker_client):
    """A unique run id; its containers are removed afterwards, also on failure."""
    rid = new_run_id()
    yield rid
    remove_run(docker_client, rid)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_smoke(tmp_path, image: str, run_id: str, nodes: int, sets: list[str],
              attempt: Attempt | None = None) -> list[tuple[int, str]]:
    """Plan ddp-smoke on ``nodes`` loopback nodes, start every container, return (status, logs).
    ``attempt``: which attempt of the run (its number and checkpoint directory), as launch plans it."""
    hosts = "\n".join(f"  - {{name: node{i + 1}, host: 127.0.0.{i + 1}}}" for i in range(nodes))
    inv_file = tmp_path / "inv.yaml"
    inv_file.write_text(textwrap.dedent(f"master_port: {free_port()}\nnodes:\n") + hosts + "\n")
    plans = make_plan(load_job("ddp-smoke"), load_inventory(inv_file), run_id=run_id, image=image,
                      interfaces={f"node{i + 1}": "lo" for i in range(nodes)},
                      overrides=parse_sets(["DDP_SMOKE_TIMEOUT=60", *sets]), attempt=attempt)
    env = {**os.environ, "DOCKER_HOST": engine.engine_url() or ""}
    for plan in plans:  # the node's login shell would get exactly this command line
        subprocess.run(["sh", "-c", command_line(plan.argv)], input=plan.stdin, env=env,
                       check=True, capture_output=True, timeout=60)
    results = []
    for plan in plans:
        status = subprocess.run(["docker", "wait", plan.container], env=env, check=True,
                                capture_output=True, text=True, timeout=300)
        logs = subprocess.run(["docker", "logs", plan.container], env=env, check=True,
                              capture_output=True, text=True, timeout=60)
        results.append((int(status.stdout), logs.stdout + logs.stderr))
    return results


@pytest.fixture(scope="module")
def six_steps(docker_client, cpu_image, tmp_path_factory):
    """An uninterrupted run of 6 steps on 2 nodes x 2 processes, without checkpoints: checked
    by the first test, and the reference the resumed run must match bit for bit."""
    rid = new_run_id()
    try:
        yield run_smoke(tmp_path_factory.mktemp("six-steps"), cpu_image, rid, nodes=2,
                        sets=["DDP_SMOKE_STEPS=6"])
    finally:
        remove_run(docker_client, rid)


@real
def test_two_nodes_two_procs_train_to_identical_weights(six_steps):
    results = six_steps
    logs = "\n".join(out for _, out in results)
    assert [status for status, _ in results] == [0, 0], logs
    ranks = {int(m[0]): m for m in RANK_LINE.findall(logs)}
    assert sorted(ranks) == [0, 1, 2, 3], logs
    assert {m[1] for m in ranks.values()} == {"4"}                     # world size
    assert sorted((m[2], m[3]) for m in ranks.values()) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {m[5] for m in ranks.values()} == {"6"}                     # steps
    assert len({m[4] for m in ranks.values()}) == 1                    # one weights digest
    assert len({m[6] for m in ranks.values()}) == 4                    # each rank saw its own data
    digest = ranks[0][4]
    assert f"ddp-smoke OK: 4 ranks on 2 nodes hold identical weights sha256={digest}" in results[0][1]


@real
def test_a_rank_with_different_weights_fails_every_node(tmp_path, smoke_image, run_id):
    results = run_smoke(tmp_path, smoke_image, run_id, nodes=2, sets=["DDP_SMOKE_PERTURB_RANK=3"])
    logs = "\n".join(out for _, out in results)
    assert all(status != 0 for status, _ in results), logs
    ranks = {int(m[0]): m[4] for m in RANK_LINE.findall(logs)}
    assert sorted(ranks) == [0, 1, 2, 3] and ranks[0] == ranks[1] == ranks[2] != ranks[3], logs
    assert "ddp-smoke FAILED" in results[0][1] and "rank(s) 3 disagree with rank 0" in logs
    assert "ddp-smoke OK" not in logs


@real
def test_no_training_is_not_a_pass(tmp_path, smoke_image, run_id):
    [(status, out)] = run_smoke(tmp_path, smoke_image, run_id, nodes=1, sets=["DDP_SMOKE_STEPS=0"])
    assert status != 0 and "weights did not change during training" in out, out


@real
def test_a_run_killed_after_step_3_resumes_to_the_weights_of_an_uninterrupted_run(
        tmp_path, smoke_image, run_id, six_steps):
    """Attempt 0 loses rank 1 before step 4; attempt 1 (the plan of the next attempt: same nodes,
    CLUSTERCTL_ATTEMPT=1) resumes every rank from step 3 and ends with the uninterrupted run's
    weights.  The plan mounts the checkpoint directory at its own path on both "nodes"."""
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    sets = ["DDP_SMOKE_STEPS=6", "DDP_SMOKE_FAIL_RANK=1", "DDP_SMOKE_FAIL_STEP=4"]

    failed = run_smoke(tmp_path, smoke_image, run_id, nodes=2, sets=sets,
                       attempt=Attempt(0, checkpoint=str(ckpt)))
    logs = "\n".join(out for _, out in failed)
    assert all(status != 0 for status, _ in failed), logs
    assert ("rank 1 fails on purpose with exit 1 before step 4 (attempt 0): "
            "DDP_SMOKE_FAIL_RANK test hook") in failed[0][1], logs
    assert not RANK_LINE.search(logs) and "resumed" not in logs, logs
    assert json.loads((ckpt / "latest").read_text()) == {"step": 3, "world_size": 4, "steps": 6}
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-2", "step-3"]  # the last 2 kept
    assert sorted(p.name for p in (ckpt / "step-3").iterdir()) == [f"rank-{r}.pt" for r in range(4)]

    resumed = run_smoke(tmp_path, smoke_image, run_id, nodes=2, sets=sets,
                        attempt=Attempt(1, checkpoint=str(ckpt)))
    logs = "\n".join(out for _, out in resumed)
    assert [status for status, _ in resumed] == [0, 0], logs
    for rank in range(4):
        assert f"rank {rank} resumed from step 3 of 6 (attempt 1)" in logs, logs
    assert "fails on purpose" not in logs
    ranks = {int(m[0]): m for m in RANK_LINE.findall(logs)}
    reference = {int(m[0]): m for m in RANK_LINE.findall("\n".join(out for _, out in six_steps))}
    assert sorted(ranks) == sorted(reference) == [0, 1, 2, 3], logs
    digest = ranks[0][4]
    print(f"resumed run weights-sha256={digest}, uninterrupted {reference[0][4]}")
    assert {m[4] for m in ranks.values()} == {m[4] for m in reference.values()} == {digest}
    assert all(ranks[r][6] == reference[r][6] for r in ranks)  # each rank's first loss, from step 3's checkpoint
    assert f"ddp-smoke OK: 4 ranks on 2 nodes hold identical weights sha256={digest} after 6 steps" in resumed[0][1]
    assert json.loads((ckpt / "latest").read_text())["step"] == 6


# --------------------------------------------------------------------------- the checkpoint files
# The script's pure helpers, imported from the checkout (the script imports without torch).

@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("ddp_smoke", REPO / "examples" / "ddp_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checkpoint(smoke, root, step: int, ranks) -> None:
    """A step directory holding the files of ``ranks`` (content does not matter here)."""
    for rank in ranks:
        path = smoke.rank_file(str(root), step, rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        smoke.atomic_write(path, b"weights")


def test_resume_from_the_step_latest_names(smoke, tmp_path):
    assert smoke.resume_step(str(tmp_path), 2) == (0, None)  # no latest: from the start
    for step in (1, 2):
        checkpoint(smoke, tmp_path, step, [0, 1])
    smoke.write_latest(str(tmp_path), 2, world=2, steps=6)
    assert smoke.read_latest(str(tmp_path)) == {"step": 2, "world_size": 2, "steps": 6}
    assert smoke.resume_step(str(tmp_path), 2) == (2, None)


@pytest.mark.parametrize("step3", [[0], []], ids=["incomplete", "missing"])
def test_a_latest_naming_an_incomplete_or_missing_step_falls_back(smoke, tmp_path, step3):
    checkpoint(smoke, tmp_path, 1, [0, 1])
    checkpoint(smoke, tmp_path, 2, [0, 1])
    checkpoint(smoke, tmp_path, 3, step3)
    checkpoint(smoke, tmp_path, 4, [0, 1])  # newer than latest (a crashed attempt's): never used
    smoke.write_latest(str(tmp_path), 3, world=2, steps=6)
    step, note = smoke.resume_step(str(tmp_path), 2)
    assert step == 2 and note == f"checkpoint step 3 in {tmp_path} is missing or incomplete: resuming from step 2"
    for step in (1, 2):
        os.unlink(smoke.rank_file(str(tmp_path), step, 1))
    assert smoke.resume_step(str(tmp_path), 2) == (
        0, f"no complete checkpoint at or before step 3 in {tmp_path}: starting from step 0")


def test_checkpoints_of_another_world_size_are_refused_naming_the_directory(smoke, tmp_path):
    checkpoint(smoke, tmp_path, 5, range(4))
    smoke.write_latest(str(tmp_path), 5, world=4, steps=6)
    with pytest.raises(smoke.CheckpointError, match=re.escape(f"{tmp_path} holds the checkpoints of a run of 4 ranks")):
        smoke.resume_step(str(tmp_path), 2)
    (tmp_path / "latest").write_text("3\n")  # not what the script writes
    with pytest.raises(smoke.CheckpointError, match=re.escape(str(tmp_path / "latest"))):
        smoke.resume_step(str(tmp_path), 4)


def test_atomic_write_leaves_the_old_file_or_the_new_one(smoke, tmp_path):
    path = str(tmp_path / "latest")
    smoke.atomic_write(path, b"old")
    smoke.atomic_write(path, b"new")
    with pytest.raises(TypeError):
        smoke.atomic_write(path, "not bytes")  # fails while writing the temp file
    assert (tmp_path / "latest").read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["latest"]  # no temp file left


def test_prune_keeps_the_last_two_steps_and_any_newer(smoke, tmp_path):
    for step in range(1, 7):
        checkpoint(smoke, tmp_path, step, [0])
    (tmp_path / "step-x").mkdir()  # not a step directory: left alone
    smoke.prune(str(tmp_path), 4)
    assert sorted(os.listdir(tmp_path)) == ["step-3", "step-4", "step-5", "step-6", "step-x"]
    assert smoke.step_numbers(str(tmp_path)) == [6, 5, 4, 3]
