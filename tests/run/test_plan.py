"""The launch plan: per-node env and docker run argv, checked against seeds/003,
the precedence rules, secrets, interfaces and bad input; and, on the real local
Docker engine, that the planned argv delivers every value exactly."""

from __future__ import annotations

import json
import os
import shlex
import textwrap
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.sshconfig import resolve_host
from clusterctl.cluster.transport import Cluster, command_line
from clusterctl.core.errors import UserError
from clusterctl.image import targets
from clusterctl.run import recovery
from clusterctl.run.jobs import load_job
from clusterctl.run.launch import local_facts, new_record
from clusterctl.run.plan import (
    MASK,
    check_inputs,
    job_device,
    job_devices,
    make_plan,
    mask_env,
    mask_text,
    masked,
    node_devices,
    node_processes,
    parse_sets,
    plan_record,
    render_dry_run,
    secret_values,
)
from tests.fixtures import JOBS

# seeds/003 (ACCL BERT), the two per-node command lines exactly as published.
SEED_NODE0 = ("docker run --name=bert_accl_test-0 --rm -it --net=host --gpus=all --shm-size=8g "
              "--device=/dev/infiniband --ulimit memlock=-1:-1 -e MASTER_ADDR=10.35.110.11 "
              "-e MASTER_PORT=29500 -e RANK=0 -e WORLD_SIZE=2 -e NPROC_PER_NODE=8 -e PHASE=1 "
              "-e BATCH_SIZE=384 -e BACKEND=accl -e ACCL_LOG_LEVEL=INFO "
              "registry.cn-hangzhou.aliyuncs.com/eflops/pytorch:22.02py38 /PATH/TO/BERT/run_pretraining.sh")
SEED_NODE1 = SEED_NODE0.replace("bert_accl_test-0", "bert_accl_test-1").replace("RANK=0", "RANK=1")
SEED_MOUNT = "/home/accl/BERT:/workspace/BERT"   # "-v/home/accl/BERT:/workspace/BERT" in the seed text


def seed_parts(line: str) -> tuple[dict[str, str], list[str]]:
    """(env, run flags) of a seed command line; --name/--rm/-it are the user's interactive choices."""
    argv = shlex.split(line)[2:-2]
    env, flags, i = {}, [], 0
    while i < len(argv):
        if argv[i] == "-e":
            k, _, v = argv[i + 1].partition("=")
            env[k] = v
            i += 2
            continue
        if argv[i] == "--ulimit":
            flags.append(f"--ulimit {argv[i + 1]}")
            i += 2
            continue
        if not argv[i].startswith(("--name=", "--rm", "-it")):
            flags.append(argv[i])
        i += 1
    return env, flags


def argv_env(argv: list[str]) -> dict[str, str]:
    out = {}
    for i, a in enumerate(argv):
        if a == "-e":
            k, _, v = argv[i + 1].partition("=")
            out[k] = v
    return out


def argv_flags(argv: list[str]) -> list[str]:
    """docker run options before the image, with two-token options joined."""
    joined, i = [], 0
    while i < len(argv):
        if argv[i] in ("--ulimit", "-v", "--name", "--label", "-e", "--env-file"):
            joined.append(f"{argv[i]} {argv[i + 1]}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return joined


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.fixture
def two_nodes(tmp_path):
    return load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: lingjun-a, host: 10.35.110.11, slots: 8}
          - {name: lingjun-b, host: 10.35.110.12, slots: 8}
    """))


# --------------------------------------------------------------------------- seeds/003

def test_bert_plan_gives_the_seed_env_and_flags_on_each_node(two_nodes):
    plans = make_plan(load_job("bert"), two_nodes, run_id="r1")
    assert [(p.node, p.host, p.rank) for p in plans] == [
        ("lingjun-a", "10.35.110.11", 0), ("lingjun-b", "10.35.110.12", 1)]
    for plan, seed in zip(plans, (SEED_NODE0, SEED_NODE1), strict=True):
        seed_env, seed_flags = seed_parts(seed)
        # every seed variable, with the seed's value, in the env AND on the command line
        assert {k: plan.env[k] for k in seed_env} == seed_env
        assert {k: argv_env(plan.argv)[k] for k in seed_env} == seed_env
        # the rest is the torchrun-compatible set every launch adds, nothing else
        extra = {k: v for k, v in plan.env.items() if k not in seed_env}
        rank = str(plan.rank)
        assert extra == {"NODE_RANK": rank, "NNODES": "2", "PET_NNODES": "2", "PET_NODE_RANK": rank,
                         "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "10.35.110.11",
                         "PET_MASTER_PORT": "29500", **recovery.environment("r1", 0, (), None)}
        flags = argv_flags(plan.argv)
        for flag in seed_flags:
            assert flag in flags, flag
        assert f"-v {SEED_MOUNT}" in flags
        assert plan.argv[:3] == ["docker", "run", "-d"]
        assert plan.argv[-2:] == [targets.resolve("accl").tag, "/workspace/BERT/run_pretraining.sh"]
        assert "--rm" not in plan.argv and plan.stdin is None and not plan.secrets
        assert plan.container == f"r1-{plan.node}"
        assert f"--name {plan.container}" in flags
        for key, value in (("run", "r1"), ("job", "bert"), ("node", plan.node), ("rank", rank)):
            assert f"--label io.clusterctl.{key}={value}" in flags


def test_set_phase_and_bert_dir(two_nodes):
    plans = make_plan(load_job("bert"), two_nodes, run_id="r1",
                      overrides=parse_sets(["PHASE=2", "BERT_DIR=/data/BERT", "BATCH_SIZE=64"]))
    for p in plans:
        assert (p.env["PHASE"], p.env["BATCH_SIZE"]) == ("2", "64")
        assert "-e PHASE=2" in argv_flags(p.argv)
        assert "-v /data/BERT:/workspace/BERT" in argv_flags(p.argv)
        assert "BERT_DIR" not in p.env        # a job parameter, not container env
    with pytest.raises(UserError) as info:
        make_plan(load_job("bert"), two_nodes, run_id="r1", overrides={"BERT_DIR": "relative/BERT"})
    assert "bert.yaml:" in info.value.message and "mounts.0" in info.value.message
    assert "absolute" in info.value.message and info.value.exit_code == 2


def test_image_override_and_devices_from_inventory(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: a, host: 10.0.0.1, slots: 8, devices: [/dev/infiniband, /dev/nvidia-caps]}
    """))
    [p] = make_plan(load_job("bert"), inv, run_id="r", image="my/bert:7",
                    extra_docker_args=["--cap-add=IPC_LOCK"])
    assert p.argv.count("--device=/dev/infiniband") == 1   # target and inventory both list it
    assert "--device=/dev/nvidia-caps" in p.argv and "--cap-add=IPC_LOCK" in p.argv
    assert p.argv.count("--net=host") == 1
    assert p.argv[-2] == "my/bert:7"
    with pytest.raises(UserError, match="--rm"):
        make_plan(load_job("bert"), inv, run_id="r", extra_docker_args=["--rm"])


