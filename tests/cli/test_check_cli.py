"""`clusterctl check` through typer's CliRunner against a real sshd on loopback."""

from __future__ import annotations

import re
import subprocess

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from tests.fixtures.sshd import ENGINE_SOCKET, free_port

runner = CliRunner()


def _check(*args: str):
    return runner.invoke(app, ["check", *args])


def _row(output: str, node: str) -> list[str]:
    """The table cells of ``node``'s row."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == node:
            return cells
    raise AssertionError(f"no row for {node} in:\n{output}")


@pytest.mark.docker
def test_all_nodes_ready_is_exit_0_with_a_row_per_node(loopback_sshd):
    inv = loopback_sshd.write_inventory(nodes=2)
    r = _check("--nodes", str(inv))
    assert r.exit_code == 0, r.output
    version = subprocess.run(["docker", "-H", ENGINE_SOCKET, "version", "--format",
                              "{{.Server.Version}}"], capture_output=True, text=True,
                             check=True).stdout.strip()
    row = _row(r.output, "node1")
    assert row[:5] + row[6:] == ["node1", "127.0.0.1", "ok", version, _uname_m(), "-", "lo", "ok"]
    assert re.fullmatch(r"\d+\.\d (MiB|GiB|TiB)", row[5]), row[5]
    assert _row(r.output, "node2")[:4] == ["node2", "127.0.0.2", "ok", version]
    assert "all 2 nodes ready; master port 29500 free" in r.output


def _uname_m() -> str:
    import platform

    return platform.machine()


def test_a_node_that_fails_is_exit_1_and_named_with_its_reason(loopback_sshd):
    inv = loopback_sshd.write_inventory(nodes=[
        loopback_sshd.node("good", 0), loopback_sshd.node("gone", 1, port=free_port("127.0.0.2"))])
    r = _check("--nodes", str(inv), "--fanout", "1")
    assert r.exit_code == 1, r.output
    assert _row(r.output, "good")[-1] == "ok"
    assert _row(r.output, "gone")[2:4] == ["FAILED", "-"]
    assert "gone: connection refused to " in r.output
    assert "1 of 2 nodes not ready: gone" in r.output


def test_unknown_host_key_fails_until_accepted_with_the_flag(loopback_sshd):
    kh = loopback_sshd.empty_known_hosts()
    inv = loopback_sshd.write_inventory(nodes=1, known_hosts=kh)
    refused = _check("--nodes", str(inv))
    assert refused.exit_code == 1
    assert f"node1: host key unknown: [127.0.0.1]:{loopback_sshd.port}" in refused.output
    assert "--accept-new-host-keys" in refused.output
    assert kh.read_text() == ""
    accepted = _check("--nodes", str(inv), "--accept-new-host-keys")
    assert accepted.exit_code == 0, accepted.output
    assert f"[127.0.0.1]:{loopback_sshd.port} ssh-ed25519 " in kh.read_text()
    assert _check("--nodes", str(inv)).exit_code == 0  # strict again, now known


def test_changed_host_key_fails_even_with_the_flag(loopback_sshd):
    inv = loopback_sshd.write_inventory(nodes=1, known_hosts=loopback_sshd.wrong_known_hosts())
    r = _check("--nodes", str(inv), "--accept-new-host-keys")
    assert r.exit_code == 1
    assert "node1: host key CHANGED" in r.output


def test_target_devices_are_required(loopback_sshd):
    inv = loopback_sshd.write_inventory(nodes=[loopback_sshd.node("mlu", 0, slots=2)])
    r = _check("--nodes", str(inv), "--target", "cambricon")
    assert r.exit_code == 1
    assert _row(r.output, "mlu")[6] == "0/3 present"
    assert ("mlu: missing devices: /dev/cambricon_ctl, /dev/cambricon_dev0, /dev/cambricon_dev1"
            in r.output)
    assert _check("--nodes", str(inv), "--target", "cpu").exit_code == 0


def test_need_disk_compares_with_free_space(loopback_sshd):
    inv = loopback_sshd.write_inventory(nodes=1)
    assert _check("--nodes", str(inv), "--need-disk", "1M").exit_code == 0
    r = _check("--nodes", str(inv), "--need-disk", "4096T")
    assert r.exit_code == 1
    assert "need 4096.0 TiB" in r.output


@pytest.mark.parametrize("args, expected", [
    (["--need-disk", "lots"], "--need-disk 'lots' is not a size"),
    (["--target", "cambrican"], 'unknown target "cambrican" (did you mean "cambricon"?)'),
    (["--fanout", "0"], "--fanout"),
])
def test_bad_options_are_exit_2_and_contact_no_node(loopback_sshd, args, expected):
    inv = loopback_sshd.write_inventory(nodes=[loopback_sshd.node("x", 0, port=free_port())])
    r = _check("--nodes", str(inv), *args)
    assert r.exit_code == 2, r.output
    assert expected in r.output
    assert "connection refused" not in r.output  # stopped before connecting
    assert "Traceback" not in r.output


def test_bad_inventory_is_exit_2_with_file_and_line(tmp_path):
    inv = tmp_path / "bad.yaml"
    inv.write_text("nodes:\n  - host: 10.0.0.1\n    port: 99999\n")
    r = _check("--nodes", str(inv))
    assert r.exit_code == 2
    assert f"{inv}:3: nodes[0].port" in r.output
    assert "Traceback" not in r.output
    missing = _check("--nodes", str(tmp_path / "none.yaml"))
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_a_port_that_is_not_ssh_is_one_line_and_no_traceback_from_paramiko(loopback_sshd):
    """paramiko logs its thread's failures with tracebacks; a real process (not CliRunner,
    where pytest's log capture would hide them) must print only the one-line reason."""
    import socket
    import sys
    import threading

    with socket.socket() as http:
        http.bind(("127.0.0.2", 0))
        http.listen(8)

        def answer() -> None:
            conn, _ = http.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        inv = loopback_sshd.write_inventory(nodes=[
            loopback_sshd.node("good", 0),
            loopback_sshd.node("web", 1, port=http.getsockname()[1])])
        r = subprocess.run([sys.executable, "-m", "clusterctl", "check", "--nodes", str(inv),
                            "--connect-timeout", "5"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "web: no SSH server answered to " in r.stdout
    assert "Traceback" not in r.stderr and "Exception (client)" not in r.stderr, r.stderr


def _load_image(tag: str, arch: str, payload: bytes) -> None:
    """Load a one-layer image of architecture ``arch`` into the local engine (docker load of a
    hand-made docker-archive: the only way to get a foreign-architecture image offline)."""
    import hashlib
    import io
    import json
    import tarfile

    def tar_of(files: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_of({"payload": payload})
    config = json.dumps({"architecture": arch, "os": "linux", "config": {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}
                         }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag],
                            "Layers": ["layer/layer.tar"]}]).encode()
    archive = tar_of({"layer/layer.tar": layer, config_name: config, "manifest.json": manifest})
    subprocess.run(["docker", "-H", ENGINE_SOCKET, "load"], input=archive, check=True,
                   capture_output=True)


