"""Stacks of a hung run: what runs in a container to dump them, and which ranks are odd (pure).

When ``launch --hang-timeout`` finds a run silent (:mod:`clusterctl.run.watchdog`), every
rank process of every container is dumped with py-spy.  This module holds the pure parts:

* :data:`DUMP_SCRIPT`: the Python program ``docker exec CONTAINER python3 -c`` runs in a
  container (argv, no shell).  It finds the rank processes (those with ``LOCAL_RANK`` in
  their environment, as torchrun and torch.distributed.launch start them; the topmost
  one of each family, so DataLoader workers are not ranks; Docker's init, PID 1 under
  ``docker run --init``, is never one; without any, every Python process), reads each one's state from ``/proc`` and dumps it with ``py-spy dump
  --pid``.  A stopped process (``T``, e.g. SIGSTOP) cannot be dumped that way: py-spy
  cannot suspend it ("Failed to suspend process"), so the script retries with
  ``--nonblocking``, which reads the stack without stopping the process.  It prints one
  JSON object; an image without py-spy says so (``"py_spy": false``);
* :func:`parse_dump`: that JSON -> :class:`RankStack` per process;
* :func:`signature`: the main thread's frames of a py-spy dump, without what differs
  between ranks doing the same thing (thread ids, idle/active);
* :func:`odd_ranks`: the ranks whose stack differs from the majority's, or that are
  stopped, or that could not be dumped, each with the reason (:class:`Odd`);
* :func:`stack_file_name`: ``<node>-rank<R>.txt`` under ``runs/<id>/stacks/``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

#: Seconds one ``py-spy dump`` may take in the container (each of the two tries).
DUMP_TIMEOUT = 20

#: Runs inside the container with ``python3 -c``; argv[1] is DUMP_TIMEOUT.  Python >= 3.6.
DUMP_SCRIPT = r'''
import json, os, shutil, subprocess, sys

timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0


def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def proc(pid):
    status = read("/proc/%d/status" % pid) or ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    env = {}
    for item in (read("/proc/%d/environ" % pid, "rb") or b"").split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"RANK", b"LOCAL_RANK"):
            env[key.decode()] = value.decode("utf-8", "replace")
    argv = (read("/proc/%d/cmdline" % pid, "rb") or b"").split(b"\0")
    return {"pid": pid, "ppid": int(fields.get("PPid", "0").strip() or 0),
            "state": fields.get("State", "?").strip(), "env": env,
            "cmd": " ".join(a.decode("utf-8", "replace") for a in argv if a)[:300],
            "exe": os.path.basename(argv[0].decode("utf-8", "replace")) if argv and argv[0] else ""}


me = os.getpid()
procs = {}
for name in os.listdir("/proc"):
    if name.isdecimal() and int(name) != me:
        info = proc(int(name))
        if info["cmd"]:
            procs[info["pid"]] = info
if procs.get(1, {}).get("exe") in ("docker-init", "tini", "tini-static"):
    del procs[1]  # docker run --init: tini is PID 1 with the container's env, not a rank
ranks = [p for p in procs.values()
         if "LOCAL_RANK" in p["env"] and "LOCAL_RANK" not in procs.get(p["ppid"], {"env": {}})["env"]]
if not ranks:
    ranks = [p for p in procs.values() if p["exe"].startswith("python")]
tool = shutil.which("py-spy")
out = {"py_spy": bool(tool), "processes": []}


def dump(pid, extra):
    try:
        r = subprocess.run([tool, "dump", *extra, "--pid", str(pid)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "py-spy dump took longer than %gs" % timeout
    text = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, " ".join(err[:3]) or "py-spy exited %d" % r.returncode
    return text, ""


def order(p):
    rank = p["env"].get("RANK", "")
    return (int(rank) if rank.isdecimal() else -1, p["pid"])


for p in sorted(ranks, key=order):
    entry = {"pid": p["pid"], "rank": p["env"].get("RANK"), "local_rank": p["env"].get("LOCAL_RANK"),
             "state": p["state"], "cmd": p["cmd"], "mode": "", "stack": "", "error": ""}
    if tool:
        text, err = dump(p["pid"], [])
        entry["mode"] = "blocking"
        if text is None:  # a stopped process cannot be suspended: read it without stopping it
            text2, err2 = dump(p["pid"], ["--nonblocking"])
            if text2 is not None:
                text, err, entry["mode"] = text2, "", "nonblocking"
            else:
                err = err + "; with --nonblocking: " + err2
        entry["stack"], entry["error"] = text or "", err
    out["processes"].append(entry)
sys.stdout.write(json.dumps(out))
'''

_THREAD = re.compile(r'^Thread\s+\S+(?:\s+\((?P<status>[^)]*)\))?:?\s*(?:"(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s+(?P<func>\S.*?)\s+\((?P<file>[^():]+?)(?::(?P<line>\d+))?\)\s*\Z")


@dataclass(frozen=True)
class RankStack:
    """One rank process's dump, on one node."""

    node: str
    pid: int
    rank: int | None = None        # global rank (RANK), None when not a torch rank
    local_rank: int | None = None
    state: str = ""                # /proc/PID/status State, e.g. "S (sleeping)", "T (stopped)"
    text: str = ""                 # py-spy's dump ("" when there is none)
    error: str = ""                # why there is no dump
    mode: str = ""                 # "blocking" or "nonblocking" (a stopped process)
    cmd: str = ""

    @property
    def label(self) -> str:
        return f"{self.node} rank {self.rank}" if self.rank is not None else f"{self.node} pid {self.pid}"

    @property
    def stopped(self) -> bool:
        return self.state[:1] in ("T", "t")


