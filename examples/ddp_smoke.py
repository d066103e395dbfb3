"""A tiny but real DistributedDataParallel training, to prove a cluster works end to end.

Started by torchrun on every node (job ``ddp-smoke``).  Every rank builds the
same seeded model, trains it for a few steps on data of its OWN (seeded by its
rank) with the backend all-reducing the gradients, then all ranks exchange a SHA-256
of their flattened weights.  DDP is only correct if every rank ends with
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
prints a line when it starts and one per step), ``DDP_SMOKE_STEP_SECONDS`` (a pause
after each step, to make a run last), and test hooks that prove the checks can
fail: ``DDP_SMOKE_PERTURB_RANK`` (that global rank adds 1e-3 to its weights after
training), ``DDP_SMOKE_STOP_RANK`` (that global rank stops itself with SIGSTOP
before step ``DDP_SMOKE_STOP_STEP``, default 3: the others then wait in the
collective for ever, which is what ``clusterctl launch --hang-timeout`` must find).
``DDP_SMOKE_IPEX=bf16`` trains with Intel Extension for PyTorch as its pages show for
CPU training: ``ipex.optimize(model, optimizer, dtype=torch.bfloat16)`` and the steps under
``torch.autocast("cpu", dtype=torch.bfloat16)``; rank 0 prints
``ipex VERSION bf16: ...`` with the parameters' dtype (job ``ddp-smoke-ipex``).
Needs only torch (and the backend's plugin; IPEX for DDP_SMOKE_IPEX).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import os
import signal
import sys
import time

if os.environ.get("DDP_SMOKE_PROGRESS") == "1":  # before the slow torch import, with the pid
    sys.stdout.write(f"rank {os.environ.get('RANK', '?')} starting (pid {os.getpid()})\n")
    sys.stdout.flush()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

FEATURES = 16

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


def train(model: torch.nn.Module, rank: int, steps: int, device: torch.device
          ) -> tuple[torch.nn.Module, float]:
    """SGD on this rank's own data; returns the trained model (IPEX's, when it optimized a copy)
    and the first step's local loss (differs per rank)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ipex_mode = os.environ.get("DDP_SMOKE_IPEX", "")
    if ipex_mode not in ("", "bf16"):
        raise SystemExit(f"ddp-smoke: DDP_SMOKE_IPEX={ipex_mode!r}; valid: bf16 or unset")
    if ipex_mode:
        model, opt = ipex_bf16(model, opt, rank)
    ddp = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device.index])
    data = torch.Generator().manual_seed(1000 + rank)
    target_w = torch.linspace(-1, 1, FEATURES)
    progress = os.environ.get("DDP_SMOKE_PROGRESS") == "1"
    pause = float(os.environ.get("DDP_SMOKE_STEP_SECONDS", "0"))
    stop_rank = os.environ.get("DDP_SMOKE_STOP_RANK")
    stop_step = env_int("DDP_SMOKE_STOP_STEP", 3)
    first = None
    for step in range(1, steps + 1):
        if stop_rank == str(rank) and step == stop_step:
            stop_here(rank, step)
        x = torch.randn(64, FEATURES, generator=data).to(device)
        y = (x @ target_w.to(device)).unsqueeze(1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(ipex_mode)):
            loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        if progress:
            say(f"rank {rank} step {step}/{steps} loss={loss.item():.6f}")
        if pause:
            time.sleep(pause)
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
    dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))

    model = make_model().to(device)
    initial = weights_digest(model)
    model, loss0 = train(model, rank, steps, device)
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
    exit_now(main())
