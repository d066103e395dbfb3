"""The classifier of collective-library errors in output lines (pure)."""

from __future__ import annotations

import pytest

from clusterctl.run.suspicious import SUSPICIOUS_EXIT, classify, findings, summary_lines

# Lines as the libraries print them (NCCL's and torch's wording, gloo's source paths).
ERRORS = [
    ("nccl", "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
             "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    ("nccl", "RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version 2.19.3"),
    ("nccl", "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."),
    ("nccl", "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
             "600058 milliseconds before timing out."),
    ("nccl", "[E ProcessGroupNCCL.cpp:916] [Rank 3] NCCL communicator was aborted on rank 3."),
    ("gloo", "rank 0 caught: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
             "[10.213.140.13]:38411"),
    ("gloo", "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
             "waiting 30000ms for recv operation to complete"),
    ("gloo", "terminate called after throwing an instance of 'gloo::EnforceNotMet'"),
    # torch 2.13's own wording, as the sandbox test's ranks printed it
    ("gloo", "rank 1 caught: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
             "error [10.213.140.13]:10970: Connection reset by peer. This is typically caused by a remote "
             "worker hanging or bugs in the application."),
    ("ccl", "2024:03:01-10:00:00:(1234) |CCL_ERROR| worker.cpp:353 ccl_worker_func: worker 0 caught internal exception"),
    ("cncl", "[ERROR][CNCL] CNCL error in: cncl_all_reduce, cnclInternalError"),
    ("accl", "ACCL ERROR: transport failed on rank 2"),
    ("torch.distributed", "torch.distributed.DistNetworkError: Connection reset by peer"),
]

# Lines a healthy run prints: none may count.
BENIGN = [
    "rank 0/6 node=0 local_rank=0 weights-sha256=ab12 steps=5 loss0=1.23",
    "ddp-smoke OK: 6 ranks on 3 nodes hold identical weights sha256=ab12 after 5 steps",
    "node1:123:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "node1:123:456 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0",
    "node1:123:456 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<1234> failed",
    "[W socket.cpp:464] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
    "error_count=0 while training the NCCL model",
    "Epoch 3: loss 0.123, errors 0",
]


@pytest.mark.parametrize(("library", "line"), ERRORS, ids=[f"{lib}-{i}" for i, (lib, _) in enumerate(ERRORS)])
def test_collective_errors_are_recognised_with_their_library(library, line):
    assert classify(line) == library


@pytest.mark.parametrize("line", BENIGN)
def test_healthy_output_and_warnings_are_not_errors(line):
    assert classify(line) is None


def test_findings_keep_the_first_lines_and_the_summary_names_exit_125():
    lines = [("node1", 0, BENIGN[0])] + [("node2", 1, ERRORS[5][1])] * 30
    found = findings(lines, keep=20)
    assert len(found) == 20 and found[0].node == "node2" and found[0].library == "gloo"
    text = summary_lines(found)
    assert SUSPICIOUS_EXIT == 125
    assert text[0].startswith("SUSPICIOUS: every container exited 0, but the output shows a "
                              "collective-library error (gloo); exit status 125")
    assert text[1] == f"  node2[1]| {ERRORS[5][1]}" and len(text) == 6
    assert summary_lines([]) == []


# What a slower node's torchrun agent printed after ddp-smoke SUCCEEDED on 16 sandbox nodes
# (issue 12): node rank 0's agent, which hosts the store, had left the exit barrier and
# exited; the agent logs the store's error and exits 0.  No collective was involved.
_P = "E1123 12:29:04.933000 1 torch/distributed/elastic/agent/server/api.py:1008]"
EXIT_BARRIER_REPORT = [
    "[W1123 12:29:04.902775167 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl("
    "fd=4, addr=[node8]:50574, remote=[node1]:29500): Failed to recv, got 0 bytes. Connection was "
    "likely closed. Did the remote server shutdown or crash?",
    "Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 "
    "(most recent call first):",
    "frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation, std::__cxx11::basic_string"
    "<char, std::char_traits<char>, std::allocator<char> >) + 0x72 (0x7f872a392022 in /usr/local/lib/"
    "python3.11/dist-packages/torch/lib/libc10.so)",
    f"{_P} Error waiting on exit barrier. Elapsed: 0.10817790031433105 seconds",
    f"{_P} Traceback (most recent call last):",
    f"{_P}     store.wait([last_member_key])",
    f"{_P} torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
    "closed. Did the remote server shutdown or crash?",
]


def test_torchruns_exit_barrier_report_is_no_collective_error():
    assert findings([("node8", 7, t) for t in EXIT_BARRIER_REPORT]) == []


def test_the_same_error_outside_the_exit_barrier_still_counts():
    # without the report's first line, the traceback's last line is an error like any other
    assert [f.library for f in findings([("node8", 7, EXIT_BARRIER_REPORT[-1])])] == ["torch.distributed"]
    # the report marks its own node's lines, not another node's
    lines = [("node8", 7, t) for t in EXIT_BARRIER_REPORT[:4]] + [("node2", 1, EXIT_BARRIER_REPORT[-1])]
    assert [f.node for f in findings(lines)] == ["node2"]
    # nor a later record of the same node (another time stamp)
    later = EXIT_BARRIER_REPORT[-1].replace("12:29:04.933000", "12:31:00.000001")
    assert len(findings([("node8", 7, t) for t in [*EXIT_BARRIER_REPORT, later]])) == 1
