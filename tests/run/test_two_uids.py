"""Two real unprivileged users of one group sharing a runs directory (issue 41, items 1-2).

The test box runs as root: a session fixture makes the group ``ccshare`` and the users
``ccalice`` and ``ccbob`` in it (``useradd``), and every step below runs clusterctl (the
CLI, or the record functions in ``python -c``) as one of them through ``setpriv`` with
umask 022, against a runs directory both may write into (group ``ccshare``, sticky and
setgid, as ``clusterctl runs --share`` makes it).  No node is needed: what is under test
is what one user's files can make the other's clusterctl do.  The subprocesses import the
clusterctl this test imported (PYTHONPATH), so the same tests run against another tree.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the fixtures two_users and shared come from tests/fixtures/two_uids.py (a plugin of conftest)
from tests.fixtures.two_uids import _PRELUDE, ALICE, BOB, _argv, _env, _umask, ok, run_as


def _record(run_id: str, **kw) -> str:
    """A run record's JSON as someone might write it by hand."""
    return json.dumps({"run_id": run_id, "job": "ddp-smoke", "inventory": "/nonexistent/inv.yaml",
                       "image": "img:1", "state": "running", "detached": True,
                       "nodes": [{"node": "node1", "host": "10.0.0.11", "rank": 0,
                                  "container": f"{run_id}-node1", "flight_dir": "/home/ccalice"}],
                       **kw})


def _save(name: str, run_id: str, **kw) -> str:
    """Code that saves a new record ``run_id`` the way launch does (step ``name``)."""
    fields = "".join(f", {k}={v!r}" for k, v in kw.items())
    return (f"step({name!r}, lambda: records.RunRecord(run_id={run_id!r}, job='ddp-smoke', "
            f"inventory='/nonexistent/inv.yaml', image='img:1'{fields}).save())\n")


def _take(name: str, run_id: str) -> str:
    """Code that takes a master port for ``run_id`` on 10.0.0.1: the first one not held."""
    return (f"step({name!r}, lambda: records.take_master_port({run_id!r}, '10.0.0.1', "
            "lambda held: next(p for p in range(29500, 29600) if p not in held)))\n")


# --------------------------------------------------------------------------- item 1: whose run

def test_a_record_bob_plants_saying_alice_launched_it_is_never_acted_on_as_alices(shared, two_users):
    alice = two_users[ALICE].pw_uid
    run_as(BOB, shared, f"(RUNS / 'planted').mkdir()\n"
                        f"(RUNS / 'planted' / 'run.json').write_text({_record('planted', user=ALICE, uid=alice)!r})\n")
    got = run_as(ALICE, shared, """
        cli("rerun", "launch", "--rerun", "planted")
        cli("resume", "launch", "--resume", "planted")
        cli("stop", "stop", "planted")
        cli("status", "status", "planted")
        cli("runs", "runs")
    """)
    for name in ("rerun", "resume", "stop", "status"):
        out = ok(got[name], 2)
        assert "is not to be trusted" in out and f"says uid {alice} (ccalice) launched it" in out, out
        assert "but ccbob" in out, out                    # who really wrote it
    assert "skipped" in got["runs"]["out"] and "planted/run.json: not to be trusted" in ok(got["runs"])


def test_bobs_own_record_is_bobs_whatever_his_login_name_says_and_acting_on_it_needs_any_user(shared):
    ok(run_as(BOB, shared, _save("save", "bobs", state="running", detached=True),
              LOGNAME=ALICE, USER=ALICE)["save"])
    got = run_as(ALICE, shared, """
        cli("json", "runs", "--json")
        cli("mine", "runs", "--mine")
        cli("rerun", "launch", "--rerun", "bobs")
        cli("resume", "launch", "--resume", "bobs")
        cli("stop", "stop", "bobs")
        cli("anyway", "launch", "--rerun", "bobs", "--any-user")
    """)
    listed = json.loads(ok(got["json"]))
    assert [(r["run_id"], r["user"]) for r in listed] == [("bobs", BOB)]   # readable, and bob's
    assert "no runs of user ccalice" in ok(got["mine"])
    for name in ("rerun", "resume", "stop"):
        out = ok(got[name], 2)
        assert "run bobs is user ccbob's run, not yours (ccalice)" in out, out
        assert "--any-user" in out and "nothing was" in out, out
    assert "run bobs is user ccbob's run; --rerun of it as you (--any-user)" in got["anyway"]["out"]


