"""A path read from another user's run record is read only when that user could read it.

A member of a shared runs directory writes a record (provably theirs: their uid owns it)
whose inventory is a file they cannot read: /etc/shadow, a file in a directory of root's.
`status` and `logs` of that run, by root (who can read anything), must not read it (and
quote its lines in the refusal, or reach hosts it lists with root's SSH identity): they
say whose run it is and ask for --nodes.  A file that user can read (theirs, or a shared
world-readable inventory) is still read, and --nodes always is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.run import records

OTHER = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files owned by another uid")


@pytest.fixture
def open_dir():
    """A directory every user may enter (pytest's tmp_path is root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="clusterctl-test-inv-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def planted(run_id: str, inventory: str, *, owner: int = OTHER) -> records.RunRecord:
    rec = records.RunRecord(run_id=run_id, job="ddp-smoke", inventory=inventory, image="img:1",
                            started=datetime.now(timezone.utc), state="running", detached=True,
                            nodes=[records.NodeRecord(node="node1", host="10.9.9.9", rank=0,
                                                      container=f"{run_id}-node1")])
    rec.save()
    path = rec.dir / records.RECORD_NAME
    path.write_text(path.read_text().replace(f'"uid": {os.geteuid()}', f'"uid": {owner}'))
    os.chown(path, owner, owner)
    os.chown(rec.dir, owner, owner)
    return records.load(run_id)


INVENTORY = "nodes:\n  - {name: node1, host: 10.9.9.9}\n"


@pytest.mark.parametrize("target", ["/etc/shadow", "roots-dir", "mode-600", "link-to-shadow", "fifo"])
def test_a_file_the_runs_owner_cannot_read_is_not_read_for_them(runs_dir, tmp_path, open_dir, target):
    if target == "roots-dir":          # readable itself, but in root's 0700 directory
        path = tmp_path / "inv.yaml"
        path.write_text(INVENTORY)
    elif target == "mode-600":
        path = open_dir / "inv.yaml"
        path.write_text(INVENTORY)
        path.chmod(0o600)
    elif target == "link-to-shadow":
        path = open_dir / "link.yaml"
        os.symlink("/etc/shadow", path)
    elif target == "fifo":
        path = open_dir / "fifo.yaml"
        os.mkfifo(path)
        path.chmod(0o666)
    else:
        path = Path(target)
    rec = planted("other-1", str(path))
    with pytest.raises(UserError, match=r"run other-1 is .*'s, and the inventory .* is not a file "
                                        r".* can read: it is not read for them\. Give the inventory"):
        records.inventory_path(rec)
    for args in (["status", "other-1"], ["logs", "other-1"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "--nodes FILE" in res.output and "root:" not in res.output, res.output
        assert "Traceback" not in res.output
    assert records.inventory_path(rec, tmp_path / "mine.yaml") == tmp_path / "mine.yaml"   # --nodes


@pytest.mark.parametrize("how", ["theirs-600", "shared-644", "group"])
def test_a_file_the_runs_owner_can_read_is_read(runs_dir, open_dir, how):
    path = open_dir / "inv.yaml"
    path.write_text(INVENTORY)
    if how == "theirs-600":
        os.chown(path, OTHER, OTHER)
        path.chmod(0o600)
    elif how == "shared-644":
        path.chmod(0o644)                      # root's, readable by everyone: a site's shared file
    else:
        os.chown(path, 0, OTHER)               # nobody's group (65534) may read it
        path.chmod(0o640)
    rec = planted("other-2", str(path))
    assert records.inventory_path(rec) == path


def test_the_callers_own_record_names_any_path(runs_dir):
    mine = planted("mine-1", "/nonexistent/inv.yaml", owner=os.geteuid())
    assert str(records.inventory_path(mine)) == "/nonexistent/inv.yaml"
