"""A job with a workdir, touching no node: keys and flags, the torchrun rule, the plan's mount,
the refusals of `launch --dry-run` (the same answers as launch), through the real CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import UserError
from clusterctl.run import launch, plan
from clusterctl.run.jobs import (
    CODE_MOUNT,
    TORCHRUN_PREFIX,
    inline_job,
    load_job,
    under_torchrun,
)
from tests.fixtures import REPO

INVENTORY = REPO / "inventories" / "example.yaml"
runner = CliRunner()


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "values.py").write_text("VALUE = 1\n")
    (root / "train.py").write_text("from pkg.values import VALUE\nprint(VALUE)\n")
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 4096)
    return root


def dry(*args: str):
    return runner.invoke(app, ["launch", "--nodes", str(INVENTORY), "--dry-run", *args])


@pytest.mark.parametrize(("command", "after"), [
    (["python", "train.py", "--lr", "3e-4"], ["train.py", "--lr", "3e-4"]),
    (["python3", "-u", "-m", "pkg.main", "x"], ["-m", "pkg.main", "x"]),
    (["/usr/bin/python3.11", "t.py"], ["t.py"]),
    (["python", "-c", "print(1)"], ["--no-python", "python", "-c", "print(1)"]),
])
def test_a_plain_python_command_runs_under_torchrun(command, after):
    assert under_torchrun(command) == [*TORCHRUN_PREFIX, *after]


@pytest.mark.parametrize("command", [["torchrun", "t.py"], ["bash", "run.sh"], ["pythonista"]])
def test_other_commands_run_as_written(command):
    assert under_torchrun(command) == command


def test_inline_job_is_checked_like_a_file(project, monkeypatch):
    monkeypatch.chdir(project.parent)
    job = inline_job({"target": "cpu", "workdir": "proj", "command": ["python", "train.py"]})
    assert job.name == "proj" and job.workdir == project
    assert job.command[:len(TORCHRUN_PREFIX)] == list(TORCHRUN_PREFIX)
    with pytest.raises(UserError, match=r"\(command line\):1: target: unknown target \"cpux\""):
        inline_job({"target": "cpux", "command": ["true"]})
    with pytest.raises(UserError, match=r"workdir: .*nowhere is not there"):
        inline_job({"target": "cpu", "workdir": "nowhere", "command": ["true"]})
    with pytest.raises(UserError, match=r"max_workdir_size"):
        inline_job({"target": "cpu", "workdir": "proj", "command": ["true"], "max_workdir_size": "lots"})


def test_flags_win_over_the_job_file_and_paths_follow_their_origin(project, tmp_path, monkeypatch):
    job_file = project / "job.yaml"
    job_file.write_text(yaml.safe_dump({"target": "cpu", "workdir": ".", "env": {"A": "1", "B": "2"},
                                        "command": ["python", "train.py"]}))
    job = load_job(job_file)
    assert job.workdir == project and job.requirements is None     # relative to the file
    monkeypatch.chdir(tmp_path)
    job = load_job(job_file, {"env": {"B": "flag"}, "nproc_per_node": 3, "workdir": "proj"})
    assert job.env == {"A": "1", "B": "flag"} and job.nproc_per_node == 3
    assert job.workdir == tmp_path / "proj"                         # relative to the cwd


def test_requirements_default_to_the_workdirs_file(project):
    (project / "requirements.txt").write_text("six==1.16.0\n")
    job = inline_job({"target": "cpu", "workdir": str(project), "command": ["true"]})
    assert job.requirements == project / "requirements.txt"


def test_the_plan_mounts_the_tree_read_only_at_workspace(project):
    job = inline_job({"target": "cpu", "workdir": str(project), "command": ["python", "train.py"]})
    inventory = load_inventory(INVENTORY)
    code = plan.CodeMount("sha256:" + "ab" * 32, {n.name: f"/c/{n.name}" for n in inventory.nodes})
    plans = plan.make_plan(job, inventory, run_id="r1", code=code)
    for p in plans:
        argv = p.argv
        i = argv.index(f"/c/{p.node}:{CODE_MOUNT}:ro")
        assert argv[i - 1] == "-v" and argv[argv.index("-w") + 1] == CODE_MOUNT
        assert p.env["CLUSTERCTL_CODE_DIGEST"] == code.digest
        assert argv[argv.index(p.image) + 1:][:1] == ["torchrun"]


def test_dry_run_shows_what_would_ship_and_the_mount(project, monkeypatch):
    monkeypatch.chdir(project)
    res = dry("--target", "cpu", "--workdir", ".", "--", "python", "train.py", "--lr", "{3e-4}")
    assert res.exit_code == 0, res.output
    m = re.search(r"# code: .* -> /workspace: (\d+) files, (\d+) bytes, (sha256:[0-9a-f]{64})", res.output)
    assert m and m.group(1) == "4", res.output      # .gitignore, pkg/__init__, pkg/values, train.py
    hexd = m.group(3).split(":")[1]
    assert f"/trees/{hexd}:/workspace:ro" in res.output
    assert "--lr '{3e-4}'" in res.output              # typed after --: braces kept, not placeholders
    assert "big.bin" not in res.output


def test_dry_run_names_the_credential_like_files_it_left_out(project, monkeypatch):
    monkeypatch.chdir(project)
    (project / ".envrc").write_text("export HF_TOKEN=hf_secret\n")
    (project / "keys").mkdir()
    (project / "keys" / "deploy.p12").write_bytes(b"\x30\x82")
    res = dry("--target", "cpu", "--workdir", ".", "--", "python", "train.py")
    assert res.exit_code == 0, res.output
    assert re.search(r"# code: .* -> /workspace: 4 files", res.output), res.output
    assert '# code: left out .envrc: direnv\'s environment file' in res.output
    assert '"!/keys/deploy.p12" in .clusterctlignore' in res.output
    assert "hf_secret" not in res.output
    from clusterctl.run import workspace

    job = inline_job({"command": ["python", "train.py"], "target": "cpu", "workdir": str(project)})
    ws = workspace.prepare(job, "unused:base")          # no requirements: no engine asked
    assert len(ws.left_out) == 2 and "2 credential-like files left out" in workspace.describe(ws)
    (project / ".clusterctlignore").write_text("!/.envrc\n")       # named: it ships after all
    res = dry("--target", "cpu", "--workdir", ".", "--", "python", "train.py")
    assert re.search(r"-> /workspace: 6 files", res.output) and "left out .envrc" not in res.output


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: os.symlink("/etc/passwd", p / "leak"), r"leak.*(outside|leaves)"),
    (lambda p: os.mkfifo(p / "pipe"), r"pipe"),
    (lambda p: (p / "huge.bin").write_bytes(b"x" * (2 << 20)), r"huge\.bin"),
])
def test_refusals_exit_2_naming_the_file_before_anything(project, make, says, monkeypatch):
    make(project)
    monkeypatch.chdir(project)
    res = dry("--target", "cpu", "--workdir", ".", "--max-workdir-size", "1MiB", "--", "python", "train.py")
    assert res.exit_code == 2, res.output
    assert re.search(says, res.output), res.output
    assert "docker run" not in res.output


@pytest.mark.docker   # the requirements file is read where its layer is built, on the engine
def test_a_bad_requirement_line_is_refused_naming_it(project, monkeypatch):
    (project / "requirements.txt").write_text("six==1.16.0\n-e git+https://example.invalid/x\n")
    monkeypatch.chdir(project)
    res = runner.invoke(app, ["launch", "--nodes", str(INVENTORY), "--target", "cpu", "--workdir", ".",
                              "--", "python", "train.py"])
    assert res.exit_code == 2, res.output
    assert "requirements.txt:2" in res.output


def test_missing_command_and_job_is_a_clear_error():
    res = runner.invoke(app, ["launch", "--nodes", str(INVENTORY), "--target", "cpu"])
    assert res.exit_code == 2 and "after --" in res.output
    res = runner.invoke(app, ["launch", "--nodes", str(INVENTORY), "--target", "cpu", "--"])
    assert res.exit_code == 2 and "nothing after --" in res.output


def test_rerun_refuses_job_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    res = runner.invoke(app, ["launch", "--rerun", "x-1", "--target", "cpu"])
    assert res.exit_code == 2 and "--rerun" in res.output


def test_yolov5_keeps_the_seeds_master_port():
    job = load_job("yolov5-mlu")
    inventory = launch.with_job_port(job, load_inventory(INVENTORY))
    plans = plan.make_plan(job, inventory, run_id="r1", overrides={"TRAIN_DIR": "/t"})
    assert {p.env["MASTER_PORT"] for p in plans} == {"2289"}
    assert "2289" in plans[0].command
    moved = plan.make_plan(job, inventory, run_id="r1", overrides={"TRAIN_DIR": "/t", "MASTER_PORT": "3000"})
    assert moved[0].env["MASTER_PORT"] == "3000"


def test_dry_run_json_has_no_code_comment(project, monkeypatch):
    monkeypatch.chdir(project)
    res = dry("--json", "--target", "cpu", "--workdir", ".", "--", "python", "train.py")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["env"]["CLUSTERCTL_CODE_DIGEST"].startswith("sha256:")
    assert Path(project).is_dir()


@pytest.mark.docker
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_export_with_a_workdir_names_the_code_image_and_validates(project, kind, base_image,
                                                                   docker_client, monkeypatch):
    """export --workdir: the thin code layer is built on the local engine (real Docker) over the
    job's image, and the manifest, naming it, is valid against the official CRD."""
    from tests.fixtures.k8s_schema import schema_errors

    job = project / "job.yaml"
    job.write_text(yaml.safe_dump({"image": base_image, "workdir": ".",
                                   "command": ["python3", "train.py"]}))
    res = runner.invoke(app, ["export", str(job), "--to", kind, "--nnodes", "2"])
    assert res.exit_code == 0, res.output
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert not schema_errors(docs[0]), schema_errors(docs[0])
    refs = set(re.findall(r"image: (\S+)", res.stdout))
    assert len(refs) == 1 and next(iter(refs)).startswith("clusterctl-code/"), refs
    ref = refs.pop()
    listing = docker_client.containers.run(ref, ["sh", "-c", "pwd; ls; cat pkg/values.py; "
                                                 "echo $CLUSTERCTL_CODE_DIGEST"], network_mode="none", remove=True).decode()
    assert listing.splitlines()[0] == "/workspace" and "VALUE = 1" in listing
    assert "data" not in listing.split() and re.search(r"sha256:[0-9a-f]{64}", listing)
    assert "note: the manifest names " + ref in res.stderr
    docker_client.images.remove(ref, force=True)


