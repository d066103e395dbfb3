"""Files under a runs directory (or the code store) that someone else may have planted.

A runs directory may be shared by a group, so whatever is in it may have been put there
by another user: a symlink to a root-only file (``/etc/shadow``), a FIFO that blocks a
reader for ever, a sparse 64 MiB file, a run's attempt directory that is a symlink to
someone's private directory.  Every file below the runs directory is opened the one way
:func:`clusterctl.core.files.open_below` opens it (``openat`` one component at a time with
``O_NOFOLLOW``, ``O_NONBLOCK``, a regular file of the caller or of its directory's owner)
and read in bounded pieces.  One table of hostile cases, checked at the guard and at each
place that reads such a file:

(a) the guard itself (:func:`open_below`, :func:`read_below`, :func:`read_from`);
(b) ``attach`` (:mod:`clusterctl.run.detached`): ``merged.log``, the supervisor's log;
(c) an attempt directory that is a symlink: ``logs RUN``, ``logs RUN --attempt 1``, ``attach RUN``;
(d) Slurm: the job's output file, the tasks' records, the stop request; ``status`` and ``runs``;
(e) the code store's manifests (``launch --rerun``).

Real files, no mocks; each read runs in a thread with a timeout, so a reader that waits on a
FIFO fails the test instead of hanging the suite.  Run as root, the cross-user cases chown
files to 65534 (nobody).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.core.files import CHUNK, open_below, read_below, read_from
from clusterctl.run import detached, logs, records
from clusterctl.run.slurm import track
from clusterctl.run.slurm.tasks import read_task_records
from tests.fixtures.hostile import bounded

SECRET = "s3cr3t-shadow-line"
NOBODY = 65534
ROOT = os.geteuid() == 0


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    d.mkdir()
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(d))
    return d


@pytest.fixture
def secret(tmp_path):
    """A file only its owner may read, holding SECRET (what /etc/shadow is to a planted link)."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    p = d / "shadow"
    p.write_text(f"node1[0]| {SECRET}\n0: {SECRET}\n")
    p.chmod(0o600)
    return p


# --------------------------------------------------------------------------- the hostile table

def _link(p: Path, secret: Path) -> None:
    os.symlink(secret, p)


def _fifo(p: Path, secret: Path) -> None:
    os.mkfifo(p)


def _dir(p: Path, secret: Path) -> None:
    p.mkdir()


def _others(p: Path, secret: Path) -> None:
    """A regular file another user put into a directory that is not theirs."""
    p.write_text(f"node1[0]| {SECRET}\n0: {SECRET}\n")
    os.chown(p, NOBODY, NOBODY)


# (name, plant(path, secret), what the refusal says)
HOSTILE = [
    ("symlink", _link, "symlink"),
    ("fifo", _fifo, "FIFO"),
    ("directory", _dir, "directory"),
    pytest.param("others", _others, "belongs to", marks=pytest.mark.skipif(not ROOT, reason="needs root to chown")),
]
IDS = ["symlink", "fifo", "directory", "others"]


def _sparse(p: Path, size: int = 64 << 20) -> Path:
    with open(p, "wb") as f:     # no disk used, but read whole it is 64 MiB
        f.truncate(size)
    return p


def _refusal(box: dict, *needles: str) -> str:
    err = box.get("error")
    assert isinstance(err, UserError), box
    text = str(err)
    assert SECRET not in text
    for n in needles:
        assert n in text, (n, text)
    return text


# --------------------------------------------------------------------------- (a) the guard

@pytest.mark.parametrize("kind,plant,said", HOSTILE, ids=IDS)
def test_open_below_refuses_what_is_not_a_regular_file_of_the_run(runs_dir, secret, kind, plant, said):
    (runs_dir / "r1").mkdir()
    p = runs_dir / "r1" / "merged.log"
    plant(p, secret)
    for read in (lambda: open_below(runs_dir, p).read(), lambda: read_below(runs_dir, p),
                 lambda: read_from(runs_dir, p, 0)):
        _refusal(bounded(read), str(p), said)


