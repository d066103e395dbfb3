"""Image references are untrusted input: one guard, every entry point refuses the same way.

The guard is :func:`clusterctl.core.imageref.check_image`; a reference enters at ``launch
--image`` (dry run or not) and a job's ``image:``, ``export --image`` (also with
``--pull-secret`` and ``--registry``), ``build``/``render`` ``--tag`` and ``--base-image``,
and ``push IMAGE`` (over SSH and to a registry).  Each hostile reference below is refused
by each of them through the real CLI: exit 2, no traceback, the credential never printed,
no raw control character printed, and before any engine, registry or node is contacted
(the inventory's node and the registry are loopback ports nothing listens on).

The build options next to a reference (``--build-arg``, ``--target``, ``--torch``) and the
copy-paste ``kubectl create secret docker-registry`` line are checked here too.
"""

from __future__ import annotations

import re
import shlex
import socket

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.core.imageref import check_image
from tests.fixtures import hostile

SECRET = "s3cr3tPW"
_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")    # what a terminal would act on

HOSTILE = {
    "credential": f"u:{SECRET}@reg.example/x:1",
    "credential-port": f"alice:{SECRET}@reg.example:5000/team/x:1",
    "user-only": f"{SECRET}@reg.example/x:1",
    "url-credential": f"https://u:{SECRET}@reg.example/x:1",
    "esc": "x\x1by",
    "esc-sequence": "reg.example/a\x1b[2Jb:1",
    "c1": "reg.example/a\u009bb:1",
    "cr": "x\r:1",
    "newline": "x:y\nRUN rm -rf /",
    "nul": "x\x00y",
    "uppercase-repo": "Foo/BAR:1",
    "uppercase-repo-registry": "Reg.example/UPPER:1",
    "uppercase-first-part": "Foo/x:1",        # no '.', ':' nor localhost: a path part, not a host
    "bad-digest": "x@sha256:zz",
    "upper-digest": "x@sha256:" + "A" * 64,
    "short-digest": "reg.example/a@sha256:" + "a" * 63,
    "traversal": "../containers/nosuch",
    "traversal-deep": "../../x",
    "long-name": "a" * 300,
    "huge-name": "a" * 100_000,
    "long-tag": "x:" + "t" * 129,
    "semicolon": "x;id",
    "command-substitution": "$(id).x/y",
    "command-substitution-registry": "$(reboot).x/y:1",
    "leading-dash": "-x",
    "leading-dash-option": "--privileged",
    "whitespace": "me/x y",
    "empty": "",
}
GOOD = ["clusterctl/cpu:2.13.0", "nvcr.io/nvidia/pytorch:24.05-py3",
        "localhost:5000/x@sha256:" + "0123456789abcdef" * 4, "Registry.Example:5000/a/b:1",
        "busybox", "reg.example:5000/x:1@sha256:" + "b" * 64, "a__b/c-d.e:_1", "localhost/x",
        "10.0.0.5:5000/team/x:1", "sha256:" + "c" * 64,
        "x" * 255 + ":" + "t" * 128]


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(res, *needles: str) -> str:
    """The output of a run that must exit 2 without a traceback, holding every needle and no
    credential nor raw control character."""
    return hostile.refused(res, *needles, hidden=(SECRET,))

def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def inv(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")   # never the host's
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "host": "127.0.0.1",
                                               "port": _closed_port()}]}))
    return path


# every place a reference enters: (name, argv for a reference and an inventory)
ENTRY_POINTS = {
    "launch --dry-run": lambda ref, inv: ["launch", "ddp-smoke", "--nodes", str(inv), "--dry-run",
                                          "--image", ref],
    "launch --dry-run --json": lambda ref, inv: ["launch", "ddp-smoke", "--nodes", str(inv),
                                                 "--dry-run", "--json", "--image", ref],
    "launch": lambda ref, inv: ["launch", "ddp-smoke", "--nodes", str(inv), "--image", ref],
    "export": lambda ref, inv: ["export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2",
                                "--image", ref],
    "export --pull-secret": lambda ref, inv: ["export", "ddp-smoke", "--to", "trainjob", "--nnodes",
                                              "2", "--image", ref, "--pull-secret", "ps"],
    "export --registry": lambda ref, inv: ["export", "ddp-smoke", "--to", "pytorchjob", "--nnodes",
                                           "2", "--image", ref, "--registry", "127.0.0.1:1"],
    "build --tag": lambda ref, inv: ["build", "--target", "cpu", "--dry-run", "--tag", ref],
    "build --base-image": lambda ref, inv: ["build", "--target", "cpu", "--dry-run",
                                            "--base-image", ref],
    "render --base-image": lambda ref, inv: ["render", "--target", "nccl", "--base-image", ref,
                                             "-o", str(inv.parent / "ctx")],
    "push --nodes": lambda ref, inv: ["push", "--nodes", str(inv), ref],
    "push --registry": lambda ref, inv: ["push", "--registry", "127.0.0.1:1", ref],
    "push --nodes --registry": lambda ref, inv: ["push", "--nodes", str(inv),
                                                 "--registry", "127.0.0.1:1", ref],
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("case", HOSTILE)
def test_every_entry_point_refuses_a_hostile_reference(inv, entry, case):
    ref = HOSTILE[case]
    argv = ENTRY_POINTS[entry](ref, inv)
    if ref.startswith("-") and entry.startswith("push"):
        argv.insert(-1, "--")                   # push's IMAGE (last) starting with '-'
    out = refused(cli(*argv), "not a valid image reference", "valid:")
    assert len(out) < 2000, len(out)            # a 100 KB name is never echoed whole
    assert not (inv.parent / "ctx").exists()    # render wrote nothing


@pytest.mark.parametrize("case", ["credential", "esc-sequence", "uppercase-repo", "traversal",
                                  "semicolon", "empty"])
def test_a_job_files_image_is_refused_naming_its_line(tmp_path, inv, case):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"image": HOSTILE[case], "command": ["true"]}))
    for argv in (["launch", str(job), "--nodes", str(inv), "--dry-run"],
                 ["export", str(job), "--to", "pytorchjob", "--nnodes", "2"],
                 ["export", str(job), "--to", "pytorchjob", "--nnodes", "2", "--registry", "127.0.0.1:1"]):
        refused(cli(*argv), "image")


