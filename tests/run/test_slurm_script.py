"""The sbatch script of `launch --scheduler slurm`: golden files for ddp-smoke and bert in
both container modes, the environment contract read from Slurm's variables, secrets by
name only, quoting, and bad options (exit 2, nothing rendered).

Pyxis mode is rendered and golden-tested only: enroot and pyxis are not packaged here.
After reviewing a change, rewrite the files with
``UPDATE_GOLDEN=1 python -m pytest tests/run/test_slurm_script.py``.
"""

from __future__ import annotations

import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest

from clusterctl.cluster.inventory import load_inventory
from clusterctl.core.errors import UserError
from clusterctl.run.jobs import load_job
from clusterctl.run.slurm.options import check_options
from clusterctl.run.slurm.script import parse_attempt_mark, render_script, shell_word
from tests.fixtures.golden import matches_golden

GOLDEN_DIR = Path(__file__).parent / "golden"
RUN_DIR = "/srv/clusterctl/runs/golden-run"


def _golden(name: str, text: str) -> None:
    matches_golden(GOLDEN_DIR, name, text, "sbatch script")


def _render(job: str, container: str, **kw):
    options = check_options(nnodes=kw.pop("nnodes", 3), partition=kw.pop("partition", "debug"),
                            time=kw.pop("time", "30:00"), container=container)
    return render_script(load_job(job), options, run_id="golden-run", run_dir=RUN_DIR, **kw)


@pytest.mark.parametrize("job", ["ddp-smoke", "bert"])
def test_docker_script_matches_golden(job):
    _golden(f"slurm-{job}-docker.sbatch", _render(job, "docker").text)


@pytest.mark.parametrize("job", ["ddp-smoke", "bert"])
def test_pyxis_script_rendered_only_no_enroot_here(job):
    _golden(f"slurm-{job}-pyxis.sbatch", _render(job, "pyxis").text)


def test_podman_mode_is_docker_mode_with_podmans_own_commands():
    """Issue 42: a Slurm site whose nodes run Podman. The task is docker mode's, each
    container command podman's (run, inspect, rm, stop, logs, wait), and nothing else differs."""
    docker, podman = _render("ddp-smoke", "docker").text, _render("ddp-smoke", "podman").text
    task = podman.split("<<'CLUSTERCTL_TASK_END' || true\n", 1)[1].split("CLUSTERCTL_TASK_END\n", 1)[0]
    for word in ("run", "inspect", "rm", "stop", "logs", "wait"):
        assert f"podman {word} " in task, word
    assert "docker" not in task.replace("docker mode", ""), task
    # podman refuses --shm-size beside --ipc=host (docker ignores it there): left out
    assert "--ipc=host" in docker and "  --shm-size=1g \\\n" in docker
    assert podman.replace("podman", "docker") == docker.replace("  --shm-size=1g \\\n", "")


@pytest.mark.parametrize("container", ["docker", "podman", "pyxis"])
def test_script_is_valid_bash(container, tmp_path):
    """bash -n parses every script (the heredoc task too)."""
    script = _render("ddp-smoke", container).text
    task = script.split("<<'CLUSTERCTL_TASK_END' || true\n", 1)[1].split("CLUSTERCTL_TASK_END\n", 1)[0]
    for name, text in (("batch", script), ("task", task)):
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_environment_contract_comes_from_slurm_variables():
    text = _render("ddp-smoke", "docker").text
    assert 'CLUSTERCTL_MASTER_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"' in text
    assert 'CLUSTERCTL_MASTER_PORT="$((SLURM_JOB_ID % 4536 + 61000))"' in text
    for line in ('-e NODE_RANK="${SLURM_NODEID}"', '-e NNODES="${SLURM_NNODES}"',
                 '-e PET_NODE_RANK="${SLURM_NODEID}"', '-e MASTER_ADDR="${CLUSTERCTL_MASTER_ADDR}"',
                 '-e PET_MASTER_PORT="${CLUSTERCTL_MASTER_PORT}"', '--node-rank="${SLURM_NODEID}"'):
        assert line in text
    assert "srun --kill-on-bad-exit=1 --label --ntasks-per-node=1" in text
    assert "--rm" not in text
    assert "--label io.clusterctl.node=\"${SLURMD_NODENAME}\"" in text


def test_task_expands_runtime_values_in_a_real_shell(tmp_path):
    """The rendered command line, run by bash with Slurm's variables set, gives each word
    exactly: literal parts untouched (even shell syntax), runtime parts filled."""
    word = shell_word("--x=$(touch /tmp/pwned)'\"" + "\x00SLURM_NODEID\x00" + "-end")
    out = subprocess.run(["bash", "-c", f"printf '%s' {word}"], env={"SLURM_NODEID": "2"},
                         capture_output=True, text=True, check=True).stdout
    assert out == "--x=$(touch /tmp/pwned)'\"2-end"