def test_open_below_refuses_a_symlink_at_any_component_below_the_root(runs_dir, secret):
    (runs_dir / "r1").mkdir()
    os.symlink(secret.parent, runs_dir / "r1" / "attempt-1")       # a directory link
    os.symlink(secret.parent, runs_dir / "r2")                      # the run directory itself
    for p in (runs_dir / "r1" / "attempt-1" / "shadow", runs_dir / "r2" / "shadow"):
        _refusal(bounded(lambda p=p: read_below(runs_dir, p)), "symlink", str(p.parent))
    # the root itself may be a link: the user named it
    os.symlink(runs_dir, runs_dir.parent / "runs-link")
    (runs_dir / "r1" / "ok.log").write_text("fine\n")
    assert read_below(runs_dir.parent / "runs-link", runs_dir.parent / "runs-link" / "r1" / "ok.log") == b"fine\n"


def test_a_missing_file_is_file_not_found_for_the_caller_to_say(runs_dir):
    for p in (runs_dir / "r1" / "merged.log", runs_dir / "nothing"):
        with pytest.raises(FileNotFoundError):
            read_below(runs_dir, p)


def test_a_huge_file_is_never_read_whole(runs_dir):
    p = _sparse(runs_dir / "big")
    _refusal(bounded(lambda: read_below(runs_dir, p, limit=1 << 20)), "67108864 bytes", str(p))
    got = read_from(runs_dir, p, 5, limit=4096)
    assert got == b"\0" * 4096
    assert len(read_from(runs_dir, p, 0)) == CHUNK


# --------------------------------------------------------------------------- (b) attach

def _run(run_id="r1", *, state="failed", attempt=0) -> records.RunRecord:
    rec = records.RunRecord(run_id=run_id, job="j", inventory="", image="img", state=state,
                            exit_code=3, attempt=attempt, max_restarts=2 if attempt else 0,
                            nodes=[records.NodeRecord(node="node1", host="10.0.0.11", rank=0,
                                                      container=f"{run_id}-node1", state="exited",
                                                      exit_code=3)])
    if attempt:
        rec.attempts = [records.AttemptRecord(attempt=k, state="failed", nodes=rec.nodes)
                        for k in range(attempt + 1)]
    rec.save()
    return rec


class Counted:
    """A stream that keeps only how much it got, and its largest single write."""

    def __init__(self) -> None:
        self.total, self.largest, self.text = 0, 0, []

    def write(self, s: str) -> int:
        self.total += len(s)
        self.largest = max(self.largest, len(s))
        if len(s) < 4096:
            self.text.append(s)
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("kind,plant,said", HOSTILE, ids=IDS)
def test_attach_refuses_a_planted_merged_log(runs_dir, secret, kind, plant, said):
    rec = _run()
    plant(rec.dir / records.MERGED_LOG, secret)
    out = Counted()
    box = bounded(lambda: detached.attach("r1", out, note=lambda _m: None, poll=0.01))
    _refusal(box, "merged.log", said)
    assert SECRET not in "".join(out.text)


@pytest.mark.parametrize("kind,plant,said", HOSTILE, ids=IDS)
def test_the_supervisor_log_shown_by_start_is_read_the_same_way(runs_dir, secret, kind, plant, said):
    rec = _run()
    log = rec.dir / detached.SUPERVISOR_LOG
    plant(log, secret)
    shown: list[str] = []
    _refusal(bounded(lambda: detached._show_new(log, 0, shown.append)), detached.SUPERVISOR_LOG, said)
    assert shown == []


def test_attach_reads_a_huge_merged_log_in_bounded_pieces(runs_dir):
    rec = _run()
    p = _sparse(rec.dir / records.MERGED_LOG)
    with open(p, "ab") as f:
        f.write(b"node1[0]| the end\n")
    out = Counted()
    box = bounded(lambda: detached.attach("r1", out, note=lambda _m: None, poll=0.01), timeout=60)
    assert box.get("value") is not None, box
    assert out.total == (64 << 20) + len("node1[0]| the end\n")
    assert out.largest <= CHUNK
    text, offset = detached._new_lines(p, 0)
    assert len(text) == CHUNK and offset == CHUNK        # one piece at a time, never all


