"""The pure parts of run/slurm/track.py: sacct's and scontrol's output, and how a job's end
becomes the run's outcome (who stopped it, when it was stopped from outside clusterctl).

The sandbox's Slurm keeps no accounting, so sacct cannot answer there: its parser is
tested on sacct's documented ``--parsable2`` output format (one line per job, fields split
by ``|`` with none at the end; ExitCode ``EXIT:SIGNAL``; ``CANCELLED by UID``), and the
fallback to scontrol is tested for real in tests/run/test_slurm_launch.py.
"""

from __future__ import annotations

import json
import os
import pwd

import pytest

from clusterctl.run import records
from clusterctl.run.slurm import track
from clusterctl.run.slurm.tasks import read_task_records

FIELDS = ",".join(track.SACCT_FIELDS)


def test_sacct_documented_parsable2_format_cancelled_by_a_uid():
    me = pwd.getpwuid(os.getuid()).pw_name
    text = (f"41|COMPLETED|0:0|2026-11-23T05:51:02|2026-11-23T05:51:40|node[1-3]\n"
            f"42|CANCELLED by {os.getuid()}|0:15|2026-11-23T05:52:02|2026-11-23T05:52:45|node[1-2],node5\n")
    info = track.parse_sacct(text, "42")
    assert (info.source, info.state, info.exit_code, info.signal) == ("sacct", "CANCELLED", 0, 15)
    assert info.nodes == ["node1", "node2", "node5"] and info.cancelled_by == me
    assert info.ended and "CANCELLED by " + me in info.words()
    done = track.parse_sacct(text, "41")
    assert (done.state, done.exit_code, done.cancelled_by, done.nodes) == (
        "COMPLETED", 0, None, ["node1", "node2", "node3"])
    assert track.parse_sacct(text, "43") is None
    pending = track.parse_sacct("44|PENDING|0:0|Unknown|Unknown|None assigned\n", "44")
    assert (pending.state, pending.nodes, pending.ended) == ("PENDING", [], False)
    assert track.parse_sacct("42|CANCELLED by 4294967\n", "42") is None    # too few fields: not sacct's


def test_scontrol_one_line_job():
    info = track.parse_scontrol("JobId=7 JobName=r UserId=root(0) JobState=CANCELLED Reason=None "
                                "ExitCode=0:15 NodeList=node[1-3] BatchHost=node1")
    assert (info.source, info.state, info.exit_code, info.signal, info.nodes) == (
        "scontrol", "CANCELLED", 0, 15, ["node1", "node2", "node3"])
    assert info.cancelled_by is None         # scontrol does not say who


def _task(d, node, rank, code, finished, stopped):
    (d / f"{node}.json").write_text(json.dumps(
        {"node": node, "rank": rank, "exit_code": code, "finished": finished, "stopped": stopped}))


def _record(tmp_path, monkeypatch, run_id="sl1"):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    rec = records.RunRecord(run_id=run_id, job="j", inventory="", image="img", scheduler="slurm",
                            slurm_job="7", state="running",
                            nodes=[records.NodeRecord(node=f"node{i + 1}", host=f"node{i + 1}", rank=i,
                                                      container=f"{run_id}-node{i + 1}") for i in range(2)])
    rec.save()
    (rec.dir / "slurm").mkdir()
    return rec


def test_scancel_from_outside_is_stopped_not_failed(tmp_path, monkeypatch):
    rec = _record(tmp_path, monkeypatch)
    _task(rec.dir / "slurm", "node1", 0, 137, "2026-11-23T05:52:45Z", True)
    _task(rec.dir / "slurm", "node2", 1, 143, "2026-11-23T05:52:44Z", True)
    tasks = read_task_records(rec.dir / "slurm")
    info = track.JobInfo(source="scontrol", state="CANCELLED", exit_code=0, signal=15)
    out, who = track.outcome(rec, tasks, ["node1", "node2"], info, interrupted=None, last_lines={},
                             ended=0.0)
    assert (out.state, out.exit_code, out.first_failure) == ("stopped", 143, None)
    assert who == "scancel outside clusterctl (who: unknown, no accounting to tell)"
    track.record_outcome(rec, out, tasks, who)
    assert [(n.state, n.exit_code, n.stopped_by) for n in rec.nodes] == [
        ("stopped", 137, who), ("stopped", 143, who)]
    sacct = track.JobInfo(source="sacct", state="CANCELLED", cancelled_by="alice")
    assert track.outcome(rec, tasks, ["node1", "node2"], sacct, interrupted=None, last_lines={},
                         ended=0.0)[1] == "scancel by alice (outside clusterctl)"
    limit = track.JobInfo(source="scontrol", state="TIMEOUT")
    assert track.outcome(rec, tasks, ["node1", "node2"], limit, interrupted=None, last_lines={},
                         ended=0.0)[1] == "Slurm (the job's time limit)"
    track.request_stop(rec, "clusterctl stop (me@here)")        # clusterctl's own stop says who
    assert track.outcome(rec, tasks, ["node1", "node2"], info, interrupted=None, last_lines={},
                         ended=0.0)[1] == "clusterctl stop (me@here)"


