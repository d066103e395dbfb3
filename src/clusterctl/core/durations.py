"""Durations as people type them: ``90``, ``90s``, ``10m``, ``1h30m``, ``1.5h``.

One parser for every duration clusterctl reads (``launch --hang-timeout``, the
job key ``hang_timeout``), so the same spellings work everywhere and a bad one is
refused with the same words.  Pure.
"""

from __future__ import annotations

import re

#: What a valid duration looks like, for messages.
DURATION_HELP = ("a duration such as 90s, 10m, 1h30m or 1.5h (a number alone is seconds), more "
                 "than 0 and at most 3650 days")
#: The longest duration clusterctl takes, ten years (a timeout past it is no timeout: leave
#: it out; an age past it is older than any image or tree clusterctl made).
MAX_SECONDS = 3650 * 24 * 3600.0

_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0}
_WHOLE = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s?)?\Z")


def parse_duration(value: object) -> float:
    """Seconds in ``value`` (text as above, or a number of seconds); ValueError saying why not."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        m = _WHOLE.match(text)
        if not text or not m or not any(m.group(k) for k in _UNIT):
            raise ValueError(f"{str(value)[:40]!r} is not a duration")
        seconds = sum(float(m.group(k)) * f for k, f in _UNIT.items() if m.group(k))
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{str(value)[:40]!r} is not more than 0 seconds")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{str(value)[:40]!r} is more than 3650 days")
    return seconds


def show_duration(seconds: float) -> str:
    """``90`` -> ``1m30s``; ``600`` -> ``10m``; ``2.5`` -> ``2.5s`` (for messages and records)."""
    if seconds < 60:
        return f"{round(seconds, 1):g}s"
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)
