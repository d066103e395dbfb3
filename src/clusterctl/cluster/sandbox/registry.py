"""A real image registry on a sandbox: CNCF Distribution on this machine's bridge address, over TLS.

``up --registry`` runs Debian's ``docker-registry`` (CNCF Distribution, the code of
the ``registry:2`` image) as users run one: ``docker-registry serve CONFIG`` on
``<head_ip>:<port>`` (5000 by default), TLS with a server certificate for that IP
address signed by a CA of the sandbox's own (openssl), and with ``--registry-auth``
an htpasswd file (bcrypt, user :data:`USER`) whose password is kept in a 0600 file
of the sandbox.  Files (CA, keys, config, password, pidfile, log) live under
``<sandbox dir>/registry/``, the stored images under ``<sandbox data dir>/registry/``.

Trust: every Docker engine on this machine (the nodes' dockerds share its file
system: ``nsenter --net`` changes only the network) reads
``/etc/docker/certs.d/HOST:PORT/*.crt`` on each push and pull, so one file there,
``clusterctl-sandbox-<name>.crt`` (a name no user file has), makes the registry
trusted by every node's engine and by this machine's.  Directories it had to create
are listed beside it in ``clusterctl-sandbox-<name>.dirs``; :func:`stop` removes both
files and exactly those directories (when empty), found by the sandbox name alone, so
also after a crash or a lost /run.

Contract: :data:`DEFAULT_PORT`, :data:`USER`, :data:`CERTS_D`, :func:`require_registry`,
:func:`check_port`, :func:`check_port_free`, :func:`render_config` (pure), :func:`start` (idempotent),
:func:`stop`, :func:`running`, :func:`trust_files`, :func:`install_trust` and
:func:`remove_trust` (files only), :func:`login_command`.
Imports the model and processes of the sandbox package.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import os
import re
import secrets
import shlex
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from clusterctl.cluster.sandbox.model import Sandbox, registry_pidfile, state_base
from clusterctl.cluster.sandbox.processes import processes_using, run, terminate
from clusterctl.core.errors import EnvironmentProblem, UserError
from clusterctl.core.invoker import hand_over
from clusterctl.core.tools import require_binaries

DEFAULT_PORT = 5000
USER = "clusterctl"
CERTS_D = Path("/etc/docker/certs.d")  # where dockerd (root) looks for a registry's CA

# binary -> Debian package that provides it
_TOOLS = {
    "docker-registry": "docker-registry",
    "htpasswd": "apache2-utils",
    "openssl": "openssl",
    "ss": "iproute2",
}


def require_registry() -> None:
    """EnvironmentProblem (exit 2) naming every missing program and its Debian package."""
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        require_binaries(*missing, packages=" ".join(sorted({_TOOLS[t] for t in missing})))


def check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UserError(f"invalid --registry-port {port}: give a TCP port from 1 to 65535, e.g. "
                        f"{DEFAULT_PORT}.")


# --------------------------------------------------------------------------- paths


class _Paths:
    def __init__(self, sb: Sandbox) -> None:
        self.dir = sb.registry_dir
        self.ca_key = self.dir / "ca.key"
        self.ca_crt = self.dir / "ca.crt"
        self.key = self.dir / "server.key"
        self.crt = self.dir / "server.crt"
        self.config = self.dir / "config.yml"
        self.secret = self.dir / "http.secret"
        self.htpasswd = self.dir / "htpasswd"
        self.password = self.dir / "password"
        self.pidfile = sb.registry_pidfile
        self.log = self.dir / "registry.log"
        self.storage = sb.registry_storage


def trust_name(name: str) -> str:
    return f"clusterctl-sandbox-{name}.crt"


def _record_name(name: str) -> str:
    return f"clusterctl-sandbox-{name}.dirs"


def trust_files(name: str, certs_d: Path = CERTS_D) -> list[Path]:
    """Every file sandbox ``name`` put under ``certs_d`` (its CA copy and its record)."""
    if not certs_d.is_dir():
        return []
    found = []
    for d in sorted(certs_d.iterdir()):
        for f in (d / trust_name(name), d / _record_name(name)):
            if f.is_file():
                found.append(f)
    return found


def login_command(sb: Sandbox) -> str | None:
    """How to log in to the sandbox's registry (the password is read from its file, never shown)."""
    if not sb.registry_password_file:
        return None
    return (f"docker login {sb.registry} -u {USER} --password-stdin < "
            f"{shlex.quote(str(sb.registry_password_file))}")


