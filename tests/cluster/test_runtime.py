"""The container runtime seam (clusterctl.cluster.runtime): the Docker runtime's argv, operation
by operation, against what the code sent to the nodes before the seam existed; and that a
runtime registered by name is the one the argv builders use.

The expected argv below were captured from the code before the seam (commit ffddaf0) by
calling its builders and its node functions (``containers.inspect_containers``,
``find_containers``, ``wait_container``, ``follow_logs``, ``fetch_logs``, ``stop_containers``,
``remove_run_containers``, ``preflight.docker_server_version``, ``docker_root_dir``,
``node_image_id``, ``image_versions``, ``distribute.node.node_has_image``, ``node_chain_ids``,
``confirm_on_node``, ``_data_root``, ``_stream_to_node``, ``faults.kill_container``,
``plan.docker_run_argv``); ``pull`` is the command of ``registry.pull.PULL_SCRIPT``.
"""

from __future__ import annotations

import pytest

from clusterctl.cluster import containers, preflight, runtime
from clusterctl.cluster.runtime import ContainerRuntime, DockerRuntime, runtime_for
from clusterctl.core.errors import UserError

RUN = "io.clusterctl.run"
NODE = "io.clusterctl.node"
IMAGE_ID = "sha256:" + "a" * 64
INFO = "{{println .DockerRootDir}}{{.InitBinary}}"
LABELS = {RUN: "r", "io.clusterctl.rank": "0"}
OPTIONS = ["--add-host", "n1:10.0.0.1", "--init", "-v", "/a:/b"]
HEAD = ["docker", "run", "-d", "--net=host", "--name", "r-n1", "--label", "io.clusterctl.run=r",
        "--label", "io.clusterctl.rank=0", "--add-host", "n1:10.0.0.1", "--init", "-v", "/a:/b",
        "-e", "A=1"]
TAIL = ["img:1", "python3", "-c", "print(1)"]

