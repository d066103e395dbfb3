"""An opt-in timeline of a push: when each node reached each phase (for profiling).

One job: when ``CLUSTERCTL_PUSH_TRACE`` names a file, append one line per event,
``<seconds since the push began> <node> <phase>``; otherwise do nothing (one
environment lookup per push).  Contract: :func:`begin` (at the start of a
push), :func:`mark` (node, phase).  The file holds node names and phase names
only, never a command line or a key.  Read it with ``benchmarks/push.py
--trace`` or by eye: which phases happen one node after the other (a cost
that grows with the chain) and which overlap.
"""

from __future__ import annotations

import os
import threading
import time

ENV = "CLUSTERCTL_PUSH_TRACE"
_lock = threading.Lock()
_state: dict[str, object] = {"path": None, "t0": 0.0}


def begin(label: str) -> None:
    """Start a new timeline (a header line) when tracing is on."""
    path = os.environ.get(ENV) or None
    with _lock:
        _state["path"], _state["t0"] = path, time.monotonic()
    if path:
        _write(f"# push {label}\n")


def mark(node: str, phase: str) -> None:
    """Note that ``node`` reached ``phase`` now (a no-op unless tracing)."""
    if not _state["path"]:
        return
    _write(f"{time.monotonic() - float(_state['t0']):8.3f} {node} {phase}\n")


def _write(line: str) -> None:
    path = _state["path"]
    if not path:
        return
    with _lock, open(str(path), "a", encoding="utf-8") as f:
        f.write(line)


def enabled() -> bool:
    """Whether this push is being traced."""
    return bool(_state["path"])
