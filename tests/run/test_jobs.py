"""Job specs: the shipped jobs load, and every kind of bad job file is refused
with FILE:LINE: key, what is valid, and exit status 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from clusterctl.core import paths
from clusterctl.core.errors import UserError
from clusterctl.image import targets
from clusterctl.run import jobs
from clusterctl.run.jobs import load_job
from tests.fixtures import JOBS


def write_job(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load_error(tmp_path: Path, text: str) -> UserError:
    path = write_job(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_job(path)
    assert info.value.exit_code == 2
    assert str(path) in info.value.message
    return info.value


# --------------------------------------------------------------------------- shipped jobs

def test_shipped_jobs_are_bert_and_ddp_smoke_and_all_load():
    shipped = jobs.shipped_jobs()
    assert {"bert", "ddp-smoke"} <= set(shipped)
    for job in jobs.list_jobs():
        assert job.command and (job.target or job.image)
        assert job.target is None or job.target in targets.target_names()
        assert job.path.parent == paths.jobs_dir()


def test_bert_job_follows_the_seed():
    job = load_job("bert")
    assert (job.target, job.contract, job.nproc_per_node) == ("accl", "accl-bert", "slots")
    assert job.command == ["/workspace/BERT/run_pretraining.sh"]
    assert job.env == {"PHASE": "1", "BATCH_SIZE": "384", "BACKEND": "{backend}", "ACCL_LOG_LEVEL": "INFO"}
    assert job.params == {"BERT_DIR": "/home/accl/BERT"}
    assert job.mounts == ["{BERT_DIR}:/workspace/BERT"]


def test_a_job_is_found_by_path_too(tmp_path):
    path = write_job(tmp_path, """
        image: example/img:1
        command: [echo, hi]
    """, name="mine.yaml")
    job = load_job(str(path))
    assert (job.name, job.path, job.image, job.command) == ("mine", path, "example/img:1", ["echo", "hi"])
    assert job.nproc_per_node == "slots" and job.contract == "torchrun"


def test_unknown_job_name_suggests_the_close_one():
    with pytest.raises(UserError) as info:
        load_job("bret")
    assert 'did you mean "bert"' in info.value.message
    assert "ddp-smoke" in info.value.message and info.value.exit_code == 2


def test_missing_job_file_is_named():
    with pytest.raises(UserError, match="does-not-exist.yaml does not exist"):
        load_job("/nonexistent/does-not-exist.yaml")


def test_env_and_params_are_text_exactly_as_written(tmp_path):
    path = write_job(tmp_path, """
        image: x
        command: [sleep, 30, true]
        env:
          PHASE: 1
          FLAG: yes
          MASK: 0755
          RATIO: 1.50
        params:
          N: 08
    """)
    job = load_job(path)
    assert job.command == ["sleep", "30", "true"]
    assert job.env == {"PHASE": "1", "FLAG": "yes", "MASK": "0755", "RATIO": "1.50"}
    assert job.params == {"N": "08"}


# --------------------------------------------------------------------------- bad files

def test_unknown_placeholder_names_file_line_and_key(tmp_path):
    err = load_error(tmp_path, """
        image: x
        command: [run]
        env:
          OK: "{node_rank}"
          WORLD: "{wrld_size}"
    """)
    assert ":5: env.WORLD" in err.message
    assert "{wrld_size}" in err.message
    assert 'did you mean "world_size"' in err.message
    assert "{master_addr}" in err.message  # lists what is valid


def test_unknown_placeholder_in_command_and_mounts(tmp_path):
    err = load_error(tmp_path, """
        image: x
        command:
          - run
          - --rank={rank}
    """)
    assert ":4: command.1" in err.message and "{rank}" in err.message
    err = load_error(tmp_path, """
        image: x
        params: {DATA: /data}
        mounts: ["{DATAA}:/data"]
        command: [run]
    """)
    assert ":3: mounts.0" in err.message and 'did you mean "DATA"' in err.message


def test_literal_braces_and_format_specs(tmp_path):
    job = load_job(write_job(tmp_path, """
        image: x
        command: [python3, -c, "print({{1: 2}})"]
    """))
    assert jobs.expand(job.command[2], {}) == "print({1: 2})"
    err = load_error(tmp_path, """
        image: x
        command: ["{node_rank:>3}"]
    """)
    assert ":2: command.0" in err.message and "format spec" in err.message
    err = load_error(tmp_path, """
        image: x
        command: ["python3 -c 'print(1}'"]
    """)
    assert ":2: command.0" in err.message and "literal braces" in err.message


def test_unknown_key_is_refused_with_the_valid_keys(tmp_path):
    err = load_error(tmp_path, """
        image: x
        command: [run]
        enviroment: {A: b}
    """)
    assert ":3: enviroment: unknown key `enviroment`" in err.message
    assert "valid: one of description, target" in err.message and "env" in err.message


@pytest.mark.parametrize("body, where, fragment", [
    ("image: x\ncommand: run\n", ":2: command", "list of strings"),
    ("image: x\ncommand: []\n", ":2: command", "non-empty"),
    ("image: x\ncommand: [run, [5]]\n", ":2: command.1", "string"),
    ("image: x\ncommand: [run]\nnproc_per_node: 0\n", ":3: nproc_per_node", "at least 1"),
    ("image: x\ncommand: [run]\nnproc_per_node: lots\n", ":3: nproc_per_node", '"slots"'),
    ("image: x\ncommand: [run]\ncontract: mpirun\n", ":3: contract", "torchrun"),
    ("image: x\ncommand: [run]\nenv:\n  1BAD: x\n", ":4: env.1BAD", "valid variable name"),
    ("image: x\ncommand: [run]\nenv:\n  A: [1, 2]\n", ":4: env.A", "mapping NAME: value"),
    ("image: x\ncommand: [run]\nenv:\n  A:\n", ":4: env.A", "mapping NAME: value"),
    ("image: x\ncommand: [run]\ndocker_args: [--cap-add=IPC_LOCK, --rm]\n", ":3: docker_args.1", "--rm"),
    ("image: x\ncommand: [run]\ndocker_args: [--name=mine]\n", ":3: docker_args.0", "--name"),
    ("image: x\ncommand: [run]\nmounts: [/data]\n", ":3: mounts.0", "HOST:CONTAINER"),
    ("image: x\ncommand: [run]\nmounts: [/a:data]\n", ":3: mounts.0", "absolute"),
    ("image: x\ncommand: [run]\nmounts: [/a:/b:rx]\n", ":3: mounts.0", "ro or rw"),
    ("image: x\ncommand: [run]\nsecrets: [OK, bad-name]\n", ":3: secrets.1", "valid variable name"),
    ("image: x\ncommand: [run]\nparams: {node_rank: 1}\n", ":3: params.node_rank", "launch value"),
    ("target: cpuu\ncommand: [run]\n", ":1: target", 'did you mean "cpu"'),
    ("image: x\ncommand: [run]\nhang_timeout: 10x\n", ":3: hang_timeout", "a duration such as 90s, 10m, 1h30m"),
    ("image: x\ncommand: [run]\nhang_timeout: 0\n", ":3: hang_timeout", "not more than 0 seconds"),
    ("image: x\ncommand: [run]\nhang_timeout: [10m]\n", ":3: hang_timeout", "a duration such as 90s"),
])
def test_bad_values_name_line_key_and_what_is_valid(tmp_path, body, where, fragment):
    err = load_error(tmp_path, body)
    assert where in err.message, err.message
    assert fragment in err.message, err.message


def test_hang_timeout_is_a_duration_in_seconds(tmp_path):
    for text, seconds in (("10m", 600.0), ("90", 90.0), ("1h30m", 5400.0)):
        path = tmp_path / "j.yaml"
        path.write_text(f"image: x\ncommand: [run]\nhang_timeout: {text}\n")
        assert jobs.load_job(path).hang_timeout == seconds
    assert jobs.load_job("ddp-smoke").hang_timeout is None   # no watchdog unless asked


def test_missing_command_and_missing_image(tmp_path):
    err = load_error(tmp_path, "image: x\n")
    assert ":1: command: is missing; valid: a non-empty list of strings" in err.message
    err = load_error(tmp_path, "command: [run]\n")
    assert "`target`" in err.message and "`image`" in err.message


def test_invalid_yaml_and_non_mapping(tmp_path):
    err = load_error(tmp_path, "image: x\ncommand: [run\nenv: {}\n")
    assert ":3: (YAML syntax): " in err.message and "flow sequence that began on line 2" in err.message
    assert "valid: YAML as in the shipped jobs/ddp-smoke.yaml" in err.message
    err = load_error(tmp_path, "- just\n- a list\n")
    assert "YAML mapping" in err.message


def test_fail_rank_test_job_is_valid():
    job = load_job(JOBS / "fail-rank.yaml")
    assert job.nproc_per_node == 1 and job.env == {"FAIL_AFTER": "3", "FAIL_RANK": "1"}
    assert "sys.exit(3)" in job.command[-1]


def test_all_problems_of_a_file_are_reported_at_once_in_line_order(tmp_path):
    err = load_error(tmp_path, """
        target: cpuu
        contract: horovod
        docker_args: [--rm]
        command: ["{rank}"]
        env:
          GOOD: "{node_rank}"
          BAD: "{nodes}"
    """)
    lines = err.message.splitlines()
    assert lines[0].endswith("5 problems in the job file (nothing was started):")
    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in lines[1:]] == ["1", "2", "3", "4", "7"]
    assert "target" in lines[1] and "contract" in lines[2] and "--rm" in lines[3]
    assert "{rank}" in lines[4] and "{nodes}" in lines[5]
    err = load_error(tmp_path, """
        image: 5
        command: run
        nproc_per_node: lots
    """)
    assert len(err.message.splitlines()) == 4 and ":3: nproc_per_node" in err.message


def test_a_repeated_key_is_a_problem_not_silently_the_last(tmp_path):
    err = load_error(tmp_path, """
        image: x
        command: [run]
        env:
          PHASE: 1
          BATCH_SIZE: 8
          PHASE: 2
    """)
    assert ":6: env.PHASE: is written twice (first on line 4;" in err.message
    assert "valid: each key once per mapping" in err.message


def test_a_directory_is_not_a_job(tmp_path):
    with pytest.raises(UserError, match="is not a file"):
        load_job(str(tmp_path))


def test_merge_keys_as_in_inventories_with_lines_at_the_merged_definition(tmp_path):
    job = load_job(write_job(tmp_path, """
        image: x
        env: &common
          PHASE: 1
          MODE: fast
        params:
          <<: *common
          MODE: slow
        command: [run]
    """))
    assert job.env == {"PHASE": "1", "MODE": "fast"}
    assert job.params == {"PHASE": "1", "MODE": "slow"}  # own keys win; merged values are text as written
    assert job.where("params.PHASE").endswith(":3: params.PHASE")
    assert job.where("params.MODE").endswith(":7: params.MODE")
    err = load_error(tmp_path, """
        image: x
        env: &common {1BAD: x}
        params: {<<: *common}
        command: [run]
    """)
    assert ":2: env.1BAD: not a valid variable name" in err.message
    assert ":2: params.1BAD: not a valid variable name" in err.message


def test_every_problem_reads_file_line_field_problem_and_what_is_valid(tmp_path):
    err = load_error(tmp_path, "image: x\ncommand: [run]\ncontract: mpirun\n")
    path = tmp_path / "job.yaml"
    assert err.message.splitlines() == [
        f"{path}: 1 problem in the job file (nothing was started):",
        f'{path}:3: contract: unknown contract "mpirun" (did you mean "mpi"?); '
        'valid: one of torchrun, accl-bert, mpi or deepspeed',
    ]
    err = load_error(tmp_path, "target: cpuu\ncommand: [run]\ndocker_args: [--rm]\n")
    assert all("; valid: " in line for line in err.message.splitlines()[1:]), err.message


def test_an_alias_bomb_is_refused(tmp_path):
    text = "image: x\ncommand: [run]\nparams:\n  A0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  A{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=r"bomb.yaml:\d+: \(YAML\): holds more than"):
        load_job(path)
