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


# --------------------------------------------------------------------------- a requeued job (issue 22)

def _attempt_record(d, node, rank, code, finished, stopped, attempt):
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{node}.json").write_text(json.dumps(
        {"node": node, "rank": rank, "exit_code": code, "finished": finished, "stopped": stopped,
         "slurm_job": "7", "attempt": attempt}))


def _slurm_record(tmp_path, monkeypatch, **kw) -> records.RunRecord:
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    rec = records.RunRecord(run_id="rq1", job="j", inventory="", image="img", scheduler="slurm",
                            slurm_job="7", state="running", **kw)
    rec.save()
    return rec


def test_output_of_every_attempt_goes_to_that_attempts_nodes(tmp_path, monkeypatch):
    """Each attempt's first line names its nodes in task order: task 0 is node1 in attempt
    0 and node3 in attempt 1 (Slurm chose other nodes after the requeue)."""
    from clusterctl.run import logs
    from clusterctl.run.slurm import track
    rec = _slurm_record(tmp_path, monkeypatch)
    text = ("[clusterctl] attempt 0 on node1,node2\n0: first try\n1: failing\n"
            "[clusterctl] requeue: attempt 0 failed (exit 1), restart 1/2\n"
            "[clusterctl] attempt 1 on node3,node2\n0: second try\n")
    track.output_path(rec).write_text(text)
    assert list(track.output_lines(rec)) == [("node1", "first try"), ("node2", "failing"),
                                             ("node3", "second try")]
    sink = logs.LogSink({"node1": 0, "node2": 1, "node3": 0}, run_dir=tmp_path / "out")
    seen = []
    tail = track.OutputTail(track.output_path(rec), sink, on_attempt=lambda a, n: seen.append((a, n)))
    tail.read(final=True)
    sink.close()
    assert seen == [(0, ["node1", "node2"]), (1, ["node3", "node2"])]
    merged = (tmp_path / "out" / logs.MERGED_LOG).read_text().splitlines()
    assert [(p[0], p[2]) for p in map(logs.parse_prefixed, merged)] == [
        ("node1", "first try"), ("node2", "failing"), ("node3", "second try")]


def test_a_requeued_run_records_every_attempt_and_ends_as_its_last(tmp_path, monkeypatch):
    from clusterctl.run.slurm import track
    rec = _slurm_record(tmp_path, monkeypatch, max_restarts=2)
    slurm = rec.dir / "slurm"
    _attempt_record(slurm / "attempt-0", "node1", 0, 3, "2026-11-26T06:00:01Z", False, 0)
    _attempt_record(slurm / "attempt-0", "node2", 1, 143, "2026-11-26T06:00:02Z", True, 0)
    _attempt_record(slurm, "node1", 0, 0, "2026-11-26T06:03:01Z", False, 1)
    _attempt_record(slurm, "node2", 1, 0, "2026-11-26T06:03:02Z", False, 1)
    info = track.JobInfo(source="scontrol", state="COMPLETED", exit_code=0, nodes=["node1", "node2"])
    monkeypatch.setattr(track, "job_info", lambda *_a, **_k: info)
    assert track.settle(rec, {}, grace=0)
    done = records.load("rq1")
    assert (done.state, done.exit_code, done.attempt) == ("succeeded", 0, 1)
    first, last = done.attempts
    assert (first.attempt, first.state, first.exit_code) == (0, "failed", 3)
    assert (first.first_failure.node, first.ended, first.then) == ("node1", "node1 exited 3",
                                                                   "requeued: restart 1/2")
    assert [(n.node, n.exit_code, n.state) for n in first.nodes] == [("node1", 3, "exited"),
                                                                     ("node2", 143, "stopped")]
    assert (last.attempt, last.state, last.exit_code, last.then) == (1, "succeeded", 0, "end")
    assert [n.exit_code for n in done.nodes] == [0, 0]       # the stale records of attempt 0 are not read


def test_restarts_used_up_on_slurm_is_said_in_the_last_attempt(tmp_path, monkeypatch):
    from clusterctl.run.slurm import track
    rec = _slurm_record(tmp_path, monkeypatch, max_restarts=1)
    slurm = rec.dir / "slurm"
    _attempt_record(slurm / "attempt-0", "node1", 0, 1, "2026-11-26T06:00:01Z", False, 0)
    _attempt_record(slurm, "node1", 0, 1, "2026-11-26T06:03:01Z", False, 1)
    info = track.JobInfo(source="none", why="forgotten")      # Slurm forgot it: the records tell
    monkeypatch.setattr(track, "job_info", lambda *_a, **_k: info)
    assert track.settle(rec, {}, grace=0)
    done = records.load("rq1")
    assert (done.state, done.exit_code, done.attempt, len(done.attempts)) == ("failed", 1, 1, 2)
    assert done.attempts[-1].then == "restarts used up (1/1)"
    assert [n.node for n in done.nodes] == ["node1"]


def test_a_run_without_restarts_records_no_attempts(tmp_path, monkeypatch):
    from clusterctl.run.slurm import track
    rec = _slurm_record(tmp_path, monkeypatch)
    _attempt_record(rec.dir / "slurm", "node1", 0, 0, "2026-11-26T06:03:01Z", False, 0)
    monkeypatch.setattr(track, "job_info", lambda *_a, **_k: track.JobInfo(source="none"))
    assert track.settle(rec, {}, grace=0)
    done = records.load("rq1")
    assert (done.state, done.attempt, done.attempts) == ("succeeded", 0, [])
