"""A tiny but real DistributedDataParallel training, to prove a cluster works end to end.

Started by torchrun on every node (job ``ddp-smoke``).  Every rank builds the
same seeded model, trains it for a few steps on data of its OWN (each step's batch
seeded by the rank and the step number, so it does not depend on where a run
resumed) with the backend all-reducing the gradients, then all ranks exchange a
SHA-256 of their flattened weights.  DDP is only correct if every rank ends with
identical weights, so:

* each rank prints ``rank R/W node=N local_rank=L weights-sha256=H steps=S loss0=X``;
* rank 0 prints ``ddp-smoke OK: W ranks on N nodes hold identical weights sha256=H``;
* on a mismatch every rank prints ``ddp-smoke FAILED: ...`` naming the ranks and
  exits 1.  It also fails when the ranks trained on identical data (then
  matching weights would prove nothing) or when training did not change the
  weights.

Backend and device come from the target (the job passes ``{backend}`` and
``{device}``): ``DDP_SMOKE_BACKEND`` (default gloo; nccl, ccl, cncl, accl import
their torch plugin first, see BACKEND_MODULES) and ``DDP_SMOKE_DEVICE`` (default
cpu; cuda or mlu: each rank uses the device of its LOCAL_RANK, as torchrun numbers
them).

Environment: ``DDP_SMOKE_STEPS`` (default 5), ``DDP_SMOKE_TIMEOUT`` (seconds a
collective waits for a peer, default 120), ``DDP_SMOKE_PROGRESS=1`` (each rank
prints a line when it starts and one per step), ``DDP_SMOKE_METRICS=1`` (each rank prints
clusterctl's metrics line after each step: ``clusterctl-metrics {"rank", "step", "loss",
"samples", "time"}``, what ``clusterctl ui`` draws and ``clusterctl top`` rates),
``DDP_SMOKE_STEP_SECONDS`` (a pause after each step, to make a run last; with
``DDP_SMOKE_BUSY=1`` the pause is spent computing, as a larger model's step would, so the
node's CPU shows the work), ``DDP_SMOKE_SLOW_RANK`` (that global rank's pause is a sleep of
``DDP_SMOKE_SLOW_SECONDS``, default the step pause, even with DDP_SMOKE_BUSY: it idles while
the others work, what ``clusterctl top`` marks idle), and test hooks that prove the checks
can fail: ``DDP_SMOKE_PERTURB_RANK`` (that global rank adds 1e-3 to its weights after
training), ``DDP_SMOKE_STOP_RANK`` (that global rank stops itself with SIGSTOP
before step ``DDP_SMOKE_STOP_STEP``, default 3: the others then wait in the
collective for ever, which is what ``clusterctl launch --hang-timeout`` must find).
``DDP_SMOKE_IPEX=bf16`` trains with Intel Extension for PyTorch as its pages show for
CPU training: ``ipex.optimize(model, optimizer, dtype=torch.bfloat16)`` and the steps under
``torch.autocast("cpu", dtype=torch.bfloat16)``; rank 0 prints
``ipex VERSION bf16: ...`` with the parameters' dtype (job ``ddp-smoke-ipex``).

Checkpoints (``clusterctl launch`` restarts): with ``CLUSTERCTL_CHECKPOINT_DIR`` (a
directory shared by all nodes, at the same path in every container) every rank saves
its model, optimizer state, step number, world size and total steps after EVERY step
to ``DIR/step-S/rank-R.pt`` (temp file in the same directory, fsync, ``os.replace``);
after a barrier rank 0 checks that every rank's file is there (else it exits 2: the
directory is not shared) and atomically writes ``DIR/latest`` (JSON naming step S and
the world size), then removes all but the last 2 step directories.  On start every rank
reads ``latest`` (none: step 0), falls back to the newest older complete step when the
one it names is missing or incomplete, loads its own file and prints ``rank R resumed
from step S of T (attempt A)`` (A: ``CLUSTERCTL_ATTEMPT``, default 0); rank 0 prints
``checkpoint saved step S`` with DDP_SMOKE_PROGRESS=1.  A run resumed after step S ends
with the weights of a run never interrupted.  Exit 2, naming the directory, when the
checkpoints there are of another world size, when the ranks disagree about the step to
resume (the directory is not shared), when the directory does not exist, and with
DDP_SMOKE_IPEX (checkpointing is not supported there).  A test hook makes a rank crash:
``DDP_SMOKE_FAIL_RANK`` (that global rank prints ``rank R fails on purpose with exit N
before step S (attempt A): ...`` and leaves with ``os._exit(N)`` before step
``DDP_SMOKE_FAIL_STEP``, default 3; N is ``DDP_SMOKE_FAIL_CODE``, default 1; only while
``CLUSTERCTL_ATTEMPT`` < ``DDP_SMOKE_FAIL_ATTEMPTS``, default 1, so a restart succeeds;
torchrun itself then exits 1).
Needs only torch (and the backend's plugin; IPEX for DDP_SMOKE_IPEX).  Without torch the
module still imports (not runs), for tests of its checkpoint file helpers.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib
import io
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

if os.environ.get("DDP_SMOKE_PROGRESS") == "1":  # before the slow torch import, with the pid
    sys.stdout.write(f"rank {os.environ.get('RANK', '?')} starting (pid {os.getpid()})\n")
    sys.stdout.flush()

try:
    import torch  # noqa: E402
    import torch.distributed as dist  # noqa: E402
    from torch.nn.parallel import DistributedDataParallel  # noqa: E402
except ImportError:
    if __name__ == "__main__":
        raise
    torch = dist = DistributedDataParallel = None  # imported for its checkpoint file helpers

FEATURES = 16
#: Checkpoint layout in CLUSTERCTL_CHECKPOINT_DIR: step-S/rank-R.pt, and ``latest``.
LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d+)$")
KEEP_STEPS = 2  # step directories kept (the newest complete one and the one before)

#: The torch plugin a backend needs imported before init_process_group (the first that
#: imports): oneCCL's bindings were torch_ccl before torch 1.12.
BACKEND_MODULES = {
    "ccl": ("oneccl_bindings_for_pytorch", "torch_ccl"),
    "cncl": ("torch_mlu",),
    "accl": ("torch_accl",),
}


def say(line: str) -> None:
    """Print one line in ONE write: the node's processes share the container's stdout, and
    torchrun runs them unbuffered (-u), where print() writes text and newline separately and
    two ranks' lines could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def pause_for(seconds: float, busy: bool) -> None:
    """The pause after a step: a sleep, or (``busy``) as long spent computing on the CPU."""
    if seconds <= 0:
        return
    if not busy:
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    x = 1.0
    while time.monotonic() < end:
        for _ in range(1000):
            x = x * 1.0000001 + 1e-9


