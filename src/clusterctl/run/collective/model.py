"""The collective check's numbers and its verdict: pure functions, no node, no I/O.

* :func:`round_robin`: the pairwise rounds (every pair of nodes meets once; the pairs
  of one round are disjoint, so each round measures every node's link at once), and
  :func:`pair_rounds`, the first few of them, which is what the check runs by default;
* :func:`bus_bandwidth`: nccl-tests' formula for all_reduce,
  ``busbw = algbw * 2(n-1)/n`` with ``algbw = bytes / seconds``;
* :func:`parse_probe_output`: the probe's ``CLUSTERCTL-PROBE {json}`` lines -> one
  node's :class:`NodeReport`;
* :func:`measure`: every node's report -> :class:`Measurements` (per size the
  slowest rank of each iteration, then the median iteration; the pair matrix);
* :func:`decide`: measurements + :class:`Thresholds` -> :class:`Verdict`, which names
  the slow or broken nodes.

How a node is judged (:func:`decide`): its *score* is the bus bandwidth of its BEST
pair.  A healthy node has at least one healthy partner, so its best pair is fast; a
node with a slow link is slow with every partner (dlrover's network check reasons the
same way: a node slow in both of its rounds is the faulty one).  A node is slow when its
score is below ``min_busbw`` (absolute) or more than ``max_slowdown`` times below the
median score (relative).  With two nodes there is one pair and the two cannot be told
apart: both are named, and the verdict says so.

How many rounds: a node needs only a few partners, not all of them.  With R rounds
(:data:`DEFAULT_PAIR_ROUNDS` = 3) each node meets R different partners (R - 1 for the
one resting in a round when n is odd), so with up to R - 1 slow nodes every healthy node
still has a healthy partner; the check costs R pair rounds at any node count, not n - 1
(7 at 8 nodes, 499 at 500).  A node named slow whose partners were all slow too might be
healthy (it never met a good partner): the verdict says so by name, and ``--pair-rounds
all`` (every pair) tells it apart.

Out of budget (the check's ``budget``): a probe whose time was up says in which phase and
with which peer (``budget``).  A node judged on the pairs it finished is judged as above;
a node that finished no pair but had one cut short is slow ("no pair finished within the
budget", naming the pair): a link that cannot move one message in the time given is slow
whatever the other figures say.  Sizes of the all-node all_reduce left out to stay within
the budget are listed (``skipped``), the verdict is on the sizes measured.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MARK = "CLUSTERCTL-PROBE "

OK, SLOW, BROKEN, STOPPED = "ok", "slow", "broken", "not measured"

#: Pair rounds the check runs by default (each node meets this many partners).
DEFAULT_PAIR_ROUNDS = 3


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint rank pairs in which every pair of ``n`` ranks meets exactly once
    (the circle method: n-1 rounds for even n, n rounds for odd n, one rank resting)."""
    if n < 2:
        return []
    ranks: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ranks)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ranks[i], ranks[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds


def pair_rounds(n: int, limit: int | None = DEFAULT_PAIR_ROUNDS) -> list[list[tuple[int, int]]]:
    """The first ``limit`` rounds of :func:`round_robin` (None: all of them, every pair)."""
    rounds = round_robin(n)
    return rounds if limit is None else rounds[:limit]


def bus_bandwidth(nbytes: int, seconds: float, n: int) -> float:
    """all_reduce bus bandwidth in bytes/s, as nccl-tests computes it: algbw * 2(n-1)/n."""
    if seconds <= 0 or n < 2:
        return 0.0
    return nbytes / seconds * 2 * (n - 1) / n


@dataclass
class NodeReport:
    """What one node's probe said, and how its container ended."""

    node: str
    rank: int
    exit_code: int | None = None        # None: no exit seen (could not be started, lost)
    start_error: str | None = None      # why the node's container never ran the probe (the whole reason)
    versions: dict = field(default_factory=dict)
    joined: float | None = None          # seconds to form the process group
    world: dict[int, list[float]] = field(default_factory=dict)   # bytes -> seconds per iteration
    pairs: dict[int, list[float]] = field(default_factory=dict)   # peer rank -> seconds per iteration
    pair_bytes: int | None = None
    error: str | None = None             # the probe's own error ("phase: message")
    done: bool = False
    stopped: bool = False                # torn down because another node failed
    out_of_budget: str | None = None     # the phase its probe was in when the budget was up
    unfinished_peer: int | None = None   # the peer of the pair all_reduce it began and did not finish
    skipped: dict[int, float] = field(default_factory=dict)  # size left out -> predicted seconds
    tail: list[str] = field(default_factory=list)  # last lines that were not probe lines
    timeline: dict[str, float] = field(default_factory=dict)  # phase -> seconds since the probe began


def parse_probe_output(node: str, rank: int, text: str, tail: int = 8) -> NodeReport:
    """One node's container output -> NodeReport (unknown or broken lines are kept as tail)."""
    r = NodeReport(node=node, rank=rank)
    other = []
    for line in text.splitlines():
        if not line.startswith(MARK):
            if line.strip():
                other.append(line)
            continue
        try:
            rec = json.loads(line[len(MARK):])
        except ValueError:
            other.append(line)
            continue
        kind = rec.get("kind")
        if isinstance(rec.get("at"), int | float):
            r.timeline[str(kind)] = float(rec["at"])
        if kind == "versions":
            r.versions = {k: v for k, v in rec.items() if k != "kind"}
        elif kind == "joined":
            r.joined = float(rec["seconds"])
        elif kind == "world":
            r.world[int(rec["bytes"])] = [float(s) for s in rec["seconds"]]
        elif kind == "measuring":
            r.unfinished_peer = int(rec["peer"])
        elif kind == "pair":
            r.pairs[int(rec["peer"])] = [float(s) for s in rec["seconds"]]
            r.pair_bytes = int(rec["bytes"])
            r.unfinished_peer = None
        elif kind == "skipped":
            r.skipped[int(rec["bytes"])] = float(rec.get("predicted") or 0.0)
        elif kind == "budget":
            r.out_of_budget = str(rec.get("phase", "?"))
            if rec.get("peer") is not None:
                r.unfinished_peer = int(rec["peer"])
        elif kind == "error":
            r.error = f"{rec.get('phase', '?')}: {rec.get('error', '?')}"
        elif kind == "done":
            r.done = True
    r.tail = other[-tail:]
    return r


@dataclass(frozen=True)
class SizeResult:
    """The all_reduce across every node at one message size."""

    nbytes: int
    seconds: float      # median iteration of the slowest rank
    algbw: float        # bytes/s
    busbw: float        # bytes/s


@dataclass
class Measurements:
    nodes: list[str]                                   # rank order
    world: list[SizeResult] = field(default_factory=list)
    pair_bytes: int | None = None
    pairs: dict[tuple[int, int], float] = field(default_factory=dict)   # (a<b) -> busbw bytes/s
    reports: dict[str, NodeReport] = field(default_factory=dict)
    unfinished: set[tuple[int, int]] = field(default_factory=set)  # pairs the budget cut short
    skipped: list[int] = field(default_factory=list)   # sizes left out to stay within the budget


def _slowest_median(per_rank: Sequence[Sequence[float]]) -> float | None:
    """Median over iterations of the slowest rank's time in each iteration."""
    per_rank = [s for s in per_rank if s]
    if not per_rank:
        return None
    iters = min(len(s) for s in per_rank)
    return statistics.median(max(s[i] for s in per_rank) for i in range(iters))


def measure(reports: Sequence[NodeReport]) -> Measurements:
    """Combine every node's report: per size the slowest rank per iteration (a collective
    ends when its last rank ends), the median iteration; per pair the same over its two."""
    reports = sorted(reports, key=lambda r: r.rank)
    n = len(reports)
    m = Measurements(nodes=[r.node for r in reports], reports={r.node: r for r in reports})
    sizes = sorted({b for r in reports for b in r.world})
    for nbytes in sizes:
        if not all(nbytes in r.world for r in reports):
            continue  # a rank that did not finish this size: no figure for the whole
        t = _slowest_median([r.world[nbytes] for r in reports])
        if t:
            m.world.append(SizeResult(nbytes, t, nbytes / t, bus_bandwidth(nbytes, t, n)))
    by_rank = {r.rank: r for r in reports}
    for r in reports:
        for peer, secs in r.pairs.items():
            a, b = sorted((r.rank, peer))
            if (a, b) in m.pairs or peer not in by_rank:
                continue
            other = by_rank[peer].pairs.get(r.rank)
            t = _slowest_median([secs, other] if other else [secs])
            if t and r.pair_bytes:
                m.pairs[(a, b)] = bus_bandwidth(r.pair_bytes, t, 2)
                m.pair_bytes = r.pair_bytes
    for r in reports:
        if r.out_of_budget and r.unfinished_peer in by_rank and r.unfinished_peer != r.rank:
            pair = tuple(sorted((r.rank, r.unfinished_peer)))
            if pair not in m.pairs:
                m.unfinished.add(pair)
    m.skipped = sorted({b for r in reports for b in r.skipped} - {s.nbytes for s in m.world})
    return m


@dataclass(frozen=True)
class Thresholds:
    """When a node counts as slow.  ``min_busbw`` (bytes/s): absolute, for each node's
    best pair and for the all-node bus bandwidth at the largest size; ``max_slowdown``:
    relative, a node whose best pair is more than this many times below the median
    node's is slow."""

    min_busbw: float | None = None
    max_slowdown: float = 3.0


@dataclass
class NodeVerdict:
    node: str
    rank: int
    status: str                      # ok, slow, broken, not measured
    score: float | None = None       # best pair's bus bandwidth, bytes/s
    reason: str = ""


@dataclass
class Verdict:
    ok: bool
    nodes: list[NodeVerdict]
    reference: float | None          # the median node score, bytes/s
    busbw: float | None              # all nodes, the largest size, bytes/s
    message: str                     # one line, naming the nodes

    @property
    def named(self) -> list[str]:
        return [v.node for v in self.nodes if v.status in (SLOW, BROKEN)]


def decide(m: Measurements, t: Thresholds) -> Verdict:
    """The verdict from the measurements alone (see the module docstring)."""
    reports = [m.reports[n] for n in m.nodes]
    verdicts = {r.node: NodeVerdict(r.node, r.rank, OK) for r in reports}
    broken = []
    for r in reports:
        why = _broken_reason(r, reports)
        if why:
            verdicts[r.node].status, verdicts[r.node].reason = BROKEN, why
            broken.append(r.node)
    scores: dict[str, float] = {}
    for r in reports:
        mine = [bw for (a, b), bw in m.pairs.items() if r.rank in (a, b)]
        if mine:
            scores[r.node] = max(mine)
            verdicts[r.node].score = scores[r.node]
    for r in reports:
        # out of budget after a pair finished: judged on its pairs like the others
        if verdicts[r.node].status == OK and (r.stopped or not r.done) and not (
                r.out_of_budget and not r.stopped and not broken and r.node in scores):
            verdicts[r.node].status = STOPPED
            verdicts[r.node].reason = ("stopped when " + ", ".join(broken) + " failed") if broken \
                else (f"the budget was up in {r.out_of_budget}" if r.out_of_budget
                      else r.error or "did not finish")
    busbw = m.world[-1].busbw if m.world else None
    reference = statistics.median(scores.values()) if scores else None
    slow = []
    if not broken and scores:
        for name, score in scores.items():
            why = []
            if t.min_busbw is not None and score < t.min_busbw:
                why.append(f"best pair {fmt_rate(score)} < --min-busbw {fmt_rate(t.min_busbw)}")
            if reference and score * t.max_slowdown < reference:
                why.append(f"best pair {fmt_rate(score)} is {reference / score:.1f}x below the "
                           f"median node's {fmt_rate(reference)} (--max-slowdown {t.max_slowdown:g})")
            if why:
                verdicts[name].status, verdicts[name].reason = SLOW, "; ".join(why)
                slow.append(name)
    if not broken:
        # no pair finished within the budget, one was cut short: at least that slow
        for r in reports:
            peers = sorted(b if a == r.rank else a for (a, b) in m.unfinished if r.rank in (a, b))
            if r.node in scores or not peers:
                continue
            verdicts[r.node].status = SLOW
            size = f" of {fmt_bytes(m.pair_bytes)}" if m.pair_bytes else ""
            verdicts[r.node].reason = (
                f"no pair finished within the budget: its pair all_reduce{size} with "
                f"{', '.join(m.nodes[p] for p in peers)} was cut short in "
                f"{r.out_of_budget or 'its probe'}")
            slow.append(r.node)
    total_low = (not broken and t.min_busbw is not None and busbw is not None
                 and busbw < t.min_busbw)
    nodes = list(verdicts.values())
    if broken:
        msg = f"broken: {', '.join(broken)} (" + "; ".join(
            f"{n}: {verdicts[n].reason}" for n in broken) + ")"
    elif slow:
        msg = f"slow: {', '.join(slow)}"
        if len(m.nodes) == 2:
            msg += " (2 nodes share the only pair: either may be the slow one)"
        else:
            unsure = _unsure(m, slow)
            for name in unsure:
                verdicts[name].reason += "; every partner it met was slow too: it may be healthy"
            if unsure:
                msg += (f" ({', '.join(unsure)}: every partner {'it' if len(unsure) == 1 else 'each'} "
                        "met was slow too, so it may be healthy; --pair-rounds all meets every pair)")
    elif total_low:
        msg = (f"bus bandwidth {fmt_rate(busbw)} across all {len(m.nodes)} nodes is below "
               f"--min-busbw {fmt_rate(t.min_busbw)}, and no single node stands out")
    elif busbw is None or any(v.status != OK for v in nodes):
        msg = "no measurement: " + "; ".join(f"{v.node}: {v.reason}" for v in nodes if v.status != OK)
        return Verdict(False, nodes, reference, busbw, msg)
    else:
        msg = (f"all {len(m.nodes)} nodes healthy: all_reduce bus bandwidth {fmt_rate(busbw)} "
               f"at {fmt_bytes(m.world[-1].nbytes)}")
        if m.skipped:
            msg += (f" ({', '.join(fmt_bytes(b) for b in m.skipped)} left out: would not fit "
                    "in the budget)")
        return Verdict(True, nodes, reference, busbw, msg)
    return Verdict(False, nodes, reference, busbw, msg)


def _unsure(m: Measurements, slow: Sequence[str]) -> list[str]:
    """The slow nodes that never met a partner judged healthy: a healthy node whose partners
    were all slow looks slow too, so for these the check cannot tell (more pair rounds can)."""
    rank = {name: i for i, name in enumerate(m.nodes)}
    slow_ranks = {rank[name] for name in slow}
    unsure = []
    for name in slow:
        me = rank[name]
        partners = {b if a == me else a for (a, b) in [*m.pairs, *m.unfinished] if me in (a, b)}
        if partners and partners <= slow_ranks:
            unsure.append(name)
    return unsure


def _broken_reason(r: NodeReport, reports: Sequence[NodeReport]) -> str | None:
    """Why this node is broken, or None.  A node is broken when its container could not
    start, when it failed while its peers were still fine, or when it never joined the
    process group that the others formed."""
    if r.start_error:
        return r.start_error
    if r.stopped or r.out_of_budget:
        return None   # stopped for another's failure, or its time was up: not its own fault
    others = [o for o in reports if o is not r]
    if r.joined is None and any(o.joined is not None for o in others):
        return "did not join the process group" + (f" ({r.error})" if r.error else "")
    if r.error and not any(o.error for o in others):
        return r.error
    if r.error and r.joined is None and all(o.joined is None for o in others):
        return None  # nobody joined: reported as "no measurement"
    if r.exit_code not in (None, 0) and r.error is None and not r.done:
        return f"container exited {r.exit_code}" + (f": {r.tail[-1]}" if r.tail else "")
    return None


# --------------------------------------------------------------------------- units

def fmt_rate(bps: float | None) -> str:
    """bytes/s -> '1.23 GB/s' (decimal units, as nccl-tests prints GB/s)."""
    if bps is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} B/s"


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def to_json(m: Measurements, v: Verdict, t: Thresholds, **extra) -> dict:
    """Everything the check measured and decided, as JSON-able data."""
    return {
        **extra,
        "ok": v.ok,
        "message": v.message,
        "thresholds": {"min_busbw": t.min_busbw, "max_slowdown": t.max_slowdown},
        "busbw": v.busbw,
        "reference": v.reference,
        "world": [{"bytes": s.nbytes, "seconds": s.seconds, "algbw": s.algbw, "busbw": s.busbw}
                  for s in m.world],
        "pair_bytes": m.pair_bytes,
        "matrix": [{"a": m.nodes[a], "b": m.nodes[b], "busbw": bw}
                   for (a, b), bw in sorted(m.pairs.items())],
        "unfinished": [{"a": m.nodes[a], "b": m.nodes[b]} for (a, b) in sorted(m.unfinished)],
        "skipped": m.skipped,
        "nodes": [{"node": x.node, "rank": x.rank, "status": x.status, "score": x.score,
                   "reason": x.reason, "versions": m.reports[x.node].versions,
                   "joined_s": m.reports[x.node].joined,
                   "timeline": m.reports[x.node].timeline, "exit_code": m.reports[x.node].exit_code,
                   "out_of_budget": m.reports[x.node].out_of_budget}
                  for x in v.nodes],
    }


def matrix_rows(m: Measurements) -> list[list[float | None]]:
    """Node-by-node bus bandwidth (bytes/s), rank order; None on the diagonal and for a pair
    not measured."""
    n = len(m.nodes)
    rows: list[list[float | None]] = [[None] * n for _ in range(n)]
    for (a, b), bw in m.pairs.items():
        rows[a][b] = rows[b][a] = bw
    return rows


__all__ = [
    "BROKEN", "DEFAULT_PAIR_ROUNDS", "MARK", "OK", "SLOW", "STOPPED", "Measurements", "NodeReport", "NodeVerdict",
    "SizeResult", "Thresholds", "Verdict", "bus_bandwidth", "decide", "fmt_bytes", "fmt_rate",
    "matrix_rows", "measure", "pair_rounds", "parse_probe_output", "round_robin", "to_json",
]


