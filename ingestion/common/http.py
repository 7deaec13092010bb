"""What the HTTP sources (Horizon, Stellar RPC) share."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Sequence

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


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http:// or https:// URL with a host, as httpx reads it: the one check
    of a source's (or a webhook endpoint's) URL, the sources' and the configuration's alike."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:  # a port that is not a number, a broken IPv6 host, ...
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


def source_urls(value: Sequence[str] | str, what: str) -> tuple[str, ...]:
    """A source's URLs (one string, or several tried in order), each http:// or https:// with a
    host.

    Raises:
        ValueError: none given, or one that is not such a URL; the message names ``what``
            ("Horizon", "RPC").
    """
    urls = (value,) if isinstance(value, str) else tuple(value)
    if not urls:
        raise ValueError(f"at least one {what} URL is needed")
    for url in urls:
        if not is_http_url(url):
            raise ValueError(f"{what} URL {url!r} must be an http:// or https:// URL with a host")
    return urls


class SourceUnreadable(RuntimeError):
    """A tool's read of a source (``verify``, ``inspect``: not a job's) got no usable answer: a
    transport error, no answer in time, an error status or a JSON-RPC error, or not the document
    asked for. The message says which in one line, any URL's credentials masked."""


def describe(exc: BaseException) -> str:
    """An exception for a log line, a status or an audit entry: its type, and its message when it
    has one, with any URL's credentials masked (an HTTP error names the URL it was for)."""
    text = redact(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
