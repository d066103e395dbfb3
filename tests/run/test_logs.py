"""Merged, prefixed logs: real threads, real files, real `docker logs --timestamps` text.

The live path (docker logs -f over SSH on sandbox nodes) is covered by
tests/run/test_launch.py; here the merge and prefix rules themselves.
"""

from __future__ import annotations

import io
import threading
import time

import pytest

from clusterctl.cluster.containers import split_timestamp
from clusterctl.run import logs
from clusterctl.run.records import RunRecord
from clusterctl.run.spool import Spool


def test_prefix_round_trips_through_parse():
    line = logs.prefix("node2", 1) + "loss=0.25 | step 3"
    assert line == "node2[1]| loss=0.25 | step 3"
    assert logs.parse_prefixed(line) == ("node2", 1, "loss=0.25 | step 3")
    assert logs.parse_prefixed("no prefix here") is None


def test_merger_keeps_each_threads_lines_whole_and_in_order(tmp_path):
    """Eight producer threads, 500 lines each: every line arrives once, unbroken, in its node's order."""
    nodes = {f"n{i}": i for i in range(8)}
    out = io.StringIO()
    sink = logs.LogSink(nodes, run_dir=tmp_path, stream=out, color=False)
    merger = logs.Merger(sink)

    def produce(node: str) -> None:
        cb = merger.callback(node)
        for k in range(500):
            cb(f"{node} line {k} " + "x" * (k % 37))

    threads = [threading.Thread(target=produce, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        merger.drain(timeout=0.01)
    for t in threads:
        t.join()
    merger.drain()
    sink.close()

    seen: dict[str, list[int]] = {n: [] for n in nodes}
    for line in out.getvalue().splitlines():
        node, rank, text = logs.parse_prefixed(line)
        assert rank == nodes[node]
        assert text.startswith(f"{node} line ")
        seen[node].append(int(text.split()[2]))
    assert all(seen[n] == list(range(500)) for n in nodes)
    # per-node files hold the raw lines; merged.log the same prefixed lines as the console
    assert (tmp_path / "n3.log").read_text().splitlines()[7] == "n3 line 7 " + "x" * 7
    assert (tmp_path / "merged.log").read_text() == out.getvalue()
    assert list(sink.last["n5"])[-1] == "n5 line 499 " + "x" * (499 % 37)
    assert len(sink.last["n5"]) == logs.KEEP_LAST


def test_wake_ends_a_waiting_drain_at_once_and_writes_nothing(tmp_path):
    """The supervisor's news (a rank exited) must not wait behind drain's timeout for output."""
    out = io.StringIO()
    sink = logs.LogSink({"n1": 0}, run_dir=tmp_path, stream=out, color=False)
    merger = logs.Merger(sink)
    threading.Timer(0.2, merger.wake).start()
    t0 = time.monotonic()
    assert merger.drain(timeout=30) == 0
    assert time.monotonic() - t0 < 10          # woken, not timed out
    merger.put("n1", "after the wake")
    merger.wake()
    assert merger.drain(timeout=30) == 1       # lines queued with a wake are still written
    sink.close()
    assert out.getvalue() == "n1[0]| after the wake\n"


def test_colour_on_a_terminal_keeps_text_verbatim(capsys):
    """Coloured output goes through rich; markup-like text must come out as written."""
    sink = logs.LogSink({"node1": 0}, stream=io.StringIO(), color=True)
    sink.write("node1", "[bold]not markup[/bold] 100%")
    assert "node1[0]| [bold]not markup[/bold] 100%" in capsys.readouterr().out


def test_docker_timestamps_sort_by_time_not_by_text():
    # docker trims trailing zeros of the nanoseconds: ".5Z" is later than ".123456789Z"
    a = split_timestamp("2026-11-22T04:30:01.5Z rank 1 done")
    b = split_timestamp("2026-11-22T04:30:01.123456789Z rank 0 done")
    assert a[1] == "rank 1 done" and b[1] == "rank 0 done"
    with Spool() as spool:
        for node, line in (("node1", a), ("node2", b)):
            spool.writer(node)(*line)
        assert list(spool.merged(["node1", "node2"])) == [("node2", "rank 0 done"),
                                                          ("node1", "rank 1 done")]
    assert split_timestamp("plain") == ("", "plain")


def _record(tmp_path, monkeypatch, nodes=("node1", "node2")) -> RunRecord:
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path))
    return RunRecord(run_id="r1", job="j", inventory="inv.yaml", image="img",
                     nodes=[{"node": n, "host": n, "rank": i, "container": f"c{i}"} for i, n in enumerate(nodes)])


def test_lines_from_files_tail_is_per_node_in_merged_order(tmp_path, monkeypatch):
    rec = _record(tmp_path, monkeypatch)
    sink = logs.LogSink({"node1": 0, "node2": 1}, run_dir=rec.dir)
    for i in range(5):
        sink.write("node1", f"a{i}")
        if i % 2:
            sink.write("node2", f"b{i}")
    sink.close()
    assert list(logs.lines_from_files(rec, tail=2)) == [
        ("node2", "b1"), ("node1", "a3"), ("node2", "b3"), ("node1", "a4")]
    assert list(logs.lines_from_files(rec, node="node2")) == [("node2", "b1"), ("node2", "b3")]


