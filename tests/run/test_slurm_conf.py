"""Which slurm.conf a Slurm run's clients use (issue 23 item 7): the pure choice, the
refusal of a SLURM_CONF naming no file (real CLI, real Slurm clients: at once, exit 2),
and the Slurm clients' own "cannot stat file ... retrying" ended at once, not waited out.
The launch through a sandbox's Slurm without SLURM_CONF: tests/run/test_slurm_launch.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from clusterctl.run.slurm import conf
from clusterctl.run.slurm.client import missing_conf, slurm_client

SBX = conf.SandboxSlurm("sbx", "/work/inventories/sandbox.yaml", "/run/clusterctl/sandbox/sbx/slurm/slurm.conf")
OTHER = conf.SandboxSlurm("h4b", "/tmp/h4b.yaml", "/run/clusterctl/sandbox/h4b/slurm/slurm.conf")
CLI = [sys.executable, "-m", "clusterctl"]


# --------------------------------------------------------------------------- pure

def test_no_slurm_conf_and_a_sandbox_inventory_gives_that_sandbox():
    assert conf.sandbox_for({}, "/work/inventories/sandbox.yaml", [OTHER, SBX]) == SBX
    assert conf.sandbox_for({}, "/tmp/h4b.yaml", [OTHER, SBX]) == OTHER
    assert conf.sandbox_for({}, "/work/inventories/../inventories/sandbox.yaml", [SBX]) == SBX


def test_slurm_conf_set_or_another_inventory_changes_nothing():
    assert conf.sandbox_for({"SLURM_CONF": "/etc/slurm/slurm.conf"}, SBX.inventory, [SBX]) is None
    assert conf.sandbox_for({"SLURM_CONF": ""}, SBX.inventory, [SBX]) is None
    assert conf.sandbox_for({}, "/site/nodes.yaml", [SBX]) is None
    assert conf.sandbox_for({}, None, [SBX]) is None          # --nnodes: no inventory
    assert conf.sandbox_for({}, SBX.inventory, []) is None    # no sandbox with Slurm


def test_conf_problem_names_what_is_wrong():
    ok = dict(exists=True, is_dir=False, is_file=True, readable=True)
    assert conf.conf_problem("/etc/slurm/slurm.conf", **ok) is None
    assert conf.conf_problem("/x", **{**ok, "exists": False, "is_file": False}) == "no such file"
    assert conf.conf_problem("/x", **{**ok, "is_dir": True, "is_file": False}) == "a directory, not a file"
    assert conf.conf_problem("/x", **{**ok, "readable": False}) == "not readable by this user"
    assert conf.conf_problem("", **{**ok, "exists": False}) == "empty"


def test_bad_conf_message_names_slurm_conf_the_path_and_what_is_valid():
    text = conf.bad_conf_message("/nowhere/slurm.conf", "no such file")
    assert text.startswith("SLURM_CONF=/nowhere/slurm.conf: no such file")
    assert "valid: the path of the cluster's slurm.conf" in text and "unset SLURM_CONF" in text


def test_missing_conf_reads_the_clients_own_words():
    said = ("sbatch: error: s_p_parse_file: cannot stat file /nowhere/slurm.conf: No such file "
            "or directory, retrying in 1sec up to 60sec\n")
    assert missing_conf(said) == "/nowhere/slurm.conf"
    assert missing_conf("sbatch: error: Invalid job id specified\n") is None


def test_slurm_env_uses_the_recorded_sandbox_and_says_so(tmp_path, monkeypatch):
    inv = tmp_path / "inventories" / "sandbox.yaml"
    inv.parent.mkdir()
    inv.write_text("nodes: []\n")
    sb = conf.SandboxSlurm("sbx", str(inv.resolve()), str(tmp_path / "slurm.conf"))
    monkeypatch.setattr(conf, "recorded_sandboxes", lambda: [sb])
    notes: list[str] = []
    monkeypatch.chdir(tmp_path)
    env = conf.slurm_env("inventories/sandbox.yaml", env={"PATH": "/bin"}, note=notes.append)
    assert env == {"PATH": "/bin", "SLURM_CONF": sb.conf}
    assert notes == [f'using the Slurm of sandbox "sbx": SLURM_CONF={sb.conf}']
    site = tmp_path / "site.conf"
    site.write_text("ClusterName=site\n")
    assert conf.slurm_env(inv, env={"SLURM_CONF": str(site)}, note=notes.append) == {"SLURM_CONF": str(site)}
    assert len(notes) == 1                                   # SLURM_CONF given: nothing said
    with pytest.raises(conf.UserError, match=r"SLURM_CONF=.*: a directory, not a file"):
        conf.slurm_env(inv, env={"SLURM_CONF": str(tmp_path)})


# --------------------------------------------------------------------------- real clients

needs_slurm_client = pytest.mark.skipif(shutil.which("sbatch") is None,
                                        reason="sbatch not installed (scripts/setup-host: slurm-client)")


@needs_slurm_client
def test_a_client_that_cannot_find_its_conf_is_ended_at_once():
    start = time.monotonic()
    res = slurm_client(["squeue", "-h"], env={**os.environ, "SLURM_CONF": "/nowhere/slurm.conf"})
    took = time.monotonic() - start
    assert res.returncode != 0 and missing_conf(res.stderr) == "/nowhere/slurm.conf", res
    assert took < 5, f"squeue took {took:.1f}s (it retries a missing conf for 60 s)"


@needs_slurm_client
@pytest.mark.parametrize("command", [
    ["launch", "ddp-smoke", "--scheduler", "slurm", "--nnodes", "2"],
    ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes",
     "tests/fixtures/inventories/good_mpi_hostfile"],
])
def test_launch_refuses_a_slurm_conf_naming_no_file_at_once(command, tmp_path):
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "nowhere" / "slurm.conf"),
           "CLUSTERCTL_RUNS": str(tmp_path / "runs")}
    start = time.monotonic()
    res = subprocess.run([*CLI, *command, "--run-id", "conf-missing"], env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    took = time.monotonic() - start
    assert res.returncode == 2, res.stdout + res.stderr
    said = " ".join(res.stderr.split())
    assert f"SLURM_CONF={tmp_path}/nowhere/slurm.conf: no such file" in said, said
    assert "valid: the path of the cluster's slurm.conf" in said and "unset SLURM_CONF" in said
    assert "Traceback" not in res.stderr and "Slurm version" not in said
    # the Slurm clients retry a missing conf for 60 s; a CLI start on a loaded 2-core CI
    # machine has taken over 5 s, so the bound sits between the two
    assert took < 30, f"took {took:.1f}s (the Slurm clients retry a missing conf for 60 s)"
    assert not (tmp_path / "runs" / "conf-missing").exists()     # nothing written


@needs_slurm_client
def test_status_of_a_slurm_run_refuses_a_slurm_conf_naming_no_file(tmp_path):
    from clusterctl.run import records
    run = tmp_path / "runs" / "sl-rec"
    run.mkdir(parents=True)
    rec = records.RunRecord(run_id="sl-rec", job="ddp-smoke", inventory="", image="x",
                            scheduler="slurm", slurm_job="12", state="running")
    (run / records.RECORD_NAME).write_text(records.dump(rec))
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "gone.conf"),
           "CLUSTERCTL_RUNS": str(tmp_path / "runs")}
    for cmd in (["status", "sl-rec"], ["logs", "sl-rec"], ["stop", "sl-rec"]):
        start = time.monotonic()
        res = subprocess.run([*CLI, *cmd], env=env, capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 2, (cmd, res.stdout + res.stderr)
        assert f"SLURM_CONF={tmp_path}/gone.conf: no such file" in " ".join(res.stderr.split())
        assert time.monotonic() - start < 5, cmd
