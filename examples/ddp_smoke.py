"""A tiny but real DistributedDataParallel training, to prove a cluster works end to end.

Started by torchrun on every node (job ``ddp-smoke``).  Every rank builds the
same seeded model, trains it for a few steps on data of its OWN (seeded by its
rank) with gloo all-reducing the gradients, then all ranks exchange a SHA-256
of their flattened weights.  DDP is only correct if every rank ends with
identical weights, so:

* each rank prints ``rank R/W node=N local_rank=L weights-sha256=H steps=S loss0=X``;
* rank 0 prints ``ddp-smoke OK: W ranks on N nodes hold identical weights sha256=H``;
* on a mismatch every rank prints ``ddp-smoke FAILED: ...`` naming the ranks and
  exits 1.  It also fails when the ranks trained on identical data (then
  matching weights would prove nothing) or when training did not change the
  weights.

Environment: ``DDP_SMOKE_STEPS`` (default 5), ``DDP_SMOKE_TIMEOUT`` (seconds a
collective waits for a peer, default 120), ``DDP_SMOKE_PERTURB_RANK`` (test
hook: that global rank adds 1e-3 to its weights after training, to prove the
check can fail).  Needs only torch.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16


def say(line: str) -> None:
    """Print one line in ONE write: the node's processes share the container's stdout, and
    torchrun runs them unbuffered (-u), where print() writes text and newline separately and
    two ranks' lines could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def make_model() -> torch.nn.Module:
    """The same initial weights on every rank (seeded), as DDP also broadcasts from rank 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def weights_digest(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])
    return hashlib.sha256(bytes(flat.contiguous().view(torch.uint8).tolist())).hexdigest()


def gather(rank: int, node: int, digest: str, loss0: float, world: int) -> list[dict]:
    """Every rank's (node, digest, first loss), via a plain tensor all_gather (no pickling)."""
    mine = torch.tensor([float(node), loss0, *bytes.fromhex(digest)], dtype=torch.float64)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return [{"rank": r, "node": int(t[0]), "loss0": float(t[1]),
             "digest": bytes(int(b) for b in t[2:]).hex()} for r, t in enumerate(parts)]


def train(model: torch.nn.Module, rank: int, steps: int) -> float:
    """SGD on this rank's own data; returns the first step's local loss (differs per rank)."""
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)
    target_w = torch.linspace(-1, 1, FEATURES)
    first = None
    for _ in range(steps):
        x = torch.randn(64, FEATURES, generator=data)
        y = (x @ target_w).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    return first if first is not None else float("nan")


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
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = os.environ.get("LOCAL_RANK", "0")
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))

    model = make_model()
    initial = weights_digest(model)
    loss0 = train(model, rank, steps)
    if os.environ.get("DDP_SMOKE_PERTURB_RANK") == str(rank):
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
    digest = weights_digest(model)
    say(f"rank {rank}/{world} node={node} local_rank={local_rank} weights-sha256={digest} "
        f"steps={steps} loss0={loss0:.6f}")

    results = gather(rank, node, digest, loss0, world)
    dist.barrier()  # nobody leaves (and has torchrun kill its siblings) before all have the results
    dist.destroy_process_group()

    found = problems(results, initial)
    if found:
        say(f"ddp-smoke FAILED on rank {rank}: {'; '.join(found)}")
        return 1
    if rank == 0:
        nodes = len({r["node"] for r in results})
        say(f"ddp-smoke OK: {world} ranks on {nodes} node{'s' if nodes != 1 else ''} hold identical "
            f"weights sha256={digest} after {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
