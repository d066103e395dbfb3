"""The dashboard's HTTP server: the page, its JSON API and a Prometheus ``/metrics``.

The standard library's :class:`~http.server.ThreadingHTTPServer` (no web framework to
install on a head node) answers GET requests only:

    /                               the page (static/index.html); ?token=T sets the cookie
    /static/NAME                    the page's script, style and the vendored uPlot
    /api/runs                       the runs table, newest first
    /api/runs/RUN                   one run: nodes, attempts, first failure
    /api/runs/RUN/log               ?after=BYTES&attempt=K&node=NAME: complete lines from an
                                    offset (none: the tail), at most files.CHUNK bytes
    /api/runs/RUN/metrics           ?attempt=K: each node's loss and throughput curves
    /metrics                        Prometheus text: the live runs' metrics-line families

The page polls (every request is short and bounded; no connection is held open).  Files
are read only under the runs directory, without following a link
(:class:`~clusterctl.run.dashboard.files.RunsDir`).  Access: on a loopback address without
a token, a request must name that address in its Host header (a web page elsewhere that
points a name of its own at 127.0.0.1 is refused: DNS rebinding); with a token (required
on any other address) every request carries it as ``Authorization: Bearer T`` or as the
cookie the page's first ``/?token=T`` sets, compared in constant time.

Contract: :class:`Dashboard` (``start()`` in a thread or ``serve_forever()``, ``url``,
``login_url``, ``close()``), :func:`needs_token`, :func:`new_token`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

from clusterctl.core.errors import UserError
from clusterctl.core.text import digits
from clusterctl.run import logs, metrics, records
from clusterctl.run.dashboard import views
from clusterctl.run.dashboard.files import CHUNK, TAIL, Lines, Refused, RunsDir, run_id_of
from clusterctl.run.dashboard.livetail import LiveTails

#: What each static file is served as; nothing else under static/ is served.
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".txt": "text/plain; charset=utf-8",
          ".png": "image/png", ".svg": "image/svg+xml"}
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
}
#: The metrics-line families /metrics serves (the containers' CPU, memory and GPUs need the
#: nodes asked: ``clusterctl top --prometheus``).
PROMETHEUS_FAMILIES = ("clusterctl_run_steps_per_second", "clusterctl_run_samples_per_second",
                       "clusterctl_run_loss", "clusterctl_run_last_step")
#: Samples kept per node for a run's curves (the newest; older ones are dropped).
KEEP_SAMPLES = 1000
#: Bytes of merged.log read per request for the curves (the first read starts this far
#: from the end; the next ones go on from where the last stopped).
METRICS_READ = 8 * 1024 * 1024
#: Runs whose samples are kept between requests.
CACHED_RUNS = 8


def needs_token(host: str) -> bool:
    """Whether serving on ``host`` needs a token: any address but a loopback one."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return True


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _static_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) of every file shipped under static/ (read once)."""
    found = {}
    root = resources.files("clusterctl.run.dashboard") / "static"
    todo = [("", root)]
    while todo:
        prefix, folder = todo.pop()
        for entry in folder.iterdir():
            name = f"{prefix}{entry.name}"
            if entry.is_dir():
                todo.append((name + "/", entry))
            elif Path(entry.name).suffix in _TYPES:
                found[name] = (entry.read_bytes(), _TYPES[Path(entry.name).suffix])
    return found


class _Samples:
    """A run attempt's metrics samples, read on from where the last request stopped."""

    def __init__(self) -> None:
        self.offset: int | None = None
        self.per_node: dict[str, deque[metrics.Sample]] = {}

    def update(self, read: Callable[..., Lines]) -> None:
        chunk = read(after=self.offset, limit=METRICS_READ, tail=METRICS_READ)
        if chunk.reset:
            self.per_node.clear()
        pairs = ((p[0], p[2]) for p in map(logs.parse_prefixed, chunk.lines) if p is not None)
        for node, found in metrics.metrics_from_lines(pairs, keep=KEEP_SAMPLES).items():
            self.per_node.setdefault(node, deque(maxlen=KEEP_SAMPLES)).extend(found)
        self.offset = chunk.next


