"""A path read from another user's run record is theirs to name, not the caller's to read.

A member of a shared runs directory writes a record (it is provably theirs: their uid owns
it) whose inventory is a file they cannot read, /etc/shadow, or one somebody else owns.
`status`, `logs` and `stop` of that run, by root or by anyone, must not read it (and quote
its lines in the refusal, or reach hosts it lists with the caller's SSH identity): they
say whose run it is and ask for --nodes.  Their own inventory, a regular file they own,
is still read, and --nodes always is.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.run import records

OTHER = 65534


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(d))
    return d


def planted(run_id: str, inventory: str, *, owner: int = OTHER) -> records.RunRecord:
    rec = records.RunRecord(run_id=run_id, job="ddp-smoke", inventory=inventory, image="img:1",
                            started=datetime.now(timezone.utc), state="running", detached=True,
                            nodes=[records.NodeRecord(node="node1", host="10.9.9.9", rank=0,
                                                      container=f"{run_id}-node1")])
    rec.save()
    path = rec.dir / records.RECORD_NAME
    text = path.read_text().replace(f'"uid": {os.geteuid()}', f'"uid": {owner}')
    path.write_text(text)
    os.chown(path, owner, owner)
    os.chown(rec.dir, owner, owner)
    return records.load(run_id)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files owned by another uid")
@pytest.mark.parametrize("target", ["/etc/shadow", "mine", "link", "missing"])
def test_another_users_recorded_inventory_is_not_read_unless_theirs(runs_dir, tmp_path, target):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: node1, host: 10.9.9.9}\n")       # the caller's, not theirs
    path = {"/etc/shadow": "/etc/shadow", "mine": str(inv), "missing": str(tmp_path / "gone.yaml"),
            "link": str(tmp_path / "link.yaml")}[target]
    if target == "link":
        theirs = tmp_path / "theirs.yaml"
        theirs.write_text(inv.read_text())
        os.chown(theirs, OTHER, OTHER)
        os.symlink(theirs, path)
        os.lchown(path, OTHER, OTHER)
    rec = planted("other-1", path)
    with pytest.raises(UserError, match=r"run other-1 is .*'s, and the inventory .* not read\. "
                                        r"Give the inventory of its nodes: --nodes FILE"):
        records.inventory_path(rec)
    for args in (["status", "other-1"], ["logs", "other-1"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "--nodes FILE" in res.output and "root:" not in res.output, res.output
        assert "Traceback" not in res.output
    assert records.inventory_path(rec, inv) == inv                          # --nodes: read


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files owned by another uid")
def test_their_own_regular_inventory_is_read(runs_dir, tmp_path):
    inv = tmp_path / "theirs.yaml"
    inv.write_text("nodes:\n  - {name: node1, host: 10.9.9.9}\n")
    os.chown(inv, OTHER, OTHER)
    rec = planted("other-2", str(inv))
    assert records.inventory_path(rec) == inv
    mine = planted("mine-1", "/nonexistent/inv.yaml", owner=os.geteuid())
    assert str(records.inventory_path(mine)) == "/nonexistent/inv.yaml"   # the caller's own record