def import_backend(backend: str) -> None:
    """Import the plugin that registers ``backend`` with torch.distributed (none for gloo/nccl)."""
    tried = []
    for name in BACKEND_MODULES.get(backend, ()):
        try:
            importlib.import_module(name)
            return
        except ImportError as e:
            tried.append(f"{name} ({e})")
    if tried:
        raise SystemExit(f"ddp-smoke: backend {backend} needs one of: {', '.join(tried)}")


def local_device(kind: str, local_rank: int) -> torch.device:
    """This rank's device: the CPU, or accelerator LOCAL_RANK of ``kind`` (cuda, mlu)."""
    if kind == "cpu":
        return torch.device("cpu")
    getattr(torch, kind).set_device(local_rank)  # torch.cuda / torch.mlu (torch_mlu)
    return torch.device(kind, local_rank)


def make_model() -> torch.nn.Module:
    """The same initial weights on every rank (seeded), as DDP also broadcasts from rank 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def weights_digest(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in model.parameters()])
    return hashlib.sha256(bytes(flat.contiguous().view(torch.uint8).tolist())).hexdigest()


def gather(rank: int, node: int, digest: str, loss0: float, world: int,
           device: torch.device) -> list[dict]:
    """Every rank's (node, digest, first loss), via a plain tensor all_gather (no pickling;
    on the rank's device: nccl gathers only accelerator tensors)."""
    mine = torch.tensor([float(node), loss0, *bytes.fromhex(digest)], dtype=torch.float64).to(device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    parts = [t.cpu() for t in parts]
    return [{"rank": r, "node": int(t[0]), "loss0": float(t[1]),
             "digest": bytes(int(b) for b in t[2:]).hex()} for r, t in enumerate(parts)]


def stop_here(rank: int, step: int) -> None:
    """DDP_SMOKE_STOP_RANK: this rank stops itself (SIGSTOP) and leaves its peers waiting."""
    say(f"rank {rank} stops itself (SIGSTOP) before step {step}: DDP_SMOKE_STOP_RANK test hook")
    os.kill(os.getpid(), signal.SIGSTOP)


def fail_here(rank: int, step: int, code: int, attempt: int) -> None:
    """DDP_SMOKE_FAIL_RANK: this rank crashes (exit ``code``, no clean-up), as a lost worker would."""
    say(f"rank {rank} fails on purpose with exit {code} before step {step} (attempt {attempt}): "
        "DDP_SMOKE_FAIL_RANK test hook")
    exit_now(code)


def step_data(rank: int, step: int) -> torch.Generator:
    """The generator of ``rank``'s batch at ``step``: seeded by the two alone, so the data of a
    step does not depend on how many steps this process ran (a resumed run sees the same).
    The seed is a hash: torch's CPU generator keeps only a seed's low 32 bits."""
    seed = hashlib.sha256(f"ddp-smoke data rank {rank} step {step}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(seed[:4], "big"))


# --------------------------------------------------------------------------- checkpoints
# Pure file helpers first (no torch: tests import them without it), then Checkpoints.

class CheckpointError(Exception):
    """A checkpoint directory this run cannot use: the script exits 2 with the message."""


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step}")


def rank_file(root: str, step: int, rank: int) -> str:
    return os.path.join(step_dir(root, step), f"rank-{rank}.pt")


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (a rename into it) durable, where the filesystem
    lets a directory be synced."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never a
    part of one: a temp file in the same directory, fsync, os.replace, fsync the directory."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def step_numbers(root: str) -> list[int]:
    """The steps that have a ``step-S`` directory in ``root``, newest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)) for m in map(STEP_DIR.match, names) if m), reverse=True)


def is_complete(root: str, step: int, world: int) -> bool:
    """Every rank of a ``world``-rank run has its file in ``step``'s directory."""
    return all(os.path.isfile(rank_file(root, step, r)) for r in range(world))


def write_latest(root: str, step: int, world: int, steps: int) -> None:
    """Name ``step`` as the newest complete checkpoint (rank 0, after every rank saved it)."""
    text = json.dumps({"step": step, "world_size": world, "steps": steps}) + "\n"
    atomic_write(os.path.join(root, LATEST), text.encode())


def read_latest(root: str) -> dict | None:
    """``root/latest`` as {"step", "world_size", "steps"}, or None when there is none."""
    path = os.path.join(root, LATEST)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        latest = json.loads(text)
        return {"step": int(latest["step"]), "world_size": int(latest["world_size"]),
                "steps": int(latest.get("steps", 0))}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path} is not a checkpoint pointer ddp_smoke.py wrote ({e!r}); "
                              "remove it or give another CLUSTERCTL_CHECKPOINT_DIR") from None