def test_a_rank_that_failed_by_itself_stays_the_first_failure_even_if_cancelled_later(tmp_path, monkeypatch):
    rec = _record(tmp_path, monkeypatch)
    _task(rec.dir / "slurm", "node1", 0, 143, "2026-11-23T05:52:45Z", True)
    _task(rec.dir / "slurm", "node2", 1, 3, "2026-11-23T05:52:42Z", False)
    tasks = read_task_records(rec.dir / "slurm")
    info = track.JobInfo(source="scontrol", state="FAILED", exit_code=143)
    out, who = track.outcome(rec, tasks, ["node1", "node2"], info, interrupted=None, last_lines={},
                             ended=0.0)
    assert (out.state, out.exit_code, out.first_failure.node, who) == ("failed", 3, "node2", None)


def test_all_zero_is_success_and_a_job_cancelled_before_it_ran_is_stopped(tmp_path, monkeypatch):
    rec = _record(tmp_path, monkeypatch)
    _task(rec.dir / "slurm", "node1", 0, 0, "2026-11-23T05:52:45Z", False)
    _task(rec.dir / "slurm", "node2", 1, 0, "2026-11-23T05:52:44Z", False)
    tasks = read_task_records(rec.dir / "slurm")
    ok, who = track.outcome(rec, tasks, ["node1", "node2"], track.JobInfo(source="scontrol", state="COMPLETED"),
                            interrupted=None, last_lines={}, ended=0.0)
    assert (ok.state, ok.exit_code, who) == ("succeeded", 0, None)
    never, who = track.outcome(rec, {}, ["node1", "node2"], track.JobInfo(source="scontrol", state="CANCELLED"),
                               interrupted=None, last_lines={}, ended=0.0)
    assert (never.state, never.exit_code) == ("stopped", 143) and who.startswith("scancel outside")


def test_a_slurm_that_does_not_answer_settles_nothing(tmp_path, monkeypatch):
    """No news is not an end: with an unusable SLURM_CONF the real clients fail, and the
    record stays running (a finished-looking task record notwithstanding)."""
    import shutil

    import pytest
    if not all(map(shutil.which, ("squeue", "scontrol", "sacct"))):
        pytest.skip("the Slurm clients are not installed")
    rec = _record(tmp_path, monkeypatch, "sl3")
    _task(rec.dir / "slurm", "node1", 0, 0, "2026-11-23T05:52:45Z", False)
    empty = tmp_path / "empty.conf"
    empty.write_text("")
    info = track.job_info("7", {**os.environ, "SLURM_CONF": str(empty)})
    assert info.source == "unreachable" and "did not answer" in info.words()
    assert not track.settle(rec, {**os.environ, "SLURM_CONF": str(empty)}, grace=0)
    assert records.load("sl3").state == "running"


def test_settle_records_a_job_slurm_forgot_from_the_task_records(tmp_path, monkeypatch, slurm3):
    """The real Slurm of the sandbox (no accounting: sacct refuses, scontrol answers "Invalid
    job id" for a job it does not know): the outcome comes from the tasks' own records, and
    the output file maps tasks to nodes."""
    rec = _record(tmp_path, monkeypatch, "sl2")
    rec.slurm_job = "987654"
    rec.save()
    _task(rec.dir / "slurm", "node1", 0, 0, "2026-11-23T05:52:45Z", False)
    _task(rec.dir / "slurm", "node2", 1, 5, "2026-11-23T05:52:44Z", False)
    (rec.dir / "slurm-987654.out").write_text("0: hello\nsrun: error: node2: task 1: Exited with exit "
                                              "code 5\n1: bye\n")
    info = track.job_info("987654", slurm3.env())
    assert info.source == "none" and "accounting storage is disabled" in info.why, info
    assert track.settle(rec, slurm3.env(), grace=0)
    saved = records.load("sl2")
    assert (saved.state, saved.exit_code, saved.first_failure.node) == ("failed", 5, "node2")
    assert saved.first_failure.last_lines == ["bye"]
    assert list(track.output_lines(saved)) == [("node1", "hello"), ("node2", "bye")]
    assert not track.settle(saved, slurm3.env(), grace=0)          # settled once: idempotent


