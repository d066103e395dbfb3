"""Durations as typed (launch --hang-timeout, the job key hang_timeout)."""

from __future__ import annotations

import pytest

from clusterctl.core.durations import parse_duration, show_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("2m30s", 150),
    (" 10M ", 600), ("0.5s", 0.5), (45, 45), (2.5, 2.5),
])
def test_valid(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "10x", "m", "1h-5m", "-5", "0", "0s", "10 minutes", True, "1e3", "nan"])
def test_invalid(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_show():
    assert [show_duration(s) for s in (2.5, 30, 30.0797, 90, 600, 5400)] == [
        "2.5s", "30s", "30.1s", "1m30s", "10m", "1h30m"]
