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
cpu` would leave it; a tag added here is removed afterwards.

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
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterctl.cluster import engine, sandbox
from clusterctl.image.targets import get_target, resolve
from tests.docs import doccmds
from tests.docs.test_doc_commands import BLOCKS, FIXTURES, doc_env, fixture_page, scratch_copy
from tests.fixtures.sandbox import _claim, _sigterm_unwinds, _teardown_once

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

SANDBOX_BLOCKS = [b for b in BLOCKS if b.marker and b.marker.kind == "sandbox" and b.commands]
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
    """Where the sandbox blocks run, and what keeps the sandbox up between them."""

    def __init__(self, name: str, cwd: Path, env: dict[str, str]):
        self.name, self.cwd, self.env = name, cwd, env

    def ensure_up(self) -> str | None:
        if sandbox.status(self.name) and (self.cwd / sandbox.DEFAULT_INVENTORY).exists():
            return None
        r = doccmds.run_command(UP, self.cwd, self.env, SANDBOX_TIMEOUT)
        return None if r.status == 0 else f"`{UP.text}` exited {r.status}:\n{r.output[-3000:]}"

    def run_blocks(self, blocks: list[doccmds.Block]) -> list[str]:
        """Run the blocks in order (each after making sure the sandbox is up); every failure."""
        failures = []
        for block in blocks:
            # the `file PATH` blocks of the block's page, as the reader has written them by now
            doccmds.write_files([b for b in BLOCKS if b.file == block.file and b.line < block.line], self.cwd)
            why = self.ensure_up()
            if why is None:
                _, why = doccmds.run_block(block, self.cwd, self.env, timeout=SANDBOX_TIMEOUT)
            else:
                why = f"{block.id}: the sandbox could not be brought up before the block: {why}"
            if why:
                failures.append(why)
        return failures


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
    # the README's tour is sandbox blocks: none found means the parser or the pages broke
    assert any(b.file == "README.md" for b in SANDBOX_BLOCKS), "no sandbox block found in README.md"
    failures = docs_sandbox.run_blocks(SANDBOX_BLOCKS)
    assert not failures, f"{len(failures)} of {len(SANDBOX_BLOCKS)} sandbox blocks failed:\n\n" + "\n\n".join(failures)
