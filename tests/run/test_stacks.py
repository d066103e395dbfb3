"""The pure half of the hang watchdog: py-spy dumps -> signatures -> the odd ranks.

The dump texts are py-spy 0.4.3's format, as it printed them for the ranks of a real
ddp-smoke run on this machine (the sandbox test, tests/run/test_watchdog.py, takes them
from real processes); DUMP_SCRIPT itself runs for real against local processes here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from clusterctl.run.stacks import (
    DUMP_SCRIPT,
    RankStack,
    majority_frame,
    odd_ranks,
    parse_dump,
    signature,
    stack_file_name,
    stack_file_text,
)

WAITING = '''Process {pid}: /usr/bin/python3 -u /opt/clusterctl/examples/ddp_smoke.py
Python v3.11.2 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:865)
    backward (torch/autograd/__init__.py:364)
    backward (torch/_tensor.py:630)
    train (ddp_smoke.py:142)
    main (ddp_smoke.py:185)
    <module> (ddp_smoke.py:222)
Thread {other} (idle): "Thread-1"
    wait (threading.py:{line})
'''

STOPPED = '''Process 77: /usr/bin/python3 -u /opt/clusterctl/examples/ddp_smoke.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 77 (idle): "MainThread"
    stop_here (ddp_smoke.py:120)
    train (ddp_smoke.py:136)
    main (ddp_smoke.py:185)
    <module> (ddp_smoke.py:222)
'''


def rank(r: int, text: str, state: str = "S (sleeping)", node: str | None = None, **kw) -> RankStack:
    return RankStack(node=node or f"node{r // 2 + 1}", pid=100 + r, rank=r, local_rank=r % 2,
                     state=state, text=text, **kw)


def waiting(r: int) -> str:
    # thread ids, idle/active and the lines of other threads differ between ranks doing the same
    return WAITING.format(pid=100 + r, other=900 + r, line=300 + r)


def test_signature_is_the_main_threads_frames_without_ids():
    sig = signature(waiting(0))
    assert sig == signature(waiting(5))
    assert sig[0] == "_engine_run_backward (torch/autograd/graph.py:865)"
    assert sig[-1] == "<module> (ddp_smoke.py:222)"
    assert signature(STOPPED)[0] == "stop_here (ddp_smoke.py:120)"
    assert signature("") is None and signature("Process 1: x\nPython v3.11\n") is None


def test_the_stopped_rank_is_named_and_only_it():
    stacks = [rank(r, waiting(r)) for r in range(6) if r != 3] + [rank(3, STOPPED, "T (stopped)")]
    odd = odd_ranks(stacks)
    assert [(o.stack.node, o.stack.rank) for o in odd] == [("node2", 3)]
    assert "process stopped (T (stopped))" in odd[0].reason
    assert "differs from the majority (5 of 6 ranks): in stop_here (ddp_smoke.py:120)" in odd[0].reason
    assert majority_frame(stacks) == "_engine_run_backward (torch/autograd/graph.py:865)"


def test_a_rank_elsewhere_is_named_even_when_it_runs():
    elsewhere = waiting(2).replace("train (ddp_smoke.py:142)", "train (ddp_smoke.py:150)")
    stacks = [rank(r, waiting(r) if r != 2 else elsewhere) for r in range(4)]
    assert [(o.stack.rank, o.reason.split(":")[0]) for o in odd_ranks(stacks)] == [
        (2, "stack differs from the majority (3 of 4 ranks)")]


def test_a_rank_that_could_not_be_dumped_is_named():
    stacks = [rank(r, waiting(r)) for r in range(3)] + [rank(3, "", error="py-spy dump took longer than 20s")]
    [odd] = odd_ranks(stacks)
    assert odd.stack.rank == 3 and "no stack (py-spy dump took longer than 20s)" in odd.reason


def test_no_majority_names_only_stopped_or_undumped_ranks():
    # 2 ranks, 1 against 1: neither stack is "the majority"
    two = [rank(0, waiting(0)), rank(1, STOPPED)]
    assert odd_ranks(two) == [] and majority_frame(two) is None
    two[1] = rank(1, STOPPED, "T (stopped)")
    assert [o.stack.rank for o in odd_ranks(two)] == [1]
    # all the same: nobody stands out
    assert odd_ranks([rank(r, waiting(r)) for r in range(6)]) == []


def test_files_are_named_per_node_and_rank_and_say_how_they_were_read():
    s = rank(3, STOPPED, "T (stopped)", mode="nonblocking", cmd="python3 ddp_smoke.py")
    assert stack_file_name(s) == "node2-rank3.txt"
    assert stack_file_name(RankStack(node="n1", pid=42)) == "n1-pid42.txt"
    text = stack_file_text(s)
    assert text.startswith("# node node2, rank 3, local rank 1, pid 103\n# state: T (stopped); "
                           "py-spy dump --nonblocking (the process could not be suspended)")
    assert text.endswith(STOPPED)


def test_parse_dump_names_an_image_without_py_spy_and_bad_output():
    d = parse_dump("node1", json.dumps({"py_spy": False, "processes": []}), "me/img:1")
    assert d.error.startswith("py-spy is not installed in the image me/img:1: images clusterctl builds "
                              "carry it")
    assert "no result (Traceback" in parse_dump("node1", "Traceback (most recent call last)").error
    assert "no rank process" in parse_dump("node1", json.dumps({"py_spy": True, "processes": []})).error
    d = parse_dump("node2", json.dumps({"py_spy": True, "processes": [
        {"pid": 7, "rank": "3", "local_rank": "1", "state": "T (stopped)", "stack": STOPPED,
         "error": "", "mode": "nonblocking", "cmd": "x"}]}))
    assert d.stacks == (RankStack("node2", 7, 3, 1, "T (stopped)", STOPPED, "", "nonblocking", "x"),)


def _py_spy() -> str | None:
    import shutil

    return shutil.which("py-spy")


@pytest.mark.skipif(_py_spy() is None, reason="py-spy is not on this machine's PATH (it is in the images)")
def test_dump_script_finds_ranks_and_reads_a_stopped_one(tmp_path):
    """DUMP_SCRIPT on real processes: two "ranks" (LOCAL_RANK set), one stopped, and a child
    of a rank (a DataLoader worker inherits LOCAL_RANK) that must not count as a rank."""
    code = ("import os, subprocess, sys, time\n"
            "if os.environ.get('CHILD') is None and os.environ['RANK'] == '0':\n"
            "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " env=dict(os.environ, CHILD='1'))\n"
            "def wait_in_collective():\n    time.sleep(60)\n"
            "wait_in_collective()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": str(r),
                                                                   "LOCAL_RANK": str(r)})
             for r in range(2)]
    try:
        time.sleep(2)
        os.kill(procs[1].pid, signal.SIGSTOP)
        out = subprocess.run([sys.executable, "-c", DUMP_SCRIPT, "20"], capture_output=True, text=True,
                             timeout=120).stdout
        dump = parse_dump("here", out)
        mine = [s for s in dump.stacks if s.pid in {p.pid for p in procs}]
        assert len(mine) == 2 and len(dump.stacks) == 2, dump   # the child is not a rank
        by_rank = {s.rank: s for s in mine}
        assert by_rank[1].stopped and by_rank[1].mode == "nonblocking"
        assert by_rank[0].mode == "blocking" and not by_rank[0].stopped
        for s in mine:
            assert signature(s.text)[0].startswith("wait_in_collective ("), s
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()


def test_the_hang_summary_names_the_odd_rank_or_says_why_none():
    from clusterctl.run.stacks import NodeDump
    from clusterctl.run.watchdog import HangReport

    stacks = [rank(r, waiting(r)) for r in range(6) if r != 3] + [rank(3, STOPPED, "T (stopped)")]
    report = HangReport(timeout=90, silent_for=90.04, last_output=0, detected=90,
                        dumps=[NodeDump("node1", tuple(stacks))], odd=odd_ranks(stacks),
                        majority=majority_frame(stacks), dump_seconds=2.0)
    text = "\n".join(report.summary_lines())
    assert text.startswith("HANG: no rank wrote output for 1m30s (--hang-timeout 1m30s); "
                           "stacks of 6 rank processes dumped with py-spy in 2.0s")
    assert "the majority waits in _engine_run_backward (torch/autograd/graph.py:865)" in text
    assert "ranks not with the majority:\n  node2 rank 3 (pid 103): process stopped (T (stopped))" in text
    # torchrun agents still importing torch: no rank process yet, different stacks, nobody odd
    agents = [RankStack(node=f"node{i}", pid=1, state="R (running)",
                        text=WAITING.format(pid=1, other=2, line=i).replace("train (", f"import{i} ("))
              for i in range(3)]
    early = HangReport(timeout=30, silent_for=30, last_output=0, detected=30,
                       dumps=[NodeDump("node1", tuple(agents))], odd=odd_ranks(agents),
                       majority=majority_frame(agents))
    text = "\n".join(early.summary_lines())
    assert "no rank process was found" in text and "no majority: the stacks differ" in text
    assert "every rank's stack is the same" not in text
    missing = HangReport(timeout=30, silent_for=30, last_output=0, detected=30,
                         dumps=[NodeDump("node2", error="py-spy is not installed in the image x")])
    assert "NO STACKS from node2: py-spy is not installed in the image x" in missing.summary_lines()


@pytest.mark.docker
def test_dump_script_under_docker_init_dumps_the_rank_not_tini(docker_client, cpu_image):
    """launch starts containers with `docker run --init`: tini is PID 1 with the container's
    whole environment (LOCAL_RANK included when the job sets it), and must not be taken for
    the rank; the python process under it is dumped, with the ptrace capability the
    watchdog's containers get."""
    code = "import time\ndef wait_in_collective():\n    time.sleep(120)\nwait_in_collective()\n"
    box = docker_client.containers.run(cpu_image, ["python3", "-c", code], detach=True, init=True,
                                       environment={"RANK": "0", "LOCAL_RANK": "0"},
                                       cap_add=["SYS_PTRACE"], network_mode="none")
    try:
        time.sleep(3)
        res = box.exec_run(["python3", "-c", DUMP_SCRIPT, "20"])
        dump = parse_dump("here", res.output.decode())
        pid1 = box.exec_run(["cat", "/proc/1/comm"]).output.decode().strip()
        assert pid1 in ("docker-init", "tini"), pid1
        assert len(dump.stacks) == 1 and dump.stacks[0].pid != 1, dump
        assert dump.stacks[0].rank == 0 and not dump.stacks[0].error, dump
        assert signature(dump.stacks[0].text)[0].startswith("wait_in_collective ("), dump
    finally:
        box.remove(force=True)