# --------------------------------------------------------------------------- rendering (pure)


def render_config(sb: Sandbox, secret: str) -> str:
    """The registry's config.yml (pure: the sandbox and its HTTP secret -> text)."""
    p = _Paths(sb)
    config: dict = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True},
                "fields": {"service": "registry", "sandbox": sb.name}},
        "storage": {"filesystem": {"rootdirectory": str(p.storage)},
                    "delete": {"enabled": True},
                    "cache": {"blobdescriptor": "inmemory"}},
        "http": {"addr": sb.registry, "secret": secret,
                 "tls": {"certificate": str(p.crt), "key": str(p.key)},
                 "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }
    if sb.registry_auth:
        config["auth"] = {"htpasswd": {"realm": f"clusterctl sandbox {sb.name}",
                                       "path": str(p.htpasswd)}}
    return (f"# Registry of sandbox {sb.name}, written by `clusterctl sandbox up --registry`;\n"
            "# `clusterctl sandbox down` stops it and removes it with its images.\n"
            + yaml.safe_dump(config, sort_keys=False))


# --------------------------------------------------------------------------- port


def _listeners(port: int) -> list[tuple[str, list[int], str]]:
    """(local address, pids, who) of every TCP listener on ``port`` in this network namespace."""
    out = run(["ss", "-Hltnp", "sport", "=", f":{port}"], check=False)
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        users = re.findall(r'\("([^"]+)",pid=([0-9]+)', line)
        who = ", ".join(f"{cmd} (pid {pid})" for cmd, pid in users) or "a process ss cannot name"
        found.append((parts[3], [int(pid) for _, pid in users], who))
    return found


def _blocks(local: str, host: str) -> bool:
    addr = local.rsplit(":", 1)[0].split("%", 1)[0].strip("[]")
    return addr in ("0.0.0.0", "*", "::", host)


def check_port_free(sb: Sandbox) -> None:
    """UserError naming the port and what holds it, unless the sandbox's own registry does."""
    own = sb.registry_pid()
    for local, pids, who in _listeners(sb.registry_port):
        if own is not None and own in pids:
            continue  # the sandbox's registry itself
        if _blocks(local, sb.head_ip):
            raise UserError(
                f"the sandbox registry cannot listen on {sb.registry}: port {sb.registry_port} is "
                f"taken ({local} is held by {who}); stop that or pass another --registry-port.")


# --------------------------------------------------------------------------- files


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (a secret never readable by others)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _ensure_ca(sb: Sandbox, p: _Paths) -> None:
    if p.ca_key.exists() and p.ca_crt.exists():
        return
    run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(p.ca_key), "-out", str(p.ca_crt), "-days", "3650",
         "-subj", f"/O=clusterctl/CN=clusterctl sandbox {sb.name} CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    p.ca_key.chmod(0o600)
    for f in (p.key, p.crt):  # a server certificate of another CA is no use
        f.unlink(missing_ok=True)


def _cert_ip(crt: Path) -> str | None:
    out = run(["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"], check=False)
    m = re.search(r"IP Address:([0-9.]+)", out)
    return m.group(1) if m else None


def _ensure_server_cert(sb: Sandbox, p: _Paths) -> None:
    if p.key.exists() and p.crt.exists() and _cert_ip(p.crt) == sb.head_ip:
        return
    csr, ext = p.dir / "server.csr", p.dir / "server.ext"
    run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(p.key), "-out", str(csr),
         "-subj", f"/O=clusterctl/CN={sb.head_ip}"])
    p.key.chmod(0o600)
    ext.write_text(f"subjectAltName=IP:{sb.head_ip}\nbasicConstraints=critical,CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n")
    run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(p.ca_crt), "-CAkey", str(p.ca_key),
         "-set_serial", str(secrets.randbits(63)), "-days", "825", "-sha256",
         "-extfile", str(ext), "-out", str(p.crt)])
    csr.unlink(missing_ok=True)
    ext.unlink(missing_ok=True)


