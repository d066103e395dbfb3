"""Benchmark: the own-project DDP training through clusterctl and through the peers users
would pick instead, on the same sandbox nodes, in one run (issue 44: "Against the peers").

The job is examples/own-project (train.py: a DDP regression with gloo, its model package,
config.toml, tomli as its one requirement), copied to a scratch directory with three lines
added that every way runs alike: ``VALUE = "..."`` (what the one-line edit changes, printed
by every rank as ``peers-bench value=V rank=R`` once its process group is up), ``FAIL_RANK =
-1`` (the failure edit: that rank ends itself with exit status 3 at step 3, printing the
time), and process-group set-up/teardown skipped when one exists already (Ray Train makes
it).  The ways, each with the peer's own documented tooling:

* ``clusterctl``: ``clusterctl launch --target cpu --workdir DIR --nodes INV -- python
  train.py --steps S`` (the image pushed once with ``clusterctl push``);
* ``by-hand``: what users type today: the project tar'ed over ``ssh`` to every node
  (tomli vendored into it with ``pip install --target``), then ``pdsh -w HOSTS docker run
  --rm --net=host -v ~/proj:/workspace IMAGE torchrun --rdzv-backend=c10d ...`` (the same
  image, pushed the same way);
* ``ray``: Ray on every node (``ray start --head`` on node1, ``ray start --address`` on the
  rest, over ssh, with the flags this sandbox needs: --node-ip-address, a --temp-dir per
  node, --num-cpus=1, --object-store-memory), then ``ray job submit --working-dir DIR --
  python ray_train.py N``: a ``TorchTrainer`` of N workers with ``FailureConfig`` whose loop
  runs train.py's ``main()``.  Every node runs the peers' scratch venv
  (requirements/bench-peers.txt, made by this script: --cache), which the sandbox's nodes
  share with this machine: on real nodes each needs its own copy (the install time and size
  are printed);
* ``mpirun``: as Intel's oneCCL guide starts PyTorch: ``mpiexec -f HOSTFILE -n N -ppn 1``
  (MPICH's hydra, what Intel MPI's mpirun is; ``apt-get install mpich``) over ssh, no
  container: ``python mpi_train.py`` (train.py with its rank from hydra's PMI_RANK and
  PMI_SIZE) in the tree tar'ed to every node as by hand, with the peers' venv's Python;
* ``clusterctl-slurm`` and ``torchx``: the same training through the sandbox's real Slurm
  (made with the sandbox when one of them is asked for): ``clusterctl launch ... --scheduler
  slurm`` (one sbatch job of the inventory's nodes, a container per node of the code
  image), and ``torchx run -s slurm -cfg partition=sandbox dist.ddp -j Nx1 --cpu 1 --script
  train.py`` from the project directory (TorchX's heterogeneous job of N one-node groups,
  each a torchrun whose rendezvous is rank 0's node by its Slurm name, which the sandbox's
  Slurm jobs resolve; the job runs in the project directory with the venv it was submitted
  from: the shared file system of a Slurm site).  Without Slurm accounting ``torchx run``
  exits 1 after its submit and ``torchx status``/``log`` fail (they read ``sacct``), so the
  user follows the replicas' output files and scontrol (TORCHX_FOLLOW); ``edit_queued_s``
  is how long Slurm kept the job queued (TorchX's heterogeneous job starts on Slurm's
  backfill pass, every 30 s by default).

Per way and node count (--nodes, default 2,4; one rank per node), in one run:

* ``setup_s``: nothing of the project on the nodes to every rank of the first run running
  (clusterctl: the first launch, its requirements layer built and shipped; by-hand: pip
  --target, the tar to every node, pdsh; ray: ``ray start`` on every node until the cluster
  counts N nodes, then the first submit); ``image_push_s`` (clusterctl, by-hand) and
  ``venv_install_s`` (ray) are the node-level installs before that, printed beside it;
* ``edit_s``: a one-line edit of train.py to every rank printing the new value (median of
  --repeat);
* ``fail_stop_s``: FAIL_RANK's exit to every process of the job on the sandbox gone (found
  by network namespace in /proc), ``fail_exit_s`` to the user's command returning, and
  ``fail_rc`` (the exit status the user sees); a job still running --stop-wait s after the
  failure is recorded as such and killed;
* ``head_cpu_s``/``head_mb``: CPU seconds and peak memory of the user's command's process
  tree on this machine during an edit run; for ray also its head node's daemons
  (``ray_head_mb``, ``ray_head_cpu_s``: the processes of node1's Ray, which the cluster
  keeps running between jobs) and a worker node's (``ray_worker_mb``);
* ``lines``: of the N x S metrics lines the ranks print (one per rank per step), how many
  arrived whole (``lines_ok``) in the user's terminal, and how many came mixed (a
  metrics line that does not parse).

* ``lost_*`` (the ways that recover from a lost node: clusterctl, ray, torchx): a run of
  LOST_STEPS steps slowed to LOST_STEP_SECONDS each, a checkpoint every 5 (clusterctl:
  ``--max-restarts 1 --checkpoint DIR``, the next node ``spare: true`` in the inventory;
  ray: Ray Train's own ``report(checkpoint=...)``/``get_checkpoint()`` and
  ``FailureConfig(max_failures=1)``, the next node joining the cluster once every worker
  is placed; torchx: ``--max_retries 1``, Slurm requeueing the job onto idle nodes, which
  it does once it calls the lost node down: about 10 minutes, the run's limit 15); once every rank passed step LOST_AT_STEP, node2's link goes down (the
  sandbox's cable pulled, as ``clusterctl fault link-down``): ``lost_s`` is that moment to
  every rank of the next attempt printing its first metrics line, ``lost_resumed_from``
  the checkpoint's step, ``lost_same_weights`` whether rank 0's final weights equal those
  of the same training run uninterrupted (torchrun on this machine, the same torch).

Not measured here (the page says why): dstack and SkyPilot (their set-up downloads from
the internet); clusterctl's Slurm way after a lost node (its job names its nodes).

Run as root with the local engine up and the cpu image built::

    sudo make bench-peers        # or: sudo .venv/bin/python benchmarks/peers.py
        [--nodes 2,4] [--repeat 1] [--steps 200] [--ways clusterctl,by-hand,ray,mpirun]
        [--cache /var/lib/clusterctl/bench-peers] [--stop-wait 90] [--keep]
        [--json FILE] [--plot FILE.png]
    .venv/bin/python benchmarks/peers.py --setup-only      # only the peers' venv (no root)

It creates its own sandbox ("bpeer", 10.213.81.0/24; --name/--subnet), one rank per node,
and removes it at the end, also on failure or Ctrl-C; the Ray daemons it started are
stopped by their process ids (``ray stop`` would end every Ray process of this machine).
Bad input (--repeat below 1, bad --nodes or --ways, a malformed --name or --subnet, an
output in a directory that does not exist, not root, no pdsh or mpiexec.hydra, no Slurm for
its ways, no engine or no cpu image) is
one message saying what is valid and exit status 2, before the sandbox is made.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import selectors
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clusterctl.cluster import distribute, engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.sandbox import processes, slurm
from clusterctl.core.errors import UserError
from clusterctl.core.tools import require_binaries
from clusterctl.image import targets

if __package__:                 # imported as benchmarks.peers (the tests)
    from . import plot as benchplot
else:                           # run as a script: benchmarks/ is sys.path[0]
    import plot as benchplot

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "own-project"
REQUIREMENTS = REPO / "requirements" / "bench-peers.txt"
WAYS = ("clusterctl", "by-hand", "ray", "mpirun", "clusterctl-slurm", "torchx")
SLURM_WAYS = ("clusterctl-slurm", "torchx")
RUN_TIMEOUT = 300.0
FAIL_STEP = 3
#: the node-lost run: steps, seconds per step, and the step every rank has passed when the
#: benchmark takes node2's link down (rank 1's node; the spare is the node after the last)
LOST_STEPS, LOST_STEP_SECONDS, LOST_AT_STEP = 60, 0.25, 12
LOST_NODE = "node2"
OBJECT_STORE = 150_000_000
RAY_PORT, DASHBOARD_PORT, RDZV_PORT = 6379, 8265, 29400
#: figures of the peers that cannot run here (or not in this benchmark), transcribed from
#: /work/shared/FIELD-NOTES.md: what they published, or what a try by hand here gave
PUBLISHED = [
    {"what": "dstack: submit -> running on an idle node (published 10-15 s; SSH fleets download "
             "their shim and runner at set-up: not here)", "seconds": 10,
     "source": "dstack docs; a prototype ~1 s, dstack #3920"},
    {"what": "SkyPilot: sky exec on a running cluster (SSH node pools install k3s from the "
             "internet: not here)", "seconds": 5.7, "source": "skypilot PR #3157"},
    {"what": "SkyPilot: 100 nodes launched on Kubernetes", "seconds": 56, "source": "skypilot PR #4393"},
    {"what": "nvidia-resiliency-ext: in-job restart after a fault", "seconds": 60,
     "source": "NVRx docs"},
]

# --------------------------------------------------------------------------- the project

RAY_TRAIN = '''"""The own-project training as a Ray Train job: a TorchTrainer of N workers, each running
train.py's main() (Ray Train makes the gloo process group; train.py keeps it)."""
import sys

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    sys.argv = ["train.py", *config["argv"]]
    import train
    if config["recover"]:      # Ray Train's own checkpoints: reported by every rank, rank 0's kept
        import os
        import tempfile

        import ray.train
        import torch
        from ray.train import Checkpoint

        def load():
            ckpt = ray.train.get_checkpoint()
            if ckpt is None:
                return None
            with ckpt.as_directory() as d:
                saved = torch.load(os.path.join(d, "bench-ckpt.pt"))
            return saved["step"], saved["model"]

        def save(step, state, rank):
            with tempfile.TemporaryDirectory() as d:
                ckpt = None
                if rank == 0:
                    torch.save({"step": step, "model": state}, os.path.join(d, "bench-ckpt.pt"))
                    ckpt = Checkpoint.from_directory(d)
                ray.train.report({"step": step}, checkpoint=ckpt)

        train.LOAD, train.SAVE = load, save
    train.main()


