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
from clusterctl.run.slurm.script import render_script, shell_word
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


@pytest.mark.parametrize("container", ["docker", "pyxis"])
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
    ({"nnodes": 0}, "--nnodes 0 is not a node count; valid: a whole number >= 1"),
    ({"nnodes": 2, "time": "ten minutes"}, "--time 'ten minutes' is not a Slurm time limit; valid:"),
    ({"nnodes": 2, "time": "1:2:3:4"}, "is not a Slurm time limit"),
    ({"nnodes": 2, "container": "podman"}, "--container 'podman' is not a container mode; valid: docker or pyxis"),
    ({"nnodes": 2, "partition": "a b"}, "--partition 'a b' is not a partition name"),
    ({}, "--scheduler slurm needs the node count: --nnodes N"),
    ({"nnodes": 3, "nodelist": ["a", "b"]}, "--nnodes 3 disagrees with the inventory's 2 nodes"),
])
def test_bad_options_are_user_errors(kw, message):
    with pytest.raises(UserError) as e:
        check_options(**kw)
    assert message in str(e.value)


@pytest.mark.parametrize("time", ["30", "30:00", "1:00:00", "2-0", "2-12:00", "2-12:00:00", "UNLIMITED"])
def test_good_times(time):
    assert check_options(nnodes=1, time=time).time == time


def test_shell_word_quotes_plain_values():
    assert shell_word("a b") == shlex.quote("a b")
    assert shell_word("plain") == "plain"
