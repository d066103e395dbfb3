"""What must match across the nodes of one run, and which node is the odd one: pure.

Preflight gathers the facts on every node (:mod:`clusterctl.cluster.preflight`); this
module only compares them.  For each fact the value most nodes share is the
reference (on a tie: the master's, the first node's), and every node with another value
is named, with both values.  The rules are data (:data:`RULES`): what differs in the
image (its ID, the torch and backend versions inside it) makes ranks run different code
and is a problem; Docker, kernel and accelerator driver versions that differ are
warnings (they run together, but a mismatch is where to look first when one node
misbehaves).  Clocks are compared with the head's (this machine's), because the run's
logs are merged by time: a node whose clock is more than :data:`MAX_SKEW` seconds off
(beyond what the measurement's own round trip can explain) is a warning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PROBLEM, WARNING = "problem", "warning"
#: seconds a node's clock may differ from the head's before it is a warning
MAX_SKEW = 1.0

#: fact name -> (how it is named in a message, severity)
RULES: dict[str, tuple[str, str]] = {
    "image_id": ("image ID", PROBLEM),
    "torch": ("torch version in the image", PROBLEM),
    "backend_version": ("backend version in the image", PROBLEM),
    "docker_version": ("Docker version", WARNING),
    "kernel": ("kernel", WARNING),
    "driver": ("accelerator driver", WARNING),
}


@dataclass(frozen=True)
class Finding:
    node: str
    fact: str
    severity: str        # problem or warning
    message: str         # names the node's value and the reference


def compare(facts: Mapping[str, Mapping[str, str | None]], order: Sequence[str]) -> list[Finding]:
    """``facts``: node -> {fact: value} (None or missing: not known on that node, not
    compared); ``order``: node names in rank order (the first is the master).  One Finding
    per node and fact that differs from the reference value."""
    findings = []
    for fact, (label, severity) in RULES.items():
        values = {n: facts.get(n, {}).get(fact) for n in order}
        known = {n: v for n, v in values.items() if v not in (None, "")}
        if len(set(known.values())) < 2:
            continue
        counts = Counter(known.values())
        top = max(counts.values())
        leaders = [v for v, c in counts.items() if c == top]
        if len(leaders) == 1:   # two or more values and one leader: it is shared (top >= 2)
            reference = leaders[0]
            whose = f"the other {top} nodes'"
        else:  # a tie: the master decides
            master = next(n for n in order if n in known)
            reference = known[master]
            whose = f"{master}'s (the master)"
        for node, value in known.items():
            if value != reference:
                findings.append(Finding(node, fact, severity,
                                        f"{label} {_short(value)} differs from {whose} "
                                        f"{_short(reference)}"))
    return findings


def _short(value: str) -> str:
    """Image IDs are long: sha256:0123456789ab is enough to tell them apart."""
    if value.startswith("sha256:") and len(value) > 19:
        return value[:19]
    return value


def clock_finding(node: str, offset: float | None, uncertainty: float | None,
                  max_skew: float = MAX_SKEW) -> Finding | None:
    """A warning when the node's clock is more than ``max_skew`` seconds from the head's,
    beyond the measurement's own uncertainty (half its round trip)."""
    if offset is None:
        return None
    if abs(offset) - (uncertainty or 0.0) <= max_skew:
        return None
    side = "ahead of" if offset > 0 else "behind"
    return Finding(node, "clock", WARNING,
                   f"clock is {abs(offset):.1f} s {side} this machine's (more than {max_skew:g} s: "
                   "merged logs would be out of order; sync it with NTP/chrony)")
