"""`clusterctl export` through typer's CliRunner: stdout or -o FILE, and bad input (exit 2,
one message, nothing written).  No cluster is contacted (none runs here)."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from clusterctl.cli import app


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


def test_a_secret_value_is_refused_unshown_and_nothing_written(tmp_path):
    out = tmp_path / "m.yaml"
    result = _export("ddp-smoke", "--to", "trainjob", "--nnodes", "2", "--set", "HF_TOKEN=hf_abc", "-o", str(out))
    assert result.exit_code == 2 and "HF_TOKEN is a secret" in result.stderr
    assert "hf_abc" not in result.output and not out.exists()


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
