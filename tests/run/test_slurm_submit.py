"""The pure parts of run/slurm/submit.py: what sbatch/srun/scontrol print, and the outcome
read from the tasks' own records (srun's status would be the highest code of all tasks)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from clusterctl.run import records
from clusterctl.run.slurm import submit


def test_parse_job_id_plain_and_with_cluster():
    assert submit.parse_job_id("42\n") == "42"
    assert submit.parse_job_id("42;cluster1\n") == "42"
    with pytest.raises(ValueError, match="not a job id"):
        submit.parse_job_id("Submitted batch job 42")


def test_parse_label_srun_lines_and_slurms_own():
    assert submit.parse_label("2: rank 4/6 ok") == (2, "rank 4/6 ok")
    assert submit.parse_label("0: ") == (0, "")
    assert submit.parse_label("srun: error: node2: task 1: Exited with exit code 3") is None
    assert submit.parse_label("plain line") is None


def test_scontrol_fields_one_line():
    text = "JobId=7 JobName=r JobState=FAILED Reason=NonZeroExitCode ExitCode=143:0 NodeList=node[1-3]"
    f = submit.scontrol_fields(text)
    assert (f["JobState"], f["ExitCode"], f["NodeList"]) == ("FAILED", "143:0", "node[1-3]")


def _write(d, node, rank, code, finished, stopped):
    (d / f"{node}.json").write_text(json.dumps(
        {"node": node, "rank": rank, "exit_code": code, "finished": finished, "stopped": stopped,
         "slurm_job": "7"}))


def test_first_failure_by_finish_time_not_highest_code(tmp_path):
    """What real Slurm gave for fail-rank: node2 exits 3, the survivors are stopped (137)."""
    _write(tmp_path, "node1", 0, 137, "2026-11-23T05:52:45.459395923Z", True)
    _write(tmp_path, "node2", 1, 3, "2026-11-23T05:52:42.187202118Z", False)
    _write(tmp_path, "node3", 2, 137, "2026-11-23T05:52:45.422954238Z", True)
    (tmp_path / "node4.json.tmp").write_text("{half")        # a record being written: skipped
    tasks = submit.read_task_records(tmp_path)
    assert set(tasks) == {"node1", "node2", "node3"}
    out = submit.outcome_of(tasks, ["node1", "node2", "node3"], ended=0.0, interrupted=None,
                            last_lines={"node2": ["failing"]})
    assert (out.exit_code, out.state) == (3, "failed")
    assert (out.first_failure.node, out.first_failure.rank) == ("node2", 1)
    assert out.first_failure.when == datetime(2026, 11, 23, 5, 52, 42, 187202, tzinfo=timezone.utc)
    assert [f.node for f in out.failures] == ["node2"]          # stopped survivors are no failures


def test_all_zero_is_success_and_missing_record_is_lost(tmp_path):
    for i, n in enumerate(["node1", "node2"]):
        _write(tmp_path, n, i, 0, "2026-11-23T05:51:59.5Z", False)
    tasks = submit.read_task_records(tmp_path)
    ok = submit.outcome_of(tasks, ["node1", "node2"], ended=0.0, interrupted=None, last_lines={})
    assert (ok.exit_code, ok.state, ok.first_failure) == (0, "succeeded", None)
    lost = submit.outcome_of(tasks, ["node1", "node2", "node3"], ended=1.0e9, interrupted=None,
                             last_lines={})
    assert lost.first_failure.kind == "lost" and lost.first_failure.node == "node3"
    assert lost.exit_code == 255


def test_cancelled_from_outside_is_no_success_interrupted_is_130(tmp_path):
    _write(tmp_path, "node1", 0, 137, "2026-11-23T05:52:45Z", True)
    _write(tmp_path, "node2", 1, 143, "2026-11-23T05:52:44Z", True)
    tasks = submit.read_task_records(tmp_path)
    out = submit.outcome_of(tasks, ["node1", "node2"], ended=0.0, interrupted=None, last_lines={})
    assert (out.state, out.exit_code, out.first_failure.node) == ("failed", 143, "node2")
    out = submit.outcome_of(tasks, ["node1", "node2"], ended=0.0, interrupted="SIGINT", last_lines={})
    assert (out.state, out.exit_code, out.first_failure) == ("interrupted", 130, None)


def test_old_run_json_without_scheduler_fields_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path))
    rec = records.RunRecord(run_id="old1", job="j", inventory="i", image="img")
    data = json.loads(rec.model_dump_json())
    del data["scheduler"], data["slurm_job"]
    (tmp_path / "old1").mkdir()
    (tmp_path / "old1" / records.RECORD_NAME).write_text(json.dumps(data))
    loaded = records.load("old1")
    assert (loaded.scheduler, loaded.slurm_job) == ("ssh", None)


def test_parse_slurm_version_from_sbatch_version():
    assert submit.parse_slurm_version("slurm 22.05.8\n") == (22, 5)
    assert submit.parse_slurm_version("slurm-wlm 23.11.4") == (23, 11)
    assert submit.parse_slurm_version("slurm 19.05.5") < submit.MIN_SLURM
    assert submit.parse_slurm_version("sbatch: error: no config") is None


def test_a_too_old_slurm_is_refused_before_anything_fake_sbatch_no_old_slurm_here(tmp_path):
    """An old Slurm cannot be installed here: a stand-in `sbatch` answers --version with
    19.05 (the only thing it does); check_cluster must refuse it with exit 2."""
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\necho 'slurm 19.05.5'\n")
    fake.chmod(0o755)
    options = submit.SlurmOptions(nnodes=2)
    with pytest.raises(submit.UserError) as e:
        submit.check_cluster(options, {"PATH": str(tmp_path)})
    assert e.value.exit_code == 2
    assert "19.05 is too old" in e.value.message and "20.11 or newer" in e.value.message
