"""`clusterctl ui` in a real browser (Playwright driving Debian's Chromium) against a real run
on the 3-node sandbox: a detached, supervised ddp-smoke training that prints metrics lines.

The page must list the run, open it, show its three nodes, show the merged output growing
while the run goes, and draw the loss and throughput curves (their points growing, their
canvases painted).  With CLUSTERCTL_SCREENSHOTS=DIR the two screenshots of the how-to page
(docs/how-to/dashboard.md) are saved there: ``CLUSTERCTL_SCREENSHOTS=docs/how-to/img``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.docker, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
RUN_LINE = re.compile(r"run (\S+) is running detached, supervised by pid (\d+)")


def clusterctl(*args: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterctl", *args], capture_output=True,
                          text=True, timeout=300, env=env, **kw)


@pytest.fixture
def ui(runs_dir):
    """`clusterctl ui --port 0` in a process of its own; its printed URL."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "clusterctl", "ui", "--port", "0",
                             "--runs-dir", str(runs_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if m := re.match(r"open (http://127\.0\.0\.1:\d+/)$", line.strip()):
                url = m.group(1)
        assert url, f"clusterctl ui printed no URL (exit {proc.poll()})"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def painted(page, selector: str) -> int:
    """How many pixels of the chart's canvas are not blank."""
    return page.evaluate("""(sel) => {
        const c = document.querySelector(sel + " canvas");
        if (!c) return 0;
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++;
        return n;
    }""", selector)


def number(page, selector: str, attr: str) -> int:
    return int(page.get_attribute(selector, attr) or 0)


def wait_for_more(page, selector: str, attr: str, than: int, timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = number(page, selector, attr)
        if now > than:
            return now
        time.sleep(0.25)
    raise AssertionError(f"{selector} {attr} stayed at {number(page, selector, attr)} "
                         f"(wanted more than {than}) for {timeout} s")


def test_the_dashboard_follows_a_real_run_in_a_real_browser(clean_nodes, cpu_image, runs_dir, ui):
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), ("Debian's chromium is missing (apt-get install chromium; "
                                    "scripts/setup-host installs it)")
    env = {**os.environ}
    started = clusterctl(
        "launch", "ddp-smoke", "--nodes", str(clean_nodes.inventory_path), "--image", cpu_image,
        "--nproc-per-node", "1", "--hang-timeout", "5m", "--detach",
        "--set", "DDP_SMOKE_STEPS=60", "--set", "DDP_SMOKE_STEP_SECONDS=0.5",
        "--set", "DDP_SMOKE_PROGRESS=1", "--set", "DDP_SMOKE_METRICS=1", env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = RUN_LINE.search(started.stdout).group(1)
    shots = os.environ.get("CLUSTERCTL_SCREENSHOTS")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(ui)
            row = page.locator(f'#runs tbody tr[data-run="{run_id}"]')
            row.wait_for(timeout=30_000)
            assert "ddp-smoke" in row.inner_text()
            assert re.search(r"\b(starting|running)\b", row.inner_text()), row.inner_text()
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                box = page.locator("#runs").bounding_box()
                page.screenshot(path=f"{shots}/dashboard-runs.png",
                                clip={"x": 0, "y": 0, "width": 1400, "height": box["y"] + box["height"] + 24})
            row.click()
            page.wait_for_selector(f"#run-view:not([hidden]) #run-id:text('{run_id}')")
            page.locator("#nodes tbody tr").nth(2).wait_for(timeout=30_000)
            nodes = page.locator("#nodes tbody tr").all_inner_texts()
            assert [t.split()[0] for t in nodes] == list(clean_nodes.nodes), nodes
            assert "3 nodes" in page.inner_text("#run-facts")

            # the merged output grows while the run goes: the training's step lines come, then more
            step = re.compile(r"node\d\[\d\]\| rank \d step \d+/60")
            deadline = time.monotonic() + 180
            while not step.search(text := page.inner_text("#log")) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert step.search(text), text[-2000:]
            first = number(page, "#log", "data-lines")
            assert wait_for_more(page, "#log", "data-lines", first) > first
            # the curves are drawn from the metrics lines and grow too
            loss = wait_for_more(page, "#loss-chart", "data-points", 3)
            rate = wait_for_more(page, "#rate-chart", "data-points", 3)
            wait_for_more(page, "#loss-chart", "data-points", loss)
            wait_for_more(page, "#rate-chart", "data-points", rate)
            assert painted(page, "#loss-chart") > 500 and painted(page, "#rate-chart") > 500
            legend = page.inner_text("#loss-chart")
            assert all(f"{node}[" in legend for node in clean_nodes.nodes), legend
            if shots:
                page.screenshot(path=f"{shots}/dashboard-run.png", full_page=True)
            browser.close()
    finally:
        stopped = clusterctl("stop", run_id, env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_a_plain_detached_runs_output_and_curves_come_from_its_nodes(clean_nodes, cpu_image, runs_dir):
    """No supervisor writes runs/<id>/merged.log for a plain `launch --detach`: the dashboard
    follows the containers itself (livetail), writes nothing under runs/, and `stop` still
    keeps every node's whole output there, which the page then reads instead (reset)."""
    import http.client
    import json

    from clusterctl.run import records
    from clusterctl.run.dashboard import Dashboard

    started = clusterctl(
        "launch", "ddp-smoke", "--nodes", str(clean_nodes.inventory_path), "--image", cpu_image,
        "--nproc-per-node", "1", "--detach", "--set", "DDP_SMOKE_STEPS=400",
        "--set", "DDP_SMOKE_STEP_SECONDS=0.2", "--set", "DDP_SMOKE_PROGRESS=1",
        "--set", "DDP_SMOKE_METRICS=1", env={**os.environ})
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = re.search(r"run (\S+) started detached", started.stdout).group(1)
    d = Dashboard(runs_dir, port=0).start()
    d.live.idle = 4.0          # let go sooner than the 120 s default: checked below

    def get(path: str):
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    try:
        status, run = get(f"/api/runs/{run_id}")
        assert status == 200 and run["output_from_nodes"], run
        step = re.compile(r"^(node\d)\[\d\]\| rank \d step (\d+)/400")
        seen: dict[str, int] = {}
        after, lines = None, []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (len(seen) < 3 or min(seen.values()) < 10):
            status, chunk = get(f"/api/runs/{run_id}/log" + ("" if after is None else f"?after={after}"))
            assert status == 200 and not chunk["reset"], chunk
            lines += chunk["lines"]
            after = chunk["next"]
            for line in chunk["lines"]:
                if m := step.match(line):
                    seen[m.group(1)] = int(m.group(2))
            time.sleep(0.5)
        assert sorted(seen) == list(clean_nodes.nodes) and min(seen.values()) >= 10, (seen, lines[-20:])
        status, curves = get(f"/api/runs/{run_id}/metrics")
        assert sorted(curves["nodes"]) == list(clean_nodes.nodes), curves
        assert all(len(c["step"]) >= 3 for c in curves["nodes"].values()), curves
        status, node2 = get(f"/api/runs/{run_id}/log?node=node2")
        assert node2["lines"] and all("|" not in ln[:8] for ln in node2["lines"]), node2["lines"][:3]
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        conn.request("GET", "/metrics")
        prom = conn.getresponse().read().decode()
        conn.close()
        assert f'clusterctl_run_last_step{{run="{run_id}",node="node3"' in prom, prom
        run_dir = runs_dir / run_id
        assert not (run_dir / records.MERGED_LOG).exists()      # the dashboard wrote nothing
        # nobody asks for `idle` seconds: the run is let go (its streams end while it runs) ...
        tail = d.live._tails[run_id]
        assert tail.done.wait(30), "the idle run's streams were not let go"
        status, run = get(f"/api/runs/{run_id}")
        assert run["state"] == "running"
        # ... and followed again when asked: a new span, so the page's old offset resets it
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, again = get(f"/api/runs/{run_id}/log?after={after}")
            assert again["reset"], again
            if any(step.match(line) for line in again["lines"]):
                break
            time.sleep(0.5)
        assert d.live._tails[run_id] is not tail and any(step.match(x) for x in again["lines"]), again
        after = again["next"]
    finally:
        stopped = clusterctl("stop", run_id, env={**os.environ})
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    try:
        # stopped: its files now, each node's whole output from step 1 (the tail had it too)
        status, run = get(f"/api/runs/{run_id}")
        assert not run["output_from_nodes"] and run["state"] == "stopped", run
        status, chunk = get(f"/api/runs/{run_id}/log?after={after}")
        assert chunk["reset"] and chunk["start"] == 0, chunk
        text = (runs_dir / run_id / "node2.log").read_text()
        assert "step 1/400" in text and f"step {seen['node2']}/400" in text
    finally:
        d.close()
