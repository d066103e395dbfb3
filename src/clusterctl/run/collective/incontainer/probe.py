"""The collective probe: runs INSIDE the job's image, one process per node.

Not imported by clusterctl: ``clusterctl check --collective`` reads this file and
feeds it to ``python3 -`` on the container's stdin, so any image with torch can run
it (nothing has to be baked into the image).  Only the standard library and torch
(plus the target's own backend module) are used.

Input: ``argv[1]`` is a JSON object (backend, and the accelerator table's device, module
and version of it; sizes, iters, rounds, pair_bytes, timeout, and optionally budget); the
rank environment is launch's (``NODE_RANK``, ``NNODES``, ``MASTER_ADDR``, ``MASTER_PORT``,
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``).
Output: one line per measurement on stdout, ``CLUSTERCTL-PROBE {json}``:

* ``versions``: torch and backend versions;
* ``joined``: seconds until the process group was up;
* ``measuring``: this node begins its pair all_reduce with ``peer`` (in round ``round``);
* ``pair``: one all_reduce between this node and ``peer`` (rounds of disjoint pairs,
  every pair of a round at the same time), the seconds of each timed iteration;
* ``world``: one all_reduce size across every node, the seconds of each timed iteration;
* ``skipped``: (with a budget) a size left out because one iteration of it would not fit
  in the time left (``predicted`` seconds);
* ``budget``: (with a budget) the time was up in ``phase``, measuring with ``peer``
  (null: no pair); the process then exits 4;
* ``error``: what failed, in which phase; the process then exits 3.

The pair rounds come first: they are what names a slow node.  Every all_reduce is timed
on this process alone (after a device synchronise); the caller takes the slowest rank of
each iteration, as nccl-tests does.

``budget`` (seconds from this script's start): the ranks agree on one deadline once the
process group is up (the earliest, counted from then: clocks are not compared), give
the pair rounds 60 % of the time left and the sizes the rest, and stop a measurement
after the iteration past which the next would not fit (decided on the slowest rank's
figures, with a tiny all_reduce, so every rank stops at the same iteration); a size
whose one iteration would not fit is skipped.  A watchdog ends the probe 2 s after the
deadline whatever it is doing (one all_reduce on a very slow link cannot be cut short),
after printing ``budget``: the caller names the nodes whose pairs had not finished.
"""

import datetime
import importlib
import json
import os
import sys
import threading
import time
import traceback

MARK = "CLUSTERCTL-PROBE "
T0 = time.time()
P0 = time.perf_counter()
BUDGET_STATUS = 4
PAIR_SHARE = 0.6     # of the measuring time, for the pair rounds (the rest: the sizes)
GRACE = 2.0          # seconds past the deadline before the watchdog ends the probe
_out = threading.Lock()
_ended = []
#: what the probe is doing, for the watchdog's last record
state = {"phase": "import", "peer": None, "deadline": None}


def emit(kind, **fields):
    with _out:
        if _ended:
            return
        sys.stdout.write(MARK + json.dumps({"kind": kind, "at": round(time.time() - T0, 3),
                                            **fields}) + "\n")
        sys.stdout.flush()


def end(code, kind=None, **fields):
    """The last record (if any), then exit at once; a second caller never gets past the lock."""
    if kind:
        emit(kind, **fields)
    with _out:
        _ended.append(code)
        sys.stdout.flush()
        os._exit(code)  # skip process-group teardown: peers may already be gone


def out_of_budget(**fields):
    end(BUDGET_STATUS, "budget", phase=state["phase"], peer=state["peer"], **fields)


def watchdog():
    while True:
        time.sleep(0.1)
        deadline = state["deadline"]
        if deadline is not None and time.perf_counter() >= deadline + GRACE:
            out_of_budget()


