"""``--nodes slurm``: the inventory from SLURM_JOB_NODELIST (python-hostlist), names and
ranks in Slurm's order; outside an allocation, one message and exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import inventory_from_slurm, load_inventory
from clusterctl.core.errors import UserError


@pytest.mark.parametrize(("nodelist", "names"), [
    ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
    ("a[01-02]b", ["a01b", "a02b"]),
    ("gpu7,cpu[9-10]", ["gpu7", "cpu9", "cpu10"]),
])
def test_hostlist_gives_names_and_ranks(nodelist, names):
    inventory = inventory_from_slurm({"SLURM_JOB_NODELIST": nodelist})
    assert inventory.names == names
    assert [inventory.rank(n) for n in names] == list(range(len(names)))
    assert inventory.master.name == names[0]
    assert [n.host for n in inventory.nodes] == names


def test_load_inventory_takes_the_word_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    assert load_inventory("slurm").names == ["node1", "node2"]


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "SLURM_JOB_NODELIST is not set, so this is not inside a Slurm allocation"),
    ({"SLURM_JOB_NODELIST": "node[3-1"}, "is not a Slurm hostlist"),
])
def test_bad_or_missing_nodelist_is_a_user_error(environ, message):
    with pytest.raises(UserError, match=message):
        inventory_from_slurm(environ)


def test_nodes_slurm_without_allocation_exits_2(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    result = CliRunner().invoke(app, ["nodes", "--nodes", "slurm"])
    assert result.exit_code == 2, result.output
    assert "SLURM_JOB_NODELIST is not set" in result.output and "Traceback" not in result.output


def test_nodes_slurm_lists_the_allocation(monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_PLAIN", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3,5]")
    result = CliRunner().invoke(app, ["nodes", "--nodes", "slurm", "--json"])
    assert result.exit_code == 0, result.output
    for name in ("node1", "node2", "node3", "node5"):
        assert name in result.output


def test_launch_dry_run_inside_an_allocation_uses_it(monkeypatch, tmp_path):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path))
    monkeypatch.delenv("CLUSTERCTL_NODES", raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    result = CliRunner().invoke(app, ["launch", "ddp-smoke", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "# node1 (host node1, rank 0" in result.output and "# node2 (host node2, rank 1" in result.output
