// clusterctl ui: the runs table and one run's page, polled from the JSON API.
// Every value from a record or a log is put in the page as text (textContent), never as HTML.
"use strict";

const RUNS_EVERY_MS = 2000, RUN_EVERY_MS = 2000, LOG_EVERY_MS = 1000, ENDED_EVERY_MS = 10000;
const KEEP_LINES = 5000;           // lines kept in the page; older ones are dropped
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#0a7ea4", "#bf3989", "#57606a"];

const $ = (id) => document.getElementById(id);
let timers = [];
let view = null;                   // the run shown: {id, logNext, charts, live, ...}

function clearTimers() { timers.forEach(clearTimeout); timers = []; }
function later(fn, ms) { timers.push(setTimeout(fn, ms)); }

async function get(url) {
  const r = await fetch(url, {credentials: "same-origin", cache: "no-store"});
  if (r.status === 401) throw new Error("not allowed: open the URL `clusterctl ui` printed (with its token)");
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || (r.status + " " + r.statusText));
  return data;
}

function showError(e) {
  const p = $("error");
  p.hidden = !e;
  p.textContent = e ? String(e.message || e) : "";
}

function stamp() { $("updated").textContent = "updated " + new Date().toLocaleTimeString(); }

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function stateCell(tr, state) {
  const td = cell(tr, "");
  const span = document.createElement("span");
  span.className = "state state-" + String(state).split(" ")[0];
  span.textContent = state;
  td.appendChild(span);
}

function short(iso) { return iso ? iso.replace("T", " ").slice(0, 19) : ""; }

// ------------------------------------------------------------------ the runs table

async function showRuns() {
  try {
    const runs = await get("/api/runs");
    const body = $("runs").tBodies[0];
    body.replaceChildren();
    for (const r of runs) {
      const tr = document.createElement("tr");
      tr.dataset.run = r.run;
      const a = document.createElement("a");
      a.href = "#/run/" + encodeURIComponent(r.run);
      a.textContent = r.run;
      cell(tr, "").appendChild(a);
      cell(tr, r.user); cell(tr, r.job); cell(tr, r.nodes);
      stateCell(tr, r.state); cell(tr, r.exit); cell(tr, r.started); cell(tr, r.finished); cell(tr, r.why);
      tr.addEventListener("click", () => { location.hash = "#/run/" + encodeURIComponent(r.run); });
      body.appendChild(tr);
    }
    $("runs-empty").hidden = runs.length > 0;
    stamp();
    showError(null);
  } catch (e) { showError(e); }
  later(showRuns, RUNS_EVERY_MS);
}

// ------------------------------------------------------------------ one run

function showDetail(d) {
  $("run-id").textContent = d.run;
  const st = $("run-state");
  st.textContent = d.state + (d.exit !== "" ? " (exit " + d.exit + ")" : "");
  st.className = "state state-" + d.state_word;
  const facts = [d.job, "user " + (d.user || "?"), d.nodes.length + " nodes", "image " + d.image,
                 "started " + d.started + " UTC"];
  if (d.finished) facts.push("finished " + d.finished + " UTC");
  if (d.master) facts.push("master " + d.master);
  if (d.code) facts.push("code " + d.code);
  $("run-facts").textContent = facts.join(" · ");
  const notes = [];
  if (d.note) notes.push(d.note);
  if (d.why && d.why !== d.note) notes.push(d.why);
  if (d.output_from_nodes) notes.push("A detached run without a supervisor: this page follows its output " +
      "from the nodes while it is open (each node's latest lines; `clusterctl logs " + d.run + "` has them all).");
  if (d.output_on_nodes) notes.push("Another user's detached run without a supervisor: its output stays on the " +
      "nodes until its owner's `clusterctl logs " + d.run + "` or `clusterctl stop " + d.run + "`; this page shows what runs/ holds.");
  if (d.first_failure) {
    const f = d.first_failure;
    notes.push("first failure: " + f.node + "[" + f.rank + "] " + f.exit + (f.reason ? ": " + f.reason : ""));
  }
  $("run-note").hidden = notes.length === 0;
  $("run-note").textContent = notes.join("\n");

  const nodes = $("nodes").tBodies[0];
  nodes.replaceChildren();
  for (const n of d.nodes) {
    const tr = document.createElement("tr");
    tr.dataset.node = n.node;
    cell(tr, n.node); cell(tr, n.host); cell(tr, n.rank); stateCell(tr, n.state);
    cell(tr, n.exit ? n.exit.replace(/^exit /, "") : ""); cell(tr, short(n.started)); cell(tr, short(n.finished));
    nodes.appendChild(tr);
  }
  const attempts = $("attempts").tBodies[0];
  attempts.replaceChildren();
  for (const a of d.attempts) {
    const tr = document.createElement("tr");
    cell(tr, a.attempt); stateCell(tr, a.state); cell(tr, a.nodes.join(", ")); cell(tr, a.ended); cell(tr, a.then);
    attempts.appendChild(tr);
  }
}

async function pollRun(v) {
  if (view !== v) return;
  try {
    const d = await get("/api/runs/" + encodeURIComponent(v.id));
    if (view !== v) return;
    v.live = d.live;
    showDetail(d);
    stamp();
    showError(null);
  } catch (e) { showError(e); }
  later(() => pollRun(v), v.live === false ? ENDED_EVERY_MS : RUN_EVERY_MS);
}

