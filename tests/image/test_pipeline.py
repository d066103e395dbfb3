"""The build pipeline (build/pipeline.py): the plan checks every input and renders in memory,
writing nothing; the build carries it out on the real engine.

Successful builds on a real engine are also covered by the cpu_image fixture
(tests/fixtures/images.py) and the docker-marked tests in tests/cli/test_build_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from clusterctl.core.errors import ClusterctlError, UserError
from clusterctl.image import pipeline, render


def test_plan_renders_in_memory_and_writes_nothing(in_tmp):
    plan = pipeline.plan_build("accl")
    assert plan.tag == plan.resolved.tag and plan.target == "accl"
    assert plan.dockerfile == render.dockerfile_text("accl")
    assert plan.texts["entrypoint.sh"] == render.entrypoint_text("accl")
    assert plan.out_dir == Path("dockerfiles/accl")
    assert list(in_tmp.iterdir()) == []


def test_build_args(in_tmp):
    plan = pipeline.plan_build("accl", build_args={"TORCH_ACCL_WHEEL_URL": "http://h/w.whl", "HTTP_PROXY": "p"})
    assert plan.build_args["TORCH_ACCL_WHEEL_URL"] == "http://h/w.whl"
    assert plan.build_args["ACCL_INSTALLER_URL"].endswith("accl-v1.3.2-4-ubuntu20.04-cuda11.4.sh")
    with pytest.raises(UserError, match="declares no such ARG. Its build args: ACCL_INSTALLER_URL or "
                                        "TORCH_ACCL_WHEEL_URL"):
        pipeline.plan_build("accl", build_args={"ACCL_URL": "x"})


def test_bad_references_are_refused_before_anything(in_tmp):
    with pytest.raises(UserError, match="--base-image 'NGC Latest' is not a valid image reference"):
        pipeline.plan_build("nccl", base_image="NGC Latest")
    with pytest.raises(UserError, match="--tag 'me/x y' is not a valid image reference"):
        pipeline.plan_build("nccl", tag="me/x y")


def test_base_is_built_not_rendered(in_tmp):
    plan = pipeline.plan_build("base")
    assert plan.tag == "clusterctl/base:bookworm" and not plan.texts
    with pytest.raises(UserError, match="debootstrapped, not rendered: --base-image and --wheelhouse"):
        pipeline.plan_build("base", base_image="debian:bookworm")
    assert not (in_tmp / "dockerfiles").exists()


def test_dry_run_description_names_tag_args_and_wheelhouse(in_tmp):
    rows = dict(pipeline.plan_build("cpu", tag="me/cpu:x").describe())
    assert rows["tag"] == "me/cpu:x"
    assert "clusterctl build --target base" in rows["base image"]
    assert rows["wheelhouse"].startswith("prepared on the host") and "torch==2.13.0" in rows["wheelhouse"].split()
    assert not (in_tmp / "dockerfiles").exists()


# ---------------------------------------------------------------- build


@pytest.mark.docker
@pytest.mark.slow
def test_a_failing_smoke_fails_the_build_and_untags(in_tmp, docker_client, cpu_image, throwaway_tag):
    plan = pipeline.plan_build("cpu", tag=throwaway_tag)
    failing = plan.resolved.model_copy(update={"smoke": ["python3", "-c", "raise SystemExit(3)"]})
    plan.resolved = failing
    with pytest.raises(ClusterctlError) as e:
        pipeline.build_target(docker_client, plan, log=lambda line: None, on_output=lambda line: None)
    assert "smoke test failed" in str(e.value) and "exited 3" in str(e.value)
    with pytest.raises(ImageNotFound):
        docker_client.images.get(throwaway_tag)


@pytest.mark.docker
@pytest.mark.slow
def test_the_wheels_of_an_offline_build_are_no_layer_of_the_image(docker_client, cpu_image):
    """On the local base, pip installs in a build stage of its own and the image copies only what it
    installed: no layer of the cpu image holds /tmp/wheels (with the wheels COPYed into the image, a
    layer the size of the wheelhouse stays, even after `rm -rf`), and torch and its console scripts
    are where the base's python3 finds them."""
    image = docker_client.images.get(cpu_image)
    created_by = [h.get("CreatedBy", "") for h in image.history()]
    assert not [c for c in created_by if "/tmp/wheels" in c], created_by
    out = docker_client.containers.run(cpu_image, ["sh", "-c", "command -v torchrun && command -v py-spy && "
                                                   "python3 -c 'import torch; print(torch.__file__)' && ls /tmp"],
                                       remove=True, network_mode="host").decode().split()
    assert out[:2] == ["/usr/local/bin/torchrun", "/usr/local/bin/py-spy"], out
    assert out[2].startswith("/usr/local/lib/python3.11/dist-packages/torch/"), out
    assert "wheels" not in out[3:], out
