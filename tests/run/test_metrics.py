"""run.metrics: the metrics line, its rates, the Prometheus text (pure, fast tier)."""

from __future__ import annotations

import json
import re

import pytest

from clusterctl.run.metrics import (
    MARKER,
    MAX_LINE,
    GpuUse,
    NodeMetrics,
    Sample,
    metrics_from_lines,
    parse_line,
    prometheus_text,
    rates,
    read_log_metrics,
)


def line(**data) -> str:
    return f"{MARKER} {json.dumps(data)}"


def test_parse_line_documented_example():
    s = parse_line('clusterctl-metrics {"rank": 0, "step": 12, "loss": 0.4312, '
                   '"samples": 768, "time": 1764369000.12}')
    assert s == Sample(rank=0, step=12, time=1764369000.12, samples=768, loss=0.4312)


def test_parse_line_keeps_extra_keys_and_logger_prefix():
    s = parse_line("INFO 12:00:01 " + line(rank=3, step=1, samples=8, time=5, lr=0.1,
                                            tokens=4096))
    assert s is not None and s.rank == 3 and s.loss is None
    assert s.extra == {"lr": 0.1, "tokens": 4096}


@pytest.mark.parametrize("text", [
    "", "step 12 loss 0.4", MARKER, MARKER + " ", MARKER + " {", MARKER + " []",
    MARKER + " null", MARKER + ' {"rank": 0}',
    line(rank=True, step=1, samples=1, time=1),
    line(rank=-1, step=1, samples=1, time=1),
    line(rank=0, step=1.5, samples=1, time=1),
    line(rank=0, step=1, samples="8", time=1),
    line(rank=0, step=1, samples=1, time="now"),
    line(rank=0, step=1, samples=1, time=1, loss="x"),
    MARKER + ' {"rank": 0, "step": 1, "samples": 1, "time": NaN}',
    MARKER + ' {"rank": 0, "step": 1, "samples": 1, "time": Infinity}',
    MARKER + " " + "[" * 100_000,
    MARKER + " " + '{"a":' * 5000,
    line(rank=0, step=1, samples=1, time=1, pad="x" * MAX_LINE),
])
def test_parse_line_junk_is_none(text):
    assert parse_line(text) is None


def test_parse_line_not_a_str_is_none():
    assert parse_line(None) is None  # type: ignore[arg-type]
    assert parse_line(b"clusterctl-metrics {}") is None  # type: ignore[arg-type]


def _run(rank: int, n: int, dt: float, t0: float = 100.0, batch: int = 64) -> list[Sample]:
    return [Sample(rank, i, t0 + i * dt, i * batch, 1.0 / (i + 1)) for i in range(n)]


def test_rates_over_window():
    r = rates(_run(0, 21, 0.5), window_s=5)
    assert r.steps_per_s == pytest.approx(2.0)
    assert r.samples_per_s == pytest.approx(128.0)
    assert r.last_step == 20 and r.last_loss == pytest.approx(1 / 21)


def test_rates_need_two_samples():
    assert rates([]).steps_per_s is None
    one = rates(_run(0, 1, 1.0))
    assert one.steps_per_s is None and one.last_step == 0


def test_rates_fall_to_zero_when_a_rank_stops_printing():
    samples = _run(0, 10, 1.0)  # last at t=109
    assert rates(samples, window_s=30, now=109).steps_per_s == pytest.approx(1.0)
    assert rates(samples, window_s=30, now=150) .steps_per_s == 0.0
    slower = rates(samples, window_s=30, now=118).steps_per_s
    assert 0 < slower < 1.0  # waiting since the last step counts


def test_rates_restart_starts_the_window_again():
    samples = _run(0, 10, 1.0) + _run(0, 5, 0.25, t0=110)
    r = rates(samples, window_s=60)
    assert r.steps_per_s == pytest.approx(4.0) and r.last_step == 4


def test_rates_several_ranks_on_a_node_slowest_steps_summed_samples():
    samples = [s for pair in zip(_run(0, 11, 0.5), _run(1, 11, 1.0), strict=True) for s in pair]
    r = rates(samples, window_s=60)
    assert r.steps_per_s == pytest.approx(1.0)
    assert r.samples_per_s == pytest.approx(128.0 + 64.0)
    assert r.last_step == 10


