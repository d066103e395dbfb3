"""The docs' `sandbox` blocks, run as written against one real 2-node sandbox.

Every `<!-- doc-test: sandbox -->` block of every page (README.md, then docs/ in nav
order) runs in page order, each command line with its own `bash -c`, in a scratch copy
of the repository (so `inventories/sandbox.yaml`, `runs/` and `dockerfiles/` are written
there, not in the checkout), with the venv's bin/ first on PATH, CLUSTERCTL_PLAIN=1 and
DOCKER_HOST naming the local engine the tests use. Before the first block the test runs
`clusterctl sandbox up --nodes 2`, the command the convention names (idempotent, so a page
that runs it again is fine; a block that runs `sandbox down` gets it back before the next
block), and `sandbox down` after the last, also when a block fails or the session is
interrupted. The cpu image is the session's (tests/fixtures/images.py), also tagged as the
cpu target's default tag when the engine lacks that tag, as `clusterctl build --target
cpu` would leave it; a tag added here is removed afterwards. Before the pages' blocks it is
put on the sandbox's nodes by one load and hard links (seed_nodes), not pushed to each.

The tour's pages (README.md, docs/getting-started/tour.md) are run by a user who is not root
and has sudo, as their readers are (test_the_tour_as_a_user_with_sudo): created for the test
(CLUSTERCTL_TEST_TOUR_USER, default "cctour") with a checkout of their own in their home, the
lines written with `sudo` run through sudo, the rest as the user; after `sudo clusterctl engine
up` (what setup does for such a user: the engine's socket becomes theirs, given back after).
Then whatever the commands made in the user's home (inventory, runs, caches) and the sandbox's
key must be the user's, and `clusterctl runs` must show their runs.  Every other page's blocks
run as root.

The sandbox's name: the docs' commands name none, so it is the CLI's default
(clusterctl.cluster.sandbox.DEFAULT_NAME) unless `sandbox up --name` reads an
environment variable, which is then set to CLUSTERCTL_TEST_DOCS_SANDBOX (default "dtst",
subnet CLUSTERCTL_TEST_DOCS_SUBNET, default 10.213.98.0/24), so that the test cannot
collide with a sandbox of the user's. A sandbox of that name that exists before the test
is not touched: the test fails and says so. A second session waits for the first (the
same claim as tests/fixtures/sandbox.py).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterctl.cluster import engine, sandbox
from clusterctl.image.targets import get_target, resolve
from tests.docs import doccmds
from tests.docs.test_doc_commands import BLOCKS, FIXTURES, doc_env, fixture_page, scratch_copy
from tests.fixtures.sandbox import (
    SandboxCluster,
    _claim,
    _sigterm_unwinds,
    _teardown_once,
    cluster_fields,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

SANDBOX_BLOCKS = [b for b in BLOCKS if b.marker and b.marker.kind == "sandbox" and b.commands]
#: the tour's pages: a user with sudo who is not root runs their blocks, as their reader is
#: told (test_the_tour_as_a_user_with_sudo); root runs every other page's
TOUR_PAGES = ("README.md", "docs/getting-started/tour.md")
TOUR_BLOCKS = [b for b in SANDBOX_BLOCKS if b.file in TOUR_PAGES]
ROOT_BLOCKS = [b for b in SANDBOX_BLOCKS if b.file not in TOUR_PAGES]
#: the user the tour runs as (created by the test, removed after it)
TOUR_USER = os.environ.get("CLUSTERCTL_TEST_TOUR_USER", "cctour")
#: Debian's sudo PATH (/etc/sudoers' secure_path)
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: one command line of a sandbox block (a launch on a loaded machine takes minutes)
SANDBOX_TIMEOUT = 600
UP = doccmds.Command(0, "clusterctl sandbox up --nodes 2")


def sandbox_settings() -> tuple[str, dict[str, str]]:
    """The sandbox name the docs' `clusterctl sandbox up --nodes 2` will use, and the
    environment variables that make it the test's own when `sandbox up`'s --name and
    --subnet read any (typer's envvar=); the CLI's default name and {} when they read none."""
    up = doccmds.cli_root().commands["sandbox"].commands["up"]
    wanted = {"name": os.environ.get("CLUSTERCTL_TEST_DOCS_SANDBOX", "dtst"),
              "subnet": os.environ.get("CLUSTERCTL_TEST_DOCS_SUBNET", "10.213.98.0/24")}
    envvars = {p.name: p.envvar for p in up.params if p.name in wanted and isinstance(p.envvar, str)}
    if "name" not in envvars:
        return sandbox.DEFAULT_NAME, {}
    return wanted["name"], {envvar: wanted[param] for param, envvar in envvars.items()}


class DocsSandbox:
    """Where the sandbox blocks run, and what keeps the sandbox up between them; as root, or
    as ``user`` (who runs the lines written with `sudo` through sudo)."""

    def __init__(self, name: str, cwd: Path, env: dict[str, str], user: pwd.struct_passwd | None = None):
        self.name, self.cwd, self.env, self.user = name, cwd, env, user
        #: an image put on the nodes of a sandbox this brings up, before any block runs there
        #: (seed_nodes); None: the blocks' own launches push it
        self.seed: str | None = None
        self.as_user = () if user is None else (
            "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--")

    def ensure_up(self) -> str | None:
        if sandbox.status(self.name) and (self.cwd / sandbox.DEFAULT_INVENTORY).exists():
            return None
        up = UP if self.user is None else dataclasses.replace(UP, sudo=True)
        r = doccmds.run_command(up, self.cwd, self.env, SANDBOX_TIMEOUT, as_user=self.as_user)
        if r.status != 0:
            return f"`{UP.text}` exited {r.status}:\n{r.output[-3000:]}"
        if self.seed is not None:
            seed_nodes(self.name, self.seed)
        return None

    def run_blocks(self, blocks: list[doccmds.Block]) -> list[str]:
        """Run the blocks in order (each after making sure the sandbox is up); every failure."""
        failures = []
        for block in blocks:
            # the `file PATH` blocks of the block's page, as the reader has written them by now
            written = [b for b in BLOCKS if b.file == block.file and b.line < block.line]
            doccmds.write_files(written, self.cwd)
            if self.user is not None and doccmds.file_blocks(written):
                give_tree(self.cwd, self.user)
            why = self.ensure_up()
            if why is None:
                _, why = doccmds.run_block(block, self.cwd, self.env, timeout=SANDBOX_TIMEOUT,
                                           as_user=self.as_user)
            else:
                why = f"{block.id}: the sandbox could not be brought up before the block: {why}"
            if why:
                failures.append(why)
        return failures


def seed_nodes(name: str, image: str) -> None:
    """Put ``image`` on every node of the fresh sandbox ``name``: one ``docker load`` and hard
    links (SandboxCluster.load_image), where the first block's launch would push 1.2 GB to
    each node (about 50 CPU seconds a node on 2 cores).  What the pages promise does not
    change: a launch checks every node for the image and pushes only where it is missing, and
    pushing has tests and a page of its own (push.md's block still runs `clusterctl push`).
    Nodes that hold an image or a container already are left as they are."""
    seeded = SandboxCluster(**cluster_fields(sandbox.load(name))).seed_image(image)
    print(f"\n{image} {'put' if seeded else 'not put (they hold something)'} on {name}'s nodes")


def give_tree(root: Path, user: pwd.struct_passwd) -> None:
    """Everything under ``root`` (links themselves, not what they point to) to ``user``."""
    for d, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.chown(os.path.join(d, name), user.pw_uid, user.pw_gid, follow_symlinks=False)
    os.chown(root, user.pw_uid, user.pw_gid)


def not_owned_by(root: Path, uid: int) -> list[str]:
    """Every path under ``root`` (``root`` included) that ``uid`` does not own, with its owner."""
    found = []
    for d, _, files in os.walk(root):
        for path in [d, *(os.path.join(d, n) for n in files)]:   # each dir comes as a d
            st = os.lstat(path)
            if st.st_uid != uid:
                found.append(f"{path} (uid {st.st_uid})")
    return found


def _default_cpu_tag() -> str:
    target = get_target("cpu")
    return target.tag.format(torch=resolve("cpu", None).pins["torch"]) if "{" in target.tag else target.tag


@pytest.fixture(scope="module")
def docs_cpu_image(request) -> Iterator[str]:
    """The session's cpu image, also under the cpu target's default tag (what `clusterctl
    build --target cpu` leaves and the docs' jobs run) when the engine lacks that tag."""
    docker_client = request.getfixturevalue("docker_client")
    cpu_image = request.getfixturevalue("cpu_image")
    default_tag = _default_cpu_tag()
    added = not any(default_tag in (i.tags or [])
                    for i in docker_client.images.list(name=default_tag.split(":")[0]))
    if added:
        docker_client.images.get(cpu_image).tag(default_tag)
    try:
        yield default_tag
    finally:
        if added:
            docker_client.images.remove(default_tag, noprune=True)


@pytest.fixture(scope="module")
def docs_sandbox(tmp_path_factory) -> Iterator[DocsSandbox]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    url = engine.engine_url()
    if url is None:
        pytest.fail("no Docker engine answers: the docs' sandbox blocks use the local engine "
                    "(`sudo clusterctl engine up`)", pytrace=False)
    name, extra = sandbox_settings()
    claim = _claim(name)
    done: list[bool] = []
    try:
        if sandbox.status(name):
            pytest.fail(f'a sandbox named "{name}" exists already, and the docs\' commands (`clusterctl sandbox '
                        "up --nodes 2`, as written) would use it and remove it at the end: remove it with "
                        f"`clusterctl sandbox down --name {name}` if it is not needed, or run this test later",
                        pytrace=False)
        cwd = scratch_copy(tmp_path_factory.mktemp("docs-sandbox") / "repo")
        env = doc_env(DOCKER_HOST=url, **extra)
        atexit.register(_teardown_once, name, done)
        with _sigterm_unwinds():
            try:
                yield DocsSandbox(name, cwd, env)
            finally:
                _teardown_once(name, done)
    finally:
        claim.close()


def test_the_sandbox_blocks_of_a_fixture_page_run_and_a_wrong_one_fails(docs_sandbox):
    page = fixture_page("sandbox.md")
    assert page.problems == []
    blocks = [b for b in page.blocks if b.marker.kind == "sandbox"]
    assert docs_sandbox.run_blocks(blocks) == []
    wrong = doccmds.parse_page((FIXTURES / "sandbox.md").read_text().replace("sandbox exit=2", "sandbox"),
                               "sandbox.md").blocks[-1]
    assert wrong.marker.exit == 0
    (why,) = docs_sandbox.run_blocks([wrong])
    assert why.startswith("sandbox.md:23: `clusterctl check --nodes inventories/no-such.yaml` exited 2, expected exit 0")


def test_the_sandbox_blocks_of_every_page(docs_cpu_image, docs_sandbox):
    docs_sandbox.seed = docs_cpu_image      # also for a sandbox a `sandbox down` block makes come back
    why = docs_sandbox.ensure_up()          # up since the fixture page's blocks, or brought up now
    assert why is None, why
    seed_nodes(docs_sandbox.name, docs_cpu_image)
    failures = docs_sandbox.run_blocks(ROOT_BLOCKS)
    assert not failures, f"{len(failures)} of {len(ROOT_BLOCKS)} sandbox blocks failed:\n\n" + "\n\n".join(failures)


def user_venv_bin(user: pwd.struct_passwd) -> Path:
    """The bin/ of a venv ``user`` can run clusterctl from: the tests' venv's, unless its
    interpreter is where ``user`` cannot go (a pyenv under /root: CI's); then one in the
    user's home of the machine's python3 (the same minor version) with the tests' venv's
    packages on its path (a .pth) and their ``clusterctl`` command."""
    own = Path(sys.executable).parent
    made = Path(user.pw_dir) / ".venv-tour"
    probe = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
                            "--", "bash", "-c", f"{own / 'clusterctl'} --version"], capture_output=True, cwd="/")
    if probe.returncode == 0:
        return own
    python = Path("/usr/bin/python3")
    minor = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True).stdout.strip()
    assert minor == str(sys.version_info[:2]), (
        f"{sys.executable} is not {user.pw_name}'s to run and {python} is Python {minor}, not "
        f"{sys.version_info[:2]}: run the tests from a venv of a python every user can run")
    subprocess.run([python, "-m", "venv", "--without-pip", made], check=True)
    site = subprocess.run([made / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    purelib = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "tests-venv.pth").write_text(purelib + "\n")
    command = made / "bin" / "clusterctl"
    command.write_text(f"#!{made / 'bin' / 'python'}\nimport sys\nfrom clusterctl.cli import main\nsys.exit(main())\n")
    command.chmod(0o755)
    return made / "bin"


@pytest.fixture(scope="module")
def tour_user() -> Iterator[tuple[pwd.struct_passwd, Path]]:
    """A user who is not root, with sudo (NOPASSWD, as a login that typed its password), a
    home and a group of its own; removed with its home and sudo rule afterwards.  sudo's
    PATH is Debian's secure_path with the venv's bin/ first (setup's /usr/local/bin/clusterctl
    is a link to the venv's; here the venv is the one the tests run in)."""
    if shutil.which("sudo") is None:
        pytest.fail("sudo is not installed: the tour is run by a user with sudo (`make setup` "
                    "installs it)", pytrace=False)
    try:
        pwd.getpwnam(TOUR_USER)
        pytest.fail(f"a user named {TOUR_USER} exists already; this test creates and removes its own: "
                    "remove that user or set CLUSTERCTL_TEST_TOUR_USER", pytrace=False)
    except KeyError:
        pass
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", TOUR_USER],
                   check=True, capture_output=True)
    rule = Path(f"/etc/sudoers.d/clusterctl-test-{TOUR_USER}")
    try:
        user = pwd.getpwnam(TOUR_USER)
        venv_bin = user_venv_bin(user)
        # sudo as Debian sets it up, except that it keeps what the test's commands need: src/
        # when testing a source tree, the test's sandbox name
        rule.write_text(f'Defaults:{TOUR_USER} secure_path="{venv_bin}:{SECURE_PATH}"\n'
                        f'Defaults:{TOUR_USER} !use_pty, env_keep += "PYTHONPATH CLUSTERCTL_PLAIN '
                        'CLUSTERCTL_SANDBOX_NAME CLUSTERCTL_SANDBOX_SUBNET"\n'
                        f"{TOUR_USER} ALL=(root) NOPASSWD: ALL\n")
        rule.chmod(0o440)
        yield user, venv_bin
    finally:
        rule.unlink(missing_ok=True)
        subprocess.run(["userdel", "--remove", TOUR_USER], capture_output=True)


