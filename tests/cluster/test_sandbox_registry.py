"""`sandbox up --registry`: a real registry (Debian's docker-registry, CNCF Distribution) on the
sandbox's head address, over TLS from the sandbox's own CA, optionally with htpasswd auth.

One small sandbox of 2 nodes for the module (name CLUSTERCTL_TEST_REGISTRY_SANDBOX, default
"reg", subnet CLUSTERCTL_TEST_REGISTRY_SUBNET, default 10.213.71.0/24).  Real parts only: this
machine's private engine pushes, a node's own engine pulls by digest, `docker login` runs with
a temporary DOCKER_CONFIG (never the machine's ~/.docker).  The tests run in file order and
share the sandbox: the registry comes up without auth, gets auth, is killed and brought back,
and the last test takes the sandbox down and checks that nothing of it is left, under
/etc/docker/certs.d included.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cluster import engine, sandbox
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.sandbox import registry
from tests.fixtures.sandbox import held_sandbox

REG_NAME = os.environ.get("CLUSTERCTL_TEST_REGISTRY_SANDBOX", "reg")
REG_SUBNET = os.environ.get("CLUSTERCTL_TEST_REGISTRY_SUBNET", "10.213.71.0/24")
AUTH_PORT = 5443  # the second `up` moves the registry here (and its CA entry with it)

runner = CliRunner()
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")


def _tree(path: Path) -> list[tuple[str, int]]:
    """Every path under ``path`` (itself included) with its mode and, for files, content."""
    found = []
    for p in [path, *path.rglob("*")] if path.exists() else []:
        with contextlib.suppress(FileNotFoundError):  # another sandbox's, removed meanwhile
            found.append((str(p), p.lstat().st_mode, p.read_bytes() if p.is_file() else b""))
    return sorted(found)


def _not_sandboxes(certs_d: Path) -> list[tuple[str, int]]:
    """What of ``certs_d`` no sandbox made: other helpers' sandboxes on this machine come and
    go while these tests run, so only the rest is compared before and after."""
    made = set()
    for record in certs_d.glob("*/clusterctl-sandbox-*.dirs") if certs_d.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            made |= set(record.read_text().splitlines())
    return [t for t in _tree(certs_d)
            if t[0] not in made and not Path(t[0]).name.startswith("clusterctl-sandbox-")]


def _docker(host: str, *args: str, config: Path,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    """The docker CLI against engine ``host`` with its own client config (logins land there,
    never in the machine's ~/.docker)."""
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    env["DOCKER_CONFIG"] = str(config)
    return subprocess.run(["docker", "-H", host, *args], capture_output=True, text=True,
                          env=env, input=stdin, timeout=120,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


@pytest.fixture(scope="module")
def etc_docker_before() -> list[tuple[str, int]]:
    """/etc/docker/certs.d as it was before this module's sandbox existed."""
    if os.geteuid() == 0:
        sandbox.down(REG_NAME)  # debris of a crashed session (certs.d entries too): not "before"
    return _not_sandboxes(registry.CERTS_D)


@pytest.fixture(scope="module")
def reg(etc_docker_before, docker_client) -> Iterator[sandbox.Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    if shutil.which("docker-registry") is None:
        pytest.fail("docker-registry is not installed; scripts/setup-host installs it "
                    "(apt-get install -y docker-registry apache2-utils)", pytrace=False)
    with held_sandbox(REG_NAME, REG_SUBNET, 2, with_registry=True) as sb:
        yield sb


@pytest.fixture(scope="module")
def tiny_image(docker_client, tmp_path_factory) -> Iterator[str]:
    """A one-file image FROM scratch in this machine's engine, unique to this run (so no
    node can have it already); removed after the module."""
    ctx = tmp_path_factory.mktemp("tiny")
    (ctx / "hello.txt").write_text(f"clusterctl registry test {uuid.uuid4().hex}\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /\n")
    tag = f"clusterctl-test/reg-{uuid.uuid4().hex[:10]}:1"
    docker_client.images.build(path=str(ctx), tag=tag, rm=True)
    image_id = docker_client.images.get(tag).id
    yield tag
    # --force by ID: every tag of it goes, the registry's included
    subprocess.run(["docker", "-H", engine.engine_url(), "rmi", "--force", image_id],
                   capture_output=True, stdin=subprocess.DEVNULL)


@pytest.fixture
def config(tmp_path) -> Path:
    """An empty docker client config of this test's own."""
    d = tmp_path / "docker-config"
    d.mkdir()
    return d


# --------------------------------------------------------------------------- bad input (no sandbox)


def test_bad_port_is_refused_before_anything_starts():
    r = runner.invoke(app, ["sandbox", "up", "--name", REG_NAME, "--nodes", "1", "--subnet",
                            REG_SUBNET, "--registry", "--registry-port", "70000"])
    assert r.exit_code == 2, r.output
    assert "--registry-port 70000" in r.output and "1 to 65535" in r.output


@needs_root
def test_missing_package_is_named(tmp_path):
    """With every sandbox tool on PATH but docker-registry: exit 2 naming the program and its
    Debian package, before anything is made (no state directory appears)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dockerd", "sshd", "ssh-keygen", "ip", "tc", "iptables", "nsenter", "htpasswd",
                 "openssl", "ss"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or shutil.which(tool, path="/usr/sbin"))
    before = (sandbox.state_base() / "zzreg").exists()
    p = subprocess.run([sys.executable, "-m", "clusterctl", "sandbox", "up", "--name", "zzreg",
                        "--nodes", "1", "--subnet", "10.213.70.0/24", "--registry",
                        "--inventory", str(tmp_path / "inv.yaml")],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PATH": str(bin_dir)}, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "docker-registry not found" in p.stderr and "apt-get install -y docker-registry" in p.stderr
    assert "Traceback" not in p.stderr
    assert not before and not (sandbox.state_base() / "zzreg").exists()
    assert not (tmp_path / "inv.yaml").exists()


# --------------------------------------------------------------------------- config (pure)


def test_config_listens_on_the_head_address_over_tls_and_asks_a_login_only_with_auth():
    sb = sandbox.Sandbox("gold", "10.213.7.0/24", 2, registry_port=5000)
    plain = yaml.safe_load(registry.render_config(sb, "s3cret"))
    assert plain["http"]["addr"] == "10.213.7.1:5000" == sb.registry
    assert plain["http"]["tls"] == {"certificate": str(sb.registry_dir / "server.crt"),
                                    "key": str(sb.registry_dir / "server.key")}
    assert plain["storage"]["filesystem"]["rootdirectory"] == str(sb.registry_storage)
    assert "auth" not in plain and sb.registry_password_file is None
    with_auth = sandbox.Sandbox("gold", "10.213.7.0/24", 2, registry_port=5443, registry_auth=True)
    auth = yaml.safe_load(registry.render_config(with_auth, "s3cret"))
    assert auth["auth"]["htpasswd"]["path"] == str(with_auth.registry_dir / "htpasswd")
    assert with_auth.registry_password_file == with_auth.registry_dir / "password"
    assert sandbox.Sandbox("gold", "10.213.7.0/24", 2).registry is None


# --------------------------------------------------------------------------- trust files (files only)


def test_trust_entries_remove_exactly_what_they_added(tmp_path):
    """install_trust/remove_trust on a certs.d of a temporary /etc: the files and directories
    each sandbox added go, a user's stay, and a directory two sandboxes needed goes with the
    last of them."""
    etc = tmp_path / "etc"
    certs_d = etc / "docker" / "certs.d"
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    etc.mkdir()
    pristine = _tree(etc)

    a = registry.install_trust("aa", "10.0.1.1:5000", ca, certs_d=certs_d)
    assert a == certs_d / "10.0.1.1:5000" / "clusterctl-sandbox-aa.crt" and a.read_text() == ca.read_text()
    registry.install_trust("bb", "10.0.2.1:5000", ca, certs_d=certs_d)
    assert registry.remove_trust("aa", certs_d=certs_d)
    assert not (certs_d / "10.0.1.1:5000").exists() and registry.trust_files("aa", certs_d) == []
    assert (certs_d / "10.0.2.1:5000" / "clusterctl-sandbox-bb.crt").is_file()   # bb's still there
    assert registry.remove_trust("bb", certs_d=certs_d)
    assert _tree(etc) == pristine              # /etc/docker and certs.d went with the last one
    assert not registry.remove_trust("bb", certs_d=certs_d)

    # a user's own files, even a CA for the same address, are never touched
    mine = certs_d / "10.0.1.1:5000"
    mine.mkdir(parents=True)
    (mine / "ca.crt").write_text("the user's CA\n")
    (certs_d / "registry.example:443").mkdir()
    before = _tree(etc)
    registry.install_trust("aa", "10.0.1.1:5000", ca, certs_d=certs_d)
    registry.install_trust("aa", "10.0.1.1:5001", ca, certs_d=certs_d)   # a new port: moved
    assert registry.trust_files("aa", certs_d) == [
        certs_d / "10.0.1.1:5001" / "clusterctl-sandbox-aa.crt",
        certs_d / "10.0.1.1:5001" / "clusterctl-sandbox-aa.dirs"]
    registry.remove_trust("aa", certs_d=certs_d)
    assert _tree(etc) == before


# --------------------------------------------------------------------------- the registry


@needs_root
def test_node_pulls_by_digest_over_tls_what_this_machine_pushed(reg, tiny_image, config):
    assert reg.registry == f"{reg.head_ip}:5000"
    assert reg.registry_up() and reg.registry_password_file is None
    inventory = Path(reg.inventory_path).read_text()
    assert f"\nregistry: {reg.registry}\n" in inventory
    assert load_inventory(reg.inventory_path).registry.address == reg.registry   # as launch reads it
    entry = registry.CERTS_D / reg.registry / registry.trust_name(reg.name)
    assert entry.read_bytes() == reg.registry_ca.read_bytes()

    here = engine.engine_url()
    ref = f"{reg.registry}/tiny:1"
    assert _docker(here, "tag", tiny_image, ref, config=config).returncode == 0
    push = _docker(here, "push", ref, config=config)
    assert push.returncode == 0, push.stderr
    pushed = re.search(r"digest: (sha256:[0-9a-f]{64})", push.stdout).group(1)
    local_id = _docker(here, "image", "inspect", "--format", "{{.Id}}", ref, config=config).stdout.strip()

    node = reg.node("node1").docker_host
    by_digest = f"{reg.registry}/tiny@{pushed}"
    # TLS is verified, not waived: without the CA entry the node's engine refuses the registry
    hidden = entry.with_name("hidden-during-test")
    entry.rename(hidden)
    try:
        refused = _docker(node, "pull", by_digest, config=config)
    finally:
        hidden.rename(entry)
    assert refused.returncode != 0 and "certificate signed by unknown authority" in refused.stderr

    pull = _docker(node, "pull", by_digest, config=config)
    assert pull.returncode == 0, pull.stderr
    assert f"Digest: {pushed}" in pull.stdout
    digests = _docker(node, "image", "inspect", "--format", "{{json .RepoDigests}}", by_digest, config=config)
    assert by_digest in digests.stdout
    assert _docker(node, "image", "inspect", "--format", "{{.Id}}", by_digest, config=config).stdout.strip() == local_id
    # the images live under the sandbox's own directory
    assert any(p.name == pushed.split(":")[1] for p in reg.registry_storage.rglob("*"))


@needs_root
def test_with_auth_anonymous_pull_is_refused_and_login_works(reg, config):
    r = runner.invoke(app, ["sandbox", "up", "--name", reg.name, "--nodes", "2", "--subnet",
                            reg.subnet, "--inventory", reg.inventory_path, "--registry-auth",
                            "--registry-port", str(AUTH_PORT)])
    assert r.exit_code == 0, r.output
    sb = sandbox.load(reg.name)
    assert sb.registry == f"{reg.head_ip}:{AUTH_PORT}" and sb.registry_up()
    pw_file = sb.registry_password_file
    assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
    password = pw_file.read_text().strip()
    assert len(password) >= 24
    login = f"docker login {sb.registry} -u clusterctl --password-stdin < {pw_file}"
    assert login in r.output.replace("\n", "")
    status = runner.invoke(app, ["sandbox", "status", "--name", reg.name])
    assert f"registry {sb.registry} running (TLS, login as clusterctl)" in status.output
    for text in (r.output, status.output, Path(reg.inventory_path).read_text(),
                 (sb.registry_dir / "config.yml").read_text()):
        assert password not in text
    # the CA entry moved with the port: the old one is gone, the new one in place
    assert not (registry.CERTS_D / f"{reg.head_ip}:5000").exists()
    assert (registry.CERTS_D / sb.registry / registry.trust_name(sb.name)).is_file()

    here = engine.engine_url()
    old_ref = f"{reg.head_ip}:5000/tiny:1"
    pushed = _docker(here, "image", "inspect", "--format", "{{index .RepoDigests 0}}",
                     old_ref, config=config).stdout.strip().split("@")[1]
    by_digest = f"{sb.registry}/tiny@{pushed}"   # kept across the restart (same storage)
    node = sb.node("node2").docker_host
    anonymous = _docker(node, "pull", by_digest, config=config)
    assert anonymous.returncode != 0
    assert "no basic auth credentials" in anonymous.stderr or "unauthorized" in anonymous.stderr

    wrong = _docker(node, "login", sb.registry, "-u", "clusterctl", "--password-stdin",
                    config=config, stdin="not-the-password\n")
    assert wrong.returncode != 0
    ok = _docker(node, "login", sb.registry, "-u", "clusterctl", "--password-stdin",
                 config=config, stdin=pw_file.read_text())
    assert ok.returncode == 0, ok.stderr
    pull = _docker(node, "pull", by_digest, config=config)
    assert pull.returncode == 0, pull.stderr
    assert f"Digest: {pushed}" in pull.stdout


@needs_root
def test_dead_registry_is_restarted_and_a_taken_port_is_named(reg):
    sb = sandbox.load(reg.name)
    pid = sb.registry_pid()
    assert pid is not None
    os.kill(pid, 9)
    with contextlib.suppress(ChildProcessError):  # started by this process (the CLI, in-process)
        os.waitpid(pid, 0)
    assert not sb.registry_up()
    assert "NOT running" in runner.invoke(app, ["sandbox", "status", "--name", reg.name]).output
    again = sandbox.up(2, name=reg.name, subnet=reg.subnet, inventory_path=reg.inventory_path)
    assert again.registry == sb.registry and again.registry_auth and again.registry_up()
    assert again.registry_pid() != pid

    with socket.socket() as taken:
        taken.bind((reg.head_ip, 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = runner.invoke(app, ["sandbox", "up", "--name", reg.name, "--nodes", "2", "--subnet",
                                reg.subnet, "--inventory", reg.inventory_path, "--registry",
                                "--registry-port", str(port)])
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.split())
    assert f"port {port} is taken" in flat and f"pid {os.getpid()}" in flat, flat
    assert "Traceback" not in r.output
    still = sandbox.load(reg.name)   # nothing changed: the same registry still serves
    assert still.registry == sb.registry and still.registry_up()


@needs_root
def test_down_removes_the_registry_its_files_and_its_ca_entries(reg, etc_docker_before):
    sb = sandbox.load(reg.name)
    pid = sb.registry_pid()
    assert pid is not None and registry.trust_files(reg.name)
    assert sandbox.down(reg.name)
    assert not Path(f"/proc/{pid}").exists() or \
        b"docker-registry" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert not sb.registry_dir.exists() and not sb.registry_storage.exists()
    assert registry.trust_files(reg.name) == []
    assert not [p for p, *_ in _tree(registry.CERTS_D) if f"/{reg.head_ip}:" in p]
    assert _not_sandboxes(registry.CERTS_D) == etc_docker_before
    assert not sb.registry_up()