def test_secrets_are_named_never_valued():
    script = _render("ddp-smoke", "docker", overrides={"HF_TOKEN": "s3cr3t-value"})
    assert "s3cr3t-value" not in script.text
    assert script.environment == {"HF_TOKEN": "s3cr3t-value"}
    assert "  -e HF_TOKEN \\\n" in script.text
    pyxis = _render("ddp-smoke", "pyxis", overrides={"HF_TOKEN": "s3cr3t-value"})
    assert "s3cr3t-value" not in pyxis.text and "HF_TOKEN" in pyxis.text


def test_inventory_gives_nodelist_and_interface(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(textwrap.dedent("""\
        defaults: {interface: eth7, slots: 2}
        nodes:
          - {name: node1, host: 10.0.0.1}
          - {name: node2, host: 10.0.0.2}
        """))
    inventory = load_inventory(inv)
    options = check_options(nodelist=inventory.names)
    text = render_script(load_job("ddp-smoke"), options, run_id="r", run_dir="/r",
                         inventory=inventory).text
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --nodelist=node1,node2\n" in text
    assert "-e GLOO_SOCKET_IFNAME=eth7" in text and "-e NCCL_SOCKET_IFNAME=eth7" in text
    assert "--add-host" not in text                      # no addresses given: none
    text = render_script(load_job("ddp-smoke"), options, run_id="r", run_dir="/r",
                         inventory=inventory, addresses={"node1": "10.0.0.1", "node2": "10.0.0.2"}).text
    for entry in ("node1:10.0.0.1", "node1:::ffff:10.0.0.1", "node2:10.0.0.2", "node2:::ffff:10.0.0.2"):
        assert f"--add-host={entry}" in text                 # as in an SSH launch (c10d's names)


def test_unlike_nodes_are_refused(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: a, host: 10.0.0.1, env: {X: \"1\"}}\n  - {name: b, host: 10.0.0.2}\n")
    inventory = load_inventory(inv)
    with pytest.raises(UserError, match="node b differs from a"):
        render_script(load_job("ddp-smoke"), check_options(nodelist=inventory.names),
                      run_id="r", run_dir="/r", inventory=inventory)


@pytest.mark.parametrize(("kw", "message"), [
    ({"nnodes": 0}, "--nnodes 0 is not a node count; valid: a whole number from 1 to 100,000"),
    ({"nnodes": 100_001}, "--nnodes 100001 is not a node count; valid: a whole number from 1 to 100,000"),
    ({"nnodes": 2, "time": "99999999999999"}, "is not a Slurm time limit"),    # past 365 days
    ({"nnodes": 2, "time": "366-0"}, "is not a Slurm time limit"),
    ({"nnodes": 2, "time": "1-24"}, "is not a Slurm time limit"),              # hours after days
    ({"nnodes": 2, "time": "1-99:99:99"}, "is not a Slurm time limit"),
    ({"nnodes": 2, "time": "2:60:00"}, "is not a Slurm time limit"),
    ({"nnodes": 2, "time": "\uff13\uff10"}, "is not a Slurm time limit"),      # full-width digits
    ({"nnodes": 2, "partition": "p" * 5000}, "... (5000 characters)"),        # cut, not echoed whole
    ({"nnodes": 2, "time": "ten minutes"}, "--time 'ten minutes' is not a Slurm time limit; valid:"),
    ({"nnodes": 2, "time": "1:2:3:4"}, "is not a Slurm time limit"),
    ({"nnodes": 2, "container": "rkt"}, "--container 'rkt' is not a container mode; valid: docker, podman or pyxis"),
    ({"nnodes": 2, "partition": "a b"}, "--partition 'a b' is not a partition name"),
    ({}, "--scheduler slurm needs the node count: --nnodes N"),
    ({"nnodes": 3, "nodelist": ["a", "b"]}, "--nnodes 3 disagrees with the inventory's 2 nodes"),
])
def test_bad_options_are_user_errors(kw, message):
    with pytest.raises(UserError) as e:
        check_options(**kw)
    assert message in str(e.value)


@pytest.mark.parametrize("time", ["30", "30:00", "1:00:00", "2-0", "2-12:00", "2-12:00:00", "UNLIMITED",
                                  "525600", "365-0", "90:00", "100:30:00"])
def test_good_times(time):
    assert check_options(nnodes=1, time=time).time == time


def test_shell_word_quotes_plain_values():
    assert shell_word("a b") == shlex.quote("a b")
    assert shell_word("plain") == "plain"


# --------------------------------------------------------------------------- recovery (issue 22)

RESTARTS = {"max_restarts": 2, "retry_on_exit": [75], "fatal_on_exit": [3, 7],
            "checkpoint": "/shared/ckpt"}


def _render_job(job: str, container: str, given: dict | None = None, **kw):
    options = check_options(nnodes=kw.pop("nnodes", 3), partition=kw.pop("partition", "debug"),
                            time=kw.pop("time", "30:00"), container=container)
    return render_script(load_job(job, given), options, run_id="golden-run",
                         run_dir=kw.pop("run_dir", RUN_DIR), **kw)


def test_restarts_script_matches_golden():
    """max_restarts, retry_on_exit, fatal_on_exit and checkpoint: --requeue, the requeue step."""
    _golden("slurm-ddp-smoke-restarts-docker.sbatch", _render_job("ddp-smoke", "docker", RESTARTS).text)


@pytest.mark.parametrize("container", ["docker", "pyxis"])
def test_attempt_is_slurms_restart_count_in_every_task_not_a_fixed_zero(container):
    text = _render_job("ddp-smoke", container).text
    assert 'CLUSTERCTL_ATTEMPT="${SLURM_RESTART_COUNT:-0}"' in text
    assert "CLUSTERCTL_ATTEMPT=0" not in text
    assert ('-e CLUSTERCTL_ATTEMPT="${CLUSTERCTL_ATTEMPT}"' if container == "docker"
            else 'export CLUSTERCTL_ATTEMPT="${CLUSTERCTL_ATTEMPT}"') in text
    assert "CLUSTERCTL_RUN_ID=golden-run" in text
    # no restarts asked: no --requeue, and the script ends with srun's own status
    assert "--requeue" not in text and "scontrol requeue" not in text
    assert text.rstrip().endswith('"$CLUSTERCTL_TASK"')


@pytest.mark.parametrize("container", ["docker", "pyxis"])
def test_checkpoint_is_mounted_at_its_own_path_and_named(container):
    text = _render_job("ddp-smoke", container, {"checkpoint": "/shared/ckpt"}).text
    assert ("-v /shared/ckpt:/shared/ckpt" if container == "docker"
            else "--container-mounts=/srv/clusterctl/runs/golden-run:/srv/clusterctl/runs/golden-run,"
                 "/shared/ckpt:/shared/ckpt") in text
    assert "CLUSTERCTL_CHECKPOINT_DIR=/shared/ckpt" in text


def test_restarts_in_pyxis_mode_too():
    text = _render_job("ddp-smoke", "pyxis", RESTARTS).text
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in text
    assert 'sh -c "$CLUSTERCTL_TASK" && code=0 || code=$?\n' in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_parse_attempt_mark():
    assert parse_attempt_mark("[clusterctl] attempt 2 on node1,node3") == (2, ["node1", "node3"])
    assert parse_attempt_mark("[clusterctl] requeue: attempt 0 failed (exit 1), restart 1/2") is None
    assert parse_attempt_mark("0: [clusterctl] attempt 1 on x") is None


# The batch script run by a real bash with stand-ins for srun and scontrol (no Slurm needed
# for its control flow; tests/run/test_slurm_launch.py runs it on a real Slurm).
FAKE_SRUN = """#!/bin/sh
# stand-in srun: the tasks' records of this scenario, then its exit status
echo "$CLUSTERCTL_ATTEMPT" > "$FAKE_DIR/srun-attempt"
[ -n "$FAKE_RECORDS" ] && printf '%s\\n' "$FAKE_RECORDS" | while IFS='|' read -r node code stopped; do
  printf '{"node": "%s", "rank": 0, "exit_code": %s, "finished": "2026-11-26T06:00:00Z", "stopped": %s, "slurm_job": "42", "attempt": %s}\\n' \\
    "$node" "$code" "$stopped" "$CLUSTERCTL_ATTEMPT" > "$CLUSTERCTL_RUN_DIR/slurm/$node.json"
done
exit "$FAKE_SRUN_EXIT"
"""
FAKE_SCONTROL = """#!/bin/sh
case "$1 $2" in
  "show hostnames") printf 'node1\\nnode2\\n' ;;
  "-o show") echo "NodeName=$4 NodeAddr=10.0.0.1 State=IDLE" ;;
  "requeue "*) echo "$2" >> "$FAKE_DIR/requeued" ;;
esac
"""


def _run_batch(tmp_path, *, restart_count: int, srun_exit: int, records: str,
               stop_request: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
    run_dir = tmp_path / "run"
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    if stop_request:
        (run_dir / "stop-request.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "sbatch.sh"
    script.write_text(_render_job("ddp-smoke", "docker", RESTARTS, run_dir=str(run_dir)).text)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_DIR": str(tmp_path), "FAKE_RECORDS": records,
           "FAKE_SRUN_EXIT": str(srun_exit), "SLURM_JOB_ID": "42", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "node[1-2]"}
    if restart_count:
        env["SLURM_RESTART_COUNT"] = str(restart_count)
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    requeued = tmp_path / "requeued"
    return res, requeued.read_text().split() if requeued.exists() else []


def test_a_failed_attempt_requeues_its_own_job(tmp_path):
    res, requeued = _run_batch(tmp_path, restart_count=0, srun_exit=143,
                               records="node1|1|false\nnode2|143|true")
    assert requeued == ["42"], res.stdout + res.stderr
    assert res.returncode == 143
    assert "[clusterctl] attempt 0 on node1,node2\n" in res.stdout
    assert "[clusterctl] requeue: attempt 0 failed (exit 143), restart 1/2" in res.stdout
    assert (tmp_path / "srun-attempt").read_text().strip() == "0"


def test_the_next_attempt_moves_the_last_ones_records_aside_and_knows_its_number(tmp_path):
    _run_batch(tmp_path, restart_count=0, srun_exit=143, records="node1|1|false\nnode2|143|true")
    res, requeued = _run_batch(tmp_path, restart_count=1, srun_exit=0,
                               records="node1|0|false\nnode2|0|false")
    assert res.returncode == 0 and requeued == ["42"]          # only attempt 0's requeue
    assert (tmp_path / "srun-attempt").read_text().strip() == "1"
    assert "[clusterctl] attempt 1 on node1,node2\n" in res.stdout
    slurm = tmp_path / "run" / "slurm"
    assert sorted(p.name for p in (slurm / "attempt-0").iterdir()) == ["node1.json", "node2.json"]
    assert '"exit_code": 1,' in (slurm / "attempt-0" / "node1.json").read_text()
    assert '"attempt": 1}' in (slurm / "node1.json").read_text()


@pytest.mark.parametrize(("case", "kw", "said"), [
    ("fatal code", {"restart_count": 0, "srun_exit": 143, "records": "node1|143|true\nnode2|7|false"},
     "[clusterctl] no requeue: a rank exited with a code of fatal_on_exit (3, 7)"),
    ("restarts used up", {"restart_count": 2, "srun_exit": 1, "records": "node1|1|false"},
     "[clusterctl] no requeue: attempt 2 failed (exit 1), restarts used up (2/2)"),
    ("clusterctl stop", {"restart_count": 0, "srun_exit": 143, "records": "node1|143|true",
                         "stop_request": True}, "[clusterctl] no requeue: clusterctl stop ended the run"),
    ("success", {"restart_count": 0, "srun_exit": 0, "records": "node1|0|false"}, ""),
])
def test_no_requeue_when_fatal_used_up_stopped_or_succeeded(tmp_path, case, kw, said):
    res, requeued = _run_batch(tmp_path, **kw)
    assert requeued == [], case
    assert res.returncode == kw["srun_exit"]
    assert said in res.stdout
    assert "] requeue: attempt" not in res.stdout


def test_a_fatal_code_of_a_stopped_rank_is_not_its_own(tmp_path):
    """Ranks that srun stopped (137/143, "stopped": true) say nothing about fatal_on_exit."""
    res, requeued = _run_batch(tmp_path, restart_count=0, srun_exit=143,
                               records="node1|3|true\nnode2|1|false")
    assert requeued == ["42"], res.stdout + res.stderr


# --------------------------------------------------------------------------- images in a registry

@pytest.mark.parametrize(("image", "uri"), [
    ("127.0.0.1:5000/cpu@sha256:" + "a" * 64, "127.0.0.1:5000#cpu@sha256:" + "a" * 64),
    ("registry.example:5000/team/cpu:2.13.0", "registry.example:5000#team/cpu:2.13.0"),
    ("localhost/cpu:1", "localhost#cpu:1"),
    ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),   # already enroot's
    ("clusterctl/cpu:2.13.0", "clusterctl/cpu:2.13.0"),        # no registry part: Docker's rule
    ("ubuntu", "ubuntu"),
])
def test_enroot_image_puts_a_hash_after_the_registry(image, uri):
    from clusterctl.run.slurm.script import enroot_image
    assert enroot_image(image) == uri


@pytest.mark.parametrize("container", ["docker", "pyxis"])
def test_a_pinned_image_is_what_every_task_runs(container):
    pinned = "registry.example:5000/team/cpu@sha256:" + "b" * 64
    text = _render("ddp-smoke", container, image=pinned).text
    if container == "pyxis":
        assert f"--container-image=registry.example:5000#team/cpu@sha256:{'b' * 64}" in text
    else:
        assert shlex.quote(pinned) in text or pinned in text
