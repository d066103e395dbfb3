"""The accelerator table (core/data/accelerators.yaml): what it holds, how a bad entry is
reported, and that a fictitious accelerator added as data (plus a target and its template)
is taken up by render, plan, check, export and the log scanner without a code change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.cli import check as check_cli
from clusterctl.cluster import preflight
from clusterctl.cluster.inventory import load_inventory
from clusterctl.core import accelerators, paths
from clusterctl.core.accelerators import AcceleratorDataError
from clusterctl.image import render, targets
from clusterctl.image.targets import TargetDataError
from clusterctl.run import export, plan, suspicious
from clusterctl.run.collective import check as collective_check
from clusterctl.run.collective.incontainer import probe
from clusterctl.run.jobs import load_job

# --------------------------------------------------------------------------- the shipped table


def test_the_shipped_table_holds_every_backend_and_device_the_targets_use():
    table = accelerators.load()
    assert table.backend_names() == ("gloo", "nccl", "ccl", "cncl", "accl")   # the default first
    assert check_cli.BACKENDS == table.backend_names()
    assert table.device_names() == ("cpu", "cuda", "mlu")
    for t in targets.load_targets().values():
        assert t.device in table.devices
        assert t.backend is None or table.backends[t.backend].device == t.device, t.name
    assert table.devices["cuda"].kubernetes_resource == "nvidia.com/gpu"
    assert table.devices["mlu"].covers("/dev/cambricon_dev3") and not table.devices["mlu"].covers("/dev/cambricon")
    assert accelerators.load() is table   # cached


def test_the_driver_probe_is_the_tables_and_preflight_runs_it():
    probe_text = accelerators.load().driver_probe()
    assert preflight._FACTS_SCRIPT == "uname -r; date +%s.%N; " + probe_text
    assert probe_text.startswith("if command -v nvidia-smi >/dev/null 2>&1; then ")
    assert "elif command -v cnmon " in probe_text and probe_text.endswith("else echo; fi")


def _problems(tmp_path: Path, text: str) -> str:
    path = tmp_path / "accelerators.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(AcceleratorDataError) as err:
        accelerators.load(path)
    return str(err.value)


def test_a_bad_entry_names_the_file_line_and_field(tmp_path):
    message = _problems(tmp_path, """\
        default_backend: gloo
        devices:
          cpu: {description: CPUs}
          gpu:
            description: GPUs
            docker_flag: gpus
        backends:
          gloo: {device: cpu, version: torch}
          xcl:
            device: xpu
            version: torch
          ycl:
            device: cpu
            version: torch
            errors: ['(unclosed']
            modules: [x]
        """)
    path = tmp_path / "accelerators.yaml"
    assert f"{path}:6: devices.gpu.docker_flag: must be a long docker run flag" in message
    assert f"{path}:10: backends.xcl.device: \"xpu\" is not a device of this file; valid: one of cpu or gpu" in message
    assert f"{path}:15: backends.ycl.errors: item 0: '(unclosed' is not a regular expression" in message
    assert f"{path}:16: backends.ycl.modules: unknown field \"modules\"" in message


def test_a_default_backend_the_table_lacks_is_refused(tmp_path):
    message = _problems(tmp_path, """\
        default_backend: mpi
        devices: {cpu: {description: CPUs}}
        backends: {gloo: {device: cpu, version: torch}}
        """)
    assert ":1: default_backend: \"mpi\" is not a backend of this file; valid: one of gloo" in message


# --------------------------------------------------------------------------- a fictitious accelerator

#: A fictitious accelerator: device kind "fake" (device files /dev/fake_*, docker flag
#: --fake-devices, Kubernetes resource example.com/fake) with collective backend "fakecl".
FICTITIOUS_DEVICE = {
    "description": "a fictitious accelerator (tests only)",
    "driver": {"command": "fakesmi", "name": "fakevendor", "version": "fakesmi --driver-version"},
    "docker_flag": "--fake-devices",
    "device_files": ["/dev/fake_"],
    "kubernetes_resource": "example.com/fake",
}
FICTITIOUS_BACKEND = {"device": "fake", "module": ["torch_fake"], "version": "module",
                      "errors": [r"\bFAKECL (?:ERROR|[Ee]rror)\b"]}
FICTITIOUS_TARGET = {
    "description": "a fictitious accelerator's PyTorch (tests only)",
    "template": "fakeaccel/Dockerfile.j2",
    "base_image": "example.com/fake/pytorch:1.0",
    "pins": {"torch": "2.0.0"},
    "torch": None,
    "pip": "python -m pip",
    "run": {"flags": ["--net=host", "--ipc=host"], "devices": ["/dev/fake_ctl"],
            "per_slot_devices": ["/dev/fake_dev{i}"]},
    "backend": "fakecl",
    "device": "fake",
    "needs": "fictitious accelerators",
    "smoke": ["python", "-c", "import torch_fake"],
    "tag": "clusterctl/fakeaccel:1.0",
}
FICTITIOUS_TEMPLATE = """\
{% from "blocks/header.j2" import header as header_block %}
{% from "blocks/labels.j2" import labels as labels_block %}
{% from "blocks/entrypoint.j2" import entrypoint as entrypoint_block %}
{% import "blocks/pip.j2" as pip %}
{{ header_block(target, command) }}
FROM {{ base_image }}