class Dashboard:
    """The dashboard of the runs directory ``runs`` on ``host:port`` (0: a free port).

    ``token`` None on a loopback address: no token; on any other address a token is
    required (UserError without one)."""

    def __init__(self, runs: Path, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        if token is None and needs_token(host):
            raise UserError(f"serving on {host} (not a loopback address) needs a token: every "
                            "request must carry it. Leave --host out (127.0.0.1), or give "
                            "--token to have one made.")
        self.runs = RunsDir(runs)
        self.host = host
        self.token = token
        self.static = _static_files()
        self._samples: dict[tuple[str, str], _Samples] = {}
        self.live = LiveTails()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"dashboard": self})
        server = ThreadingHTTPServer
        if ":" in host:       # an IPv6 address (--host ::1, --host ::)
            server = type("Server6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        try:
            self.server = server((host, port), handler)
        except OSError as e:
            raise UserError(f"cannot serve on {host}:{port}: {e.strerror or e}; give another "
                            "--port (0 picks a free one) or --host.") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def login_url(self) -> str:
        """The URL to open: with ``?token=`` when there is a token (the page then keeps it in
        a cookie and drops it from the address bar)."""
        return self.url + (f"?token={quote(self.token)}" if self.token else "")

    @property
    def cookie(self) -> str:
        return f"clusterctl_ui_{self.port}"

    def start(self) -> Dashboard:
        """Serve in a thread of this process (tests; a caller that goes on)."""
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), name="clusterctl-ui",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join()
        self.server.server_close()
        self.live.close()

    # -- what the API answers ------------------------------------------------------------

    def runs_table(self) -> list[dict]:
        return [views.summary(r) for r in self.runs.records()]

    def run(self, run_id: str) -> dict:
        return views.detail(self.runs.record(run_id))

    def log(self, run_id: str, *, after: int | None, attempt: int | None,
            node: str | None) -> dict:
        record = self.runs.record(run_id)
        self._attempt(record, attempt)        # 404 naming the attempts there are
        if node is not None and node not in {n.node for n in (
                record if attempt is None else record.at_attempt(attempt)).nodes}:
            raise Refused(404, f"run {record.run_id} has no node {node!r}")
        return self._reader(record, attempt, node)(after=after, limit=CHUNK, tail=TAIL).json()

    def _reader(self, record: records.RunRecord, attempt: int | None,
                node: str | None) -> Callable[..., Lines]:
        """Where an attempt's merged output (``node`` None) or a node's is read: its file under
        runs/<id>/, or for a plain detached run the dashboard's own live tail of its nodes
        (:mod:`~clusterctl.run.dashboard.livetail`)."""
        parts = self._attempt(record, attempt)
        if attempt in (None, record.attempt) and self.live.wanted(record):
            return lambda **kw: self.live.read(record, node, **kw)
        name = records.MERGED_LOG if node is None else f"{node}.log"
        return lambda **kw: self.runs.read_lines(record.run_id, [*parts, name], **kw)

    def curves(self, run_id: str, *, attempt: int | None) -> dict:
        record = self.runs.record(run_id)
        parts = self._attempt(record, attempt)
        key = (record.run_id, "/".join(parts))
        read = self._reader(record, attempt, None)
        with self._lock:
            cached = self._samples.pop(key, None) or _Samples()
            self._samples[key] = cached          # newest last: the oldest go first
            while len(self._samples) > CACHED_RUNS:
                self._samples.pop(next(iter(self._samples)))
            try:
                cached.update(read)
            except Refused as e:
                if e.status != 404:
                    raise
            per_node = {n: list(d) for n, d in cached.per_node.items()}
        return {"run_id": record.run_id, "attempt": record.attempt if attempt is None else attempt,
                **views.curves(per_node, record.started.timestamp())}

    def prometheus(self) -> str:
        """The live runs' metrics-line families, each family's HELP and TYPE once."""
        families: dict[str, list[str]] = {}
        now = time.time()
        for summary in self.runs_table():
            if not summary["live"]:
                continue
            record = self.runs.record(summary["run"])
            self.curves(record.run_id, attempt=None)
            with self._lock:
                cached = self._samples.get((record.run_id, "/".join(self._attempt(record, None))))
                per_node = {n: list(d) for n, d in cached.per_node.items()} if cached else {}
            ranks = {n.node: n.rank for n in record.nodes}
            text = metrics.prometheus_text(record.run_id, {
                node: metrics.NodeMetrics(node=node, rank=ranks.get(node),
                                          rates=metrics.rates(samples, now=now))
                for node, samples in per_node.items()})
            name = None
            for line in text.splitlines():
                if line.startswith("# HELP "):
                    name = line.split()[2]
                    families.setdefault(name, [])
                    if len(families[name]) == 0:
                        families[name] += [line]
                elif line.startswith("# TYPE "):
                    if len(families[name]) == 1:
                        families[name].append(line)
                elif name is not None:
                    families[name].append(line)
        return "".join("\n".join(families[f]) + "\n" for f in PROMETHEUS_FAMILIES if f in families)

    @staticmethod
    def _attempt(record: records.RunRecord, attempt: int | None) -> list[str]:
        try:
            return views.attempt_parts(record, attempt)
        except UserError as e:
            raise Refused(404, e.message) from None


