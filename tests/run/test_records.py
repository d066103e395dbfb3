"""Run records in runs/<run-id>/: written atomically, listed newest first, found by id.

The records that real launches write are checked in tests/run/test_launch.py; here
the record store itself and its error messages, with real files.
"""

from __future__ import annotations

import json
import os
import pwd
import threading
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.containers import ContainerState
from clusterctl.core.errors import UserError
from clusterctl.run import records

runner = CliRunner()
T0 = datetime(2026, 11, 22, 4, 0, tzinfo=timezone.utc)


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(d))
    return d


def make(run_id: str, minutes: int, **kw) -> records.RunRecord:
    rec = records.RunRecord(run_id=run_id, job="ddp-smoke", inventory="/x/inv.yaml", image="img:1",
                         started=T0 + timedelta(minutes=minutes),
                         nodes=[records.NodeRecord(node="node1", host="10.0.0.11", rank=0, container=f"{run_id}-node1",
                                                env={"HF_TOKEN": "****", "NODE_RANK": "0"})], **kw)
    rec.save()
    return rec


def test_record_round_trips_and_lists_newest_first(runs_dir):
    make("b-run", 5, state="failed", exit_code=3)
    make("a-run", 9, state="succeeded", exit_code=0)
    make("c-run", 1)
    assert [r.run_id for r in records.list_runs()] == ["a-run", "b-run", "c-run"]
    assert records.resolve(None).run_id == "a-run"  # RUN defaults to the newest
    loaded = records.load("b-run")
    assert loaded.exit_code == 3 and loaded.nodes[0].env["HF_TOKEN"] == "****"
    assert loaded.started == T0 + timedelta(minutes=5)
    assert not list(runs_dir.glob("*/.run.*"))  # no temp files left behind


def test_runs_cli_json_and_table_newest_first(runs_dir):
    make("older", 1)
    make("newer", 2, state="failed", exit_code=3,
         first_failure=records.FailureRecord(node="node1", rank=0, kind="exit", exit_code=3, time=T0))
    res = runner.invoke(app, ["runs", "--json"])
    assert res.exit_code == 0
    assert [r["run_id"] for r in json.loads(res.output)] == ["newer", "older"]
    table = runner.invoke(app, ["runs"]).output
    assert table.index("newer") < table.index("older") and "node1[0]" in table


def test_a_damaged_record_is_skipped_in_listings_and_named_when_asked_for(runs_dir):
    make("good", 1)
    (runs_dir / "broken").mkdir()
    (runs_dir / "broken" / "run.json").write_text('{"run_id": "broken", "job": 5')
    assert [r.run_id for r in records.list_runs()] == ["good"]
    with pytest.raises(UserError, match=r"broken/run.json is not a valid run record"):
        records.load("broken")


def test_unknown_run_says_where_it_looked_and_suggests(runs_dir):
    make("ddp-smoke-20261122-040000-abcd", 1)
    with pytest.raises(UserError) as e:
        records.load("ddp-smoke-20261122-040000-abce")
    assert 'did you mean "ddp-smoke-20261122-040000-abcd"' in str(e.value)
    res = runner.invoke(app, ["status", "nope"])
    assert res.exit_code == 2 and "no run 'nope'" in res.output and "Traceback" not in res.output


def test_no_runs_yet(runs_dir):
    assert records.list_runs() == []
    res = runner.invoke(app, ["logs"])
    assert res.exit_code == 2 and "no runs recorded" in res.output
    assert "no runs recorded" in runner.invoke(app, ["runs"]).output


@pytest.mark.parametrize("bad", ["../x", "", "a b", "-x", "x" * 64, "a/b"])
def test_run_id_must_be_a_safe_name(bad):
    with pytest.raises(UserError, match="is not valid"):
        records.check_run_id(bad)


def test_new_run_ids_are_valid_and_distinct():
    ids = {records.new_run_id("my job/v2", T0) for _ in range(50)}
    assert len(ids) > 40
    for i in ids:
        assert records.check_run_id(i) == i and i.startswith("my-job-v2-20261122-040000-")


