"""examples/ddp_smoke.py for real: torchrun, gloo, 2 nodes x 2 processes.

The two "nodes" are two ``--net=host`` containers on the local engine, started
from the ``ddp-smoke`` job's own plan (node ranks 0 and 1, master 127.0.0.1,
GLOO_SOCKET_IFNAME=lo), so the job file, the plan, the cpu image (built from
this checkout, examples/ copied to /opt/clusterctl/examples) and the script are
tested together.  The negative tests prove the weight check can fail.
"""

from __future__ import annotations

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
from clusterctl.run.plan import make_plan, parse_sets

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RANK_LINE = re.compile(r"^rank (\d+)/(\d+) node=(\d+) local_rank=(\d+) "
                       r"weights-sha256=([0-9a-f]{64}) steps=(\d+) loss0=(\S+)$", re.M)


@pytest.fixture
def smoke_image(request):
    """The cpu target image (torch + gloo)."""
    return request.getfixturevalue("cpu_image")


@pytest.fixture
def run_id(docker_client):
    """A unique run id; its containers are removed afterwards, also on failure."""
    rid = f"smoketest-{uuid.uuid4().hex[:8]}"
    yield rid
    for c in docker_client.containers.list(all=True, filters={"label": f"io.clusterctl.run={rid}"}):
        c.remove(force=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_smoke(tmp_path, image: str, run_id: str, nodes: int, sets: list[str]) -> list[tuple[int, str]]:
    """Plan ddp-smoke on ``nodes`` loopback nodes, start every container, return (status, logs)."""
    hosts = "\n".join(f"  - {{name: node{i + 1}, host: 127.0.0.{i + 1}}}" for i in range(nodes))
    inv_file = tmp_path / "inv.yaml"
    inv_file.write_text(textwrap.dedent(f"master_port: {free_port()}\nnodes:\n") + hosts + "\n")
    plans = make_plan(load_job("ddp-smoke"), load_inventory(inv_file), run_id=run_id, image=image,
                      interfaces={f"node{i + 1}": "lo" for i in range(nodes)},
                      overrides=parse_sets(["DDP_SMOKE_TIMEOUT=60", *sets]))
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


def test_two_nodes_two_procs_train_to_identical_weights(tmp_path, smoke_image, run_id):
    results = run_smoke(tmp_path, smoke_image, run_id, nodes=2, sets=["DDP_SMOKE_STEPS=4"])
    logs = "\n".join(out for _, out in results)
    assert [status for status, _ in results] == [0, 0], logs
    ranks = {int(m[0]): m for m in RANK_LINE.findall(logs)}
    assert sorted(ranks) == [0, 1, 2, 3], logs
    assert {m[1] for m in ranks.values()} == {"4"}                     # world size
    assert sorted((m[2], m[3]) for m in ranks.values()) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {m[5] for m in ranks.values()} == {"4"}                     # steps
    assert len({m[4] for m in ranks.values()}) == 1                    # one weights digest
    assert len({m[6] for m in ranks.values()}) == 4                    # each rank saw its own data
    digest = ranks[0][4]
    assert f"ddp-smoke OK: 4 ranks on 2 nodes hold identical weights sha256={digest}" in results[0][1]


def test_a_rank_with_different_weights_fails_every_node(tmp_path, smoke_image, run_id):
    results = run_smoke(tmp_path, smoke_image, run_id, nodes=2, sets=["DDP_SMOKE_PERTURB_RANK=3"])
    logs = "\n".join(out for _, out in results)
    assert all(status != 0 for status, _ in results), logs
    ranks = {int(m[0]): m[4] for m in RANK_LINE.findall(logs)}
    assert sorted(ranks) == [0, 1, 2, 3] and ranks[0] == ranks[1] == ranks[2] != ranks[3], logs
    assert "ddp-smoke FAILED" in results[0][1] and "rank(s) 3 disagree with rank 0" in logs
    assert "ddp-smoke OK" not in logs


def test_no_training_is_not_a_pass(tmp_path, smoke_image, run_id):
    [(status, out)] = run_smoke(tmp_path, smoke_image, run_id, nodes=1, sets=["DDP_SMOKE_STEPS=0"])
    assert status != 0 and "weights did not change during training" in out, out
