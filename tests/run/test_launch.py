"""`clusterctl launch` and friends on a real 3-node sandbox with the real cpu image.

Every integration test here talks to real parts: the nodes' own sshd and
dockerd (sandbox3), real `docker run --net=host` containers, real torch
processes.  Each test removes the containers it created on every node (the
`clean_nodes` fixture), also when it fails.  Timings are printed, never asserted.
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
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import containers
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.runtime import runtime_for
from clusterctl.cluster.transport import Cluster
from clusterctl.run import launch, records, supervise
from clusterctl.run.jobs import load_job
from tests.fixtures import JOBS, REPO
from tests.fixtures.sandbox import kept_login_dirs

FAIL_RANK_JOB = JOBS / "fail-rank.yaml"
runner = CliRunner()

integration = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]


# --------------------------------------------------------------------------- helpers

def run_containers(sb, node: str, run_id: str | None = None, *, running: bool = False) -> list[str]:
    """Names of containers of a run (any run when None) on a node, read from its own dockerd."""
    label = containers.RUN_LABEL + (f"={run_id}" if run_id else "")
    argv = ["ps", "--filter", f"label={label}", "--format", "{{.Names}}"]
    if not running:
        argv.insert(1, "-a")
    return sb.node_docker(node, *argv).stdout.split()


def cli(*args: str):
    return runner.invoke(app, list(args))


def run_id_from(output: str) -> str:
    m = re.search(r"run (\S+): \d+ containers running", output) or re.search(r"run (\S+) ", output)
    assert m, output
    return m.group(1)


def write_job(tmp_path: Path, name: str, image: str, code: str) -> Path:
    """A one-process job file running ``python3 -c code`` (no braces: they are placeholders)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"image": image, "nproc_per_node": 1,
                                    "command": ["python3", "-u", "-c", code]}))
    return path


# --------------------------------------------------------------------------- the real thing

@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_ddp_smoke_on_three_nodes(clean_nodes, cpu_image, runs_dir):
    sb = clean_nodes
    t0 = time.monotonic()
    res = cli("launch", "ddp-smoke", "--nodes", str(sb.inventory_path), "--image", cpu_image)
    print(f"ddp-smoke on 3 nodes: {time.monotonic() - t0:.1f}s (push included)")
    assert res.exit_code == 0, res.output
    out = res.output

    # every rank reports its weights; DDP is right only if all six are identical.  The two
    # processes of a node share the container's stdout, so their reports may share a line:
    # each line's prefix must still name the node the reports in it come from.
    ranks = {}
    report = re.compile(r"rank (\d+)/(\d+) node=(\d+) local_rank=\d weights-sha256=([0-9a-f]{64})")
    for line in out.splitlines():
        m = re.match(r"^(node\d)\[(\d)\]\| ", line)
        for rank, world, node_rank, digest in report.findall(line):
            assert m, line
            assert m.group(2) == node_rank and m.group(1) == f"node{int(node_rank) + 1}", line
            assert world == "6"
            ranks[int(rank)] = digest
    assert sorted(ranks) == list(range(6)), out
    assert len(set(ranks.values())) == 1, ranks
    assert "ddp-smoke OK: 6 ranks on 3 nodes" in out
    for node, rank in (("node1", 0), ("node2", 1), ("node3", 2)):
        assert f"{node}[{rank}]| " in out

    record = records.list_runs()[0]
    assert record.state == "succeeded" and record.exit_code == 0
    assert [n.exit_code for n in record.nodes] == [0, 0, 0]
    # the recorded ID is the image the nodes ran (the tag itself may have moved since:
    # other sessions rebuild it in the same engine)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", record.image_id)
    assert sb.node_docker("node3", "image", "inspect", "--format", "{{.Id}}", record.image_id,
                          ).stdout.strip() == record.image_id
    assert Path(record.inventory) == sb.inventory_path.absolute()
    assert record.nodes[2].env["NODE_RANK"] == "2" and record.nodes[2].env["GLOO_SOCKET_IFNAME"] == "eth0"
    for node in sb.nodes:
        text = (runs_dir / record.run_id / f"{node}.log").read_text()
        assert "weights-sha256=" in text and not text.startswith(f"{node}[")  # raw lines
        assert run_containers(sb, node, record.run_id) == []  # launch removed them
    assert json.loads((runs_dir / record.run_id / "run.json").read_text())["run_id"] == record.run_id


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_failing_rank_ends_the_run_with_its_code(clean_nodes, cpu_image, runs_dir):
    """The LAST node fails (so "first in the list" would be wrong); the others would sleep an hour."""
    sb = clean_nodes
    res = cli("launch", str(FAIL_RANK_JOB), "--nodes", str(sb.inventory_path), "--image", cpu_image,
              "--set", "FAIL_RANK=2", "--set", "FAIL_AFTER=4")
    assert res.exit_code == 3, res.output
    summary = res.output[res.output.index("FIRST FAILURE"):]
    assert summary.startswith("FIRST FAILURE: node3[2] exited 3"), summary
    assert "node rank 2 failing with exit status 3" in summary  # its last lines
    teardown = re.search(r"teardown (\d+\.\d)s", summary)
    print(f"teardown after the failure: {teardown.group(1) if teardown else '?'}s")

    record = records.list_runs()[0]
    assert record.first_failure.node == "node3" and record.first_failure.exit_code == 3
    assert record.state == "failed" and record.exit_code == 3
    assert [n.exit_code for n in record.nodes][2] == 3
    for node in sb.nodes:
        assert run_containers(sb, node, record.run_id, running=True) == [], node


