"""An interactive terminal on a node, or in a container on it, over SSH: ``clusterctl shell``.

One job: :func:`relay` - the bytes of a pseudo-terminal session
(:meth:`~clusterctl.cluster.transport.NodeConnection.terminal_channel`) to and from this
machine's terminal, as ``ssh -t`` moves them:

* this terminal is put in raw mode for the session (and given back as it was, also when the
  connection dies): every key, Ctrl-C (a ``\\x03``, which the node's terminal turns into
  SIGINT for what runs in its foreground) and Ctrl-D included, goes to the node untouched;
  a SIGINT this process gets otherwise (stdin no terminal, ``kill -INT``) is sent on as that
  same byte;
* a resize of this terminal (SIGWINCH) resizes the node's (``window-change``), so ``stty
  size``, editors and pagers follow;
* the session's exit status is returned (the shell's ``exit 3`` gives 3); a connection that
  dies is a ``NodeError`` naming the node; SIGTERM or SIGHUP here ends the session (the node's
  sshd hangs up its terminal) with 128 + the signal.

:func:`shell_argv` is the command a container's shell starts with (bash when the image has
it, else sh); :func:`on_node` opens a login shell on an inventory's node.

Contract: :func:`relay`, :func:`open_terminal`, :func:`on_node`, :func:`shell_argv`,
:func:`local_size`, :data:`DEFAULT_SIZE`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import termios
import threading
import tty
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.execute import pick
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.transport.cluster import Cluster
from clusterctl.core.errors import NodeError

if TYPE_CHECKING:
    import paramiko

    from clusterctl.cluster.transport import NodeConnection

#: (columns, rows) of a session whose stdin is no terminal
DEFAULT_SIZE = (80, 24)
#: the terminal type a session gets when $TERM is not set here
DEFAULT_TERM = "xterm"
_READ = 32 * 1024
_CTRL_C = b"\x03"


def shell_argv() -> list[str]:
    """A container's interactive shell: bash when the image has it, else sh (not a login
    shell: Debian's /etc/profile would set PATH again, hiding the image's own)."""
    return ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"]


def local_size(fd: int) -> tuple[int, int]:
    """(columns, rows) of the terminal at ``fd``; :data:`DEFAULT_SIZE` when it is none."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_SIZE
    return (size.columns or DEFAULT_SIZE[0], size.lines or DEFAULT_SIZE[1])


def terminal_type() -> str:
    """This terminal's type ($TERM), for the node's terminal."""
    return os.environ.get("TERM") or DEFAULT_TERM


def open_terminal(conn: NodeConnection, argv: Sequence[str] | None, *, stdin_fd: int = 0,
                  stdout_fd: int = 1) -> int:
    """``argv`` (None: the login shell) on a terminal of ``conn``'s node, relayed to this one
    until it ends; its exit status."""
    cols, rows = local_size(stdin_fd)
    chan = conn.terminal_channel(argv, term=terminal_type(), width=cols, height=rows)
    return relay(chan, node=conn.name, stdin_fd=stdin_fd, stdout_fd=stdout_fd)


def on_node(inventory_path: Path, node: str | None = None, *, stdin_fd: int = 0,
            stdout_fd: int = 1) -> int:
    """A login shell on ``node`` of the inventory (None: its first node) on this terminal;
    its exit status.  UserError naming the nodes for a name the inventory has not."""
    inventory = load_inventory(inventory_path)
    members = [(n.name, r) for r, n in enumerate(inventory.nodes)]
    name = pick(members, nodes=[node] if node else [], where=f"inventory {inventory_path}")[0][0]
    with Cluster(inventory) as cluster:
        return open_terminal(cluster.connection(name), None, stdin_fd=stdin_fd, stdout_fd=stdout_fd)


class _Ended(Exception):
    """SIGTERM or SIGHUP came: end the session."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def relay(chan: paramiko.Channel, *, node: str, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Move a terminal session's bytes between ``chan`` and this terminal until the session
    ends (see the module docstring); its exit status (-1: it ended without one)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    try:
        with _raw(stdin_fd), _signals(chan, stdin_fd, wake_w):
            return _pump(chan, node, stdin_fd, stdout_fd, wake_r)
    except _Ended as e:
        return 128 + e.signum
    finally:
        chan.close()
        os.close(wake_r)
        os.close(wake_w)


def _pump(chan: paramiko.Channel, node: str, stdin_fd: int, stdout_fd: int, wake_r: int) -> int:
    reading = True
    while True:
        if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
            chan.status_event.wait(1.0)       # output done (its pipe stays readable): the status
            ready = []
        else:
            watched = [chan, wake_r] + ([stdin_fd] if reading else [])
            ready, _, _ = select.select(watched, [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 512)
            if not chan.closed:
                cols, rows = local_size(stdin_fd)
                with contextlib.suppress(Exception):   # the session ended meanwhile
                    chan.resize_pty(width=cols, height=rows)
        if reading and stdin_fd in ready:
            try:
                data = os.read(stdin_fd, _READ)
            except OSError as e:
                if e.errno not in (errno.EIO, errno.EBADF):
                    raise
                data = b""
            if data:
                with contextlib.suppress(OSError, EOFError):
                    chan.sendall(data)
            else:                                    # stdin ended: the node's input does too
                reading = False
                with contextlib.suppress(OSError, EOFError):
                    chan.shutdown_write()
        while chan.recv_ready():
            _write_all(stdout_fd, chan.recv(_READ))
        while chan.recv_stderr_ready():
            _write_all(stdout_fd, chan.recv_stderr(_READ))
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            code = chan.recv_exit_status()
            if code == -1 and not chan.get_transport().is_active():
                raise NodeError(node, "connection lost during the session (the node stopped answering)")
            return code
        if not chan.get_transport().is_active():
            raise NodeError(node, "connection lost during the session (the node stopped answering)")
        if chan.closed and not chan.recv_ready():
            return -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        view = view[n:]


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """``fd``'s terminal in raw mode while inside (nothing when it is no terminal)."""
    try:
        saved = termios.tcgetattr(fd)
    except (termios.error, OSError):
        yield
        return
    tty.setraw(fd, termios.TCSANOW)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _signals(chan: paramiko.Channel, stdin_fd: int, wake_w: int) -> Iterator[None]:
    """SIGWINCH wakes the relay (which resizes the node's terminal), SIGINT goes to the node as
    Ctrl-C, SIGTERM and SIGHUP end the session; the old handlers back after.  Only the main
    thread can set handlers: elsewhere the relay runs without them (no resize)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def winch(signum, frame) -> None:
        with contextlib.suppress(OSError):
            os.write(wake_w, b"w")

    def interrupt(signum, frame) -> None:
        with contextlib.suppress(Exception):
            chan.sendall(_CTRL_C)

    def end(signum, frame) -> None:
        raise _Ended(signum)

    handlers = {signal.SIGWINCH: winch, signal.SIGINT: interrupt, signal.SIGTERM: end,
                signal.SIGHUP: end}
    saved = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


__all__ = ["DEFAULT_SIZE", "local_size", "on_node", "open_terminal", "relay", "shell_argv",
           "terminal_type"]