def test_a_renamed_run_directory_is_refused_and_an_unsafe_runs_directory_records_nothing(shared):
    ok(run_as(ALICE, shared, _save("save", "alices", state="running", detached=True))["save"])
    rename = "step('rename', lambda: os.rename(RUNS / 'alices', RUNS / 'moved'))\n"
    assert "PermissionError" in run_as(BOB, shared, rename)["rename"]["out"]  # sticky: bob cannot
    os.chmod(shared, 0o2775)                     # the directory as the old how-to made it
    ok(run_as(BOB, shared, rename)["rename"])
    got = run_as(ALICE, shared, """
        cli("status", "status", "moved")
        cli("stop", "stop", "moved")
        cli("rerun", "launch", "--rerun", "moved")
    """, _save("another", "another"))
    for name in ("status", "stop", "rerun"):
        assert "names run 'alices' but is in directory 'moved'" in ok(got[name], 2)
    out = ok(got["another"], 2)                   # nothing new goes into an unsafe directory
    assert "is writable by group ccshare without the sticky bit" in out
    assert "clusterctl runs --share GROUP" in out and not (shared / "another").exists()


def test_runs_share_makes_a_directory_the_group_shares_and_refuses_an_unknown_group(shared, two_users):
    os.chmod(shared, 0o755)
    os.chmod(shared / ".ports", 0o755)
    got = run_as(ALICE, shared, 'cli("share", "runs", "--share", "ccshare")\n'
                                'cli("bad", "runs", "--share", "no-such-group-here")\n')
    assert "is shared with group ccshare" in ok(got["share"])
    assert "no such group" in ok(got["bad"], 2)
    for d in (shared, shared / ".ports"):
        st = os.stat(d)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o3775, two_users[ALICE].pw_gid), d
    ok(run_as(BOB, shared, _save("save", "bobs"))["save"])     # a member records there


def test_an_inventory_in_a_directory_closed_to_the_caller_is_named_not_a_traceback(shared, two_users):
    """Bob's ``status`` of alice's run reads the inventory recorded with it, which is in her
    own 0700 directory (found on real nodes: tests/run/test_two_uids_nodes.py)."""
    closed = shared.parent / "alice-only"
    closed.mkdir(mode=0o700)
    (closed / "nodes.yaml").write_text("nodes:\n- {name: node1, host: 10.0.0.11}\n")
    os.chown(closed, two_users[ALICE].pw_uid, two_users[ALICE].pw_gid)
    got = run_as(BOB, shared, f'cli("nodes", "nodes", "--nodes", {str(closed / "nodes.yaml")!r})\n')
    out = ok(got["nodes"], 2)
    assert f"{closed / 'nodes.yaml'}: cannot reach the inventory (Permission denied)" in out, out
    assert "give --nodes an inventory you can read" in out, out


# --------------------------------------------------------------------------- item 2: files

def test_planted_symlinks_at_the_lock_a_claim_or_a_log_are_never_followed(shared):
    precious = str(shared.parent / "precious")
    run_as(BOB, shared, f"os.symlink({precious!r}, RUNS / '.ports' / 'lock')\n"
                        # a run directory bob made beforehand, open to all, its log linked to alice's file
                        f"(RUNS / 'taken').mkdir()\nos.chmod(RUNS / 'taken', 0o777)\n"
                        f"os.symlink({precious!r}, RUNS / 'taken' / 'merged.log')\n")
    got = run_as(ALICE, shared, _take("lock", "a1"), _save("taken", "taken"), """
        from clusterctl.run.logs import LogSink
        step("log", lambda: LogSink({"node1": 0}, run_dir=RUNS / "taken").write("node1", "hello"))
        os.unlink(RUNS / ".ports" / "lock")      # alice owns .ports: she may remove bob's link
        os.symlink(os.environ["HOME"] + "/precious", RUNS / ".ports" / "b1.json")
    """)
    out = ok(got["lock"], 2)
    assert "a symlink" in out and ".ports/lock" in out, out
    assert "is not a run directory of yours (owner ccbob)" in ok(got["taken"], 2)
    assert "merged.log (a symlink: clusterctl never follows one here" in ok(got["log"], 2)
    assert Path(precious).read_text() == "keep\n"       # nothing truncated or appended through a link
    out = ok(run_as(BOB, shared, _take("claim", "b1"))["claim"], 2)   # alice's link at bob's claim
    assert ".ports/b1.json" in out and "cannot replace" in out, out
    assert Path(precious).read_text() == "keep\n" and (shared / ".ports" / "b1.json").is_symlink()