GRACEFUL = """import os, signal, sys, time
rank = int(os.environ["NODE_RANK"])
def term(signum, frame):
    print("rank %d got SIGTERM" % rank)
    time.sleep(2.5)
    print("rank %d flushed" % rank)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("rank %d started" % rank)
if rank == 0:
    time.sleep(4)
    sys.exit(3)
time.sleep(3600)
"""


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_fail_fast_gives_the_others_sigterm_then_kills_them_after_the_fail_grace(
        clean_nodes, cpu_image, runs_dir, tmp_path):
    """A rank fails: the others get SIGTERM (their handler runs) and SIGKILL after fail_grace
    (1 s), not after the 3 s an interactive stop gives: their 2.5 s "flush" never ends."""
    sb = clean_nodes
    job = load_job(write_job(tmp_path, "graceful", cpu_image, GRACEFUL))
    result = launch.launch(job, load_inventory(sb.inventory_path), stream=open(os.devnull, "w"),  # noqa: SIM115
                           settings=supervise.Settings(fail_grace=1))
    out = result.outcome
    print(f"teardown {out.teardown_seconds:.2f}s, detection {out.noticed_at - out.first_failure.time:.2f}s")
    assert result.exit_code == 3 and out.first_failure.node == "node1", supervise.summary_lines(out)
    for node, rank in (("node2", 1), ("node3", 2)):
        text = (runs_dir / result.run_id / f"{node}.log").read_text()
        assert f"rank {rank} got SIGTERM" in text, text           # SIGTERM reached the program
        assert f"rank {rank} flushed" not in text, text           # killed after the 1 s grace
        assert out.exit_codes[node] == 137, out.exit_codes
        assert run_containers(sb, node, result.run_id) == [], node


ABORT_AT_EXIT = """import os, time
rank = int(os.environ["NODE_RANK"])
print("rank %d weights-sha256=ab12" % rank)
if rank == 0:
    time.sleep(1)
    print("terminate called without an active exception")
    for i in range(25):
        print("report line %d" % i)
    os.abort()
time.sleep(3600)
"""


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_rank_that_aborts_at_exit_gets_the_known_cause_under_its_failure(clean_nodes, cpu_image, runs_dir,
                                                                          tmp_path):
    """The line that says why (gloo's SIGABRT at the interpreter's exit) sits above the 20 lines
    the failure report shows, under torchrun's own report: the report names it and the fix."""
    sb = clean_nodes
    job = load_job(write_job(tmp_path, "abort-at-exit", cpu_image, ABORT_AT_EXIT))
    result = launch.launch(job, load_inventory(sb.inventory_path), stream=open(os.devnull, "w"))  # noqa: SIM115
    out = result.outcome
    summary = supervise.summary_lines(out)
    assert out.first_failure.node == "node1" and result.exit_code == 134, summary
    last = summary.index("last 20 lines of node1[0]:")
    assert "terminate called" not in "\n".join(summary[last:last + 21])       # out of sight
    hint = summary[last + 21]
    assert hint.startswith('hint: node1[0] printed "terminate called without an active exception", '
                           "above the lines shown: "), summary
    assert "os._exit(0)" in hint and "A finished run fails with SIGABRT at exit" in hint, hint
    assert set(out.known_causes) == {"node1"}, out.known_causes   # the others printed no such line


def stop_shells(sb, run_id: str) -> list[str]:
    """The stop channels' shells (containers.StopChannel) of ``run_id`` still on the nodes."""
    return [p for p in sb.node_processes(containers._STOP_SCRIPT) if run_id in p]