if __name__ == "__main__":
    # ray_train.py N [--recover NAME] TRAIN_ARGS...: --recover retries once from the last
    # checkpoint (FailureConfig(max_failures=1)), a run of its own name
    workers, argv = int(sys.argv[1]), sys.argv[2:]
    recover = argv[:1] == ["--recover"]
    name = argv[1] if recover else "peers-bench"
    argv = argv[2:] if recover else argv
    trainer = TorchTrainer(
        loop, train_loop_config={"argv": argv, "recover": recover},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path="/tmp/ray-peers-bench-results",
                             failure_config=FailureConfig(max_failures=1 if recover else 0)))
    trainer.fit()
'''


#: train.py's additions for the node-lost run: a checkpoint after every step, loaded on
#: start, through clusterctl's ``--checkpoint DIR`` (CLUSTERCTL_CHECKPOINT_DIR) or, under Ray
#: Train, its own Checkpoint API (ray_train.py sets LOAD and SAVE), every 5 steps (a Ray
#: Train report with a checkpoint took 2 s here: one per step would be most of the run); the data a rank drew
#: before the checkpoint is drawn again, unused, so a resumed run ends with the weights of
#: an uninterrupted one; PEERS_STEP_SECONDS slows each step
RECOVERY_LINES = '''STARTED = round(time.time(), 3)
STEP_SECONDS = float(os.environ.get("PEERS_STEP_SECONDS", "0"))
CKPT_EVERY = 5  # steps between checkpoints
CKPT = os.environ.get("CLUSTERCTL_CHECKPOINT_DIR")
LOAD = None     # () -> (step, state dict) or None: Ray Train's get_checkpoint
SAVE = None     # (step, state dict, rank): Ray Train's report, on every rank


def resume(model, data, cfg, rank):
    loaded = LOAD() if LOAD else None
    if loaded is None and CKPT and (Path(CKPT) / "bench-ckpt.pt").exists():
        saved = torch.load(Path(CKPT) / "bench-ckpt.pt")
        loaded = saved["step"], saved["model"]
    if loaded is None:
        return 0
    step, state = loaded
    model.module.load_state_dict(state)
    for _ in range(step):
        torch.randn(cfg["batch"], cfg["features"], generator=data)
        torch.randn(cfg["batch"], 1, generator=data)
    # DDP lays its gradient bucket out anew after a process's first backward, and where a
    # value lies in it decides the order gloo adds the ranks' parts (beyond 2 ranks, a
    # different sum): one backward whose gradients are dropped, so that every step trained
    # here uses the layout the uninterrupted run used (examples/ddp_smoke.py does the same)
    model(torch.zeros(cfg["batch"], cfg["features"])).sum().backward()
    model.zero_grad()
    print(f"peers-bench resumed rank={rank} step={step} t={time.time():.3f}", flush=True)
    return step


def keep(step, model, rank):
    time.sleep(STEP_SECONDS)
    if step % CKPT_EVERY:
        return
    if SAVE:
        SAVE(step, model.module.state_dict(), rank)
    elif CKPT and rank == 0:
        tmp = Path(CKPT) / f".bench-ckpt.{os.getpid()}"
        torch.save({"step": step, "model": model.module.state_dict()}, tmp)
        os.replace(tmp, Path(CKPT) / "bench-ckpt.pt")
'''


MPI_TRAIN = '''"""train.py under mpiexec (MPICH's hydra, the launcher of Intel MPI), as Intel's oneCCL
guide starts PyTorch: the script takes its place in the job from hydra's PMI_RANK and
PMI_SIZE, and the rendezvous from MASTER_ADDR and MASTER_PORT (mpiexec -genv)."""
import os
import runpy
import sys