@pytest.mark.parametrize("case", HOSTILE)
def test_the_library_entries_refuse_before_the_engine_is_asked(case):
    """source_image and pinned_reference check first: no client is needed to refuse (none is
    given), so nothing reaches the engine's API path (``../containers/...``)."""
    from clusterctl.cluster.distribute import source_image
    from clusterctl.cluster.registry import lookup
    from clusterctl.cluster.registry.reference import Registry
    from clusterctl.image import render
    ref = HOSTILE[case]
    for call in (lambda: source_image(None, ref),
                 lambda: lookup.pinned_reference(ref, Registry("127.0.0.1", 1), client=None),
                 lambda: render.check_reference(ref, "--tag")):
        with pytest.raises(UserError) as e:
            call()
        assert SECRET not in str(e.value) and not _RAW_CONTROL.search(str(e.value))
        assert len(str(e.value)) < 1000


@pytest.mark.parametrize("case,why", [
    ("credential", "credential"), ("user-only", "credential"), ("esc", "control character (\\x1b)"),
    ("c1", "control character (\\x9b)"), ("newline", "line break (\\n)"),
    ("uppercase-repo", "lower-case"), ("bad-digest", "64 lower-case hex"), ("long-name", "255"),
    ("long-tag", "128"), ("leading-dash", "'-'"), ("whitespace", "whitespace"), ("empty", "empty"),
])
def test_the_guard_says_why(case, why):
    with pytest.raises(UserError) as e:
        check_image(HOSTILE[case], "--image")
    text = str(e.value)
    assert text.startswith("--image ") and why in text and "e.g. clusterctl/cpu:2.13.0" in text, text


@pytest.mark.parametrize("ref", GOOD)
def test_good_references_are_accepted(ref):
    assert check_image(ref, "--image") == ref


@pytest.mark.parametrize("ref", GOOD[:4])
def test_good_references_pass_the_entry_points(inv, ref):
    for argv in (["launch", "ddp-smoke", "--nodes", str(inv), "--dry-run", "--image", ref],
                 ["export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--image", ref],
                 ["build", "--target", "cpu", "--dry-run", "--tag", ref]):
        res = cli(*argv)
        assert res.exit_code == 0, (argv, res.output)


# --------------------------------------------------------------------------- the kubectl line

def test_the_pull_secret_line_is_one_shell_command():
    res = cli("export", "ddp-smoke", "--to", "pytorchjob", "--nnodes", "2", "--image",
              "Registry.Example:5000/a/b:1", "--pull-secret", "ps", "-n", "team-a")
    assert res.exit_code == 0, res.output
    line = next(x.strip() for x in res.output.splitlines()
                if x.strip().startswith("kubectl create secret docker-registry"))
    assert shlex.split(line) == ["kubectl", "create", "secret", "docker-registry", "ps", "-n", "team-a",
                                 "--docker-server=Registry.Example:5000", "--docker-username=...",
                                 "--docker-password=..."]


# --------------------------------------------------------------------------- build options

def test_a_proxy_password_in_a_build_arg_is_masked_in_the_dry_run():
    res = cli("build", "--target", "cpu", "--dry-run", "--build-arg",
              f"HTTPS_PROXY=http://u:{SECRET}@proxy:3128")
    assert res.exit_code == 0, res.output
    assert SECRET not in res.output and "****@proxy:3128" in res.output


@pytest.mark.parametrize("value", ["a\nb", "a\x1b[2Jb", "a\rb", "a\u009bb", "a\x00b",
                                   f"http://u:{SECRET}@p:1\x1b[2J"])
def test_a_control_character_in_a_build_arg_value_is_refused(value):
    refused(cli("build", "--target", "cpu", "--dry-run", "--build-arg", f"HTTPS_PROXY={value}"),
            "--build-arg 'HTTPS_PROXY'")


@pytest.mark.parametrize("argv", [
    ["--target", "x\x1b[2J"], ["--target", "x\u009b"], ["--target", "t" * 100_000],
    ["--target", "cpu", "--torch", "x\x1b[2J"], ["--target", "cpu", "--torch", "9" * 100_000],
    ["--target", "nccl", "--torch", "x\x1b[2J"],
    ["--target", "cpu", "--build-arg", "A" * 100_000 + "=x"],
    ["--target", "cpu", "--build-arg", "B" * 100_000],
    ["--target", "cpu", "--build-arg", f"u:{SECRET}@x"],
])
def test_build_options_are_quoted_escaped_and_cut(argv):
    out = refused(cli("build", "--dry-run", *argv))
    assert len(out) < 3000, len(out)