def device_for(cfg, torch):
    """The device one process of this backend uses, importing the backend's module: the
    first of ``cfg["module"]`` that imports (later ones are older names of it)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    modules = cfg["module"]
    for i, name in enumerate(modules):
        try:
            importlib.import_module(name)  # registers the backend or the device
            break
        except ImportError:
            if i == len(modules) - 1:
                raise
    kind = cfg["device"]
    if kind == "cpu":
        return torch.device("cpu"), (lambda: None)
    accelerator = getattr(torch, kind)  # torch.cuda, torch.mlu (registered by torch_mlu), ...
    accelerator.set_device(local)
    return torch.device(kind, local), (lambda: accelerator.synchronize())


def backend_version(cfg, torch):
    try:
        how = cfg["version"]
        if how == "nccl":
            v = torch.cuda.nccl.version()
            return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        if how == "module":
            for name in cfg["module"]:
                mod = sys.modules.get(name)
                if mod is not None:
                    return str(getattr(mod, "__version__", "?"))
        if how == "torch":
            return "torch " + torch.__version__
    except Exception as e:  # noqa: BLE001 - a version is information, not a failure
        return f"unknown ({type(e).__name__})"
    return "?"


def main():
    cfg = json.loads(sys.argv[1])
    rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    budget = cfg.get("budget")
    if budget is not None:
        state["deadline"] = P0 + float(budget)
        threading.Thread(target=watchdog, name="budget", daemon=True).start()
    try:
        import torch
        import torch.distributed as dist

        backend = cfg["backend"]
        device, sync = device_for(cfg, torch)
        emit("versions", torch=torch.__version__, backend=backend,
             backend_version=backend_version(cfg, torch), device=str(device))
        state["phase"] = "join"
        start = time.perf_counter()
        dist.init_process_group(
            backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=cfg["timeout"]))
        emit("joined", seconds=time.perf_counter() - start)

        def agree(values, group):
            """Every rank of ``group`` gets the largest of each value (a tiny all_reduce)."""
            t = torch.tensor(values, dtype=torch.float32, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            sync()
            return t.tolist()

        def left(until):
            return until - time.perf_counter()

        def timed(nbytes, group, until=None):
            """``iters`` timed all_reduce; with ``until`` (perf_counter), fewer when the next
            iteration would end past it (at least one)."""
            t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
            # warm-up (connections, buffers): the whole size without a budget, one element
            # with one (a full-size warm-up on a slow link costs as much as an iteration)
            dist.all_reduce(t if until is None else t[:1], group=group)
            sync()
            seconds = []
            for _ in range(cfg["iters"]):
                s = time.perf_counter()
                dist.all_reduce(t, group=group)
                sync()
                seconds.append(time.perf_counter() - s)
                if until is not None and len(seconds) < cfg["iters"]:
                    slowest, negative_left = agree([seconds[-1], -left(until)], group)
                    if slowest > -negative_left:
                        break
            return seconds

        if budget is not None:
            # one deadline for all: the earliest rank's, counted from now on every rank
            state["deadline"] = time.perf_counter() - agree([-left(state["deadline"])], None)[0]
        deadline = state["deadline"]
        rounds = cfg["rounds"]
        pairs_end = (time.perf_counter() + PAIR_SHARE * left(deadline)) if budget is not None else None
        for i, pairs in enumerate(rounds):
            state["phase"] = f"pair round {i + 1}"
            mine = None
            for pair in pairs:  # every rank creates every group, in the same order
                group = dist.new_group(ranks=sorted(pair))
                if rank in pair:
                    mine = (group, pair[1] if pair[0] == rank else pair[0])
            if mine is not None:
                state["peer"] = mine[1]
                emit("measuring", peer=mine[1], round=i + 1)
                until = None if budget is None else \
                    time.perf_counter() + max(0.0, left(pairs_end)) / (len(rounds) - i)
                emit("pair", peer=mine[1], bytes=cfg["pair_bytes"],
                     seconds=timed(cfg["pair_bytes"], mine[0], until))
                state["peer"] = None
        state["phase"] = "world"
        sizes = cfg["sizes"]
        previous = None   # (bytes, the slowest rank's median seconds), the same on every rank
        for k, nbytes in enumerate(sizes):
            if budget is None:
                dist.barrier()
                emit("world", bytes=nbytes, seconds=timed(nbytes, None))
                continue
            predicted = previous[1] * nbytes / previous[0] if previous else 0.0
            # the earliest rank's time left (also the barrier before the size)
            time_left = -agree([-left(deadline)], None)[0]
            if previous and predicted * 1.2 > time_left:
                for rest in sizes[k:]:
                    emit("skipped", bytes=rest, predicted=round(predicted * rest / nbytes, 3))
                break
            until = time.perf_counter() + time_left / (len(sizes) - k)
            seconds = timed(nbytes, None, until)
            emit("world", bytes=nbytes, seconds=seconds)
            previous = (nbytes, agree([sorted(seconds)[len(seconds) // 2]], None)[0])
        state["phase"] = "end"
        dist.barrier()
        emit("done")
    except BaseException as e:  # noqa: BLE001 - the caller gets the reason, not a hang
        error = f"{type(e).__name__}: {e}".strip()[:2000]
        deadline = state["deadline"]
        if deadline is not None and time.perf_counter() >= deadline:
            out_of_budget(error=error)   # most likely a peer whose time was up went away
        end(3, "error", phase=state["phase"], error=error, trace=traceback.format_exc()[-2000:])
    end(0)


if __name__ == "__main__":
    main()