def gone_within(seconds: float, what) -> list:
    """Poll ``what()`` until it is empty or ``seconds`` passed; its last value."""
    deadline = time.monotonic() + seconds
    while (left := what()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def within(seconds: float, cond) -> bool:
    """Poll ``cond()`` until it holds or ``seconds`` passed."""
    return not gone_within(seconds, lambda: [] if cond() else ["not yet"])


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_fail_fast_writes_each_stop_on_the_channel_opened_while_the_run_started(
        clean_nodes, cpu_image, runs_dir, monkeypatch):
    """Issue 12: after the first failure, each other node's stop is one line written on a channel
    opened while the run started (a shell on the node waiting on its stdin), not a new SSH
    session per node for `docker stop` (whose start on a busy node was most of the teardown).
    Real channels, only counted here; afterwards no such shell is left on any node."""
    sb = clean_nodes
    from clusterctl.cluster.transport import connection
    opened: list[tuple[str, list[str]]] = []
    real = connection.NodeConnection._channel

    def counted(self, argv, *a, **kw):
        opened.append((self.name, list(argv)))
        return real(self, argv, *a, **kw)

    waiting: list[list[str]] = []

    def look_while_running(record: records.RunRecord) -> None:
        def later():
            time.sleep(2)   # the failure comes at 4 s
            waiting.append(stop_shells(sb, record.run_id))
        threading.Thread(target=later, daemon=True).start()

    monkeypatch.setattr(connection.NodeConnection, "_channel", counted)
    result = launch.launch(load_job(FAIL_RANK_JOB), load_inventory(sb.inventory_path), image=cpu_image,
                           stream=open(os.devnull, "w"),  # noqa: SIM115
                           overrides={"FAIL_RANK": "2", "FAIL_AFTER": "4"}, on_started=look_while_running)
    monkeypatch.setattr(connection.NodeConnection, "_channel", real)
    out = result.outcome
    print(f"teardown {out.teardown_seconds:.2f}s")
    assert result.exit_code == 3 and out.first_failure.node == "node3", supervise.summary_lines(out)
    stop_argv = containers.StopChannel("c").argv_for(runtime_for("docker"))[:3]   # the sandbox's nodes run docker
    assert stop_argv[2] == f"RT=docker\n{containers._STOP_SCRIPT}", stop_argv
    stop_channels = [n for n, argv in opened if argv[:3] == stop_argv]
    assert sorted(stop_channels) == ["node1", "node2", "node3"], opened
    assert [a for _, a in opened if a[:2] == ["docker", "stop"]] == [], opened   # no new session
    assert len(waiting) == 1 and len(waiting[0]) == 3, waiting   # one shell per node, waiting
    for node in ("node1", "node2"):       # SIGTERM reached python through tini: docker stop ran
        assert out.exit_codes[node] == 143, out.exit_codes
    assert gone_within(10, lambda: stop_shells(sb, result.run_id)) == []
    for node in sb.nodes:
        assert run_containers(sb, node, result.run_id) == [], node


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_stop_channel_closed_or_cut_stops_nothing_and_a_broken_one_falls_back(
        clean_nodes, cpu_image, runs_dir):
    """EOF on a stop channel (clusterctl closed it, ended, or lost its connection) must never
    stop the container, and its shell must end; a stop whose channel broke still happens, on a
    new channel."""
    sb = clean_nodes
    inventory = load_inventory(sb.inventory_path)
    with Cluster(inventory) as cluster:   # a no-op where an earlier test pushed it
        launch.push_image(cluster, cpu_image)
    run_id = f"stopchan-{os.getpid()}"
    name = f"{run_id}-node1"
    sb.node_docker("node1", "run", "-d", "--init", "--label", f"{containers.RUN_LABEL}={run_id}",
                   "--name", name, cpu_image, "sleep", "600")

    def running() -> bool:
        return run_containers(sb, "node1", run_id, running=True) == [name]

    try:
        with Cluster(inventory) as cluster:
            stopper = containers.StopChannel(name)       # closed by clusterctl, unused
            assert stopper.open(lambda: cluster.connection("node1"))
            assert within(5, lambda: len(stop_shells(sb, run_id)) == 1)
            stopper.close()
            assert gone_within(10, lambda: stop_shells(sb, run_id)) == []
            assert running()

            stopper = containers.StopChannel(name)       # the connection goes (clusterctl ended)
            assert stopper.open(lambda: cluster.connection("node1"))
            assert within(5, lambda: len(stop_shells(sb, run_id)) == 1)
            cluster.connection("node1").close()
            assert gone_within(10, lambda: stop_shells(sb, run_id)) == []
            assert running()
            assert stopper.stop(0, timeout=10) is None   # its channel is gone: not stopped by it

            stopper = containers.StopChannel(name)       # its shell killed on the node: fallback
            assert stopper.open(lambda: cluster.connection("node1"))
            assert within(5, lambda: len(stop_shells(sb, run_id)) == 1)
            for line in stop_shells(sb, run_id):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            assert gone_within(10, lambda: stop_shells(sb, run_id)) == []
            assert running()
            assert containers.stop_containers(cluster, {"node1": name}, grace=0,
                                              ready={"node1": stopper}) == {}
            assert not running()

            sb.node_docker("node1", "start", name)        # grace 0: docker stop on the channel
            assert running()
            stopper = containers.StopChannel(name)
            assert stopper.open(lambda: cluster.connection("node1"))
            res = stopper.stop(0, timeout=20)
            assert res is not None and res.exit_code == 0, res
            assert not running()
            assert gone_within(10, lambda: stop_shells(sb, run_id)) == []
    finally:
        sb.node_docker("node1", "rm", "--force", name, check=False)


def tree_or_direct(sb, tmp_path: Path, how: str):
    """The sandbox's inventory as it is (3 nodes: a connection per node) or with the tree on
    (``ssh: {tree: true}``, width 1: node1 -> node2 -> node3, so node2 carries node3)."""
    if how == "direct":
        return load_inventory(sb.inventory_path)
    data = yaml.safe_load(sb.inventory_path.read_text())
    data["ssh"].update({"tree": True, "tree_width": 1})
    path = tmp_path / "tree.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_inventory(path)


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("how", ["direct", "tree"])
def test_node_lost_mid_run_is_detected_and_the_run_torn_down(clean_nodes, cpu_image, runs_dir, tmp_path, how):
    """Also through the tree, where node2 carries node3: node2's silence there takes it (and
    node3) off the tree, this machine's own probe names node2 lost, node3 is stopped."""
    sb = clean_nodes
    inventory = tree_or_direct(sb, tmp_path, how)
    job = load_job(FAIL_RANK_JOB)
    cut: list[float] = []

    def pull_the_cable(record: records.RunRecord) -> None:
        def later():
            time.sleep(3)
            sb.link_down("node2")
            cut.append(time.monotonic())
        threading.Thread(target=later, daemon=True).start()

    settings = supervise.Settings(probe_interval=1.0, probe_timeout=3.0, lost_after=6.0)
    try:
        result = launch.launch(job, inventory, image=cpu_image, overrides={"FAIL_RANK": "99"},
                               settings=settings, on_started=pull_the_cable,
                               stream=open(os.devnull, "w"))  # noqa: SIM115
        detected = time.monotonic()
    finally:
        sb.link_up("node2")
    print(f"{how}: lost node detected and run torn down {detected - cut[0]:.1f}s after the link went down")
    assert result.exit_code == supervise.NODE_LOST_EXIT
    first = result.outcome.first_failure
    assert (first.node, first.kind) == ("node2", "lost")
    assert result.record.first_failure.node == "node2"
    assert "node2" in result.outcome.not_stopped  # said plainly: we could not stop it
    for node in ("node1", "node3"):
        assert run_containers(sb, node, result.run_id, running=True) == [], node


TICK_JOB = JOBS / "tick.yaml"


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("how", ["direct", "tree"])
def test_a_link_flap_shorter_than_the_liveness_window_is_no_failure(clean_nodes, cpu_image, runs_dir,
                                                                     tmp_path, how):
    """node2's link goes down for FLAP seconds mid-run and comes back: with the same liveness
    settings as the lost-node test above (lost_after 6 s), the run ends 0 with every line of
    every node.  FLAP is chosen between TCP's retransmissions (3.0 and 6.2 s after the first
    lost segment), where the established connection answers only at 6.2 s: a prober that
    waited for it would call the node lost; a real loss is still detected (test above).
    Through the tree, node2 (and node3 below it) go silent there, are taken off it and
    probed from here; the tree's own connections outlive the flap and their signs of life,
    when they resume, count too."""
    sb = clean_nodes
    inventory = tree_or_direct(sb, tmp_path, how)
    job = load_job(TICK_JOB)
    flap, window = 4.0, 6.0
    cut: list[float] = []

    def flap_the_link(record: records.RunRecord) -> None:
        def later():
            time.sleep(3)
            sb.link_down("node2")
            cut.append(time.monotonic())
            time.sleep(flap)
            sb.link_up("node2")
            cut.append(time.monotonic())
        threading.Thread(target=later, daemon=True).start()

    settings = supervise.Settings(probe_interval=1.0, probe_timeout=3.0, lost_after=window)
    try:
        result = launch.launch(job, inventory, image=cpu_image, overrides={"TICKS": "30", "TICK": "0.5"},
                               settings=settings, on_started=flap_the_link,
                               stream=open(os.devnull, "w"))  # noqa: SIM115
    finally:
        sb.link_up("node2")
    assert len(cut) == 2 and cut[1] - cut[0] >= flap, cut  # the link really was down that long
    assert result.exit_code == 0, (result.outcome.first_failure, result.outcome.lost)
    assert result.outcome.lost == [] and result.outcome.first_failure is None
    for node in sb.nodes:  # no line lost through the flap, in the node's log file
        text = (runs_dir / result.run_id / f"{node}.log").read_text()
        assert [line for line in text.splitlines() if line.startswith("tick")] == \
            [f"tick {i}" for i in range(30)], node
        assert run_containers(sb, node, result.run_id, running=True) == [], node


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_sigint_stops_every_container_and_exits_130(clean_nodes, cpu_image, runs_dir):
    sb = clean_nodes
    env = {**os.environ, "CLUSTERCTL_RUNS": str(runs_dir), "CLUSTERCTL_PLAIN": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clusterctl", "launch", str(FAIL_RANK_JOB), "--nodes", str(sb.inventory_path),
         "--image", cpu_image, "--set", "FAIL_RANK=99"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        started = 0
        for line in proc.stdout:  # wait until every node's program printed (containers run)
            lines.append(line)
            started += "started" in line and "]| node rank" in line
            if started == 3 or time.monotonic() > deadline:
                break
        assert started == 3, "".join(lines)
        run_id = run_id_from("".join(lines))
        assert any(run_containers(sb, n, run_id, running=True) for n in sb.nodes)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        print(f"SIGINT to exit: {time.monotonic() - t0:.1f}s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(lines) + rest
    assert "interrupted" in rest and "Traceback" not in rest
    for node in sb.nodes:
        assert run_containers(sb, node, run_id, running=True) == [], node
    assert records.load(run_id).state == "interrupted"


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_master_port_in_use_is_refused_before_anything_starts(clean_nodes, cpu_image, runs_dir):
    """A port the user pinned (--set MASTER_PORT) that something holds on the master is
    refused, naming the process; an unpinned one is moved off (tests/run/test_concurrent_runs.py)."""
    sb = clean_nodes
    port = load_inventory(sb.inventory_path).master_port
    listener = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{sb.netns('node1')}", sys.executable, "-c",
         "import socket, sys, time\n"
         # SO_REUSEADDR: earlier runs leave TIME_WAIT connections on the master port
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('0.0.0.0', {port})); s.listen(); print('listening', flush=True)\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        res = cli("launch", str(FAIL_RANK_JOB), "--nodes", str(sb.inventory_path), "--image", cpu_image,
                  "--set", f"MASTER_PORT={port}")
    finally:
        listener.kill()
        listener.wait()
    assert res.exit_code == 2, res.output
    assert f"master port {port} is already in use" in res.output
    assert "node1" in res.output and "nothing was started" in res.output
    for node in sb.nodes:
        assert run_containers(sb, node) == [], node
    assert records.list_runs() == []  # not even a record


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_node_that_cannot_start_means_nothing_runs(clean_nodes, cpu_image, runs_dir):
    """node3 already has a container named like the run's: its `docker run` fails, so the
    containers started on node1 and node2 are removed again; the foreign one stays."""
    sb = clean_nodes
    sb.node_docker("node3", "create", "--name", "startfail-node3", cpu_image, "true")
    try:
        res = cli("launch", str(FAIL_RANK_JOB), "--nodes", str(sb.inventory_path), "--image", cpu_image,
                  "--set", "FAIL_RANK=99", "--run-id", "startfail")
        assert res.exit_code == 1, res.output
        assert "could not start the run on every node" in res.output
        assert "node3" in res.output and "already in use" in res.output
        for node in sb.nodes:
            assert run_containers(sb, node, "startfail") == [], node
        assert sb.node_docker("node3", "ps", "-a", "-q", "--filter", "name=^/startfail-node3$").stdout.strip()
        assert records.load("startfail").state == "start-failed"
    finally:
        sb.node_docker("node3", "rm", "--force", "startfail-node3", check=False)


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_detached_launch_opens_three_ssh_channels_per_node_and_pushes_only_where_needed(
        clean_nodes, cpu_image, runs_dir, monkeypatch):
    """Host work per node (issue 12): preflight's two scripts and the start, nothing else; the
    image IDs preflight read decide which nodes push skips, so a node without the image still
    gets it (real channels, only counted here).  Stopping the run is one channel per node
    (issue 24: it was six), and a last line written without its newline is kept whole."""
    sb = clean_nodes
    inventory = load_inventory(sb.inventory_path)
    from clusterctl.cluster.transport import connection
    with Cluster(inventory) as cluster:   # node1 and node2 have the image (the session pushed it)
        launch.push_image(cluster, cpu_image)
    sb.node_docker("node3", "image", "rm", "--force", cpu_image)
    opened: dict[str, list[str]] = {}
    real = connection.NodeConnection._channel

    def counted(self, argv, *a, **kw):
        opened.setdefault(self.name, []).append(" ".join(argv)[:40])
        return real(self, argv, *a, **kw)

    monkeypatch.setattr(connection.NodeConnection, "_channel", counted)
    job = write_job(runs_dir.parent, "partial", cpu_image,
                    "import sys, time; sys.stdout.write('line one' + chr(10) + 'no newline at the end'); "
                    "sys.stdout.flush(); time.sleep(600)")
    result = launch.launch(load_job(job), inventory, image=cpu_image, detach=True)
    assert len(opened["node1"]) == 3 and len(opened["node2"]) == 3, opened
    assert len(opened["node3"]) > 3, opened                           # it was pushed to
    assert sb.node_docker("node3", "image", "inspect", cpu_image).returncode == 0
    deadline = time.monotonic() + 60
    # docker holds a line without its newline until the container's output ends (the stop):
    # "line one" on its own says both were written
    while "line one" not in sb.node_docker("node1", "logs", result.record.nodes[0].container).stdout:
        assert time.monotonic() < deadline, "the job never wrote its line"
        time.sleep(0.5)
    opened.clear()
    with Cluster(inventory) as cluster:
        stopped = supervise.stop_run(cluster, result.record, grace=0)
    monkeypatch.setattr(connection.NodeConnection, "_channel", real)
    assert {n: len(c) for n, c in opened.items()} == {"node1": 1, "node2": 1, "node3": 1}, opened
    assert all(s.error is None and s.was_running and s.containers for s in stopped.values()), stopped
    assert [c.status for c in stopped["node1"].containers] == ["exited"], stopped["node1"]
    assert (runs_dir / result.run_id / "node1.log").read_text().splitlines() == [
        "line one", "no newline at the end"]
    assert all(run_containers(sb, node, result.run_id) == [] for node in sb.nodes)


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_through_the_tree_a_launch_opens_one_connection_and_a_followed_run_still_fails_fast(
        clean_nodes, cpu_image, runs_dir, monkeypatch, tmp_path):
    """``ssh: {tree: true}`` (issue 12's host work): preflight and start of every node go over
    the first node's connection (width 1: node1 -> node2 -> node3, agent forwarding two levels
    down), each container gets its own rank; a followed run then behaves as without the tree."""
    sb = clean_nodes
    data = yaml.safe_load(sb.inventory_path.read_text())
    data["ssh"].update({"tree": True, "tree_width": 1})
    tree_inv = tmp_path / "tree.yaml"
    tree_inv.write_text(yaml.safe_dump(data, sort_keys=False))
    inventory = load_inventory(tree_inv)
    with Cluster(load_inventory(sb.inventory_path)) as cluster:
        launch.push_image(cluster, cpu_image)
    from clusterctl.cluster.transport import connection
    opened: dict[str, int] = {}
    real = connection.NodeConnection._channel

    def counted(self, argv, *a, **kw):
        opened[self.name] = opened.get(self.name, 0) + 1
        return real(self, argv, *a, **kw)

    monkeypatch.setattr(connection.NodeConnection, "_channel", counted)
    result = launch.launch(load_job(FAIL_RANK_JOB), inventory, image=cpu_image, detach=True,
                           push=False, overrides={"FAIL_RANK": "99"})
    monkeypatch.setattr(connection.NodeConnection, "_channel", real)
    try:
        assert opened == {"node1": 2}, opened          # the tree's preflight, the tree's start
        for rank, node in enumerate(sb.nodes):
            names = run_containers(sb, node, result.record.run_id, running=True)
            assert len(names) == 1, (node, names)
            label = sb.node_docker(node, "inspect", "--format",
                                   f'{{{{index .Config.Labels "{containers.RANK_LABEL}"}}}}', names[0])
            assert label.stdout.strip() == str(rank), node
        assert [n.state for n in result.record.nodes] == ["running"] * 3
    finally:
        with Cluster(inventory) as cluster:
            supervise.stop_run(cluster, result.record, grace=0)
    res = cli("launch", str(FAIL_RANK_JOB), "--nodes", str(tree_inv), "--image", cpu_image,
              "--set", "FAIL_RANK=2", "--set", "FAIL_AFTER=3")
    assert res.exit_code == 3, res.output
    assert res.output[res.output.index("FIRST FAILURE"):].startswith("FIRST FAILURE: node3[2] exited 3")
    for node in sb.nodes:
        assert run_containers(sb, node, running=True) == [], node
    assert list(Path("/tmp").glob("clusterctl-tree.*")) == []


def hop_processes(sb, target: str) -> list[int]:
    """PIDs of the tree's hop ssh processes (on any node) that log in to node ``target``."""
    ip, found = sb.nodes[target], []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if words and words[0] == "ssh" and ip in words and any("clusterctl-tree" in w for w in words):
            found.append(int(proc.name))
    return found


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_followed_run_through_the_tree_uses_one_connection_and_a_broken_hop_loses_no_line(
        clean_nodes, cpu_image, runs_dir, monkeypatch, tmp_path):
    """A followed run with the tree on (issue 24): every node's output, exit status and final
    state come over node1's connection (width 1: node1 -> node2 -> node3); this machine opens
    three channels in all (the tree's preflight, start and follow) and none to node2 or node3.
    Then, mid-run, the hop that carries node2 and node3 (node1's ssh to node2) is killed: both
    go on on their own connections from the line after the last one that came, and the run
    ends 0 with every tick of every node exactly once, in order.  (The fourth channel ends
    the logins node1 and node2 kept for the command's later calls: OpenSSH control masters.)"""
    sb = clean_nodes
    inventory = tree_or_direct(sb, tmp_path, "tree")
    with Cluster(load_inventory(sb.inventory_path)) as cluster:
        launch.push_image(cluster, cpu_image)
    from clusterctl.cluster.transport import connection
    real = connection.NodeConnection._channel
    # kept logins' directories of earlier tests (a node lost mid-run keeps its own until
    # a later tree call's sweep): none of this test's
    kept_before = kept_login_dirs()

    def run(ticks: int, on_started=None) -> tuple[launch.RunResult, dict[str, int]]:
        opened: dict[str, int] = {}

        def counted(self, argv, *a, **kw):
            opened[self.name] = opened.get(self.name, 0) + 1
            return real(self, argv, *a, **kw)
        monkeypatch.setattr(connection.NodeConnection, "_channel", counted)
        try:
            result = launch.launch(load_job(TICK_JOB), inventory, image=cpu_image, push=False,
                                   overrides={"TICKS": str(ticks), "TICK": "0.5"}, on_started=on_started,
                                   stream=open(os.devnull, "w"))  # noqa: SIM115
        finally:
            monkeypatch.setattr(connection.NodeConnection, "_channel", real)
        return result, opened

    def every_tick_once(result, ticks: int) -> None:
        assert result.exit_code == 0, (result.outcome.first_failure, result.outcome.lost)
        for node in sb.nodes:
            text = (runs_dir / result.run_id / f"{node}.log").read_text()
            assert [line for line in text.splitlines() if line.startswith("tick")] == \
                [f"tick {i}" for i in range(ticks)], (node, text[-2000:])
            assert run_containers(sb, node, result.run_id) == [], node   # read and removed

    result, opened = run(6)
    every_tick_once(result, 6)
    assert opened == {"node1": 4}, opened     # preflight, start, follow, close: all through node1

    killed: list[int] = []

    def cut_the_hop(record: records.RunRecord) -> None:
        def later():
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not killed:
                time.sleep(0.5)
                if (runs_dir / record.run_id / "node3.log").is_file() and \
                        "tick 4" in (runs_dir / record.run_id / "node3.log").read_text():
                    for pid in hop_processes(sb, "node2"):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
        threading.Thread(target=later, daemon=True).start()

    result, opened = run(24, cut_the_hop)
    assert killed, "the hop to node2 was never found"
    every_tick_once(result, 24)
    # node1: the tree's four, and maybe its prober's backup read of the container's state
    # (every 5th probe, 10 s); node2 and node3: their own follower and waiter at least
    assert opened["node1"] in (4, 5) and opened.get("node2", 0) >= 2 and opened.get("node3", 0) >= 2, opened
    assert list(Path("/tmp").glob("clusterctl-tree.*")) == []
    # node1's closed by the tree, node2's on its own connection
    assert kept_login_dirs() - kept_before == set()


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_logs_status_stop_on_a_detached_run_then_on_the_finished_one(clean_nodes, cpu_image, runs_dir):
    sb = clean_nodes
    inv = str(sb.inventory_path)
    res = cli("launch", str(FAIL_RANK_JOB), "--nodes", inv, "--image", cpu_image,
              "--set", "FAIL_RANK=99", "--detach", "--run-id", "live1")
    assert res.exit_code == 0, res.output
    assert "started detached" in res.output
    for node in sb.nodes:  # running on every node, launch has returned
        assert len(run_containers(sb, node, "live1", running=True)) == 1, node

    deadline = time.monotonic() + 120  # the programs print once python has started
    while True:
        res = cli("logs", "live1")
        if res.output.count("started") == 3 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert res.exit_code == 0
    assert {"node1[0]| node rank 0 of 3 started", "node2[1]| node rank 1 of 3 started",
            "node3[2]| node rank 2 of 3 started"} <= set(res.output.splitlines())
    only = cli("logs", "live1", "--node", "node2")
    assert only.output.strip().splitlines() == ["node2[1]| node rank 1 of 3 started"]

    st = cli("status", "--nodes", inv)  # RUN defaults to the newest
    assert st.exit_code == 0 and "live1" in st.output, st.output
    st = json.loads(cli("status", "live1", "--json").output)
    assert [(n["node"], n["state"], n["source"]) for n in st["nodes"]] == [
        ("node1", "running", "node"), ("node2", "running", "node"), ("node3", "running", "node")]

    # a node that does not answer: named, exit 1, the others stopped anyway
    sb.stop_sshd("node3")
    try:
        res = cli("stop", "live1")
    finally:
        sb.start_sshd("node3")
    assert res.exit_code == 1, res.output
    assert "could not stop the run on node3" in res.output
    assert run_containers(sb, "node1", "live1") == [] and len(run_containers(sb, "node3", "live1")) == 1

    res = cli("stop", "live1")
    assert res.exit_code == 0, res.output
    assert "stopped and removed" in res.output  # node3's, now
    res = cli("stop", "live1")  # idempotent
    assert res.exit_code == 0 and res.output.count("no container") == 3, res.output
    for node in sb.nodes:
        assert run_containers(sb, node, "live1") == []

    # finished: logs and status come from runs/live1
    res = cli("logs", "live1", "--tail", "1")
    assert sorted(res.output.strip().splitlines()) == [
        "node1[0]| node rank 0 of 3 started", "node2[1]| node rank 1 of 3 started",
        "node3[2]| node rank 2 of 3 started"]
    assert (runs_dir / "live1" / "node2.log").read_text() == "node rank 1 of 3 started\n"
    st = json.loads(cli("status", "live1", "--json").output)
    assert {(n["source"], n["state"]) for n in st["nodes"]} == {("record", "stopped")}
    assert (st["state"], st["exit_code"]) == ("stopped", 143)
    assert st["stopped_by"].startswith("clusterctl stop (") and all(
        n["stopped_by"] == st["stopped_by"] for n in st["nodes"])

    # a run that finished in the foreground, then `runs` lists both, newest first
    job = write_job(runs_dir.parent, "hello", cpu_image,
                    "import os; print('hello from node rank', os.environ['NODE_RANK'])")
    res = cli("launch", str(job), "--nodes", inv, "--run-id", "done1")
    assert res.exit_code == 0, res.output
    assert "node3[2]| hello from node rank 2" in res.output
    res = cli("logs", "--node", "node1")  # newest run, from runs/ (launch removed the containers)
    assert res.output.strip() == "node1[0]| hello from node rank 0"
    listed = json.loads(cli("runs", "--json").output)
    assert [r["run_id"] for r in listed] == ["done1", "live1"]
    assert cli("runs").output.index("done1") < cli("runs").output.index("live1")


# --------------------------------------------------------------------------- no nodes needed

def test_dry_run_json_on_nodes_that_do_not_exist(tmp_path, runs_dir):
    inv = tmp_path / "ghosts.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": "gpu-a", "host": "gpu-a.invalid", "slots": 8, "interface": "ib0"},
        {"name": "gpu-b", "host": "gpu-b.invalid", "slots": 8},
    ]}))
    res = cli("launch", "bert", "--nodes", str(inv), "--dry-run", "--json", "--set", "HF_TOKEN=s3cret")
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)
    assert [p["node"] for p in plans] == ["gpu-a", "gpu-b"]
    assert plans[0]["env"]["GLOO_SOCKET_IFNAME"] == "ib0" and plans[0]["env"]["NCCL_SOCKET_IFNAME"] == "ib0"
    assert "GLOO_SOCKET_IFNAME" not in plans[1]["env"]  # unknown: no node was asked
    assert plans[1]["env"]["RANK"] == "1" and plans[1]["env"]["WORLD_SIZE"] == "2"
    assert "s3cret" not in res.output
    assert not runs_dir.exists()  # nothing recorded, nothing started