class _Handler(BaseHTTPRequestHandler):
    dashboard: Dashboard
    server_version = "clusterctl-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30      # a client that stops sending mid-request gives its thread back

    def log_message(self, format, *args) -> None:   # noqa: A002 - the base class's name
        pass          # the request line may hold ?token=: nothing is logged

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _method_not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET\n", "text/plain; charset=utf-8",
                   extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _method_not_allowed

    # -- answering ------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str, *, head: bool = False,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in {**_HEADERS, "Content-Type": content_type, "Content-Length": str(len(body)),
                     "Cache-Control": "no-store", **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, data, *, head: bool = False) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", head=head)

    def _error(self, status: int, message: str, *, head: bool = False) -> None:
        self._json(status, {"error": message}, head=head)

    # -- access ---------------------------------------------------------------------------

    def _token_given(self, query: dict[str, list[str]]) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer "):].strip()
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            cookie = SimpleCookie()
        if self.dashboard.cookie in cookie:
            return cookie[self.dashboard.cookie].value
        return (query.get("token") or [None])[0]

    def _allowed(self, query: dict[str, list[str]]) -> bool:
        d = self.dashboard
        if d.token is None:
            host = (self.headers.get("Host") or "").lower()
            return host in {f"127.0.0.1:{d.port}", f"localhost:{d.port}", f"[::1]:{d.port}",
                            f"{d.host}:{d.port}"}
        given = self._token_given(query)
        return given is not None and hmac.compare_digest(given.encode(), d.token.encode())

    # -- routing --------------------------------------------------------------------------

    def _serve(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        try:
            query = parse_qs(url.query, max_num_fields=8)
        except ValueError:
            return self._error(HTTPStatus.BAD_REQUEST, "too many query fields", head=head)
        path = url.path
        if not self._allowed(query):
            if path.startswith("/api/") or path == "/metrics":
                return self._error(HTTPStatus.UNAUTHORIZED, "a token is needed: open the URL "
                                   "`clusterctl ui` printed, or send Authorization: Bearer TOKEN",
                                   head=head)
            return self._send(HTTPStatus.UNAUTHORIZED, b"clusterctl ui: open the URL it printed "
                              b"(with ?token=...).\n", "text/plain; charset=utf-8", head=head)
        d = self.dashboard
        if "token" in query and d.token is not None and path == "/":
            # the token goes into a cookie and out of the address bar (and the history)
            return self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", head=head, extra={
                "Location": "/", "Set-Cookie": f"{d.cookie}={d.token}; Path=/; HttpOnly; "
                                               "SameSite=Strict"})
        try:
            if path in ("/", "/index.html"):
                body, kind = d.static["index.html"]
                return self._send(HTTPStatus.OK, body, kind, head=head)
            if path.startswith("/static/") and path[len("/static/"):] in d.static:
                body, kind = d.static[path[len("/static/"):]]
                return self._send(HTTPStatus.OK, body, kind, head=head,
                                  extra={"Cache-Control": "max-age=3600"})
            if path == "/metrics":
                return self._send(HTTPStatus.OK, d.prometheus().encode(),
                                  "text/plain; version=0.0.4; charset=utf-8", head=head)
            if path == "/api/runs":
                return self._json(HTTPStatus.OK, d.runs_table(), head=head)
            parts = path.split("/")
            if len(parts) in (4, 5) and parts[:3] == ["", "api", "runs"]:
                run_id = run_id_of(parts[3])
                if len(parts) == 4:
                    return self._json(HTTPStatus.OK, d.run(run_id), head=head)
                attempt = _int(query, "attempt")
                if parts[4] == "log":
                    return self._json(HTTPStatus.OK, d.log(
                        run_id, after=_int(query, "after"), attempt=attempt,
                        node=(query.get("node") or [None])[0]), head=head)
                if parts[4] == "metrics":
                    return self._json(HTTPStatus.OK, d.curves(run_id, attempt=attempt), head=head)
            return self._error(HTTPStatus.NOT_FOUND, f"nothing at {path}", head=head)
        except Refused as e:
            return self._error(e.status, e.message, head=head)


def _int(query: dict[str, list[str]], name: str) -> int | None:
    value = (query.get(name) or [None])[0]
    if value is None:
        return None
    if not digits(value) or len(value) > 18:
        raise Refused(400, f"{name}={value!r} is not a number of 0 or more")
    return int(value)
