"""The events API: stellar-rpc's JSON-RPC (``getEvents``, ``getLatestLedger``, ``getHealth``,
``getNetwork``) over every event a job holds in PostgreSQL (docs/API.md).

Pure:

- :mod:`ingestion.api.store`: the store's contract (the projection's tables and indexes) and its SQL.
- :mod:`ingestion.api.query`: a ``getEvents`` request as a query plan; rows as the answer.
- :mod:`ingestion.api.core`: the JSON-RPC envelope, the small methods, the errors.
- :mod:`ingestion.api.subscription`: one subscription's decisions: history, then live events
  without gap or duplicate at the seam, the bounded outbox, when to cut a slow client.
- :mod:`ingestion.api.stream_protocol`: the streaming protocol's frames.

I/O:

- :mod:`ingestion.api.projector`: the fenced projector (a scheduled job) that keeps the store.
- :mod:`ingestion.api.reader`: read-only, bounded reads of the store.
- :mod:`ingestion.api.server`: the ASGI app, its metrics, the HTTP server.
- :mod:`ingestion.api.service`: the API built from the settings (a node's, ``ingestion api``'s).
- :mod:`ingestion.api.feed`, :mod:`ingestion.api.stream_reads`, :mod:`ingestion.api.streaming`:
  subscriptions over WebSocket and SSE (docs/API.md, its streaming section).
"""
