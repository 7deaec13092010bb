"""The Stellar RPC source: the one module that talks HTTP to Stellar RPC.

:class:`RpcSource` follows contract events (``getEvents``) for a set of filters from a cursor, across
retries and failover between several RPC URLs. Every decision is made by the I/O-free
:class:`~ingestion.rpc.follower.RpcFollower`; this module sends the requests, bounds every wait, logs,
and writes the audit entry of a skipped history gap.

Shape of ``stream(cursor)``: a pump task owns the follower and the HTTP client and sends each
page's batches into a small buffer of pages, so that the next page is fetched while the consumer
commits the previous one.
Each event is one record (its ``id`` is the paging token, its JSON the body); a page that scanned
past its last event also carries the scanned-through cursor, committed with it.

History beyond RPC's window (``on_history_gap = "lake"``): when the position is older than the
oldest ledger every RPC URL keeps (the others are asked when one reports it; one that keeps it is
followed instead), the gap is recorded (a fenced ``history-gap`` audit entry with
``action: lake``), then the events are read from ``history`` (a data lake: the same events with the
same ids) from the position until every ledger before that oldest ledger is read, committed as
they come; the last lake object's scanned-through cursor ``through(L)`` is where a new follower
resumes on RPC (a request after it starts at ledger L + 1). So the stream is one ordering of ids
across the switch, and a failover in either phase resumes from the committed cursor: a cursor
still older than RPC's window goes back to the lake, one inside it stays on RPC. Should RPC's
oldest ledger have moved past L + 1 meanwhile, the gap is met again and the lake reads the rest.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import attrs
import httpx
import structlog
import trio

from actors.health import SourceHealth
from actors.source import Batch, Source, SourceFatalError
from ingestion.common.gaps import record_history_gap
from ingestion.common.http import SourceUnreadable, describe, source_urls, ssl_context
from ingestion.common.network import SourceLook
from ingestion.common.retry import RetryPolicy, parse_retry_after
from ingestion.rpc.follower import Note, Outcome, RpcFollower, parse_answer, read_events, request_body
from ingestion.rpc.protocol import Cursor, EventFilter, checked_filters

log = structlog.get_logger()

_MAX_BODY = 64 * 1024 * 1024  # a 10,000-event page is a few MB; refuse anything absurd
_MAX_ERROR_BODY = 4096


def _urls(value: Sequence[str] | str) -> tuple[str, ...]:
    return source_urls(value, "RPC")


def _one_url(value: str) -> str:
    return _urls(value)[0]


def _client(connect_timeout: float, request_timeout: float) -> httpx.AsyncClient:
    timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
    return httpx.AsyncClient(timeout=timeout, follow_redirects=True, verify=ssl_context())


async def post(
    client: httpx.AsyncClient, url: str, body: bytes, bound: float
) -> tuple[httpx.Response, bytes]:
    """POST a JSON-RPC body; the whole exchange bounded by ``bound`` seconds, the answer's body by
    its size (64 MiB; an error's is cut at 4 KiB).

    Raises:
        httpx.HTTPError, trio.TooSlowError: no answer.
    """
    with trio.fail_after(bound):
        headers = {"content-type": "application/json"}
        async with client.stream("POST", url, content=body, headers=headers) as response:
            chunks: list[bytes] = []
            size = 0
            limit = _MAX_BODY if response.status_code == 200 else _MAX_ERROR_BODY
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= limit:
                    if response.status_code == 200:
                        raise httpx.DecodingError(f"answer larger than {limit} bytes")
                    break
            return response, b"".join(chunks)


@attrs.frozen
class RpcReader:
    """A tool that reads a Stellar RPC once (``verify``, ``inspect``, ``backfill``), not a job's
    source: its URL checked as a source's are, each call's exchange bounded (:func:`post`) as
    theirs are.

    Args:
        url: the RPC's URL.
        connect_timeout, request_timeout: seconds; a call takes connect + request at most.

    Raises:
        ValueError: ``url`` is not an http:// or https:// URL with a host.
    """

    url: str = attrs.field(converter=_one_url)
    connect_timeout: float = 5.0
    request_timeout: float = 10.0

    def client(self) -> httpx.AsyncClient:
        return _client(self.connect_timeout, self.request_timeout)

    async def call(self, client: httpx.AsyncClient, method: str, params: Any = None) -> Any:
        """``method``'s result.

        Raises:
            SourceUnreadable: no answer (a transport error, none in time), a status other than
                200, a JSON-RPC error, or not a JSON-RPC answer.
        """
        bound = self.connect_timeout + self.request_timeout
        try:
            response, content = await post(client, self.url, request_body(method, 1, params), bound)
        except httpx.HTTPError as exc:
            raise SourceUnreadable(describe(exc)) from exc
        except trio.TooSlowError as exc:
            raise SourceUnreadable(f"{method}: no answer within {bound:g} s") from exc
        if response.status_code != 200:
            detail = content.decode("utf-8", "replace").strip() or response.reason_phrase
            raise SourceUnreadable(f"{method}: HTTP {response.status_code}: {detail[:200]}")
        try:
            result, error = parse_answer(content)
        except ValueError as exc:
            raise SourceUnreadable(f"{method}: {describe(exc)}") from exc
        if error is not None:
            raise SourceUnreadable(f"{method}: RPC error {error[0]}: {error[1]}")
        return result

    async def ledger_range(self, client: httpx.AsyncClient) -> tuple[int, int]:
        """The oldest and latest ledgers the RPC keeps (``getEvents`` from the latest ledger).

        Raises:
            SourceUnreadable: as :meth:`call`, or an answer without those ledgers.
        """
        latest = await self.call(client, "getLatestLedger")
        try:
            result = await self.call(client, "getEvents", {"startLedger": latest["sequence"], "filters": []})
            return int(result["oldestLedger"]), int(result["latestLedger"])
        except (LookupError, TypeError, ValueError) as exc:
            raise SourceUnreadable(f"getEvents: an answer without its ledger range: {describe(exc)}") from exc


@attrs.frozen
class RpcSource:
    """A :class:`~actors.source.Source` of Stellar RPC contract events.

    Args:
        urls: RPC endpoints (a single string is accepted), tried in order.
        filters: up to 5 ``getEvents`` filters (OR-ed); none: every event.
        connect_timeout: seconds to establish a connection.
        request_timeout: seconds one request may take in all.
        retry_base, retry_cap, attempts_per_url, malformed_retries, retry_after_cap: as for the
            Horizon source (see :class:`~ingestion.retry.RetryPolicy`).
        page_limit: events per request, at most 10,000 (halved after a -32001, then restored):
            the cursor chain is sequential, so at a real RPC's latency the page size sets the pace.
        prefetch: pages fetched ahead of the consumer.
        commit_max_records: a page is handed on in batches of at most this many events (the
            Ingestor commits them in parts at its pace: :class:`~actors.commit_pace.CommitPace`).
        on_history_gap: ``"stop"``, ``"skip"`` or ``"lake"``, when the position is older than the
            oldest ledger the RPC keeps: stop (log ``history-gap``, write nothing,
            SourceFatalError), skip (a ``history-gap`` audit entry, then on from the oldest
            ledger) or lake (the audit entry, then the events from ``history`` up to RPC's
            window, then on on RPC: see the module docstring).
        history: the source of the same events with the same ids for ledgers older than RPC
            keeps (a :class:`~ingestion.lake.source.LakeSource`); needed by ``"lake"``.
        reset_after: seconds every URL may report a latest ledger below the position before
            ``rpc-network-reset-suspected`` is logged (an error; repeated every ``reset_after``).
        stale_after: seconds without a new ledger at the tip before, with several URLs, the
            source moves to the next one (``rpc-stale``): 30 s, the RPC's own ``getHealth`` rule.
        audit: ``await audit(event, fields)`` appends an audit entry under the current term.

    Raises:
        ValueError: a bad URL, filter or setting (a configuration error).
    """

    urls: tuple[str, ...] = attrs.field(converter=_urls)
    filters: tuple[EventFilter, ...] = attrs.field(default=(), converter=checked_filters)
    connect_timeout: float = 2.0
    request_timeout: float = 30.0
    retry_base: float = 0.2
    retry_cap: float = 10.0
    attempts_per_url: int = 3
    malformed_retries: int = 5
    retry_after_cap: float = 120.0
    page_limit: int = 10_000
    prefetch: int = 2
    commit_max_records: int = 10_000
    on_history_gap: str = attrs.field(
        default="stop", validator=attrs.validators.in_(("stop", "skip", "lake"))
    )
    reset_after: float = 60.0
    stale_after: float = 30.0
    audit: Callable[[str, dict[str, str]], Awaitable[bool]] | None = None
    history: Source | None = None
    health: SourceHealth = attrs.field(factory=SourceHealth, eq=False)

    def __attrs_post_init__(self) -> None:
        self.policy  # noqa: B018 -- validates the retry settings now
        if not 1 <= self.page_limit <= 10_000:
            raise ValueError(f"page_limit {self.page_limit} must be within 1..10000")
        if self.connect_timeout <= 0 or self.request_timeout <= 0:
            raise ValueError("connect_timeout and request_timeout must be > 0")
        if self.on_history_gap == "lake" and self.history is None:
            raise ValueError('on_history_gap = "lake" needs a lake to read history from (rpc.lake)')

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            base=self.retry_base,
            cap=self.retry_cap,
            attempts_per_url=self.attempts_per_url,
            malformed_retries=self.malformed_retries,
            retry_after_cap=self.retry_after_cap,
        )

    def follower(self, cursor: str) -> RpcFollower:
        try:
            return RpcFollower(
                self.urls, self.filters, cursor, self.policy,
                page_limit=self.page_limit, reset_after=self.reset_after,
                stale_after=self.stale_after,
            )  # fmt: skip
        except ValueError as exc:
            raise SourceFatalError(str(exc)) from exc

    def _client(self) -> httpx.AsyncClient:
        return _client(self.connect_timeout, self.request_timeout)

    async def _call(
        self, client: httpx.AsyncClient, url: str, body: bytes
    ) -> tuple[httpx.Response, bytes]:
        """POST a JSON-RPC body; the whole exchange bounded by the request timeout.

        Raises:
            httpx.HTTPError, trio.TooSlowError: no answer.
        """
        return await post(client, url, body, self.connect_timeout + self.request_timeout)

    async def probe(self) -> bool:
        """Ask for the job's own resource at each URL in turn until one answers: the latest
        ledger (``getLatestLedger``), then ``getEvents`` with the job's filters from that ledger,
        ``limit: 1``. A server that answers ``getLatestLedger`` but fails ``getEvents`` is failing
        for this job (not ``getHealth`` either: it calls a server whose last ledger is over 30 s
        old failing, and a stale server is still one this node can reach). Records nothing: the
        source watch does, and a leader's probe never clears a failure of its own ``getEvents``
        requests. Each request is bounded by the connect and request timeouts (the watch bounds
        the whole probe)."""
        filters = [f.to_json() for f in self.filters]
        async with self._client() as client:
            for url in self.urls:
                try:
                    response, content = await self._call(client, url, request_body("getLatestLedger", 1))
                    latest, _ = parse_answer(content) if response.status_code == 200 else (None, None)
                    if not isinstance(latest, dict) or not isinstance(latest.get("sequence"), int):
                        continue
                    params = {"startLedger": latest["sequence"], "filters": filters,
                              "pagination": {"limit": 1}}  # fmt: skip
                    response, content = await self._call(client, url, request_body("getEvents", 2, params))
                    if response.status_code != 200:
                        continue
                    result, error = parse_answer(content)
                except (httpx.HTTPError, trio.TooSlowError, ValueError):
                    continue
                if error is None and isinstance(result, dict) and isinstance(result.get("events"), list):
                    return True
        return False

    async def network_looks(self, ledger: int | None) -> list[SourceLook]:
        """What each URL says of its network (ingestion/node/network.py asks): ``getNetwork``'s
        passphrase, ``getLatestLedger``'s sequence (and ``closeTime``) and, for ``ledger`` (when it
        holds it), its hash and close time (the latest's ``id``, else ``getLedgers``'). A URL
        that does not answer says nothing (None); each request bounded by the connect and request timeouts."""
        looks = []
        async with self._client() as client:
            for url in self.urls:
                passphrase, latest, held, top_closed, closed = None, None, None, None, None
                try:
                    network = await self._result(client, url, "getNetwork")
                    passphrase = network.get("passphrase") if isinstance(network, dict) else None
                    top = await self._result(client, url, "getLatestLedger")
                    latest = top.get("sequence") if isinstance(top, dict) else None
                    top_closed = _seconds(top.get("closeTime")) if isinstance(top, dict) else None
                    if isinstance(latest, int) and ledger is not None and ledger == latest:
                        held, closed = top.get("id"), top_closed
                    elif isinstance(latest, int) and ledger is not None and ledger < latest:
                        params = {"startLedger": ledger, "pagination": {"limit": 1}}
                        page = await self._result(client, url, "getLedgers", params)
                        found = page.get("ledgers") if isinstance(page, dict) else None
                        if isinstance(found, list) and found and isinstance(found[0], dict):
                            if found[0].get("sequence") == ledger:
                                held, closed = found[0].get("hash"), _seconds(found[0].get("ledgerCloseTime"))
                except (httpx.HTTPError, trio.TooSlowError, ValueError):
                    pass
                looks.append(SourceLook(
                    url, passphrase if isinstance(passphrase, str) else None,
                    latest if isinstance(latest, int) else None, held if isinstance(held, str) else None,
                    top_closed, closed,
                ))  # fmt: skip
        return looks

    async def _result(self, client: httpx.AsyncClient, url: str, method: str, params: Any = None) -> Any:
        """One JSON-RPC call's result (None: an error answer).

        Raises:
            httpx.HTTPError, trio.TooSlowError, ValueError: no usable answer.
        """
        response, content = await self._call(client, url, request_body(method, 1, params))
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}")
        result, error = parse_answer(content)
        return None if error is not None else result

    async def resolve_start(self, cursor: str) -> str:
        """``"now"`` as the scanned-through cursor of the latest ledger (``getLatestLedger``),
        asked of the URLs in turn with backoff; other cursors unchanged."""
        if cursor != "now":
            return cursor
        policy = self.policy
        attempt = 0
        async with self._client() as client:
            while True:
                url = self.urls[(attempt // policy.attempts_per_url) % len(self.urls)]
                try:
                    response, content = await self._call(client, url, request_body("getLatestLedger", 1))
                    if response.status_code != 200:
                        raise ValueError(f"HTTP {response.status_code}")
                    result, error = parse_answer(content)
                    if error is not None:
                        raise ValueError(f"RPC error {error[0]}: {error[1]}")
                    latest = int(result["sequence"])
                    self.health.ok(trio.current_time())
                    resolved = str(Cursor.through(latest))
                    log.info("rpc-now-resolved", url=url, latest_ledger=latest, cursor=resolved)
                    return resolved
                except (httpx.HTTPError, trio.TooSlowError, ValueError, LookupError, TypeError) as exc:
                    error_text = describe(exc)
                self.health.failed(trio.current_time())
                attempt += 1
                delay = policy.delay(attempt, random.random())
                log.warning("rpc-retry", attempt=attempt, delay=round(delay, 3), error=error_text, url=url)
                await trio.sleep(delay)

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        """Batches of events strictly after ``cursor`` (``"0"``, a ledger, an id or a
        scanned-through cursor). Runs until cancelled; raises SourceFatalError when the RPC
        rejects the request for good or a history gap stops the job."""
        follower = self.follower(cursor)
        log.info(
            "rpc-follow",
            url=follower.url,
            cursor=cursor,
            filters=[f.to_json() for f in self.filters],
            page_limit=self.page_limit,
        )
        fatal: list[SourceFatalError] = []
        # A page's batches travel together: ``prefetch`` counts pages, so that the next page is
        # fetched while every batch of this one is committed (counted in batches, a 10,000-event
        # page in ten, the pump waited for all but the last two before asking for the next).
        send, receive = trio.open_memory_channel[list[Batch]](self.prefetch)
        async with self._client() as client, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, follower, send, fatal)
            with receive:
                async for batches in receive:
                    for batch in batches:
                        yield batch
        if fatal:
            raise fatal[0]

    async def _pump(
        self,
        client: httpx.AsyncClient,
        follower: RpcFollower,
        send: trio.MemorySendChannel[list[Batch]],
        fatal: list[SourceFatalError],
    ) -> None:
        with send:
            try:
                while True:
                    outcome = await self._exchange(client, follower)
                    for note in outcome.notes:
                        _log(note)
                    if outcome.fatal is not None:
                        log.error("rpc-fatal", error=outcome.fatal, url=follower.url)
                        raise SourceFatalError(outcome.fatal)
                    if outcome.gap is not None:
                        follower = await self._history_gap(client, follower, outcome, send)
                        continue
                    if outcome.batch is not None:
                        await send.send(outcome.batch.split(self.commit_max_records))
                    if outcome.delay > 0:
                        await trio.sleep(outcome.delay)
            except SourceFatalError as exc:
                fatal.append(exc)

    async def _exchange(self, client: httpx.AsyncClient, follower: RpcFollower) -> Outcome:
        request = follower.next_request()
        try:
            response, content = await self._call(client, request.url, request.body)
        except (httpx.HTTPError, trio.TooSlowError) as exc:
            self.health.failed(trio.current_time())
            return follower.on_transport_error(describe(exc), trio.current_time())
        now = trio.current_time()
        if response.status_code != 200:
            self.health.failed(now)
            retry_after = parse_retry_after(response.headers.get("retry-after"), time.time())
            detail = content.decode("utf-8", "replace").strip() or response.reason_phrase
            return follower.on_http_error(response.status_code, detail, retry_after, now)
        page = read_events(content)
        outcome = None if page is None else follower.on_events(page, request.limit, now)
        if outcome is None:  # not a plain good page: read it the general way, which says why
            try:
                result, error = parse_answer(content)
            except ValueError as exc:
                self.health.failed(now)
                return follower.on_malformed(describe(exc), now)
            outcome = (
                follower.on_error(error[0], error[1], now)
                if error is not None
                else follower.on_result(result, request.limit, now)
            )
        if outcome.ok:
            self.health.ok(now)
        else:
            self.health.failed(now)
        return outcome

    async def _history_gap(
        self,
        client: httpx.AsyncClient,
        follower: RpcFollower,
        outcome: Outcome,
        send: trio.MemorySendChannel[list[Batch]],
    ) -> RpcFollower:
        """Stop, skip, or read from the lake (:meth:`_from_history`); the follower to go on with.
        The lake is read only when every URL is past the position (:meth:`_keeper`): one that
        still keeps it is followed instead, with no gap recorded."""
        gap = outcome.gap
        assert gap is not None
        if self.on_history_gap == "lake" and len(self.urls) > 1:
            keeper = await self._keeper(client, follower, gap.url)
            if keeper is not None:
                # RpcFollower moves between URLs only on failures: point it at the keeper
                follower.url_index, follower.failures, follower.round_failures = keeper, 0, 0
                return follower
        fields = {
            "cursor": gap.cursor,
            "cursor_ledger": gap.cursor_ledger,
            "elder_ledger": gap.elder_ledger,
            "rpc": gap.url,
        }
        problem = await record_history_gap(
            fields,
            on_history_gap=self.on_history_gap,
            audit=self.audit,
            stop_message=(
                f"history gap: the cursor {gap.cursor} (ledger {gap.cursor_ledger}) is older than "
                f"the oldest ledger {gap.elder_ledger} that {gap.url} keeps; resuming would "
                "silently skip the events in between, so nothing was written. Point --rpc at an "
                "RPC with a longer retention, set rpc.on_history_gap = \"lake\" (and rpc.lake) "
                "to read the older events from a data lake, or \"skip\" to record the gap in the "
                "audit stream and go on from the oldest ledger"
            ),
            resume={"resume_ledger": gap.elder_ledger},
        )
        if problem is not None:
            log.warning("rpc-retry", error=problem, url=gap.url)
            await trio.sleep(self.policy.delay(1, random.random()))
            return follower
        if self.on_history_gap == "lake":
            return await self._from_history(gap.cursor, gap.elder_ledger, send)
        follower.skip_to(
            gap.elder_ledger, f"history gap: ledgers before {gap.elder_ledger} are gone from {gap.url}"
        )
        return follower

    async def _keeper(self, client: httpx.AsyncClient, follower: RpcFollower, reporter: str) -> int | None:
        """The index of another URL that still keeps the first ledger the position needs (asked
        with the job's own ``getEvents`` from that ledger, ``limit: 1``), or None when every URL
        is past it. A URL that does not answer counts as past: the lake holds the same events
        with the same ids, so going there loses nothing, while waiting for an unreachable URL
        could wait forever."""
        needed = _needed_ledger(follower.describe_position())
        params = {"startLedger": needed, "filters": [f.to_json() for f in self.filters],
                  "pagination": {"limit": 1}}  # fmt: skip
        answers: dict[str, str] = {reporter: "past"}
        for index, url in enumerate(self.urls):
            if url in answers:
                continue
            try:
                response, content = await self._call(client, url, request_body("getEvents", 1, params))
                result, error = parse_answer(content) if response.status_code == 200 else (None, None)
            except (httpx.HTTPError, trio.TooSlowError, ValueError) as exc:
                answers[url] = f"no answer: {describe(exc)}"
                continue
            if error is None and isinstance(result, dict) and isinstance(result.get("events"), list):
                log.info("rpc-history-elsewhere", url=url, needed_ledger=needed, past=reporter)
                return index
            answers[url] = (
                f"HTTP {response.status_code}" if response.status_code != 200
                else "past" if error is None else f"past: RPC error {error[0]}: {error[1]}"
            )  # fmt: skip
        log.info("rpc-history-past-every-url", needed_ledger=needed, answers=answers)
        return None

    async def _from_history(
        self, cursor: str, oldest: int, send: trio.MemorySendChannel[list[Batch]]
    ) -> RpcFollower:
        """Events after ``cursor`` from the lake, committed as they come, until every ledger
        before ``oldest`` (RPC's oldest) is read; then a follower on RPC from the lake's last
        scanned-through cursor.

        Raises:
            SourceFatalError: the lake's (a hole, an object that cannot be read).
        """
        assert self.history is not None
        started, records, through = trio.current_time(), 0, None
        log.info("rpc-lake-backfill", cursor=cursor, until_ledger=oldest - 1)
        async with self.history.stream(cursor) as batches:
            async for batch in batches:
                await send.send([batch])
                self.health.ok(trio.current_time())
                records += len(batch.records)
                if batch.through is not None:
                    through = Cursor.parse(batch.through)
                    if through.ledger >= oldest - 1:
                        break
        assert through is not None  # the lake's stream ends only by a fatal error or the break
        log.info(
            "rpc-lake-handover",
            cursor=str(through),
            through_ledger=through.ledger,
            records=records,
            lake_s=round(trio.current_time() - started, 3),
        )
        return self.follower(str(through))


def _needed_ledger(position: str) -> int:
    """The first ledger a follower at ``position`` (a ledger number or a cursor) still needs:
    L + 1 after the scanned-through cursor of L."""
    if position.isdigit():
        return int(position)
    cursor = Cursor.parse(position)
    return cursor.ledger + 1 if cursor == Cursor.through(cursor.ledger) else cursor.ledger



def _log(note: Note) -> None:
    getattr(log, note.level)(note.event, **note.fields)


def _seconds(value: Any) -> int | None:
    """A close time as Stellar RPC says it (Unix seconds, a string or a number); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None
