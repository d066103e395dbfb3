"""Slurm's client programs, each call bounded, and the pure readers of what they print.

One place for ``sbatch``/``squeue``/``scontrol``/``sacct``/``scancel`` calls
(:func:`slurm_client`: argv list, bounded, never raises for a non-zero status) and for
parsing their output and srun's labels.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time
from collections.abc import Mapping, Sequence

import hostlist

from clusterctl.core.text import digits

CLIENT_TIMEOUT = 30.0     # seconds one sbatch / squeue / scontrol / sacct / scancel call may take

#: What every Slurm client prints, then retries for 60 s, when its slurm.conf is not there
#: (``s_p_parse_file: cannot stat file /x/slurm.conf: No such file or directory, retrying
#: in 1sec up to 60sec``): the call is ended at that line, not waited out.
_NO_CONF = re.compile(r"cannot stat file (\S+?):? .*retrying")


def missing_conf(text: str) -> str | None:
    """The slurm.conf path a Slurm client said it cannot find, from its stderr; else None."""
    m = _NO_CONF.search(text)
    return m.group(1) if m else None


def slurm_client(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    """One Slurm client call (argv list), bounded; never raises for a non-zero status.

    A client that says it cannot find its slurm.conf is stopped at once (exit 1, its
    words in stderr: :func:`missing_conf` reads them) instead of retrying for a minute."""
    argv = list(argv)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None)
    got = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for f in got:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return _ended(proc, argv, 124, got, f"{argv[0]} timed out after {timeout:.0f}s")
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                got[key.fileobj] += data
                if key.fileobj is proc.stderr and missing_conf(got[proc.stderr].decode(errors="replace")):
                    return _ended(proc, argv, 1, got, "")
    try:
        code = proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        return _ended(proc, argv, 124, got, f"{argv[0]} timed out after {timeout:.0f}s")
    return _ended(proc, argv, code, got, "")


def _ended(proc: subprocess.Popen, argv: list[str], code: int, got: dict, why: str) -> subprocess.CompletedProcess:
    """Kill ``proc`` if it still runs, close its pipes; the call's result as subprocess.run gives it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    out, err = (bytes(got[f]).decode(errors="replace") for f in (proc.stdout, proc.stderr))
    for f in (proc.stdout, proc.stderr):
        f.close()
    if code == 124:
        return subprocess.CompletedProcess(argv, 124, "", why)
    return subprocess.CompletedProcess(argv, code, out, err)


def parse_label(line: str) -> tuple[int, str] | None:
    """``srun --label``'s ``N: text`` -> (N, text); None for Slurm's own lines."""
    head, sep, text = line.partition(": ")
    if not sep:
        head, sep, text = line.partition(":")
    head = head.strip()
    if sep and digits(head):
        return int(head), text
    return None


def scontrol_fields(text: str) -> dict[str, str]:
    """``scontrol show job`` output -> {field: value} (values without spaces)."""
    out: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


def job_nodes(job_id: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """(JobState, the job's nodes in task order) from ``scontrol show job``; ("", []) unknown."""
    res = slurm_client(["scontrol", "-o", "show", "job", job_id], env=env)
    if res.returncode != 0:
        return "", []
    f = scontrol_fields(res.stdout)
    nodelist = f.get("NodeList", "")
    names = hostlist.expand_hostlist(nodelist) if nodelist and nodelist != "(null)" else []
    return f.get("JobState", ""), names


def in_queue(job_id: str, env: Mapping[str, str]) -> bool | None:
    """Whether the job is still pending/running; None when squeue could not tell."""
    res = slurm_client(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env)
    if res.returncode != 0:
        # squeue errors with "Invalid job id" once a finished job is purged
        return False if "Invalid job id" in res.stderr else None
    state = res.stdout.strip()
    return bool(state) and state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                         "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL")
