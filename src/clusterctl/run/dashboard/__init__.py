"""``clusterctl ui``: a dashboard of the runs directory in a browser, live while runs go.

What it shows: the runs table (the same rows as ``clusterctl runs``), a run's nodes with
their state and exit, its attempts, its merged output as it grows, and two curves drawn
from the metrics lines the training prints (:mod:`clusterctl.run.metrics`): loss by step
and samples per second by time.  What it shows is read from ``runs/<id>/`` (what
``launch`` or a detached run's supervisor writes there), except the output of the caller's
own plain ``launch --detach`` runs, which nobody writes there: the dashboard follows those
from their nodes while a page asks (:mod:`~clusterctl.run.dashboard.livetail`, in memory).
It starts and stops nothing.

Built on what earns its place: the standard library's ``http.server`` (a
``ThreadingHTTPServer`` serving JSON, no web framework to install on a head node) and one
vendored charting library, uPlot (MIT, 50 KB minified, no dependencies: ``static/vendor/
uplot/``), shipped inside the package rather than loaded from a CDN, because head and
cluster nodes are often offline and a page that needs the internet to draw a curve would
not draw there; there is no JavaScript build step either (one hand-written ``app.js``).

Modules: :mod:`~clusterctl.run.dashboard.files` (reading under the runs directory, no link
followed, bounded), :mod:`~clusterctl.run.dashboard.livetail` (a plain detached run's output
from its nodes), :mod:`~clusterctl.run.dashboard.views` (what a record and its samples
look like as JSON), :mod:`~clusterctl.run.dashboard.server` (the HTTP server, access by
address or token).
"""

from clusterctl.run.dashboard.server import Dashboard, needs_token, new_token

__all__ = ["Dashboard", "needs_token", "new_token"]
