"""The lock that serialises `sandbox up`/`down` of one name, with real processes.

The lock file is removed when no sandbox of that name is left, so a refused `up`
leaves nothing behind; these tests check that removing it never lets two processes
hold the lock at once (a waiter on the removed file must lock the path anew).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from clusterctl.cluster.sandbox import lifecycle

HOLDER = """
import sys, time
from pathlib import Path
from clusterctl.cluster.sandbox.lifecycle import _locked
log, who, release = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with _locked("lk"):
    with log.open("a") as f:
        f.write(f"{who} in {time.monotonic()}\\n")
    if release == "-":
        time.sleep(1.5)
    else:
        while not Path(release).exists():
            time.sleep(0.02)
    with log.open("a") as f:
        f.write(f"{who} out {time.monotonic()}\\n")
"""


def _start(tmp: Path, who: str, release: str = "-") -> subprocess.Popen:
    env = {**os.environ, "CLUSTERCTL_STATE": str(tmp / "state")}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp / "log"), who, release],
                            env=env)


def _wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _intervals(log: Path) -> dict[str, tuple[float, float]]:
    seen: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        who, edge, t = line.split()
        seen.setdefault(who, {})[edge] = float(t)
    return {who: (e["in"], e["out"]) for who, e in seen.items()}


def test_the_lock_file_goes_with_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_STATE", str(tmp_path))
    lock = tmp_path / "sandbox" / ".lk.lock"
    with lifecycle._locked("lk"):
        assert lock.exists()
    assert not lock.exists()  # nothing of sandbox "lk": nothing left
    (tmp_path / "sandbox" / "lk").mkdir()  # a sandbox "lk" is up: its lock file stays
    with lifecycle._locked("lk"):
        pass
    assert lock.exists()


def test_a_waiter_on_a_removed_lock_file_does_not_run_beside_a_newcomer(tmp_path):
    """A holds; B waits on A's file; A removes it and leaves; C opens a new file.

    B and C must not hold the lock at the same time.  Were B to keep the lock of the
    removed file, it would run beside C, which locks a file of its own.
    """
    log, release = tmp_path / "log", tmp_path / "release-a"
    lock = tmp_path / "state" / "sandbox" / ".lk.lock"
    a = _start(tmp_path, "A", str(release))
    _wait_for(lambda: log.exists() and "A in" in log.read_text(), "A to hold the lock")
    b = _start(tmp_path, "B")
    time.sleep(1.0)  # B is started and blocked on A's lock file
    assert "B in" not in log.read_text()
    release.touch()
    assert a.wait(timeout=20) == 0
    c = _start(tmp_path, "C")
    assert b.wait(timeout=30) == 0 and c.wait(timeout=30) == 0
    spans = _intervals(log)
    assert set(spans) == {"A", "B", "C"}, log.read_text()
    (b_in, b_out), (c_in, c_out) = spans["B"], spans["C"]
    assert b_out <= c_in or c_out <= b_in, f"B and C held the lock at once:\n{log.read_text()}"
    assert not lock.exists()