def test_attach_copies_only_complete_lines_from_the_offset(runs_dir):
    rec = _run()
    (rec.dir / records.MERGED_LOG).write_text("node1[0]| a\nnode1[0]| b\nnode1[0]| half")
    assert detached._new_lines(rec.dir / records.MERGED_LOG, 0) == ("node1[0]| a\nnode1[0]| b\n", 24)
    assert detached._new_lines(rec.dir / records.MERGED_LOG, 12) == ("node1[0]| b\n", 24)
    assert detached._new_lines(rec.dir / "attempt-1" / records.MERGED_LOG, 0) == ("", 0)   # not yet


# --------------------------------------------------------------------------- (c) attempt dir link

def _attempt_link(runs_dir: Path, secret: Path, *, owner: int | None = None) -> records.RunRecord:
    rec = _run(attempt=1)
    os.symlink(secret.parent, rec.dir / "attempt-1")
    if owner is not None:            # another user's run: their record, their directory
        d = json.loads((rec.dir / records.RECORD_NAME).read_text())
        d["uid"] = owner
        (rec.dir / records.RECORD_NAME).write_text(json.dumps(d))
        for p in (rec.dir / records.RECORD_NAME, rec.dir / "attempt-1", rec.dir):
            os.lchown(p, owner, owner)
    (secret.parent / records.MERGED_LOG).write_text(f"node1[0]| {SECRET}\n")
    return rec


OWNERS = [pytest.param(None, id="own-run"),
          pytest.param(NOBODY, id="cross-user", marks=pytest.mark.skipif(not ROOT, reason="needs root"))]


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("args", [["logs", "r1"], ["logs", "r1", "--attempt", "1"], ["attach", "r1"]],
                         ids=["logs", "logs-attempt", "attach"])
def test_an_attempt_directory_that_is_a_symlink_is_never_followed(runs_dir, secret, owner, args):
    _attempt_link(runs_dir, secret, owner=owner)
    box = bounded(lambda: cli(*args))
    res = box["value"]
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output and SECRET not in res.output, res.output
    assert "attempt-1" in res.output and "symlink" in res.output, res.output


def test_lines_from_files_refuses_a_planted_node_log_too(runs_dir, secret):
    rec = _run()
    os.symlink(secret, rec.log_path("node1"))      # no merged.log: the per-node files are read
    _refusal(bounded(lambda: list(logs.lines_from_files(rec))), "node1.log", "symlink")


@pytest.mark.parametrize("kind,plant,said", HOSTILE, ids=IDS)
def test_logs_refuses_a_planted_merged_log(runs_dir, secret, kind, plant, said):
    rec = _run()
    plant(rec.dir / records.MERGED_LOG, secret)
    _refusal(bounded(lambda: list(logs.lines_from_files(rec))), "merged.log", said)


def test_logs_reads_a_huge_line_in_pieces(runs_dir):
    rec = _run()
    p = _sparse(rec.dir / records.MERGED_LOG, 8 << 20)
    with open(p, "ab") as f:
        f.write(b"\nnode1[0]| after\n")
    got = bounded(lambda: list(logs.lines_from_files(rec)), timeout=60)
    assert got.get("value") == [("node1", "after")], got.get("error")


# --------------------------------------------------------------------------- (d) Slurm

def _slurm_run(runs_dir: Path) -> records.RunRecord:
    rec = records.RunRecord(run_id="sl1", job="j", inventory="", image="img", scheduler="slurm",
                            slurm_job="7", state="running",
                            nodes=[records.NodeRecord(node=f"node{i + 1}", host=f"node{i + 1}", rank=i,
                                                      container=f"sl1-node{i + 1}") for i in range(2)])
    rec.save()
    (rec.dir / "slurm").mkdir()
    return rec


def _task(d: Path, node: str, rank: int, code: int) -> None:
    (d / f"{node}.json").write_text(json.dumps({"node": node, "rank": rank, "exit_code": code,
                                                "finished": "2026-11-23T05:52:45Z", "stopped": False}))


@pytest.mark.parametrize("kind,plant,said", HOSTILE, ids=IDS)
def test_the_job_output_file_is_never_followed_nor_waited_on(runs_dir, secret, kind, plant, said):
    rec = _slurm_run(runs_dir)
    plant(track.output_path(rec), secret)
    _refusal(bounded(lambda: list(track.output_lines(rec))), f"slurm-{rec.slurm_job}.out", said)
    tail = track.OutputTail(track.output_path(rec), logs.LogSink({"node1": 0}))
    _refusal(bounded(tail.read), f"slurm-{rec.slurm_job}.out", said)