def test_spool_merges_nodes_by_time_keeps_each_nodes_order_and_leaves_no_file():
    """Three nodes' timestamped lines (one line with no timestamp, texts with tabs, quotes,
    newlines escaped by JSON): merged by time, ties by node, then the directory is gone."""
    lines = {
        "n2": [("2026-01-01T00:00:01.000000000", 'b "1"'), ("2026-01-01T00:00:03.000000000", "b\t3")],
        "n1": [("", "no stamp"), ("2026-01-01T00:00:02.000000000", "a 2"),
               ("2026-01-01T00:00:03.000000000", "a 3")],
        "n3": [],
    }
    with Spool() as spool:
        for node, got in lines.items():
            write = spool.writer(node)
            for key, text in got:
                write(key, text)
        directory = spool.dir
        assert list(spool.texts("n1")) == ["no stamp", "a 2", "a 3"]
        assert list(spool.merged(["n1", "n2", "n3"])) == [
            ("n1", "no stamp"), ("n2", 'b "1"'), ("n1", "a 2"), ("n1", "a 3"), ("n2", "b\t3")]
        write("x", "after the merge")        # a late writer: nothing breaks
    write("y", "after close")                 # dropped
    assert not directory.exists()


def test_lines_from_files_without_merged_log_reads_node_files(tmp_path, monkeypatch):
    rec = _record(tmp_path, monkeypatch)
    logs.save_node_log(rec, "node2", ["x", "y"])
    assert list(logs.lines_from_files(rec)) == [("node2", "x"), ("node2", "y")]


@pytest.mark.parametrize("tail", [None, 3])
def test_lines_from_files_streams_a_log_larger_than_it_keeps(tmp_path, monkeypatch, tail):
    """A 40 MB merged.log (a long run): reading it, with or without --tail, holds a few lines
    at a time, not the file (Python's own allocations traced; the old reader held it all)."""
    import tracemalloc
    rec = _record(tmp_path, monkeypatch)
    sink = logs.LogSink({"node1": 0, "node2": 1}, run_dir=rec.dir)
    filler = "x" * 1000
    for i in range(20_000):
        sink.write("node1" if i % 2 else "node2", f"{i} {filler}")
    sink.close()
    assert (rec.dir / logs.MERGED_LOG).stat().st_size > 20_000_000
    tracemalloc.start()
    try:
        count, last = 0, None
        for item in logs.lines_from_files(rec, tail=tail):
            count, last = count + 1, item
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == (20_000 if tail is None else 6)
    assert last == ("node1", f"19999 {filler}")
    assert peak < 2_000_000, f"{peak:,} bytes held while reading"


def test_a_full_merge_queue_makes_producers_wait_and_loses_nothing(tmp_path):
    """Backpressure, not buffering: with the writer stopped, a producer fills the bounded
    queue and then waits in put; once the writer drains again every line arrives, once,
    in order (issue 12: a chatty job must not grow clusterctl's memory, nor lose lines)."""
    out = io.StringIO()
    sink = logs.LogSink({"n1": 0}, run_dir=tmp_path, stream=out, color=False)
    merger = logs.Merger(sink, max_lines=50)
    produced: list[int] = []

    def produce() -> None:
        cb = merger.callback("n1")
        for k in range(2000):
            cb(f"line {k}")
            produced.append(k)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while merger.queue.qsize() < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert merger.queue.qsize() == 50 and len(produced) <= 51 and t.is_alive()  # waiting, not buffering
    while t.is_alive() or merger.queue.qsize():
        merger.drain(timeout=0.01)
    sink.close()
    assert out.getvalue().splitlines() == [f"n1[0]| line {k}" for k in range(2000)]
    assert (tmp_path / "n1.log").read_text().splitlines() == [f"line {k}" for k in range(2000)]


def test_drain_with_a_budget_returns_while_producers_keep_up(tmp_path):
    """A flood of lines must not keep the supervisor's drain from returning (its failures and
    Ctrl-C wait behind it): with a budget, drain returns although the queue never empties."""
    sink = logs.LogSink({"n1": 0}, stream=io.StringIO(), color=False)
    merger = logs.Merger(sink, max_lines=100)
    stop = threading.Event()

    def flood() -> None:
        k = 0
        while not stop.is_set():
            merger.put("n1", f"line {k}")
            k += 1

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    got: list[int] = []
    drainer = threading.Thread(target=lambda: got.append(merger.drain(timeout=1.0, budget=0.2)),
                               daemon=True)
    try:
        t0 = time.monotonic()
        drainer.start()
        drainer.join(10)
        took = time.monotonic() - t0
        assert not drainer.is_alive(), "drain kept writing while the producer kept up"
    finally:
        stop.set()
    assert got and got[0] > 0 and took < 5.0, (got, took)
