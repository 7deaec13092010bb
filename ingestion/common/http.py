"""What the HTTP sources (Horizon, Stellar RPC) share."""

from __future__ import annotations

import functools
import ssl

import httpx

from ingestion.common.redact import redact


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One TLS context for every client this process opens.

    httpx builds a new context (loading the CA bundle) for each client unless given one: 100 ms or
    more of CPU, paid by every term, since each ``stream`` opens its own client. A standby that
    takes over would pay it between becoming leader and its first request.
    """
    return httpx.create_ssl_context()


def describe(exc: BaseException) -> str:
    """An exception for a log line, a status or an audit entry: its type, and its message when it
    has one, with any URL's credentials masked (an HTTP error names the URL it was for)."""
    text = redact(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
