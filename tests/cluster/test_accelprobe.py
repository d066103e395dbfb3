"""The accelerator probe's parsers and judge, on RECORDED tool output (no GPU or MLU here).

The samples under tests/fixtures/accel/ were written by hand from the tools' documented
formats (its README says which), except one CAPTURED on a lent NVIDIA H200 machine
(``captured-h200-probe.txt``, tests named ``..._captured_...``): the hand-written ones prove
the parsing and the judging of faults no healthy machine shows, the captured one that a
real nvidia-smi (driver 580, XML DTD v13) reads as the hand-written ones do.  The probe script
itself runs for real on this machine (which has none of the tools) and on a real sshd with
stand-in tools on its PATH (tests/cli/test_check_cli.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clusterctl.cluster import accelprobe as ap
from clusterctl.core import accelerators

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "accel"
U0 = "GPU-4b8f6c1e-7d2a-4f39-9c55-0e1d2a3b4c5d"
U1 = "GPU-9a0b1c2d-3e4f-5061-7283-94a5b6c7d8e9"


def rec(name: str) -> str:
    return (FIX / name).read_text()


def spec(name: str = "cdi-nvidia-535.yaml", path: str = "/etc/cdi/nvidia.yaml") -> str:
    return f"== {path}\n{rec(name)}"


def healthy(**more) -> dict[str, tuple[int, str]]:
    return {"smi_xml": (0, rec("smi-a100x2-healthy.xml")), "smi_apps": (0, ""), "xid": (0, ""),
            "toolkit": (0, "/usr/bin/nvidia-container-runtime-hook\n/usr/bin/nvidia-ctk\n"),
            "cdi_list": (0, rec("cdi-list.txt")), "cdi_specs": (0, ""), **more}


def test_smi_xml_recorded_a100_new_ecc_layout():
    r = ap.parse_smi_xml(rec("smi-a100x2-faulty.xml"))
    assert (r.driver, r.cuda, len(r.gpus)) == ("550.54.15", "12.4", 2)
    g0, g1 = r.gpus
    assert (g0.index, g0.uuid, g0.bus_id, g0.ecc_uncorrected, g0.remap_pending, g0.remap_failure) == \
        (0, U0, "00000000:07:00.0", 2, True, False)
    assert g0.retired_pages is None and not g0.retirement_pending   # N/A on A100 (row remapping)
    assert (g1.ecc_uncorrected, g1.processes) == (0, ((23188, "python3"),))


def test_smi_xml_recorded_v100_old_ecc_layout_and_retired_pages():
    r = ap.parse_smi_xml(rec("smi-v100x2-old.xml"))
    assert (r.driver, r.cuda) == ("470.82.01", "11.4")
    assert [(g.ecc_uncorrected, g.retired_pages, g.retirement_pending) for g in r.gpus] == \
        [(0, 0, False), (1, 2, True)]


@pytest.mark.parametrize("text", ["not xml", "<other/>",
                                  '<!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>'])
def test_smi_xml_that_is_not_nvidia_smis_is_refused(text):
    with pytest.raises(ValueError):
        ap.parse_smi_xml(text)


def test_small_parsers_on_recorded_output():
    assert ap.parse_compute_apps(rec("smi-apps-busy.csv")) == [ap.ComputeApp(U1, 23188, "python3", "40211 MiB")]
    assert ap.parse_cdi_list(rec("cdi-list.txt")) == [
        "nvidia.com/gpu=0", "nvidia.com/gpu=1", f"nvidia.com/gpu={U0}", f"nvidia.com/gpu={U1}",
        "nvidia.com/gpu=all"]
    (s,) = ap.parse_cdi_specs(spec())
    assert (s.path, s.kind, s.devices, s.libraries) == ("/etc/cdi/nvidia.yaml", "nvidia.com/gpu",
                                                        ("0", U0, "all"), ("535.104.05",))
    assert [(x.bus, x.code) for x in ap.parse_xids(rec("dmesg-xid.txt"))] == [("0000:0f:00", 13), ("0000:07:00", 79)]
    h = ap.parse_dcgmi_health(rec("dcgmi-health-fail.txt"))
    assert h.overall == "Failure" and h.gpus[0] == ("Healthy", ())
    assert h.gpus[1][1] == ("Memory system: Failure - A volatile double-bit ECC error has occurred on GPU 1.",
                            "PCIe system: Warning - Detected more than 8 PCIe replays per minute for GPU 1 : 13")
    cards = ap.parse_cnmon_info(rec("cnmon-info-mlu370x2.txt"))
    assert [(c.index, c.product, c.driver, c.uncorrected) for c in cards] == \
        [(0, "MLU370-X8", "v4.20.18", 0), (1, "MLU370-X8", "v4.20.18", 3)]


def test_parts_are_read_by_the_token_only():
    text = "T part a\nx\nT rc a 0\nT part b\nU rc b 1\n\nT rc b 3\n"
    assert ap.parse_parts("T", text) == {"a": (0, "x"), "b": (3, "U rc b 1")}


def test_recorded_healthy_node_has_no_finding():
    f = ap.judge(healthy(), toolkit_version="12.3.2", wants="cuda")
    assert (f.kind, f.count, f.problems, f.warnings) == ("cuda", 2, [], [])
    assert f.facts["driver"] == "550.54.15" and f.facts["busy"] == []


def test_recorded_no_toolkit_is_a_problem_for_a_cuda_job_a_warning_otherwise():
    parts = healthy(toolkit=(0, ""), cdi_list=(0, "INFO[0000] Found 0 CDI devices\n"))
    (p,) = ap.judge(parts, wants="cuda").problems
    assert "no NVIDIA Container Toolkit" in p and "docker run --gpus" in p
    f = ap.judge(parts)
    assert f.problems == [] and any("no NVIDIA Container Toolkit" in w for w in f.warnings)
    (p,) = ap.judge(healthy(cdi_list=(0, "")), runtime="podman", wants="cuda").problems
    assert "podman gives GPUs to containers only by CDI name (--device=nvidia.com/gpu=all)" in p


def test_recorded_broken_and_stale_cdi_specs_are_named():
    broken = ap.judge(healthy(cdi_list=(1, "ERRO[0000] failed to load CDI spec /etc/cdi/nvidia.yaml: "
                                           "yaml: line 3: mapping values are not allowed")), wants="cuda")
    assert any("`nvidia-ctk cdi list` exited 1: ERRO[0000] failed to load CDI spec" in p for p in broken.problems)
    stale = ap.judge(healthy(toolkit=(0, ""), cdi_list=(0, ""), cdi_specs=(0, spec())), runtime="podman",
                     wants="cuda")
    assert any(p.startswith("the CDI spec is stale: it lacks GPU 1") for p in stale.problems), stale.problems
    assert any("mounts driver 535.104.05 libraries but the driver is 550.54.15" in p for p in stale.problems)


@pytest.mark.parametrize(("toolkit", "level", "words"), [
    ("12.3.2", None, None),
    ("12.6", "warnings", "only by minor version compatibility (full support from 560.28.03)"),
    ("13.0", "problems", "driver 550.54.15 is older than CUDA 13.0 (the image's) needs: 580.65.06"),
])
def test_recorded_driver_against_the_images_cuda(toolkit, level, words):
    f = ap.judge(healthy(), toolkit_version=toolkit, wants="cuda")
    if level is None:
        assert f.problems == f.warnings == []
    else:
        assert any(words in m for m in getattr(f, level)), (f.problems, f.warnings)


def test_recorded_old_driver_under_a_cuda_12_image_is_a_problem():
    f = ap.judge(healthy(smi_xml=(0, rec("smi-v100x2-old.xml"))), toolkit_version="12.3.2", wants="cuda")
    assert any("driver 470.82.01 is older than CUDA 12.3.2 (the image's) needs: 545.23.08 "
               "(525.60.13 with minor version compatibility)" in p for p in f.problems), f.problems


def test_recorded_unhealthy_gpus_busy_gpus_xids_and_dcgm_are_named():
    f = ap.judge(healthy(smi_xml=(0, rec("smi-a100x2-faulty.xml")), smi_apps=(0, rec("smi-apps-busy.csv")),
                         xid=(0, rec("dmesg-xid.txt")), dcgm=(0, rec("dcgmi-health-fail.txt"))))
    problems, warnings = "\n".join(f.problems), "\n".join(f.warnings)
    assert "GPU 0 (00000000:07:00.0): 2 uncorrectable ECC errors" in problems
    assert "GPU 0 (00000000:07:00.0): a row remap is pending" in problems
    assert "GPU 0 (0000:07:00): Xid 79 (GPU has fallen off the bus)" in problems
    assert "GPU 1: DCGM health Failure: Memory system: Failure - A volatile double-bit ECC" in problems
    assert "GPU 1 is busy: python3 (pid 23188, 40211 MiB)" in warnings
    assert "GPU 1 (0000:0f:00): Xid 13 in the kernel log (a program's fault)" in warnings
    assert f.facts["busy"] == [1]
    old = ap.judge(healthy(smi_xml=(0, rec("smi-v100x2-old.xml"))))
    assert any("GPU 1 (00000000:3B:00.0): a retired memory page is pending" in p for p in old.problems)
    assert any("GPU 1 (00000000:3B:00.0): 2 memory pages retired" in w for w in old.warnings)


def test_recorded_driver_not_loaded_and_missing_driver():
    f = ap.judge({"smi_xml": (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                 "driver. Make sure that the latest NVIDIA driver is installed and running.")})
    assert f.problems == ["nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with "
                          "the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and "
                          "running. (is the NVIDIA driver loaded?)"]
    assert ap.judge({}).kind is None and ap.judge({}).problems == []
    (p,) = ap.judge({}, wants="cuda").problems
    assert p.startswith("no nvidia-smi on the node")


def test_recorded_cambricon_node():
    files = "/dev/cambricon_ctl\n/dev/cambricon_dev0\n/dev/cambricon_dev1\n"
    f = ap.judge({"mlu_devices": (0, files), "cnmon_info": (0, rec("cnmon-info-mlu370x2.txt"))}, wants="mlu")
    assert (f.kind, f.count, f.facts["driver"]) == ("mlu", 2, "v4.20.18")
    assert f.problems == ["MLU 1: 3 uncorrected ECC errors (cnmon): drain the node"]
    f = ap.judge({"mlu_devices": (0, "/dev/cambricon_dev0\n"), "cnmon_info": (0, rec("cnmon-info-mlu370x2.txt"))})
    assert "/dev/cambricon_ctl is missing: containers cannot reach the MLUs" in f.problems
    assert f.warnings == ["cnmon lists 2 MLUs but the node has 1 /dev/cambricon_dev* files"]
    f = ap.judge({"mlu_devices": (0, files)})
    assert f.count == 2 and f.warnings[0].startswith("no cnmon on the PATH")


def test_driver_table_is_the_published_one():
    cuda = accelerators.load().devices["cuda"]
    assert cuda.driver_needed("12.3.2") == ("545.23.08", "525.60.13")
    assert cuda.driver_needed("12.3") == ("545.23.06", "525.60.13")
    assert cuda.driver_needed("11.4.2") == ("470.57.02", "450.80.02")
    assert cuda.driver_needed("12.7") == (None, "525.60.13")    # no such release: not judged fully
    assert cuda.driver_needed("garbage") == (None, None)


def test_probe_script_prints_nothing_on_a_node_without_the_tools():
    """The real script, run by sh here (this machine has no nvidia-smi, cnmon or cambricon device)."""
    r = subprocess.run(["sh", "-c", ap.SCRIPT, "sh", "TOKEN"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert (r.returncode, r.stdout) == (0, "")


def test_the_images_cuda_from_nvidias_label_else_its_env():
    from clusterctl.cluster.preflight import image_cuda_version

    assert image_cuda_version({"Config": {"Labels": {"com.nvidia.cuda.version": "12.3.2.001"},
                                          "Env": ["CUDA_VERSION=12.3.0"]}}) == "12.3.2.001"
    assert image_cuda_version({"Config": {"Labels": None, "Env": ["PATH=/bin", "CUDA_VERSION=11.4.2"]}}) == "11.4.2"
    assert image_cuda_version({"Config": {"Env": ["PATH=/bin"]}}) is None and image_cuda_version({}) is None


# --------------------------------------------------------------------------- captured on an H200

def captured() -> dict[str, tuple[int, str]]:
    return ap.parse_parts("CCTOK", rec("captured-h200-probe.txt"))


def test_captured_h200_probe_parts_and_smi_xml():
    parts = captured()
    assert sorted(parts) == ["cdi_specs", "smi_apps", "smi_xml", "toolkit", "xid"]
    assert all(rc == 0 for rc, _ in parts.values())
    r = ap.parse_smi_xml(parts["smi_xml"][1])
    assert (r.driver, r.cuda) == ("580.159.04", "13.0")
    (g,) = r.gpus
    assert (g.index, g.name, g.bus_id, g.uuid) == (0, "NVIDIA H200", "00000000:00:06.0",
                                                   "GPU-8dd9049d-bcfd-97d6-d76f-3f62cfb13a38")
    # Hopper: ECC on and counted, page retirement N/A (row remapping instead), no remap pending
    assert (g.ecc_uncorrected, g.retired_pages, g.retirement_pending, g.remap_pending,
            g.remap_failure) == (0, None, False, False, False)
    assert g.processes == ((468, "python3"),)
    assert ap.parse_compute_apps(parts["smi_apps"][1]) == [
        ap.ComputeApp("GPU-8dd9049d-bcfd-97d6-d76f-3f62cfb13a38", 468, "python3", "1002 MiB")]


def test_captured_h200_judged_as_that_machine_was():
    """No container toolkit and no CDI spec on that machine: a GPU target cannot start there
    (Docker's --gpus, Podman's CDI names); the driver runs NGC 24.01's CUDA 12.3.2 and 13.0;
    the GPU was busy with another process; nothing else is wrong with it."""
    for runtime, words in (("docker", "no NVIDIA Container Toolkit"), ("podman", "no CDI spec names nvidia.com/gpu")):
        found = ap.judge(captured(), runtime=runtime, toolkit_version="12.3.2", wants="cuda")
        assert len(found.problems) == 1 and found.problems[0].startswith(words), found.problems
        assert found.warnings == ["GPU 0 is busy: python3 (pid 468, 1002 MiB) (another job? a run "
                                  "there shares its memory)"]
        assert (found.kind, found.count) == ("cuda", 1)
        assert found.facts["models"] == ["NVIDIA H200"] and found.facts["busy"] == [0]
    assert not ap.judge(captured(), toolkit_version="13.0", wants="cuda").warnings[1:]
    old = ap.judge(captured(), toolkit_version="13.0", wants=None)
    assert old.problems == [] and old.warnings[0].startswith("no NVIDIA Container Toolkit")


def test_processes_against_devices():
    one_gpu = {"kind": "cuda", "count": 1}
    (problem,) = ap.processes_findings(one_gpu, 2, wants="cuda", source="the job starts").problems
    assert problem.startswith("the job starts 2 processes here but the node has 1 GPU: each rank "
                              "takes the GPU of its LOCAL_RANK, so NCCL stops at the first collective "
                              "with 'Duplicate GPU detected'")
    assert problem.endswith("set the node's `slots: 1` (a job with nproc_per_node: slots) or NPROC_PER_NODE=1")
    idle = ap.processes_findings({"kind": "cuda", "count": 8}, 1, wants="cuda", source="`slots:` gives")
    assert idle.problems == [] and idle.warnings == [
        "`slots:` gives 1 process here but the node has 8 GPUs: 7 stay idle (set `slots: 8` with "
        "nproc_per_node: slots to use them all)"]
    mlu = ap.processes_findings({"kind": "mlu", "count": 2}, 4, wants="mlu", source="the job starts")
    assert "node has 2 MLUs" in mlu.problems[0] and "two ranks share one device" in mlu.problems[0]
    for accel, wants in ((one_gpu, None), (one_gpu, "mlu"), (None, "cuda"),
                         ({"kind": "cuda", "count": 0}, "cuda"), ({"kind": "cuda", "count": 2}, "cuda")):
        got = ap.processes_findings(accel, 2, wants=wants, source="x")
        assert got.problems == got.warnings == [], (accel, wants)