def resume_step(root: str, world: int) -> tuple[int, str | None]:
    """The step to resume from in ``root`` (0: from the start) and a note when ``latest`` names
    a step that is missing or incomplete (then the newest older complete step is used).
    CheckpointError when the checkpoints are of another world size."""
    latest = read_latest(root)
    if latest is None:
        return 0, None
    if latest["world_size"] != world:
        raise CheckpointError(f"{root} holds the checkpoints of a run of {latest['world_size']} "
                              f"ranks (step {latest['step']}); this run has {world}: give an "
                              "empty CLUSTERCTL_CHECKPOINT_DIR, or run with that world size")
    wanted = latest["step"]
    for step in step_numbers(root):
        if step <= wanted and is_complete(root, step, world):
            if step == wanted:
                return step, None
            return step, (f"checkpoint step {wanted} in {root} is missing or incomplete: "
                          f"resuming from step {step}")
    return 0, (f"no complete checkpoint at or before step {wanted} in {root}: "
               "starting from step 0")


def prune(root: str, newest: int, keep: int = KEEP_STEPS) -> None:
    """Remove the step directories older than the ``keep`` newest up to ``newest`` (a newer one,
    left by an attempt that crashed, is overwritten step by step, never removed)."""
    for step in [s for s in step_numbers(root) if s <= newest][keep:]:
        shutil.rmtree(step_dir(root, step), ignore_errors=True)