# (operation, positional args, keyword args) -> the argv docker got before the seam
DOCKER_ARGV = [
    ("inspect", (["a", "b"],), {}, ["docker", "inspect", "--type", "container", "a", "b"]),
    ("ps", (), {"labels": {RUN: "r1"}},
     ["docker", "ps", "-a", "-q", "--no-trunc", "--filter", "label=io.clusterctl.run=r1"]),
    ("ps", (), {"labels": {RUN: "r1"}, "no_trunc": False},
     ["docker", "ps", "-a", "-q", "--filter", "label=io.clusterctl.run=r1"]),
    ("ps", (), {"labels": {RUN: "r1", NODE: "n1"}, "status": "running", "all": False},
     ["docker", "ps", "-q", "--no-trunc", "--filter", "label=io.clusterctl.run=r1", "--filter",
      "label=io.clusterctl.node=n1", "--filter", "status=running"]),
    ("wait", ("c1",), {}, ["docker", "wait", "c1"]),
    ("logs", ("c1",), {"follow": True, "tail": 5}, ["docker", "logs", "--follow", "--tail", "5", "c1"]),
    ("logs", ("c1",), {"follow": True, "timestamps": True, "since": "2026-01-01T00:00:00.000000000Z"},
     ["docker", "logs", "--follow", "--since", "2026-01-01T00:00:00.000000000Z", "--timestamps", "c1"]),
    ("logs", ("c1",), {"follow": True, "timestamps": True}, ["docker", "logs", "--follow", "--timestamps", "c1"]),
    ("logs", ("c1",), {"tail": 3, "timestamps": True}, ["docker", "logs", "--tail", "3", "--timestamps", "c1"]),
    ("logs", ("c1",), {"timestamps": True}, ["docker", "logs", "--timestamps", "c1"]),
    ("stats", (["c1", "c2"],), {},  # new with clusterctl top: no argv before the seam
     ["docker", "stats", "--no-stream", "--no-trunc", "--format", "{{json .}}", "c1", "c2"]),
    ("exec", ("c1", ["python3", "-c", "x"]), {}, ["docker", "exec", "c1", "python3", "-c", "x"]),
    ("exec_interactive", ("c1", ["sh"]), {}, ["docker", "exec", "--interactive", "--tty", "c1", "sh"]),
    ("exec_interactive", ("c1", ["bash"]), {"env": [("TERM", "xterm-256color"), ("A", "b c")]},
     ["docker", "exec", "--interactive", "--tty", "--env", "TERM=xterm-256color", "--env", "A=b c",
      "c1", "bash"]),
    ("stop", (["c1"],), {"grace": 7}, ["docker", "stop", "--time", "7", "c1"]),
    ("stop", (["c1"],), {"grace": 9}, ["docker", "stop", "--time", "9", "c1"]),
    ("rm", (["c1"],), {}, ["docker", "rm", "--force", "c1"]),
    ("rm", (["i1", "i2"],), {}, ["docker", "rm", "--force", "i1", "i2"]),
    ("kill", ("c1",), {"signal": "KILL"}, ["docker", "kill", "--signal", "KILL", "c1"]),
    ("load", (), {}, ["docker", "load"]),
    ("image_inspect", (["img:1"],), {"format": "{{.Id}}"},
     ["docker", "image", "inspect", "--format", "{{.Id}}", "img:1"]),
    ("image_inspect", ([IMAGE_ID],), {"format": "{{.Id}}"},
     ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE_ID]),
    ("image_inspect", ([""],), {"format": "{{.Id}}"}, ["docker", "image", "inspect", "--format", "{{.Id}}", ""]),
    ("image_inspect", (["x", "y"],), {"format": "{{json .RootFS.Layers}}"},
     ["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", "x", "y"]),
    ("image_ids", (), {}, ["docker", "image", "ls", "-a", "-q", "--no-trunc"]),
    ("images", (), {"label": "io.clusterctl.target"},
     ["docker", "image", "ls", "-q", "--no-trunc", "--filter", "label=io.clusterctl.target"]),
    ("remove_images", ([IMAGE_ID],), {}, ["docker", "image", "rm", "--force", IMAGE_ID]),
    ("tag", (IMAGE_ID, "img:1"), {}, ["docker", "tag", IMAGE_ID, "img:1"]),
    ("pull", ("reg:5000/x@sha256:1",), {}, ["docker", "pull", "--quiet", "reg:5000/x@sha256:1"]),
    ("version", (), {}, ["docker", "version", "--format", "{{.Server.Version}}"]),
    ("info", (INFO,), {}, ["docker", "info", "--format", INFO]),
    ("info", ("{{.DockerRootDir}}",), {}, ["docker", "info", "--format", "{{.DockerRootDir}}"]),
    ("run", ("img:1", ["python3", "-c", "S"]), {"remove": True, "network": "none"},
     ["docker", "run", "--rm", "--net=none", "img:1", "python3", "-c", "S"]),
    # the launch plan's four shapes: every value by -e; secrets by --env-file; by name; attached
    ("run", TAIL[:1], {"command": TAIL[1:], "name": "r-n1", "detach": True, "network": "host",
                       "labels": LABELS, "options": OPTIONS, "env": [("A", "1"), ("S", "secret"), ("B", "x y")]},
     [*HEAD, "-e", "S=secret", "-e", "B=x y", *TAIL]),
    ("run", TAIL[:1], {"command": TAIL[1:], "name": "r-n1", "detach": True, "network": "host",
                       "labels": LABELS, "options": OPTIONS, "env": [("A", "1"), ("B", "x y")],
                       "env_file": "/dev/stdin"},
     [*HEAD, "-e", "B=x y", "--env-file", "/dev/stdin", *TAIL]),
    ("run", TAIL[:1], {"command": TAIL[1:], "name": "r-n1", "detach": True, "network": "host",
                       "labels": LABELS, "options": OPTIONS, "env": [("A", "1"), ("B", "x y")],
                       "env_names": ["S"]},
     [*HEAD, "-e", "B=x y", "-e", "S", *TAIL]),
    ("run", TAIL[:1], {"command": TAIL[1:], "name": "r-n1", "network": "host", "labels": LABELS,
                       "options": OPTIONS, "env": [("A", "1"), ("B", "x y")], "env_file": "/dev/stdin"},
     [HEAD[0], HEAD[1], *HEAD[3:], "-e", "B=x y", "--env-file", "/dev/stdin", *TAIL]),
]


