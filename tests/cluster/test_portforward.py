"""The port forward (clusterctl.cluster.portforward) on a real sshd reached through a ProxyJump
host, as ~/.ssh/config may say: a server on the node's loopback answers at the local URL, one
bound to the node's own address only is reached by the second host tried, and a port where
nothing listens is said, the forward going on.  A run's rank under `clusterctl port-forward`:
tests/run/test_shell_sandbox.py."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request

import pytest

from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.portforward import Forwarder, PortSpec
from clusterctl.cluster.transport import Cluster
from tests.fixtures.sshd import free_port


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.server.server_address[0]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def servers():
    """HTTP servers on 127.0.0.1 and on 127.0.0.3 only (a node's own address), stopped after."""
    made = [http.server.ThreadingHTTPServer((host, 0), _Hello) for host in ("127.0.0.1", "127.0.0.3")]
    for s in made:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield {s.server_address[0]: s.server_address[1] for s in made}
    for s in made:
        s.shutdown()
        s.server_close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_forward_through_a_jump_host(loopback_sshd, servers, tmp_path):
    sshd = loopback_sshd
    config = tmp_path / "ssh_config"
    config.write_text(f"Host jumped\n  HostName 127.0.0.2\n  Port {sshd.port}\n"
                      f"  ProxyJump {sshd.user}@127.0.0.1:{sshd.port}\n"
                      f"Host *\n  IdentityFile {sshd.key}\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"ssh: {{known_hosts: {sshd.known_hosts}}}\nnodes:\n  - name: j\n    host: jumped\n")
    events: list[str] = []
    closed = free_port()
    with Cluster(load_inventory(inv), ssh_config=config) as cluster:
        conn = cluster.connection("j")
        # through the jump host: the node's sshd sees this session come from 127.0.0.1
        assert conn.run(["printenv", "SSH_CONNECTION"]).stdout.split()[2] == "127.0.0.2"
        forwards = {}
        stop = threading.Event()
        for port, hosts in ((servers["127.0.0.1"], ("127.0.0.1", "127.0.0.3")),
                            (servers["127.0.0.3"], ("127.0.0.1", "127.0.0.3")),
                            (closed, ("127.0.0.1",))):
            fwd = Forwarder(PortSpec(port, 0), hosts=hosts, on_event=events.append)
            fwd.bind()
            threading.Thread(target=fwd.serve, args=(conn, stop), daemon=True).start()
            forwards[port] = fwd
        try:
            assert _get(forwards[servers["127.0.0.1"]].url) == "hello from 127.0.0.1"
            for _ in range(2):   # the node's own address, after 127.0.0.1 refused; then kept first
                assert _get(forwards[servers["127.0.0.3"]].url) == "hello from 127.0.0.3"
            assert forwards[servers["127.0.0.3"]].hosts == ["127.0.0.3", "127.0.0.1"]
            with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
                _get(forwards[closed].url)
            # the forward goes on after a connection it could not make
            assert _get(forwards[servers["127.0.0.1"]].url) == "hello from 127.0.0.1"
        finally:
            stop.set()
    assert events == [f"j: cannot connect to 127.0.0.1:{closed} there: nothing accepts connections "
                      "there (connection refused)"], events
