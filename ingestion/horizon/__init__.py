"""Stellar Horizon: the source that follows one Horizon collection (pages, then SSE).

Pure:

- :mod:`ingestion.horizon.resources`: the collections a job can follow (paths, query parameters,
  cursors, limits).
- :mod:`ingestion.horizon.failures`: what a failed request means (retryable or fatal, the 404
  give-up).
- :mod:`ingestion.horizon.pages`: pages and stream records parsed and validated, record texts
  compacted.
- :mod:`ingestion.horizon.follower`: the I/O-free follower (which request next, backoff, failover,
  giving up).
- :mod:`ingestion.horizon.health`: Horizon's root resource, the history-gap check, rate-limit
  pacing, staleness.
- :mod:`ingestion.horizon.catchup`: the overlapped catch-up planner.

I/O:

- :mod:`ingestion.horizon.exchange`: what every request shares (rate pacing, page requests,
  failures, logging the follower's decisions).
- :mod:`ingestion.horizon.roots`: reading roots, the staleness watcher.
- :mod:`ingestion.horizon.overlapped`: the overlapped catch-up.
- :mod:`ingestion.horizon.streaming`: following the SSE stream.
- :mod:`ingestion.horizon.source`: :class:`~ingestion.horizon.source.HorizonSource`, composing them.
"""
