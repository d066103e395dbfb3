"""Every seed workflow is a shipped job: its `launch NAME --dry-run --json` plan, node by
node, holds the commands and values the seed types by hand (seeds/000, 001, 002, 004; 003
is `bert`, tests/run/test_plan.py).  The seed lines are copied here as published and
parsed, not restated.

The mpi contract (seeds 000, 001) is checked against MPICH's own mpiexec (hydra, from the
`mpich` wheel: the variables it gives each process are the reference), and run for real
across the 3 sandbox nodes on the cpu image: every rank reports rank, size, local rank
and an all_reduce.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster.inventory import load_inventory
from clusterctl.image import targets
from clusterctl.run import mpi, records, recovery
from clusterctl.run.jobs import BASE_ENV, CONTRACTS, load_job
from clusterctl.run.plan import make_plan
from tests.fixtures import JOBS

# --------------------------------------------------------------------------- the seeds' own lines

# seeds/000, on node0 for two nodes (node0 is the master; the hostfile lists both IPs)
SEED_000 = """
export CCL_WORKER_COUNT=1
export MASTER_ADDR=xxx.xxx.xxx.xxx #node0 ip
mpirun -f hostfile -n 4 -ppn 2 \\
-genv OMP_NUM_THREADS=23 \\
python3 run_qa.py \\
    --model_name_or_path distilbert-base-uncased-distilled-squad \\
    --dataset_name squad \\
    --apply_quantization \\
    --quantization_approach static \\
    --do_train \\
    --do_eval \\
    --verify_loading \\
    --output_dir /tmp/squad_output \\
    --no_cuda \\
    --xpu_backend ccl
"""

# seeds/001, on node0 for four nodes, "if you choose not to let Accelerate launch mpirun"
SEED_001 = """
export CCL_WORKER_COUNT=1
export MASTER_ADDR=xxx.xxx.xxx.xxx #node0 ip
export CCL_ATL_TRANSPORT=ofi
mpirun -f hostfile -n 16 -ppn 4 accelerate launch examples/nlp_example.py
"""
# seeds/001's default_config.yaml from `accelerate config` on node0.  The page lost the
# indentation of the two nested mappings (ipex_config, mpirun_config); restored here.
SEED_001_CONFIG = """
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
downcast_bf16: 'no'
ipex_config:
  ipex: true
machine_rank: 0
main_process_ip: 36.112.23.24
main_process_port: 29500
main_training_function: main
mixed_precision: bf16
mpirun_config:
  mpirun_ccl: '1'
  mpirun_hostfile: /home/user/hostfile
num_machines: 4
num_processes: 16
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""

# seeds/002
SEED_002_TORCHRUN_GPUS = "CUDA_VISIBLE_DEVICES=1,2,3,4 torchrun --nproc-per-node 4 run_clm.py"
SEED_002_TORCHRUN = "torchrun --master_port 61234 --nproc_per_node $gpu_num hf_train.py ..."
SEED_002_DEEPSPEED = """deepspeed --include "localhost:1,2,3,4" train_model.py \\
	--deepspeed ds_config.json \\
	--output_dir ..."""

# seeds/004, node A and node B.  The page joined each command's continuation lines into one
# line (" \\ " between flags); the lines are restored here, tokens unchanged.
SEED_004_A = """python -m torch.distributed.launch \\
 --master_port 2289 \\
 --nproc_per_node 2 \\
 --nnodes=2 \\
 --node_rank=0 \\
 --master_addr="192.168.1.18" \\
 train.py --data coco.yaml --cfg yolov5n.yaml \\
 --weights '' --batch-size 64 --device 0,1"""
SEED_004_B = SEED_004_A.replace("--node_rank=0", "--node_rank=1")
SEED_004_ONE_NODE_DEVICE = "--device mlu"   # the single-node line (the two-node lines say 0,1)