def test_bad_run_id_is_refused_before_anything(tmp_path, runs_dir):
    inv = tmp_path / "ghosts.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"host": "a.invalid"}]}))
    res = cli("launch", "ddp-smoke", "--nodes", str(inv), "--run-id", "../etc")
    assert res.exit_code == 2 and "--run-id '../etc' is not valid" in res.output
    assert "Traceback" not in res.output


def _state(node: str, code: int | None, finished: datetime | None, status: str = "exited"):
    return containers.ContainerState(node=node, name=f"r-{node}", status=status, exit_code=code, finished=finished)


def test_first_failure_is_first_by_node_time_not_by_arrival_or_list_order():
    """node3 failed first on its own clock; node1's failure (a consequence) was noticed first."""
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ranks = {"node1": 0, "node2": 1, "node3": 2}
    noticed = [supervise.Failure("node1", 0, "exit", 1, (t + timedelta(seconds=5)).timestamp())]
    states = {
        "node1": _state("node1", 1, t + timedelta(seconds=2)),
        "node2": _state("node2", 143, t + timedelta(seconds=9)),   # stopped by the teardown
        "node3": _state("node3", 3, t + timedelta(seconds=1)),     # news had not arrived yet
    }
    cut = (t + timedelta(seconds=6)).timestamp()
    failures = supervise.failures_by_time(noticed, states, ranks, cut)
    first = supervise.first_failure(failures)
    assert (first.node, first.exit_code) == ("node3", 3)
    assert {f.node for f in failures} == {"node1", "node3"}  # node2 was stopped by us: no failure
    assert supervise.run_exit_code(first) == 3
    lost = supervise.Failure("node2", 1, "lost", 255, t.timestamp())
    assert supervise.first_failure([*failures, lost]) is lost
    assert supervise.run_exit_code(lost) == supervise.NODE_LOST_EXIT
    assert supervise.run_exit_code(None, "SIGINT") == 130 and supervise.run_exit_code(None) == 0


