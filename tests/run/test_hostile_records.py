"""Run records read back that another user may have planted (a shared runs directory).

Every value of a record read back is checked at one guard, the table of
:func:`clusterctl.run.records.read_back_problem` (or the record model's types, for the shape
of a nested field), and a record that fails is "not to be trusted": refused by name with
why, skipped by ``runs``, never a traceback, its bytes never printed raw.  One table of
hostile values per class:

1. a Slurm job id that is no job id (an option, a path, an escape sequence);
2. control characters in any text field, a state that is no state, a node name that is none;
3. a nested field of the wrong shape (``hang``, an attempt's ``end``, ``spec``);
4. unbounded text;
5. exit codes and ranks past what a process or a job has;
6. port claims under runs/.ports/ (``take_master_port``'s holders, and what they print);
and a merged.log line whose rank has thousands of digits.  Records clusterctl writes load.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shlex
from datetime import datetime, timezone

import pytest

from clusterctl.core.errors import UserError
from clusterctl.run import logs, records, recovery
from tests.fixtures.hostile import cli

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
ESC = "\x1b[2J"


NODE = {"node": "node1", "host": "10.0.0.11", "rank": 0, "container": "r1-node1", "state": "exited",
        "exit_code": 3, "stopped_by": None, "env": {"NODE_RANK": "0", "HF_TOKEN": "****"}}
FAILURE = {"node": "node1", "rank": 0, "kind": "exit", "exit_code": 3, "time": T0.isoformat(),
           "reason": "exited 3", "last_lines": ["Traceback (most recent call last):", "boom"]}
END = dataclasses.asdict(recovery.AttemptEnd(0, "failed", 3, node="node1", kind="exit", last_line="boom"))
HANG = {"timeout_seconds": 60.0, "silent_seconds": 61.2, "phase": "running",
        "last_output": T0.isoformat(), "detected": T0.isoformat(), "dump_seconds": 1.5,
        "stacks_dir": "/runs/r1/stacks", "files": ["node1-0.txt"], "majority_frame": "all_reduce",
        "odd_ranks": [{"node": "node1", "rank": 0, "pid": 4242, "state": "S (sleeping)",
                       "reason": "not in all_reduce"}],
        "node_errors": {"node1": "docker exec failed"}, "error": None}


def base() -> dict:
    """A record as clusterctl writes one (every field the checks walk has a value)."""
    return {
        "run_id": "r1", "job": "ddp-smoke", "inventory": "/x/inv.yaml", "image": "img:1",
        "master_addr": "10.0.0.11", "master_port": 29500, "state": "failed", "exit_code": 3,
        "started": T0.isoformat(), "finished": T0.isoformat(), "detached": True,
        "nodes": [copy.deepcopy(NODE)], "first_failure": copy.deepcopy(FAILURE),
        "argv": ["clusterctl", "launch", "ddp-smoke"], "note": "", "stopped_by": None,
        "hang": copy.deepcopy(HANG), "collective_errors": ["node1[0]| NCCL WARN x"],
        "flight": {"node1": ["dump0"]},
        "code": {"digest": "sha256:" + "a" * 64, "workdir": "/home/a/proj",
                 "git_commit": "0123456789abcdef0123456789abcdef01234567", "sent": {"node1": 10}},
        "spec": {"job": "/x/job.yaml", "flags": {"workdir": "proj"}, "secret_env": ["HF_TOKEN"],
                 "cwd": "/home/a"},
        "attempt": 0, "max_restarts": 1,
        "attempts": [{"attempt": 0, "state": "failed", "exit_code": 3, "nodes": [copy.deepcopy(NODE)],
                      "first_failure": copy.deepcopy(FAILURE), "ended": "node1 exited 3",
                      "then": "end", "excluded": {"node1": "failed twice"},
                      "replaced": {"node1": "node2"}, "end": copy.deepcopy(END)}],
        "excluded": {"node1": "failed twice"},
    }


def planted(runs_dir, path: str, value) -> dict:
    """The base record with the value at ``path`` (dotted, list indices as numbers) replaced,
    written as runs/r1/run.json."""
    data = base()
    *parents, last = path.split(".")
    at = data
    for p in parents:
        at = at[int(p)] if isinstance(at, list) else at.setdefault(p, {})
    if isinstance(at, list):
        at[int(last)] = value
    else:
        at[last] = value
    d = runs_dir / data["run_id"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(json.dumps(data))
    (d / "node1.log").write_text("hello\n")
    return data


def assert_refused(runs_dir, case: str) -> str:
    """The planted record is refused by name at load, skipped by list_runs and `runs` (which
    say why), and no command prints it raw or with a traceback."""
    with pytest.raises(UserError) as e:
        records.load("r1")
    msg = str(e.value)
    assert "r1/run.json" in msg and ("not to be trusted" in msg or "not a valid run record" in msg), msg
    assert not any(c in msg for c in "\x1b\x07\r\x00"), msg
    assert len(msg) < 1200, (case, len(msg))
    assert records.list_runs() == []
    listed = cli("runs")
    assert listed.exit_code == 0 and "Traceback" not in listed.output, (case, listed.output)
    status = cli("status", "r1")
    assert status.exit_code == 2, (case, status.output, status.exception)
    for out in (listed.output, status.output, cli("logs", "r1").output, cli("stop", "r1").output):
        assert "Traceback" not in out and "\x1b" not in out and "\x07" not in out, (case, out)
        assert len(out) < 5000, (case, len(out))
    return msg


def test_the_base_record_loads_and_lists(runs_dir):
    planted(runs_dir, "note", "")
    r = records.load("r1")
    assert r.hang["odd_ranks"][0]["node"] == "node1" and r.attempts[0].end["node"] == "node1"
    assert [x.run_id for x in records.list_runs()] == ["r1"]
    assert cli("runs").exit_code == 0


# --------------------------------------------------------------------------- 1. slurm_job

BAD_SLURM_JOBS = ["--user=alice", "x/../../../secret", "1" + ESC, "123_4", "123+0", "１２３", "",
                  "-1", " 12", "1" * 21]


@pytest.mark.parametrize("job", BAD_SLURM_JOBS, ids=[repr(j)[:30] for j in BAD_SLURM_JOBS])
def test_a_slurm_job_that_is_no_job_id_is_refused(runs_dir, job):
    planted(runs_dir, "scheduler", "slurm")
    data = json.loads((runs_dir / "r1" / "run.json").read_text())
    data.update(slurm_job=job, state="running")
    (runs_dir / "r1" / "run.json").write_text(json.dumps(data))
    assert "slurm_job" in assert_refused(runs_dir, job)


@pytest.mark.parametrize("job", ["4242", "1", "4294967295"])
def test_a_slurm_job_id_as_sbatch_prints_it_loads(runs_dir, job):
    from clusterctl.run.slurm.submit import parse_job_id
    planted(runs_dir, "slurm_job", parse_job_id(f"{job};cluster\n"))
    assert records.load("r1").slurm_job == job


# --------------------------------------------------------------------------- 2. controls, states

CONTROLS = {
    "note": "x" + ESC, "stopped_by": "alice\x1b]0;T\x07", "state": "failed" + ESC,
    "nodes.0.state": "exited" + ESC, "nodes.0.stopped_by": "x\rY", "nodes.0.node": "node1\x1b",
    "first_failure.node": "n" + ESC, "first_failure.reason": "x\x1b[31m", "first_failure.last_lines": ["a\x07"],
    "attempts.0.ended": "e" + ESC, "attempts.0.then": "t\x00", "attempts.0.state": "x" + ESC,
    "attempts.0.replaced": {"node1" + ESC: "node2"}, "attempts.0.excluded": {"node1": "why" + ESC},
    "excluded": {"node1": "lost\x1b[2J"},
    "hang.odd_ranks": [{"node": "n" + ESC, "rank": 0, "pid": 1, "state": "S", "reason": "r"}],
    "hang.odd_ranks.0.rank": "0" + ESC, "hang.odd_ranks.0.reason": "r" + ESC,
    "hang.node_errors": {"node1": "e" + ESC},
    "code.git_commit": "abc" + ESC, "inventory": "/x/inv.yaml" + ESC,
    "spec.secret_env": ["HF" + ESC], "spec.flags.workdir": "proj" + ESC, "spec.cwd": "/x\n",
    "collective_errors": ["node1[0]| " + ESC], "flight.node1": "none" + ESC,
    "attempts.0.end.last_line": "boom" + ESC, "attempts.0.end.node": "n/../x",
    "launcher": {"host": "h" + ESC, "pid": 1}, "scheduler": "ssh" + ESC, "argv": ["x" + ESC],
    "nodes.0.env": {"A" + ESC: "1"},
    # a state that is no state, a node name that is none
    "state (unknown word)": "pwned", "nodes.0.state (unknown word)": "pwned",
    "attempts.0.state (unknown word)": "pwned", "first_failure.node (path)": "../../x",
    "attempts.0.replaced (value)": {"node1": "../x"}, "first_failure.kind": "pwned",
}


@pytest.mark.parametrize("case", CONTROLS, ids=list(CONTROLS))
def test_a_control_character_or_unknown_word_in_any_field_is_refused(runs_dir, case):
    path = case.split(" ")[0]
    planted(runs_dir, path, CONTROLS[case])
    msg = assert_refused(runs_dir, case)
    assert path.split(".")[0] in msg, msg


# --------------------------------------------------------------------------- 3. shapes

SHAPES = {
    "hang.odd_ranks int": ("hang.odd_ranks", 5),
    "hang.odd_ranks str": ("hang.odd_ranks", "xy"),
    "hang.odd_ranks without rank": ("hang.odd_ranks", [{"node": "n"}]),
    "hang a list": ("hang", [1, 2]),
    "hang.node_errors a list": ("hang.node_errors", ["x"]),
    "end unknown key": ("attempts.0.end", {"bogus": 1}),
    "end extra key": ("attempts.0.end", {**END, "bogus": 1}),
    "end lost a str": ("attempts.0.end.lost", 5),
    "end exit_code a word": ("attempts.0.end.exit_code", "x"),
    "spec.secret_env a str": ("spec.secret_env", "HF_TOKEN"),
    "spec.flags a list": ("spec.flags", ["x"]),
    "spec a list": ("spec", [1]),
}


@pytest.mark.parametrize("case", SHAPES, ids=list(SHAPES))
def test_a_nested_field_of_the_wrong_shape_is_refused_at_load(runs_dir, case):
    planted(runs_dir, *SHAPES[case])
    assert_refused(runs_dir, case)


def test_resume_of_a_record_with_a_malformed_attempt_end_is_refused(runs_dir):
    data = planted(runs_dir, "attempts.0.end", {"bogus": 1})
    data.update(state="running", detached=False)
    (runs_dir / "r1" / "run.json").write_text(json.dumps(data))
    res = cli("launch", "--resume", "r1")
    assert res.exit_code == 2 and "Traceback" not in res.output, (res.output, res.exception)
    assert "r1/run.json" in res.output


RANK_DIGITS = ["9" * 5000, "9" * 10, "１", "٣"]


@pytest.mark.parametrize("rank", RANK_DIGITS, ids=["5000 digits", "10 digits", "fullwidth", "arabic"])
def test_a_merged_log_line_whose_rank_is_no_rank_is_no_prefixed_line(runs_dir, rank):
    assert logs.parse_prefixed(f"node1[{rank}]| hello") is None
    assert logs.parse_prefixed("node1[999999999]| hello") == ("node1", 999999999, "hello")
    planted(runs_dir, "detached", False)      # a followed run that ended: its logs are the files
    (runs_dir / "r1" / "merged.log").write_text(f"node1[{rank}]| evil\nnode1[0]| fine\n")
    res = cli("logs", "r1")
    assert res.exit_code == 0 and "Traceback" not in res.output, (res.output, res.exception)
    assert "fine" in res.output


# --------------------------------------------------------------------------- 4. unbounded text

LONG = {
    "note": "x" * 5000, "stopped_by": "y" * 5000, "state": "z" * 5000, "inventory": "/" + "i" * 5000,
    "spec.secret_env": ["S" * 3000], "nodes.0.stopped_by": "s" * 5000, "job": "j" * 300,
    "first_failure.reason": "r" * 5000, "first_failure.last_lines": ["l" * 5000],
    "attempts.0.ended": "e" * 5000, "nodes.0.host": "h" * 300, "hang.error": "e" * 5000,
    "master_addr": "m" * 300,
}


@pytest.mark.parametrize("case", LONG, ids=list(LONG))
def test_unbounded_text_is_refused_and_never_echoed_whole(runs_dir, case):
    planted(runs_dir, case, LONG[case])
    msg = assert_refused(runs_dir, case)
    assert "x" * 200 not in msg and "S" * 200 not in msg and "i" * 200 not in msg, msg


# --------------------------------------------------------------------------- 5. numbers

NUMBERS = {
    "exit_code 256": ("exit_code", 256), "exit_code -256": ("exit_code", -256),
    "exit_code 2**40": ("exit_code", 2**40), "exit_code -1": ("exit_code", -1),
    "node exit_code 10**30": ("nodes.0.exit_code", 10**30),
    "node rank 10**30": ("nodes.0.rank", 10**30), "node rank -1": ("nodes.0.rank", -1),
    "first_failure rank 10**30": ("first_failure.rank", 10**30),
    "first_failure exit_code 256": ("first_failure.exit_code", 256),
    "attempt exit_code 512": ("attempts.0.exit_code", 512),
    "attempt node rank": ("attempts.0.nodes.0.rank", 10**8),
    "end exit_code 256": ("attempts.0.end.exit_code", 256),
    "hang rank": ("hang.odd_ranks.0.rank", 10**30),
    "master_port 70000": ("master_port", 70000),
}


@pytest.mark.parametrize("case", NUMBERS, ids=list(NUMBERS))
def test_numbers_past_what_a_process_or_job_has_are_refused(runs_dir, case):
    planted(runs_dir, *NUMBERS[case])
    assert_refused(runs_dir, case)


@pytest.mark.parametrize("code", [0, 1, 124, 137, 143, 255])
def test_every_exit_code_a_process_returns_loads(runs_dir, code):
    planted(runs_dir, "exit_code", code)
    assert records.load("r1").exit_code == code


def test_attach_of_a_run_recorded_with_exit_256_is_refused_not_exit_0(runs_dir):
    planted(runs_dir, "exit_code", 256)
    res = cli("attach", "r1")
    assert res.exit_code == 2, (res.output, res.exception)


# --------------------------------------------------------------------------- writing

def test_free_text_clusterctl_records_from_a_jobs_output_is_saved_escaped_and_loads(runs_dir):
    """A crash loop's note quotes the job's last line, which may hold escape sequences:
    the record clusterctl writes holds them escaped (and bounded), so it loads again."""
    rec = records.RunRecord(run_id="r1", job="ddp-smoke", inventory="/x/inv.yaml", image="img:1",
                            state="failed", exit_code=121,
                            note="the same failure 2 times in a row: node1 exited 1 (\x1b[31mboom\r)",
                            first_failure=records.FailureRecord(
                                node="node1", rank=0, kind="exit", exit_code=1, time=T0,
                                reason="x" * 10000, last_lines=["\x1b[31mError\x1b[0m", "tqdm\r50%"]),
                            collective_errors=["node1[0]| \x1b[1mNCCL WARN\x1b[0m"],
                            nodes=[records.NodeRecord(node="node1", host="10.0.0.11", rank=0,
                                                      container="r1-node1", state="hibernating")])
    rec.save()
    back = records.load("r1")
    assert back.note == "the same failure 2 times in a row: node1 exited 1 (\\x1b[31mboom\\r)"
    assert back.first_failure.last_lines == ["\\x1b[31mError\\x1b[0m", "tqdm\\r50%"]
    assert len(back.first_failure.reason) <= records.TEXT_MAX
    assert back.collective_errors == ["node1[0]| \\x1b[1mNCCL WARN\\x1b[0m"]
    assert back.nodes[0].state == "unknown"        # a runtime's word clusterctl does not know


def test_a_node_state_the_runtime_reports_is_kept(runs_dir):
    for state in ("created", "running", "exited", "dead", "paused", "restarting", "stopped", "lost"):
        planted(runs_dir, "nodes.0.state", state)
        assert records.load("r1").nodes[0].state == state


# --------------------------------------------------------------------------- 6. port claims

def _claim(runs_dir, name: str, **kw) -> os.PathLike:
    d = runs_dir / records.PORTS_DIR
    d.mkdir(parents=True, exist_ok=True)
    claim = {"run_id": name, "user": "alice\x1b]0;T\x07", "uid": os.geteuid(),
             "master_addr": "10.0.0.1", "port": 29500, "time": records.utcnow().isoformat(),
             "launcher": records.this_launcher().model_dump(mode="json"), **kw}
    path = d / f"{name}.json"
    path.write_text(json.dumps(claim))
    return path


HOSTILE_CLAIM_NAMES = ["x\x1b[2J;touch PWNED", "y;touch PWNED2 #", "-rf", "a b", "../x"]


@pytest.mark.parametrize("name", HOSTILE_CLAIM_NAMES, ids=[repr(n) for n in HOSTILE_CLAIM_NAMES])
def test_a_claim_whose_run_id_is_no_run_id_is_no_claim_and_is_kept(runs_dir, name):
    if "/" in name:
        path = _claim(runs_dir, "ok1", run_id=name)       # the name inside differs from the file's
    else:
        path = _claim(runs_dir, name)
    assert records.port_holders("10.0.0.1") == {}
    port = records.take_master_port("mine", "10.0.0.1", lambda held: 29500 if not held else 1)
    assert port == 29500 and path.exists()


def test_a_claims_holder_is_named_by_the_files_owner_not_what_it_says(runs_dir):
    _claim(runs_dir, "c1")
    held = records.port_holders("10.0.0.1")
    assert held[29500].run_id == "c1" and held[29500].user == records.current_user()
    msg = records.held_message(29500, "node1", held[29500])
    assert "\x1b" not in msg and "\x07" not in msg and "`clusterctl status c1`" in msg


@pytest.mark.parametrize("dirname", ["runs dir;touch X #", "r\x1b[2J"])
def test_an_unreadable_claims_chmod_hint_is_quoted_for_a_shell(tmp_path, dirname):
    path = tmp_path / dirname / records.PORTS_DIR / "c1.json"
    msg = records.unreadable_claim_message(path)
    assert "\x1b" not in msg
    hint = msg.split("(`", 1)[1].split("`)", 1)[0]
    assert shlex.split(hint)[:2] == ["chmod", "a+r"] and len(shlex.split(hint)) == 3, hint


def test_runs_names_each_record_it_skips_and_why_escaped(runs_dir):
    planted(runs_dir, "hang", {"odd_ranks": 5})
    d = runs_dir / ("x" + ESC)
    d.mkdir()
    (d / "run.json").write_text(json.dumps({**base(), "run_id": "x"}))
    res = cli("runs")
    assert res.exit_code == 0 and "\x1b" not in res.output, res.output
    assert "r1/run.json: not a valid run record (field hang" in res.output, res.output
    assert "x\\x1b[2J/run.json: not to be trusted" in res.output, res.output