def test_output_tail_labels_the_pieces_of_a_huge_line_and_masks_a_secret_across_a_cut(tmp_path):
    """srun --label prefixes a line once; a 200,000-character line is passed on in pieces
    (bounded memory) that all stay with their task's node, Slurm's own lines stay out, and a
    secret written across the natural cut point is masked, not split into two halves."""
    from clusterctl.core.lines import MAX_LINE
    from clusterctl.run import logs
    secret = "hunter2-secret-value"
    out = tmp_path / "slurm-7.out"
    sink = logs.LogSink({"n1": 0, "n2": 1}, run_dir=tmp_path / "run", redact=[secret])
    tail = track.OutputTail(out, sink)
    tail.nodes = ["n1", "n2"]
    head = MAX_LINE - len("1: ") - 7
    big = "1: " + "a" * head + secret + "b" * 200_000
    with open(out, "w") as f:
        f.write("0: hello\n")
        f.write(big[:100_000])     # the rest of the line is not written yet
    tail.read()
    with open(out, "a") as f:
        f.write(big[100_000:] + "\nsrun: error: task 3 exited\n0: bye\n")
    tail.read(final=True)
    sink.close()
    n2 = (tmp_path / "run" / "n2.log").read_text().splitlines()
    assert (tmp_path / "run" / "n1.log").read_text().splitlines() == ["hello", "bye"]
    assert "".join(n2) == "a" * head + logs.MASK + "b" * 200_000
    assert len(n2) >= 4 and max(map(len, n2)) <= MAX_LINE
    assert secret not in (tmp_path / "run" / logs.MERGED_LOG).read_text()


def test_a_followed_slurm_run_names_the_known_cause_above_its_last_lines(tmp_path, monkeypatch):
    """As for a run launched over SSH (tests/run/test_hints.py): the follower keeps each
    node's first line with a known cause, and the failure report names it under the first
    failure's last lines, even when 25 more lines pushed it out of the last 20 shown."""
    from clusterctl.run import hints, logs, supervise
    rec = _record(tmp_path, monkeypatch, "sl4")
    _task(rec.dir / "slurm", "node1", 0, 143, "2026-11-23T05:52:45Z", True)
    _task(rec.dir / "slurm", "node2", 1, 134, "2026-11-23T05:52:44Z", False)
    abort = "terminate called without an active exception"
    out = tmp_path / "slurm-8.out"
    out.write_text("0: step 1\n1: step 1\n" + f"1: {abort}\n"
                   + "".join(f"1: torchrun report line {i}\n" for i in range(25))
                   + "srun: error: node2: task 1: Aborted\n0: " + abort + " (not the first failure)\n")
    sink = logs.LogSink({"node1": 0, "node2": 1})
    tail = track.OutputTail(out, sink)
    tail.nodes = ["node1", "node2"]
    tail.read(final=True)
    sink.close()
    assert sorted(tail.hints.found) == ["node1", "node2"]
    assert tail.hints.found["node2"] == hints.Hint("node2", 1, abort, hints.match(abort))
    result, _who = track.outcome(rec, read_task_records(rec.dir / "slurm"), ["node1", "node2"],
                                 track.JobInfo(source="scontrol", state="FAILED", exit_code=134),
                                 interrupted=None, last_lines={k: list(v) for k, v in sink.last.items()},
                                 ended=0.0, known_causes=tail.hints.found)
    assert (result.state, result.first_failure.node) == ("failed", "node2")
    report = supervise.summary_lines(result)
    at = report.index("  torchrun report line 24") + 1
    assert report[at] == f'hint: node2[1] printed "{abort}", above the lines shown: ' + hints.match(abort)
    assert sum(line.startswith("hint:") for line in report) == 1        # the first failure's only



@pytest.mark.parametrize("finished, expect", [
    # what each runtime's `inspect --format '{{.State.FinishedAt}}'` writes in the task record
    ("2026-11-29T05:36:38.684576814Z", "2026-11-29T05:36:38.684576+00:00"),              # Docker
    ("2026-11-29 05:36:38.684576814 +0000 UTC", "2026-11-29T05:36:38.684576+00:00"),     # Podman 4
    ("2026-11-29 07:36:38.5 +0200 CEST", "2026-11-29T07:36:38.500000+02:00"),
    ("2026-11-29T05:36:38.123456789Z", "2026-11-29T05:36:38.123456+00:00"),             # date -u +%N
])
def test_a_task_record_is_read_whichever_runtime_wrote_its_time(tmp_path, monkeypatch, finished, expect):
    """A Slurm job on Podman nodes ran to success, and the head called both nodes lost:
    Podman writes FinishedAt as Go's time.String(), which the record reader skipped."""
    rec = _record(tmp_path, monkeypatch)
    _task(rec.dir / "slurm", "node1", 0, 0, finished, False)
    tasks = read_task_records(rec.dir / "slurm")
    assert tasks["node1"].finished.isoformat() == expect