@pytest.mark.docker
def test_image_sets_the_architecture_and_the_disk_space_nodes_need(loopback_sshd):
    import platform
    import uuid

    from clusterctl.cluster.preflight import docker_arch

    here = docker_arch(platform.machine())
    other = "arm64" if here != "arm64" else "amd64"
    native, foreign = (f"clusterctl-test/check-{uuid.uuid4().hex[:10]}:{a}" for a in (here, other))
    _load_image(native, here, b"x" * 4096)
    _load_image(foreign, other, b"y" * 4096)
    try:
        inv = loopback_sshd.write_inventory(nodes=1)
        ok = _check("--nodes", str(inv), "--image", native)
        assert ok.exit_code == 0, ok.output
        wrong = _check("--nodes", str(inv), "--image", foreign)
        assert wrong.exit_code == 1
        assert (f"node1: architecture {platform.machine()} ({here}) cannot run {other} images"
                in wrong.output)
        too_big = _check("--nodes", str(inv), "--image", native, "--need-disk", "4096T")
        assert too_big.exit_code == 1 and "need 4096.0 TiB" in too_big.output
        missing = _check("--nodes", str(inv), "--image", native + "-absent")
        assert missing.exit_code == 2 and "is not in the local Docker engine" in missing.output
    finally:
        subprocess.run(["docker", "-H", ENGINE_SOCKET, "rmi", "-f", native, foreign],
                       capture_output=True)


def test_json_output_has_every_field_per_node(loopback_sshd):
    import json

    inv = loopback_sshd.write_inventory(nodes=[
        loopback_sshd.node("good", 0, devices=["/dev/null"]),
        loopback_sshd.node("gone", 1, port=free_port("127.0.0.2"))])
    r = runner.invoke(app, ["check", "--nodes", str(inv), "--json"])
    assert r.exit_code == 1
    good, gone = json.loads(r.stdout)
    assert good["node"] == "good" and good["ok"] is True and good["ssh"] is True
    assert good["devices"] == ["/dev/null"] and good["missing_devices"] == []
    assert good["interface"] == "lo" and good["address"] == "127.0.0.1"
    assert good["master_port_free"] is True and isinstance(good["free_bytes"], int)
    assert gone["ok"] is False and gone["ssh"] is False
    assert gone["problems"][0].startswith("connection refused")


def _stand_in_tools(bin_dir, fixtures) -> None:
    """nvidia-smi, nvidia-ctk, dcgmi and dmesg that print RECORDED output (tests/fixtures/accel):
    no GPU here, so these stand in for the vendor tools on a real sshd's PATH."""
    bin_dir.mkdir()
    tools = {
        "nvidia-smi": f'case "$1" in -q) cat {fixtures}/smi-a100x2-faulty.xml;; '
                      f'--query-compute-apps=*) cat {fixtures}/smi-apps-busy.csv;; *) exit 2;; esac',
        "nvidia-ctk": f'[ "$1 $2" = "cdi list" ] && cat {fixtures}/cdi-list.txt',
        "nvidia-container-runtime-hook": "exit 0",
        "dcgmi": f'cat {fixtures}/dcgmi-health-fail.txt',
        "dmesg": f'cat {fixtures}/dmesg-xid.txt',
    }
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)