def test_save_is_atomic_under_a_concurrent_reader(runs_dir):
    """A reader polling run.json while it is rewritten never sees a partial file."""
    rec = make("busy", 1)
    stop = threading.Event()
    errors = []

    def reader():
        path = runs_dir / "busy" / "run.json"
        while not stop.is_set():
            try:
                records.RunRecord.model_validate_json(path.read_text())
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(300):
        rec.argv = ["x" * (i % 97)] * (i % 13)
        rec.save()
    stop.set()
    t.join()
    assert errors == []
    assert os.listdir(runs_dir / "busy") == ["run.json"]


# --------------------------------------------------------------------------- what a record implies

def test_which_runs_may_still_have_containers(runs_dir):
    assert not records.may_have_containers(make("followed", 1, state="failed", exit_code=3))
    assert records.may_have_containers(make("detached", 1, state="succeeded", detached=True))
    assert records.may_have_containers(make("going", 1, state="running"))
    lost = make("lost", 1, state="failed")
    lost.nodes[0].state = "lost"
    assert records.may_have_containers(lost)


def _row(state: str, source: str = "node") -> records.NodeStatus:
    return records.NodeStatus(node="node1", rank=0, container="c", state=state, source=source)


def test_containers_ended_only_when_every_node_says_so_and_nobody_recorded_it(runs_dir):
    rec = make("det", 1, state="running", detached=True)
    assert records.containers_ended(rec, [_row("exited"), _row("dead")])
    assert not records.containers_ended(rec, [_row("exited"), _row("running")])
    assert not records.containers_ended(rec, [_row("exited", source="record")])  # a node did not answer
    assert not records.containers_ended(rec, [])
    rec.state = "stopped"
    assert not records.containers_ended(rec, [_row("exited")])


def _ended(node: str, code: int, minute: int) -> ContainerState:
    return ContainerState(node=node, name=f"c-{node}", status="exited", exit_code=code,
                          started=T0, finished=T0 + timedelta(minutes=minute))


def test_record_stop_keeps_a_detached_runs_true_outcome(runs_dir):
    rec = make("two", 1, state="running", detached=True)
    rec.nodes.append(records.NodeRecord(node="node2", host="10.0.0.12", rank=1, container="two-node2"))
    records.record_stop(rec, {"node1": [_ended("node1", 0, 3)], "node2": [_ended("node2", 7, 2)]},
                        was_running=False)
    saved = records.load("two")
    assert (saved.state, saved.exit_code, saved.finished) == ("failed", 7, T0 + timedelta(minutes=3))
    assert [n.exit_code for n in saved.nodes] == [0, 7]
    rec = make("busy", 1, state="running", detached=True)
    records.record_stop(rec, {"node1": [_ended("node1", 137, 4)]}, was_running=True)
    assert records.load("busy").state == "stopped" and records.load("busy").nodes[0].exit_code == 137



# --------------------------------------------------------------------------- state that tells the truth

def test_describe_exit_names_the_signal_of_128_plus_n():
    assert records.describe_exit(0) == "exit 0"
    assert records.describe_exit(7) == "exit 7"
    assert records.describe_exit(137) == "exit 137 (SIGKILL)"
    assert records.describe_exit(143) == "exit 143 (SIGTERM)"
    assert records.describe_exit(255) == "exit 255"
    assert records.describe_exit(None) == ""


def test_a_launcher_that_died_is_told_apart_from_a_live_one(runs_dir):
    """Real processes: this one (alive) and a child that has exited and been reaped."""
    import subprocess
    import sys

    assert records.launcher_gone(records.this_launcher()) is False
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = records.this_launcher().model_copy(update={"pid": child.pid, "start_ticks": 1})
    assert records.launcher_gone(gone) is True
    reused = records.this_launcher().model_copy(update={"start_ticks": 1})   # same pid, other process
    assert records.launcher_gone(reused) is True
    elsewhere = records.this_launcher().model_copy(update={"host": "another-machine"})
    assert records.launcher_gone(elsewhere) is None                           # cannot tell from here

    rec = make("orphan", 1, state="running", launcher=gone)
    assert records.mark_unknown_if_orphaned(rec)
    saved = records.load("orphan")
    assert saved.state == "unknown" and f"pid {child.pid}" in saved.note
    assert records.may_have_containers(saved)
    alive = make("alive", 2, state="running", launcher=records.this_launcher())
    assert not records.mark_unknown_if_orphaned(alive) and records.load("alive").state == "running"
    detached = make("det", 3, state="running", detached=True, launcher=gone)
    assert not records.mark_unknown_if_orphaned(detached)