def shell(text: str) -> tuple[dict[str, str], list[list[str]]]:
    """(exported variables, the other command lines as argv) of a seed's shell lines."""
    env, commands = {}, []
    for line in text.replace("\\\n", " ").strip().splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if argv[0] == "export":
            for item in argv[1:]:
                k, _, v = item.partition("=")
                env[k] = v
        else:
            commands.append(argv)
    return env, commands


def mpirun_parts(argv: list[str]) -> dict:
    """hydra's mpirun options of a seed line (-f, -n, -ppn, -genv) and the program argv."""
    assert argv[0] == "mpirun"
    out, i = {"genv": {}}, 1
    while argv[i].startswith("-"):
        if argv[i] == "-genv" and "=" in argv[i + 1]:      # -genv NAME=VALUE
            k, _, v = argv[i + 1].partition("=")
            out["genv"][k] = v
            i += 2
        elif argv[i] == "-genv":                             # -genv NAME VALUE
            out["genv"][argv[i + 1]] = argv[i + 2]
            i += 3
        else:
            out[argv[i].lstrip("-")] = argv[i + 1]
            i += 2
    out["program"] = argv[i:]
    return out


# --------------------------------------------------------------------------- helpers

runner = CliRunner()


def cli(*args: str):
    return runner.invoke(app, list(args))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def dry_run(job: str, inventory: Path, *sets: str) -> list[dict]:
    """`clusterctl launch JOB --nodes INV --dry-run --json` (plus --set ...), parsed."""
    args = ["launch", job, "--nodes", str(inventory), "--dry-run", "--json", "--run-id", "seed"]
    for s in sets:
        args += ["--set", s]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def container_command(record: dict) -> list[str]:
    """The container command of a dry-run record: what follows the image in its argv."""
    argv = record["argv"]
    return argv[argv.index(record["image"]) + 1:]


def options(record: dict) -> list[str]:
    argv = record["argv"]
    return argv[:argv.index(record["image"])]


def launch_env_keys(contract: str) -> set[str]:
    """The variables every launch adds for ``contract`` (and the job's target defaults)."""
    return set(BASE_ENV) | set(CONTRACTS[contract]) | set(recovery.environment("r", 0, (), None))


def check_mpi_node(record: dict, *, ppn: int, n: int, program: list[str]) -> None:
    """One node of an mpi-contract plan gives what `mpirun -n N -ppn P PROGRAM` gives there."""
    first, count, inner = mpi.split_spawn(container_command(record))
    assert inner == program
    assert (first, count) == (record["rank"] * ppn, ppn)
    env = record["env"]
    assert (env["PMI_SIZE"], env["MPI_LOCALNRANKS"], env["PMI_HOSTNAME"]) == (str(n), str(ppn), record["node"])
    assert mpi.process_env(first, count) == [
        {"PMI_RANK": str(record["rank"] * ppn + i), "MPI_LOCALRANKID": str(i)} for i in range(ppn)]


# --------------------------------------------------------------------------- seeds/000

def test_optimum_qa_ccl_is_seed_000_on_every_node(tmp_path):
    inv = write(tmp_path, "hostfile", """
        10.20.0.10
        10.20.0.11
    """)    # the seed's hostfile, an MPI hostfile clusterctl reads as an inventory
    seed_env, [mpirun] = shell(SEED_000.replace("xxx.xxx.xxx.xxx", "10.20.0.10"))
    parts = mpirun_parts(mpirun)
    assert (parts["f"], parts["n"], parts["ppn"]) == ("hostfile", "4", "2")
    plans = dry_run("optimum-qa-ccl", inv)
    assert [(p["host"], p["rank"]) for p in plans] == [("10.20.0.10", 0), ("10.20.0.11", 1)]
    assert sum(p["nproc"] for p in plans) == int(parts["n"])
    for p in plans:
        assert p["image"] == targets.resolve("ipex").tag
        # the exports of node0's shell and mpirun's -genv reach every process
        assert {k: p["env"][k] for k in seed_env} == seed_env
        assert {k: p["env"][k] for k in parts["genv"]} == parts["genv"] == {"OMP_NUM_THREADS": "23"}
        check_mpi_node(p, ppn=int(parts["ppn"]), n=int(parts["n"]), program=parts["program"])
        extra = set(p["env"]) - set(seed_env) - set(parts["genv"])
        assert extra <= launch_env_keys("mpi") | set(targets.get_target("ipex").env), extra
        assert "-v" in options(p) and "/tmp/squad_output:/tmp/squad_output" in options(p)
    # OMP_NUM_THREADS is the seed's knob: settable per launch
    assert {p["env"]["OMP_NUM_THREADS"] for p in dry_run("optimum-qa-ccl", inv, "OMP_NUM_THREADS=28")} == {"28"}


