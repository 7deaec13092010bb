"""The Horizon source: :class:`HorizonSource`, which the Horizon I/O modules make up.

:class:`HorizonSource` follows a Horizon collection (``/operations``, ``/accounts/G.../payments``,
...) from a cursor: it catches up with ``order=asc`` pages, then follows the Server-Sent Event
stream, across reconnects, retries and failover between several Horizon URLs. Every decision
(which request next, validation, backoff, failover, giving up) is made by the I/O-free
:class:`~ingestion.horizon.follower.HorizonFollower`; the source only carries the requests out, bounds
every wait, and logs. It composes the I/O modules beside it: :mod:`~ingestion.horizon.exchange`
(what every request shares: rate pacing, failures, logging the follower's decisions),
:mod:`~ingestion.horizon.overlapped` (overlapped catch-up), :mod:`~ingestion.horizon.streaming`
(following the stream) and :mod:`~ingestion.horizon.roots` (roots, staleness and the completeness
look); the probe, the ``now`` lookup, the pump, sequential paging and the history check are here.
Each batch handed on carries the job's completeness watermark
(:mod:`~ingestion.horizon.completeness`).

Shape of ``stream(cursor)``: one pump task owns the follower and the HTTP client and sends
:class:`Batch` values into a small buffer, so the next page is fetched while the consumer commits
the previous one. While streaming, a reader task feeds validated records to a batcher that gathers
whatever arrives within a few milliseconds (up to a page) into one batch.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing

import attrs
import httpx
import structlog
import trio
from httpx_sse import SSEError, aconnect_sse

from actors.health import SourceHealth
from actors.source import Batch, SourceFatalError, Watermark
from ingestion.common.gaps import record_history_gap
from ingestion.common.http import describe, source_urls, ssl_context
from ingestion.common.network import SourceLook
from ingestion.common.paging import InvalidPagingToken, token_key
from ingestion.common.retry import RetryPolicy
from ingestion.horizon.catchup import overlappable
from ingestion.horizon.completeness import Completeness
from ingestion.horizon.exchange import (
    MAX_ERROR_BODY,
    answered,
    bounded_get,
    failed,
    failure_of,
    get_page,
    malformed,
    pace,
)
from ingestion.horizon.failures import (
    Failure,
    NotFoundTracker,
    fatal_message,
    is_entity_scoped,
    is_retryable_status,
)
from ingestion.horizon.follower import HorizonFollower, Mode, PageRequest
from ingestion.horizon.health import RatePacer, RootInfo, cursor_ledger, history_gap
from ingestion.horizon.overlapped import overlapped
from ingestion.horizon.resources import MAX_PAGE_LIMIT, STREAM_LIMIT, check_resource, split_resource
from ingestion.horizon.roots import Switch, look_for_quiet, network_looks, watch_staleness
from ingestion.horizon.streaming import follow_stream

log = structlog.get_logger()


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


def _urls(value: Sequence[str] | str) -> tuple[str, ...]:
    return source_urls(value, "Horizon")


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
        complete_check_interval: seconds between completeness looks while the stream hands
            nothing on (the root and one record after the position: a quiet job's watermark
            follows Horizon's ledgers); 0: never (the watermark moves with records only).
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
    complete_check_interval: float = 5.0
    # One rate pacer per Horizon base URL, shared by every request of the source (exchange.pace).
    pacers: dict[str, RatePacer] = attrs.field(factory=dict, init=False, eq=False, repr=False)

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

    async def network_looks(self, ledger: int | None) -> list[SourceLook]:
        """What each URL says of its network (ingestion/node/network.py asks)."""
        return await network_looks(self, self.urls, ledger)

    async def probe(self) -> bool:
        """Ask for what the job reads, at each URL in turn until one answers both: its newest
        record (a page, ``order=desc&limit=1``) and its stream (opened from ``now`` with
        ``Accept: text/event-stream`` and the follower's ``limit=200``: Horizon closes a stream
        after ``limit`` records, 10 by default; held until Horizon's first frame, the ``hello``,
        then closed). A Horizon that answers ``/`` but fails the job's requests, or answers pages but
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
                        stream_params = {**extra, "limit": str(STREAM_LIMIT), "cursor": "now"}
                        if await _stream_says_hello(client, url, stream_params):
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
                    pacer = await pace(self, base)
                    response = None
                    try:
                        with trio.fail_after(self.connect_timeout + 2 * self.read_timeout):
                            response = await client.get(url, params=params)
                    finally:
                        answered(pacer, response)
                    body = response.content
                    if response.status_code == 200:
                        self.health.ok(trio.current_time())
                        records = json.loads(body)["_embedded"]["records"]
                        token = str(records[0]["paging_token"]) if records else "0"
                        if token != "0":
                            token_key(token)
                        log.info("horizon-now-resolved", url=base, resource=self.resource, cursor=token)
                        return token
                    failure = failure_of(response, body[:MAX_ERROR_BODY])
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
        completeness = Completeness(self.resource, received=follower.cursor)
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
            nursery.start_soon(self._pump, client, follower, send, fatal, completeness)
            with receive:
                async for batch in receive:
                    # Pages already waiting go out as one batch (one commit): while catching up,
                    # fewer and larger commits leave more of the one thread to everything else.
                    batches = [batch]
                    count = len(batch.records)
                    while count < self.commit_max_records:
                        try:
                            batches.append(receive.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                        count += len(batches[-1].records)
                    yield _merged(batches, completeness)
        if fatal:
            raise fatal[0]

    # -- the pump: owns the follower

    async def _pump(
        self,
        client: httpx.AsyncClient,
        follower: HorizonFollower,
        out: trio.MemorySendChannel[Batch],
        fatal: list[SourceFatalError],
        completeness: Completeness,
    ) -> None:
        with out:
            try:
                checked: str | None = None  # the URL whose retained history was checked
                if (
                    self.parallel_requests > 1
                    and follower.mode is Mode.CATCH_UP
                    and overlappable(self.resource)
                    and await self._check_history(client, follower, completeness)  # never a silent gap
                ):
                    checked = follower.base_url
                    follower = await overlapped(self, client, follower, out)
                async with trio.open_nursery() as nursery:
                    ahead: _PageAhead | None = None
                    switch = Switch()
                    if len(self.urls) > 1 and self.stale_check_interval > 0:
                        nursery.start_soon(watch_staleness, self, client, follower, switch)
                    if self.complete_check_interval > 0:
                        nursery.start_soon(
                            look_for_quiet, self, client, follower, completeness, out,
                            self.complete_check_interval,
                        )  # fmt: skip
                    while True:
                        if switch.to is not None:
                            follower.switch_url(switch.to)
                            switch.to = None
                        if follower.base_url != checked:
                            # Each term start and each switch of URL: is our cursor still in
                            # this Horizon's history?
                            if not await self._check_history(client, follower, completeness):
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
                            await follow_stream(self, client, follower, attempt.request, out, switch)
            except* SourceFatalError as group:
                exc = _leaves(group)[0]
                log.error("horizon-fatal", error=str(exc), cursor=follower.cursor)
                fatal.append(exc)
            except* trio.BrokenResourceError:
                pass  # the consumer went away

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
            response, failure = await get_page(self, client, request)
        if response is None:
            failed(self, follower, failure or Failure(None, "no response"), request)
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
            malformed(follower, outcome.malformed, request)
        elif follower.mode is Mode.STREAMING:
            log.info("horizon-caught-up", cursor=follower.cursor, url=request.base_url)
        return nxt

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
            ahead.response, ahead.failure = await get_page(self, client, ahead.request)
        ahead.done.set()

    # -- history retention

    async def _check_history(
        self, client: httpx.AsyncClient, follower: HorizonFollower, completeness: Completeness
    ) -> bool:
        """Compare the cursor with the Horizon's ``history_elder_ledger`` (from ``/``).

        Returns True to go on (no gap, or a gap skipped: ``completeness`` then holds the
        watermark before it), False when ``/`` could not be read (the follower has scheduled a
        retry, maybe on another URL).

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
        response, failure = await bounded_get(self, client, base, url, what="root")
        if failure is None and response is not None:
            try:
                info = RootInfo.parse(response.content)
            except ValueError as exc:
                failure = Failure(None, f"malformed root resource: {exc}")
        if failure is not None or response is None:
            failed(self, follower, failure or Failure(None, "no response"), url)
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
            failed(self, follower, Failure(None, problem), url)
            return False
        completeness.hold(
            follower.cursor, gap.resume_cursor,
            f"history gap: ledgers before {gap.elder_ledger} are gone from {base}",
        )  # fmt: skip
        follower.skip_to(gap.resume_cursor)
        return True


# -- helpers


@attrs.define(eq=False)
class _PageAhead:
    """A page request sent before the follower asked for it (pipelining during catch-up)."""

    request: PageRequest
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    response: httpx.Response | None = None
    failure: Failure | None = None


def _merged(batches: list[Batch], completeness: Completeness) -> Batch:
    """Consecutive batches as one, with the watermark once it is committed: the records in
    order, the last batch's read-through cursor (an earlier one is passed by the records after
    it)."""
    last = batches[-1]
    records = last.records if len(batches) == 1 else tuple(r for b in batches for r in b.records)
    taken = next((b.records[-1].paging_token for b in reversed(batches) if b.records), None)
    if taken is not None:
        completeness.received = taken
    mark: Watermark | None = completeness.mark(last.cursor)
    if len(batches) == 1 and mark == last.watermark:
        return last
    return Batch(records, through=last.through, watermark=mark)


def _leaves(group: BaseExceptionGroup[SourceFatalError]) -> list[SourceFatalError]:
    out: list[SourceFatalError] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


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
