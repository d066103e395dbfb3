"""`clusterctl launch --scheduler slurm` through typer's CliRunner: --dry-run prints the
sbatch script; bad options and a machine without sbatch are one message, exit 2, nothing
submitted and nothing written."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from clusterctl.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CLUSTERCTL_PLAIN", "1")
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("CLUSTERCTL_NODES", raising=False)


def _refused(result: Result, *fragments: str) -> None:
    if not isinstance(result.exception, SystemExit):
        shown = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else ""
        pytest.fail(f"expected exit 2, got {result.exception!r}\n{shown}\n{result.output}")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output


def test_dry_run_prints_the_script(tmp_path):
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nnodes", "3",
                                 "--partition", "debug", "--time", "10", "--run-id", "r1",
                                 "--set", "API_TOKEN=hidden-value", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=3" in result.output and "#SBATCH --partition=debug" in result.output
    assert f"#SBATCH --output={tmp_path}/runs/r1/slurm-%j.out" in result.output
    assert "hidden-value" not in result.output and "-e API_TOKEN \\" in result.output
    assert not (tmp_path / "runs").exists()


def test_dry_run_pyxis_rendered_only_no_enroot_here():
    result = runner.invoke(app, ["launch", "bert", "--scheduler", "slurm", "--nnodes", "2",
                                 "--container", "pyxis", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "--container-image=clusterctl/accl:" in result.output
    assert "--no-container-mount-home" in result.output


@pytest.mark.parametrize(("args", "fragments"), [
    (["--nnodes", "0"], ["--nnodes 0 is not a node count"]),
    (["--nnodes", "2", "--time", "soon"], ["--time 'soon' is not a Slurm time limit", "HH:MM:SS"]),
    (["--nnodes", "2", "--container", "rkt"], ["--container 'rkt'", "docker, podman or pyxis"]),
    ([], ["needs the node count: --nnodes N"]),
])
def test_bad_slurm_options_exit_2(args, fragments, tmp_path):
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", *args, "--dry-run"])
    _refused(result, *fragments)
    assert not (tmp_path / "runs").exists()


def test_unknown_scheduler_and_slurm_options_without_slurm_exit_2():
    _refused(runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "pbs"]),
             "--scheduler 'pbs' is not a scheduler; valid: ssh or slurm")
    _refused(runner.invoke(app, ["launch", "ddp-smoke", "--nnodes", "2"]),
             "--nnodes: only with --scheduler slurm")
    _refused(runner.invoke(app, ["launch", "ddp-smoke"]), "--nodes FILE is required")


def test_no_sbatch_on_path_exit_2_nothing_submitted(monkeypatch, tmp_path):
    """A real PATH with no Slurm client on it (an empty directory), not a mock."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nnodes", "2"])
    _refused(result, "sbatch", "not found on this machine", "slurm-client")
    assert not (tmp_path / "runs").exists()
    assert os.environ["PATH"] == str(empty) and not any(Path(empty).iterdir())


def test_dry_run_json_is_refused_for_slurm_the_plan_is_one_script(tmp_path):
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nnodes", "2",
                                 "--dry-run", "--json"])
    _refused(result, "--dry-run --json: with --scheduler slurm the plan is one sbatch script",
             "Nothing was submitted")
    assert not (tmp_path / "runs").exists()


def _slurm_record(tmp_path) -> None:
    from clusterctl.run import records
    rec = records.RunRecord(run_id="sl-done", job="ddp-smoke", inventory="", image="img",
                            scheduler="slurm", slurm_job="999999", state="failed", exit_code=3,
                            nodes=[records.NodeRecord(node="node1", host="node1", rank=0,
                                                      container="sl-done-node1", state="exited",
                                                      exit_code=3)])
    rec.save()
    (rec.dir / "node1.log").write_text("hello from node1\n")


def test_status_and_logs_of_a_slurm_run_come_from_its_record(tmp_path):
    """A Slurm run's record and files; the Slurm clients are the real ones (an empty
    SLURM_CONF: no Slurm answers, the job is reported as not known)."""
    _slurm_record(tmp_path)
    result = runner.invoke(app, ["logs", "sl-done"])
    assert result.exit_code == 0, result.output
    assert "node1[0]| hello from node1" in result.output
    if all(map(__import__("shutil").which, ("squeue", "scontrol"))):
        empty = tmp_path / "empty.conf"   # a missing one makes Slurm retry for 60 s
        empty.write_text("")
        result = runner.invoke(app, ["status", "sl-done"], env={"SLURM_CONF": str(empty)})
        assert result.exit_code == 0, result.output
        assert "Slurm job 999999" in result.output and "failed, exit 3" in result.output


def _inventory(tmp_path: Path, *runtimes: str | None) -> Path:
    lines = ["nodes:"]
    for i, runtime in enumerate(runtimes, 1):
        lines.append(f"  - {{name: node{i}, host: 10.0.0.{i}" + (f", runtime: {runtime}}}" if runtime else "}"))
    path = tmp_path / "inv.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("runtimes", "runs"), [
    (("podman", "podman"), "podman run"), ((None, "docker"), "docker run"), ((None, None), "docker run")])
def test_without_container_the_script_uses_the_inventorys_runtime(tmp_path, runtimes, runs):
    inv = _inventory(tmp_path, *runtimes)
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes", str(inv), "--dry-run"])
    assert result.exit_code == 0, result.output
    other = {"podman run": "docker run", "docker run": "podman run"}[runs]
    assert runs in result.output and other not in result.output


def test_a_spare_in_the_inventory_takes_no_rank_on_slurm_and_the_user_is_told(tmp_path):
    """Before, --nodelist and --nodes counted the spare: it ran as one more rank."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: node1, host: 10.0.0.1}\n  - {name: node2, host: 10.0.0.2}\n"
                   "  - {name: node3, host: 10.0.0.3, spare: true}\n")
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes", str(inv), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --nodes=2\n" in result.output and "#SBATCH --nodelist=node1,node2\n" in result.output
    assert f"note: node3 (spare: true in {inv}) takes no rank on Slurm" in result.output
    assert "give --nnodes N instead of --nodes" in result.output
    mismatch = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes", str(inv),
                                   "--nnodes", "3", "--dry-run"])
    _refused(mismatch, "--nnodes 3 disagrees with the inventory's 2 nodes")


@pytest.mark.parametrize(("runtimes", "args", "fragments"), [
    (("docker", "podman"), [], ["inv.yaml: the nodes' runtime differs: docker (node1), podman (node2)",
                                "valid: the same `runtime` on every node, or --container pyxis"]),
    (("podman", "podman"), ["--container", "docker"], ["--container docker:", "inv.yaml gives its nodes runtime "
                                                       "podman (node1)", "valid: --container podman"]),
])
def test_a_runtime_the_nodes_do_not_agree_on_is_refused(tmp_path, runtimes, args, fragments):
    inv = _inventory(tmp_path, *runtimes)
    result = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "slurm", "--nodes", str(inv), *args,
                                 "--dry-run"])
    _refused(result, *fragments)
    assert not (tmp_path / "runs").exists()