{{ labels_block(target, torch) }}

{{ pip.tools_online(pip_command, pip_flags, tools) }}

{{ entrypoint_block() }}
"""


def _with(source: Path, dest: Path, section: str, name: str, entry: dict) -> Path:
    data = yaml.safe_load(source.read_text())
    data[section][name] = entry
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


@pytest.fixture
def fictitious_accelerator(tmp_path, monkeypatch):
    """The shipped data with the fictitious accelerator added (table entries, a target, its
    template), in copies that the loaders read instead of the shipped files."""
    table = _with(accelerators.ACCELERATORS_FILE, tmp_path / "accelerators.yaml", "devices", "fake",
                  FICTITIOUS_DEVICE)
    _with(table, table, "backends", "fakecl", FICTITIOUS_BACKEND)
    target_data = _with(targets.TARGETS_FILE, tmp_path / "targets.yaml", "targets", "fakeaccel",
                        FICTITIOUS_TARGET)
    templates = tmp_path / "templates"
    shutil.copytree(paths.templates_dir(), templates)
    (templates / "fakeaccel").mkdir()
    (templates / "fakeaccel" / "Dockerfile.j2").write_text(FICTITIOUS_TEMPLATE)
    monkeypatch.setattr(accelerators, "ACCELERATORS_FILE", table)
    monkeypatch.setattr(targets, "TARGETS_FILE", target_data)
    monkeypatch.setattr(paths, "templates_dir", lambda: templates)
    return tmp_path


def test_a_fictitious_target_without_its_accelerator_entries_is_refused_naming_the_line(tmp_path):
    path = _with(targets.TARGETS_FILE, tmp_path / "targets.yaml", "targets", "fakeaccel", FICTITIOUS_TARGET)
    with pytest.raises(TargetDataError) as err:
        targets.load_targets(path)
    lines = path.read_text().splitlines()
    device_line = next(i for i, line in enumerate(lines, 1) if line.strip() == "device: fake")
    assert f"{path}:{device_line}: targets.fakeaccel.device: \"fake\" is not a known device kind; " \
           "valid: one of the devices of accelerators.yaml (cpu, cuda or mlu)" in str(err.value)
    assert "targets.fakeaccel.backend: \"fakecl\" is not a known backend" in str(err.value)


def test_a_fictitious_accelerator_added_as_data_is_rendered(fictitious_accelerator):
    dockerfile = render.dockerfile_text("fakeaccel")
    assert "FROM example.com/fake/pytorch:1.0\n" in dockerfile
    assert 'io.clusterctl.target="fakeaccel"' in dockerfile and 'io.clusterctl.torch="2.0.0"' in dockerfile
    assert "`clusterctl render --target fakeaccel` from templates/fakeaccel/" in dockerfile
    assert "RUN python -m pip install --no-cache-dir \\\n        py-spy==" in dockerfile
    assert 'exec "$@"' in render.entrypoint_text("fakeaccel")


def test_a_fictitious_accelerator_added_as_data_is_planned(fictitious_accelerator):
    tmp = fictitious_accelerator
    (tmp / "job.yaml").write_text("target: fakeaccel\ncommand: [train, --backend, '{backend}', --device, '{device}']\n")
    (tmp / "inv.yaml").write_text("nodes:\n  - {name: a, host: 10.0.0.1, slots: 2}\n"
                                  "  - {name: b, host: 10.0.0.2, slots: 1}\n")
    job, inventory = load_job(tmp / "job.yaml"), load_inventory(tmp / "inv.yaml")
    a, b = plan.make_plan(job, inventory, run_id="r")
    assert [x for x in a.argv if x.startswith("--device=")] == \
        ["--device=/dev/fake_ctl", "--device=/dev/fake_dev0", "--device=/dev/fake_dev1"]
    assert [x for x in b.argv if x.startswith("--device=")] == ["--device=/dev/fake_ctl", "--device=/dev/fake_dev0"]
    assert a.argv[-6:] == ["clusterctl/fakeaccel:1.0", "train", "--backend", "fakecl", "--device", "fake"]
    assert "--device=/dev/fake_dev1" in plan.render_dry_run([a, b])


def test_a_fictitious_accelerator_added_as_data_is_checked(fictitious_accelerator, tmp_path):
    # check --target: the devices preflight requires on each node
    node = load_inventory(_inventory(tmp_path)).nodes[0]
    assert check_cli._target_devices("fakeaccel")(node) == ["/dev/fake_ctl", "/dev/fake_dev0", "/dev/fake_dev1"]
    # check --collective --backend: the table's backends, the probe set up for its device and module
    result = CliRunner().invoke(app, ["check", "--collective", "--nodes", str(_inventory(tmp_path)),
                                      "--image", "x:1", "--backend", "nosuch"])
    assert result.exit_code == 2 and "valid: gloo, nccl, ccl, cncl, accl, fakecl" in result.output
    cfg = collective_check.config(2, "fakecl", collective_check.Options())
    assert (cfg["device"], cfg["module"], cfg["version"]) == ("fake", ["torch_fake"], "module")
    assert collective_check.backend_of(load_job(_job(tmp_path)), None) == "fakecl"
    # the driver probe: a node with the fictitious driver's command reports it
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fakesmi").write_text("#!/bin/sh\necho 7.1.2\n")
    (bin_dir / "fakesmi").chmod(0o755)
    script = accelerators.load().driver_probe()
    out = subprocess.run(["sh", "-c", "uname -r; date +%s.%N; " + script], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}, check=True).stdout
    assert preflight.parse_facts(out)[2] == "fakevendor 7.1.2"


def test_the_collective_probe_sets_a_fictitious_device_up_from_the_table(fictitious_accelerator, tmp_path,
                                                                          monkeypatch):
    """The probe (which runs in the image, with torch) imports the table's module and sets
    the table's device up; torch is a stand-in here, the probe's code is the shipped one."""
    (tmp_path / "torch_fake.py").write_text("__version__ = '0.3'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "1")
    calls = []

    class Fake:
        def set_device(self, i):
            calls.append(("set_device", i))

        def synchronize(self):
            calls.append(("synchronize",))

    class Torch:
        fake = Fake()

        @staticmethod
        def device(kind, index=None):
            return f"{kind}:{index}"

    cfg = collective_check.config(2, "fakecl", collective_check.Options())
    device, sync = probe.device_for(cfg, Torch)
    sync()
    assert device == "fake:1" and calls == [("set_device", 1), ("synchronize",)]
    assert probe.backend_version(cfg, Torch) == "0.3"


def test_a_fictitious_accelerator_added_as_data_is_exported(fictitious_accelerator, tmp_path):
    job = load_job(_job(tmp_path))
    body = export.build_manifest(job, kind="pytorchjob", nnodes=2, slots=4).body
    container = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"example.com/fake": "4"}
    # its docker flag, in both spellings, becomes the same resource
    assert export.pod_settings(["--fake-devices", "2"], [], slots=4).resources == {"example.com/fake": "2"}
    assert export.pod_settings(["--fake-devices=all"], [], slots=3).resources == {"example.com/fake": "3"}
    with pytest.raises(Exception, match="--fake-devices=all .example.com/fake = slots. or --fake-devices=N"):
        export.pod_settings(["--fake-devices=some"], [], slots=3)


def test_a_fictitious_accelerator_added_as_data_is_known_to_the_log_scanner(fictitious_accelerator):
    line = "[rank1]: FAKECL ERROR ring 3 broke"
    assert suspicious.classify(line) == "fakecl"
    assert suspicious.classify("FAKECL warning: slow link") is None
    found = suspicious.findings([("a", 0, "step 1"), ("b", 1, line)])
    assert [(f.node, f.library) for f in found] == [("b", "fakecl")]
    assert "(fakecl)" in suspicious.summary_lines(found)[0]
    assert suspicious.classify("NCCL error: unhandled system error") == "nccl"   # the shipped ones stay


def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - {name: a, host: 10.0.0.1, slots: 2}\n")
    return path


def _job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"target": "fakeaccel", "command": ["run"]}))
    return path
