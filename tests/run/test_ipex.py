"""The ipex target for real: torch 2.8.0 + Intel Extension for PyTorch 2.8.0 from PyPI, built on
the local Debian base from a wheelhouse, then bf16 training with IPEX over gloo on 2 sandbox nodes (a sandbox of the module's own).

oneCCL's bindings are a STAND-IN here (tests/fixtures/ccl_stand_in.py): the real
``oneccl_bind_pt`` wheel is served from Intel's index only, which this machine cannot reach.
The stand-in registers no ``ccl`` backend, so training runs over gloo (``--set BACKEND=gloo``).
Everything else is real: the IPEX wheel, ``ipex.optimize(..., dtype=torch.bfloat16)``, CPU
autocast, DDP across two nodes' containers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.run import records
from tests.fixtures.images import IPEX_TORCH
from tests.fixtures.sandbox import SandboxCluster, cluster_fields, held_sandbox, own_sandbox

runner = CliRunner()
NAME, SUBNET = own_sandbox("i", "h", 7)
#: what IPEX's bf16 weight prepack (``ipex.optimize(..., dtype=torch.bfloat16)``) needs of the
#: CPU, in IPEX's own words: "avx_ne_convert or avx512bw, avx512vl and avx512dq"
BF16_ANY, BF16_ALL = "avx_ne_convert", ("avx512bw", "avx512vl", "avx512dq")


def _cpu_lacks_bf16() -> list[str]:
    """What this machine's CPU (the sandbox nodes' too) lacks for IPEX's bf16; [] if nothing."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                  if line.startswith("flags")), set())
    missing = [f for f in BF16_ALL if f not in flags]
    return [] if BF16_ANY in flags or not missing else [BF16_ANY, *missing]


#: IPEX refuses bf16 weight prepack on a CPU without those (an AMD EPYC with AVX2 only, seen
#: on a CI machine: "BF16 weight prepack needs the cpu support ..."): hardware this machine
#: lacks, which no stand-in can replace.  A marker, so the skip comes before the image is
#: built for it.
needs_bf16_cpu = pytest.mark.skipif(
    bool(_cpu_lacks_bf16()),
    reason=f"IPEX's bf16 training needs a CPU with {BF16_ANY} or {', '.join(BF16_ALL)}; this "
           f"machine's has none of {', '.join(_cpu_lacks_bf16())}")


RANK_LINE = re.compile(r"rank (\d+)/(\d+) node=(\d+) local_rank=\d weights-sha256=([0-9a-f]{64})")


@pytest.fixture(scope="module")
def two_nodes(ipex_image) -> Iterator[Path]:
    """The inventory of a 2-node sandbox of the module's own (2 slots a node), removed after
    the module with the image on it. The ipex image is on both nodes before the first launch
    (``load_image``: one ``docker load`` of its 7.4 GB, the other node's store hard-linked),
    so the launches push nothing: the push is not these tests' subject, and a second 7.4 GB
    load cost CI about two minutes."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, daemons)")
    with held_sandbox(NAME, SUBNET, 2, slots=2) as raw:
        sb = SandboxCluster(**cluster_fields(raw))
        sb.load_image(ipex_image, list(sb.nodes))
        yield sb.inventory_path


@needs_bf16_cpu
@pytest.mark.docker
@pytest.mark.slow
def test_the_ipex_image_holds_ipex_and_names_its_ccl_bindings_as_a_stand_in(docker_client, ipex_image):
    """Real IPEX 2.8.0 on torch 2.8.0, bf16 kernels usable; the ccl module is the stand-in and says
    so; the entrypoint sourced the (stand-in) setvars.sh, as it sources oneCCL's real one."""
    probe = ("import os, torch, intel_extension_for_pytorch as ipex, oneccl_bindings_for_pytorch as ccl; "
             "lin = ipex.optimize(torch.nn.Linear(4, 2).eval(), dtype=torch.bfloat16); "
             "ctx = torch.autocast('cpu', dtype=torch.bfloat16); ctx.__enter__(); y = lin(torch.ones(1, 4)); "
             "print(torch.__version__, ipex.__version__, ccl.STAND_IN, os.environ.get('CLUSTERCTL_CCL_STAND_IN'), "
             "y.dtype, torch.distributed.is_backend_available('ccl'))")
    out = docker_client.containers.run(ipex_image, ["python3", "-c", probe], remove=True,
                                       network_mode="host").decode()
    torch_v, ipex_v, stand_in, sourced, dtype, has_ccl = out.split()[-6:]
    assert torch_v.startswith(IPEX_TORCH) and ipex_v.startswith(IPEX_TORCH), out
    assert (stand_in, sourced, dtype, has_ccl) == ("True", "1", "torch.bfloat16", "False"), out