def test_a_missing_job_output_file_is_no_output_yet(runs_dir):
    rec = _slurm_run(runs_dir)
    assert list(track.output_lines(rec)) == []
    track.OutputTail(track.output_path(rec), logs.LogSink({"node1": 0})).read()


@pytest.mark.parametrize("kind,plant,said", [*HOSTILE, ("huge", lambda p, s: _sparse(p), "")],
                         ids=[*IDS, "huge"])
def test_a_planted_task_record_or_stop_request_is_no_record(runs_dir, secret, kind, plant, said):
    rec = _slurm_run(runs_dir)
    _task(rec.dir / "slurm", "node2", 1, 0)
    plant(rec.dir / "slurm" / "node1.json", secret)
    box = bounded(lambda: read_task_records(rec.dir / "slurm"))
    assert list(box.get("value", {})) == ["node2"], box
    plant(rec.dir / track.STOP_REQUEST, secret)
    assert bounded(lambda: track.stop_request(rec)) == {"value": None}


def test_task_records_under_a_linked_directory_are_not_read(runs_dir, tmp_path):
    rec = _slurm_run(runs_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _task(elsewhere, "node1", 0, 9)
    os.rmdir(rec.dir / "slurm")
    os.symlink(elsewhere, rec.dir / "slurm")
    assert read_task_records(rec.dir / "slurm") == {}


FAKE_SLURM = {      # a job Slurm reports cancelled and has left the queue
    "sacct": 'echo "7|CANCELLED|0:15|2026-01-01T00:00:00|2026-01-01T00:01:00|node[1-2]"',
    "squeue": 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1',
    "scontrol": "exit 1",
    "scancel": "exit 0",
}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    d = tmp_path / "fakebin"
    d.mkdir()
    for name, body in FAKE_SLURM.items():
        (d / name).write_text(f"#!/bin/sh\n{body}\n")
        (d / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return d


@pytest.mark.parametrize("args", [["status", "sl1"], ["runs"]], ids=["status", "runs"])
def test_status_and_runs_settle_a_slurm_run_whose_files_are_fifos(runs_dir, fake_slurm, args):
    rec = _slurm_run(runs_dir)
    _task(rec.dir / "slurm", "node2", 1, 143)
    for p in (rec.dir / "slurm" / "node1.json", rec.dir / track.STOP_REQUEST, track.output_path(rec)):
        os.mkfifo(p)
    box = bounded(lambda: cli(*args), timeout=30)
    res = box["value"]
    assert res.exit_code == 0, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    assert records.load("sl1").state not in ("running", "unknown")   # settled without those files


# --------------------------------------------------------------------------- (e) the code store

@pytest.fixture
def stored(tmp_path, monkeypatch):
    from clusterctl.code import snapshot, store
    monkeypatch.setenv("CLUSTERCTL_CACHE", str(tmp_path / "cache"))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    tree = store.save(snapshot.take(proj))
    return tree.digest, store._manifest_path(tree.digest)


@pytest.mark.parametrize("kind,plant,said", [*HOSTILE, ("huge", lambda p, s: _sparse(p), "more than")],
                         ids=[*IDS, "huge"])
def test_a_planted_code_manifest_is_refused_before_it_is_read(stored, secret, kind, plant, said):
    from clusterctl.code import store
    digest, path = stored
    assert store.load(digest).digest == digest
    if kind == "others":
        path.chmod(0o644)
        os.chown(path, NOBODY, NOBODY)      # the caller's own cache: nobody else's file is read
    else:
        path.unlink()
        plant(path, secret)
    _refusal(bounded(lambda: store.load(digest)), str(path), said)


def test_a_code_manifest_under_a_linked_trees_directory_is_refused(stored, tmp_path):
    from clusterctl.code import store
    digest, path = stored
    moved = tmp_path / "moved-trees"
    path.parent.rename(moved)
    os.symlink(moved, path.parent)
    _refusal(bounded(lambda: store.load(digest)), "symlink", "trees")


def test_a_missing_code_manifest_still_says_where_it_was_shipped(stored):
    from clusterctl.code import store
    digest, path = stored
    path.unlink()
    _refusal(bounded(lambda: store.load(digest)), "not in this machine's code store")