@dataclass(frozen=True)
class NodeDump:
    """What dumping one node's container gave: its rank stacks, or why there are none."""

    node: str
    stacks: tuple[RankStack, ...] = ()
    error: str = ""                # the node could not be dumped at all (no py-spy, unreachable)


@dataclass(frozen=True)
class Odd:
    """A rank that is not where the majority is, and why."""

    stack: RankStack
    reason: str


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_dump(node: str, output: str, image: str = "") -> NodeDump:
    """DUMP_SCRIPT's output on ``node`` -> NodeDump (an error naming the node when unusable)."""
    try:
        data = json.loads(output)
        procs = data["processes"]
    except (ValueError, KeyError, TypeError):
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return NodeDump(node, error=f"the stack dump in the container gave no result ({tail[0][:200]})")
    if not data.get("py_spy"):
        return NodeDump(node, error=f"py-spy is not installed in the image{' ' + image if image else ''}: "
                                    "images clusterctl builds carry it (rebuild with `clusterctl build`); "
                                    "for your own image add `pip install py-spy` to its Dockerfile")
    stacks = tuple(RankStack(node=node, pid=int(p.get("pid", 0)), rank=_int(p.get("rank")),
                             local_rank=_int(p.get("local_rank")), state=str(p.get("state", "")),
                             text=str(p.get("stack", "")), error=str(p.get("error", "")),
                             mode=str(p.get("mode", "")), cmd=str(p.get("cmd", "")))
                   for p in procs)
    if not stacks:
        return NodeDump(node, error="no rank process found in the container (it may have exited)")
    return NodeDump(node, stacks)


def threads(text: str) -> list[tuple[str, list[str]]]:
    """A py-spy dump -> [(thread name, ["func (file:line)", ...] innermost first)]."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            found.append((m.group("name") or "", []))
            continue
        f = _FRAME.match(line)
        if f and found:
            where = f.group("file") + (f":{f.group('line')}" if f.group("line") else "")
            found[-1][1].append(f"{f.group('func')} ({where})")
    return found


def signature(text: str) -> tuple[str, ...] | None:
    """The frames of the main thread (the first thread when none is named MainThread): what
    ranks doing the same thing share.  None when the dump holds no frame."""
    found = threads(text)
    if not found:
        return None
    frames = next((f for name, f in found if name == "MainThread"), found[0][1])
    return tuple(frames) or None


def odd_ranks(stacks: Sequence[RankStack]) -> list[Odd]:
    """The ranks whose stack differs from the majority's, with the reason, in rank order.

    The majority is the largest group of identical :func:`signature` s when it is larger
    than every other group and holds at least two ranks.  Besides the ranks outside it,
    a stopped process (``T``) and one that could not be dumped are always named: neither
    takes part in a collective.  Without a majority (2 ranks, 1 against 1; all different)
    only those are named.
    """
    sigs = {id(s): signature(s.text) if s.text else None for s in stacks}
    counts = Counter(sig for sig in sigs.values() if sig is not None)
    ranked = counts.most_common()
    majority = None
    if ranked and ranked[0][1] >= 2 and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        majority = ranked[0][0]
    odd = []
    for s in stacks:
        sig = sigs[id(s)]
        why = []
        if s.stopped:
            why.append(f"process stopped ({s.state})")
        if sig is None:
            why.append(f"no stack ({s.error or 'empty dump'})")
        elif majority is not None and sig != majority:
            why.append(f"stack differs from the majority ({counts[majority]} of {len(stacks)} ranks): "
                       f"in {sig[0]}")
        if why:
            odd.append(Odd(s, "; ".join(why)))
    return sorted(odd, key=lambda o: (o.stack.rank is None, o.stack.rank or 0, o.stack.node, o.stack.pid))


def majority_frame(stacks: Sequence[RankStack]) -> str | None:
    """The innermost frame where the majority waits (for the summary), or None."""
    counts = Counter(sig for s in stacks if s.text and (sig := signature(s.text)) is not None)
    ranked = counts.most_common(2)
    if ranked and ranked[0][1] >= 2 and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        return ranked[0][0][0]
    return None


def stack_file_name(stack: RankStack) -> str:
    """``<node>-rank<R>.txt`` (``<node>-pid<P>.txt`` for a process without a rank)."""
    who = f"rank{stack.rank}" if stack.rank is not None else f"pid{stack.pid}"
    return f"{stack.node}-{who}.txt"


def stack_file_text(stack: RankStack) -> str:
    """What is saved for one rank: a header (node, rank, pid, state, how it was read), then the dump."""
    head = [f"# node {stack.node}, rank {stack.rank if stack.rank is not None else '-'}, "
            f"local rank {stack.local_rank if stack.local_rank is not None else '-'}, pid {stack.pid}",
            f"# state: {stack.state or 'unknown'}; py-spy dump"
            + (" --nonblocking (the process could not be suspended)" if stack.mode == "nonblocking" else ""),
            f"# command: {stack.cmd}"]
    if stack.error:
        head.append(f"# no stack: {stack.error}")
    return "\n".join(head) + "\n\n" + stack.text