function appendLines(v, lines) {
  const pre = $("log");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  const frag = document.createDocumentFragment();
  for (const line of lines) {
    const m = /^([^\s[\]|]+\[\d+\]\| ?)(.*)$/.exec(line);
    if (m) {
      const pfx = document.createElement("span");
      pfx.className = "pfx";
      pfx.textContent = m[1];
      frag.appendChild(pfx);
      frag.appendChild(document.createTextNode(m[2] + "\n"));
    } else {
      frag.appendChild(document.createTextNode(line + "\n"));
    }
  }
  pre.appendChild(frag);
  v.lines += lines.length;
  // drop the oldest lines beyond KEEP_LINES (a prefix span and its text node, or a text node)
  let extra = v.lines - KEEP_LINES;
  while (extra > 0 && pre.firstChild) {
    const first = pre.firstChild;
    if (first.nodeType === Node.ELEMENT_NODE && first.nextSibling) pre.removeChild(first.nextSibling);
    pre.removeChild(first);
    v.lines -= 1; extra -= 1;
  }
  pre.dataset.lines = String(v.seen += lines.length);
  if ($("follow").checked && (atBottom || v.first)) pre.scrollTop = pre.scrollHeight;
  v.first = false;
}

async function pollLog(v) {
  if (view !== v) return;
  let more = false;
  try {
    const q = v.logNext == null ? "" : "?after=" + v.logNext;
    const chunk = await get("/api/runs/" + encodeURIComponent(v.id) + "/log" + q);
    if (view !== v) return;
    if (chunk.reset) { $("log").replaceChildren(); v.lines = 0; }
    if (chunk.lines.length) appendLines(v, chunk.lines);
    v.logNext = chunk.next;
    more = chunk.next < chunk.size;
  } catch (e) {
    if (!/^no /.test(e.message)) showError(e);     // no merged.log (yet): nothing to show
  }
  later(() => pollLog(v), more ? 50 : (v.live === false ? ENDED_EVERY_MS : LOG_EVERY_MS));
}

function joined(nodes, xKey, yKey) {
  // uPlot wants one x array and, per series, a y array aligned with it (null: no point)
  const names = Object.keys(nodes);
  const xs = [...new Set(names.flatMap((n) => nodes[n][xKey]))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  for (const n of names) {
    const ys = new Array(xs.length).fill(null);
    nodes[n][xKey].forEach((x, i) => { ys[at.get(x)] = nodes[n][yKey][i]; });
    data.push(ys);
  }
  return {names, data, points: names.reduce((s, n) => s + nodes[n][yKey].length, 0)};
}

function drawChart(v, key, el, xLabel, yLabel, j) {
  el.dataset.points = String(j.points);
  const sig = j.names.join(",");
  const width = Math.max(300, el.clientWidth || 500);
  if (!v.charts[key] || v.charts[key].sig !== sig) {
    if (v.charts[key]) v.charts[key].plot.destroy();
    const series = [{label: xLabel}].concat(j.names.map((n, i) => ({
      label: n + "[" + v.ranks[n] + "]", stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
    })));
    const plot = new uPlot({width, height: 220, scales: {x: {time: false}},
                            axes: [{label: xLabel}, {label: yLabel}], series}, j.data, el);
    v.charts[key] = {plot, sig};
  } else {
    v.charts[key].plot.setData(j.data);
  }
}

async function pollMetrics(v) {
  if (view !== v) return;
  try {
    const m = await get("/api/runs/" + encodeURIComponent(v.id) + "/metrics");
    if (view !== v) return;
    const nodes = m.nodes;
    v.ranks = Object.fromEntries(Object.entries(nodes).map(([n, c]) => [n, c.rank]));
    const any = Object.keys(nodes).length > 0;
    $("no-metrics").hidden = any;
    if (any) {
      drawChart(v, "loss", $("loss-chart"), "step", "loss", joined(nodes, "step", "loss"));
      drawChart(v, "rate", $("rate-chart"), "seconds", "samples/s", joined(nodes, "t", "samples_per_s"));
    }
  } catch (e) { showError(e); }
  later(() => pollMetrics(v), v.live === false ? ENDED_EVERY_MS : RUN_EVERY_MS);
}

function openRun(id) {
  const v = {id, logNext: null, lines: 0, seen: 0, first: true, charts: {}, ranks: {}, live: null};
  view = v;
  $("log").replaceChildren();
  $("log").dataset.lines = "0";
  for (const el of [$("loss-chart"), $("rate-chart")]) { el.replaceChildren(); el.dataset.points = "0"; }
  pollRun(v); pollLog(v); pollMetrics(v);
}

// ------------------------------------------------------------------ routing

function route() {
  clearTimers();
  view = null;
  const m = /^#\/run\/(.+)$/.exec(location.hash);
  $("runs-view").hidden = !!m;
  $("run-view").hidden = !m;
  if (m) openRun(decodeURIComponent(m[1])); else showRuns();
}

$("where").textContent = location.host;
window.addEventListener("hashchange", route);
route();