def test_a_lock_made_by_one_user_serves_the_other(shared):
    assert ok(run_as(ALICE, shared, _take("take", "a1"))["take"]) == "29500"
    assert stat.S_IMODE(os.stat(shared / ".ports/lock").st_mode) == 0o644   # umask 022: only alice writes it
    assert ok(run_as(BOB, shared, _take("take", "b1"))["take"]) == "29500"  # a1's launch ended: stale


def test_a_live_claim_holds_its_port_for_the_other_user_and_an_unreadable_one_is_never_deleted(shared):
    alice = subprocess.Popen([*_argv(ALICE), sys.executable, "-c",
                              _PRELUDE + _take("take", "a-live") + "print(results['take']['out'], flush=True)\n"
                              "sys.stdin.readline()\n"],
                             env=_env(ALICE, shared), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_umask)
    try:
        assert alice.stdout.readline() == "29500\n"
        claim = shared / ".ports" / "a-live.json"
        assert stat.S_IMODE(claim.stat().st_mode) == 0o644
        assert ok(run_as(BOB, shared, _take("take", "b-1"))["take"]) == "29501"   # never 29500 twice
        os.chmod(claim, 0o600)                     # as an older clusterctl wrote it
        out = ok(run_as(BOB, shared, _take("take", "b-2"))["take"], 2)
        assert f"the port claim {claim} cannot be read (owner ccalice)" in out and "chmod a+r" in out, out
        assert claim.exists()
    finally:
        alice.communicate("\n", timeout=30)
    assert alice.returncode == 0


def test_status_of_a_foreign_unreadable_record_names_the_file_and_the_fix(shared):
    ok(run_as(ALICE, shared, _save("save", "alices", state="succeeded", exit_code=0))["save"])
    path = shared / "alices" / "run.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644       # the users who share it read it
    os.chmod(path, 0o600)
    got = run_as(BOB, shared, 'cli("status", "status", "alices")\ncli("runs", "runs")\n')
    out = ok(got["status"], 2)
    assert f"cannot read the run record {path} (owner ccalice, mode 0600)" in out and "chmod a+r" in out, out
    assert f"skipped {path}: not readable" in ok(got["runs"])


# --------------------------------------------------------------------------- stop: paths and pids

def test_node_paths_come_from_the_run_id_never_from_the_record(runs_dir):
    from clusterctl.run import flight, plan, records

    rec = records.RunRecord.model_validate_json(_record("r1"))   # its flight_dir says /home/ccalice
    assert flight.node_dirs(rec, {"node1"}) == {"node1": plan.flight_dir("r1", "node1")}
    assert plan.flight_dir("r1", "node1") == "/var/tmp/clusterctl/runs/r1/node1/flight"
    assert flight.node_dirs(rec, {"node9"}) == {}          # a node not in the inventory: nothing
    bad = rec.model_copy(update={"run_id": "../.."})
    with pytest.raises(Exception, match="not valid"):
        flight.node_dirs(bad, {"node1"})


def test_stop_signals_the_recorded_launcher_only_when_it_is_the_owners_process(shared, two_users):
    """Even root (``stop --any-user``) does not signal a pid a record names when that process
    is not the record owner's."""
    from clusterctl.run import detached, records

    bobs = subprocess.Popen([*_argv(BOB), "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{bobs.pid}").st_uid != two_users[BOB].pw_uid and time.monotonic() < deadline:
            time.sleep(0.01)                       # setpriv has not exec'd sleep yet
        time.sleep(0.1)
        launcher = records.this_launcher().model_copy(
            update={"pid": bobs.pid, "start_ticks": records._start_ticks(bobs.pid)})
        rec = records.RunRecord.model_validate_json(_record("alices", uid=two_users[ALICE].pw_uid))
        rec.launcher = launcher
        assert records.launcher_gone(launcher) is False
        assert detached.ask_to_stop(rec, timeout=1) is False
        assert bobs.poll() is None                  # bob's process was not signalled
    finally:
        bobs.kill()
        bobs.wait()
