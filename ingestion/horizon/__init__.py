"""Stellar Horizon: the source that follows one Horizon collection (pages, then SSE).

- :mod:`ingestion.horizon.follower`: the I/O-free follower (which request next, validation, backoff,
  failover, giving up).
- :mod:`ingestion.horizon.health`: Horizon's root resource, the history-gap check, rate-limit
  pacing, staleness (pure).
- :mod:`ingestion.horizon.catchup`: the overlapped catch-up planner (pure).
- :mod:`ingestion.horizon.source`: :class:`~ingestion.horizon.source.HorizonSource`, the I/O.
"""