# --------------------------------------------------------------------------- seeds/001

ACCELERATE_STAND_IN = """#!/bin/sh
# stands in for `accelerate` (not installed here): records its argv and config file
python3 - "$@" <<'PY'
import json, sys
args = sys.argv[1:]
cfg = open(args[args.index("--config_file") + 1]).read()
print(json.dumps({"argv": args, "config": cfg}))
PY
"""


def test_accelerate_ipex_is_seed_001_on_four_nodes(tmp_path):
    inv = write(tmp_path, "inv.yaml", """
        master_port: 29500
        nodes:
          - {name: node0, host: 36.112.23.24}
          - {name: node1, host: 36.112.23.25}
          - {name: node2, host: 36.112.23.26}
          - {name: node3, host: 36.112.23.27}
    """)
    seed_env, [mpirun] = shell(SEED_001.replace("xxx.xxx.xxx.xxx", "36.112.23.24"))
    parts = mpirun_parts(mpirun)
    seed_config = yaml.safe_load(SEED_001_CONFIG)
    plans = dry_run("accelerate-ipex", inv)
    assert len(plans) == 4 and sum(p["nproc"] for p in plans) == int(parts["n"]) == seed_config["num_processes"]
    for p in plans:
        assert {k: p["env"][k] for k in seed_env} == seed_env
        config = yaml.safe_load(p["env"]["ACCELERATE_CONFIG"])
        # the seed's config, per node: machine_rank is the node's; no mpirun_hostfile, since
        # clusterctl is the mpirun (with it accelerate would start a second mpirun)
        expected = {**seed_config, "machine_rank": p["rank"],
                    "mpirun_config": {"mpirun_ccl": seed_config["mpirun_config"]["mpirun_ccl"]}}
        assert config == expected
        assert str(config["mpirun_config"]["mpirun_ccl"]) == p["env"]["CCL_WORKER_COUNT"]
        first, count, inner = mpi.split_spawn(container_command(p))
        check_mpi_node(p, ppn=int(parts["ppn"]), n=int(parts["n"]), program=inner)

        # the inner command, run for real with a stand-in `accelerate`: it is the seed's
        # `accelerate launch examples/nlp_example.py` with this node's config file
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        (bindir / "accelerate").write_text(ACCELERATE_STAND_IN)
        (bindir / "accelerate").chmod(0o755)
        env = {**p["env"], "PATH": f"{bindir}:{os.environ['PATH']}"}
        out = subprocess.run(inner, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
        assert [seen["argv"][0], *seen["argv"][3:]] == parts["program"][1:]   # launch examples/nlp_example.py
        assert seen["argv"][1] == "--config_file"
        assert yaml.safe_load(seen["config"]) == expected
        # the config file the job wrote (in a container it goes with the container; here it
        # is this machine's /tmp, so the test removes it: a leftover from an earlier run made
        # the old check, "no file named after this process's PID", fail by PID reuse)
        written = Path(seen["argv"][2])
        assert written.parent == Path("/tmp") and written.name.startswith("accelerate-config-"), written
        written.unlink()
    assert plans[0]["env"]["MASTER_ADDR"] == seed_config["main_process_ip"] == "36.112.23.24"


# --------------------------------------------------------------------------- seeds/002

def test_torchrun_nccl_is_seed_002_with_slots_and_the_chosen_port(tmp_path):
    inv = write(tmp_path, "inv.yaml", """
        master_port: 61234
        nodes:
          - {name: gpu0, host: 10.30.0.10, slots: 4}
          - {name: gpu1, host: 10.30.0.11, slots: 4}
    """)
    gpus = shell(SEED_002_TORCHRUN_GPUS)[1][0][0].split("=", 1)[1]
    gpu_num = str(len(gpus.split(",")))        # gpu_num=$(... awk -F ',' '{print NF}')
    [seed] = shell(SEED_002_TORCHRUN.replace("$gpu_num", gpu_num).replace(" ...", ""))[1]
    for p in dry_run("torchrun-nccl", inv):
        multi_node = ["--nnodes", "2", "--node_rank", str(p["rank"]), "--master_addr", "10.30.0.10"]
        assert container_command(p) == [*seed[:-1], *multi_node, seed[-1]]
        assert p["image"] == targets.resolve("nccl").tag and "--gpus=all" in options(p)
        assert p["env"]["MASTER_PORT"] == "61234" and p["env"]["NPROC_PER_NODE"] == gpu_num
        # the launch's variables, plus the nccl target's flight recorder (on by default)
        recorder = set(targets.get_target("nccl").flight_recorder.environment())
        assert set(p["env"]) <= launch_env_keys("torchrun") | recorder
        assert recorder <= set(p["env"])
    # the seed's other way to choose the port ("if 29500 is taken, change it")
    assert {p["env"]["MASTER_PORT"] for p in dry_run("torchrun-nccl", inv, "MASTER_PORT=61235")} == {"61235"}
    assert all("61235" in container_command(p) for p in dry_run("torchrun-nccl", inv, "MASTER_PORT=61235"))


def test_deepspeed_is_seed_002_with_a_mounted_config_and_deepspeeds_variables(tmp_path):
    inv = write(tmp_path, "inv.yaml", """
        nodes:
          - {name: gpu0, host: 10.30.0.10, slots: 4}
          - {name: gpu1, host: 10.30.0.11, slots: 4}
    """)
    [seed] = shell(SEED_002_DEEPSPEED)[1]
    assert seed[:3] == ["deepspeed", "--include", "localhost:1,2,3,4"]
    gpus = len(seed[2].split(":")[1].split(","))
    script = seed[3:]                       # train_model.py --deepspeed ds_config.json --output_dir ...
    plans = dry_run("deepspeed", inv, "DS_CONFIG=/srv/zero2.json", "OUTPUT_DIR=/srv/out")
    for p in plans:
        rank, command = p["rank"], container_command(p)
        assert command[:11] == ["torchrun", "--nproc_per_node", str(gpus), "--nnodes", "2",
                                "--node_rank", str(rank), "--master_addr", "10.30.0.10",
                                "--master_port", "29500"]
        assert command[11:] == [*script[:-1], "/workspace/output"]   # "..." is the user's output dir
        # the config is mounted where the seed's relative ds_config.json is read (the workdir)
        opts = options(p)
        assert opts[opts.index("-w") + 1] == "/workspace/code"
        assert "/srv/zero2.json:/workspace/code/ds_config.json:ro" in opts
        assert "/srv/out:/workspace/output" in opts
        # what deepspeed.launcher.launch sets on each node (RANK, LOCAL_RANK: torchrun's)
        assert {k: p["env"][k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "CROSS_RANK",
                                          "CROSS_SIZE", "LOCAL_SIZE")} == {
            "MASTER_ADDR": "10.30.0.10", "MASTER_PORT": "29500", "WORLD_SIZE": str(2 * gpus),
            "CROSS_RANK": str(rank), "CROSS_SIZE": "2", "LOCAL_SIZE": str(gpus)}
        assert "CUDA_VISIBLE_DEVICES" not in p["env"]   # the seed: never with deepspeed
        # the launch's variables, plus the nccl target's flight recorder (on by default)
        recorder = set(targets.get_target("nccl").flight_recorder.environment())
        assert set(p["env"]) <= launch_env_keys("deepspeed") | recorder


# --------------------------------------------------------------------------- seeds/004

def test_yolov5_mlu_is_seed_004_on_both_nodes(tmp_path):
    inv = write(tmp_path, "inv.yaml", """
        master_port: 2289
        nodes:
          - {name: node-a, host: 192.168.1.18, slots: 2}
          - {name: node-b, host: 192.168.1.19, slots: 2}
    """)
    seeds = [shell(SEED_004_A)[1][0], shell(SEED_004_B)[1][0]]
    device = SEED_004_ONE_NODE_DEVICE.split()[1]
    run = targets.get_target("cambricon").run
    for as_typed, value in ((dry_run("yolov5-mlu", inv, "DEVICE=0,1"), "0,1"), (dry_run("yolov5-mlu", inv), device)):
        for p, seed in zip(as_typed, seeds, strict=True):
            expected = [*seed[:-1], value]
            assert container_command(p) == expected
            assert p["image"] == targets.resolve("cambricon").tag
            opts = options(p)
            assert [o for o in opts if o.startswith("--device=")] == [f"--device={d}" for d in run.devices_for(2)]
            assert "--device=/dev/cambricon_dev1" in opts and "--device=/dev/cambricon_ctl" in opts
            assert set(p["env"]) <= launch_env_keys("torchrun")
    assert container_command(dry_run("yolov5-mlu", inv)[0])[-1] == "mlu"


# --------------------------------------------------------------------------- the mpi contract

def mpich_bin() -> Path:
    """The bin/ of the `mpich` wheel (a dev dependency): mpiexec and hydra_pmi_proxy (in
    the virtualenv's bin/, where pip puts a wheel's scripts)."""
    try:
        dist = importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("the `mpich` wheel (dev extra in pyproject.toml) is not installed: "
                    "pip install -r requirements/dev.lock")
    found = [Path(dist.locate_file(f)).resolve().parent for f in dist.files or []
             if str(f).endswith("bin/mpiexec.hydra")]
    which = shutil.which("mpiexec.hydra")
    for d in [*found, Path(sys.executable).parent, *([Path(which).parent] if which else [])]:
        if (d / "mpiexec.hydra").is_file() and (d / "hydra_pmi_proxy").is_file():
            return d
    pytest.fail(f"mpich {dist.version} is installed but its mpiexec.hydra was not found")


PRINT_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)), flush=True)"]


