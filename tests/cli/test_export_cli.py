"""`clusterctl export` through typer's CliRunner: stdout or -o FILE, and bad input (exit 2,
one message, nothing written).  No cluster is contacted (none runs here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app

REPO = Path(__file__).resolve().parents[2]


def _export(*args: str):
    return CliRunner().invoke(app, ["export", *args])


def test_export_prints_a_pytorchjob_no_cluster():
    result = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--namespace", "ml")
    assert result.exit_code == 0, result.output
    body = yaml.safe_load(result.stdout)
    assert body["kind"] == "PyTorchJob" and body["metadata"]["namespace"] == "ml"
    assert result.stdout.startswith("# PyTorchJob of clusterctl job ddp-smoke")


def test_export_writes_a_trainjob_file_no_cluster(tmp_path):
    out = tmp_path / "bert.yaml"
    result = _export("bert", "--to", "trainjob", "--nnodes", "2", "--slots", "8", "--image",
                     "registry.example/accl:1", "--set", "BERT_DIR=/data/BERT", "-o", str(out))
    assert result.exit_code == 0, result.output
    body = yaml.safe_load(out.read_text())
    assert body["spec"]["trainer"]["image"] == "registry.example/accl:1"
    assert f"wrote TrainJob bert to {out}" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["bert.yaml"]   # no temporary file left


def _refused(tmp_path, *args: str, message: str):
    out = tmp_path / "m.yaml"
    result = _export(*args, "-o", str(out))
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_unknown_kind_is_refused_and_nothing_written(tmp_path):
    _refused(tmp_path, "ddp-smoke", "--to", "pytorch-job", "--nnodes", "2",
             message='unknown kind (did you mean "pytorchjob"?); valid: pytorchjob or trainjob')


def test_zero_nodes_is_refused_and_nothing_written(tmp_path):
    _refused(tmp_path, "ddp-smoke", "--to", "trainjob", "--nnodes", "0", message="--nnodes 0")


@pytest.mark.parametrize("to_file", [False, True])
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_secret_value_is_exported_as_a_reference_and_shown_nowhere(tmp_path, kind, to_file):
    """The real CLI as a subprocess: exit 0, a secretKeyRef, the kubectl line on stderr with
    the value elided; the value in none of stdout, stderr, the manifest."""
    out = tmp_path / "m.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "clusterctl", "export", "ddp-smoke", "--to", kind, "--nnodes", "2",
         "--set", "HF_TOKEN=hf_abc123secret", "--set", "API_PASSWORD=pw_zz9", "-n", "ml",
         *(["-o", str(out)] if to_file else [])],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=120)
    assert done.returncode == 0, done.stderr
    manifest = out.read_text() if to_file else done.stdout
    for text in (done.stdout, done.stderr, manifest):
        assert "hf_abc123secret" not in text and "pw_zz9" not in text
    body = yaml.safe_load(manifest)
    env = (body["spec"]["trainer"] if kind == "trainjob" else
           body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0])["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"HF_TOKEN": {"name": "ddp-smoke-secrets", "key": "HF_TOKEN"},
                    "API_PASSWORD": {"name": "ddp-smoke-secrets", "key": "API_PASSWORD"}}
    assert ("kubectl create secret generic ddp-smoke-secrets -n ml --from-literal=HF_TOKEN=... "
            "--from-literal=API_PASSWORD=...") in done.stderr
    assert "given by --set HF_TOKEN=..., --set API_PASSWORD=... are written nowhere" in done.stderr


def test_secret_name_option_and_its_check(tmp_path):
    result = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--set", "HF_TOKEN=hf_q",
                     "--secret-name", "team-hf")
    assert result.exit_code == 0, result.output
    assert "secretKeyRef:\n                  name: team-hf\n" in result.stdout
    assert "kubectl create secret generic team-hf --from-literal=HF_TOKEN=..." in result.stderr
    assert "hf_q" not in result.stdout + result.stderr
    _refused(tmp_path, "ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "--set", "HF_TOKEN=hf_q",
             "--secret-name", "Team_HF", message="--secret-name 'Team_HF': not a Kubernetes Secret name; "
             "valid: lower-case letters, digits, '-' and '.'")


def test_every_shipped_job_exports_to_both_kinds_through_the_cli():
    for job in sorted(p.stem for p in (REPO / "jobs").glob("*.yaml")):
        for kind in ("pytorchjob", "trainjob"):
            result = _export(job, "--to", kind, "--nnodes", "2", "--slots", "2")
            assert result.exit_code == 0, (job, kind, result.output)


def test_an_inexpressible_device_is_refused_and_nothing_written(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("image: reg/app:1\ndocker_args: [--device=/dev/dri]\ncommand: [run]\n")
    out = tmp_path / "m.yaml"
    result = _export(str(job), "--to", "pytorchjob", "--nnodes", "1", "-o", str(out))
    assert result.exit_code == 2 and "device /dev/dri cannot be expressed in Kubernetes" in result.stderr
    assert not out.exists()


def test_missing_output_directory_is_refused(tmp_path):
    result = _export("ddp-smoke", "--to", "pytorchjob", "--nnodes", "1", "-o", str(tmp_path / "no" / "m.yaml"))
    assert result.exit_code == 2 and "does not exist" in result.stderr
