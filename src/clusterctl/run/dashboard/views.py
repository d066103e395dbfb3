"""What the dashboard shows of a run record and of its metrics lines, as JSON data.

A view names only what a person watching a run needs: the runs table's columns (the same
rows as ``clusterctl runs``: :func:`clusterctl.run.records.summary_rows`), each node's state
and exit, the attempts, the first failure.  It never carries a record's environment, its
command line or its job spec (the environment is masked in the record, but a view that
leaves it out cannot leak it), and a run whose following launch died shows as ``unknown``
without the record being rewritten (the dashboard only reads).

Curves come from the metrics lines of the merged output (:mod:`clusterctl.run.metrics`):
per node its lowest rank's loss by step, and the node's samples per second
(:func:`clusterctl.run.metrics.rates` over a trailing window) by time since the run began.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from clusterctl.run import metrics, records
from clusterctl.run.dashboard import livetail

#: The runs table's columns, as ``clusterctl runs`` prints them (records.summary_rows).
COLUMNS = ("run", "user", "job", "code", "nodes", "state", "exit", "started", "finished", "why")
#: Seconds of samples each point of the throughput curve is rated over.
RATE_WINDOW_S = 10.0
#: Curves are drawn for at most this many nodes (those of the lowest ranks) ...
CURVE_NODES = 16
#: ... with at most this many points each.
CURVE_POINTS = 300


def _time(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def shown_state(record: records.RunRecord) -> tuple[str, str]:
    """(state, note) as shown: a followed run whose launch died is ``unknown`` (as ``runs``
    would record it), read-only."""
    if records.launcher_died(record):
        return "unknown", ("the launch following it ended without recording an outcome; "
                           f"`clusterctl status {record.run_id}` asks the nodes")
    return record.state, record.note


def summary(record: records.RunRecord) -> dict:
    """One row of the runs table."""
    state, note = shown_state(record)
    shown = record.model_copy(update={"state": state, "note": note})
    row = dict(zip(COLUMNS, records.summary_rows([shown])[0], strict=True))
    return {**row, "state_word": state, "live": state in records.LIVE_STATES,
            "started_at": _time(record.started), "finished_at": _time(record.finished)}


def _node(n: records.NodeRecord) -> dict:
    return {"node": n.node, "host": n.host, "rank": n.rank, "container": n.container,
            "state": n.state, "exit_code": n.exit_code, "exit": records.describe_exit(n.exit_code),
            "started": _time(n.started), "finished": _time(n.finished), "stopped_by": n.stopped_by}


def _attempt(a: records.AttemptRecord) -> dict:
    return {"attempt": a.attempt, "started": _time(a.started), "finished": _time(a.finished),
            "state": a.state, "exit_code": a.exit_code, "nodes": [n.node for n in a.nodes],
            "ended": a.ended, "then": a.then, "excluded": dict(a.excluded),
            "replaced": dict(a.replaced)}


def detail(record: records.RunRecord) -> dict:
    """A run's page: the row, where it runs, its nodes, its attempts, its first failure."""
    failure = record.first_failure
    attempts = [_attempt(a) for a in record.attempts]
    if not attempts:      # a run without restarts has had one attempt: the record's own
        attempts = [{"attempt": record.attempt, "started": _time(record.started),
                     "finished": _time(record.finished), "state": shown_state(record)[0],
                     "exit_code": record.exit_code, "nodes": [n.node for n in record.nodes],
                     "ended": "", "then": "", "excluded": {}, "replaced": {}}]
    return {
        **summary(record),
        "image": record.image, "image_id": record.image_id, "scheduler": record.scheduler,
        "slurm_job": record.slurm_job, "master": (f"{record.master_addr}:{record.master_port}"
                                                  if record.master_addr else None),
        "detached": record.detached, "supervised": record.supervised,
        # a plain --detach run is followed by nobody, so runs/<id>/merged.log does not grow:
        # the dashboard follows the caller's own from its nodes (livetail); another user's
        # output stays on the nodes until its owner's `clusterctl logs`/`stop`
        "output_from_nodes": livetail.wanted(record),
        "output_on_nodes": (record.detached and not record.supervised and record.scheduler == "ssh"
                            and record.state in records.LIVE_STATES and not livetail.wanted(record)),
        "attempt": record.attempt, "max_restarts": record.max_restarts,
        "excluded": dict(record.excluded), "note": shown_state(record)[1],
        "attempt_lines": records.attempt_lines(record),
        "first_failure": None if failure is None else {
            "node": failure.node, "rank": failure.rank, "kind": failure.kind,
            "exit": "lost" if failure.kind == "lost" else records.describe_exit(failure.exit_code),
            "time": _time(failure.time), "reason": failure.reason,
            "last_lines": list(failure.last_lines)},
        "nodes": [_node(n) for n in record.nodes],
        "attempts": attempts,
    }


def attempt_parts(record: records.RunRecord, attempt: int | None) -> list[str]:
    """The directories under runs/<id>/ of an attempt's logs ([] for the first), by the
    record's own rule (:meth:`~clusterctl.run.records.RunRecord.attempt_dir`); UserError
    naming the attempts there are."""
    at = record if attempt is None else record.at_attempt(attempt)
    rel = at.attempt_dir().relative_to(record.dir)
    return [p for p in rel.parts if p != "."]


def curves(per_node: Mapping[str, Sequence[metrics.Sample]], start: float, *,
           nodes: int = CURVE_NODES, points: int = CURVE_POINTS) -> dict:
    """Each node's curves from its metrics samples (in the order printed): ``step``/``loss`` of
    its lowest rank, and ``t`` (seconds since ``start``) / ``samples_per_s`` of the node, at
    most ``points`` of each (evenly spaced, the newest always), for the ``nodes`` nodes of
    the lowest ranks."""
    lowest = {node: min(s.rank for s in samples) for node, samples in per_node.items() if samples}
    out = {}
    for node in sorted(lowest, key=lambda n: (lowest[n], n))[:nodes]:
        samples = list(per_node[node])
        low = lowest[node]
        mine = [i for i, s in enumerate(samples) if s.rank == low]
        shown = mine[::-(-len(mine) // points)] if mine else []
        if mine and shown[-1] != mine[-1]:
            shown.append(mine[-1])
        t, rate, first = [], [], 0
        for i in shown:
            s = samples[i]
            while samples[first].time < s.time - RATE_WINDOW_S:
                first += 1
            r = metrics.rates(samples[first:i + 1], RATE_WINDOW_S)
            if r.samples_per_s is not None:
                t.append(round(s.time - start, 3))
                rate.append(r.samples_per_s)
        out[node] = {"rank": low, "step": [samples[i].step for i in shown],
                     "loss": [samples[i].loss for i in shown], "t": t, "samples_per_s": rate}
    return {"nodes": out, "nodes_total": len(lowest)}