class Checkpoints:
    """Save after every step and resume from CLUSTERCTL_CHECKPOINT_DIR (the module docstring
    says how); every rank calls each method (they hold collectives)."""

    def __init__(self, root: str, rank: int, world: int, steps: int, device: torch.device,
                 attempt: int, progress: bool):
        self.root, self.rank, self.world, self.steps = root, rank, world, steps
        self.device, self.attempt, self.progress = device, attempt, progress

    def resume(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, float | None]:
        """Load this rank's newest complete checkpoint into ``model`` and ``opt``; returns its
        step (0: none) and the first step's loss it recorded."""
        error = None
        try:
            step, note = resume_step(self.root, self.world)
        except CheckpointError as e:
            step, note, error = -1, None, e
        agreed = torch.tensor([step, -step], dtype=torch.int64, device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank learns the max and the min
        if error is not None:
            raise error
        high, low = int(agreed[0]), -int(agreed[1])
        if high != low:
            raise CheckpointError(f"the ranks found different steps to resume from in {self.root} "
                                  f"({low} to {high}; rank {self.rank}: {step}): "
                                  "CLUSTERCTL_CHECKPOINT_DIR must be one directory shared by all nodes")
        if note and self.rank == 0:
            say(f"ddp-smoke: {note}")
        if step == 0:
            return 0, None
        path = rank_file(self.root, step, self.rank)
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
        except TypeError:  # torch < 1.13 has no weights_only
            state = torch.load(path, map_location=self.device)
        if (state.get("world_size"), state.get("step"), state.get("rank")) != (self.world, step, self.rank):
            raise CheckpointError(f"{path} is the checkpoint of rank {state.get('rank')} of "
                                  f"{state.get('world_size')} at step {state.get('step')}, not of "
                                  f"rank {self.rank} of {self.world} at step {step}: give an empty "
                                  "CLUSTERCTL_CHECKPOINT_DIR")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        say(f"rank {self.rank} resumed from step {step} of {self.steps} (attempt {self.attempt})")
        return step, state.get("loss0")

    def save(self, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
             loss0: float | None) -> None:
        """Every rank writes its file of ``step``; then rank 0 names the step in ``latest``."""
        buf = io.BytesIO()
        torch.save({"step": step, "steps": self.steps, "world_size": self.world, "rank": self.rank,
                    "run_id": os.environ.get("CLUSTERCTL_RUN_ID", ""), "loss0": loss0,
                    "model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
        os.makedirs(step_dir(self.root, step), exist_ok=True)
        atomic_write(rank_file(self.root, step, self.rank), buf.getvalue())
        dist.barrier()  # every rank's file of this step is written
        if self.rank == 0:
            missing = [r for r in range(self.world) if not os.path.isfile(rank_file(self.root, step, r))]
            if missing:
                raise CheckpointError(f"rank 0 does not see the step {step} checkpoint of rank(s) "
                                      f"{', '.join(map(str, missing))} in {self.root}: "
                                      "CLUSTERCTL_CHECKPOINT_DIR must be one directory shared by all nodes")
            write_latest(self.root, step, self.world, self.steps)
            prune(self.root, step)
            if self.progress:
                say(f"checkpoint saved step {step}")
        dist.barrier()  # nobody goes on (and may crash) before `latest` names this step


# --------------------------------------------------------------------------- training

def ipex_bf16(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int
              ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """DDP_SMOKE_IPEX=bf16: IPEX's bf16 training set-up (before DDP wraps the model)."""
    import intel_extension_for_pytorch as ipex

    model.train()
    model, opt = ipex.optimize(model, optimizer=opt, dtype=torch.bfloat16)
    if rank == 0:
        dtypes = sorted({str(p.dtype) for p in model.parameters()})
        say(f"ipex {ipex.__version__} bf16: ipex.optimize done, parameters {', '.join(dtypes)}, "
            "steps under torch.autocast(cpu, bfloat16)")
    return model, opt


def settle_buckets(ddp: DistributedDataParallel, opt: torch.optim.Optimizer,
                   device: torch.device) -> None:
    """One forward and backward whose gradients are dropped, before a resumed process trains.

    DDP all-reduces the gradients in one flat bucket, laid out in parameter order for its
    first backward and anew, in the order the gradients came, from then on; the backend's
    sum of a value depends on where it lies in the bucket (the order the ranks' parts are
    added), so a process that trained its first step with the first layout would end a bit
    apart from an uninterrupted run.  After this backward, every step a resumed process
    trains uses the layout the uninterrupted run used for that step."""
    ddp(torch.zeros(64, FEATURES, device=device)).float().sum().backward()
    opt.zero_grad()


def train(model: torch.nn.Module, rank: int, steps: int, device: torch.device,
          checkpoints: Checkpoints | None = None) -> tuple[torch.nn.Module, float]:
    """SGD on this rank's own data; returns the trained model (IPEX's, when it optimized a copy)
    and the first step's local loss (differs per rank; a resumed run has it from its checkpoint).
    With ``checkpoints``: resume from the newest complete one, save after every step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ipex_mode = os.environ.get("DDP_SMOKE_IPEX", "")
    if ipex_mode not in ("", "bf16"):
        raise SystemExit(f"ddp-smoke: DDP_SMOKE_IPEX={ipex_mode!r}; valid: bf16 or unset")
    if ipex_mode:
        model, opt = ipex_bf16(model, opt, rank)
    start, first = 0, None
    if checkpoints is not None:  # before DDP wraps the model (it broadcasts rank 0's weights)
        start, first = checkpoints.resume(model, opt)
    ddp = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device.index])
    if start:
        settle_buckets(ddp, opt, device)
    target_w = torch.linspace(-1, 1, FEATURES)
    progress = os.environ.get("DDP_SMOKE_PROGRESS") == "1"
    metrics = os.environ.get("DDP_SMOKE_METRICS") == "1"
    pause = float(os.environ.get("DDP_SMOKE_STEP_SECONDS", "0"))
    busy = os.environ.get("DDP_SMOKE_BUSY") == "1"
    if os.environ.get("DDP_SMOKE_SLOW_RANK") == str(rank):   # it idles while the others work
        pause, busy = float(os.environ.get("DDP_SMOKE_SLOW_SECONDS", pause)), False
    stop_rank = os.environ.get("DDP_SMOKE_STOP_RANK")
    stop_step = env_int("DDP_SMOKE_STOP_STEP", 3)
    fail_rank = os.environ.get("DDP_SMOKE_FAIL_RANK")
    fail_step = env_int("DDP_SMOKE_FAIL_STEP", 3)
    fail_code = env_int("DDP_SMOKE_FAIL_CODE", 1)
    attempt = env_int("CLUSTERCTL_ATTEMPT", 0)
    fail = fail_rank == str(rank) and attempt < env_int("DDP_SMOKE_FAIL_ATTEMPTS", 1)
    for step in range(start + 1, steps + 1):
        if fail and step == fail_step:
            fail_here(rank, step, fail_code, attempt)
        if stop_rank == str(rank) and step == stop_step:
            stop_here(rank, step)
        x = torch.randn(64, FEATURES, generator=step_data(rank, step)).to(device)
        y = (x @ target_w.to(device)).unsqueeze(1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(ipex_mode)):
            loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        if progress:
            say(f"rank {rank} step {step}/{steps} loss={loss.item():.6f}")
        if metrics:       # clusterctl's metrics line (clusterctl.run.metrics): the dashboard's curves
            say("clusterctl-metrics " + json.dumps({"rank": rank, "step": step, "loss": loss.item(),
                                                    "samples": 64 * step, "time": time.time()}))
        if checkpoints is not None:
            checkpoints.save(step, model, opt, first)
        pause_for(pause, busy)
    return model, (first if first is not None else float("nan"))


def problems(results: list[dict], initial: str) -> list[str]:
    """What is wrong with the gathered per-rank results (empty when DDP worked)."""
    found = []
    digests = {r["digest"] for r in results}
    if len(digests) > 1:
        ref = results[0]["digest"]
        odd = [str(r["rank"]) for r in results if r["digest"] != ref]
        found.append(f"weights differ: rank(s) {', '.join(odd)} disagree with rank 0")
    if len(results) > 1 and len({r["loss0"] for r in results}) == 1:
        found.append("every rank saw the same data (identical first losses): the check would prove nothing")
    if initial in digests:
        found.append("weights did not change during training")
    return found


def main() -> int:
    steps = env_int("DDP_SMOKE_STEPS", 5)
    timeout = datetime.timedelta(seconds=env_int("DDP_SMOKE_TIMEOUT", 120))
    backend = os.environ.get("DDP_SMOKE_BACKEND") or "gloo"
    local_rank = os.environ.get("LOCAL_RANK", "0")
    import_backend(backend)
    device = local_device(os.environ.get("DDP_SMOKE_DEVICE") or "cpu", int(local_rank))
    checkpoint_dir = os.environ.get("CLUSTERCTL_CHECKPOINT_DIR") or None
    if checkpoint_dir and os.environ.get("DDP_SMOKE_IPEX"):
        raise CheckpointError(f"checkpoints are not supported with DDP_SMOKE_IPEX "
                              f"(CLUSTERCTL_CHECKPOINT_DIR={checkpoint_dir}): unset one of them")
    if checkpoint_dir and not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"CLUSTERCTL_CHECKPOINT_DIR={checkpoint_dir} is not a directory: it "
                              "must be one directory shared by all nodes, at that path in every container")
    dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    checkpoints = None
    if checkpoint_dir:
        checkpoints = Checkpoints(checkpoint_dir, rank, world, steps, device,
                                  attempt=env_int("CLUSTERCTL_ATTEMPT", 0),
                                  progress=os.environ.get("DDP_SMOKE_PROGRESS") == "1")

    model = make_model().to(device)
    initial = weights_digest(model)
    model, loss0 = train(model, rank, steps, device, checkpoints)
    if os.environ.get("DDP_SMOKE_PERTURB_RANK") == str(rank):
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
    digest = weights_digest(model)
    say(f"rank {rank}/{world} node={node} local_rank={local_rank} weights-sha256={digest} "
        f"steps={steps} loss0={loss0:.6f}")

    results = gather(rank, node, digest, loss0, world, device)
    dist.barrier()  # nobody leaves (and has torchrun kill its siblings) before all have the results
    dist.destroy_process_group()

    found = problems(results, initial)
    if found:
        say(f"ddp-smoke FAILED on rank {rank}: {'; '.join(found)}")
        return 1
    if rank == 0:
        nodes = len({r["node"] for r in results})
        say(f"ddp-smoke OK: {world} ranks on {nodes} node{'s' if nodes != 1 else ''} hold identical "
            f"weights sha256={digest} after {steps} steps"
            + ("" if backend == "gloo" and device.type == "cpu" else f" ({backend}, {device.type})"))
    return 0


def exit_now(code: int) -> None:
    """Leave without C++ static teardown: after destroy_process_group, gloo's threads can abort
    the interpreter's exit ("terminate called without an active exception", SIGABRT), turning a
    verified run into a failed one. Everything worth keeping has been printed by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        status = main()
    except CheckpointError as e:  # every rank sees the same directory, so every rank says so
        sys.stderr.write(f"ddp-smoke: {e}\n")
        status = 2
    exit_now(status)