@pytest.mark.docker
def test_gpu_problems_from_recorded_tool_output_on_a_real_sshd(tmp_path):
    """check on a real sshd whose PATH has stand-in NVIDIA tools printing recorded output:
    the probe runs for real over SSH, its findings are named per node and GPU."""
    from pathlib import Path

    from tests.fixtures.sshd import running_sshd

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "accel"
    _stand_in_tools(tmp_path / "bin", fixtures)
    with running_sshd(env={"PATH": f"{tmp_path / 'bin'}:/usr/local/bin:/usr/bin:/bin"}) as server:
        inv = server.write_inventory(nodes=[server.node("gpu1", 0)])
        r = _check("--nodes", str(inv), "--target", "nccl")
        assert r.exit_code == 1, r.output
        lines = r.output.splitlines()
        for expected in (
                "gpu1: GPU 0 (00000000:07:00.0): 2 uncorrectable ECC errors since the driver loaded",
                "gpu1: GPU 0 (00000000:07:00.0): a row remap is pending",
                "gpu1: GPU 0 (0000:07:00): Xid 79 (GPU has fallen off the bus)",
                "gpu1: GPU 1: DCGM health Failure: Memory system: Failure",
                "gpu1: warning: GPU 1 is busy: python3 (pid 23188, 40211 MiB)"):
            assert any(line.startswith(expected) for line in lines), (expected, r.output)
        js = runner.invoke(app, ["check", "--nodes", str(inv), "--json"])
        (node,) = __import__("json").loads(js.stdout)
        assert node["accelerator"]["kind"] == "cuda" and node["accelerator"]["busy"] == [1]
        assert node["accelerator"]["driver"] == "550.54.15"


@pytest.mark.docker
def test_captured_h200_node_more_ranks_than_gpus_on_a_real_sshd(tmp_path, runs_dir):
    """A node whose stand-in nvidia-smi prints what a real H200 machine's printed
    (tests/fixtures/accel/captured-h200-probe.txt; a container toolkit hook stands in too):
    `check --target nccl` warns that the inventory's `slots: 2` exceeds its one GPU, and a
    launch of ddp-smoke-nccl (nproc_per_node: slots) is refused before anything starts,
    quoting what NCCL said when two ranks were put on that GPU."""
    import uuid

    from clusterctl.cluster import accelprobe, containers
    from clusterctl.cluster.inventory import load_inventory
    from clusterctl.run import launch
    from clusterctl.run.jobs import load_job
    from tests.fixtures import REPO
    from tests.fixtures.sshd import running_sshd

    parts = accelprobe.parse_parts("CCTOK", (REPO / "tests" / "fixtures" / "accel" /
                                             "captured-h200-probe.txt").read_text())
    (tmp_path / "smi.xml").write_text(parts["smi_xml"][1])
    (tmp_path / "apps.csv").write_text(parts["smi_apps"][1])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {
            "nvidia-smi": f'case "$1" in -q) cat {tmp_path}/smi.xml;; '
                          f'--query-compute-apps=*) cat {tmp_path}/apps.csv;; *) exit 2;; esac',
            "nvidia-container-runtime-hook": "exit 0"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    with running_sshd(env={"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}) as server:
        inv = server.write_inventory(nodes=[server.node("gpu1", 0, slots=2)])
        r = _check("--nodes", str(inv), "--target", "nccl")
        assert r.exit_code == 0, r.output
        assert "gpu1: warning: `slots:` gives 2 processes here but the node has 1 GPU" in r.output, r.output
        assert "gpu1: warning: GPU 0 is busy: python3 (pid 468, 1002 MiB)" in r.output, r.output

        run_id = "gpu-count-" + uuid.uuid4().hex[:8]   # its record in the test's own runs/
        with pytest.raises(launch.PreflightFailed) as failed:
            launch.launch(load_job(REPO / "jobs" / "ddp-smoke-nccl.yaml"), load_inventory(inv),
                          push=False, run_id=run_id)
        text = str(failed.value)
        assert "preflight failed, nothing was started" in text
        assert ("the job starts 2 processes here but the node has 1 GPU: each rank takes the GPU "
                "of its LOCAL_RANK, so NCCL stops at the first collective with 'Duplicate GPU "
                "detected'") in text, text
        left = subprocess.run(["docker", "-H", ENGINE_SOCKET, "ps", "-aq", "--filter",
                               f"label={containers.RUN_LABEL}={run_id}"], capture_output=True, text=True, check=True)
        assert left.stdout == ""
