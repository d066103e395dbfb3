"""MPI and DeepSpeed hostfiles as inventories.

One job: read a hostfile, one host per line, into an ``Inventory``.  Accepted lines:
``host``, ``user@host`` (Open MPI), ``host:N`` (MPICH), ``host slots=N [max_slots=M]``
(Open MPI, DeepSpeed); ``#`` starts a comment.  A hostfile writes no port, user (except
``user@``) or key: the transport takes them from ``~/.ssh/config`` at connect time.
Problems are reported per line as ``FILE:LINE: host|slots|max_slots: problem; valid: ...``.

Contract: ``read_hostfile(path, text) -> Inventory`` (``InventoryError`` on bad input).
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.cluster.inventory.checks import Reader
from clusterctl.cluster.inventory.model import Inventory, Node
from clusterctl.core.errors import did_you_mean
from clusterctl.core.text import digits, escaped

_KEYS = ("slots", "max_slots")
_VALID = "one host per line: host, user@host, host:N or host slots=N (N a whole number of at least 1)"


def read_hostfile(path: Path, text: str) -> Inventory:
    """The inventory a hostfile describes, in file order (the first host is the master)."""
    return _HostfileReader(path, text).load()


def _field(loc: tuple) -> str:
    """A hostfile line has no field names: a value is the host, or the setting it belongs to."""
    return str(loc[2]) if len(loc) > 2 else "host"


class _HostfileReader(Reader):
    def __init__(self, path: Path, text: str) -> None:
        super().__init__(path, text, spell=_field)

    def ref(self, i: int) -> str:
        return f"line {self.problems.line(('nodes', i))}"

    def load(self) -> Inventory:
        raw: list[dict] = []
        for lineno, text in enumerate(self.text.splitlines(), 1):
            entry = self._parse_line(lineno, text)
            if entry is not None:
                self.problems.lines[("nodes", len(raw))] = lineno
                raw.append(entry)
        if not raw and not self.problems.found:
            self.add((), "no hosts", _VALID)
        nodes = [self.validate(Node, data, ("nodes", i), ("host", "slots"))[0] for i, data in enumerate(raw)]
        self.check_nodes(list(enumerate(raw)))
        self.problems.raise_if_any()
        return Inventory(self.path, nodes, format="hostfile")

    def _parse_line(self, lineno: int, text: str) -> dict | None:
        tokens = text.split("#", 1)[0].split()
        if not tokens:
            return None
        host, entry = tokens[0], {}
        if host.count(":") == 1:  # MPICH style host:N
            host, _, n = host.partition(":")
            entry["slots"] = self._slots(lineno, n, text)
        if "@" in host:  # Open MPI's user@host
            entry["user"], _, host = host.rpartition("@")
        if not host:
            self.problems.add(lineno, f'no host name in "{escaped(text.strip())}"', _VALID, field="host")
            return None
        entry["host"] = host
        for tok in tokens[1:]:
            key, eq, value = tok.partition("=")
            if not eq or key not in _KEYS:
                what = (f'unknown setting "{escaped(tok)}"{did_you_mean(key, _KEYS)}' if eq
                    else f'unexpected "{escaped(tok)}"')
                if digits(tok):
                    what += f' (did you mean "slots={tok}"?)'
                self.problems.add(lineno, what, _VALID, field="host")
            elif key == "slots":
                entry["slots"] = self._slots(lineno, value, text)
            else:
                self._slots(lineno, value, text, field="max_slots")  # checked, not used
        return entry if all(v is not None for v in entry.values()) else None

    def _slots(self, lineno: int, value: str, text: str, field: str = "slots") -> int | None:
        if digits(value) and int(value) >= 1:
            return int(value)
        self.problems.add(lineno, f'"{escaped(value)}" is not a whole number of at least 1 '
                          f'(in "{escaped(text.strip())}")',
                          _VALID, field=field)
        return None
