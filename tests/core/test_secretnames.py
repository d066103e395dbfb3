"""core/secretnames: the secret-name rule, and secret values typed on the command line moved
off it (into a fresh process's environment) before clusterctl does anything else."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterctl.core.secretnames import MOVED_MARK, is_secret_name, move_off_argv

SECRET = "tok-9f8e7d6c5b4a3"

MOVES = [
    # argv, what stays on it, what moves
    (["launch", "--env", f"HF_TOKEN={SECRET}", "--dry-run"],
     ["launch", "--env", "HF_TOKEN", "--dry-run"], {"HF_TOKEN": SECRET}),
    (["launch", f"--env=DB_PASSWORD={SECRET}"], ["launch", "--env", "DB_PASSWORD"], {"DB_PASSWORD": SECRET}),
    (["launch", "--set", f"WANDB_API_KEY={SECRET}", "--set", "PHASE=2"],
     ["launch", "--set", "WANDB_API_KEY", "--set", "PHASE=2"], {"WANDB_API_KEY": SECRET}),
    (["launch", "--set", "API_TOKEN="], ["launch", "--set", "API_TOKEN"], {"API_TOKEN": ""}),
    # settings named like tokens are not secrets; after "--" is the job's own command
    (["launch", "--env", "TOKENIZERS_PARALLELISM=false", "--set", "PAD_TOKEN_ID=0"],
     ["launch", "--env", "TOKENIZERS_PARALLELISM=false", "--set", "PAD_TOKEN_ID=0"], {}),
    (["launch", "--", "python", "t.py", "--env", f"HF_TOKEN={SECRET}"],
     ["launch", "--", "python", "t.py", "--env", f"HF_TOKEN={SECRET}"], {}),
    (["launch", "--env", "HF_TOKEN"], ["launch", "--env", "HF_TOKEN"], {}),
    (["launch", "--env"], ["launch", "--env"], {}),
    (["launch", "--envx", f"HF_TOKEN={SECRET}"], ["launch", "--envx", f"HF_TOKEN={SECRET}"], {}),
    (["launch", "--env", f"1BAD_TOKEN={SECRET}"], ["launch", "--env", f"1BAD_TOKEN={SECRET}"], {}),
]


@pytest.mark.parametrize(("argv", "stays", "moved"), MOVES)
def test_secret_values_move_off_the_command_line(argv, stays, moved):
    assert move_off_argv(argv) == (stays, moved)


@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("DB_PASSWORD", True), ("MY_SECRET_PATH", True),
    ("hf_token", True), ("PAD_TOKEN_ID", False), ("TOKENIZERS_PARALLELISM", False),
    ("MAX_TOKENS", False), ("KEY_COLUMN", False), ("MONKEY", False),
])
def test_the_rule_is_by_words(name, secret):
    assert is_secret_name(name) is secret
    assert is_secret_name(name, declared=[name])


def _silent_server() -> tuple[socket.socket, int]:
    """A TCP server on loopback that accepts and never answers: an SSH connection to it waits
    for the server's banner, which keeps a real launch alive long enough to look at it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def _env(tmp_path: Path, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This environment for a clusterctl of the source tree whose records and caches stay in
    ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if k not in (MOVED_MARK, *drop)}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"),
               CLUSTERCTL_RUNS=str(tmp_path / "runs"), HOME=str(tmp_path),
               XDG_STATE_HOME=str(tmp_path / "state"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    return env


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_secret_typed_on_the_command_line_is_not_in_the_process_list(tmp_path):
    """A real ``clusterctl launch`` (the console entry, ``python -m clusterctl``): while it
    waits on a node, ``/proc/PID/cmdline`` (what ``ps`` shows every user) has the name only;
    the value is in its environment, which only its own user can read."""
    server, port = _silent_server()
    inv = tmp_path / "inv.yaml"
    key = tmp_path / "id"
    key.write_text("not a key")
    key.chmod(0o600)
    inv.write_text(f"nodes: [{{name: n1, host: 127.0.0.1, port: {port}, user: u, identity_file: {key}}}]\n")
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "launch", "--target", "cpu",
                             "--nodes", str(inv), "--env", f"HF_TOKEN={SECRET}", "--", "true"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        seen = b""
        while time.monotonic() < deadline and proc.poll() is None:
            seen = _cmdline(proc.pid)
            if b"HF_TOKEN" in seen and b"-m\0clusterctl" in seen and MOVED_MARK.encode() in \
                    Path(f"/proc/{proc.pid}/environ").read_bytes():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stdout.read().decode()
        assert b"--env\0HF_TOKEN\0" in seen and SECRET.encode() not in seen, seen
        assert f"HF_TOKEN={SECRET}".encode() in Path(f"/proc/{proc.pid}/environ").read_bytes()
    finally:
        proc.kill()
        out = proc.communicate()[0].decode()
        server.close()
    assert SECRET not in out


def test_the_moved_value_reaches_the_job_masked_in_a_dry_run(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes: [{name: n1, host: 10.0.0.1}]\n")
    env = _env(tmp_path, drop=("HF_TOKEN",))
    out = subprocess.run([sys.executable, "-m", "clusterctl", "launch", "--target", "cpu", "--nodes",
                          str(inv), "--dry-run", "--json", "--env", f"HF_TOKEN={SECRET}", "--", "true"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr and '"HF_TOKEN": "****"' in out.stdout
    unset = subprocess.run([sys.executable, "-m", "clusterctl", "launch", "--target", "cpu", "--nodes",
                            str(inv), "--dry-run", "--env", "HF_TOKEN", "--", "true"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert unset.returncode == 2 and "HF_TOKEN is not set in clusterctl's environment" in unset.stderr