@pytest.mark.parametrize("operation,args,kwargs,expected", DOCKER_ARGV,
                         ids=[f"{i}-{row[0]}" for i, row in enumerate(DOCKER_ARGV)])
def test_docker_runtime_sends_the_argv_sent_before_the_seam(operation, args, kwargs, expected):
    got = getattr(runtime_for("docker"), operation)(*args, **kwargs)
    assert got == expected
    assert all(isinstance(a, str) for a in got)


def test_the_table_covers_every_operation_of_the_seam():
    assert set(ContainerRuntime.__abstractmethods__) == {row[0] for row in DOCKER_ARGV}


def test_docker_is_the_default_and_a_node_without_a_runtime_gets_it():
    assert runtime.DEFAULT_RUNTIME == "docker" and set(runtime.RUNTIMES) == {"docker", "podman"}
    assert type(runtime_for()) is DockerRuntime and runtime_for().binary == "docker"
    assert type(runtime.node_runtime(object())) is DockerRuntime


def test_an_unknown_runtime_is_a_user_error_naming_the_known_ones():
    with pytest.raises(UserError, match=r"container runtime 'dockr' is not known \(did you mean "
                                        r"\"docker\"\?\); valid: docker or podman"):
        runtime_for("dockr")


# --------------------------------------------------------------------------- a second runtime


class EchoRuntime(DockerRuntime):
    """A fictitious second runtime: its own binary, and its own word for ``run``."""

    name = "fictitious"
    binary = "echo-runtime"

    def run(self, image, command, **kwargs):
        argv = super().run(image, command, **kwargs)
        return [self.binary, "create-and-start", *argv[2:]]


@pytest.fixture
def fictitious(monkeypatch):
    """EchoRuntime registered beside docker (one entry in RUNTIMES), the test's only change."""
    monkeypatch.setitem(runtime.RUNTIMES, EchoRuntime.name, EchoRuntime)
    return runtime_for("fictitious")


def test_a_registered_runtime_is_found_by_name(fictitious):
    assert type(fictitious) is EchoRuntime
    assert type(runtime_for("docker")) is DockerRuntime    # the others stay as they were


def test_the_containers_builders_use_the_runtime_selected(fictitious):
    assert containers.docker_logs_argv("c1", follow=True, timestamps=True, runtime=fictitious) == \
        ["echo-runtime", "logs", "--follow", "--timestamps", "c1"]
    assert containers.docker_logs_argv("c1", follow=True, timestamps=True) == \
        ["docker", "logs", "--follow", "--timestamps", "c1"]


def test_preflight_asks_a_nodes_own_runtime(fictitious, monkeypatch):
    """Preflight's scripted sections stand for the node's runtime's commands (the keys its
    later calls are answered from), and a node picks its runtime in node_runtime."""
    monkeypatch.setattr(runtime, "DEFAULT_RUNTIME", "fictitious")
    (_, _, _), (_, _, argv_of) = preflight._Replay.scripts(object(), devices=[], ports=False,
                                                           image_ref="img:1")
    assert argv_of == {"version": ["echo-runtime", "version", "--format", "{{.Server.Version}}"],
                       "info": ["echo-runtime", "info", "--format", preflight.DOCKER_INFO_FORMAT],
                       "image": ["echo-runtime", "image", "inspect", "--format", "{{.Id}}", "img:1"]}
