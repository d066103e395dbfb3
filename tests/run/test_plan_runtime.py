"""The launch plan's ``docker run`` argv comes from the node's container runtime
(clusterctl.cluster.runtime): byte for byte what it was before the seam with Docker, and
another runtime's words when another is selected."""

from __future__ import annotations

import textwrap

import pytest

from clusterctl.cluster import runtime
from clusterctl.cluster.inventory import load_inventory
from clusterctl.cluster.runtime import DockerRuntime, runtime_for
from clusterctl.run import plan
from clusterctl.run.jobs import load_job

KW = dict(name="r-n1", labels={"io.clusterctl.run": "r", "io.clusterctl.rank": "0"},
          options=["--add-host", "n1:10.0.0.1", "--init", "-v", "/a:/b"],
          env={"A": "1", "S": "secret", "B": "x y"}, image="img:1", command=["python3", "-c", "print(1)"])
HEAD = ["--net=host", "--name", "r-n1", "--label", "io.clusterctl.run=r", "--label", "io.clusterctl.rank=0",
        "--add-host", "n1:10.0.0.1", "--init", "-v", "/a:/b", "-e", "A=1"]
TAIL = ["img:1", "python3", "-c", "print(1)"]


# plan.docker_run_argv's keyword arguments -> its argv before the seam (captured from commit ffddaf0)
@pytest.mark.parametrize("kwargs,expected", [
    ({"secrets": ()}, ["docker", "run", "-d", *HEAD, "-e", "S=secret", "-e", "B=x y", *TAIL]),
    ({"secrets": ["S"]}, ["docker", "run", "-d", *HEAD, "-e", "B=x y", "--env-file", "/dev/stdin", *TAIL]),
    ({"secrets": ["S"], "secrets_by_name": True}, ["docker", "run", "-d", *HEAD, "-e", "B=x y", "-e", "S", *TAIL]),
    ({"secrets": ["S"], "detach": False},
     ["docker", "run", *HEAD, "-e", "B=x y", "--env-file", "/dev/stdin", *TAIL]),
])
def test_docker_run_argv_is_what_it_was_before_the_seam(kwargs, expected):
    assert plan.docker_run_argv(**KW, **kwargs) == expected


class EchoRuntime(DockerRuntime):
    """A fictitious second runtime: its own binary, and its own word for ``run``."""

    name = "fictitious"
    binary = "echo-runtime"

    def run(self, image, command, **kwargs):
        argv = super().run(image, command, **kwargs)
        return [self.binary, "create-and-start", *argv[2:]]


def test_a_plan_on_nodes_of_another_runtime_uses_its_argv(tmp_path, monkeypatch):
    """Every node's argv is the selected runtime's, the rest of the plan unchanged."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(textwrap.dedent("""
        nodes:
          - {name: a, host: 10.0.0.1, slots: 2}
          - {name: b, host: 10.0.0.2, slots: 2}
    """))
    job, nodes = load_job("ddp-smoke"), load_inventory(inv)
    docker = plan.make_plan(job, nodes, run_id="r1")
    monkeypatch.setitem(runtime.RUNTIMES, EchoRuntime.name, EchoRuntime)
    monkeypatch.setattr(runtime, "DEFAULT_RUNTIME", EchoRuntime.name)   # every node's runtime
    echo = plan.make_plan(job, nodes, run_id="r1")
    assert [p.argv[:3] for p in docker] == [["docker", "run", "-d"]] * 2
    assert [p.argv[:3] for p in echo] == [["echo-runtime", "create-and-start", "-d"]] * 2
    assert [p.argv[2:] for p in echo] == [p.argv[2:] for p in docker]
    assert plan.docker_run_argv(**KW, secrets=(), runtime=runtime_for("docker"))[0] == "docker"
