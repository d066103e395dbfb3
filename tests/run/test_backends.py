"""The run-backend interface: one table of backends, the CLI picks one and never branches
on the scheduler; a backend added to the table (a fictitious one here, defined in this
test) is what launch, status, logs and stop of its runs reach."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import clusterctl
from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.run import backends, jobs, records
from clusterctl.run.backends.base import Backend, Status

CLI_DIR = Path(clusterctl.__file__).parent / "cli"


def test_every_backend_is_in_one_table_and_launch_takes_those_that_start_runs():
    assert set(backends.BACKENDS) == {"ssh", "slurm", "kubernetes"}
    assert [b.name for b in backends.launchers()] == ["ssh", "slurm"]
    assert backends.get("slurm") is backends.BACKENDS["slurm"]
    with pytest.raises(UserError, match=r"--scheduler 'kubernetes' is not a scheduler; valid: ssh or slurm"):
        backends.get("kubernetes")
    with pytest.raises(UserError, match=r"--scheduler 'lsf' is not a scheduler; valid: ssh or slurm"):
        backends.get("lsf")


def test_the_kubernetes_backend_renders_and_refuses_to_act_on_a_run(tmp_path):
    k8s = backends.BACKENDS["kubernetes"]
    job = jobs.load_job("ddp-smoke")
    manifest = k8s.render(job, kind="pytorchjob", nnodes=2)
    assert manifest.body["kind"] == "PyTorchJob"
    policy, backoff, _notes = k8s.recovery(job)
    assert (policy, backoff) == ("Never", 0)       # ddp-smoke has no max_restarts
    record = records.RunRecord(run_id="k", job="ddp-smoke", inventory="", image="x")
    for act in (lambda: k8s.status(record, None, nodes=None), lambda: k8s.attach(record, None),
                lambda: k8s.stop(record, None, nodes=None, grace=1)):
        with pytest.raises(UserError, match="only renders a manifest"):
            act()


def test_each_backend_gives_the_recovery_policy_in_its_own_form():
    job = jobs.inline_job({"target": "cpu", "command": ["true"], "max_restarts": 2,
                           "fatal_on_exit": [3]})
    ssh = backends.BACKENDS["ssh"].recovery(job)
    assert ssh.max_restarts == 2 and ssh.fatal_on_exit == frozenset({3})
    shell = backends.BACKENDS["slurm"].recovery(job)
    assert "scontrol requeue" in shell and "3)" in shell
    policy, backoff, _ = backends.BACKENDS["kubernetes"].recovery(job)
    assert backoff == 2 and policy in ("OnFailure", "ExitCode")


def test_a_record_goes_to_the_backend_it_went_through():
    slurm = records.RunRecord(run_id="s", job="j", inventory="", image="x", scheduler="slurm")
    ssh = records.RunRecord(run_id="o", job="j", inventory="", image="x")
    assert backends.for_record(slurm).name == "slurm"
    assert backends.for_record(ssh).name == "ssh"


def _cli_sources():
    for path in sorted(CLI_DIR.glob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_the_cli_never_branches_on_the_scheduler():
    """No comparison with a scheduler's name or a record's scheduler, and no import of a
    backend's own modules (run.slurm, run.launch), anywhere in cli/."""
    found = []
    for path, tree in _cli_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                names = [n for n in (node.left, *node.comparators)
                         if (isinstance(n, ast.Attribute) and n.attr == "scheduler")
                         or (isinstance(n, ast.Name) and n.id == "scheduler")
                         or (isinstance(n, ast.Constant) and n.value in backends.BACKENDS)]
                if names:
                    found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module.startswith("clusterctl.run.slurm")
                    or node.module == "clusterctl.run.launch"
                    or any(a.name in ("slurm", "launch") for a in node.names
                           if node.module == "clusterctl.run")):
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
    assert not found, found


def test_launch_in_the_cli_only_parses():
    tree = ast.parse((CLI_DIR / "run.py").read_text())
    launch = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "launch")
    body = launch.body[1:]           # after the docstring
    assert body[-1].end_lineno - body[0].lineno + 1 < 30
    assert len((CLI_DIR / "run.py").read_text().splitlines()) < 400