@needs_bf16_cpu
@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_ipex_bf16_training_over_gloo_on_two_sandbox_nodes(two_nodes, ipex_image, runs_dir):
    """`clusterctl launch ddp-smoke-ipex` on 2 nodes x 2 processes: every rank trains with
    ipex.optimize(bf16) under CPU autocast, and all 4 end with identical weights."""
    res = runner.invoke(app, ["launch", "ddp-smoke-ipex", "--nodes", str(two_nodes), "--image", ipex_image,
                              "--set", "BACKEND=gloo", "--set", "STEPS=4"])
    assert res.exit_code == 0, res.output
    assert re.search(rf"ipex {re.escape(IPEX_TORCH)}\S* bf16: ipex.optimize done, parameters torch.bfloat16",
                     res.output), res.output
    ranks = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), m.group(4))
             for m in RANK_LINE.finditer(res.output)}
    assert sorted(ranks) == [0, 1, 2, 3], res.output
    assert {world for world, _, _ in ranks.values()} == {4}
    assert sorted(node for _, node, _ in ranks.values()) == [0, 0, 1, 1]
    assert len({digest for _, _, digest in ranks.values()}) == 1, res.output
    assert "ddp-smoke OK: 4 ranks on 2 nodes hold identical weights" in res.output, res.output
    record = records.list_runs()[0]
    assert record.exit_code == 0 and [n.exit_code for n in record.nodes] == [0, 0]


@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_ipex_job_on_the_ccl_backend_fails_where_the_bindings_are_stood_in(two_nodes, ipex_image, runs_dir):
    """The stand-in registers no ccl: the job's default backend (the target's) must fail, named,
    not quietly fall back to another backend."""
    res = runner.invoke(app, ["launch", "ddp-smoke-ipex", "--nodes", str(two_nodes), "--image", ipex_image])
    assert res.exit_code != 0, res.output
    # torch's own words (torch 2.8: "AssertionError: Unknown backend type ccl")
    assert re.search(r"Unknown (c10d )?backend type ccl", res.output, re.IGNORECASE), res.output
    assert "ddp-smoke OK" not in res.output, res.output


@pytest.mark.skipif(not _cpu_lacks_bf16(), reason="this machine's CPU has what IPEX's bf16 needs: "
                    "the bf16 training test above runs instead")
@pytest.mark.sandbox
@pytest.mark.docker
@pytest.mark.slow
def test_ipex_bf16_on_a_cpu_without_avx512_fails_with_ipexs_words_and_clusterctls_hint(
        two_nodes, ipex_image, runs_dir):
    """On a CPU that lacks what IPEX's bf16 weight prepack needs (this machine's, read from
    /proc/cpuinfo: real hardware, nothing stood in), the job fails at ipex.optimize on the
    nodes, and the report names the node and says why and what to do instead."""
    res = runner.invoke(app, ["launch", "ddp-smoke-ipex", "--nodes", str(two_nodes), "--image", ipex_image,
                              "--set", "BACKEND=gloo", "--set", "STEPS=1"])
    assert res.exit_code != 0, res.output
    assert "BF16 weight prepack needs the cpu support" in res.output, res.output
    hint = re.search(r'^hint: (node\d)\[(\d)\] printed "[^"]*BF16 weight prepack[^"]*"[^:]*: (.*)$',
                     res.output, re.M)
    assert hint, res.output
    assert "avx512bw" in hint.group(3) and "float32" in hint.group(3), hint.group(0)
    assert "ddp-smoke OK" not in res.output