def test_metrics_from_lines_keeps_last_per_node():
    lines = [("node1", line(rank=0, step=i, samples=i, time=i)) for i in range(50)]
    lines += [("node2", "noise"), ("node2", line(rank=1, step=1, samples=1, time=1))]
    got = metrics_from_lines(lines, keep=5)
    assert [s.step for s in got["node1"]] == [45, 46, 47, 48, 49]
    assert len(got["node2"]) == 1


def test_read_log_metrics_tail_of_merged_log(tmp_path):
    merged = tmp_path / "merged.log"
    with open(merged, "w") as f:
        for i in range(2000):
            f.write(f"node1[0]| {line(rank=0, step=i, samples=i * 8, time=1000 + i)}\n")
            f.write(f"node2[1]| {line(rank=1, step=i, samples=i * 8, time=1000 + i)}\n")
            f.write("node2[1]| plain output\n")
        f.write("no prefix " + line(rank=9, step=1, samples=1, time=1) + "\n")
    got = read_log_metrics(merged, max_bytes=20_000)
    assert set(got) == {"node1", "node2"}
    assert got["node1"][-1].step == 1999
    assert len(got["node1"]) < 200  # only the tail was read
    assert all(s.step > 1500 for s in got["node2"])
    assert read_log_metrics(tmp_path / "missing.log") == {}


def test_read_log_metrics_does_not_follow_a_symlink(tmp_path):
    real = tmp_path / "elsewhere.log"
    real.write_text(f"node1[0]| {line(rank=0, step=1, samples=1, time=1)}\n")
    (tmp_path / "merged.log").symlink_to(real)
    assert read_log_metrics(tmp_path / "merged.log") == {}


# -- the exposition format ----------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SERIES = re.compile(rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})? "
                     r"(?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|Inf|NaN))$")
_LABEL_ONE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A strict reader of the text format 0.0.4: HELP then TYPE before a family's series,
    every series of a declared family, families not repeated, the text ends in a newline."""
    assert text.endswith("\n")
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    helped: set[str] = set()
    current = None
    for raw in text.splitlines():
        if raw.startswith("# HELP "):
            name = raw.split(" ")[2]
            assert re.fullmatch(_NAME, name) and name not in helped, raw
            helped.add(name)
        elif raw.startswith("# TYPE "):
            _, _, name, kind = raw.split(" ")
            assert name in helped and name not in families, raw
            assert kind in ("gauge", "counter", "untyped"), raw
            families[name] = []
            current = name
        else:
            m = _SERIES.match(raw)
            assert m, f"not a series line: {raw!r}"
            assert m.group("name") == current, raw
            labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                      for k, v in _LABEL_ONE.findall(m.group("labels") or "")}
            families[current].append((labels, float(m.group("value"))))
    return families


def test_prometheus_text_parses_and_escapes_labels():
    up = NodeMetrics("node1", rank=0, rates=rates(_run(0, 21, 0.5)), cpu_percent=97.5,
                     memory_bytes=512 << 20, memory_limit_bytes=8 << 30,
                     gpus=(GpuUse(0, 88.0, 10 << 30, 80 << 30), GpuUse(1, None, 1 << 30, None)))
    down = NodeMetrics('no"de\\2\n', rank=1, error="timeout after 5 s")
    fam = parse_exposition(prometheus_text('run "x"', {"node1": up, "node2": down}))
    steps = fam["clusterctl_run_steps_per_second"]
    assert steps == [({"run": 'run "x"', "node": "node1", "rank": "0"}, 2.0)]
    assert {labels["node"]: v for labels, v in fam["clusterctl_run_node_up"]} == {
        "node1": 1.0, 'no"de\\2\n': 0.0}
    gpu = fam["clusterctl_run_gpu_memory_used_bytes"]
    assert [(labels["gpu"], v) for labels, v in gpu] == [("0", 10 << 30), ("1", 1 << 30)]
    assert [labels["gpu"] for labels, _ in fam["clusterctl_run_gpu_utilization_percent"]] == ["0"]
    assert fam["clusterctl_run_container_cpu_percent"][0][1] == 97.5
    # the unknown is left out, not written as 0: the down node has no cpu series
    assert len(fam["clusterctl_run_container_cpu_percent"]) == 1


def test_prometheus_text_empty_and_no_gpus():
    assert prometheus_text("r", {}) == ""
    fam = parse_exposition(prometheus_text("r", {"n": NodeMetrics("n", cpu_percent=1.0)}))
    assert not any(name.startswith("clusterctl_run_gpu") for name in fam)
    assert "clusterctl_run_steps_per_second" not in fam
