"""`clusterctl shell` and `clusterctl port-forward` on the real 3-node sandbox, one detached run
shared by the module (each rank serves its rank number over HTTP on PORT).

The shell runs in a real terminal, a tmux pane driven by send-keys and read by capture-pane:
it is in rank 1's container (its PID 1 is the run's command) with that rank's environment, `stty size` follows a resize of the
pane, Ctrl-C ends a `sleep 100` and the shell lives on, `exit 3` makes clusterctl exit 3; and
`shell --nodes FILE NODE` opens a login shell on the node itself.  port-forward reaches rank
1's server on the node's loopback, a server bound to the node's own address only, says a port
where nothing listens, and exits 0 on Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.run import records

SRC = Path(__file__).resolve().parents[2] / "src"
PORT = 18765          # every rank's server (the job's command)
OWN_PORT = 18766      # rank 1's second server, bound to its node's address only
RUN = "shell1"
SERVE = ("import http.server, os\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        body = ('rank ' + os.environ['NODE_RANK']).encode()\n"
         "        self.send_response(200)\n"
         "        self.send_header('Content-Length', str(len(body)))\n"
         "        self.end_headers()\n"
         "        self.wfile.write(body)\n"
         f"http.server.HTTPServer(('', {PORT}), H).serve_forever()\n")


@pytest.fixture(scope="module")
def run(sandbox3, cpu_image, tmp_path_factory):
    """A detached run on the sandbox's 3 nodes serving PORT, its env for clusterctl processes;
    its containers removed after."""
    sb = sandbox3
    base = tmp_path_factory.mktemp("shell")
    env = {**os.environ, "CLUSTERCTL_RUNS": str(base / "runs"), "CLUSTERCTL_PLAIN": "1",
           "PYTHONPATH": str(SRC)}
    env.pop("CLUSTERCTL_NODES", None)
    job = base / "serve.yaml"
    job.write_text(yaml.safe_dump({"image": cpu_image, "nproc_per_node": 1,
                                   "command": ["python3", "-u", "-c", SERVE]}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLUSTERCTL_RUNS", env["CLUSTERCTL_RUNS"])
        mp.setenv("CLUSTERCTL_PLAIN", "1")
        mp.delenv("CLUSTERCTL_NODES", raising=False)
        res = CliRunner().invoke(app, ["launch", str(job), "--nodes", str(sb.inventory_path),
                                       "--detach", "--run-id", RUN])
        assert res.exit_code == 0, res.output
        try:
            yield env, records.load(RUN)
        finally:
            for node in sb.nodes:
                names = sb.node_docker(node, "ps", "-aq", "--filter", f"label=io.clusterctl.run={RUN}",
                                       check=False).stdout.split()
                if names:
                    sb.node_docker(node, "rm", "--force", *names, check=False)


class Tmux:
    """A tmux server of the test's own (its own socket), killed after."""

    def __init__(self) -> None:
        self.socket = f"clusterctl-test-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=20).stdout

    def start(self, session: str, command: str, env: dict[str, str]) -> None:
        """``command`` in a 100x30 pane, then its exit status shown as clusterctl-exit=N."""
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()
                        if k in ("CLUSTERCTL_RUNS", "CLUSTERCTL_PLAIN", "PYTHONPATH", "PATH", "HOME"))
        self("new-session", "-d", "-s", session, "-x", "100", "-y", "30",
             f"env {line} {command}; echo clusterctl-exit=$?; sleep 600")

    def screen(self, session: str) -> str:
        return self("capture-pane", "-p", "-J", "-t", session, "-S", "-500")

    def wait_for(self, session: str, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.screen(session))
            if m:
                return m
            assert time.monotonic() < deadline, f"{pattern!r} not on the screen:\n{self.screen(session)}"
            time.sleep(0.2)

    def type(self, session: str, text: str) -> None:
        self("send-keys", "-t", session, "-l", text)
        self("send-keys", "-t", session, "Enter")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (apt-get install tmux; scripts/setup-host installs it)")
    t = Tmux()
    yield t
    t.kill()


