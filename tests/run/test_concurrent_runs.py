"""Two people, one cluster: launches at once on the same nodes, and whose run is whose.

The sandbox test starts two real `python -m clusterctl launch` processes at the same moment,
on the same three sandbox nodes (sandbox3): each run gets its own master port (chosen free on
the master, or held by no other run), its own run id, container names and logs, and nothing
of one run's output lands in the other's.  Then one run is handed to another uid (root chowns
its record, as that user's own launch would have written it): `stop` of it is refused without
--any-user, and a pinned port that a live run holds is refused naming that run.  Two real
unprivileged users sharing a runs directory are tests/run/test_two_uids.py.  The records' own races (two processes saving at once, taking a
port at once) are in tests/run/test_records.py; the preflight facts a port is chosen from
are here against the loopback sshd.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.preflight import parse_ss_holders, run_preflight
from clusterctl.cluster.transport import Cluster
from clusterctl.run import launch, records
from tests.fixtures import REPO
from tests.fixtures.sshd import free_port

runner = CliRunner()

#: Each node prints the port and run id its container got, then stays up long enough for the
#: other launch's containers to run at the same time.
HOLD_S = 8


def _job(tmp_path: Path, image: str) -> Path:
    path = tmp_path / "who.yaml"
    path.write_text(yaml.safe_dump({
        "image": image, "nproc_per_node": 1, "env": {"RUN_ID": "{run_id}"},
        "command": ["sh", "-c", f'echo "$MASTER_PORT $RUN_ID $NODE_RANK"; sleep {HOLD_S}']}))
    return path


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterctl", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_two_users_launch_on_the_same_nodes_at_once(clean_nodes, cpu_image, runs_dir, tmp_path):
    sb = clean_nodes
    inv = str(sb.inventory_path)
    job = _job(tmp_path, cpu_image)
    # the nodes hold the image already: two pushes at once are another test's subject
    t0 = time.monotonic()
    with Cluster(load_inventory(sb.inventory_path)) as cluster:
        launch.push_image(cluster, cpu_image)
    print(f"image on the nodes: {time.monotonic() - t0:.1f}s")
    base = {**os.environ, "CLUSTERCTL_RUNS": str(runs_dir), "CLUSTERCTL_PLAIN": "1"}
    env = {u: base for u in ("alice", "bob")}
    t0 = time.monotonic()
    procs = {u: subprocess.Popen([sys.executable, "-m", "clusterctl", "launch", str(job), "--nodes", inv,
                                  "--run-id", f"{u}-run"],
                                 env=env[u], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
             for u in env}
    try:
        done = {u: p.communicate(timeout=150) for u, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    print(f"two launches at once: {time.monotonic() - t0:.1f}s")
    for u, p in procs.items():
        assert p.returncode == 0, (u, *done[u])
        assert "Traceback" not in done[u][1]

    runs = {r.run_id: r for r in records.list_runs()}
    assert set(runs) == {"alice-run", "bob-run"}
    a, b = runs["alice-run"], runs["bob-run"]
    # they really ran at the same time (else one port could serve both, one after the other)
    assert a.started < b.finished and b.started < a.finished, (a.started, a.finished, b.started, b.finished)
    assert a.run_id != b.run_id and a.dir != b.dir
    assert a.master_port != b.master_port and {a.master_port, b.master_port} <= set(range(29500, 29600))
    assert not {n.container for n in a.nodes} & {n.container for n in b.nodes}
    for rec in (a, b):
        assert rec.state == "succeeded" and rec.master_addr == sb.nodes["node1"]
        for n in rec.nodes:     # each node's log: its own line only, with its own port and id
            assert rec.log_path(n.node).read_text() == f"{rec.master_port} {rec.run_id} {n.rank}\n"
        merged = (rec.dir / records.MERGED_LOG).read_text()
        assert merged.count(rec.run_id) == 3 and (b if rec is a else a).run_id not in merged
        out = done[rec.run_id.split("-")[0]][0]  # what each launch printed: its own run's lines only
        lines = sorted(line for line in out.splitlines() if "]| " in line)
        assert lines == [f"{n.node}[{n.rank}]| {rec.master_port} {rec.run_id} {n.rank}" for n in rec.nodes], out
    # bob's run becomes user nobody's, as nobody's own launch would have written it
    nobody = pwd.getpwnam("nobody").pw_uid
    data = json.loads((b.dir / "run.json").read_text())
    data["uid"] = nobody
    (b.dir / "run.json").write_text(json.dumps(data))
    os.chown(b.dir / "run.json", nobody, -1)
    os.chown(b.dir, nobody, -1)
    me = records.current_user()
    listed = _cli("runs", env=env["alice"]).stdout
    assert a.run_id in listed and b.run_id in listed and "nobody" in listed
    assert b.run_id not in _cli("runs", "--mine", env=env["alice"]).stdout

    # whose run is whose: without RUN each gets their own; another's only when named
    st = json.loads(_cli("status", "--json", env=env["alice"]).stdout)
    assert (st["run_id"], st["user"]) == (a.run_id, me)
    # nobody could not read the inventory bob's record names (the sandbox's, in root's 0700
    # directory): it is not read for them, and --nodes is asked for
    res = _cli("status", b.run_id, env=env["alice"])
    assert res.returncode == 2 and "is not a file nobody can read" in res.stderr \
        and "--nodes FILE" in res.stderr, res.stdout + res.stderr
    res = _cli("status", b.run_id, "--nodes", inv, env=env["alice"])
    assert res.returncode == 0 and "user nobody's run" in res.stdout, res.stdout + res.stderr
    res = _cli("logs", b.run_id, env=env["alice"])
    assert res.returncode == 0 and f"run {b.run_id} is user nobody's run" in res.stderr
    assert res.stdout.count(b.run_id) == 3 and a.run_id not in res.stdout
    res = _cli("stop", b.run_id, env=env["alice"])
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"run {b.run_id} is user nobody's run, not yours ({me}); nothing was stopped" in res.stderr
    assert "--any-user" in res.stderr and "Traceback" not in res.stderr
    res = _cli("stop", b.run_id, "--any-user", "--nodes", inv, env=env["alice"])
    assert res.returncode == 0 and "no container (already removed)" in res.stdout, res.stdout + res.stderr


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_a_busy_or_held_master_port_is_skipped_and_a_pinned_one_refused_naming_its_holder(
        clean_nodes, cpu_image, runs_dir, tmp_path, monkeypatch):
    """A process outside clusterctl listens on the default port on the master; alice's run
    (detached) holds the next; a pinned launch of bob's on either is refused naming the
    process or the run, an unpinned one takes the port after both."""
    sb = clean_nodes
    inv = str(sb.inventory_path)
    job = _job(tmp_path, cpu_image)
    first = load_inventory(sb.inventory_path).master_port
    listener = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{sb.netns('node1')}", sys.executable, "-c",
         "import socket, time\n"
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('0.0.0.0', {first})); s.listen(); print('listening', flush=True)\n"
         "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        res = runner.invoke(app, ["launch", str(job), "--nodes", inv, "--detach", "--run-id", "alices"])
        assert res.exit_code == 0, res.output
        assert records.load("alices").master_port == first + 1
        assert f"master port {first + 1} on node1: {first} is in use there" in res.output

        res = runner.invoke(app, ["launch", str(job), "--nodes", inv, "--set", f"MASTER_PORT={first}"])
        assert res.exit_code == 2, res.output
        assert f"master port {first} is already in use on the master by " in res.output
        assert f"(pid {listener.pid})" in res.output and "nothing was started" in res.output
        res = runner.invoke(app, ["launch", str(job), "--nodes", inv, "--set", f"MASTER_PORT={first + 1}"])
        assert res.exit_code == 2, res.output
        assert (f"port {first + 1} on node1 (--set MASTER_PORT) is held by run alices of user "
                f"{records.current_user()} (running)") in res.output, res.output
        assert "nothing was started" in res.output and "Traceback" not in res.output
        assert [r.run_id for r in records.list_runs()] == ["alices"]   # no record of a refused one

        res = runner.invoke(app, ["launch", str(job), "--nodes", inv, "--run-id", "bobs"])
        assert res.exit_code == 0, res.output
        assert records.load("bobs").master_port == first + 2
        assert f"{first + 2} bobs 0" in res.output
        assert f"{first} is held by run alices" not in res.output     # first is in use, not held
    finally:
        listener.kill()
        listener.wait()


# --------------------------------------------------------------------------- preflight's port facts

def test_ss_holders_are_read_for_the_port_asked_only():
    text = ('LISTEN 0 128 0.0.0.0:29500 0.0.0.0:* users:(("python3",pid=812,fd=3))\n'
            'LISTEN 0 128 [::]:29500 [::]:* users:(("python3",pid=812,fd=4),("torchrun",pid=9,fd=5))\n'
            'LISTEN 0 128 0.0.0.0:295000 0.0.0.0:* users:(("other",pid=1,fd=3))\n'
            'LISTEN 0 128 127.0.0.1:22 0.0.0.0:* users:(("sshd",pid=77,fd=3))\n'
            'LISTEN 0 128 0.0.0.0:29501 0.0.0.0:*\n')
    assert parse_ss_holders(text, 29500) == ["python3 (pid 812)", "torchrun (pid 9)"]
    assert parse_ss_holders(text, 29501) == []        # another user's process: ss names nobody


def test_preflight_chooses_or_names_who_holds_a_busy_master_port(loopback_sshd):
    """A real sshd on loopback, a real listening socket in this process."""
    port = free_port("0.0.0.0")
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
        s.listen()
        with Cluster(loopback_sshd.inventory(2, master_port=port)) as cluster:
            chosen = run_preflight(cluster, master_port_mode="choose")
            pinned = run_preflight(cluster, master_port_mode="pinned")
    assert chosen[0].ok and chosen[0].master_port_free is False and port in chosen[0].listening_ports
    assert chosen[1].listening_ports is None               # the master's only
    assert pinned[0].master_port_holder and f"(pid {os.getpid()})" in pinned[0].master_port_holder
    assert pinned[0].problems == [f"master port {port} is already in use on the master by "
                                  f"{pinned[0].master_port_holder} (another job? leave the port "
                                  "unpinned and launch picks a free one, or pin another)"]