os.environ.update(RANK=os.environ["PMI_RANK"], WORLD_SIZE=os.environ["PMI_SIZE"],
                  LOCAL_RANK=os.environ.get("MPI_LOCALRANKID", "0"))
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
'''


def make_project(dst: Path) -> None:
    """examples/own-project copied to ``dst``, with the benchmark's three additions (the VALUE
    and FAIL_RANK lines and an existing process group kept), ray_train.py and mpi_train.py."""
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    path = dst / "train.py"
    text = path.read_text()
    swaps = [
        ("from torch.nn.parallel import DistributedDataParallel\n",
         "from torch.nn.parallel import DistributedDataParallel\n\n"
         'VALUE = "start"\nFAIL_RANK = -1\n' + RECOVERY_LINES),
        ('    dist.init_process_group("gloo")\n',
         '    owned = not dist.is_initialized()\n    if owned:\n        dist.init_process_group("gloo")\n'),
        ("    rank, world = dist.get_rank(), dist.get_world_size()\n",
         "    rank, world = dist.get_rank(), dist.get_world_size()\n"
         '    print(f"peers-bench value={VALUE} rank={rank} ", flush=True)\n'),
        ("    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)\n",
         "    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)\n"
         "    start = resume(model, data, cfg, rank)\n"),
        ("    for step in range(1, args.steps + 1):\n",
         "    for step in range(start + 1, args.steps + 1):\n"),
        ("        optimizer.step()\n",
         "        optimizer.step()\n"
         "        keep(step, model, rank)\n"),
        ('"samples": step * cfg["batch"], "time": round(time.time(), 3)}',
         '"samples": step * cfg["batch"], "time": round(time.time(), 3), "start": STARTED}'),
        ("        x = torch.randn(",
         f"        if rank == FAIL_RANK and step == {FAIL_STEP}:\n"
         '            print(f"peers-bench failing rank={rank} t={time.time():.3f}", flush=True)\n'
         "            os._exit(3)\n"
         "        x = torch.randn("),
        ("    dist.destroy_process_group()\n",
         "    if owned:\n        dist.destroy_process_group()\n"),
    ]
    for old, new in swaps:
        if text.count(old) != 1:
            raise UserError(f"{EXAMPLE / 'train.py'}: the line {old.strip()!r} the benchmark "
                            "edits is not there once; update benchmarks/peers.py's make_project")
        text = text.replace(old, new)
    path.write_text(text)
    (dst / "ray_train.py").write_text(RAY_TRAIN)
    (dst / "mpi_train.py").write_text(MPI_TRAIN)
    with open(dst / ".gitignore", "a") as f:         # by-hand's vendored tomli ships by hand only
        f.write(".deps/\n")


def edit(project: Path, name: str, value: str) -> None:
    """The one-line edit: train.py's ``NAME = ...`` line gets ``value`` (a Python literal)."""
    path = project / "train.py"
    new, count = re.subn(rf"^{name} = .*$", f"{name} = {value}", path.read_text(), flags=re.MULTILINE)
    assert count == 1, f"train.py lost its {name} line"
    path.write_text(new)


# --------------------------------------------------------------------------- the peers' venv

def venv_dir(cache: Path) -> Path:
    return cache / "venv"


def ensure_venv(cache: Path, log=print) -> dict:
    """The peers' scratch venv (requirements/bench-peers.txt), made once under ``cache``: its
    install time (from its record), size and versions.  A half-made one is made again."""
    venv = venv_dir(cache)
    record = venv / "peers-bench-install.json"
    if not record.is_file():
        shutil.rmtree(venv, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
        log(f"installing the peers ({REQUIREMENTS.relative_to(REPO)}) into {venv} ...")
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-r", str(REQUIREMENTS)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(f"pip install -r {REQUIREMENTS} into {venv} failed:\n{r.stderr[-2000:]}")
        took = time.monotonic() - t
        size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
        record.write_text(json.dumps({"install_s": round(took, 1), "mb": round(size / 1e6),
                                      "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}))
    info = json.loads(record.read_text())
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import ray, torchx, torch; print(ray.__version__, torchx.__version__, torch.__version__)"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        info["ray"], info["torchx"], info["torch"] = r.stdout.split()
    return info


# --------------------------------------------------------------------------- watching a command

def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (from /proc's parent ids)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


@dataclass
class Timed:
    """One command, its output stamped against its start."""

    rc: int = -1
    exit_s: float = 0.0
    ranks_s: float | None = None     # every rank printed value=VALUE
    fail_at: float | None = None     # the failing rank's time.time()
    cpu_s: float = 0.0               # the command's process tree, this machine
    peak_mb: float = 0.0
    lines_ok: int = 0
    lines_mixed: int = 0
    out: list[tuple[float, str]] = field(default_factory=list)   # (seconds after the start, line)
    killed: bool = False
    end_wall: float = 0.0            # time.time() when the command had exited
    gone_at: float | None = None     # time.time() when no job process was left (after fail_at)
    queued_s: float | None = None    # how long Slurm kept the job queued (TorchX's follow says)


METRICS = re.compile(r"clusterctl-metrics (\{.*)$")


def read_lines(fd: int, buf: bytes) -> tuple[list[str], bytes, bool]:
    """What ``fd`` holds now, as whole lines after ``buf``; the rest of a line is the
    returned buffer; True at the end of the output."""
    data = os.read(fd, 65536)
    if not data:
        return [], buf, True
    *lines, rest = (buf + data).split(b"\n")
    return [raw.decode(errors="replace") for raw in lines], rest, False


def watch(argv: list[str], env: dict[str, str], ranks: int, value: str | None = None,
          stop_at: float | None = None, timeout: float = RUN_TIMEOUT,
          inodes: set[int] | None = None) -> Timed:
    """Run ``argv`` (in its own process group); the time every one of ``ranks`` printed
    ``value=VALUE``, the failure line's time, its tree's CPU and peak memory, the metrics
    lines that arrived whole or mixed.  ``stop_at``: the wait after a failure line before
    the command is killed (a job that does not stop); ``inodes``: the nodes' network
    namespaces, watched for the job's processes once the failure line came (gone_at)."""
    t0, wall0 = time.monotonic(), time.time()
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    res = Timed()
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            peak[0] = max(peak[0], rss_mb(tree_pids(p.pid)))
            if inodes and res.fail_at is not None and res.gone_at is None and not job_pids(inodes):
                res.gone_at = time.time()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    seen: set[str] = set()
    want = re.compile(rf"value={re.escape(value)} rank=(\d+) ") if value else None
    buf = b""
    deadline = t0 + timeout
    while True:
        now = time.monotonic()
        limit = deadline if res.fail_at is None or stop_at is None else \
            min(deadline, t0 + (res.fail_at - wall0) + stop_at)
        if now >= limit:
            os.killpg(p.pid, signal.SIGKILL)
            res.killed = True
            break
        if not sel.select(timeout=min(limit - now, 1.0)):
            continue
        lines, buf, eof = read_lines(p.stdout.fileno(), buf)
        if eof:
            break
        for line in lines:
            res.out.append((time.monotonic() - t0, line))
            if want is not None and res.ranks_s is None:
                seen.update(want.findall(line))
                if len(seen) >= ranks:
                    res.ranks_s = time.monotonic() - t0
            m = re.search(r"peers-bench failing rank=\d+ t=([0-9.]+)", line)
            if m and res.fail_at is None:
                res.fail_at = float(m.group(1))
            if m := re.match(r"peers-bench slurm-queued-s=(\d+)$", line):
                res.queued_s = float(m.group(1))
            m = METRICS.search(line)
            if m:
                try:
                    json.loads(m.group(1))
                    res.lines_ok += 1
                except ValueError:
                    res.lines_mixed += 1
            elif "clusterctl-metrics" in line:
                res.lines_mixed += 1
    res.rc = p.wait()
    res.exit_s, res.end_wall = time.monotonic() - t0, time.time()
    done.set()
    sampler.join()
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res.cpu_s = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    res.peak_mb = peak[0]
    return res


WEIGHTS = re.compile(r"rank 0/\d+ weights-sha256=([0-9a-f]+)")
RESUMED = re.compile(r"peers-bench resumed rank=(\d+) step=(\d+)")


def lost_run(argv: list[str], env: dict[str, str], ranks: int, ready, fault,
             timeout: float = RUN_TIMEOUT) -> dict:
    """Run ``argv``; once every rank passed LOST_AT_STEP and ``ready()`` says so, ``fault()``
    (returns its time.time()); then the time every rank of the next attempt (a process that
    started after the fault) printed its first metrics line, the step it resumed from, the
    final weights and the exit status."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    steps: dict[int, int] = {}
    back: dict[int, float] = {}
    resumed: set[int] = set()
    res: dict = {"fault_at": None, "weights": None, "out": []}
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    buf, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if res["fault_at"] is None and len(steps) >= ranks and min(steps.values()) >= LOST_AT_STEP \
                and ready():
            res["fault_at"] = fault()
        if not sel.select(timeout=0.25):
            continue
        lines, buf, eof = read_lines(p.stdout.fileno(), buf)
        if eof:
            break
        for line in lines:
            res["out"] = (res["out"] + [line])[-40:]
            m = METRICS.search(line)
            if m:
                try:
                    d = json.loads(m.group(1))
                    rank, step, t, started = int(d["rank"]), int(d["step"]), float(d["time"]), d.get("start", 0)
                except (ValueError, KeyError, TypeError):
                    continue
                if res["fault_at"] is None:
                    steps[rank] = max(steps.get(rank, 0), step)
                elif started > res["fault_at"]:
                    back.setdefault(rank, t)
            if (m := RESUMED.search(line)) and res["fault_at"] is not None:
                resumed.add(int(m.group(2)))
            if m := WEIGHTS.search(line):
                res["weights"] = m.group(1)
    else:
        os.killpg(p.pid, signal.SIGKILL)
        res["killed"] = True
    res["rc"] = p.wait()
    if res["fault_at"] is not None and len(back) >= ranks:
        res["training_again_s"] = round(max(back.values()) - res["fault_at"], 2)
    res["resumed_from"] = min(resumed) if resumed else None
    return res


def reference_weights(bench, n: int, steps: int) -> str | None:
    """rank 0's weights after ``steps`` uninterrupted steps of n ranks: train.py under torchrun
    on this machine (the peers' venv: the torch of the image, 2.13.0+cpu)."""
    r = subprocess.run([str(venv_dir(bench.cache) / "bin" / "torchrun"), "--standalone",
                        "--nproc-per-node", str(n), "train.py", "--steps", str(steps)],
                       cwd=bench.project, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    m = WEIGHTS.search(r.stdout)
    return m.group(1) if m else None


def node_lost(bench, way, n: int) -> dict:
    """The node-lost run of a way that recovers (row fields ``lost_*``)."""
    argv, env = way.lost_argv(n, LOST_STEPS)
    sb = bench.sb

    def fault() -> float:
        sandbox.set_link(sb.name, LOST_NODE, up=False)
        return time.time()
    try:
        r = lost_run(argv, env, n, lambda: way.lost_ready(n), fault, timeout=way.lost_timeout)
    finally:
        sandbox.set_link(sb.name, LOST_NODE, up=True)
    way.lost_cleanup(n)
    ref = bench.reference.get(n)
    row = {"lost_rc": r["rc"], "lost_s": r.get("training_again_s"), "lost_resumed_from": r["resumed_from"],
           "lost_weights": r["weights"], "lost_same_weights": None if not (ref and r["weights"]) else r["weights"] == ref}
    if r["fault_at"] is None:
        row["lost_note"] = "the fault was never injected: " + " / ".join(r["out"][-4:])
    elif row["lost_s"] is None:
        row["lost_note"] = "not every rank trained again: " + " / ".join(r["out"][-4:])
    return row


# --------------------------------------------------------------------------- the sandbox's processes

def netns_inodes(sb: sandbox.Sandbox, n: int) -> set[int]:
    return {os.stat(f"/run/netns/{node.netns}").st_ino for node in sb.nodes[:n]}


def netns_processes(inodes: set[int]) -> Iterator[tuple[int, bytes]]:
    """(pid, command line with NULs as spaces) of every process in one of the network
    namespaces ``inodes`` (those gone meanwhile left out)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.stat(d / "ns" / "net").st_ino not in inodes:
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        yield int(d.name), cmd


def job_pids(inodes: set[int], patterns=("train.py", "RayTrainWorker", "ray_train.py")) -> list[int]:
    """Processes of the job on the sandbox's nodes: in one of their network namespaces, with
    one of ``patterns`` in the command line."""
    wanted = [p.encode() for p in patterns]
    return [pid for pid, cmd in netns_processes(inodes) if any(p in cmd for p in wanted)]


def wait_gone(inodes: set[int], limit: float) -> float | None:
    """time.time() when the last job process was gone (None: still there after ``limit`` s)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not job_pids(inodes):
            return time.time()
        time.sleep(0.1)
    return None


# --------------------------------------------------------------------------- the ways

class Way:
    name = ""
    needs = ""                       # what every node must hold

    def __init__(self, bench: Bench) -> None:
        self.b = bench

    def inodes(self, n: int) -> set[int]:     # the namespaces the job's processes may be in
        return netns_inodes(self.b.sb, n)

    def ready(self, n: int) -> None:          # before the set-up's clock starts: the cluster settled
        pass

    def setup(self, n: int) -> dict:          # what to do once per node count before the first run
        return {}

    def argv(self, n: int) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def prepare(self, n: int) -> float:       # per run, before the command (by-hand's copy): wall s
        return 0.0

    def teardown(self, n: int) -> None:
        pass

    def extra(self, n: int) -> dict:
        return {}

    recovers = False                 # offers recovery from a lost node (the node-lost run)
    lost_timeout = RUN_TIMEOUT       # the node-lost run's limit

    def lost_argv(self, n: int, steps: int) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def lost_ready(self, n: int) -> bool:   # the spare can take the lost node's place now
        return True

    def lost_cleanup(self, n: int) -> None:
        pass


class Clusterctl(Way):
    name = "clusterctl"
    needs = "sshd, a container engine, the cpu image (clusterctl push); nothing of clusterctl"

    def argv(self, n):
        return ([sys.executable, "-m", "clusterctl", "launch", "--target", "cpu", "--workdir",
                 str(self.b.project), "--nodes", str(self.b.inventory(n)), "--",
                 "python", "train.py", "--steps", str(self.b.args.steps)], self.b.cli_env)

    recovers = True

    def lost_argv(self, n, steps):
        """``--max-restarts 1 --checkpoint DIR`` on the n nodes and the next one as a spare."""
        ckpt = self.b.tmp / f"ckpt-{n}"
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir()
        return ([sys.executable, "-m", "clusterctl", "launch", "--target", "cpu", "--workdir",
                 str(self.b.project), "--nodes", str(self.b.inventory(n, spare=True)),
                 "--max-restarts", "1", "--checkpoint", str(ckpt),
                 "--set", f"PEERS_STEP_SECONDS={LOST_STEP_SECONDS}", "--",
                 "python", "train.py", "--steps", str(steps)], self.b.cli_env)

    def lost_cleanup(self, n):
        """The lost node's container of the first attempt (clusterctl could not reach it)."""
        left = processes.node_docker(self.b.sb.name, LOST_NODE, "ps", "-aq", "--filter",
                                     "label=io.clusterctl.run").stdout.split()
        if left:
            processes.node_docker(self.b.sb.name, LOST_NODE, "rm", "--force", *left)


class ClusterctlSlurm(Way):
    """``clusterctl launch --scheduler slurm``: the same launch through the sandbox's Slurm
    (one sbatch job of the inventory's n nodes, a container per node from the code image),
    beside TorchX's Slurm way."""

    name = "clusterctl-slurm"
    needs = "Slurm (a slurmd on every node), a container engine, the cpu image; nothing of clusterctl"

    def inodes(self, n):
        return netns_inodes(self.b.sb, self.b.sb.node_count)

    def argv(self, n):
        argv, env = Clusterctl(self.b).argv(n)
        at = argv.index("--")
        return argv[:at] + ["--scheduler", "slurm"] + argv[at:], {**env, **self.b.slurm_env}

    def ready(self, n):
        slurm_settled(self.b)

    def teardown(self, n):
        slurm.cancel_jobs(self.b.sb.name)


def slurm_settled(bench, limit: float = 240.0) -> None:
    """Wait until Slurm counts every node idle (``idle``, not ``idle*``: not responding, or
    ``alloc``: a job left), so that a Slurm way's set-up starts on a settled cluster: the
    node-lost runs before it take node2's link down.  (The first run through clusterctl's
    Slurm way once took 41 s at 2 nodes against 6 s at 4; the cause was not found, --trace
    keeps every command's stamped output to see it.)"""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        states = slurm.node_states(bench.sb.name)
        if states and all(v == "idle" for v in states.values()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"Slurm's nodes did not all come back idle within {limit:.0f} s: "
                       f"{slurm.node_states(bench.sb.name)}")


class ByHand(Way):
    name = "by-hand"
    needs = "sshd, a container engine, the image (pushed); pdsh on the head; tomli vendored in the tree"

    def setup(self, n):
        deps = self.b.project / ".deps"
        if not deps.is_dir():
            subprocess.run([str(venv_dir(self.b.cache) / "bin" / "pip"), "install", "-q", "--target",
                            str(deps), "tomli==2.0.1"], check=True, capture_output=True)
        return {}

    def prepare(self, n):
        """The tree to every node: tar over ssh, in parallel (one ssh per node)."""
        t = time.monotonic()
        pairs = []
        for ip in self.b.ips[:n]:
            tar = subprocess.Popen(["tar", "-C", str(self.b.project), "-cf", "-", "."], stdout=subprocess.PIPE)
            ssh = subprocess.Popen([*self.b.ssh, ip, 'rm -rf "$HOME/proj" && mkdir "$HOME/proj" && '
                                    'tar -C "$HOME/proj" -xf -'],
                                   stdin=tar.stdout)
            tar.stdout.close()
            pairs.append((tar, ssh))
        if any(tar.wait() or ssh.wait() for tar, ssh in pairs):
            raise RuntimeError("by-hand: the tar to a node failed")
        return time.monotonic() - t

    def argv(self, n):
        self.b.run_id += 1
        # every sandbox node has the same host name: the node's address from the login, and
        # node1 told it hosts the rendezvous (torchrun cannot tell from the host name)
        cmd = ("ip=$(echo $SSH_CONNECTION | cut -d' ' -f3); "
               f"host=$([ $ip = {self.b.ips[0]} ] && echo 1 || echo 0); "
               f"docker run --rm --name peers-bench-{self.b.run_id} --net=host "
               "-v $HOME/proj:/workspace:ro -w /workspace -e PYTHONPATH=/workspace/.deps "
               f"-e GLOO_SOCKET_IFNAME=eth0 {self.b.image} torchrun --nnodes={n} --nproc-per-node=1 "
               "--local-addr=$ip --rdzv-conf=is_host=$host "
               f"--rdzv-backend=c10d --rdzv-endpoint={self.b.ips[0]}:{RDZV_PORT} "
               f"--rdzv-id=peers-{self.b.run_id} --max-restarts=0 train.py --steps {self.b.args.steps}")
        env = {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {self.b.ssh_config} %h"}
        return ["pdsh", "-w", ",".join(self.b.ips[:n]), cmd], env

    def teardown(self, n):
        for node in self.b.sb.nodes[:n]:       # a by-hand job that did not stop: its containers
            subprocess.run(["docker", "-H", node.docker_host, "rm", "-f", *self._containers(node)],
                           capture_output=True)

    def _containers(self, node) -> list[str]:
        r = subprocess.run(["docker", "-H", node.docker_host, "ps", "-aq", "--filter", "name=peers-bench-"],
                           capture_output=True, text=True)
        return r.stdout.split() or ["peers-bench-none"]


class Mpirun(ByHand):
    """``mpiexec -f HOSTFILE -n N -ppn 1``, as Intel's oneCCL guide runs PyTorch: MPICH's
    hydra (what Intel MPI's mpirun is) starts ``python mpi_train.py`` on every host over
    ssh, outside any container, in the tree tar'ed to each node as by hand; the nodes need
    Python with torch and tomli (the peers' venv, as for Ray) and hydra's proxy."""

    name = "mpirun"
    needs = "MPICH's hydra proxy; Python with torch and tomli (the venv); the tree copied; ssh to every node"

    def setup(self, n):
        self.hostfile = self.b.tmp / f"hostfile-{n}"
        self.hostfile.write_text("".join(f"{ip}:1\n" for ip in self.b.ips[:n]))
        self.ssh = self.b.tmp / "mpi-ssh"       # hydra's -launcher-exec takes a program, no options
        self.ssh.write_text(f'#!/bin/sh\nexec ssh -F {self.b.ssh_config} "$@"\n')
        self.ssh.chmod(0o755)
        return {}

    def argv(self, n):
        python = venv_dir(self.b.cache) / "bin" / "python"
        # every node's own $HOME/proj (hydra's -wdir takes one path for all)
        cmd = f'cd "$HOME/proj" && exec {python} mpi_train.py --steps {self.b.args.steps}'
        return (["mpiexec.hydra", "-f", str(self.hostfile), "-n", str(n), "-ppn", "1",
                 "-launcher", "ssh", "-launcher-exec", str(self.ssh),
                 "-localhost", self.b.sb.head_ip,
                 # hydra passes this machine's whole environment by default, HOME too: each
                 # node's login environment instead, plus the rendezvous
                 "-genvnone",
                 "-genv", "MASTER_ADDR", self.b.ips[0], "-genv", "MASTER_PORT", str(RDZV_PORT),
                 "-genv", "GLOO_SOCKET_IFNAME", "eth0",
                 "bash", "-c", cmd], {**os.environ})

    def teardown(self, n):
        pass


def alive_nodes(dashboard: str) -> int:
    """The nodes Ray's state API (the head's dashboard) counts as alive; 0 while it does not answer."""
    try:
        with urllib.request.urlopen(f"{dashboard}/api/v0/nodes?limit=1000", timeout=5) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return 0
    return len(re.findall(r'"state":\s*"ALIVE"', text))


class Ray(Way):
    name = "ray"
    needs = "Python and ray[default,train], torch, tomli (the venv) on every node; Ray's daemons running"

    def __init__(self, bench):
        super().__init__(bench)
        self.started: list[int] = []

    def _ray(self) -> str:
        return str(venv_dir(self.b.cache) / "bin" / "ray")

    def setup(self, n):
        """``ray start`` on every node over ssh, until the cluster counts n nodes: wall s."""
        t = time.monotonic()
        head = self.b.ips[0]
        common = f"--num-cpus=1 --object-store-memory={OBJECT_STORE} --disable-usage-stats"
        cmds = [f"{self._ray()} start --head --node-ip-address={head} --port={RAY_PORT} "
                f"--dashboard-host={head} --dashboard-port={DASHBOARD_PORT} --include-dashboard=true "
                f"--temp-dir=/tmp/ray-{self.b.args.name}-1 {common}"]
        cmds += [f"{self._ray()} start --address={head}:{RAY_PORT} --node-ip-address={ip} "
                 f"--temp-dir=/tmp/ray-{self.b.args.name}-{i} {common}"
                 for i, ip in enumerate(self.b.ips[1:n], start=2)]
        self._ssh(head, cmds[0])
        procs = [subprocess.Popen([*self.b.ssh, ip, c + " >/dev/null 2>&1 </dev/null"])
                 for ip, c in zip(self.b.ips[1:n], cmds[1:], strict=True)]
        for p in procs:
            p.wait()
        while time.monotonic() - t < 120:
            if alive_nodes(f"http://{head}:{DASHBOARD_PORT}") >= n:
                break
            time.sleep(0.25)
        else:
            raise RuntimeError(f"ray: {n} nodes did not join within 120 s")
        self.started = self._pids(n)
        return {"cluster_up_s": round(time.monotonic() - t, 2)}

    def _ssh(self, ip: str, cmd: str) -> None:
        r = subprocess.run([*self.b.ssh, ip, cmd + " >/dev/null 2>&1 </dev/null"],
                           capture_output=True, text=True, timeout=180)
        if r.returncode:
            raise RuntimeError(f"ray start on {ip} exited {r.returncode}: {r.stderr[-500:]}")

    def _pids(self, n: int, node: int | None = None) -> list[int]:
        """Ray's processes (the venv's, in the sandbox's namespaces; ``node``: that one's)."""
        nodes = self.b.sb.nodes[:n] if node is None else [self.b.sb.nodes[node]]
        inodes = {os.stat(f"/run/netns/{x.netns}").st_ino for x in nodes}
        mark = str(venv_dir(self.b.cache)).encode()
        return [pid for pid, cmd in netns_processes(inodes)
                if mark in cmd or b"ray::" in cmd or b"/ray/" in cmd]

    def argv(self, n):
        env = {**os.environ, "RAY_ADDRESS": f"http://{self.b.ips[0]}:{DASHBOARD_PORT}"}
        runtime = {"env_vars": {"GLOO_SOCKET_IFNAME": "eth0", "RAY_DEDUP_LOGS": "0"},
                   "excludes": [".deps"]}
        return ([self._ray(), "job", "submit", "--working-dir", str(self.b.project),
                 "--runtime-env-json", json.dumps(runtime), "--",
                 str(venv_dir(self.b.cache) / "bin" / "python"), "ray_train.py", str(n),
                 "--steps", str(self.b.args.steps)], env)

    recovers = True

    def lost_argv(self, n, steps):
        """The same submit with ``--recover``: FailureConfig(max_failures=1) and Ray Train's
        checkpoints, a run name of its own."""
        argv, env = self.argv(n)
        runtime = json.loads(argv[argv.index("--runtime-env-json") + 1])
        runtime["env_vars"]["PEERS_STEP_SECONDS"] = str(LOST_STEP_SECONDS)
        argv[argv.index("--runtime-env-json") + 1] = json.dumps(runtime)
        at = argv.index("ray_train.py") + 2
        argv[at:] = ["--recover", f"peers-lost-{n}-{int(time.time())}", "--steps", str(steps)]
        self.spare = None
        return argv, env

    def lost_ready(self, n):
        """The spare joins once every worker is placed (before, Ray might place one there):
        ``ray start`` on node n+1, in the background; ready when the cluster counts it."""
        head = self.b.ips[0]
        if getattr(self, "spare", None) is None:
            cmd = (f"{self._ray()} start --address={head}:{RAY_PORT} --node-ip-address={self.b.ips[n]} "
                   f"--temp-dir=/tmp/ray-{self.b.args.name}-{n + 1} --num-cpus=1 "
                   f"--object-store-memory={OBJECT_STORE} --disable-usage-stats")
            self.spare = subprocess.Popen([*self.b.ssh, self.b.ips[n], cmd + " >/dev/null 2>&1 </dev/null"])
            return False
        return alive_nodes(f"http://{head}:{DASHBOARD_PORT}") >= n + 1

    def extra(self, n):
        head = self._pids(n, 0)
        worker = self._pids(n, 1) if n > 1 else []
        return {"ray_head_mb": round(rss_mb(head)), "ray_head_procs": len(head),
                "ray_worker_mb": round(rss_mb(worker)), "_head_pids": head}

    def teardown(self, n):
        pids = set(self.started) | set(self._pids(self.b.sb.node_count))   # the spare's too
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        end = time.monotonic() + 10
        while time.monotonic() < end and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for i in range(1, self.b.sb.node_count + 1):
            shutil.rmtree(f"/tmp/ray-{self.b.args.name}-{i}", ignore_errors=True)
        shutil.rmtree("/tmp/ray-peers-bench-results", ignore_errors=True)
        self.started = []


#: TorchX's Slurm submit, then what a user does without Slurm accounting (``torchx run``
#: exits 1 and ``torchx status``/``log`` fail: they read ``sacct``): follow the replicas'
#: ``slurm-ID-ROLE-K.out``/``.err`` files in the project directory until scontrol says the
#: job ended, then exit with its exit code (and say how long Slurm kept the job queued:
#: ``peers-bench slurm-queued-s=N``, whole seconds).  {submit}: the ``torchx run`` command line.
TORCHX_FOLLOW = r"""
out=$({submit} 2>&1)
id=$(printf '%s\n' "$out" | sed -n 's#^slurm://[^/]*/\([0-9][0-9]*\)$#\1#p' | head -n 1)
[ -n "$id" ] || {{ printf '%s\n' "$out" >&2; exit 125; }}
files=; for k in $(seq 0 {last}); do files="$files slurm-$id-train-$k.out slurm-$id-train-$k.err"; done
tail -q -n +1 -F $files 2>/dev/null &
follower=$!
going() {{
    states=$(scontrol show job "$id" 2>/dev/null | grep -o 'JobState=[A-Z_]*') &&
        printf '%s\n' "$states" | grep -qE '=(PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUE[A-Z_]*|SUSPENDED)$'
}}
# {settle} s more before believing an end: a job Slurm requeues after a node failure
# may show NODE_FAIL for a moment first
while going || {{ [ {settle} -gt 0 ] && sleep {settle} && going; }}; do
    sleep 0.25
done
sleep 0.5; kill $follower
show=$(scontrol show job "$id" 2>/dev/null)
code=$(printf '%s\n' "$show" | sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p' | sort -n | tail -n 1)
submitted=$(printf '%s\n' "$show" | sed -n 's/.*SubmitTime=\([0-9T:-]*\).*/\1/p' | sort | head -n 1)
started=$(printf '%s\n' "$show" | sed -n 's/.*StartTime=\([0-9T:-]*\).*/\1/p' | sort | tail -n 1)
if [ -n "$submitted" ] && [ -n "$started" ]; then
    echo "peers-bench slurm-queued-s=$(( $(date -d "$started" +%s) - $(date -d "$submitted" +%s) ))"
fi
exit "${{code:-125}}"
"""


class TorchX(Way):
    """``torchx run -s slurm dist.ddp -j Nx1``, TorchX's documented way onto a Slurm cluster:
    one heterogeneous job of N one-node groups, each a ``torchrun`` whose rendezvous is
    rank 0's node by its Slurm name; the job runs in the project directory (the shared file
    system a Slurm site has: here every node is this machine) with the venv it was submitted
    from.  Without Slurm accounting the user follows the output files (TORCHX_FOLLOW)."""

    name = "torchx"
    needs = ("Slurm (a slurmd on every node); Python with torchx, torch and tomli (the venv) "
             "and the project on a file system every node shares")

    def inodes(self, n):
        return netns_inodes(self.b.sb, self.b.sb.node_count)   # Slurm picks the nodes

    def ready(self, n):
        slurm_settled(self.b)

    def _follow(self, n: int, steps: int, options: str = "", settle: int = 0):
        """``torchx run ... dist.ddp -j Nx1 [options]`` from the project directory, followed
        (TORCHX_FOLLOW), with the venv first on PATH (the job runs with what it was submitted from)."""
        bin_dir = venv_dir(self.b.cache) / "bin"
        submit = (f"{bin_dir / 'torchx'} run -s slurm -cfg partition={slurm.PARTITION} dist.ddp "
                  f"-j {n}x1 --cpu 1 {options}--script train.py -- --steps {steps}")
        env = {**os.environ, **self.b.slurm_env, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        return ["bash", "-c", f"cd {shlex.quote(str(self.b.project))}\n"
                + TORCHX_FOLLOW.format(submit=submit, last=n - 1, settle=settle)], env

    def argv(self, n):
        return self._follow(n, self.b.args.steps)

    recovers = True
    lost_timeout = 900.0             # Slurm declares a node down after SlurmdTimeout (300 s)

    def lost_argv(self, n, steps):
        """TorchX's own recovery: ``--max_retries 1`` (the job is submitted ``--requeue`` and
        its script requeues it after a failed srun), the checkpoint directory and the slower
        steps through ``--env``; Slurm may place the next attempt on any idle node."""
        ckpt = self.b.tmp / f"ckpt-torchx-{n}"
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir()
        return self._follow(n, steps, settle=5, options=(
            f"--max_retries 1 --env CLUSTERCTL_CHECKPOINT_DIR={ckpt},"
            f"PEERS_STEP_SECONDS={LOST_STEP_SECONDS} "))

    def lost_ready(self, n):
        """The fault hits the job only when Slurm placed one of its groups on node2."""
        return slurm.node_states(self.b.sb.name).get(LOST_NODE) in ("alloc", "mix")

    def lost_cleanup(self, n):
        self.teardown(n)

    def teardown(self, n):
        """Every job still there (one the benchmark gave up on), and the output files."""
        slurm.cancel_jobs(self.b.sb.name)
        for f in self.b.project.glob("slurm-*.*"):
            f.unlink()


WAY_CLASSES = {"clusterctl": Clusterctl, "by-hand": ByHand, "ray": Ray, "mpirun": Mpirun,
               "clusterctl-slurm": ClusterctlSlurm, "torchx": TorchX}


# --------------------------------------------------------------------------- the bench

class Bench:
    def __init__(self, args, sb: sandbox.Sandbox, tmp: Path, inventory: Path) -> None:
        self.args, self.sb, self.tmp = args, sb, tmp
        self.cache = Path(args.cache)
        self.project = tmp / "project"
        self.data = yaml.safe_load(inventory.read_text())
        self.ips = [node["host"] for node in self.data["nodes"]]
        self.image = args.image
        self.run_id = 0
        self.runs = 0                # commands run (--trace numbers their logs)
        self.reference: dict[int, str | None] = {}   # n -> an uninterrupted run's weights
        self.cli_env = benchplot.cli_env(os.environ, DOCKER_HOST=engine.engine_url() or "",
                                         CLUSTERCTL_RUNS=str(tmp / "runs"))
        self.ssh_config = tmp / "ssh_config"
        self.ssh_config.write_text(
            "Host *\n  User root\n"
            f"  IdentityFile {sb.key_path}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            f"  StrictHostKeyChecking yes\n  UserKnownHostsFile {sb.known_hosts_path}\n"
            "  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        self.ssh = ["ssh", "-F", str(self.ssh_config)]
        self.slurm_env = {"SLURM_CONF": sb.slurm_conf or ""}   # Slurm's clients, this sandbox's

    def inventory(self, n: int, spare: bool = False) -> Path:
        """The first n nodes (``spare``: and the next one, ``spare: true``)."""
        path = self.tmp / f"inventory-{n}{'-spare' if spare else ''}.yaml"
        if not path.exists():
            nodes = self.data["nodes"][:n] + ([{**self.data["nodes"][n], "spare": True}] if spare else [])
            path.write_text(yaml.safe_dump({**self.data, "nodes": nodes}, sort_keys=False))
        return path

    def once(self, way: Way, n: int, value: str | None, stop_wait: float | None = None,
             inodes: set[int] | None = None) -> tuple[Timed, float]:
        prep = way.prepare(n)
        argv, env = way.argv(n)
        res = watch(argv, env, n, value, stop_at=stop_wait, inodes=inodes)
        if self.args.trace:          # what the user saw, each line stamped with its second
            self.runs += 1
            path = Path(self.args.trace) / f"{self.runs:02d}-{way.name}-{n}-{value or 'fail'}.log"
            path.write_text(f"$ {shlex.join(argv)}\n" + "".join(f"{t:8.2f} {line}\n" for t, line in res.out)
                            + f"exit {res.rc} after {res.exit_s:.2f} s\n")
        return res, prep


def tail(res: Timed, k: int = 6) -> str:
    return " / ".join(line for _, line in res.out[-k:])


def run_way(bench: Bench, way: Way, n: int, log) -> dict:
    """One way at ``n`` nodes: set-up and first run, --repeat edits, the failure."""
    args = bench.args
    row: dict = {"nodes": n, "way": way.name, "needs": way.needs}
    inodes = way.inodes(n)
    try:
        edit(bench.project, "VALUE", '"first"')
        way.ready(n)
        t = time.monotonic()
        row.update(way.setup(n))
        first, _ = bench.once(way, n, "first")
        if first.ranks_s is None or first.rc != 0:
            raise RuntimeError(f"first run exited {first.rc}: " + tail(first))
        row["setup_s"] = round(time.monotonic() - t - first.exit_s + first.ranks_s, 2)
        edits, cpu, mem, ok, mixed, queued = [], [], [], [], [], []
        for k in range(args.repeat):
            value = f"v{n}-{k}-{int(time.time())}"
            edit(bench.project, "VALUE", f'"{value}"')
            t = time.monotonic()
            r, prep = bench.once(way, n, value)
            if r.ranks_s is None or r.rc != 0:
                raise RuntimeError(f"edit run exited {r.rc}: " + tail(r))
            edits.append(prep + r.ranks_s)
            cpu.append(r.cpu_s)
            mem.append(r.peak_mb)
            ok.append(r.lines_ok)
            mixed.append(r.lines_mixed)
            if r.queued_s is not None:
                queued.append(r.queued_s)
        row.update(edit_s=round(statistics.median(edits), 2), edit_runs=[round(e, 2) for e in edits],
                   head_cpu_s=round(statistics.median(cpu), 2), head_mb=round(max(mem)),
                   lines_expected=n * args.steps, lines_ok=min(ok), lines_mixed=max(mixed))
        if queued:                    # of the edit's seconds, queued for Slurm
            row["edit_queued_s"] = statistics.median(queued)
        if isinstance(way, Ray):
            extra = way.extra(n)
            head = extra.pop("_head_pids")
            c0 = cpu_s(head)
            edit(bench.project, "VALUE", '"idle"')
            r, _ = bench.once(way, n, "idle")
            extra["ray_head_cpu_s"] = round(cpu_s(head) - c0, 2)
            row.update(extra)
        # the failure: rank 1 (rank 0 when alone) exits 3 at step FAIL_STEP
        edit(bench.project, "FAIL_RANK", str(min(1, n - 1)))
        edit(bench.project, "VALUE", '"fail"')
        r, _ = bench.once(way, n, None, stop_wait=args.stop_wait, inodes=inodes)
        edit(bench.project, "FAIL_RANK", "-1")
        row["fail_rc"] = r.rc if not r.killed else None
        if r.fail_at is None:
            row["fail_note"] = "the failing rank's line never reached the user: " + tail(r, 4)
        else:
            end = r.end_wall
            gone = r.gone_at or wait_gone(inodes, max(0.0, args.stop_wait - (time.time() - r.fail_at)))
            row["fail_exit_s"] = None if r.killed else round(end - r.fail_at, 2)
            row["fail_stop_s"] = round(gone - r.fail_at, 2) if gone and not r.killed else None
            if r.killed or gone is None:
                row["fail_note"] = (f"still running {args.stop_wait:.0f} s after the rank failed: "
                                    "killed by the benchmark")
        if way.recovers and n + 1 <= bench.sb.node_count and n >= 2:
            log(f"  {way.name} at {n} nodes: {LOST_NODE}'s link down at step {LOST_AT_STEP} ...")
            row.update(node_lost(bench, way, n))
        row["result"] = "ok"
    except (RuntimeError, OSError, subprocess.SubprocessError, UserError) as e:
        row["result"] = f"failed: {e}"[:600]
        log(f"  {way.name} at {n} nodes: {row['result']}")
    finally:
        edit(bench.project, "FAIL_RANK", "-1")
        try:
            way.teardown(n)
        except (OSError, subprocess.SubprocessError) as e:
            log(f"  {way.name} teardown: {e}")
    return row


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each figure over clusterctl's at the same node count (x_NAME); a Slurm way's also over
    clusterctl's Slurm way's (xs_NAME)."""
    base = {r["nodes"]: r for r in rows if r["way"] == "clusterctl"}
    on_slurm = {r["nodes"]: r for r in rows if r["way"] == SLURM_WAYS[0]}
    for r in rows:
        b = base.get(r["nodes"])
        for key in ("setup_s", "edit_s", "fail_stop_s", "head_cpu_s", "head_mb", "lost_s"):
            if b and r.get(key) is not None and b.get(key):
                r[f"x_{key}"] = round(r[key] / b[key], 2)
        b = on_slurm.get(r["nodes"])
        if r["way"] in SLURM_WAYS[1:] and b:
            for key in ("setup_s", "edit_s", "fail_stop_s"):
                if r.get(key) is not None and b.get(key):
                    r[f"xs_{key}"] = round(r[key] / b[key], 2)
    return rows


def print_rows(rows: list[dict]) -> None:
    def f(v, suffix=""):
        return "-" if v is None else f"{v}{suffix}"
    print(f"\n{'nodes':>5} {'way':<16} {'set-up s':>9} {'edit s':>7} {'fail->stop s':>13} {'rc':>4} "
          f"{'head CPU s':>10} {'head MB':>8} {'lines ok/exp':>13}  result")
    for r in rows:
        print(f"{r['nodes']:>5} {r['way']:<16} {f(r.get('setup_s')):>9} {f(r.get('edit_s')):>7} "
              f"{f(r.get('fail_stop_s')):>13} {f(r.get('fail_rc')):>4} {f(r.get('head_cpu_s')):>10} "
              f"{f(r.get('head_mb')):>8} {f(r.get('lines_ok'))}/{f(r.get('lines_expected')):<6}  "
              f"{r.get('result', '')[:60]}", flush=True)
    lost = [r for r in rows if r.get("lost_rc") is not None or r.get("lost_note")]
    if lost:
        print(f"\n{LOST_NODE}'s link down at step {LOST_AT_STEP}, a spare beside (ways that recover):")
    for r in lost:
        print(f"{r['nodes']:>5} {r['way']:<16} training again {f(r.get('lost_s'), ' s')}, resumed from step "
              f"{f(r.get('lost_resumed_from'))}, same weights as uninterrupted: {f(r.get('lost_same_weights'))}, "
              f"exit {f(r.get('lost_rc'))} {r.get('lost_note') or ''}"[:200], flush=True)
    print("\n(over clusterctl's at the same node count)")
    for r in rows:
        if r["way"] != "clusterctl":
            bits = [f"{k[2:]} x{v:.2f}" for k, v in r.items() if k.startswith("x_")]
            print(f"{r['nodes']:>3} nodes {r['way']:>16}: " + (", ".join(bits) or "-"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=benchplot.node_counts("2,4"), default=[2, 4],
                    help="node counts (default 2,4)")
    ap.add_argument("--repeat", type=benchplot.positive_int, default=1, help="edit runs per way and count")
    ap.add_argument("--steps", type=benchplot.positive_int, default=200,
                    help="training steps (one metrics line per rank per step)")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"ways, comma-separated (default {','.join(WAYS)})")
    ap.add_argument("--image", default=targets.resolve("cpu").tag, help="the cpu target's image")
    ap.add_argument("--cache", default="/var/lib/clusterctl/bench-peers",
                    help="where the peers' scratch venv is made (once)")
    ap.add_argument("--stop-wait", type=benchplot.positive_int, default=90,
                    help="seconds after a rank's failure before a job still running is killed")
    ap.add_argument("--setup-only", action="store_true", help="only make the peers' venv, then stop")
    ap.add_argument("--keep", action="store_true",
                    help="leave the sandbox up at the end (a rerun reuses it; remove it with "
                         "`clusterctl sandbox down --name NAME`)")
    ap.add_argument("--name", default="bpeer", help="sandbox name")
    ap.add_argument("--subnet", default="10.213.81.0/24", help="sandbox subnet")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the rows and conditions as JSON")
    ap.add_argument("--plot", default=None, metavar="FILE.png", help="draw the figures per way")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="write each command's output there, each line stamped with its second")
    return ap


def check(args: argparse.Namespace) -> None:
    """Every problem with the input or this machine, before the sandbox exists (exit 2)."""
    ways = [w for w in args.ways.split(",") if w]
    if not ways or any(w not in WAYS for w in ways) or len(set(ways)) != len(ways):
        raise UserError(f'--ways "{args.ways}": give ways from {", ".join(WAYS)} separated by commas, '
                        "each once, e.g. clusterctl,ray")
    args.ways = ways
    sandbox.check_name(args.name)
    sandbox.parse_subnet(args.subnet, max(args.nodes) + 1)
    benchplot.check_outputs(args.json, args.plot)
    if args.trace is not None and not Path(args.trace).is_dir():
        raise UserError(f"--trace {args.trace}: not a directory; give an existing one")
    if not Path(args.cache).resolve().parent.is_dir():
        raise UserError(f"--cache {args.cache}: its parent directory does not exist")
    if args.setup_only:
        return
    sandbox.require_environment("benchmarks/peers.py")
    require_binaries("ssh", packages="openssh-client")
    if "by-hand" in ways:
        require_binaries("pdsh", packages="pdsh")
    if "mpirun" in ways:
        require_binaries("mpiexec.hydra", packages="mpich")
    if set(SLURM_WAYS) & set(ways):
        slurm.require_slurm()
    distribute.source_image(engine.client(), args.image)   # no engine, or no such image


def run(args: argparse.Namespace) -> int:
    info = ensure_venv(Path(args.cache))
    print(f"peers' venv: {info}", flush=True)
    if args.setup_only:
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-bench-peers-"))
    loads = benchplot.Loads()
    rows: list[dict] = []
    extra: dict = {"venv_install_s": info.get("install_s"), "venv_mb": info.get("mb"),
                   **{k: info[k] for k in ("ray", "torchx", "torch") if k in info}}
    try:
        t = time.monotonic()
        inventory = tmp / "sandbox.yaml"
        print(f"sandbox {args.name}: {max(args.nodes) + 1} nodes (the last a spare), sharing this machine's "
              f"{os.cpu_count()} cores ...", flush=True)
        sb = sandbox.up(max(args.nodes) + 1, name=args.name, subnet=args.subnet, slots=1,
                        inventory_path=inventory,   # the last one: the node-lost run's spare
                        with_slurm=bool(set(SLURM_WAYS) & set(args.ways)))
        extra["sandbox_up_s"] = round(time.monotonic() - t, 1)
        bench = Bench(args, sb, tmp, inventory)
        make_project(bench.project)
        for n in args.nodes:
            bench.reference[n] = reference_weights(bench, n, LOST_STEPS)
            print(f"uninterrupted weights, {n} ranks x {LOST_STEPS} steps: {bench.reference[n]}", flush=True)
        if set(args.ways) & {"clusterctl", "by-hand", "clusterctl-slurm"}:
            t = time.monotonic()
            results = distribute.push_image(args.image, load_inventory(inventory), strategy="relay")
            failed = [f"{r.node}: {r.error}" for r in results if not r.ok]
            if failed:
                raise UserError(f"pushing {args.image} to the sandbox failed: " + "; ".join(failed))
            extra["image_push_s"] = round(time.monotonic() - t, 1)
            print(f"image {args.image} on {sb.node_count} nodes in {extra['image_push_s']:.0f} s", flush=True)
        for n in args.nodes:
            for name in args.ways:
                print(f"{name} at {n} nodes ...", flush=True)
                rows.append(run_way(bench, WAY_CLASSES[name](bench), n, lambda m: print(m, flush=True)))
                loads.sample()
        add_ratios(rows)
        print_rows(rows)
    finally:
        if rows and (args.json or args.plot):
            doc = benchplot.document("peers", benchplot.command_line(), {
                **benchplot.conditions(loads), "repeat": args.repeat, "steps": args.steps,
                "image": args.image, **extra}, rows=rows, published=PUBLISHED)
            benchplot.save(doc, args.json, args.plot)
        if not args.keep:
            sandbox.down(args.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return benchplot.run_main(parser, check, run, argv)


if __name__ == "__main__":
    sys.exit(main())
