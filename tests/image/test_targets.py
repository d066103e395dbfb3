"""Target facts and the IPEX/oneCCL version table (src/clusterctl/image/data/*.yaml via
clusterctl.image.targets), and how a bad data file is reported."""

from __future__ import annotations

import pytest
import yaml

from clusterctl.core.errors import UserError
from clusterctl.image import targets


def test_all_stacks_are_targets():
    assert targets.target_names() == ["base", "cpu", "ipex", "accl", "nccl", "cambricon"]


@pytest.mark.parametrize("name", ["cpu", "ipex", "accl", "nccl", "cambricon"])
def test_every_stack_names_its_backend_smoke_and_template(name):
    t = targets.get_target(name)
    assert t.backend and t.smoke and t.template and t.tag and t.needs
    assert t.template.startswith(f"{name}/")


@pytest.mark.parametrize(("torch", "ipex", "oneccl"), [
    ("1.10.0", "1.10.100", "1.10.0"),
    ("1.11.0", "1.11.200", "1.11.0"),
    ("1.12.0", "1.12.300", "1.12.0"),
    ("1.12.1", "1.12.300", "1.12.100"),   # not 1.12.0: that wheel was built for torch 1.12.0
    ("2.0.1", "2.0.100", "2.0.100"),
    ("2.1.0", "2.1.0", "2.1.0+cpu"),
    ("2.3.1", "2.3.100", "2.3.100"),
    ("2.8.0", "2.8.0", "2.8.0"),
])
def test_ipex_pins_follow_the_version_table(torch, ipex, oneccl):
    r = targets.resolve("ipex", torch)
    assert (r.torch, r.pins["ipex"], r.pins["oneccl_bind_pt"]) == (torch, ipex, oneccl)
    assert r.requirements == [f"torch=={torch}", f"intel_extension_for_pytorch=={ipex}",
                              f"oneccl_bind_pt=={oneccl}"]
    assert r.tag == f"clusterctl/ipex:{torch}"


@pytest.mark.parametrize(("torch", "module"), [
    ("1.10.0", "torch_ccl"), ("1.11.0", "torch_ccl"),
    ("1.12.0", "oneccl_bindings_for_pytorch"), ("2.3.1", "oneccl_bindings_for_pytorch"),
])
def test_ccl_import_name_changes_at_1_12(torch, module):
    r = targets.resolve("ipex", torch)
    assert r.pins["ccl_module"] == module
    assert f"import torch, intel_extension_for_pytorch as ipex, {module};" in r.smoke[-1]
    assert any(f"{module} as m" in line for line in r.entrypoint_env)
    assert r.entrypoint_env[-1] == '. "$ccl_dir/env/setvars.sh"'


def test_wheel_index_option_depends_on_the_era():
    old = targets.resolve("ipex", "1.12.1").indexes
    assert [i.pip_args() for i in old] == [["-f", "https://developer.intel.com/ipex-whl-stable-cpu"]]
    oldest = targets.resolve("ipex", "1.10.0").indexes
    assert [i.pip_args() for i in oldest] == [["-f", "https://software.intel.com/ipex-whl-stable"]]
    new = [i.pip_args() for i in targets.resolve("ipex", "2.3.1").indexes]
    assert ["--extra-index-url", "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"] in new
    assert all(option == "--extra-index-url" for option, _ in new)


def test_every_row_of_the_ipex_table_resolves():
    t = targets.get_target("ipex")
    for version in t.torch_versions():
        r = targets.resolve("ipex", version)
        major_minor = tuple(int(x) for x in version.split(".")[:2])
        assert (r.pins["ccl_module"] == "torch_ccl") == (major_minor < (1, 12)), version
        assert r.base_image == f"python:{r.pins['python']}-slim-bookworm"
        assert r.indexes, version


def test_ipex_defaults_to_the_tables_default():
    assert targets.resolve("ipex").torch == targets.get_target("ipex").torch.default == "2.8.0"


def test_unknown_torch_is_refused_with_the_known_versions():
    with pytest.raises(UserError) as e:
        targets.resolve("ipex", "1.12.2")
    msg = str(e.value)
    assert "torch 1.12.2 is not known for target ipex" in msg
    assert 'did you mean "1.12.1"' in msg
    for known in ("1.10.0", "1.12.1", "2.3.1", "2.8.0"):
        assert known in msg
    assert "ipex_versions.yaml" in msg


def test_torch_cannot_be_chosen_where_the_base_image_brings_it():
    with pytest.raises(UserError, match="takes torch from its base image"):
        targets.resolve("accl", "2.0.1")


def test_unknown_target_suggests_the_closest():
    with pytest.raises(UserError) as e:
        targets.get_target("cambrican")
    assert 'did you mean "cambricon"' in str(e.value)
    assert "base, cpu, ipex, accl, nccl or cambricon" in str(e.value)


