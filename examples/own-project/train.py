"""A tiny real DistributedDataParallel regression on synthetic data.

Run under torchrun (``clusterctl launch ... -- python train.py`` runs it so on every
node): every rank builds the same model from config.toml, trains on data of its own
(seeded by its rank) with gloo all-reducing the gradients, and prints its weights'
SHA-256 at the end: all ranks print the same one. Without torchrun it runs as one
process. ``--save DIR``: rank 0 writes DIR/model.pt (a mounted directory on a cluster).
Every rank prints clusterctl's metrics line after each step (``clusterctl top`` and the
dashboard read it; docs/how-to/top.md): ``clusterctl-metrics {"rank": ..., "step": ...,
"loss": ..., "samples": ..., "time": ...}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import tomli
import torch
import torch.distributed as dist
from model import TinyRegressor
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--config", default=str(Path(__file__).with_name("config.toml")))
    parser.add_argument("--save", metavar="DIR", help="rank 0 writes DIR/model.pt")
    args = parser.parse_args()
    with open(args.config, "rb") as f:
        cfg = tomli.load(f)

    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                          ("MASTER_PORT", "29500")):
        os.environ.setdefault(name, default)      # plain `python train.py`: one process
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(cfg["seed"])                # the same initial weights on every rank
    model = DistributedDataParallel(TinyRegressor(cfg["features"], cfg["hidden"]))
    true_w = torch.randn(cfg["features"], 1)      # the function to learn, the same everywhere
    data = torch.Generator().manual_seed(cfg["seed"] + 1 + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    for step in range(1, args.steps + 1):
        x = torch.randn(cfg["batch"], cfg["features"], generator=data)
        y = x @ true_w + 0.01 * torch.randn(cfg["batch"], 1, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()                           # DDP averages the gradients over all ranks
        optimizer.step()
        # clusterctl's metrics line, every rank, one write (ranks of a node share stdout)
        sys.stdout.write("clusterctl-metrics " + json.dumps({
            "rank": rank, "step": step, "loss": round(loss.item(), 6),
            "samples": step * cfg["batch"], "time": round(time.time(), 3)}) + "\n")
        sys.stdout.flush()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0 and (step == 1 or step % 5 == 0 or step == args.steps):
            print(f"step {step}/{args.steps} loss {mean.item() / world:.4f}", flush=True)

    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    print(f"rank {rank}/{world} weights-sha256={hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]}",
          flush=True)
    if args.save and rank == 0:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), Path(args.save) / "model.pt")
        print(f"saved {Path(args.save) / 'model.pt'}", flush=True)
    dist.barrier()                                # nobody leaves while a peer still needs it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo (torch 2.13) can SIGABRT the interpreter's exit after destroy_process_group
    # ("terminate called without an active exception"): all is printed, so skip that exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