def test_mpi_contract_gives_what_mpich_hydra_gives_each_process(tmp_path):
    """MPICH's mpiexec (fork launcher: both "hosts" on this machine) is the reference: each
    of its processes' variables, by rank, equals what the plan + spawner give; the only ones
    left out are hydra's PMI wire (PMI_FD, HYDI_CONTROL_FD) and a Fortran runtime switch."""
    inv = write(tmp_path, "hostfile", "h1 slots=2\nh2 slots=3\n")   # 2 + 3: uneven nodes
    job = write(tmp_path, "job.yaml", """
        image: x
        contract: mpi
        nproc_per_node: slots
        command: [print-env]
    """)
    bin_dir = mpich_bin()
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MARK": "1"}
    hydra = subprocess.run([str(bin_dir / "mpiexec"), "-launcher", "fork", "-hosts", "h1:2,h2:3",
                            "-n", "5", *PRINT_ENV], env=base, capture_output=True, text=True, timeout=120)
    assert hydra.returncode == 0, hydra.stderr
    theirs = {int(e["PMI_RANK"]): {k: v for k, v in e.items() if k not in base}
              for e in map(json.loads, hydra.stdout.splitlines())}
    assert sorted(theirs) == list(range(5))

    ours = {}
    for plan in make_plan(load_job(job), load_inventory(inv), run_id="r"):
        first, count, inner = mpi.split_spawn(plan.command)
        assert inner == ["print-env"]
        contract = {k: plan.env[k] for k in CONTRACTS["mpi"]}
        out = subprocess.run(mpi.spawn_command(first, count, PRINT_ENV), env={**base, **contract},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        for e in map(json.loads, out.stdout.splitlines()):
            ours[int(e["PMI_RANK"])] = {k: v for k, v in e.items() if k not in base}
    left_out = {"PMI_FD", "HYDI_CONTROL_FD", "GFORTRAN_UNBUFFERED_PRECONNECTED"}
    for rank in range(5):
        assert set(theirs[rank]) - set(ours[rank]) == left_out, rank
        assert ours[rank] == {k: v for k, v in theirs[rank].items() if k not in left_out}, rank
    assert [ours[r]["PMI_HOSTNAME"] for r in range(5)] == ["h1", "h1", "h2", "h2", "h2"]


def test_mpi_spawner_ends_with_the_first_failure_and_stops_the_rest(tmp_path):
    """As hydra: one process exits non-zero -> the others (whole process groups) are stopped
    and the container exits with that code; a command that cannot start is exit 127."""
    script = 'if [ "$MPI_LOCALRANKID" = 1 ]; then exit 5; fi; sleep 60 & wait'
    out = subprocess.run(mpi.spawn_command(0, 3, ["sh", "-c", script]), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 5
    out = subprocess.run(mpi.spawn_command(0, 2, [str(tmp_path / "missing")]), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 127 and "cannot start" in out.stderr


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_mpi_contract_exports_with_the_same_spawner(kind):
    """A pod starts its node's processes as an SSH launch does: clusterctl's spawner, first
    rank PET_NODE_RANK x processes per node (Kubernetes turns $$ into $); a PyTorchJob's
    node-level RANK / WORLD_SIZE are unset first. tests/run/test_export_schemas.py runs the
    wrapper in a real shell."""
    result = cli("export", "optimum-qa-ccl", "--to", kind, "--nnodes", "2", "--image", "r/ipex:1")
    assert result.exit_code == 0, result.output
    body = yaml.safe_load(result.stdout)
    if kind == "pytorchjob":
        container = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    else:
        container = body["spec"]["trainer"]
    args = container["args"]
    assert args[:2] == ["/bin/sh", "-c"] and mpi.SPAWNER in args
    assert '"$$((PET_NODE_RANK * 2))" 2 ' in args[2]
    assert ("unset RANK WORLD_SIZE" in args[2]) == (kind == "pytorchjob")


@pytest.mark.parametrize("container", ["docker", "pyxis"])
def test_mpi_contract_through_slurm_each_task_computes_its_first_rank(container, tmp_path):
    """One sbatch script for all nodes: the spawner's first rank is the task's
    $((SLURM_NODEID * P)); run in bash with Slurm's variables, node 2 of 3 starts ranks 4, 5."""
    from clusterctl.run.slurm.options import check_options
    from clusterctl.run.slurm.script import render_script

    options = check_options(nnodes=3, container=container)
    text = render_script(load_job(MPI_JOB), options, run_id="r", run_dir="/srv/runs/r").text
    task = text.split("<<'CLUSTERCTL_TASK_END' || true\n", 1)[1].split("CLUSTERCTL_TASK_END\n", 1)[0]
    assert 'CLUSTERCTL_FIRST_RANK="$((SLURM_NODEID * 2))"' in task
    assert '"${CLUSTERCTL_FIRST_RANK}" 2 -- python3 -u -c' in task
    assert 'PMI_SIZE="${CLUSTERCTL_WORLD_SIZE}"' in task and 'PMI_HOSTNAME="${SLURMD_NODENAME}"' in task
    # the task's own first-rank line and the spawner's words, evaluated by a real bash
    first_line = next(line for line in task.splitlines() if line.startswith("CLUSTERCTL_FIRST_RANK="))
    words = subprocess.run(["bash", "-c", f'{first_line}\nprintf "%s\\n" "$CLUSTERCTL_FIRST_RANK"'],
                           env={"SLURM_NODEID": "2"}, capture_output=True, text=True, check=True)
    assert words.stdout == "4\n"
    path = tmp_path / "task.sh"
    path.write_text(task)
    subprocess.run(["bash", "-n", str(path)], check=True)


MPI_JOB = JOBS / "mpi-allreduce.yaml"
REPORT = re.compile(r"mpi-rank (\d+) size (\d+) local (\d+)/(\d+) host (\S+) allreduce (\d+)")


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_mpi_contract_for_real_on_three_nodes(sandbox3, cpu_image, runs_dir):
    """3 sandbox nodes x 2 processes on the cpu image, each reading only mpirun's variables."""
    sb = sandbox3
    res = cli("launch", str(MPI_JOB), "--nodes", str(sb.inventory_path), "--image", cpu_image)
    assert res.exit_code == 0, res.output
    reports = {}
    for line in res.output.splitlines():
        m = re.match(r"^(node\d)\[(\d)\]\| ", line)
        for rank, size, local, nlocal, host, total in REPORT.findall(line):
            assert m and m.group(1) == host, line       # the report comes from that node
            reports[int(rank)] = (int(size), int(local), int(nlocal), host, int(total))
    print("\n".join(f"rank {r}: {v}" for r, v in sorted(reports.items())))
    assert reports == {r: (6, r % 2, 2, f"node{r // 2 + 1}", 21) for r in range(6)}, res.output
    record = records.list_runs()[0]
    assert record.exit_code == 0 and [n.exit_code for n in record.nodes] == [0, 0, 0]


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_mpi_rank_failure_ends_the_run_with_its_code(sandbox3, cpu_image, runs_dir):
    """Rank 3 (node2, local 1) exits 3 before joining; its node's spawner stops rank 2, and
    launch stops the other nodes, whose ranks would otherwise wait for it."""
    sb = sandbox3
    res = cli("launch", str(MPI_JOB), "--nodes", str(sb.inventory_path), "--image", cpu_image,
              "--set", "MPI_FAIL_RANK=3")
    assert res.exit_code == 3, res.output
    summary = res.output[res.output.index("FIRST FAILURE"):]
    assert summary.startswith("FIRST FAILURE: node2[1] exited 3"), summary
    assert "mpi-rank 3 failing with exit status 3" in summary


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_mpi_contract_through_real_slurm_on_three_nodes(slurm3, slurm_cpu_image, tmp_path):
    """The same job through `--scheduler slurm` (one sbatch script, each task computes its
    node's first rank): every rank reports, the all_reduce is 21 everywhere."""
    env = slurm3.env(CLUSTERCTL_RUNS=str(tmp_path / "runs"))
    res = subprocess.run([sys.executable, "-m", "clusterctl", "launch", str(MPI_JOB), "--scheduler",
                          "slurm", "--nodes", str(slurm3.inventory_path), "--image", slurm_cpu_image,
                          "--run-id", "sl-mpi"], env=env, capture_output=True, text=True,
                         timeout=900, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^(node\d)\[(\d)\]\| ", line)
        for rank, size, local, nlocal, host, total in REPORT.findall(line):
            assert m and m.group(1) == host, line
            reports[int(rank)] = (int(size), int(local), int(nlocal), host, int(total))
    print("\n".join(f"slurm rank {r}: {v}" for r, v in sorted(reports.items())))
    assert reports == {r: (6, r % 2, 2, f"node{r // 2 + 1}", 21) for r in range(6)}, res.stdout[-3000:]