class FictitiousBackend(Backend):
    """Not a real scheduler: a backend defined by this test that records what it is asked."""

    name = "fictitious"
    options = {}
    asked: list = []

    def launch(self, req, ui):
        self.asked.append(("launch", req.job, req.given, req.sets, req.detach))
        ui.say(f"fictitious: would run {req.job}")
        return 7

    def logs(self, record, ui, *, node, follow, tail, nodes):
        self.asked.append(("logs", record.run_id, follow))
        return 0

    def attach(self, record, ui):
        return 0

    def status(self, record, ui, *, nodes):
        self.asked.append(("status", record.run_id))
        rows = [records.NodeStatus(node=n.node, rank=n.rank, container=n.container,
                                   state="running", source="fictitious") for n in record.nodes]
        return Status(rows, note="fictitious scheduler: all well")

    def stop(self, record, ui, *, nodes, grace):
        self.asked.append(("stop", record.run_id, grace))
        return 0

    def recovery(self, job):
        return None


@pytest.fixture
def fictitious(monkeypatch, tmp_path):
    backend = FictitiousBackend()
    backend.asked = []
    monkeypatch.setitem(backends.BACKENDS, "fictitious", backend)
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("COLUMNS", "200")
    return backend


def test_a_new_backend_is_one_class_and_one_table_entry(fictitious, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "fictitious", "--detach",
                              "--set", "A=1", "--max-restarts", "2"])
    assert res.exit_code == 7, res.output
    assert "fictitious: would run ddp-smoke" in res.output
    assert fictitious.asked == [("launch", "ddp-smoke", {"max_restarts": 2}, ["A=1"], True)]
    # a Slurm flag is refused by a backend that does not take it, naming whose it is
    res = runner.invoke(app, ["launch", "ddp-smoke", "--scheduler", "fictitious", "--partition", "p"])
    assert res.exit_code == 2 and "--partition: only with --scheduler slurm" in res.output
    # a recorded run of it: status, logs and stop reach it
    run = tmp_path / "runs" / "f1"
    run.mkdir(parents=True)
    rec = records.RunRecord(run_id="f1", job="ddp-smoke", inventory="", image="x",
                            scheduler="fictitious", state="running",
                            nodes=[records.NodeRecord(node="n1", host="h1", rank=0, container="c1")])
    (run / records.RECORD_NAME).write_text(records.dump(rec))
    res = runner.invoke(app, ["status", "f1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["nodes"][0]["source"] == "fictitious"
    res = runner.invoke(app, ["status", "f1"])
    assert "fictitious scheduler: all well" in res.output
    assert runner.invoke(app, ["logs", "f1", "--follow"]).exit_code == 0
    assert runner.invoke(app, ["stop", "f1", "--grace", "5"]).exit_code == 0
    assert [a[0] for a in fictitious.asked[1:]] == ["status", "status", "logs", "stop"]
    assert fictitious.asked[-1] == ("stop", "f1", 5)


def test_every_job_key_flag_is_a_launch_option_that_names_its_key():
    res = CliRunner().invoke(app, ["launch", "--help"], env={"COLUMNS": "400"})
    text = " ".join(res.output.split())
    for name, flag in jobs.KEY_FLAGS.items():
        assert flag.flag in text and f"Job key: {name}." in text, name
    assert set(jobs.KEY_HELP) == set(jobs._Spec.model_fields)
    assert jobs.flag_values({"workdir": Path("proj"), "env": ["A=1", "B=x=y"], "target": None,
                             "max_restarts": 0}) == {"workdir": "proj", "env": {"A": "1", "B": "x=y"},
                                                     "max_restarts": 0}
    with pytest.raises(UserError, match="--env: expected NAME=VALUE"):
        jobs.flag_values({"env": ["=novalue"]})
    with pytest.raises(UserError, match="--env NONE_SET: NONE_SET is not set in clusterctl's environment"):
        jobs.flag_values({"env": ["NONE_SET"]}, {})
    assert jobs.flag_values({"env": ["HF_TOKEN"]}, {"HF_TOKEN": "hf_x"}) == {"env": {"HF_TOKEN": "hf_x"}}
