"""The events API (issue 48): stellar-rpc's ``getEvents`` over the events held in PostgreSQL, and
its streaming half.

Pure:

- :mod:`ingestion.api.subscription`: one subscription's decisions: history, then live events
  without gap or duplicate at the seam, the bounded outbox, when to cut a slow client.

I/O:

- :mod:`ingestion.api.stream_reads`: the blocking reads the streaming half makes (worker threads).
"""