def test_status_records_the_outcome_once_every_container_has_ended(runs_dir):
    rec = make("ended", 1, state="running", detached=True)
    rec.nodes.append(records.NodeRecord(node="node2", host="10.0.0.12", rank=1, container="ended-node2"))
    rows = [records.NodeStatus(node="node1", rank=0, container="c1", state="exited", exit_code=0,
                               finished=T0 + timedelta(minutes=3)),
            records.NodeStatus(node="node2", rank=1, container="c2", state="exited", exit_code=0,
                               finished=T0 + timedelta(minutes=2))]
    assert records.record_ended(rec, rows)
    saved = records.load("ended")
    assert (saved.state, saved.exit_code, saved.finished) == ("succeeded", 0, T0 + timedelta(minutes=3))
    rows[1] = rows[1].model_copy(update={"exit_code": 7})
    rec.state = "running"
    assert records.record_ended(rec, rows)
    saved = records.load("ended")
    assert (saved.state, saved.exit_code, saved.first_failure.node) == ("failed", 7, "node2")
    rec.state = "running"
    assert not records.record_ended(rec, [rows[0], rows[1].model_copy(update={"state": "running"})])


def test_a_stopped_run_has_an_exit_code_and_says_who_stopped_it(runs_dir):
    rec = make("stopme", 1, state="running", detached=True)
    st = _ended("node1", 1, 4).model_copy(update={"name": "stopme-node1"})
    records.record_stop(rec, {"node1": [st]}, was_running=True, by="clusterctl stop (me@here)",
                        stopped={"node1": ["stopme-node1"]})
    saved = records.load("stopme")
    assert (saved.state, saved.exit_code, saved.stopped_by) == ("stopped", 143, "clusterctl stop (me@here)")
    assert (saved.nodes[0].state, saved.nodes[0].exit_code, saved.nodes[0].stopped_by) == (
        "stopped", 1, "clusterctl stop (me@here)")
    row = records.summary_rows([saved])[0]
    assert row[1] == records.current_user() and row[5:7] == ["stopped", "143"]
    assert row[-1] == "stopped by clusterctl stop (me@here)"


# --------------------------------------------------------------------------- two users, two processes
# (two real unprivileged users sharing a runs directory: tests/run/test_two_uids.py; here root
# hands a record to another uid the way that user's own launch would have written it)

NOBODY = pwd.getpwnam("nobody").pw_uid


def _give(run_id: str, uid: int = NOBODY) -> None:
    """Make ``run_id`` the run of ``uid``: its ``uid`` field, and the owner of run.json and its
    directory (root chowns them)."""
    d = records.run_path(run_id)
    data = json.loads((d / "run.json").read_text())
    data["uid"], data["user"] = uid, "alice"            # the name shown is the owner's, not this
    (d / "run.json").write_text(json.dumps(data))
    os.chown(d / "run.json", uid, -1)
    os.chown(d, uid, -1)