def _ensure_auth(sb: Sandbox, p: _Paths) -> None:
    """With auth: a random password (0600, kept across ups) and its bcrypt htpasswd entry.
    Without: neither file (a password that no longer guards anything is not kept)."""
    if not sb.registry_auth:
        p.password.unlink(missing_ok=True)
        p.htpasswd.unlink(missing_ok=True)
        return
    if not p.password.exists():
        _write_private(p.password, secrets.token_urlsafe(24) + "\n")
        p.htpasswd.unlink(missing_ok=True)
    p.password.chmod(0o600)
    hand_over(p.password)   # under sudo: the invoking user logs in without sudo
    if p.htpasswd.exists():
        return
    password = p.password.read_text().strip()
    # -i: the password from stdin, never on a command line other users can read
    r = subprocess.run(["htpasswd", "-B", "-i", "-c", str(p.htpasswd), USER], input=password,
                       capture_output=True, text=True)
    if r.returncode != 0:
        p.htpasswd.unlink(missing_ok=True)
        raise EnvironmentProblem(f"htpasswd exited {r.returncode} making {p.htpasswd}: "
                                 f"{r.stderr.strip()}")
    p.htpasswd.chmod(0o600)


def _secret(p: _Paths) -> str:
    with contextlib.suppress(OSError):
        s = p.secret.read_text().strip()
        if s:
            return s
    s = secrets.token_hex(32)
    _write_private(p.secret, s + "\n")
    return s


# --------------------------------------------------------------------------- trust (certs.d)


def _records(certs_d: Path) -> list[Path]:
    return sorted(certs_d.glob("*/clusterctl-sandbox-*.dirs")) if certs_d.is_dir() else []


