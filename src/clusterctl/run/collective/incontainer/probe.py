"""The collective probe: runs INSIDE the job's image, one process per node.

Not imported by clusterctl: ``clusterctl check --collective`` reads this file and
feeds it to ``python3 -`` on the container's stdin, so any image with torch can run
it (nothing has to be baked into the image).  Only the standard library and torch
(plus the target's own backend module) are used.

Input: ``argv[1]`` is a JSON object (backend, sizes, iters, rounds, pair_bytes,
timeout); the rank environment is launch's (``NODE_RANK``, ``NNODES``,
``MASTER_ADDR``, ``MASTER_PORT``, ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``).
Output: one line per measurement on stdout, ``CLUSTERCTL-PROBE {json}``:

* ``versions``: torch and backend versions;
* ``joined``: seconds until the process group was up;
* ``world``: one all_reduce size across every node, the seconds of each timed iteration;
* ``pair``: one all_reduce between this node and ``peer`` (rounds of disjoint pairs,
  every pair of a round at the same time), the seconds of each timed iteration;
* ``error``: what failed, in which phase; the process then exits 3.

Every all_reduce is timed on this process alone (after a device synchronise); the
caller takes the slowest rank of each iteration, as nccl-tests does.
"""

import datetime
import json
import os
import sys
import time
import traceback

MARK = "CLUSTERCTL-PROBE "
T0 = time.time()


def emit(kind, **fields):
    sys.stdout.write(MARK + json.dumps({"kind": kind, "at": round(time.time() - T0, 3), **fields}) + "\n")
    sys.stdout.flush()


def device_for(backend, torch):
    """The device one process of this backend uses, importing the backend's module."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend in ("nccl", "accl"):
        if backend == "accl":
            import torch_accl  # noqa: F401  (registers the backend)
        torch.cuda.set_device(local)
        return torch.device("cuda", local), (lambda: torch.cuda.synchronize())
    if backend == "cncl":
        import torch_mlu  # noqa: F401
        torch.mlu.set_device(local)
        return torch.device("mlu", local), (lambda: torch.mlu.synchronize())
    if backend == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401
        except ImportError:
            import torch_ccl  # noqa: F401  (before torch 1.12)
    return torch.device("cpu"), (lambda: None)


def backend_version(backend, torch):
    try:
        if backend in ("nccl", "accl"):
            v = torch.cuda.nccl.version()
            return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        if backend == "ccl":
            for name in ("oneccl_bindings_for_pytorch", "torch_ccl"):
                mod = sys.modules.get(name)
                if mod is not None:
                    return str(getattr(mod, "__version__", "?"))
        if backend == "cncl":
            mod = sys.modules.get("torch_mlu")
            return str(getattr(mod, "__version__", "?"))
        if backend == "gloo":
            return "torch " + torch.__version__
    except Exception as e:  # noqa: BLE001 - a version is information, not a failure
        return f"unknown ({type(e).__name__})"
    return "?"


def main():
    cfg = json.loads(sys.argv[1])
    rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    phase = "import"
    try:
        import torch
        import torch.distributed as dist

        backend = cfg["backend"]
        device, sync = device_for(backend, torch)
        emit("versions", torch=torch.__version__, backend=backend,
             backend_version=backend_version(backend, torch), device=str(device))
        phase = "join"
        start = time.perf_counter()
        dist.init_process_group(
            backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=cfg["timeout"]))
        emit("joined", seconds=time.perf_counter() - start)

        def timed(nbytes, group):
            t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
            dist.all_reduce(t, group=group)  # warm-up: connections, buffers
            sync()
            seconds = []
            for _ in range(cfg["iters"]):
                s = time.perf_counter()
                dist.all_reduce(t, group=group)
                sync()
                seconds.append(time.perf_counter() - s)
            return seconds

        phase = "world"
        for nbytes in cfg["sizes"]:
            dist.barrier()
            emit("world", bytes=nbytes, seconds=timed(nbytes, None))
        for i, pairs in enumerate(cfg["rounds"]):
            phase = f"pair round {i + 1}"
            mine = None
            for pair in pairs:  # every rank creates every group, in the same order
                group = dist.new_group(ranks=sorted(pair))
                if rank in pair:
                    mine = (group, pair[1] if pair[0] == rank else pair[0])
            if mine is not None:
                emit("pair", peer=mine[1], bytes=cfg["pair_bytes"],
                     seconds=timed(cfg["pair_bytes"], mine[0]))
        phase = "end"
        dist.barrier()
        emit("done")
    except BaseException as e:  # noqa: BLE001 - the caller gets the reason, not a hang
        emit("error", phase=phase, error=f"{type(e).__name__}: {e}".strip()[:2000],
             trace=traceback.format_exc()[-2000:])
        sys.stdout.flush()
        os._exit(3)
    sys.stdout.flush()
    os._exit(0)  # skip process-group teardown: peers may already be gone


if __name__ == "__main__":
    main()