def test_slurm_dry_run_names_the_code_image(project, monkeypatch):
    monkeypatch.chdir(project)
    res = runner.invoke(app, ["launch", "--scheduler", "slurm", "--nnodes", "2", "--dry-run",
                              "--target", "cpu", "--workdir", ".", "--", "python", "train.py"])
    assert res.exit_code == 0, res.output
    digest = re.search(r"# code: .* (sha256:[0-9a-f]{64})", res.output).group(1)
    assert f"clusterctl-code/clusterctl-cpu:{digest[7:19]}" in res.output
    assert "torchrun" in res.output


def test_dry_run_checks_the_requirements_lines_too(project, monkeypatch):
    (project / "requirements.txt").write_text("six==1.16.0\n-e .\n")
    monkeypatch.chdir(project)
    res = dry("--target", "cpu", "--workdir", ".", "--", "python", "train.py")
    assert res.exit_code == 2, res.output
    assert "requirements.txt:2" in res.output and "docker run" not in res.output


def test_a_rerun_does_not_need_the_workdir_any_more(project):
    """launch --rerun ships the recorded copy from the head's store: the job is loaded
    without the directory it was taken from."""
    gone = project.parent / "gone"
    with pytest.raises(UserError, match="not there"):
        inline_job({"target": "cpu", "workdir": str(gone), "command": ["true"]})
    job = inline_job({"target": "cpu", "workdir": str(gone), "command": ["true"]}, workdir_needed=False)
    assert job.workdir == gone


def test_a_secret_given_with_env_is_never_recorded_and_must_be_given_again(monkeypatch):
    from clusterctl.run import request

    spec = request.spec_of(None, {"target": "cpu", "env": {"HF_TOKEN": "hf_s3cret", "LR": "1"},
                                   "command": ["true"]})
    assert "hf_s3cret" not in json.dumps(spec)
    assert spec["flags"]["env"] == {"LR": "1"} and spec["secret_env"] == ["HF_TOKEN"]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(UserError, match="HF_TOKEN with --env"):
        request.secret_env_again("r1", ["HF_TOKEN"], [])
    assert request.secret_env_again("r1", ["HF_TOKEN"], ["HF_TOKEN=x"]) == {}   # --set wins
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert request.secret_env_again("r1", ["HF_TOKEN"], []) == {"HF_TOKEN": "from-env"}