def test_each_record_names_its_launchers_uid_and_without_run_id_you_get_your_newest(runs_dir, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("hands records to another uid with chown (root)")
    monkeypatch.setenv("LOGNAME", "alice")              # a login name says nothing about who you are
    monkeypatch.setenv("USER", "alice")
    me = records.current_user()
    assert me == pwd.getpwuid(os.geteuid()).pw_name != "alice"
    make("mine-old", 1)
    make("theirs", 2)
    _give("theirs")
    make("mine-new", 3).save()                          # a later save keeps the launcher
    assert [(r.run_id, r.user, r.uid) for r in records.list_runs()] == [
        ("mine-new", me, 0), ("theirs", "nobody", NOBODY), ("mine-old", me, 0)]
    theirs = records.load("theirs")
    theirs.note = "root looked"
    theirs.save()                                       # root rewriting another's record keeps it theirs
    assert os.stat(runs_dir / "theirs" / "run.json").st_uid == NOBODY
    assert (records.load("theirs").uid, records.load("theirs").note) == (NOBODY, "root looked")
    assert records.resolve(None).run_id == "mine-new"
    assert records.resolve("theirs").user == "nobody"   # named: anyone's
    assert records.others_run(records.load("theirs")) == "nobody"
    assert records.others_run(records.load("mine-old")) is None
    for run_id in ("mine-new", "mine-old"):
        _give(run_id, NOBODY)
    with pytest.raises(UserError) as e:
        records.resolve(None)
    assert f"no runs of user {me}" in e.value.message and "mine-new of user nobody" in e.value.message
    legacy = json.loads((runs_dir / "theirs" / "run.json").read_text())
    legacy.pop("user"), legacy.pop("uid")               # written before user and uid: its file's owner's
    (runs_dir / "theirs" / "run.json").write_text(json.dumps(legacy))
    assert (records.load("theirs").uid, records.load("theirs").user) == (NOBODY, "nobody")


def test_stop_refuses_another_users_run_and_logs_and_runs_name_the_owner(runs_dir):
    if os.geteuid() != 0:
        pytest.skip("hands records to another uid with chown (root)")
    rec = make("alices", 1, state="running", detached=True)
    done = make("alices-done", 0, state="succeeded", exit_code=0)
    (done.dir / "node1.log").write_text("hello from alice\n")
    _give("alices")
    _give("alices-done")
    me = records.current_user()
    before = (rec.dir / "run.json").read_text()
    res = runner.invoke(app, ["stop", "alices"])
    assert res.exit_code == 2, res.output
    assert f"run alices is user nobody's run, not yours ({me}); nothing was stopped" in res.output
    assert "clusterctl stop alices --any-user" in res.output and "Traceback" not in res.output
    assert (rec.dir / "run.json").read_text() == before           # untouched
    res = runner.invoke(app, ["stop"])                             # no run of mine: none is picked
    assert res.exit_code == 2 and f"no runs of user {me}" in res.output and "alices of user nobody" in res.output
    res = runner.invoke(app, ["logs", "alices-done"])                 # from runs/: no node asked
    assert res.exit_code == 0 and "run alices-done is user nobody's run" in res.output
    assert "node1[0]| hello from alice" in res.output
    table = runner.invoke(app, ["runs"]).output
    assert "alices" in table and "nobody" in table.split("alices", 1)[1].splitlines()[0]
    assert f"no runs of user {me}" in runner.invoke(app, ["runs", "--mine"]).output
    assert json.loads(runner.invoke(app, ["runs", "--json"]).output)[0]["user"] == "nobody"


def test_logs_of_another_users_run_never_read_through_a_link_they_planted(runs_dir, tmp_path):
    """Root (or anyone) reading nobody's run: its merged.log links to a file only root may read."""
    if os.geteuid() != 0:
        pytest.skip("hands records to another uid with chown (root)")
    secret = tmp_path / "root-only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    done = make("theirs", 0, state="succeeded", exit_code=0)
    (done.dir / records.MERGED_LOG).symlink_to(secret)
    _give("theirs")
    res = runner.invoke(app, ["logs", "theirs"])
    assert res.exit_code == 2 and "root's secret" not in res.output, res.output
    assert f"{done.dir / records.MERGED_LOG} (a symlink: clusterctl never follows one here" in res.output
    assert "Traceback" not in res.output


#: A process that waits for ``go`` to exist, then does its part (argv: runs dir, go file, ...).
_WAIT = ("import os, sys, time\n"
         "os.environ['CLUSTERCTL_RUNS'] = sys.argv[1]\n"
         "from clusterctl.run import plan, records\n"
         "print('ready', flush=True)\n"
         "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n")


def _at_once(tmp_path, code: str, args_per_process: list[list[str]], env_per_process=None):
    """Start one real Python process per item, release them together, return (code, out, err)."""
    import subprocess
    import sys

    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WAIT + code, str(tmp_path / "runs"), str(go), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **((env_per_process or [{}] * len(args_per_process))[i])})
             for i, args in enumerate(args_per_process)]
    for p in procs:          # every one has imported clusterctl and polls for `go`
        assert p.stdout.readline() == "ready\n"
    go.touch()
    return [(p.wait(timeout=60), *p.communicate()) for p in procs]