def test_cpu_installs_offline_from_a_wheelhouse_with_pip_from_its_wheel():
    r = targets.resolve("cpu")
    assert r.target.wheelhouse == "required"
    assert r.requirements == ["torch==2.13.0", "numpy==2.4.6"]  # numpy: torch warns without it
    assert r.base_image == targets.get_target("base").tag == "clusterctl/base:bookworm"
    assert "is_gloo_available()" in r.smoke[-1]


def test_launch_facts_per_stack():
    cam = targets.get_target("cambricon").run
    assert cam.devices_for(2) == ["/dev/cambricon_ctl", "/dev/cambricon_dev0", "/dev/cambricon_dev1"]
    assert cam.optional_devices == ["/dev/cambricon_ipcm0"]
    assert {"--ipc=host", "--net=host"} <= set(cam.flags)
    accl = targets.get_target("accl")
    assert accl.backend == "accl" and accl.run.devices == ["/dev/infiniband"]
    assert "memlock=-1:-1" in accl.run.flags
    nccl = targets.get_target("nccl").run.flags
    assert "--gpus=all" in nccl and "stack=67108864" in nccl
    assert targets.get_target("ipex").env["CCL_WORKER_COUNT"] == "1"


def test_a_bad_data_file_names_the_field(tmp_path):
    bad = tmp_path / "targets.yaml"
    bad.write_text("targets:\n  x:\n    description: d\n    template: x/Dockerfile.j2\n")
    with pytest.raises(UserError) as e:
        targets.load_targets(bad)
    assert str(bad) in str(e.value) and "targets.x." in str(e.value)


def test_every_problem_of_a_data_file_is_located(tmp_path):
    bad = tmp_path / "targets.yaml"
    good = {k: v for k, v in targets.load_targets()["cpu"].model_dump().items() if k != "name"}
    bad.write_text(yaml.safe_dump({"targets": {"ok": good, "y": {**good, "wheelhouse": "always"},
                                               "z": [1]}}, sort_keys=False)
                   .replace("targets:", "# data\ntargets:", 1) + "  w: {}\n")
    with pytest.raises(UserError) as e:
        targets.load_targets(bad)
    msg, lines = str(e.value), bad.read_text().splitlines()
    assert e.value.exit_code == 2 and msg.splitlines()[0].endswith("problems in the target data (nothing was started):")
    wheelhouse = next(i for i, line in enumerate(lines, 1) if "always" in line)
    assert f"{bad}:{wheelhouse}: targets.y.wheelhouse: input should be 'required' or 'optional'" in msg
    assert f"{bad}:{lines.index('  z:') + 1}: targets.z: a list is not a mapping" in msg
    assert f"{bad}:{len(lines)}: targets.w.description: is missing; valid: the fields described" in msg


def test_a_syntax_error_in_data_is_located(tmp_path):
    bad = tmp_path / "targets.yaml"
    bad.write_text("targets:\n  x: {description: [d}\n")
    with pytest.raises(UserError, match=r"targets.yaml:2: \(YAML syntax\): .*valid: YAML as in the other"):
        targets.load_targets(bad)
    bad.write_text("- a list\n")
    with pytest.raises(UserError, match=r"targets.yaml:1: targets: a list is not a mapping of targets"):
        targets.load_targets(bad)


def test_another_base_image_drops_the_default_bases_torch_fact():
    assert targets.resolve("cambricon").pins["torch"] == "1.13.1"
    other = targets.resolve("cambricon", base_image="pytorch:v1.15.0-torch1.9-ubuntu18.04-py37")
    assert "torch" not in other.pins
    assert other.base_image == "pytorch:v1.15.0-torch1.9-ubuntu18.04-py37"


def test_a_target_built_on_the_local_base_runs_pip_the_way_that_base_needs():
    """bookworm's python3 has no pip and its image builds reach no index: ipex FROM the local base
    installs offline with pip from its wheel and the base's CPython, not the table's 3.10."""
    local = targets.get_target("base").tag
    default = targets.resolve("ipex", "2.8.0")
    assert (default.pip, default.wheelhouse, default.pins["python"]) == ("python3 -m pip", "optional", "3.10")
    on_local = targets.resolve("ipex", "2.8.0", base_image=local)
    assert on_local.base_image == local
    assert on_local.pip == 'python3 "$1/pip"' and on_local.pip_setup == "set -- /tmp/wheels/pip-*.whl"
    assert on_local.pip_flags == ["--break-system-packages"]
    assert on_local.wheelhouse == "required" and on_local.pins["python"] == "3.11"
    # another base keeps the target's own facts
    assert targets.resolve("ipex", "2.8.0", base_image="python:3.11-slim").pip == "python3 -m pip"
