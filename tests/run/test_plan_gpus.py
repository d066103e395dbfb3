"""GPUs in the plan, the way each container runtime takes them: docker's ``--gpus`` as the
target says it, CDI names (``--device=nvidia.com/gpu=...``) on a runtime that takes only
those (Podman).  Pure: no node, no GPU (none here)."""

from __future__ import annotations

import pytest

from clusterctl.cluster.runtime import DockerRuntime
from clusterctl.cluster.runtime.base import cdi_names
from clusterctl.core.errors import UserError
from clusterctl.run import plan


class CdiOnly(DockerRuntime):
    """A runtime that takes GPUs by CDI name only, as Podman does (a stand-in: the Podman
    runtime is its own module)."""

    name = "cdi-only"
    gpu_style = "cdi"


class _Node:
    name = "gpu1"


@pytest.mark.parametrize(("value", "names"), [
    ("all", ["all"]), ("2", ["0", "1"]), ("count=3", ["0", "1", "2"]),
    ('"device=0,2"', ["0", "2"]), ("device=GPU-4b8f", ["GPU-4b8f"])])
def test_gpus_value_to_cdi_names(value, names):
    assert cdi_names(value) == names


def test_docker_keeps_its_flag_a_cdi_runtime_gets_device_names():
    opts = ["--net=host", "--gpus=all", "--ipc=host", "--gpus", "2"]
    assert DockerRuntime().gpu_options(opts, "nvidia.com/gpu") == opts
    assert CdiOnly().gpu_options(opts, "nvidia.com/gpu") == [
        "--net=host", "--device=nvidia.com/gpu=all", "--ipc=host",
        "--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"]


def test_plan_says_gpus_in_the_nodes_runtimes_words(monkeypatch):
    flags = ["--gpus=all", "--net=host", "--device=/dev/infiniband"]
    assert plan._gpus_for_runtime(list(flags), _Node()) == flags          # docker: as the target says
    monkeypatch.setattr(plan, "node_runtime", lambda node: CdiOnly())
    assert plan._gpus_for_runtime(list(flags), _Node()) == [
        "--device=nvidia.com/gpu=all", "--net=host", "--device=/dev/infiniband"]
    with pytest.raises(UserError, match=r"node gpu1 \(cdi-only\): --gpus 'many'"):
        plan._gpus_for_runtime(["--gpus=many"], _Node())