def test_shell_in_a_rank_s_container_and_on_a_node(sandbox3, run, tmux):
    env, record = run
    clusterctl = f"{shlex.quote(sys.executable)} -m clusterctl"
    tmux.start("rank1", f"{clusterctl} shell {RUN} --rank 1", env)
    # rank 1's environment, and PID 1 is the run's own command: inside its container
    tmux.type("rank1", "echo rank=$NODE_RANK pid1=$(tr '\\0' ' ' </proc/1/cmdline | grep -c http.server)")
    tmux.wait_for("rank1", r"rank=1 pid1=[1-9]")          # (its lines that name it; none on a node)
    assert f"run {RUN}: node2 (rank 1), container {record.node('node2').container}" in tmux.screen("rank1")

    tmux.type("rank1", "echo size=$(stty size)")
    tmux.wait_for("rank1", r"size=30 100")
    tmux("resize-window", "-t", "rank1", "-x", "120", "-y", "40")
    rows, cols = tmux("display", "-p", "-t", "rank1", "#{pane_height} #{pane_width}").split()
    assert (rows, cols) == ("40", "120")
    tmux.type("rank1", "echo resized=$(stty size)")
    tmux.wait_for("rank1", r"resized=40 120")

    tmux.type("rank1", "sleep 100")
    time.sleep(1)
    started = time.monotonic()
    tmux("send-keys", "-t", "rank1", "C-c")
    tmux.type("rank1", "echo alive-$((2+3))")
    tmux.wait_for("rank1", r"alive-5", timeout=20)
    assert time.monotonic() - started < 20                 # not the sleep's 100 s

    tmux.type("rank1", "exit 3")
    tmux.wait_for("rank1", r"clusterctl-exit=3")

    # the node itself: a login shell on node3 (its address is its own), exit 5 passed on
    ip = sandbox3.nodes["node3"]
    tmux.start("node3", f"{clusterctl} shell --nodes {shlex.quote(str(sandbox3.inventory_path))} node3",
               env)
    tmux.type("node3", "ip -o -4 addr show; echo rank=${NODE_RANK:-none}")
    tmux.wait_for("node3", rf"inet {re.escape(ip)}/[\s\S]*rank=none")
    tmux.type("node3", "exit 5")
    tmux.wait_for("node3", r"clusterctl-exit=5")


def _forward(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "port-forward", RUN, *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.match(r"Forwarding (http://127\.0\.0\.1:\d+/) -> ", line)
    if not m:
        proc.kill()
        pytest.fail(f"no URL printed: {line!r} {proc.communicate()}")
    return proc, m.group(1)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=15) as r:
        return r.status, r.read().decode()


def test_port_forward_reaches_a_rank_s_port_until_ctrl_c(sandbox3, run):
    env, record = run
    container = record.node("node2").container
    sandbox3.node_docker("node2", "exec", "-d", container, "python3", "-m", "http.server",
                         str(OWN_PORT), "--bind", sandbox3.nodes["node2"], "--directory", "/")
    procs = []
    try:
        proc, url = _forward(env, "--rank", "1", f"{PORT}:0")
        procs.append(proc)
        assert _get(url) == (200, "rank 1")
        assert _get(url) == (200, "rank 1")                   # again: the forward goes on

        own, own_url = _forward(env, "--node", "node2", f"{OWN_PORT}:0")
        procs.append(own)
        deadline = time.monotonic() + 20                    # the server in the container starting
        while True:
            try:
                status, body = _get(own_url + "etc/")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert status == 200 and "hostname" in body         # / of the container, by its node's address

        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, (out, err)
        assert "stopped." in err, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    # nothing listens on a port: the connection is closed here, and said, the forward going on
    closed, closed_url = _forward(env, "--rank", "2", "18799:0")
    try:
        with pytest.raises(OSError):
            _get(closed_url)
    finally:
        closed.send_signal(signal.SIGINT)
        out, err = closed.communicate(timeout=20)
    assert closed.returncode == 0
    ip = sandbox3.nodes["node3"]
    assert (f"node3: cannot connect to 127.0.0.1:18799 there: nothing accepts connections there "
            f"(connection refused); cannot connect to {ip}:18799 there: nothing accepts") in err, err