@pytest.mark.docker
def test_first_failure_from_real_docker_inspect(docker_client, base_image):
    """Real containers on the local engine exit 0, 3 and 5 at different times; the real
    `docker inspect` JSON decides which failed first."""
    # each exits at an absolute time, so slow container creation cannot reorder them
    at = time.time() + 6
    plan = {"c": (3, at + 0.5), "b": (5, at + 1.5), "a": (0, at)}
    made = []
    try:
        for code, when in plan.values():
            program = f"import time; time.sleep(max(0, {when} - time.time())); raise SystemExit({code})"
            made.append(docker_client.containers.run(
                base_image, ["python3", "-c", program], detach=True, network_mode="none",
                labels={containers.RUN_LABEL: "unit"}))
        for c in made:
            c.wait(timeout=30)
        states = {}
        for name, c in zip(plan, made, strict=True):
            c.reload()
            states[name] = containers.state_from_inspect(name, c.attrs)
        assert states["b"].exit_code == 5 and states["a"].exit_code == 0
        assert states["c"].finished < states["b"].finished
        ranks = {"a": 0, "b": 1, "c": 2}
        # b's news came first (as a slow link to c would make it), c still failed first
        noticed = [supervise.Failure("b", 1, "exit", 5, time.time())]
        first = supervise.first_failure(supervise.failures_by_time(noticed, states, ranks, time.time()))
        assert (first.node, first.exit_code) == ("c", 3)
    finally:
        for c in made:
            c.remove(force=True)


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_follow_a_detached_run_to_its_end_then_stop_records_its_outcome(clean_nodes, cpu_image, runs_dir):
    sb = clean_nodes
    job = write_job(runs_dir.parent, "count", cpu_image,
                    "import os, time\nfor i in range(3):\n"
                    "    print('tick', i, 'of node rank', os.environ['NODE_RANK']); time.sleep(1)\n"
                    "raise SystemExit(int(os.environ['NODE_RANK']) == 1 and 7)")
    res = cli("launch", str(job), "--nodes", str(sb.inventory_path), "--detach", "--run-id", "follow1")
    assert res.exit_code == 0, res.output
    res = cli("logs", "follow1", "--follow")  # returns when every container has ended
    assert res.exit_code == 0, res.output
    for rank in range(3):
        assert f"node{rank + 1}[{rank}]| tick 2 of node rank {rank}" in res.output, res.output
    st = json.loads(cli("status", "follow1", "--json").output)   # the nodes' word becomes the record
    assert [n["exit_code"] for n in st["nodes"]] == [0, 7, 0]
    assert (st["state"], st["exit_code"]) == ("failed", 7)
    assert records.load("follow1").first_failure.node == "node2"
    shown = cli("status", "follow1").output
    assert "failed, exit 7" in shown and "`clusterctl stop follow1` removes them" in shown, shown
    res = cli("stop", "follow1")
    assert res.exit_code == 0 and res.output.count("removed (had exited by itself)") == 3, res.output
    record = records.load("follow1")
    assert (record.state, record.exit_code) == ("failed", 7)  # the run's true outcome
    assert [line.split("| ")[1] for line in (runs_dir / "follow1" / "merged.log").read_text().splitlines()
            if line.startswith("node2[1]|")] == [f"tick {i} of node rank 1" for i in range(3)]


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_status_of_a_detached_run_that_exited_0_says_succeeded_and_stop_says_how_each_ended(
        clean_nodes, cpu_image, runs_dir):
    sb = clean_nodes
    inv = str(sb.inventory_path)
    job = write_job(runs_dir.parent, "quick", cpu_image, "print('done')")
    assert cli("launch", str(job), "--nodes", inv, "--detach", "--run-id", "quick1").exit_code == 0
    deadline = time.monotonic() + 90
    while True:
        st = json.loads(cli("status", "quick1", "--json").output)
        if st["state"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (st["state"], st["exit_code"]) == ("succeeded", 0), st      # not "running"
    assert [(n["state"], n["exit_code"], n["source"]) for n in st["nodes"]] == [("exited", 0, "node")] * 3
    assert "succeeded, exit 0" in cli("status", "quick1").output
    listed = {r["run_id"]: r for r in json.loads(cli("runs", "--json").output)}
    assert (listed["quick1"]["state"], listed["quick1"]["exit_code"]) == ("succeeded", 0)
    res = cli("stop", "quick1")
    assert res.exit_code == 0 and res.output.count("removed (had exited by itself), exit 0") == 3, res.output
    assert records.load("quick1").state == "succeeded"

    # a running run: each container's own end, who stopped it, and an exit code in `runs`
    res = cli("launch", str(FAIL_RANK_JOB), "--nodes", inv, "--image", cpu_image,
              "--set", "FAIL_RANK=99", "--detach", "--run-id", "halt1")
    assert res.exit_code == 0, res.output
    # each container's start, as the start's own `docker inspect` saw it, is in the record
    assert [(n.state, n.started is not None) for n in records.load("halt1").nodes] == [("running", True)] * 3
    res = cli("stop", "halt1", "--grace", "1")
    assert res.exit_code == 0, res.output
    # docker run --init: tini, PID 1, passes SIGTERM on to python, which ends at once (python
    # as PID 1 would ignore it and be killed after the grace: exit 137)
    assert res.output.count("stopped and removed (SIGTERM), exit 143 (SIGTERM)") == 3, res.output
    assert "halt1: stopped by clusterctl stop (" in res.output and "exit 143" in res.output
    rec = records.load("halt1")
    assert (rec.state, rec.exit_code) == ("stopped", 143) and rec.stopped_by.startswith("clusterctl stop (")
    assert [(n.state, n.exit_code) for n in rec.nodes] == [("stopped", 143)] * 3
    row = next(line for line in cli("runs").output.splitlines() if "halt1" in line)
    assert "stopped" in row and "143" in row, row


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_launch_killed_with_sigkill_then_status_stop_and_runs_tell_the_truth(clean_nodes, cpu_image, runs_dir):
    """clusterctl itself dies (SIGKILL: no handler, no teardown) while the run goes on."""
    sb = clean_nodes
    inv = str(sb.inventory_path)
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "launch", str(FAIL_RANK_JOB), "--nodes",
                             inv, "--image", cpu_image, "--set", "FAIL_RANK=99", "--run-id", "crash1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    merged = runs_dir / "crash1" / "merged.log"
    deadline = time.monotonic() + 180
    while not (merged.is_file() and merged.read_text().count("started") == 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.5)
    assert within(10, lambda: len(stop_shells(sb, "crash1")) == 3)   # one per node, waiting
    proc.kill()
    proc.wait()
    # its stop channels' shells read EOF when the connections went: they end, stopping nothing
    assert gone_within(10, lambda: stop_shells(sb, "crash1")) == []
    for node in sb.nodes:      # nobody tore it down: still running everywhere
        assert len(run_containers(sb, node, "crash1", running=True)) == 1, node

    listed = {r["run_id"]: r for r in json.loads(cli("runs", "--json").output)}
    assert listed["crash1"]["state"] == "unknown" and f"pid {proc.pid}" in listed["crash1"]["note"]
    st = json.loads(cli("status", "crash1", "--json").output)
    assert st["state"] == "unknown"
    assert [(n["node"], n["state"], n["source"]) for n in st["nodes"]] == [
        ("node1", "running", "node"), ("node2", "running", "node"), ("node3", "running", "node")]

    res = cli("stop", "crash1")           # finds them by label: launch's memory died with it
    assert res.exit_code == 0 and res.output.count("stopped and removed") == 3, res.output
    for node in sb.nodes:
        assert run_containers(sb, node, "crash1") == [], node
    rec = records.load("crash1")
    assert (rec.state, rec.exit_code) == ("stopped", 143) and rec.stopped_by.startswith("clusterctl stop")
    assert json.loads(cli("runs", "--json").output)[0]["state"] == "stopped"   # never success
    logs = cli("logs", "crash1").output
    assert logs.count("started") == 3, logs