def test_per_slot_devices_come_from_the_target_data(tmp_path):
    """The target's devices (per slot where the stack says) then the node's own."""
    job = load_job(write(tmp_path, "job.yaml", """
        target: cambricon
        command: [run]
    """))
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: a, host: 10.0.0.1, slots: 4, devices: [/dev/cambricon_ipcm0]}
          - {name: b, host: 10.0.0.2, slots: 2}
    """))
    run = targets.get_target("cambricon").run
    a, b = make_plan(job, inv, run_id="r")
    assert [x for x in a.argv if x.startswith("--device=")] == \
        [f"--device={d}" for d in [*run.devices_for(4), "/dev/cambricon_ipcm0"]]
    assert [x for x in b.argv if x.startswith("--device=")] == [f"--device={d}" for d in run.devices_for(2)]
    assert "--device=/dev/cambricon_dev3" in a.argv and "--device=/dev/cambricon_dev2" not in b.argv
    assert all(f in a.argv for f in run.flags if f != "--net=host")
    # known before any plan exists (preflight checks them), and carried by the plan
    assert node_devices(job, inv.nodes[0]) == a.devices == [*run.devices_for(4), "/dev/cambricon_ipcm0"]
    assert node_devices(load_job("ddp-smoke"), inv.nodes[1]) == []


def test_devices_in_a_jobs_own_docker_args_are_checked_by_preflight_too(tmp_path):
    """Preflight checks the devices before any plan exists: the job's own --device args count."""
    job = load_job(write(tmp_path, "job.yaml", """
        image: x
        params: {DEV: /dev/fuse}
        docker_args: ["--device=/dev/kvm", "--device", "/dev/net/tun:/dev/net/tun:rwm", "--device={DEV}"]
        command: [run]
    """))
    assert job_devices(job) == ["/dev/kvm", "/dev/net/tun:/dev/net/tun:rwm"]
    assert job_devices(load_job("ddp-smoke")) == []


def test_docker_args_from_params_are_checked_after_expansion(tmp_path, two_nodes):
    job = load_job(write(tmp_path, "job.yaml", """
        image: x
        params: {EXTRA: --cap-add=IPC_LOCK}
        docker_args: ["{EXTRA}"]
        command: [run]
    """))
    assert "--cap-add=SYS_NICE" in make_plan(job, two_nodes, run_id="r",
                                             overrides={"EXTRA": "--cap-add=SYS_NICE"})[0].argv
    with pytest.raises(UserError) as info:
        make_plan(job, two_nodes, run_id="r", overrides={"EXTRA": "--rm"})
    assert ":3: docker_args.0" in info.value.message and "--rm" in info.value.message


# --------------------------------------------------------------------------- ddp-smoke