@pytest.fixture(scope="module")
def tour_sandbox(docs_sandbox, tour_user) -> Iterator[DocsSandbox]:
    """The docs' sandbox, for the tour user: their own checkout in their home, the environment
    a login of theirs has after `make demo` (no DOCKER_HOST when the engine is clusterctl's
    own: `sudo clusterctl engine up`, what setup does for them, gives them its socket)."""
    user, venv_bin = tour_user
    cwd = scratch_copy(Path(user.pw_dir) / "clusterctl")
    give_tree(Path(user.pw_dir), user)
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "SHELL": "/bin/bash",
           "LANG": "C.UTF-8", "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "CLUSTERCTL_PLAIN": "1",
           **{k: v for k, v in docs_sandbox.env.items()
              if k == "PYTHONPATH" or k.startswith("CLUSTERCTL_SANDBOX_") or k.lower().endswith("_proxy")}}
    tour = DocsSandbox(docs_sandbox.name, cwd, env, user)
    ours = engine.local_engine_paths()
    if engine.engine_url() != ours.url:
        env["DOCKER_HOST"] = engine.engine_url()
        yield tour
        return
    before = ours.socket.stat()
    r = doccmds.run_command(doccmds.Command(0, "clusterctl engine up", sudo=True), cwd, env, 60,
                            as_user=tour.as_user)
    assert r.status == 0, r.output
    try:
        assert ours.socket.stat().st_uid == user.pw_uid, "`sudo clusterctl engine up` left the socket root's"
        yield tour
    finally:
        os.chown(ours.socket, before.st_uid, before.st_gid)


