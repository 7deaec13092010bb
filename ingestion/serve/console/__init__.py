"""The operator console: one page per node, showing the whole cluster.

Served beside ``/metrics`` on the observe port (``ingestion/serve/metrics.py``):

- ``/`` the jobs (kind, leader, token and since when, lease left, committed cursor, records/s,
  lag; for a job without a leader, why: who hosts it and why each holds off) and the nodes (live
  or down by their reports, version, what each hosts and leads, its share, its source health per
  job) and, on a node serving the events API (``api.port``), that API: requests by method and
  outcome, latency p50/p99, subscribers, the window served (``ingestion/serve/api_section.py``,
  from the node's own API metrics). Each job's row carries ``data-job="NAME"`` and
  ``data-leader="NODE"`` (empty when leaderless) for scripts and tests.
- ``/console/job/NAME`` one job: its state, its hosts, its takeover audit (every term: who, when,
  why, how long the job was leaderless), its recent fencing rejections and, for a webhook job, the
  endpoint (state, position, recent attempts with status and latency, dead letters).
- ``/console/state`` the cluster as JSON; ``/console/job/NAME/state`` one job's detail as JSON;
  ``/console/events`` (``?job=NAME`` on a job's page) server-sent events: ``state`` whenever the
  cluster changes, ``job`` when that job's detail does. The pages update without a reload.
- ``POST /console/action`` the guarded actions (below).

**What it reads.** The cluster comes from the nodes' presence reports
(``ingestion/serve/presence.py``): one subscription to their channel, so an open page costs no
Redis command per second, whatever the number of jobs and viewers. A page load also looks for jobs
in Redis that no live node reports (one ``SCAN``, at most every ``DISCOVER_EVERY``). A job's page
reads that job's keys in one round trip when it loads and when the job's reports change.

**Actions**, read-only unless ``observe.console_token`` is set: hand a job over (its leader's
next renewal takes the request and ends the term gracefully), pause or resume a webhook endpoint,
replay its dead letters. The console only asks; the job's leader carries each out under its own
fencing token and writes it to the job's audit with who asked. A request must be a JSON ``POST``
(a cross-site form cannot send one without the browser asking first, which this server never
allows), from the console's own origin when the browser names one, with the token as a bearer
token, compared in constant time.

Nothing a source, an endpoint or Redis gave is trusted: the server escapes every value it writes
into HTML, and the page's script (``/console/app.js``, no inline script: the
Content-Security-Policy forbids it) sets text only. No setting is rendered (so no secret: the
Redis URL, webhook URLs and secrets, the console token; a PostgreSQL sink's URL appears only in a
node's held-off reason, with its password blanked, as in its log line).

The package, along the seams: :mod:`.view` (the pure core), :mod:`.reader` (what it reads and the
actions it asks for), :mod:`.pages` (rendering) and :mod:`.app` (the HTTP side).
"""

from __future__ import annotations

from ingestion.serve.console.app import is_console_path, serve_console
from ingestion.serve.console.pages import job_sections
from ingestion.serve.console.reader import ClusterReader
from ingestion.serve.console.view import ClusterView, why_leaderless

__all__ = [
    "ClusterReader", "ClusterView", "is_console_path", "job_sections", "serve_console", "why_leaderless",
]  # fmt: skip