def test_ddp_smoke_torchrun_command_per_node(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        master_port: 29611
        nodes:
          - {name: node1, host: 10.213.0.11}
          - {name: node2, host: 10.213.0.12}
          - {name: node3, host: 10.213.0.13}
    """))
    plans = make_plan(load_job("ddp-smoke"), inv, run_id="smoke")
    for p in plans:
        cmd = p.argv[p.argv.index(targets.resolve("cpu").tag) + 1:]
        assert cmd == ["torchrun", "--nnodes=3", f"--node-rank={p.rank}", "--nproc-per-node=2",
                       "--master-addr=10.213.0.11", "--master-port=29611", "--max-restarts=0",
                       "/opt/clusterctl/examples/ddp_smoke.py"]
        assert p.env["OMP_NUM_THREADS"] == targets.get_target("cpu").env["OMP_NUM_THREADS"]
        assert (p.env["NPROC_PER_NODE"], p.nproc) == ("2", 2)
        assert "RANK" not in p.env and "WORLD_SIZE" not in p.env   # torchrun sets them per process


def test_set_nproc_per_node_changes_torchrun_and_world_size(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: n1, host: 10.0.0.1}
          - {name: n2, host: 10.0.0.2, env: {NPROC_PER_NODE: "1"}}
    """))
    n1, n2 = make_plan(load_job("ddp-smoke"), inv, run_id="r")
    assert (n1.nproc, n2.nproc) == (2, 1) and "--nproc-per-node=1" in n2.argv
    n1, n2 = make_plan(load_job("ddp-smoke"), inv, run_id="r", overrides={"NPROC_PER_NODE": "3"})
    assert (n1.nproc, n2.nproc) == (3, 3)
    assert "--nproc-per-node=3" in n1.argv and n2.env["PET_NPROC_PER_NODE"] == "3"
    with pytest.raises(UserError, match="NPROC_PER_NODE='two'.*whole number from 1 to 1024"):
        make_plan(load_job("ddp-smoke"), inv, run_id="r", overrides={"NPROC_PER_NODE": "two"})


# --------------------------------------------------------------------------- precedence

def test_precedence_target_job_inventory_set(tmp_path):
    job = load_job(write(tmp_path, "job.yaml", """
        target: cpu
        nproc_per_node: slots
        env:
          OMP_NUM_THREADS: 4              # beats the target's default
          A: job
          B: job
          C: job
          GLOO_SOCKET_IFNAME: from-job    # beats the interface preflight found
          WORLD: "{world_size}"
        command: [run, "--port={master_port}", "--addr={master_addr}"]
    """))
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        defaults:
          env: {B: inv-defaults, C: inv-defaults}
        nodes:
          - {name: n1, host: 10.0.0.1, slots: 3}
          - {name: n2, host: 10.0.0.2, slots: 5, env: {C: inv-node, MASTER_PORT: "30001"}}
    """))
    n1, n2 = make_plan(job, inv, run_id="r", interfaces={"n1": "eth0", "n2": "eth1"},
                       overrides={"B": "set", "NEW": "set"})
    assert n1.env["OMP_NUM_THREADS"] == "4"
    assert (n1.env["A"], n1.env["B"], n1.env["C"]) == ("job", "set", "inv-defaults")
    assert (n2.env["A"], n2.env["B"], n2.env["C"]) == ("job", "set", "inv-node")
    assert n1.env["NEW"] == n2.env["NEW"] == "set"
    assert n1.env["GLOO_SOCKET_IFNAME"] == n2.env["GLOO_SOCKET_IFNAME"] == "from-job"
    assert (n1.env["NCCL_SOCKET_IFNAME"], n2.env["NCCL_SOCKET_IFNAME"]) == ("eth0", "eth1")
    assert (n1.nproc, n2.nproc) == (3, 5) and n1.env["WORLD"] == n2.env["WORLD"] == "8"
    # an inventory MASTER_PORT also becomes the {master_port} placeholder value on that node
    assert n1.env["MASTER_PORT"] == "29500" and n1.argv[-2] == "--port=29500"
    assert n2.env["MASTER_PORT"] == "30001" and n2.argv[-2] == "--port=30001"
    assert n2.env["PET_MASTER_PORT"] == "30001"   # the PET_ twin agrees too


def test_interfaces_set_gloo_and_nccl_unless_inventory_sets_them(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: n1, host: 10.0.0.1}
          - {name: n2, host: 10.0.0.2, interface: ib0}
          - {name: n3, host: 10.0.0.3, env: {NCCL_SOCKET_IFNAME: "^docker,lo"}}
          - {name: n4, host: 10.0.0.4}
    """))
    job = load_job("ddp-smoke")
    found = {"n1": "eth0", "n2": "eth9", "n3": "ens5"}
    n1, n2, n3, n4 = make_plan(job, inv, run_id="r", interfaces=found)
    assert (n1.env["GLOO_SOCKET_IFNAME"], n1.env["NCCL_SOCKET_IFNAME"]) == ("eth0", "eth0")
    assert (n2.env["GLOO_SOCKET_IFNAME"], n2.env["NCCL_SOCKET_IFNAME"]) == ("ib0", "ib0")
    assert (n3.env["GLOO_SOCKET_IFNAME"], n3.env["NCCL_SOCKET_IFNAME"]) == ("ens5", "^docker,lo")
    assert "GLOO_SOCKET_IFNAME" not in n4.env and "NCCL_SOCKET_IFNAME" not in n4.env
    plain = make_plan(job, inv, run_id="r")
    assert "GLOO_SOCKET_IFNAME" not in plain[0].env