def test_two_processes_recording_the_same_run_id_at_once_one_wins_the_other_is_refused(runs_dir, tmp_path):
    code = ("from clusterctl.run import records\nfrom clusterctl.core.errors import UserError\n"
            "r = records.RunRecord(run_id='same-id', job='j', inventory='', image='img', note=sys.argv[3])\n"
            "try:\n    r.save()\nexcept UserError as e:\n    print(e.message); sys.exit(2)\n"
            "print('won')\n")
    users = ["alice", "bob", "carol", "dave"]
    results = _at_once(tmp_path, code, [[u] for u in users])
    assert sorted(r[0] for r in results) == [0, 2, 2, 2], results
    winner = users[[r[0] for r in results].index(0)]
    saved = records.load("same-id")
    assert saved.note == winner                                   # the winner's record, whole
    for rc, out, err in results:
        assert err == "" and (rc == 0 or "run id 'same-id' is already recorded" in out), (out, err)
    assert os.listdir(runs_dir / "same-id") == ["run.json"]       # no temp file left


def test_two_processes_rewriting_one_record_at_once_never_leave_it_half_written(runs_dir, tmp_path):
    make("shared", 1, state="running")
    code = ("from clusterctl.run import records\n"
            "for i in range(200):\n"
            "    r = records.load('shared')\n"
            "    r.note = sys.argv[3] * (i % 500)\n"
            "    r.argv = [sys.argv[3]] * (i % 37)\n"
            "    r.save()\n"
            "bad = 0\n")
    reader = ("from clusterctl.run import records\nbad = 0\n"
              "for i in range(2000):\n"
              "    try:\n        records.load('shared')\n"
              "    except Exception as e:\n        bad += 1; print(e)\n"
              "print('bad', bad)\n")
    results = _at_once(tmp_path, "exec(sys.argv[4])\n", [["a", code], ["b", code], ["r", reader]])
    assert [r[0] for r in results] == [0, 0, 0], results
    assert results[2][1].strip().splitlines()[-1] == "bad 0", results[2]
    assert records.load("shared").note[:1] in ("a", "b", "")
    assert os.listdir(runs_dir / "shared") == ["run.json"]


def test_launches_choosing_a_master_port_at_once_get_different_ones(runs_dir, tmp_path):
    """Four real processes take a port on one master at the same moment, each holding its
    claim while it lives; a fifth after they ended gets the first port again."""
    code = ("port = records.take_master_port(sys.argv[3], '10.0.0.1', lambda held: "
            "plan.choose_master_port(29500, [29501], {p: h.words() for p, h in held.items()}))\n"
            "print(port, flush=True)\n"
            "time.sleep(2)\n")              # alive: its claim counts
    results = _at_once(tmp_path, code, [[f"run{i}"] for i in range(4)])
    assert all(r[0] == 0 for r in results), results
    ports = sorted(int(r[1]) for r in results)
    assert ports == [29500, 29502, 29503, 29504], results
    # every launch has ended without recording a run: their claims are stale, and removed
    assert records.port_holders("10.0.0.1") == {}
    assert records.take_master_port("later", "10.0.0.1", lambda held: 29500) == 29500
    assert [p.name for p in (runs_dir / records.PORTS_DIR).glob("*.json")] == ["later.json"]


def test_a_live_runs_record_holds_its_port_on_its_master_only(runs_dir):
    me = records.current_user()
    make("live", 1, state="running", detached=True, master_addr="10.0.0.1", master_port=29500)
    make("done", 2, state="succeeded", master_addr="10.0.0.1", master_port=29501)
    make("elsewhere", 3, state="running", detached=True, master_addr="10.0.0.9", master_port=29502)
    held = records.port_holders("10.0.0.1")
    assert list(held) == [29500] and held[29500].words() == f"run live of user {me} (running)"
    assert records.port_holders("10.0.0.1", skip_run="live") == {}
    msg = records.held_message(29500, "node1", held[29500], "--set MASTER_PORT")
    assert msg.startswith(f"port 29500 on node1 (--set MASTER_PORT) is held by run live of user {me}")
    with pytest.raises(UserError, match="held by run live"):
        records.take_master_port("new", "10.0.0.1", lambda h: (_ for _ in ()).throw(
            UserError(records.held_message(29500, "node1", h[29500]))))
