"""The follow through the tree (clusterctl.run.treefollow): its pure parts.

The follow itself runs on the real sandbox: tests/run/test_launch.py (a followed run
through the tree, a hop killed mid-run, a lost node and a link flap with the tree on) and
tests/run/test_scale32.py (32 nodes, one login from this machine).  Here: the commands
each node runs, run by a real ``sh`` with ``docker`` replaced by a script that prints what
a container would (the only stand-in: a Docker engine is not needed to check the shell),
and the reading of a container's final state."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from clusterctl.run.treefollow import REMOVED, follow_commands, parse_final

FAKE_DOCKER = r"""#!/bin/sh
# stand-in for the docker CLI (no engine needed): what each subcommand of the follow prints
case "$1" in
  logs) printf '2026-11-27T10:00:00.1Z first line\n\n2026-11-27T10:00:01Z %s\nno newline at the end' "$LONG" ;;
  inspect) if [ -n "$RUNNING" ]; then
             printf '{"Name":"/c1","State":{"Status":"running","Running":true,"ExitCode":0,"StartedAt":"2026-11-27T10:00:00Z","FinishedAt":"0001-01-01T00:00:00Z"},"Config":{"Labels":{}}}\n'
           else
             printf '{"Name":"/c1","State":{"Status":"exited","Running":false,"ExitCode":3,"StartedAt":"2026-11-27T10:00:00Z","FinishedAt":"2026-11-27T10:00:02.5Z"},"Config":{"Labels":{"io.clusterctl.rank":"4"}}}\n'
           fi ;;
  rm) echo "$@" >> "$RM_LOG"; exit 0 ;;
  wait) sleep 1; echo 3 ;;
esac
"""


def run_with_fake_docker(tmp_path: Path, argv: tuple[str, ...], **more: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LONG": "x" * 7000,
           "RM_LOG": str(tmp_path / "rm.log"), **more}
    # fd 3 is the tree's own stdout, as the tree's node program gives it to each command
    return subprocess.run(["sh", "-c", 'exec 3>&1; exec "$@"', "sh", *argv], capture_output=True,
                          text=True, env=env, timeout=30)


def test_the_log_command_writes_whole_protocol_lines_then_the_final_state(tmp_path):
    logs, _ = follow_commands("node7", "c1", remove=True)
    r = run_with_fake_docker(tmp_path, logs.argv)
    lines = r.stdout.splitlines()
    assert all(line.startswith("clusterctl-tree-l node7 1 ") and line.endswith(" .") for line in lines)
    texts = [line[len("clusterctl-tree-l node7 1 "):-2] for line in lines]
    # a line longer than 3000 bytes comes in pieces under a pipe's 4 KiB, each whole
    assert texts[:3] == ["2026-11-27T10:00:00.1Z first line", "", "2026-11-27T10:00:01Z " + "x" * 2979]
    assert texts[3:5] == ["x" * 3000, "x" * 1021] and texts[5] == "no newline at the end"
    assert max(len(line) for line in lines) < 4096
    state, removed = parse_final("node7", r.stderr)
    assert removed and r.stderr.strip().endswith(REMOVED)
    assert (state.name, state.status, state.exit_code, state.rank) == ("c1", "exited", 3, 4)
    assert state.finished.isoformat() == "2026-11-27T10:00:02.500000+00:00"


def test_a_stream_that_ends_while_the_container_runs_leaves_it_running(tmp_path):
    """The log stream ends also when the tree above the node is cut mid-run (fd 3 breaks):
    the container then runs on, followed over the node's own connection, and must not be
    removed (a ``rm --force`` killed it with 137 once in CI).  Its state is still said."""
    logs, _ = follow_commands("node7", "c1", remove=True)
    r = run_with_fake_docker(tmp_path, logs.argv, RUNNING="1")
    assert r.returncode == 0, r.stderr
    state, removed = parse_final("node7", r.stderr)
    assert state.running and not removed and REMOVED not in r.stderr
    assert not (tmp_path / "rm.log").exists()
    ended = run_with_fake_docker(tmp_path, logs.argv)        # the same once it has ended: removed
    assert parse_final("node7", ended.stderr)[1]
    assert (tmp_path / "rm.log").read_text().split() == ["rm", "--force", "c1"]


def test_the_wait_command_sends_signs_of_life_until_docker_wait_answers(tmp_path):
    _, wait = follow_commands("node7", "c1", remove=True, heartbeat=0.2)
    r = run_with_fake_docker(tmp_path, wait.argv)
    beats = [line for line in r.stdout.splitlines() if line.startswith("clusterctl-tree-l")]
    assert set(beats) == {"clusterctl-tree-l node7 2 ."} and 3 <= len(beats) <= 7, r.stdout
    assert r.stdout.splitlines()[-1] == "3" and r.returncode == 0


def test_a_final_state_that_is_missing_or_running_is_no_end():
    assert parse_final("n", "Error: No such container: c1\n") == (None, False)
    running = json.dumps({"Name": "/c1", "State": {"Status": "running"}, "Config": {"Labels": {}}})
    state, removed = parse_final("n", running + "\n")
    assert state.running and not removed