def test_master_addr_resolves_an_ssh_config_alias(tmp_path):
    config = write(tmp_path, "ssh_config", """
        Host gpu-head
          HostName 10.9.8.7
          User trainer
    """)
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: head, host: gpu-head}
          - {name: other, host: 10.9.8.8}
    """))
    master_addr = resolve_host(inv.master.host, config)  # what launch passes to the plan
    head, other = make_plan(load_job("ddp-smoke"), inv, run_id="r", master_addr=master_addr)
    assert head.host == "gpu-head"                       # SSH still uses the alias
    assert head.env["MASTER_ADDR"] == other.env["MASTER_ADDR"] == "10.9.8.7"
    assert "--master-addr=10.9.8.7" in other.argv
    assert resolve_host("gpu-head", tmp_path / "none") == "gpu-head"
    unresolved = make_plan(load_job("ddp-smoke"), inv, run_id="r")  # the plan reads no ssh config
    assert unresolved[1].env["MASTER_ADDR"] == "gpu-head"


def test_the_plan_reads_nothing_but_its_arguments(tmp_path, two_nodes, monkeypatch):
    """No os.environ, no ~/.ssh/config: the same arguments give the same plan anywhere."""
    job = load_job(write(tmp_path, "job.yaml", """
        image: x
        secrets: [HF_TOKEN]
        command: [run]
    """))
    monkeypatch.setenv("HF_TOKEN", "from-the-shell")
    monkeypatch.setenv("HOME", str(tmp_path))  # an ~/.ssh/config that would rename every host
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host *\n  HostName 10.99.99.99\n")
    with pytest.raises(UserError, match="HF_TOKEN"):
        make_plan(job, two_nodes, run_id="r")
    a, b = make_plan(job, two_nodes, run_id="r", host_env={"HF_TOKEN": "given"})
    assert a.env["HF_TOKEN"] == "given" and b.env["MASTER_ADDR"] == two_nodes.master.host


def test_every_container_resolves_the_clusters_nodes_without_dns(two_nodes):
    """The c10d store looks up each peer's name, as ::ffff:<ip> (dual-stack sockets); with no
    DNS server reachable (air-gapped, or the sandbox's namespaced nodes) every lookup failed
    with a warning."""
    addresses = {"lingjun-a": "10.35.110.11", "lingjun-b": "10.35.110.12"}
    for p in make_plan(load_job("ddp-smoke"), two_nodes, run_id="r", addresses=addresses):
        hosts = [a for a in p.argv[:p.argv.index(p.image)] if a.startswith("--add-host")]
        assert hosts == ["--add-host=lingjun-a:10.35.110.11", "--add-host=lingjun-a:::ffff:10.35.110.11",
                         "--add-host=lingjun-b:10.35.110.12", "--add-host=lingjun-b:::ffff:10.35.110.12"]
    assert not any(a.startswith("--add-host") for a in make_plan(load_job("ddp-smoke"), two_nodes,
                                                                 run_id="r")[0].argv)


def test_local_facts_resolve_ssh_aliases_and_keep_only_ip_addresses(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host head\n  HostName 10.9.8.7\n")
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: n1, host: head}
          - {name: n2, host: gpu-b.example}
          - {name: n3, host: 10.9.8.9}
    """))
    facts = local_facts(inv)
    assert facts["master_addr"] == "10.9.8.7"
    assert facts["addresses"] == {"n1": "10.9.8.7", "n3": "10.9.8.9"}


def test_check_inputs_refuses_what_the_plan_refuses_and_names_the_image(tmp_path, two_nodes):
    job = load_job(write(tmp_path, "job.yaml", """
        image: x/y:1
        secrets: [HF_TOKEN]
        params: {DATA: /data}
        mounts: ["{DATA}:/data"]
        command: [run]
    """))
    ok = {"host_env": {"HF_TOKEN": "t"}}
    assert check_inputs(job, two_nodes, run_id="r", **ok) == "x/y:1"
    assert check_inputs(job, two_nodes, run_id="r", image="other:2", **ok) == "other:2"
    bad = [
        ({"run_id": "r"}, "HF_TOKEN"),
        ({"run_id": "r", "overrides": {"DATA": "rel"}, **ok}, "must be absolute"),
        ({"run_id": "r", "overrides": {"NPROC_PER_NODE": "0"}, **ok}, "NPROC_PER_NODE"),
        ({"run_id": "r", "image": "-x", **ok}, "not a valid image reference"),
        ({"run_id": "r", "extra_docker_args": ["--name=x"], **ok}, "--name"),
    ]
    for kw, message in bad:
        with pytest.raises(UserError, match=message):
            check_inputs(job, two_nodes, **kw)
        with pytest.raises(UserError, match=message):
            make_plan(job, two_nodes, **kw)


# --------------------------------------------------------------------------- --set

@pytest.mark.parametrize("item", ["PHASE", "", "=2", "1X=2", "A-B=1", "A B=1"])
def test_malformed_set_is_a_user_error(item):
    with pytest.raises(UserError) as info:
        parse_sets([item])
    assert info.value.exit_code == 2 and "--set" in info.value.message


def test_set_values_are_kept_exactly():
    weird = ["E=", "A=a=b", "Q=it's \"quoted\"", "S=$(touch /tmp/pwned) `id`; x | y & {node_rank}"]
    assert parse_sets(weird) == {"E": "", "A": "a=b", "Q": "it's \"quoted\"",
                                 "S": "$(touch /tmp/pwned) `id`; x | y & {node_rank}"}


# --------------------------------------------------------------------------- secrets

