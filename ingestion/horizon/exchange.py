"""One request to a Horizon, the parts every request of the source shares (I/O).

Rate pacing (:func:`pace` before a request, :func:`answered` after it), a bounded request
(:func:`bounded_get`, a page's :func:`get_page`), what a failed answer means (:func:`failure_of`,
:func:`read_bounded`), and logging the follower's decisions on a failure or malformed data
(:func:`failed`, :func:`malformed`). What the source must provide is :class:`Requester`, which
:class:`~ingestion.horizon.source.HorizonSource` is; :class:`Reader` is the one of a tool that
reads a Horizon once (``verify``, ``inspect``), with the same bounded, paced requests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import httpx
import structlog
import trio

from actors.health import SourceHealth
from ingestion.common.http import SourceUnreadable, describe, source_urls, ssl_context
from ingestion.common.retry import parse_retry_after
from ingestion.horizon.failures import Failure, problem_detail
from ingestion.horizon.follower import HorizonFollower, PageRequest, Retry, StreamRequest
from ingestion.horizon.health import RatePacer, parse_rate_headers
from ingestion.horizon.pages import Malformed
from ingestion.horizon.resources import split_resource

log = structlog.get_logger()

# An error body is only read for its problem detail; a misbehaving server cannot make us read more.
MAX_ERROR_BODY = 64 * 1024


class Requester(Protocol):
    """What a request needs of the source: its timeouts, its rate pacers (one per base URL), and
    the health it reports answers and failures to."""

    @property
    def connect_timeout(self) -> float: ...

    @property
    def read_timeout(self) -> float: ...

    @property
    def pacers(self) -> dict[str, RatePacer]: ...

    @property
    def health(self) -> SourceHealth: ...


def _horizon_url(value: str) -> str:
    return source_urls(value, "Horizon")[0].rstrip("/")


@attrs.define
class Reader:
    """The :class:`Requester` of a tool that reads a Horizon once (``verify``, ``inspect``), not a
    job's source: its URL checked as a source's are, its requests bounded and paced as theirs are
    (:func:`bounded_get`), with pacers of its own and a health nobody reads.

    Args:
        url: the Horizon's base URL.
        connect_timeout, read_timeout: seconds; a page request takes connect + 2 x read at most.

    Raises:
        ValueError: ``url`` is not an http:// or https:// URL with a host.
    """

    url: str = attrs.field(converter=_horizon_url)
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    pacers: dict[str, RatePacer] = attrs.field(factory=dict)
    health: SourceHealth = attrs.field(factory=SourceHealth)

    def client(self) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.read_timeout, connect=self.connect_timeout)
        return httpx.AsyncClient(timeout=timeout, follow_redirects=True, verify=ssl_context())

    async def records(self, client: httpx.AsyncClient, resource: str, **params: str) -> list[Any]:
        """One page of ``resource`` (a collection path, with its query parameters) asked with
        ``params`` (``order``, ``limit``, ``cursor``): its records, parsed, in the page's order.

        Raises:
            SourceUnreadable: no page: a transport error, no answer in time, a status other than
                200 (with Horizon's problem detail), or not a page.
        """
        path, extra = split_resource(resource)
        response, failure = await bounded_get(self, client, self.url, self.url + path, {**extra, **params})
        if response is None:
            failure = failure or Failure(None, "no response")
            status = "" if failure.status is None else f"HTTP {failure.status}: "
            raise SourceUnreadable(status + failure.error)
        try:
            records = json.loads(response.content)["_embedded"]["records"]
        except (ValueError, LookupError, TypeError) as exc:
            raise SourceUnreadable(f"not a page: {describe(exc)}") from exc
        if not isinstance(records, list):
            raise SourceUnreadable("not a page: _embedded.records is not a list")
        return records


async def pace(source: Requester, base: str) -> RatePacer:
    """Wait until the rate limit of ``base`` allows one more request (by the X-RateLimit
    headers seen so far) and count it; the caller reports its answer with :func:`answered`."""
    pacer = source.pacers.get(base)
    if pacer is None:
        pacer = source.pacers[base] = RatePacer()
    delay = pacer.reserve(trio.current_time())
    if delay > 0:
        log.debug("horizon-rate-paced", delay=round(delay, 3), url=base)
        try:
            await trio.sleep(delay)
        except BaseException:
            pacer.answered(trio.current_time(), None)
            raise
    return pacer


async def get_page(
    source: Requester, client: httpx.AsyncClient, request: PageRequest
) -> tuple[httpx.Response | None, Failure | None]:
    """One page request, bounded as a whole: (the 200 response, None) or (None, why not)."""
    return await bounded_get(source, client, request.base_url, request.url, request.params, "page")


async def bounded_get(
    source: Requester,
    client: httpx.AsyncClient,
    base: str,
    url: str,
    params: Mapping[str, str] | None = None,
    what: str = "page",
) -> tuple[httpx.Response | None, Failure | None]:
    """A GET of ``url`` (on the Horizon ``base``, paced by its rate limit), bounded as a whole:
    (the 200 response, None) or (None, why not); ``what`` names the request in a timeout."""
    failure: Failure | None = None
    response: httpx.Response | None = None
    pacer = await pace(source, base)
    try:
        with trio.move_on_after(source.connect_timeout + 2 * source.read_timeout) as scope:
            try:
                response = await client.get(url, params=params)
            except httpx.HTTPError as exc:  # transport, decoding, too many redirects
                failure = Failure(None, describe(exc))
    finally:
        answered(pacer, response)
    if scope.cancelled_caught:
        failure = Failure(None, f"{what} request timed out")
    elif response is not None and response.status_code != 200:
        failure = failure_of(response, response.content[:MAX_ERROR_BODY])
    if failure is not None or response is None:
        return None, failure or Failure(None, "no response")
    return response, None


def failed(source: Requester, follower: HorizonFollower, failure: Failure, request: object) -> None:
    source.health.failed(trio.current_time())
    url = request_url(request)
    limit = follower.limit
    retry = follower.on_failure(failure, url=url, now=trio.current_time())
    log_retry(follower, retry, status=failure.status, error=failure.error, url=url)
    if follower.limit < limit:
        log.warning("horizon-page-limit-reduced", limit=follower.limit, status=failure.status, url=url)


def malformed(follower: HorizonFollower, bad: Malformed, request: object) -> None:
    url = request_url(request)
    log.warning(
        "horizon-malformed-record",
        reason=bad.reason,
        value=bad.value,
        url=url,
        cursor=follower.cursor,
    )
    retry = follower.last_retry
    if retry is not None:
        log_retry(follower, retry, status=200, error=f"malformed: {bad.reason}", url=url)


def log_retry(
    follower: HorizonFollower, retry: Retry, *, status: int | None, error: str, url: str
) -> None:
    log.warning(
        "horizon-retry",
        attempt=retry.attempt,
        delay=round(retry.delay, 3),
        status=status,
        error=error,
        url=url,
        cursor=follower.cursor,
    )
    if retry.failover_to is not None:
        log.warning(
            "horizon-failover",
            from_url=retry.failover_from,
            to_url=retry.failover_to,
            cursor=follower.cursor,
        )


def request_url(request: object) -> str:
    if isinstance(request, PageRequest | StreamRequest):
        query = "&".join(f"{k}={v}" for k, v in request.params.items())
        return f"{request.url}?{query}"
    return str(request)


def answered(pacer: RatePacer, response: httpx.Response | None) -> None:
    rate = None if response is None else parse_rate_headers(response.headers)
    pacer.answered(trio.current_time(), rate)


def failure_of(response: httpx.Response, body: bytes) -> Failure:
    status = response.status_code
    retry_after = None
    if status in (429, 503):  # Horizon's limiter, and an overloaded or stale server
        retry_after = parse_retry_after(response.headers.get("Retry-After"), time.time())
    return Failure(status, problem_detail(body), retry_after)


async def read_bounded(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BODY:
            break
    return b"".join(chunks)[:MAX_ERROR_BODY]