def _recorded_dirs(record: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return [Path(line) for line in record.read_text().splitlines() if line.startswith("/")]
    return []


@contextlib.contextmanager
def _trust_locked(certs_d: Path) -> Iterator[None]:
    """Serialise changes to ``certs_d`` across sandboxes (each up/down holds only its own
    lock): one removing a shared directory while another fills it would lose a file.  The
    lock is on the directory above ``/etc/docker`` (``/etc``), which always exists, so that
    no lock file is left behind."""
    fd = os.open(certs_d.parent.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install_trust(name: str, address: str, ca_crt: Path, certs_d: Path = CERTS_D) -> Path:
    """Sandbox ``name``'s CA in ``certs_d/ADDRESS/`` (its entry for another address removed),
    recording each directory made for it; the file written.  A directory that another
    sandbox's record lists was made by clusterctl too, and is recorded again, so that the
    last sandbox taken down removes it."""
    with _trust_locked(certs_d):
        return _install_trust(name, address, ca_crt, certs_d)


def _install_trust(name: str, address: str, ca_crt: Path, certs_d: Path) -> Path:
    _remove_trust(name, address, certs_d)
    target = certs_d / address
    inherited = {d for r in _records(certs_d) if r.parent != target for d in _recorded_dirs(r)}
    record = target / _record_name(name)
    made = _recorded_dirs(record)
    for d in (certs_d.parent, certs_d, target):
        if (not d.exists() or d in inherited) and d not in made:
            made.append(d)
        d.mkdir(mode=0o755, exist_ok=True)
    record.write_text("".join(f"{d}\n" for d in made))
    crt = target / trust_name(name)
    tmp = target / f".{crt.name}.tmp"
    shutil.copyfile(ca_crt, tmp)
    tmp.chmod(0o644)
    tmp.replace(crt)
    return crt


def remove_trust(name: str, keep: str | None = None, certs_d: Path = CERTS_D) -> bool:
    """Remove what sandbox ``name`` put under ``certs_d`` (except its entry for address
    ``keep``): its two files, then the directories its record lists, deepest first, when
    empty and listed by no other sandbox's record; True when there was something."""
    with _trust_locked(certs_d):
        return _remove_trust(name, keep, certs_d)


def _remove_trust(name: str, keep: str | None, certs_d: Path) -> bool:
    found = False
    if not certs_d.is_dir():
        return False
    for d in sorted(certs_d.iterdir()):
        if d.name == keep:
            continue
        crt, record = d / trust_name(name), d / _record_name(name)
        if not (crt.is_file() or record.is_file()):
            continue
        found = True
        dirs = _recorded_dirs(record)
        crt.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        others = {x for r in _records(certs_d) for x in _recorded_dirs(r)}  # listed by another
        for made in sorted(dirs, key=lambda x: len(x.parts), reverse=True):
            if made in others or not (made == certs_d.parent or certs_d.parent in made.parents):
                continue  # another sandbox's still, or not ours to judge (outside /etc/docker)
            with contextlib.suppress(OSError):  # not empty: something else lives there now
                made.rmdir()
    return found


# --------------------------------------------------------------------------- process


def running(sb: Sandbox) -> bool:
    """True when the sandbox's registry process runs and accepts connections."""
    return sb.registry_up()


def _tail(path: Path, n: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _answers(sb: Sandbox, p: _Paths) -> str | None:
    """None when GET /v2/ over TLS (verified with the sandbox's CA) answers 200 or 401,
    else why not."""
    try:
        ctx = ssl.create_default_context(cafile=str(p.ca_crt))
        conn = http.client.HTTPSConnection(sb.head_ip, sb.registry_port, context=ctx, timeout=3)
        try:
            conn.request("GET", "/v2/")
            status = conn.getresponse().status
        finally:
            conn.close()
    except (OSError, ssl.SSLError, http.client.HTTPException) as e:
        return str(e) or type(e).__name__
    return None if status in (200, 401) else f"GET /v2/ answered {status}"


def _spawn(p: _Paths) -> subprocess.Popen:
    # REGISTRY_* variables override the config file: none of the caller's may leak in
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    with open(p.log, "ab") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(p.config)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True, env=env)
    p.pidfile.write_text(f"{proc.pid}\n")
    return proc


def start(sb: Sandbox, timeout: float = 30.0) -> None:
    """The registry of ``sb`` (``sb.registry_port`` set): CA, server certificate, auth files,
    config, trust entry, process; then wait until it answers over TLS.

    Idempotent: a running registry whose config is unchanged is kept; a changed one
    (port, auth) is restarted; a dead one started again.  Stored images are kept."""
    if not sb.registry_port:
        return
    require_registry()
    p = _Paths(sb)
    p.dir.mkdir(parents=True, exist_ok=True)
    p.dir.chmod(0o700)
    p.storage.mkdir(parents=True, exist_ok=True)
    _ensure_ca(sb, p)
    _ensure_server_cert(sb, p)
    _ensure_auth(sb, p)
    config = render_config(sb, _secret(p))
    changed = not p.config.exists() or p.config.read_text() != config
    if changed:
        _write_private(p.config, config)
    install_trust(sb.name, sb.registry, p.ca_crt)
    if running(sb) and not changed:
        return
    _kill(sb.name)
    check_port_free(sb)
    proc = _spawn(p)
    deadline = time.monotonic() + timeout
    why = "it did not answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            why = f"it exited with status {proc.returncode}"
            break
        if (why := _answers(sb, p)) is None:
            return
        time.sleep(0.1)
    else:
        why = f"it did not answer over TLS within {timeout:.0f}s ({why})"
    _kill(sb.name)
    raise EnvironmentProblem(f"the sandbox registry on {sb.registry} did not start: {why}; "
                             f"last lines of {p.log}:\n{_tail(p.log)}")


def _kill(name: str) -> bool:
    """Stop the registry process of sandbox ``name``; True when one ran.  Found by its command
    line, which names the sandbox's registry directory (never by a pidfile alone: a stale
    one may name a reused pid), so also after a crash or a lost pidfile."""
    pids = processes_using(state_base() / name / "registry")
    terminate(pids, grace=5.0)
    registry_pidfile(name).unlink(missing_ok=True)
    return bool(pids)


def stop(name: str) -> bool:
    """Stop the registry of sandbox ``name`` and remove its trust entries under CERTS_D;
    True when something was there.  (Its files go with the sandbox's directories.)"""
    found = _kill(name)
    return remove_trust(name) or found