@pytest.fixture
def secret_plans(tmp_path):
    job = load_job(write(tmp_path, "job.yaml", """
        image: x/y:1
        nproc_per_node: 1
        secrets: [HF_TOKEN, WANDB]
        env: {WANDB: from-job-wandb, PLAIN: visible}
        command: [run]
    """))
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: n1, host: 10.0.0.1, env: {API_KEY: inv-api-key-value}}
          - {name: n2, host: 10.0.0.2}
    """))
    return make_plan(job, inv, run_id="r", overrides={"DB_PASSWORD": "set-db-pass"},
                     host_env={"HF_TOKEN": "hf_host_token_value"})


SECRET_VALUES = ("hf_host_token_value", "from-job-wandb", "inv-api-key-value", "set-db-pass")


def test_secrets_never_in_argv_and_masked_in_text_and_json(secret_plans):
    n1, n2 = secret_plans
    assert n1.secrets == {"HF_TOKEN", "WANDB", "API_KEY", "DB_PASSWORD"}
    assert n2.secrets == {"HF_TOKEN", "WANDB", "DB_PASSWORD"}
    assert n1.env["HF_TOKEN"] == "hf_host_token_value"        # real value kept for the run
    for p in secret_plans:
        assert not any(v in a for v in SECRET_VALUES for a in p.argv)
        assert p.argv[p.argv.index("--env-file") + 1] == "/dev/stdin"
        lines = p.stdin.decode().splitlines()
        assert sorted(lines) == sorted(f"{k}={p.env[k]}" for k in p.secrets)
        assert "-e PLAIN=visible" in argv_flags(p.argv)
    text = render_dry_run(secret_plans)
    data = json.loads(render_dry_run(secret_plans, json=True))
    for shown in (text, json.dumps(data), json.dumps([plan_record(p) for p in secret_plans])):
        assert not any(v in shown for v in SECRET_VALUES)
    assert f"HF_TOKEN={MASK}" in text and f"API_KEY={MASK}" in text
    assert data[0]["env"]["HF_TOKEN"] == MASK and data[0]["env"]["PLAIN"] == "visible"
    assert set(data[0]["secrets"]) == n1.secrets
    assert masked(n1).stdin is None and masked(n1).env["DB_PASSWORD"] == MASK
    assert secret_values(secret_plans) == sorted(SECRET_VALUES)
    user_argv = ["clusterctl", "launch", "job", "--set", "DB_PASSWORD=set-db-pass"]
    assert [mask_text(a, secret_values(secret_plans)) for a in user_argv][-1] == f"DB_PASSWORD={MASK}"


def test_mask_env_by_name_and_listing():
    env = {"GITHUB_TOKEN": "t", "my_secret_x": "s", "DB_PASSWORD": "p", "SSH_KEY": "k",
           "CUSTOM": "c", "PHASE": "1"}
    assert mask_env(env, ["CUSTOM"]) == {"GITHUB_TOKEN": MASK, "my_secret_x": MASK,
                                         "DB_PASSWORD": MASK, "SSH_KEY": MASK, "CUSTOM": MASK,
                                         "PHASE": "1"}


def test_missing_or_multiline_secret_is_a_user_error(tmp_path, two_nodes):
    job = load_job(write(tmp_path, "job.yaml", """
        image: x
        secrets: [HF_TOKEN]
        command: [run]
    """))
    with pytest.raises(UserError) as info:
        make_plan(job, two_nodes, run_id="r", host_env={})
    assert "HF_TOKEN" in info.value.message and "export" in info.value.message
    assert ":2: secrets" in info.value.message
    with pytest.raises(UserError, match="line break") as info:
        make_plan(job, two_nodes, run_id="r", host_env={"HF_TOKEN": "abc\ndef"})
    assert "abc" not in info.value.message


# --------------------------------------------------------------------------- dry-run output

def test_dry_run_text_is_the_exact_command_per_node(two_nodes):
    plans = make_plan(load_job("bert"), two_nodes, run_id="r1", overrides={"NOTE": "a b 'c'"})
    text = render_dry_run(plans)
    commands = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert [shlex.split(c) for c in commands] == [p.argv for p in plans]
    assert "# lingjun-a (host 10.35.110.11, rank 0, 8 processes)" in text
    data = json.loads(render_dry_run(plans, json=True))
    assert [(d["node"], d["host"], d["rank"], d["argv"], d["env"]) for d in data] == \
        [(p.node, p.host, p.rank, p.argv, p.env) for p in plans]


# --------------------------------------------------------------------------- real delivery

@pytest.fixture
def run_label(docker_client):
    """A unique run id; every container labelled with it is removed afterwards, also on failure."""
    run_id = f"plantest-{uuid.uuid4().hex[:8]}"
    yield run_id
    for c in docker_client.containers.list(all=True, filters={"label": f"io.clusterctl.run={run_id}"}):
        c.remove(force=True)


@pytest.mark.docker
def test_planned_argv_delivers_values_exactly_over_ssh(loopback_sshd, base_image, run_label):
    """The production path: the argv run over a real SSH connection (the node's login shell
    parses its shlex.join'ed line), secrets on the channel's stdin, in a real container."""
    weird = "a  b 'c' \"d\" $(touch /tmp/pwned) `id` ; x | y & {node_rank} \\ end "
    secret = "hf_$(id) 'q' \"dq\" tail  "
    inv = loopback_sshd.inventory([loopback_sshd.node("local", 0, env={"FROM_INV": "inv $HOME"})])
    job = load_job(JOBS / "print-env.yaml")
    [plan] = make_plan(job, inv, run_id=run_label, image=base_image, interfaces={"local": "lo"},
                       overrides=parse_sets(["PHASE=2", f"WEIRD={weird}", "EMPTY="]),
                       host_env={"HF_TOKEN": secret})
    assert secret not in command_line(plan.argv)
    with Cluster(inv) as cluster:
        conn = cluster.connection("local")
        conn.run(plan.argv, stdin=plan.stdin, check=True, timeout=60)
        status = conn.run(["docker", "wait", plan.container], check=True, timeout=60).stdout
        out = conn.run(["docker", "logs", plan.container], check=True, timeout=60).stdout
    assert int(status) == 0, out
    got = json.loads(out)
    for key in ("PHASE", "WEIRD", "EMPTY", "FROM_INV", "FROM_JOB", "HF_TOKEN", "MASTER_ADDR",
                "NODE_RANK", "GLOO_SOCKET_IFNAME", "PET_MASTER_PORT"):
        assert got[key] == plan.env[key], key
    assert got["WEIRD"] == weird and got["HF_TOKEN"] == secret
    assert got["FROM_JOB"] == "job value with {braces} and 0"
    assert got["FROM_INV"] == "inv $HOME"
    assert not os.path.exists("/tmp/pwned")


# --------------------------------------------------------------------------- through the CLI

def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_cli_dry_run_prints_the_plan_and_touches_no_node(tmp_path):
    inv = write(tmp_path, "inv.yaml", """
        nodes:
          - {name: a, host: 10.35.110.11, slots: 8}
          - {name: b, host: 10.35.110.12, slots: 8}
    """)
    result = cli("launch", "bert", "--nodes", str(inv), "--dry-run", "--run-id", "dry1",
                 "--set", "PHASE=2", "--set", "NOTE=$(rm -rf /) 'x'", "--set", "WANDB_API_KEY=k-123")
    assert result.exit_code == 0, result.output
    commands = [shlex.split(line) for line in result.stdout.splitlines() if line.startswith("docker ")]
    expected = [masked(p).argv for p in make_plan(
        load_job("bert"), load_inventory(inv), run_id="dry1",
        overrides={"PHASE": "2", "NOTE": "$(rm -rf /) 'x'", "WANDB_API_KEY": "k-123"},
        init_nodes=["a", "b"], **local_facts(load_inventory(inv)))]
    assert commands == expected
    assert all("--init" in c for c in commands)   # as a launch on nodes with Docker's init
    partial = make_plan(load_job("bert"), load_inventory(inv), run_id="dry1", init_nodes=["b"],
                        **local_facts(load_inventory(inv)))
    assert [(p.node, "--init" in p.argv) for p in partial] == [("a", False), ("b", True)]
    assert "--add-host=a:10.35.110.11" in commands[1] and "--add-host=b:10.35.110.12" in commands[0]
    assert "-e PHASE=2" in argv_flags(commands[1]) and "-e NOTE=$(rm -rf /) 'x'" in argv_flags(commands[0])
    assert "k-123" not in result.output and f"WANDB_API_KEY={MASK}" in result.output
    data = json.loads(cli("launch", "bert", "--nodes", str(inv), "--dry-run", "--json",
                          "--run-id", "dry1", "--set", "PHASE=2").stdout)
    assert [(d["node"], d["rank"], d["env"]["PHASE"], d["env"]["RANK"]) for d in data] == \
        [("a", 0, "2", "0"), ("b", 1, "2", "1")]


def test_cli_bad_set_and_bad_job_exit_2_with_the_place(tmp_path):
    inv = write(tmp_path, "inv.yaml", "nodes: [{host: 10.0.0.1}]\n")
    result = cli("launch", "bert", "--nodes", str(inv), "--dry-run", "--set", "PHASE_UNSET_HERE")
    assert result.exit_code == 2, result.output
    assert "--set PHASE_UNSET_HERE: PHASE_UNSET_HERE is not set in clusterctl's environment; valid: NAME=VALUE" in result.output
    assert "Traceback" not in result.output
    job = write(tmp_path, "job.yaml", """
        image: x
        command:
          - run
          - "--rank={rnak}"
    """)
    result = cli("launch", str(job), "--nodes", str(inv), "--dry-run")
    assert result.exit_code == 2
    assert f"{job}:4: command.1: unknown placeholder {{rnak}}" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    result = cli("launch", "ddp-smoke", "--nodes", str(inv), "--dry-run", "--image", "--privileged")
    assert result.exit_code == 2 and "not a valid image reference" in result.output


def test_run_record_masks_a_secret_given_with_set_in_clusterctls_own_argv(two_nodes):
    overrides = {"HF_TOKEN": "hf_s3cr3t value"}
    plans = make_plan(load_job("bert"), two_nodes, run_id="r1", overrides=overrides)
    argv = ["clusterctl", "launch", "bert", "--set", "HF_TOKEN=hf_s3cr3t value", "--set", "PHASE=2"]
    record = new_record(load_job("bert"), two_nodes, plans, "r1", image_id=None, detached=False,
                        argv=argv)
    dumped = repr(record)
    assert "hf_s3cr3t" not in dumped
    assert record.argv[4] == "HF_TOKEN=****" and record.argv[6] == "PHASE=2"
    assert all(n.env["HF_TOKEN"] == "****" for n in record.nodes)


# --------------------------------------------------------------------------- smoke on the real backend

def _gpu_nodes(tmp_path):
    return load_inventory(write(tmp_path, "gpu.yaml", """
        nodes:
          - {name: gpu1, host: 10.0.0.21, slots: 4, interface: ib0}
          - {name: gpu2, host: 10.0.0.22, slots: 4, interface: ib0}
    """))


def test_node_processes_and_job_device_are_what_the_plan_counts(tmp_path, two_nodes):
    """What launch's preflight compares with each node's GPUs: the plan's own process counts
    (slots, NPROC_PER_NODE from --set or the node's env) and the target's device and CUDA."""
    nccl, inv = load_job("ddp-smoke-nccl"), _gpu_nodes(tmp_path)
    assert node_processes(nccl, inv) == {"gpu1": 4, "gpu2": 4}
    assert node_processes(nccl, inv, {"NPROC_PER_NODE": "2"}) == {"gpu1": 2, "gpu2": 2}
    plans = make_plan(nccl, inv, run_id="r", overrides={"NPROC_PER_NODE": "2"})
    assert [p.nproc for p in plans] == [2, 2]
    assert job_device(nccl) == ("cuda", "12.3.2")
    assert job_device(load_job("ddp-smoke")) == (None, None)      # cpu: nothing to compare


def test_ddp_smoke_takes_backend_and_device_from_the_target(tmp_path, two_nodes):
    """cpu: gloo on the CPU as before; the nccl sibling: nccl, one CUDA device per local rank
    (the script maps LOCAL_RANK to its device), one process per GPU slot."""
    cpu = make_plan(load_job("ddp-smoke"), two_nodes, run_id="r")
    assert {(p.env["DDP_SMOKE_BACKEND"], p.env["DDP_SMOKE_DEVICE"]) for p in cpu} == {("gloo", "cpu")}
    nccl = make_plan(load_job("ddp-smoke-nccl"), _gpu_nodes(tmp_path), run_id="r")
    for p in nccl:
        assert (p.env["DDP_SMOKE_BACKEND"], p.env["DDP_SMOKE_DEVICE"]) == ("nccl", "cuda")
        assert p.nproc == 4 and "--nproc-per-node=4" in p.argv and "--gpus=all" in p.argv
        assert p.image == targets.resolve("nccl").tag
    for name, target in (("ipex", ("ccl", "cpu")), ("cambricon", ("cncl", "mlu")), ("accl", ("accl", "cuda"))):
        t = targets.get_target(name)
        assert (t.backend, t.device) == target


def test_nccl_plan_turns_the_flight_recorder_on_with_a_run_directory_per_node(tmp_path):
    """No GPU here: the nccl variant is checked as a plan (and a golden dry-run below)."""
    plans = make_plan(load_job("ddp-smoke-nccl"), _gpu_nodes(tmp_path), run_id="fr-1")
    for p in plans:
        assert p.flight_dir == f"/var/tmp/clusterctl/runs/fr-1/{p.node}/flight"
        i = p.argv.index(f"{p.flight_dir}:/var/run/clusterctl/flight")
        assert p.argv[i - 1] == "-v"
        assert p.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and p.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        assert p.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/var/run/clusterctl/flight/nccl_trace_rank_"
        assert p.env["TORCH_FR_DUMP_TEMP_FILE"] == "/var/run/clusterctl/flight/nccl_trace_rank_"
    # the user can turn it off (--set wins over the target's layer); gloo targets have none
    off = make_plan(load_job("ddp-smoke-nccl"), _gpu_nodes(tmp_path), run_id="fr-1",
                    overrides={"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    assert off[0].env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0"
    cpu = make_plan(load_job("ddp-smoke"), _gpu_nodes(tmp_path), run_id="r")
    assert all(p.flight_dir is None and not any(k.startswith("TORCH_") for k in p.env) for p in cpu)
    # a Slurm script has nobody to collect the dumps: no mount there
    assert all(p.flight_dir is None for p in make_plan(load_job("ddp-smoke-nccl"), _gpu_nodes(tmp_path),
                                                       run_id="r", flight_recorder=False))


def test_ddp_smoke_nccl_dry_run_matches_golden(tmp_path):
    """The whole `launch ddp-smoke-nccl --dry-run --hang-timeout 10m` text (no GPU here: this,
    not a run, is what checks the nccl variant)."""
    inv = write(tmp_path, "gpu.yaml", """
        nodes:
          - {name: gpu1, host: 10.0.0.21, slots: 2, interface: ib0}
          - {name: gpu2, host: 10.0.0.22, slots: 2, interface: ib0}
    """)
    result = CliRunner().invoke(app, ["launch", "ddp-smoke-nccl", "--nodes", str(inv), "--dry-run",
                                      "--run-id", "smoke-nccl-1", "--hang-timeout", "10m"])
    assert result.exit_code == 0, result.output
    from tests.fixtures.golden import matches_golden

    matches_golden(Path(__file__).parent / "golden", "ddp-smoke-nccl.dry-run.txt", result.stdout,
                   "launch ddp-smoke-nccl --dry-run")


def test_a_hang_timeout_adds_sys_ptrace_and_nothing_else(tmp_path):
    """py-spy reads the ranks' memory: the containers get that one capability, and only when
    a hang timeout is set (flag or job key); a bad value names the option or the key."""
    inv = write(tmp_path, "inv.yaml", "nodes:\n  - {name: n1, host: 10.0.0.1}\n")
    plain = CliRunner().invoke(app, ["launch", "ddp-smoke", "--nodes", str(inv), "--dry-run"])
    watched = CliRunner().invoke(app, ["launch", "ddp-smoke", "--nodes", str(inv), "--dry-run",
                                       "--hang-timeout", "90s"])
    assert plain.exit_code == watched.exit_code == 0
    assert "--cap-add=SYS_PTRACE" not in plain.stdout and "--privileged" not in watched.stdout
    assert watched.stdout.count("--cap-add") == 1 and watched.stdout.count("--cap-add=SYS_PTRACE") == 1
    job = write(tmp_path, "j.yaml", "target: cpu\ncommand: [sleep, '1']\nhang_timeout: 5m\n")
    from_key = CliRunner().invoke(app, ["launch", str(job), "--nodes", str(inv), "--dry-run"])
    assert from_key.stdout.count("--cap-add=SYS_PTRACE") == 1
    bad = CliRunner().invoke(app, ["launch", "ddp-smoke", "--nodes", str(inv), "--dry-run",
                                   "--hang-timeout", "soon"])
    assert bad.exit_code == 2 and "--hang-timeout 'soon' is not a duration; valid: a duration such as 90s" \
        in bad.output
    # the library refuses a detached run with a watchdog (the CLI forks a supervisor to follow
    # it instead: tests/run/test_recovery_sandbox.py)
    from clusterctl.run.launch import launch
    with pytest.raises(UserError, match="a hang timeout needs a followed run"):
        launch(load_job(job), load_inventory(inv), detach=True)


# --------------------------------------------------------------------------- the master port

def test_pinned_master_port_by_precedence_and_none_when_left_default(tmp_path):
    from clusterctl.run.plan import PinnedPort, pinned_master_port

    job = load_job(write(tmp_path, "job.yaml", "image: x\ncommand: [run]\n"))
    pinned_job = load_job(write(tmp_path, "pinned.yaml", "image: x\nmaster_port: 29500\ncommand: [run]\n"))
    env_job = load_job(write(tmp_path, "envjob.yaml", "image: x\nenv: {MASTER_PORT: '31000'}\ncommand: [run]\n"))
    placeholder_job = load_job(write(tmp_path, "ph.yaml",
                                     "image: x\nenv: {MASTER_PORT: '{master_port}'}\ncommand: [run]\n"))
    plain = load_inventory(write(tmp_path, "plain.yaml", """
        nodes:
          - {name: n1, host: 10.0.0.1}
          - {name: n2, host: 10.0.0.2, env: {MASTER_PORT: "30001"}}
    """))
    fixed = load_inventory(write(tmp_path, "fixed.yaml", """
        master_port: 29611
        nodes:
          - {name: n1, host: 10.0.0.1, env: {MASTER_PORT: "30002"}}
    """))
    # left default (a non-master's env does not count; a placeholder is no number)
    assert pinned_master_port(job, plain) is None
    assert pinned_master_port(placeholder_job, plain) is None
    # the job's master_port pins even the default's value: the user asked for it
    assert pinned_master_port(pinned_job, plain).port == 29500
    assert pinned_master_port(env_job, plain).port == 31000
    # --set beats the master's inventory env, which beats the job and the inventory's master_port
    assert pinned_master_port(pinned_job, fixed, {"MASTER_PORT": "30003"}) == \
        PinnedPort(30003, "--set MASTER_PORT")
    assert pinned_master_port(pinned_job, fixed).port == 30002
    assert "inventory env of n1" in pinned_master_port(pinned_job, fixed).where
    fixed.master.env.pop("MASTER_PORT")
    assert pinned_master_port(job, fixed).port == 29611 and "fixed.yaml" in pinned_master_port(job, fixed).where
    for bad in ("http", "0", "70000", ""):
        with pytest.raises(UserError, match=r"--set MASTER_PORT = .* is not a port; valid: a whole number"):
            pinned_master_port(job, plain, {"MASTER_PORT": bad})


def test_choose_master_port_skips_busy_and_held_ports_and_says_when_none_is_left():
    from clusterctl.run.plan import choose_master_port

    assert choose_master_port(29500, [], {}) == 29500
    assert choose_master_port(29500, [22, 29500, 29502], {29501: "run a of user alice"}) == 29503
    assert choose_master_port(65534, [65534], {}) == 65535
    with pytest.raises(UserError) as e:
        choose_master_port(29500, range(29500, 29600), {}, where="node1")
    assert "no free master port on node1: 29500-29599" in e.value.message
    assert "--set MASTER_PORT" in e.value.message
    with pytest.raises(UserError, match="65534-65535"):
        choose_master_port(65534, [65534], {65535: "run b of user bob"})


def test_the_planned_env_carries_the_port_launch_chose(tmp_path):
    """launch gives make_plan the inventory with the chosen port: MASTER_PORT, PET_MASTER_PORT
    and the {master_port} placeholder agree on it, on every node."""
    from dataclasses import replace
    job = load_job(write(tmp_path, "job.yaml", 'image: x\ncommand: [run, "--port={master_port}"]\n'))
    inv = load_inventory(write(tmp_path, "inv.yaml", """
        nodes:
          - {name: n1, host: 10.0.0.1}
          - {name: n2, host: 10.0.0.2}
    """))
    for p in make_plan(job, replace(inv, master_port=29503), run_id="r"):
        assert (p.env["MASTER_PORT"], p.env["PET_MASTER_PORT"], p.argv[-1]) == ("29503", "29503", "--port=29503")
