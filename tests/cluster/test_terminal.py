"""The terminal relay (clusterctl.cluster.terminal) on a real sshd: a session on the node's
pseudo-terminal, driven from a local one (a pty pair stands for the user's terminal): its
size and a resize reach the node's, Ctrl-C interrupts what runs there, the exit status comes
back and the local terminal is given back as it was.  In a run's container under tmux:
tests/run/test_shell_sandbox.py."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import termios
import threading
import time

from clusterctl.cluster.terminal import open_terminal, shell_argv
from clusterctl.cluster.transport import Cluster

SCRIPT = ("stty size; echo ready-1; read a; stty size; trap 'echo got-int' INT; echo ready-2; "
          "sleep 100; echo after-sleep; exit 3")


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _Screen:
    """What the node wrote to the local terminal, read from the pty's master side."""

    def __init__(self, master: int) -> None:
        self.master, self.text, self._stop = master, "", False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            self.text += data.decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text:
            assert time.monotonic() < deadline, f"{text!r} not seen in {self.text!r}"
            time.sleep(0.05)


def test_size_resize_ctrl_c_and_exit_status_reach_the_session(loopback_sshd):
    master, local = pty.openpty()
    _set_size(local, 100, 30)
    before = termios.tcgetattr(local)
    screen = _Screen(master)

    def user() -> None:
        screen.wait_for("ready-1")
        _set_size(local, 120, 40)                       # the user's window grows ...
        os.kill(os.getpid(), signal.SIGWINCH)           # ... and the terminal says so
        time.sleep(0.5)
        os.write(master, b"\r")
        screen.wait_for("ready-2")
        time.sleep(0.5)                                 # sleep 100 has started
        os.write(master, b"\x03")                       # Ctrl-C

    helper = threading.Thread(target=user, daemon=True)
    helper.start()
    started = time.monotonic()
    try:
        with Cluster(loopback_sshd.inventory(1)) as cluster:
            code = open_terminal(cluster.connection("node1"), ["sh", "-c", SCRIPT],
                                 stdin_fd=local, stdout_fd=local)
        helper.join(5)
        screen.wait_for("after-sleep")
        lines = [line.strip() for line in screen.text.splitlines()]
        assert code == 3, screen.text
        assert lines.index("30 100") < lines.index("ready-1") < lines.index("40 120"), screen.text
        # the node's terminal echoes the Ctrl-C (^C) before the trap's line
        assert 0 < screen.text.index("got-int") < screen.text.index("after-sleep"), screen.text
        assert time.monotonic() - started < 30                   # not the 100 s of the sleep
        assert termios.tcgetattr(local) == before                # raw mode given back
    finally:
        os.close(local)
        os.close(master)


def test_a_container_shell_is_bash_when_there_is_one(loopback_sshd):
    """shell_argv starts bash when the node (here) or the image has it."""
    with Cluster(loopback_sshd.inventory(1)) as cluster:
        got = cluster.connection("node1").run(shell_argv(), stdin=b'echo "$0-$BASH_VERSION"\n')
    assert got.stdout.startswith("bash-"), got
