"""Stellar RPC: the ``getEvents`` source (contract events) and the rules it shares with the simulator.

- :mod:`ingestion.rpc.protocol`: the API's own rules, pure: event ids (cursors), request
  validation with the server's messages, filter matching, ScVal topic segments.
- :mod:`ingestion.rpc.follower`: the I/O-free follower (which request next, what an answer means:
  records, a scanned-through cursor, wait for the next ledger, back off, fail over, stop).
- :mod:`ingestion.rpc.source`: :class:`~ingestion.rpc.source.RpcSource`, the thin I/O around it.
"""
