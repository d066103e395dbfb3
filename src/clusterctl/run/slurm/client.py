"""Slurm's client programs, each call bounded, and the pure readers of what they print.

One place for ``sbatch``/``squeue``/``scontrol``/``sacct``/``scancel`` calls
(:func:`slurm_client`: argv list, bounded, never raises for a non-zero status) and for
parsing their output and srun's labels.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

import hostlist

CLIENT_TIMEOUT = 30.0     # seconds one sbatch / squeue / scontrol / sacct / scancel call may take


def slurm_client(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    """One Slurm client call (argv list), bounded; never raises for a non-zero status."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} timed out after {timeout:.0f}s")


def parse_label(line: str) -> tuple[int, str] | None:
    """``srun --label``'s ``N: text`` -> (N, text); None for Slurm's own lines."""
    head, sep, text = line.partition(": ")
    if not sep:
        head, sep, text = line.partition(":")
    head = head.strip()
    if sep and head.isdigit():
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
