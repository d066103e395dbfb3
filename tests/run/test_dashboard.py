"""`clusterctl ui`'s server, fast tier: a real server on 127.0.0.1 over a runs directory of real
records (written by records' and logs' own code), asked over real HTTP.

Access (the Host check on loopback, the token elsewhere), what is never served (a record's
environment, a bad run id, anything reached through a link, a FIFO), the log's offsets, the
curves and /metrics from metrics lines.  The page itself in a real browser against a real run:
tests/run/test_dashboard_browser.py.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from clusterctl.cli import app
from clusterctl.core.errors import UserError
from clusterctl.run import logs, records
from clusterctl.run.dashboard import Dashboard, livetail, needs_token
from clusterctl.run.dashboard import files as dfiles

T0 = datetime.now(timezone.utc) - timedelta(minutes=5)
TOKEN = "tok-" + "x" * 40


def make(run_id: str, minutes: int = 0, nodes=("node1", "node2"), **kw) -> records.RunRecord:
    rec = records.RunRecord(
        run_id=run_id, job="ddp-smoke", inventory="/x/inv.yaml", image="img:1",
        started=T0 + timedelta(minutes=minutes), argv=["clusterctl", "launch", "--set", "K=v"],
        nodes=[records.NodeRecord(node=n, host=f"10.0.0.{11 + i}", rank=i, container=f"{run_id}-{n}",
                                  env={"HF_TOKEN": "****", "NODE_RANK": str(i)})
               for i, n in enumerate(nodes)], **kw)
    rec.save()
    return rec


def write_lines(rec: records.RunRecord, lines: list[tuple[str, str]]) -> None:
    """Lines as a followed launch writes them (runs/<id>/merged.log and <node>.log)."""
    sink = logs.LogSink({n.node: n.rank for n in rec.nodes}, run_dir=rec.attempt_dir())
    for node, text in lines:
        sink.write(node, text)
    sink.close()


@pytest.fixture
def served(runs_dir):
    started = []

    def serve(**kw) -> Dashboard:
        d = Dashboard(runs_dir, port=0, **kw).start()
        started.append(d)
        return d
    yield serve
    for d in started:
        d.close()


def ask(d: Dashboard, path: str, *, host: str | None = None, headers=None, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host or f"127.0.0.1:{d.port}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        body = r.read()
        return r.status, dict(r.getheaders()), body
    finally:
        conn.close()


def ask_json(d: Dashboard, path: str, **kw):
    status, _, body = ask(d, path, **kw)
    return status, json.loads(body)


def test_runs_table_and_a_run_never_carry_the_environment_or_command_line(served, runs_dir):
    make("older", 1, state="failed", exit_code=3,
         first_failure=records.FailureRecord(node="node2", rank=1, kind="exit", exit_code=3, time=T0))
    make("newer", 2, state="succeeded", exit_code=0)
    d = served()
    status, runs = ask_json(d, "/api/runs")
    assert status == 200
    assert [r["run"] for r in runs] == ["newer", "older"]
    assert runs[1]["why"] == "node2[1] exit 3" and runs[1]["state"] == "failed"
    status, run = ask_json(d, "/api/runs/older")
    assert status == 200
    assert [(n["node"], n["rank"], n["host"]) for n in run["nodes"]] == [
        ("node1", 0, "10.0.0.11"), ("node2", 1, "10.0.0.12")]
    assert run["first_failure"]["exit"] == "exit 3"
    assert run["attempts"][0]["state"] == "failed"
    for path in ("/api/runs", "/api/runs/older"):
        _, _, body = ask(d, path)
        assert b"HF_TOKEN" not in body and b"NODE_RANK" not in body and b"K=v" not in body


def test_bad_run_ids_are_refused_and_unknown_ones_not_found(served, runs_dir):
    make("a-run")
    d = served()
    for bad in ("..", ".hidden", "a%20b", "%2e%2e", "a;b", "-x"):
        status, body = ask_json(d, f"/api/runs/{bad}")
        assert status == 400, (bad, body)
        assert "run id" in body["error"]
    assert ask_json(d, "/api/runs/a-run/../../etc")[0] == 404   # no such route
    status, body = ask_json(d, "/api/runs/no-such-run")
    assert status == 404 and "no-such-run" in body["error"]
    assert ask_json(d, "/api/runs/a-run/log?after=-1")[0] == 400
    assert ask_json(d, "/api/runs/a-run/log?attempt=7")[0] == 404
    assert ask_json(d, "/api/runs/a-run/log?node=../run.json")[0] == 404
    assert ask(d, "/static/../server.py")[0] == 404
    assert ask(d, "/api/runs", method="POST")[0] == 405


def test_links_and_fifos_under_the_runs_dir_are_not_followed(served, runs_dir, tmp_path):
    rec = make("real")
    write_lines(rec, [("node1", "hello")])
    # a run directory that is a link to someone else's record
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "linked").mkdir(parents=True)
    (elsewhere / "linked" / "run.json").write_text(
        rec.model_copy(update={"run_id": "linked"}).model_dump_json())
    (runs_dir / "linked").symlink_to(elsewhere / "linked")
    # a merged.log replaced by a link to a private file, a node log that is a FIFO
    secret = tmp_path / "secret.txt"
    secret.write_text("node1[0]| THE SECRET\n")
    (runs_dir / "real" / "merged.log").unlink()
    (runs_dir / "real" / "merged.log").symlink_to(secret)
    (runs_dir / "real" / "node2.log").unlink(missing_ok=True)
    os.mkfifo(runs_dir / "real" / "node2.log")
    d = served()
    assert [r["run"] for r in ask_json(d, "/api/runs")[1]] == ["real"]
    status, body = ask_json(d, "/api/runs/linked")
    assert status == 403 and "link" in body["error"]
    status, body = ask_json(d, "/api/runs/real/log")
    assert status == 403 and "THE SECRET" not in json.dumps(body)
    status, body = ask_json(d, "/api/runs/real/log?node=node2")      # would block if opened
    assert status == 403 and "not a regular file" in body["error"]
    assert ask_json(d, "/api/runs/real/metrics")[0] == 403
    status, body = ask_json(d, "/api/runs/real/log?node=node1")
    assert status == 200 and body["lines"] == ["hello"]


def test_the_log_comes_from_offsets_in_bounded_pieces_complete_lines_only(served, runs_dir):
    rec = make("run1")
    write_lines(rec, [("node1", f"line {i}") for i in range(3)])
    d = served()
    status, first = ask_json(d, "/api/runs/run1/log?after=0")
    assert status == 200 and first["lines"] == [f"node1[0]| line {i}" for i in range(3)]
    merged = runs_dir / "run1" / "merged.log"
    assert first["next"] == merged.stat().st_size
    # a line still being written is not shown until its newline is there
    with open(merged, "a") as f:
        f.write("node2[1]| half")
    assert ask_json(d, f"/api/runs/run1/log?after={first['next']}")[1]["lines"] == []
    with open(merged, "a") as f:
        f.write(" done\n")
    again = ask_json(d, f"/api/runs/run1/log?after={first['next']}")[1]
    assert again["lines"] == ["node2[1]| half done"] and again["start"] == first["next"]
    # a big log: the tail without an offset, and at most CHUNK bytes per answer
    write_lines(rec, [("node1", "y" * 99)] * 8000)               # ~0.9 MB
    tail = ask_json(d, "/api/runs/run1/log")[1]
    assert 0 < tail["size"] - tail["start"] <= dfiles.TAIL and tail["next"] == tail["size"]
    assert all(line == "node1[0]| " + "y" * 99 for line in tail["lines"])
    piece = ask_json(d, "/api/runs/run1/log?after=0")[1]
    assert piece["next"] <= dfiles.CHUNK and piece["next"] < piece["size"]
    # a log rewritten shorter than the offset asked for (an adopted attempt): from its start
    merged.write_text("node1[0]| new\n")
    reset = ask_json(d, f"/api/runs/run1/log?after={piece['next']}")[1]
    assert reset["reset"] and reset["lines"] == ["node1[0]| new"]


def test_an_attempts_log_and_a_nodes_own_log(served, runs_dir):
    rec = make("restarted", attempt=1, attempts=[
        records.AttemptRecord(attempt=0, state="failed", nodes=[]),
        records.AttemptRecord(attempt=1, state="running", nodes=[])])
    rec.attempts[0].nodes = rec.attempts[1].nodes = rec.nodes
    rec.save()
    write_lines(rec.at_attempt(0), [("node1", "first try")])
    write_lines(rec, [("node2", "second try")])
    d = served()
    assert ask_json(d, "/api/runs/restarted/log")[1]["lines"] == ["node2[1]| second try"]
    assert ask_json(d, "/api/runs/restarted/log?attempt=0")[1]["lines"] == ["node1[0]| first try"]
    assert ask_json(d, "/api/runs/restarted/log?node=node2")[1]["lines"] == ["second try"]
    assert ask_json(d, "/api/runs/restarted/log?node=node9")[0] == 404
    run = ask_json(d, "/api/runs/restarted")[1]
    assert [a["state"] for a in run["attempts"]] == ["failed", "running"]


def metrics_line(rank: int, step: int, t: float, loss: float) -> str:
    return "clusterctl-metrics " + json.dumps(
        {"rank": rank, "step": step, "loss": loss, "samples": 64 * step, "time": t})


def test_curves_and_prometheus_from_the_metrics_lines(served, runs_dir):
    rec = make("training", state="running", detached=True, supervised=True)
    start = rec.started.timestamp()
    lines = []
    for step in range(1, 6):
        for rank, node in enumerate(("node1", "node2")):
            lines.append((node, metrics_line(rank, step, start + step, 1.0 / step + rank)))
        lines.append(("node1", f"some other output {step}"))
    write_lines(rec, lines)
    make("ended", -1, state="succeeded")
    d = served()
    status, m = ask_json(d, "/api/runs/training/metrics")
    assert status == 200 and m["nodes_total"] == 2
    n1 = m["nodes"]["node1"]
    assert n1["step"] == [1, 2, 3, 4, 5] and n1["loss"] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert n1["t"] == [2.0, 3.0, 4.0, 5.0] and n1["samples_per_s"] == [64.0] * 4
    assert m["nodes"]["node2"]["loss"][0] == 2.0
    # more lines: the next answer goes on from where the last read stopped
    write_lines(rec, [("node1", metrics_line(0, 6, start + 6, 0.1))])
    assert ask_json(d, "/api/runs/training/metrics")[1]["nodes"]["node1"]["step"][-1] == 6
    status, headers, body = ask(d, "/metrics")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'clusterctl_run_last_step{run="training",node="node1",rank="0"} 6' in text
    assert text.count("# TYPE clusterctl_run_loss gauge") == 1
    assert "ended" not in text and "node_up" not in text      # live runs; no node was asked


def test_on_loopback_a_foreign_host_header_is_refused(served, runs_dir):
    make("a-run")
    d = served()
    assert ask(d, "/api/runs")[0] == 200
    assert ask(d, "/api/runs", host=f"localhost:{d.port}")[0] == 200
    status, _, body = ask(d, "/api/runs", host=f"evil.example:{d.port}")   # DNS rebinding
    assert status == 401 and b"a-run" not in body
    status, headers, _ = ask(d, "/")
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]


def test_a_token_is_needed_off_loopback_and_checked_on_every_request(served, runs_dir):
    make("a-run")
    assert needs_token("0.0.0.0") and needs_token("10.1.2.3") and needs_token("::")
    assert not needs_token("127.0.0.1") and not needs_token("::1") and not needs_token("localhost")
    with pytest.raises(UserError, match="needs a token"):
        Dashboard(runs_dir, host="0.0.0.0", port=0)
    d = served(token=TOKEN)
    assert d.login_url.endswith(f"/?token={TOKEN}")
    for path in ("/", "/api/runs", "/api/runs/a-run", "/metrics", "/static/app.js"):
        status, _, body = ask(d, path)
        assert status == 401 and b"a-run" not in body, path
    assert ask(d, "/api/runs", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert ask(d, "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert ask(d, "/api/runs?token=" + TOKEN[:-1] + "y")[0] == 401
    # the page's first visit: the token goes into a cookie and out of the address
    status, headers, _ = ask(d, f"/?token={TOKEN}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
    assert ask(d, "/api/runs", headers={"Cookie": cookie})[0] == 200
    assert ask(d, "/api/runs", headers={"Cookie": cookie[:-1]})[0] == 401


def test_cli_ui_refuses_a_port_in_use_and_bad_options(runs_dir):
    runner = CliRunner()
    d = Dashboard(runs_dir, port=0)
    try:
        res = runner.invoke(app, ["ui", "--port", str(d.port)])
        assert res.exit_code == 2 and "cannot serve on 127.0.0.1" in res.output
    finally:
        d.close()
    assert runner.invoke(app, ["ui", "--port", "70000"]).exit_code == 2


def test_a_big_run_json_is_not_read_whole(served, runs_dir, monkeypatch):
    make("a-run")
    monkeypatch.setattr(dfiles, "RECORD_LIMIT", 100)
    d = served()
    status, body = ask_json(d, "/api/runs/a-run")
    assert status == 403 and "more than a run record" in body["error"]
    t0 = time.monotonic()
    assert ask_json(d, "/api/runs")[1] == []
    assert time.monotonic() - t0 < 5


def test_an_ipv6_loopback_is_served_without_a_token(runs_dir):
    make("a-run")
    try:
        d = Dashboard(runs_dir, host="::1", port=0).start()
    except UserError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    try:
        assert d.url == f"http://[::1]:{d.port}/" and d.token is None
        conn = http.client.HTTPConnection("::1", d.port, timeout=10)
        conn.request("GET", "/api/runs")          # Host: [::1]:PORT
        r = conn.getresponse()
        assert r.status == 200 and b"a-run" in r.read()
        conn.close()
    finally:
        d.close()


# --- a plain --detach run: followed from its nodes by the dashboard itself (livetail) ------

def test_a_ring_reads_like_a_file_that_forgets_its_beginning():
    ring = livetail.Ring(keep=100)
    empty = ring.read(None, limit=1000, tail=1000)
    assert (empty.lines, empty.start, empty.next, empty.reset) == ([], livetail.BASE, livetail.BASE, False)
    for i in range(30):
        ring.append(f"line {i:02d}")                # 8 bytes each with the newline
    kept = ring.read(None, limit=1000, tail=1000)
    assert kept.lines == [f"line {i:02d}" for i in range(18, 30)]    # 12 x 8 = 96 <= 100
    assert kept.next == kept.size == livetail.BASE + 30 * 8
    # from an offset it gave: the next lines, at most `limit` bytes, whole lines only
    part = ring.read(kept.start, limit=20, tail=1000)
    assert part.lines == ["line 18", "line 19"] and part.next == kept.start + 16
    assert ring.read(part.next, limit=1000, tail=1000).lines[0] == "line 20"
    assert ring.read(kept.next, limit=1000, tail=1000).lines == []
    # the tail is the last `tail` bytes' whole lines
    assert ring.read(None, limit=1000, tail=17).lines == ["line 28", "line 29"]
    # an offset it never gave (a file's, or one it has forgotten): from what it keeps, reset
    for stale in (0, 5000, livetail.BASE, kept.next + 1):
        again = ring.read(stale, limit=1000, tail=1000)
        assert again.reset and again.lines == kept.lines, stale
    # one line longer than `limit` still comes (a page never stalls on it)
    ring.append("x" * 300)
    assert ring.read(kept.next, limit=10, tail=1000).lines == ["x" * 300]


def test_only_the_callers_own_live_plain_detached_runs_over_ssh_are_followed(runs_dir):
    plain = make("plain-1", detached=True, state="running")
    assert livetail.wanted(plain)
    assert not livetail.wanted(make("sup-1", detached=True, supervised=True, state="running"))
    assert not livetail.wanted(make("fol-1", state="running"))                   # launch writes its files
    assert not livetail.wanted(make("end-1", detached=True, state="stopped"))
    assert not livetail.wanted(make("slurm-1", detached=True, state="running", scheduler="slurm"))
    other = make("other-1", detached=True, state="running")
    other.uid = os.geteuid() + 1
    assert not livetail.wanted(other)                          # another user's: their nodes, their identity


def test_a_plain_detached_runs_page_says_it_follows_the_nodes_and_names_a_node_it_cannot_reach(
        served, runs_dir):
    """The inventory the record names is gone: the live tail says so in the log, no traceback,
    and the page's JSON says where the output comes from."""
    rec = make("plain-2", detached=True, state="running")
    d = served()
    status, run = ask_json(d, "/api/runs/plain-2")
    assert status == 200 and run["output_from_nodes"] and not run["output_on_nodes"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, chunk = ask_json(d, "/api/runs/plain-2/log")
        assert status == 200, chunk
        if chunk["lines"]:
            break
        time.sleep(0.1)
    assert chunk["lines"] == [f"node1[0]| [clusterctl] cannot follow this run's nodes: "
                              f"{chunk['lines'][0].split(': ', 1)[1]}"]
    assert "/x/inv.yaml" in chunk["lines"][0]
    assert chunk["start"] >= livetail.BASE
    # a file offset is not one of its offsets: the page is told to start again
    status, again = ask_json(d, "/api/runs/plain-2/log?after=10")
    assert again["reset"] and again["lines"] == chunk["lines"]
    status, mine = ask_json(d, "/api/runs/plain-2/log?node=node2")
    assert status == 200 and mine["lines"] == []
    assert not (rec.dir / records.MERGED_LOG).exists()          # nothing written under runs/
    status, curves = ask_json(d, "/api/runs/plain-2/metrics")
    assert status == 200 and curves["nodes"] == {}


def test_the_how_to_page_states_the_live_tails_bounds():
    from pathlib import Path
    page = (Path(__file__).parents[2] / "docs/how-to/dashboard.md").read_text().replace("\n", " ")
    assert f"last {livetail.TAIL_LINES:,} lines" in page
    assert f"at most {livetail.KEEP_BYTES // 2**20} MB" in page
    assert f"for {livetail.IDLE_S:g} s is let go" in page


def test_a_record_another_user_planted_as_the_callers_is_neither_listed_nor_followed(served, runs_dir):
    """A group member writes runs/spoof/run.json saying uid/user are the caller's, a live plain
    detached run whose inventory is /etc/shadow: the dashboard makes the check `clusterctl
    runs` makes (the file's owner is the launcher), so it neither lists the run, nor serves
    it, nor follows it (which would read the planted inventory and reach its hosts)."""
    rec = make("spoof", detached=True, state="running")
    path = rec.dir / records.RECORD_NAME
    data = json.loads(path.read_text())
    data.update(inventory="/etc/shadow", uid=os.geteuid(), user="root")
    path.write_text(json.dumps(data))
    os.chown(path, 65534, 65534)                           # written by someone else
    os.chown(rec.dir, 65534, 65534)
    d = served()
    status, table = ask_json(d, "/api/runs")
    assert status == 200 and [r["run"] for r in table] == []
    for url in ("/api/runs/spoof", "/api/runs/spoof/log", "/api/runs/spoof/metrics"):
        status, body = ask_json(d, url)
        assert status == 403 and "not to be trusted" in body["error"], (url, body)
    assert d.live._tails == {}
    # the same record, renamed into another run's directory, is refused too
    os.chown(path, os.geteuid(), os.getegid())
    os.chown(rec.dir, os.geteuid(), os.getegid())
    os.rename(rec.dir, runs_dir / "other-1")
    status, body = ask_json(d, "/api/runs/other-1")
    assert status == 403 and "names run 'spoof'" in body["error"], body
