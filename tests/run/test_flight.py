"""The flight recorder's run directory on a node (issue 41, item 5): /var/tmp is shared, so
each part of ``/var/tmp/clusterctl/runs/<id>/<node>`` may have been made by another user
first. The real node programs (path-check.sh, tar, rm) run here on this machine's files, a
local stand-in replacing only the SSH channel, with the root moved under a temporary /var/tmp."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clusterctl.cluster import containers
from clusterctl.cluster.transport.commands import CommandResult
from clusterctl.run import flight, plan, records


@dataclass
class LocalConnection:
    """Runs a node command on this machine (stand-in for the SSH channel only)."""

    name: str = "node1"

    def run(self, argv, *, stdin=None, timeout=None, check=False):
        p = subprocess.run(list(argv), input=stdin or b"", capture_output=True, timeout=timeout or 60)
        r = CommandResult(self.name, list(argv), p.returncode, p.stdout.decode(), p.stderr.decode())
        return r.check() if check else r


@dataclass
class OneNodeCluster:
    """``cluster.map`` over one local connection (what collect uses of a Cluster)."""

    conn: LocalConnection = field(default_factory=LocalConnection)

    @property
    def inventory(self):
        return type("Inv", (), {"nodes": [type("N", (), {"name": self.conn.name})()]})()

    def map(self, fn, nodes=None):
        return {self.conn.name: fn(self.conn)} if nodes is None or self.conn.name in nodes else {}


@pytest.fixture
def var_tmp(tmp_path, monkeypatch):
    top = tmp_path / "var-tmp"
    top.mkdir(mode=0o1777)
    top.chmod(0o1777)
    monkeypatch.setattr(plan, "NODE_RUN_ROOT", f"{top}/clusterctl/runs")
    monkeypatch.setattr(flight, "NODE_RUN_TOP", str(top))
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    return top


def _record(run_id="r1"):
    return records.RunRecord(run_id=run_id, job="j", inventory="i.yaml", image="img", nodes=[
        records.NodeRecord(node="node1", host="h", rank=0, container="c", flight_dir="yes")])


def test_dumps_are_collected_and_the_run_directory_removed(var_tmp):
    d = Path(plan.flight_dir("r1", "node1"))
    d.mkdir(parents=True)
    (d / "rank0.dump").write_text("trace")
    got = flight.collect(OneNodeCluster(), _record())
    assert got == {"node1": ["rank0.dump"]}
    assert (records.run_path("r1") / "flight" / "node1" / "rank0.dump").read_text() == "trace"
    assert not (var_tmp / "clusterctl" / "runs" / "r1").exists()


def test_a_planted_link_in_the_path_is_neither_read_nor_removed(var_tmp, tmp_path):
    victim = tmp_path / "victim"
    (victim / "node1" / "flight").mkdir(parents=True)
    (victim / "node1" / "flight" / "precious").write_text("keep")
    (var_tmp / "clusterctl" / "runs").mkdir(parents=True)
    (var_tmp / "clusterctl" / "runs" / "r1").symlink_to(victim)
    got = flight.collect(OneNodeCluster(), _record())
    assert got["node1"] == (f"not collected, and left on the node: {var_tmp}/clusterctl/runs/r1 "
                            "is a symbolic link")
    assert (victim / "node1" / "flight" / "precious").read_text() == "keep"
    assert not (records.run_path("r1") / "flight").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user's needs root to make")
@pytest.mark.parametrize(("owner", "mode", "why"), [
    (65534, 0o755, "belongs to another user (uid 65534)"),
    (0, 0o777, "may be written by others (mode 777, not sticky)"),
    (0, 0o775, "may be written by others (mode 775, not sticky)"),
])
def test_a_part_another_user_made_or_may_swap_is_refused(var_tmp, owner, mode, why):
    runs = var_tmp / "clusterctl" / "runs"
    Path(plan.flight_dir("r1", "node1")).mkdir(parents=True)
    os.chown(runs, owner, owner)
    runs.chmod(mode)
    problem = containers.path_problem(LocalConnection(), str(var_tmp), plan.flight_dir("r1", "node1"))
    assert problem == f"{runs} {why}"
    got = flight.collect(OneNodeCluster(), _record())
    assert got["node1"] == f"not collected, and left on the node: {runs} {why}"
    assert Path(plan.flight_dir("r1", "node1")).is_dir()


def test_a_sticky_shared_parent_and_a_missing_path_are_fine(var_tmp):
    (var_tmp / "clusterctl").mkdir(mode=0o1777)
    (var_tmp / "clusterctl").chmod(0o1777)
    assert containers.path_problem(LocalConnection(), str(var_tmp), plan.flight_dir("r1", "node1")) is None
    assert containers.path_problem(LocalConnection(), str(var_tmp), f"{var_tmp}/../etc") == f"{var_tmp}/../etc names .."
