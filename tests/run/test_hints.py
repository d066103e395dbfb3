"""Known causes of a failure in a rank's output, and the failure report's hint (pure)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from clusterctl.run import hints, supervise
from tests.fixtures import REPO

ABORT = "terminate called without an active exception"


def test_the_line_as_libstdcxx_prints_it_has_a_cause_and_healthy_lines_none():
    advice = hints.match(ABORT)
    assert advice is not None and "os._exit(0)" in advice and "destroy_process_group" in advice
    assert hints.match(f"[default0]:{ABORT}") == advice            # torchrun --tee's prefix
    for line in ("rank 0/4 weights-sha256=4afb0496a0ddfce8", "terminate called after throwing an instance "
                 "of 'gloo::EnforceNotMet'", "exitcode  : -6 (pid: 9)  (SIGABRT)", ""):
        assert hints.match(line) is None, line


@pytest.mark.parametrize(("shown", "above"), [([], True), ([ABORT, "exitcode -6"], False)])
def test_the_hint_says_whether_its_line_is_among_the_lines_shown(shown, above):
    hint = hints.Hint("node1", 0, ABORT, hints.match(ABORT))
    (line,) = hints.hint_lines(hint, shown)
    assert line.startswith(f'hint: node1[0] printed "{ABORT}"')
    assert (", above the lines shown: " in line) is above
    assert hints.hint_lines(None, shown) == []


def _outcome(known: dict[str, hints.Hint]) -> supervise.Outcome:
    when = datetime(2026, 11, 26, 19, 7, 3, tzinfo=timezone.utc)
    first = supervise.Failure("node1", 0, "exit", 1, when.timestamp())
    last = [f"torchrun report line {i}" for i in range(20)]
    return supervise.Outcome(1, "failed", first, [first], {"node1": 1, "node2": 143}, {},
                             last_lines={"node1": last}, known_causes=known)


def test_the_failure_report_adds_the_first_failures_hint_after_its_last_lines():
    plain = supervise.summary_lines(_outcome({}))
    other = supervise.summary_lines(_outcome({"node2": hints.Hint("node2", 1, ABORT, hints.match(ABORT))}))
    assert other == plain and not any(s.startswith("hint:") for s in plain)   # another node's: not shown
    found = supervise.summary_lines(_outcome({"node1": hints.Hint("node1", 0, ABORT, hints.match(ABORT))}))
    at = found.index("  torchrun report line 19") + 1
    assert found[:at] == plain[:at] and found[at].startswith('hint: node1[0] printed "terminate called')
    assert found[at + 1:] == plain[at:]


def test_every_hint_names_a_section_of_the_troubleshooting_page():
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^#+ (.+)$", page, re.M))
    for _, advice in hints.HINTS:
        named = re.findall(r'troubleshooting: "([^"]+)"', advice)
        assert named and all(n in headings for n in named), (advice, sorted(headings))


IPEX_BF16 = ("AssertionError: BF16 weight prepack needs the cpu support avx_ne_convert or avx512bw, "
             "avx512vl and avx512dq")


def test_ipexs_bf16_refusal_on_an_avx2_cpu_names_the_instructions_and_the_float32_way():
    """IPEX 2.8's own words (seen on an AMD EPYC with AVX2 only), torchrun's prefix or not."""
    advice = hints.match(IPEX_BF16)
    assert advice is not None and advice != hints.match(ABORT)
    assert "avx512bw" in advice and "float32" in advice and "ddp-smoke" in advice
    assert hints.match(f"[default1]:{IPEX_BF16}") == advice
    assert hints.match("ipex 2.8.0 bf16: ipex.optimize done, parameters torch.bfloat16") is None


DUPLICATE = "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60"


def test_nccl_duplicate_gpu_names_local_rank_and_the_processes():
    """NCCL 2.28.9's line as two ranks on one H200 printed it (docs/how-to/gpu-mlu-nodes.md)."""
    advice = hints.match(DUPLICATE)
    assert advice is not None and advice not in (hints.match(ABORT), hints.match(IPEX_BF16))
    assert "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))" in advice
    assert "CUDA_VISIBLE_DEVICES" in advice
    assert hints.match("[rank0]: Last error:") is None