def test_the_tour_as_a_user_with_sudo(docs_cpu_image, tour_sandbox):
    """README's and the tour page's commands, run by a user who is not root as written: the
    lines with `sudo` through sudo, the rest as the user; what they made is the user's."""
    # the README's tour is sandbox blocks: none found means the parser or the pages broke
    assert {b.file for b in TOUR_BLOCKS} == set(TOUR_PAGES), "a tour page has no sandbox block"
    failures = tour_sandbox.run_blocks(TOUR_BLOCKS)
    assert not failures, f"{len(failures)} of {len(TOUR_BLOCKS)} tour blocks failed:\n\n" + "\n\n".join(failures)
    uid, home = tour_sandbox.user.pw_uid, Path(tour_sandbox.user.pw_dir)
    # the runs, caches and inventory it made are the user's, and `clusterctl runs` shows the runs
    assert not_owned_by(home, uid) == []
    assert sorted(home.rglob("run.json")) and (home / ".cache" / "clusterctl").is_dir()
    assert sandbox.load(tour_sandbox.name).key_path.stat().st_uid == uid
    r = doccmds.run_command(doccmds.Command(0, "clusterctl runs"), tour_sandbox.cwd, tour_sandbox.env, 60,
                            as_user=tour_sandbox.as_user)
    assert r.status == 0 and "ddp-smoke" in r.output and TOUR_USER in r.output, r.output
