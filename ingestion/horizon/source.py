"""The Horizon source: the one module that talks HTTP to Horizon.

:class:`HorizonSource` follows a Horizon collection (``/operations``, ``/accounts/G.../payments``,
...) from a cursor: it catches up with ``order=asc`` pages, then follows the Server-Sent Event
stream, across reconnects, retries and failover between several Horizon URLs. Every decision
(which request next, validation, backoff, failover, giving up) is made by the I/O-free
:class:`~ingestion.horizon.core.HorizonFollower`; this module only carries the requests out, bounds
every wait, and logs.

Shape of ``stream(cursor)``: one pump task owns the follower and the HTTP client and sends
:class:`Batch` values into a small buffer, so the next page is fetched while the consumer commits
the previous one. While streaming, a reader task feeds validated records to a batcher that gathers
whatever arrives within a few milliseconds (up to a page) into one batch.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing

import attrs
import httpx
import structlog
import trio
from httpx_sse import SSEError, aconnect_sse

from actors.health import SourceHealth
from actors.source import Batch, Record, SourceFatalError
from ingestion.common.gaps import record_history_gap
from ingestion.common.http import describe, ssl_context
from ingestion.common.paging import InvalidPagingToken, token_key
from ingestion.common.retry import RetryPolicy, parse_retry_after
from ingestion.horizon.catchup import LedgerRange, ledger_of, ledgers_per_range, overlappable, plan_ranges
from ingestion.horizon.core import (
    MAX_PAGE_LIMIT,
    Failure,
    HorizonFollower,
    Malformed,
    Mode,
    NotFoundTracker,
    PageRequest,
    Retry,
    StreamRequest,
    StreamSignal,
    check_resource,
    fatal_message,
    is_entity_scoped,
    is_retryable_status,
    problem_detail,
    split_resource,
)
from ingestion.horizon.health import (
    RatePacer,
    RootInfo,
    assess_staleness,
    cursor_ledger,
    history_gap,
    parse_rate_headers,
)

log = structlog.get_logger()

# An error body is only read for its problem detail; a misbehaving server cannot make us read more.
_MAX_ERROR_BODY = 64 * 1024


def _warm_up(urls: Sequence[str]) -> None:
    """Pay httpx's one-time costs at start-up rather than at the start of a term.

    A process's first client imports httpcore and its HTTP/1.1 and HTTP/2 machinery lazily and its
    first request encodes a host name (the idna codec): together 50 ms to 150 ms on a busy machine,
    which a standby taking over would otherwise spend between ``became-leader`` and its first
    request.
    """
    httpx.AsyncHTTPTransport(verify=ssl_context())  # no connection is opened
    for url in urls:
        httpx.Request("GET", url)


def _check_url(url: str) -> str:
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"Horizon URL {url!r} must be an http:// or https:// URL with a host")
    return url


def _urls(value: Sequence[str] | str) -> tuple[str, ...]:
    urls = (value,) if isinstance(value, str) else tuple(value)
    if not urls:
        raise ValueError("at least one Horizon URL is needed")
    return tuple(_check_url(u) for u in urls)


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class HorizonSource:
    """A :class:`~actors.source.Source` reading one Horizon collection.

    Args:
        urls: Horizon base URLs (a single string is accepted). The source sticks to the first
            that works and moves to the next after ``attempts_per_url`` consecutive failures.
        resource: the collection path: ``/ledgers``, ``/transactions``, ``/operations``,
            ``/payments``, ``/effects`` or a scoped one such as ``/accounts/G.../payments``.
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds a page request may sit without receiving data; a whole page
            request is bounded by ``connect_timeout + 2 * read_timeout``.
        stream_idle_timeout: seconds an open SSE stream may stay silent before we reconnect.
            Horizon sends no heartbeats and closes streams itself after about 55 s, so keep this
            above a ledger interval; an idle stream is reconnected, not counted as a failure.
        retry_base, retry_cap: backoff for the n-th consecutive failure is jittered within
            ``[e/2, e]``, ``e = min(retry_cap, retry_base * 2**(n-1))``.
        attempts_per_url: consecutive failures on one URL before moving to the next.
        malformed_retries: refetches of the same malformed data before giving up.
        retry_after_cap: the longest ``Retry-After`` (429, 503) we honour, in seconds.
        not_found_give_up: seconds every URL must have answered 404 for an account-scoped
            collection (an account not ingested yet) before the source gives up.
        stream_quick_close: a stream that ends without records after at least this many seconds
            open is reopened at once (Horizon closes quiet streams after 55 s); one that ends
            sooner backs off.
        page_limit: records per page (``limit``), at most 200.
        stream_batch_window: seconds the streaming batcher waits for more records to join a
            batch once one arrived.
        prefetch: batches fetched ahead of the consumer.
        commit_max_records: batches already waiting are handed on merged, up to this many records
            (one commit instead of several).
        on_history_gap: ``"stop"`` or ``"skip"``: what to do when the cursor is older than the
            Horizon's retained history (checked from ``/`` before following and after each switch
            to another URL). Stop: log ``history-gap`` and raise SourceFatalError before reading
            anything. Skip: write a ``history-gap`` audit entry (through ``audit``), log it, and
            go on from the oldest retained ledger.
        stale_check_interval: seconds between reads of every URL's ``/`` to notice that the URL
            in use is stale (0: never; only with several URLs).
        stale_after_ledgers: the URL in use is stale when its ``history_latest_ledger`` is more
            than this many ledgers behind its ``core_latest_ledger`` or another URL's; the
            source then moves to the freshest URL and logs ``horizon-stale``.
        audit: ``await audit(event, fields)`` appends an entry to the job's audit trail under the
            current term and returns False when the term's token is no longer current.

    Raises:
        ValueError: a bad URL, resource or setting (a configuration error).
    """

    urls: tuple[str, ...] = attrs.field(converter=_urls)
    resource: str = attrs.field(
        default="/operations", validator=lambda _i, _a, v: check_resource(v)
    )
    connect_timeout: float = attrs.field(default=5.0, validator=_positive)
    read_timeout: float = attrs.field(default=30.0, validator=_positive)
    stream_idle_timeout: float = attrs.field(default=65.0, validator=_positive)
    retry_base: float = attrs.field(default=0.25, validator=_positive)
    retry_cap: float = attrs.field(default=30.0, validator=_positive)
    attempts_per_url: int = 3
    malformed_retries: int = 5
    retry_after_cap: float = attrs.field(default=120.0, validator=_positive)
    stream_quick_close: float = 10.0
    not_found_give_up: float = 120.0
    page_limit: int = MAX_PAGE_LIMIT
    stream_batch_window: float = 0.005
    prefetch: int = 8
    # When a request last succeeded, since when all have failed (source-aware leadership).
    health: SourceHealth = attrs.field(factory=SourceHealth, eq=False)
    # Overlapped catch-up (ingestion/horizon/catchup.py): page requests in flight at once while far behind
    # (1: strictly sequential), and the size of each ledger range, in pages.
    parallel_requests: int = 1
    pages_per_range: int = 4
    # Batches waiting in the prefetch queue are merged into one of at most this many records.
    commit_max_records: int = 1000
    on_history_gap: str = attrs.field(
        default="stop", validator=attrs.validators.in_(("stop", "skip"))
    )
    audit: Callable[[str, dict[str, str]], Awaitable[bool]] | None = None
    stale_check_interval: float = 30.0
    stale_after_ledgers: int = 10
    _pacers: dict[str, RatePacer] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.policy  # noqa: B018 -- validates the retry settings now, not on first stream
        if not 1 <= self.page_limit <= MAX_PAGE_LIMIT:
            raise ValueError(f"page_limit {self.page_limit} must be within 1..{MAX_PAGE_LIMIT}")
        if self.prefetch < 0 or self.stream_batch_window < 0:
            raise ValueError("prefetch and stream_batch_window must be >= 0")
        _warm_up(self.urls)

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            base=self.retry_base,
            cap=self.retry_cap,
            attempts_per_url=self.attempts_per_url,
            malformed_retries=self.malformed_retries,
            retry_after_cap=self.retry_after_cap,
            stream_quick_close=self.stream_quick_close,
            not_found_give_up=self.not_found_give_up,
        )

    async def probe(self) -> bool:
        """Ask for what the job reads, at each URL in turn until one answers both: its newest
        record (a page, ``order=desc&limit=1``) and its stream (opened from ``now`` with
        ``Accept: text/event-stream``, held until Horizon's first frame, the ``hello``, then
        closed). A Horizon that answers ``/`` but fails the job's requests, or answers pages but
        blocks or buffers streams (a proxy), is failing for this job, which follows the stream
        at the tip. Records nothing (the source watch does). Each of the two requests is bounded
        by the connect timeout plus the read timeout (at most 5 s)."""
        read = min(self.read_timeout, 5.0)
        timeout = httpx.Timeout(read, connect=self.connect_timeout)
        path, extra = split_resource(self.resource)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=True, verify=ssl_context()) as client:
            for base in self.urls:
                url = f"{base.rstrip('/')}{path}"
                try:
                    with trio.fail_after(self.connect_timeout + read):
                        response = await client.get(url, params={**extra, "order": "desc", "limit": "1"})
                    if response.status_code != 200:
                        continue
                    with trio.fail_after(self.connect_timeout + read):
                        if await _stream_says_hello(client, url, {**extra, "cursor": "now"}):
                            return True
                except (httpx.HTTPError, SSEError, trio.TooSlowError):
                    continue
        return False

    def follower(self, cursor: str) -> HorizonFollower:
        """A fresh follower for ``cursor`` (raises SourceFatalError for a bad cursor)."""
        return HorizonFollower(
            self.urls, self.resource, cursor, self.policy, page_limit=self.page_limit
        )

    async def resolve_start(self, cursor: str) -> str:
        """``"now"`` as a concrete paging token: the collection's newest record (``"0"`` when it is
        empty), asked of the URLs in turn with the source's backoff; other cursors unchanged.

        Raises:
            SourceFatalError: Horizon rejects the request for good (e.g. an unknown account).
        """
        if cursor != "now":
            return cursor
        policy = self.policy
        timeout = httpx.Timeout(self.read_timeout, connect=self.connect_timeout)
        attempt = 0
        not_found = NotFoundTracker(self.urls, policy.not_found_give_up)
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=True, verify=ssl_context()
        ) as client:
            while True:
                base = self.urls[(attempt // policy.attempts_per_url) % len(self.urls)]
                path, extra = split_resource(self.resource)
                url = f"{base.rstrip('/')}{path}"
                params = {**extra, "order": "desc", "limit": "1"}
                retry_after = None
                try:
                    pacer = await self._pace(base)
                    response = None
                    try:
                        with trio.fail_after(self.connect_timeout + 2 * self.read_timeout):
                            response = await client.get(url, params=params)
                    finally:
                        _answered(pacer, response)
                    body = response.content
                    if response.status_code == 200:
                        self.health.ok(trio.current_time())
                        records = json.loads(body)["_embedded"]["records"]
                        token = str(records[0]["paging_token"]) if records else "0"
                        if token != "0":
                            token_key(token)
                        log.info("horizon-now-resolved", url=base, resource=self.resource, cursor=token)
                        return token
                    failure = _failure_of(response, body[:_MAX_ERROR_BODY])
                    if response.status_code == 404 and is_entity_scoped(self.resource):
                        if not_found.not_found(base, trio.current_time()):
                            message = fatal_message(404, url, failure.error)
                            log.error("horizon-fatal", error=message)
                            raise SourceFatalError(message)
                    elif not is_retryable_status(response.status_code):
                        message = fatal_message(response.status_code, url, failure.error)
                        log.error("horizon-fatal", error=message)
                        raise SourceFatalError(message)
                    error, retry_after = f"HTTP {response.status_code}: {failure.error}", failure.retry_after
                except (httpx.HTTPError, trio.TooSlowError) as exc:
                    error = describe(exc)
                except (ValueError, LookupError, TypeError) as exc:
                    error = f"malformed page: {describe(exc)}"
                self.health.failed(trio.current_time())
                attempt += 1
                delay = policy.delay(attempt, random.random())
                if retry_after is not None:
                    delay = max(delay, min(retry_after, policy.retry_after_cap))
                log.warning("horizon-retry", attempt=attempt, delay=round(delay, 3), error=error, url=url)
                await trio.sleep(delay)

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        """Batches of records strictly after ``cursor`` (``"now"``, ``"0"`` or a paging token).

        Runs until cancelled; raises SourceFatalError when Horizon rejects the request for good
        (bad cursor, unknown account or path) or keeps sending the same malformed data.
        """
        follower = self.follower(cursor)
        log.info(
            "horizon-follow",
            url=follower.base_url,
            resource=self.resource,
            cursor=cursor,
            mode=follower.mode.value,
        )
        fatal: list[SourceFatalError] = []
        send, receive = trio.open_memory_channel[Batch](self.prefetch)
        timeout = httpx.Timeout(
            connect=self.connect_timeout,
            read=self.read_timeout,
            write=self.read_timeout,
            pool=self.connect_timeout,
        )
        async with (
            httpx.AsyncClient(
                timeout=timeout, follow_redirects=True, verify=ssl_context()
            ) as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(self._pump, client, follower, send, fatal)
            with receive:
                async for batch in receive:
                    # Pages already waiting go out as one batch (one commit): while catching up,
                    # fewer and larger commits leave more of the one thread to everything else.
                    records = list(batch.records)
                    while len(records) < self.commit_max_records:
                        try:
                            records.extend(receive.receive_nowait().records)
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    yield Batch(tuple(records)) if len(records) > len(batch.records) else batch
        if fatal:
            raise fatal[0]

    # -- the pump: owns the follower

    async def _pump(
        self,
        client: httpx.AsyncClient,
        follower: HorizonFollower,
        out: trio.MemorySendChannel[Batch],
        fatal: list[SourceFatalError],
    ) -> None:
        with out:
            try:
                checked: str | None = None  # the URL whose retained history was checked
                if (
                    self.parallel_requests > 1
                    and follower.mode is Mode.CATCH_UP
                    and overlappable(self.resource)
                    and await self._check_history(client, follower)  # never a silent gap
                ):
                    checked = follower.base_url
                    follower = await self._overlapped(client, follower, out)
                async with trio.open_nursery() as nursery:
                    ahead: _PageAhead | None = None
                    switch = _Switch()
                    if len(self.urls) > 1 and self.stale_check_interval > 0:
                        nursery.start_soon(self._watch_staleness, client, follower, switch)
                    while True:
                        if switch.to is not None:
                            follower.switch_url(switch.to)
                            switch.to = None
                        if follower.base_url != checked:
                            # Each term start and each switch of URL: is our cursor still in
                            # this Horizon's history?
                            if not await self._check_history(client, follower):
                                await trio.sleep(follower.take_delay())
                                continue
                            checked = follower.base_url
                        attempt = follower.next_attempt()
                        if attempt.delay > 0:
                            await trio.sleep(attempt.delay)
                        if ahead is not None and ahead.request != attempt.request:
                            ahead.scope.cancel()  # speculation missed: nothing of it is used
                            ahead = None
                        if isinstance(attempt.request, PageRequest):
                            ahead = await self._fetch_page(
                                client, follower, attempt.request, out, ahead, nursery
                            )
                        else:
                            await self._follow_stream(
                                client, follower, attempt.request, out, switch
                            )
            except* SourceFatalError as group:
                exc = _leaves(group)[0]
                log.error("horizon-fatal", error=str(exc), cursor=follower.cursor)
                fatal.append(exc)
            except* trio.BrokenResourceError:
                pass  # the consumer went away

    async def _get_page(
        self, client: httpx.AsyncClient, request: PageRequest
    ) -> tuple[httpx.Response | None, Failure | None]:
        """One page request, bounded as a whole: (the 200 response, None) or (None, why not)."""
        failure: Failure | None = None
        response: httpx.Response | None = None
        pacer = await self._pace(request.base_url)
        try:
            with trio.move_on_after(self.connect_timeout + 2 * self.read_timeout) as scope:
                try:
                    response = await client.get(request.url, params=request.params)
                except httpx.HTTPError as exc:  # transport, decoding, too many redirects
                    failure = Failure(None, describe(exc))
        finally:
            _answered(pacer, response)
        if scope.cancelled_caught:
            failure = Failure(None, "page request timed out")
        elif response is not None and response.status_code != 200:
            failure = _failure_of(response, response.content[:_MAX_ERROR_BODY])
        if failure is not None or response is None:
            return None, failure or Failure(None, "no response")
        return response, None

    async def _fetch_page(
        self,
        client: httpx.AsyncClient,
        follower: HorizonFollower,
        request: PageRequest,
        out: trio.MemorySendChannel[Batch],
        ahead: _PageAhead | None,
        nursery: trio.Nursery,
    ) -> _PageAhead | None:
        """Fetch (or take the speculatively fetched) page, hand its records on; return the
        speculative request for the page after it, already on its way, if this page was full."""
        if ahead is not None:
            await ahead.done.wait()
            response, failure = ahead.response, ahead.failure
        else:
            response, failure = await self._get_page(client, request)
        if response is None:
            self._failed(follower, failure or Failure(None, "no response"), request)
            return None
        self.health.ok(trio.current_time())
        content = response.content
        nxt = self._speculate(request, content, follower.grown_limit(request.limit))
        if nxt is not None:
            nursery.start_soon(self._fetch_ahead, client, nxt)
        outcome = follower.on_page(content)
        if outcome.records:
            await out.send(Batch(outcome.records))
        if outcome.malformed is not None:
            self._malformed(follower, outcome.malformed, request)
        elif follower.mode is Mode.STREAMING:
            log.info("horizon-caught-up", cursor=follower.cursor, url=request.base_url)
        return nxt

    # -- overlapped catch-up (see ingestion/horizon/catchup.py)

    async def _overlapped(
        self, client: httpx.AsyncClient, follower: HorizonFollower, out: trio.MemorySendChannel[Batch]
    ) -> HorizonFollower:
        """Catch up through ledger ranges paged side by side, their records sent strictly in
        order; returns the follower to go on with (sequential paging to the head, then the
        stream). Falls back to that follower at once when the history cannot be split (Horizon's
        root does not answer, the first page shows the job is nearly caught up)."""
        # The first page, sequentially: where we are, and how dense the history is.
        attempt = follower.next_attempt()
        request = attempt.request
        if not isinstance(request, PageRequest):
            return follower
        response, failure = await self._get_page(client, request)
        if response is None:
            self._failed(follower, failure or Failure(None, "no response"), request)
            return follower
        self.health.ok(trio.current_time())
        outcome = follower.on_page(response.content)
        if outcome.records:
            await out.send(Batch(outcome.records))
        if outcome.malformed is not None:
            self._malformed(follower, outcome.malformed, request)
            return follower
        if not outcome.full or follower.last_token is None:
            return follower
        first, last = ledger_of(outcome.records[0].paging_token), ledger_of(follower.last_token)
        span = max(1, last - first + 1)
        roots: dict[str, RootInfo | None] = {}
        await self._read_root(client, follower.base_url, roots)
        root = roots[follower.base_url]
        if root is None:
            return follower
        oldest, latest = root.history_elder_ledger, root.history_latest_ledger
        per_range = ledgers_per_range(len(outcome.records) / span, self.pages_per_range, self.page_limit)
        plan = plan_ranges(follower.last_token, oldest, latest, per_range)
        if len(plan) < 2:
            return follower
        log.info(
            "horizon-catch-up-overlapped", ranges=len(plan), ledgers_per_range=per_range,
            parallel=self.parallel_requests, cursor=follower.last_token, latest_ledger=latest,
        )  # fmt: skip
        cursor = follower.last_token
        limiter = trio.Semaphore(self.parallel_requests)
        window = 2 * self.parallel_requests  # ranges fetched ahead of the one being handed on
        async with trio.open_nursery() as nursery:
            pending: dict[int, trio.MemoryReceiveChannel[Batch]] = {}
            started = 0
            for index in range(len(plan)):
                while started < len(plan) and started < index + window:
                    send, receive = trio.open_memory_channel[Batch](self.pages_per_range + 2)
                    pending[started] = receive
                    nursery.start_soon(self._range, client, plan[started], send, limiter)
                    started += 1
                with pending.pop(index) as receive:
                    async for batch in receive:
                        await out.send(batch)
                        cursor = batch.cursor
        log.info("horizon-catch-up-ranges-done", cursor=cursor)
        return self.follower(cursor)

    async def _range(
        self,
        client: httpx.AsyncClient,
        rng: LedgerRange,
        out: trio.MemorySendChannel[Batch],
        limiter: trio.Semaphore,
    ) -> None:
        """Page one ledger range in order into ``out`` (retrying like the sequential path)."""
        follower = self.follower(rng.after)
        with out:
            while True:
                attempt = follower.next_attempt()
                if attempt.delay > 0:
                    await trio.sleep(attempt.delay)
                request = attempt.request
                if not isinstance(request, PageRequest):
                    return  # the range reached Horizon's head
                async with limiter:
                    response, failure = await self._get_page(client, request)
                if response is None:
                    self._failed(follower, failure or Failure(None, "no response"), request)
                    continue
                self.health.ok(trio.current_time())
                outcome = follower.on_page(response.content)
                kept = rng.kept(outcome.records)
                if kept:
                    await out.send(Batch(kept))
                if len(kept) < len(outcome.records):
                    return  # past the range's last ledger
                if outcome.malformed is not None:
                    self._malformed(follower, outcome.malformed, request)
                elif not outcome.full:
                    return

    def _speculate(self, request: PageRequest, content: bytes, limit: int) -> _PageAhead | None:
        """While this page is parsed and committed, Horizon can already render the next one: if
        the page looks full, guess the next request from its last paging token (a text search).
        The guess is used only if it equals the request the follower then decides on."""
        if content.count(b'"paging_token"') < request.limit:
            return None
        at = content.rfind(b'"paging_token": "')
        if at < 0:
            return None
        start = at + len(b'"paging_token": "')
        end = content.find(b'"', start)
        token = content[start:end].decode("ascii", "replace")
        return _PageAhead(attrs.evolve(request, cursor=token, limit=limit))

    async def _fetch_ahead(self, client: httpx.AsyncClient, ahead: _PageAhead) -> None:
        with ahead.scope:
            ahead.response, ahead.failure = await self._get_page(client, ahead.request)
        ahead.done.set()

    # -- rate limit

    async def _pace(self, base: str) -> RatePacer:
        """Wait until the rate limit of ``base`` allows one more request (by the X-RateLimit
        headers seen so far) and count it; the caller reports its answer with ``_answered``."""
        pacer = self._pacers.get(base)
        if pacer is None:
            pacer = self._pacers[base] = RatePacer()
        delay = pacer.reserve(trio.current_time())
        if delay > 0:
            log.debug("horizon-rate-paced", delay=round(delay, 3), url=base)
            try:
                await trio.sleep(delay)
            except BaseException:
                pacer.answered(trio.current_time(), None)
                raise
        return pacer

    # -- staleness

    async def _watch_staleness(
        self, client: httpx.AsyncClient, follower: HorizonFollower, switch: _Switch
    ) -> None:
        """Every ``stale_check_interval``, read every URL's ``/``; when the URL in use is stale,
        log ``horizon-stale`` and have the pump move to the freshest URL."""
        while True:
            await trio.sleep(self.stale_check_interval)
            current = follower.base_url
            roots: dict[str, RootInfo | None] = {}
            async with trio.open_nursery() as nursery:
                for url in follower.urls:
                    nursery.start_soon(self._read_root, client, url, roots)
            if follower.base_url != current or switch.to is not None:
                continue  # moved meanwhile: judge the new one next time
            stale = assess_staleness(current, roots, self.stale_after_ledgers)
            if stale is None:
                continue
            log.warning(
                "horizon-stale",
                horizon=current,
                history_latest_ledger=stale.history_latest_ledger,
                core_latest_ledger=stale.core_latest_ledger,
                freshest=stale.freshest,
                freshest_ledger=stale.freshest_ledger,
                to_url=stale.switch_to,
                cursor=follower.cursor,
            )
            if stale.switch_to is not None:
                switch.request(stale.switch_to)

    async def _read_root(
        self, client: httpx.AsyncClient, base: str, out: dict[str, RootInfo | None]
    ) -> None:
        """``/`` of ``base`` parsed into ``out[base]`` (None when it cannot be read)."""
        out[base] = None
        pacer = await self._pace(base)
        response = None
        try:
            with trio.move_on_after(self.connect_timeout + 2 * self.read_timeout):
                response = await client.get(base + "/")
                if response.status_code == 200:
                    out[base] = RootInfo.parse(response.content)
        except (httpx.HTTPError, ValueError):
            pass
        finally:
            _answered(pacer, response)

    # -- history retention

    async def _check_history(self, client: httpx.AsyncClient, follower: HorizonFollower) -> bool:
        """Compare the cursor with the Horizon's ``history_elder_ledger`` (from ``/``).

        Returns True to go on (no gap, or a gap skipped), False when ``/`` could not be read (the
        follower has scheduled a retry, maybe on another URL).

        Raises:
            SourceFatalError: a history gap and ``on_history_gap`` is ``"stop"``.
        """
        try:
            if cursor_ledger(follower.cursor) is None:
                return True  # no position in history: nothing can be skipped
        except InvalidPagingToken:
            return True  # Horizon rejects it with its own clear error
        base = follower.base_url
        url = base + "/"
        response: httpx.Response | None = None
        failure: Failure | None = None
        pacer = await self._pace(base)
        try:
            with trio.move_on_after(self.connect_timeout + 2 * self.read_timeout) as scope:
                try:
                    response = await client.get(url)
                except httpx.HTTPError as exc:
                    failure = Failure(None, describe(exc))
        finally:
            _answered(pacer, response)
        if scope.cancelled_caught:
            failure = Failure(None, "root request timed out")
        elif response is not None and response.status_code != 200:
            failure = _failure_of(response, response.content[:_MAX_ERROR_BODY])
        if failure is None and response is not None:
            try:
                info = RootInfo.parse(response.content)
            except ValueError as exc:
                failure = Failure(None, f"malformed root resource: {exc}")
        if failure is not None or response is None:
            self._failed(follower, failure or Failure(None, "no response"), url)
            return False
        gap = history_gap(follower.cursor, info.history_elder_ledger, follower.path)
        if gap is None:
            return True
        fields = {
            "cursor": gap.cursor,
            "cursor_ledger": gap.cursor_ledger,
            "elder_ledger": gap.elder_ledger,
            "horizon": base,
        }
        problem = await record_history_gap(
            fields,
            on_history_gap=self.on_history_gap,
            audit=self.audit,
            stop_message=(
                f"history gap: the cursor {gap.cursor} (ledger {gap.cursor_ledger}) is older than "
                f"the oldest ledger {gap.elder_ledger} that {base} keeps; resuming would silently "
                "skip the records in between, so nothing was written. Point --horizon at a "
                "Horizon with more history, or set horizon.on_history_gap = \"skip\" to record "
                "the gap in the audit stream and go on from the oldest ledger"
            ),
            resume={"resume_cursor": gap.resume_cursor},
        )
        if problem is not None:
            self._failed(follower, Failure(None, problem), url)
            return False
        follower.skip_to(gap.resume_cursor)
        return True

    # -- streaming

    async def _follow_stream(
        self,
        client: httpx.AsyncClient,
        follower: HorizonFollower,
        request: StreamRequest,
        out: trio.MemorySendChannel[Batch],
        switch: _Switch,
    ) -> None:
        send, receive = trio.open_memory_channel[Record](follower.page_limit)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stream, client, follower, request, send, switch)
            await self._batch_stream(receive, out)

    async def _batch_stream(
        self, receive: trio.MemoryReceiveChannel[Record], out: trio.MemorySendChannel[Batch]
    ) -> None:
        """Gather records that arrive together (within the batch window, up to a page)."""
        limit = self.page_limit
        with receive:
            while True:
                try:
                    batch = [await receive.receive()]
                except trio.EndOfChannel:
                    return
                with trio.move_on_after(self.stream_batch_window):
                    while len(batch) < limit:
                        try:
                            batch.append(await receive.receive())
                        except trio.EndOfChannel:
                            break
                await out.send(Batch(tuple(batch)))

    async def _read_stream(
        self,
        client: httpx.AsyncClient,
        follower: HorizonFollower,
        request: StreamRequest,
        records: trio.MemorySendChannel[Record],
        switch: _Switch,
    ) -> None:
        """One SSE connection: validated records go to ``records``; the end goes to the follower.

        The staleness watcher may cut the connection short (``switch``), but never while a record
        is being handed on: only the wait for Horizon is cancelled, so no record is lost.
        """
        got = 0
        opened = False
        opened_at = 0.0
        idle = self.stream_idle_timeout
        # httpx's own read timeout is only a backstop; the idle deadline below is the real one.
        timeout = httpx.Timeout(
            connect=self.connect_timeout,
            read=idle + self.read_timeout,
            write=self.read_timeout,
            pool=self.connect_timeout,
        )
        with records:
            pacer = await self._pace(request.base_url)
            paced: RatePacer | None = pacer
            try:
                # Until the response head arrives: the connect and read timeouts.
                with (
                    trio.CancelScope() as cut,
                    trio.CancelScope(
                        deadline=trio.current_time() + self.connect_timeout + self.read_timeout
                    ) as scope,
                ):
                    switch.scope = cut
                    async with aconnect_sse(
                        client,
                        "GET",
                        request.url,
                        params=request.params,
                        headers=request.headers,
                        timeout=timeout,
                    ) as source:
                        response = source.response
                        paced = None
                        _answered(pacer, response)
                        if response.status_code != 200:
                            body = await _read_bounded(response)
                            self._failed(follower, _failure_of(response, body), request)
                            return
                        follower.on_stream_open()
                        self.health.ok(trio.current_time())
                        opened, opened_at = True, trio.current_time()
                        log.debug(
                            "horizon-stream-open", url=request.base_url, cursor=request.cursor
                        )
                        scope.deadline = trio.current_time() + idle
                        async with aclosing(source.aiter_sse()) as events:
                            async for sse in events:
                                self.health.ok(trio.current_time())
                                result = follower.on_stream_event(sse.event, sse.id, sse.data)
                                if isinstance(result, Record):
                                    got += 1
                                    try:
                                        records.send_nowait(result)
                                    except trio.WouldBlock:
                                        # Waiting for our own consumer is not Horizon idling.
                                        scope.deadline = math.inf
                                        switch.scope = None
                                        await records.send(result)
                                        switch.scope = cut
                                        if switch.to is not None:
                                            break
                                elif result is StreamSignal.CLOSED:
                                    break
                                elif result is StreamSignal.ERROR:
                                    error = f"stream error event: {sse.data[:200]}"
                                    self._failed(follower, Failure(None, error), request)
                                    return
                                elif isinstance(result, Malformed):
                                    self._malformed(follower, result, request)
                                    return
                                scope.deadline = trio.current_time() + idle
                if switch.to is not None:
                    log.info(
                        "horizon-stream-reconnect",
                        reason="stale",
                        records=got,
                        cursor=follower.cursor,
                        delay=0,
                        url=request.base_url,
                    )
                    return  # the pump moves to the URL the watcher chose
                if scope.cancelled_caught and not opened:
                    self._failed(follower, Failure(None, "stream request timed out"), request)
                    return
                reason = "idle" if scope.cancelled_caught else "closed"
            except (httpx.HTTPError, SSEError) as exc:
                if got == 0:
                    self._failed(follower, Failure(None, describe(exc)), request)
                    return
                # The records so far were good: reopen from the last one, like a clean close.
                reason = f"dropped: {describe(exc)}"
            finally:
                switch.scope = None
                if paced is not None:  # no response head: the request is over all the same
                    _answered(paced, None)
            open_for = trio.current_time() - opened_at if opened else 0.0
            delay = follower.on_stream_end(got_records=got > 0, open_for=open_for)
            log.info(
                "horizon-stream-reconnect",
                reason=reason,
                records=got,
                cursor=follower.cursor,
                delay=round(delay, 3),
                url=request.base_url,
            )

    # -- logging the follower's decisions

    def _failed(self, follower: HorizonFollower, failure: Failure, request: object) -> None:
        self.health.failed(trio.current_time())
        url = _request_url(request)
        limit = follower.limit
        retry = follower.on_failure(failure, url=url, now=trio.current_time())
        _log_retry(follower, retry, status=failure.status, error=failure.error, url=url)
        if follower.limit < limit:
            log.warning("horizon-page-limit-reduced", limit=follower.limit, status=failure.status, url=url)

    def _malformed(self, follower: HorizonFollower, bad: Malformed, request: object) -> None:
        url = _request_url(request)
        log.warning(
            "horizon-malformed-record",
            reason=bad.reason,
            value=bad.value,
            url=url,
            cursor=follower.cursor,
        )
        retry = follower.last_retry
        if retry is not None:
            _log_retry(follower, retry, status=200, error=f"malformed: {bad.reason}", url=url)


def _log_retry(
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


# -- helpers


@attrs.define(eq=False)
class _Switch:
    """The staleness watcher's request to the pump: move to ``to``. ``scope`` is the wait for a
    stream's next event, the only thing the watcher may cut short (None while a record is being
    handed on)."""

    to: str | None = None
    scope: trio.CancelScope | None = None

    def request(self, url: str) -> None:
        self.to = url
        if self.scope is not None:
            self.scope.cancel("the Horizon in use is stale")


@attrs.define(eq=False)
class _PageAhead:
    """A page request sent before the follower asked for it (pipelining during catch-up)."""

    request: PageRequest
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    response: httpx.Response | None = None
    failure: Failure | None = None


def _leaves(group: BaseExceptionGroup[SourceFatalError]) -> list[SourceFatalError]:
    out: list[SourceFatalError] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


def _request_url(request: object) -> str:
    if isinstance(request, PageRequest | StreamRequest):
        query = "&".join(f"{k}={v}" for k, v in request.params.items())
        return f"{request.url}?{query}"
    return str(request)


def _answered(pacer: RatePacer, response: httpx.Response | None) -> None:
    rate = None if response is None else parse_rate_headers(response.headers)
    pacer.answered(trio.current_time(), rate)


def _failure_of(response: httpx.Response, body: bytes) -> Failure:
    status = response.status_code
    retry_after = None
    if status in (429, 503):  # Horizon's limiter, and an overloaded or stale server
        retry_after = parse_retry_after(response.headers.get("Retry-After"), time.time())
    return Failure(status, problem_detail(body), retry_after)


async def _stream_says_hello(client: httpx.AsyncClient, url: str, params: dict[str, str]) -> bool:
    """Open the stream at ``url`` and wait for its first frame (Horizon's ``hello``, sent before
    any record): True if it came with a 200 event stream. The caller bounds the wait."""
    async with aconnect_sse(client, "GET", url, params=params) as source:
        if source.response.status_code != 200:
            return False
        async with aclosing(source.aiter_sse()) as frames:
            async for _frame in frames:
                return True
    return False


async def _read_bounded(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= _MAX_ERROR_BODY:
            break
    return b"".join(chunks)[:_MAX_ERROR_BODY]
