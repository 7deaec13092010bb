"""The simulator's ASGI application: Horizon's routes, paging, streaming, and the control endpoint.

Horizon routes (GET; ``Accept: text/event-stream`` streams the collections):
``/``, ``/ledgers``, ``/transactions``, ``/operations``, ``/payments``, ``/effects``,
``/ledgers/{seq}[/transactions|operations|payments|effects]``,
``/accounts/{id}/transactions|operations|payments|effects``,
``/transactions/{hash}[/operations|payments|effects]``, ``/operations/{id}[/effects]``.

The control endpoint (``/_simulator/...``; not part of Horizon) is :mod:`ingestion.simulator.control`.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol
from urllib.parse import parse_qsl

import attrs
import trio

import ingestion.simulator.render as render
from ingestion.common.asgi import respond, serve_lifespan
from ingestion.common.paging import toid
from ingestion.common.strkey import is_valid_account
from ingestion.simulator.chain import Chain
from ingestion.simulator.control import ControlHost, serve_control
from ingestion.simulator.faults import MalformedKind
from ingestion.simulator.ratelimit import RateLimiter
from ingestion.simulator.records import (
    KEY_SHIFT,
    PROTOCOL_VERSION,
    TRADE_BASE,
    key_of,
    timestamp,
    token_of,
)
from ingestion.simulator.render import Problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_LIMIT = 200
DEFAULT_LIMIT = 10
PUBLIC_RATE_BURST = 100  # the public SDF Horizon: 3600 requests an hour, bursts of 100 (+1)
_SUB = "(transactions|operations|payments|effects)"
_ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("collection", re.compile(r"/(ledgers|transactions|operations|payments|effects|trades)")),
    ("ledger", re.compile(r"/ledgers/([^/]+)")),
    ("ledger_sub", re.compile(rf"/ledgers/([^/]+)/{_SUB}")),
    ("account_sub", re.compile(r"/accounts/([^/]+)/(transactions|operations|payments|effects|trades)")),
    ("pool_sub", re.compile(r"/liquidity_pools/([^/]+)/(transactions|operations|effects|trades)")),
    ("balance_sub", re.compile(r"/claimable_balances/([^/]+)/(transactions|operations)")),
    ("offer_sub", re.compile(r"/offers/([^/]+)/(trades)")),
    ("transaction", re.compile(r"/transactions/([^/]+)")),
    ("transaction_sub", re.compile(r"/transactions/([^/]+)/(operations|payments|effects)")),
    ("operation", re.compile(r"/operations/([^/]+)")),
    ("operation_sub", re.compile(r"/operations/([^/]+)/(effects)")),
)
_EXTRA_PARAMS = ("include_failed", "join")


@attrs.frozen
class SeenRequest:
    """A Horizon request as the simulator received it (``Simulator.requests``), for tests."""

    path: str
    query: dict[str, str]
    stream: bool
    at: float  # trio.current_time() on arrival


class HorizonSettings(Protocol):
    """The settings the Horizon app reads (the server's ``SimulatorConfig``)."""

    @property
    def response_delay_ms(self) -> int: ...
    @property
    def rate_limit(self) -> int: ...
    @property
    def rate_burst(self) -> int: ...
    @property
    def stream_timeout(self) -> float: ...
    @property
    def sse_update_frequency(self) -> float: ...
    @property
    def network_passphrase(self) -> str: ...


class HorizonHost(ControlHost, Protocol):
    """What the Horizon app needs of the simulator serving it (the server's ``Simulator``): its
    chain and faults (as the control endpoint), and these."""

    active_streams: int  # open SSE responses: the app counts its own

    @property
    def config(self) -> HorizonSettings: ...
    @property
    def url(self) -> str: ...
    @property
    def core_latest(self) -> int: ...
    @property
    def requests(self) -> collections.deque[SeenRequest]: ...
    @property
    def statuses(self) -> collections.Counter[int]: ...
    async def wait_for_ledger(self, seen: int) -> None: ...


def _joins(query: CollectionQuery, params: PageParams) -> bool:
    """``join=transactions`` on a collection of operations: embed each one's transaction."""
    return params.extras.get("join") == "transactions" and query.collection in (
        "operations",
        "payments",
    )


def _client(scope: Scope) -> str:
    """The client's address: Horizon limits per IP."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


@attrs.frozen
class CollectionQuery:
    """A collection to page or stream: all of ``collection`` in ``[low, high)``, or an account's."""

    collection: str
    path: str
    low: int = 0
    high: int | None = None
    account: str | None = None
    entity: tuple[str, str] | None = None  # a liquidity pool's, claimable balance's or offer's


def _int_param(text: str, field: str) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", text):
        raise Problem(400, render.bad_request(field, f"{field} must be a non-negative integer"))
    return int(text)


def resolve(path: str, chain: Chain) -> CollectionQuery | int | None:
    """Map a path to a collection query, a single record's key, or None (not found).

    Raises:
        Problem: a malformed id in the path.
    """
    for name, pattern in _ROUTES:
        m = pattern.fullmatch(path)
        if m is None:
            continue
        if name == "collection":
            return CollectionQuery(m.group(1), path)
        if name in ("ledger", "ledger_sub"):
            seq = _int_param(m.group(1), "ledger_id")
            low, high = (
                key_of(toid(seq)) if seq < 1 << 31 else 0,
                key_of(toid(min(seq + 1, 1 << 30))),
            )
            if name == "ledger":
                return key_of(toid(seq)) if chain.first <= seq <= chain.latest else None
            return CollectionQuery(m.group(2), path, low=low, high=high)
        if name == "account_sub":
            if not is_valid_account(m.group(1)):
                raise Problem(400, render.bad_request("account_id", "invalid address"))
            if not chain.knows_account(m.group(1)):
                return None  # an account Horizon has not ingested (yet): 404
            return CollectionQuery(m.group(2), path, account=m.group(1))
        if name == "pool_sub":
            pool = m.group(1).lower()
            if not re.fullmatch(r"[0-9a-f]{64}", pool):
                raise Problem(400, render.bad_request("liquidity_pool_id", "invalid liquidity pool id"))
            if not chain.knows_entity("liquidity_pools", pool):
                return None
            return CollectionQuery(m.group(2), path, entity=("liquidity_pools", pool))
        if name == "balance_sub":
            balance = m.group(1).lower()
            if not re.fullmatch(r"[0-9a-f]{72}", balance):
                raise Problem(400, render.bad_request("claimable_balance_id", "invalid balance id"))
            if not chain.knows_entity("claimable_balances", balance):
                return None
            return CollectionQuery(m.group(2), path, entity=("claimable_balances", balance))
        if name == "offer_sub":
            offer = str(_int_param(m.group(1), "offer_id"))
            return CollectionQuery("trades", path, entity=("offers", offer))
        if name in ("transaction", "transaction_sub"):
            tx_hash = m.group(1).lower()
            if not re.fullmatch(r"[0-9a-f]{64}", tx_hash):
                raise Problem(400, render.bad_request("tx_id", "tx_id must be a 64 character hex"))
            tx_key = chain.transaction_key(tx_hash)
            if name == "transaction":
                return tx_key
            if tx_key is None:
                return None
            return CollectionQuery(m.group(2), path, low=tx_key, high=tx_key + key_of(1 << 12))
        if name in ("operation", "operation_sub"):
            op_key = key_of(_int_param(m.group(1), "id"))
            if not chain.has_record(op_key) or chain.record(op_key).get("type_i") is None:
                return None
            if name == "operation":
                return op_key
            return CollectionQuery("effects", path, low=op_key, high=op_key + key_of(1))
    return None


def parse_cursor(text: str, collection: str, latest: int, descending: bool) -> int | None:
    """The exclusive cursor key of a ``cursor`` value (None: from the start, or from the end).

    Raises:
        Problem: not a paging token of this collection.
    """
    if text == "":
        return None
    if text == "now":
        after_latest = key_of(toid(latest + 1))
        return after_latest if descending else after_latest - 1
    m = re.fullmatch(r"(-?[0-9]{1,19})(?:-([0-9]{1,10}))?", text)
    if m is None or (m.group(2) is not None and collection not in ("effects", "trades")):
        raise Problem(400, render.bad_request("cursor", "cursor must be a valid paging token"))
    value = int(m.group(1))
    if value < 0:
        raise Problem(
            400, render.bad_request("cursor", f"the cursor {value} is a negative number: ")
        )
    if value >= 1 << 63:
        raise Problem(400, render.bad_request("cursor", "cursor is out of range"))
    if m.group(2) is None and collection in ("effects", "trades"):
        # A bare operation id as an effects (trades) cursor: after all of its effects (trades).
        return key_of(value, 0xFFFF)
    n = int(m.group(2) or 0)
    if collection == "trades":
        n += TRADE_BASE  # "<operation>-<order>", order from 0
    if n > 0xFFFF:
        raise Problem(400, render.bad_request("cursor", "cursor is out of range"))
    return key_of(value, n)


@attrs.frozen
class PageParams:
    cursor: str
    order: str
    limit: int
    limit_given: bool
    extras: dict[str, str]


def parse_page_params(query: dict[str, str]) -> PageParams:
    """``cursor``, ``order`` and ``limit``, validated as Horizon does.

    Raises:
        Problem: 400 with ``invalid_field`` naming the bad parameter.
    """
    order = query.get("order", "") or "asc"
    if order not in ("asc", "desc"):
        raise Problem(400, render.bad_request("order", "order: invalid value"))
    limit_text = query.get("limit", "")
    if limit_text == "":
        limit = DEFAULT_LIMIT
    else:
        if not re.fullmatch(r"-?[0-9]{1,19}", limit_text):
            raise Problem(400, render.bad_request("limit", "unparseable value"))
        limit = int(limit_text)
        if limit <= 0 or limit > MAX_LIMIT:
            raise Problem(
                400,
                render.bad_request("limit", f"limit must be between 1 and {MAX_LIMIT}"),
            )
    extras = {name: query[name] for name in _EXTRA_PARAMS if name in query}
    if extras.get("include_failed", "false") not in ("true", "false"):
        raise Problem(400, render.bad_request("include_failed", "must be true or false"))
    if extras.get("join", "transactions") != "transactions":
        raise Problem(400, render.bad_request("join", "only transactions can be joined"))
    return PageParams(query.get("cursor", ""), order, limit, limit_text != "", extras)


class HorizonApp:
    """The ASGI callable. One instance per :class:`Simulator`, reused across restarts."""

    def __init__(self, sim: HorizonHost):
        self.sim = sim
        config = sim.config
        #: Horizon's per-client limiter (--rate-limit); None: no limit, no X-RateLimit headers.
        self.limiter = (
            RateLimiter(config.rate_limit, config.rate_burst, trio.current_time)
            if config.rate_limit
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        try:
            if path.startswith("/_simulator/"):
                await serve_control(self.sim, scope, receive, send)
                return
            delay = self.sim.config.response_delay_ms
            if delay:
                await trio.sleep(delay / 1000)  # a real Horizon's query time: no CPU used
            send = self._counting(send)
            await self._horizon(scope, receive, send)
        except Problem as p:
            await respond(send, p.status, render.PROBLEM_JSON, p.body)

    # -- plumbing -------------------------------------------------------------------------------

    def _counting(self, send: Send) -> Send:
        statuses = self.sim.statuses

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] += 1
            await send(message)

        return counted

    def _rate_headers(self, exhausted: bool = False) -> list[tuple[bytes, bytes]]:
        """X-RateLimit headers for an armed failure (the ``fail`` knob): the configured limiter's
        size, or the public Horizon's (bursts of 101), spent when ``exhausted``."""
        burst = self.sim.config.rate_burst if self.limiter is not None else PUBLIC_RATE_BURST
        return [
            (b"x-ratelimit-limit", str(burst + 1).encode()),
            (b"x-ratelimit-remaining", str(0 if exhausted else burst).encode()),
            (b"x-ratelimit-reset", b"1"),
        ]

    @staticmethod
    def _header(scope: Scope, name: bytes) -> str | None:
        for key, value in scope["headers"]:
            if key.lower() == name:
                return bytes(value).decode("latin-1")
        return None

    def _base(self, scope: Scope) -> str:
        host = self._header(scope, b"host")
        if not host:
            return self.sim.url
        proto = self._header(scope, b"x-forwarded-proto") or scope.get("scheme", "http")
        return f"{proto}://{host}"

    # -- Horizon --------------------------------------------------------------------------------

    def _seen(self, scope: Scope) -> None:
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        stream = "text/event-stream" in (self._header(scope, b"accept") or "")
        self.sim.requests.append(SeenRequest(scope["path"], query, stream, trio.current_time()))

    async def _horizon(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._seen(scope)
        failure = self.sim.faults.take_request_failure()
        if failure is not None:
            headers = self._rate_headers(exhausted=failure.status == 429)
            if failure.status in (429, 503):
                headers.append((b"retry-after", str(failure.retry_after).encode()))
            if failure.status == 502:  # from the proxy in front of Horizon, not Horizon
                await respond(send, 502, b"text/html", render.BAD_GATEWAY_HTML)
                return
            await respond(
                send, failure.status, render.PROBLEM_JSON, render.failure(failure.status), headers
            )
            return
        accept = self._header(scope, b"accept") or ""
        rate_headers: list[tuple[bytes, bytes]] = []
        if self.limiter is not None and "text/event-stream" not in accept:
            # Horizon's middleware; streams are limited by the stream loop instead (_stream).
            decision = self.limiter.take(_client(scope))
            rate_headers = decision.headers()
            if decision.limited:
                await respond(
                    send, 429, render.PROBLEM_JSON, render.failure(429), rate_headers
                )
                return
        if scope["method"] not in ("GET", "HEAD"):
            raise Problem(404, render.not_found())
        path: str = scope["path"]
        base = self._base(scope)
        if path == "/":
            await respond(send, 200, render.HAL_JSON, self._root(base), rate_headers)
            return
        target = resolve(path, self.sim.chain)
        if target is None:
            raise Problem(404, render.not_found())
        if isinstance(target, int):
            content = self.sim.chain.content(target >> (KEY_SHIFT + 32))
            record = render.go_json(content.records[target])
            body = render.with_base(record, base.encode())
            await respond(send, 200, render.HAL_JSON, body, rate_headers)
            return
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        params = parse_page_params(query)
        if "text/event-stream" in accept:
            last_event_id = self._header(scope, b"last-event-id")
            if last_event_id:
                params = attrs.evolve(params, cursor=last_event_id)
            await self._stream(target, params, base, _client(scope), receive, send)
            return
        body = self._page(target, params, base)
        await respond(send, 200, render.HAL_JSON, body, rate_headers)

    def _root(self, base: str) -> bytes:
        chain = self.sim.chain
        t = "{?cursor,limit,order}"
        links = {
            "account": {"href": f"{base}/accounts/{{account_id}}", "templated": True},
            "accounts": {
                "href": f"{base}/accounts{{?signer,sponsor,asset,liquidity_pool{t[2:]}",
                "templated": True,
            },
            "account_transactions": {
                "href": f"{base}/accounts/{{account_id}}/transactions{t}",
                "templated": True,
            },
            "effects": {"href": f"{base}/effects{t}", "templated": True},
            "fee_stats": {"href": f"{base}/fee_stats"},
            "ledger": {"href": f"{base}/ledgers/{{sequence}}", "templated": True},
            "ledgers": {"href": f"{base}/ledgers{t}", "templated": True},
            "operation": {"href": f"{base}/operations/{{id}}", "templated": True},
            "operations": {
                "href": f"{base}/operations{{?cursor,limit,order,include_failed}}",
                "templated": True,
            },
            "payments": {
                "href": f"{base}/payments{{?cursor,limit,order,include_failed}}",
                "templated": True,
            },
            "self": {"href": f"{base}/"},
            "transaction": {"href": f"{base}/transactions/{{hash}}", "templated": True},
            "transactions": {
                "href": f"{base}/transactions{{?cursor,limit,order,include_failed}}",
                "templated": True,
            },
        }
        root = {
            "_links": links,
            "horizon_version": "23.0.0-simulator",
            "core_version": "stellar-core 23.0.1 (simulator)",
            "ingest_latest_ledger": chain.latest,
            "history_latest_ledger": chain.latest,
            "history_latest_ledger_closed_at": timestamp(chain.closed_at(chain.latest)),
            "history_elder_ledger": chain.first,
            "core_latest_ledger": self.sim.core_latest,
            "network_passphrase": self.sim.config.network_passphrase,
            "current_protocol_version": PROTOCOL_VERSION,
            "supported_protocol_version": PROTOCOL_VERSION,
            "core_supported_protocol_version": PROTOCOL_VERSION,
        }
        return render.go_json(root)

    def _keys(
        self, query: CollectionQuery, after: int | None, descending: bool, limit: int
    ) -> list[int]:
        return self.sim.chain.page(
            query.collection,
            after=after,
            descending=descending,
            limit=limit,
            low=query.low,
            high=query.high,
            account=query.account,
            entity=query.entity,
        )

    def _page(self, query: CollectionQuery, params: PageParams, base: str) -> bytes:
        chain = self.sim.chain
        descending = params.order == "desc"
        after = parse_cursor(params.cursor, query.collection, chain.latest, descending)
        keys = self._keys(query, after, descending, params.limit)
        form = render.joined_page_form if _joins(query, params) else render.page_form
        records = [form(chain.content(key >> (KEY_SHIFT + 32)), key) for key in keys]
        body = render.page(
            base,
            query.path,
            params.extras,
            order=params.order,
            limit=params.limit,
            # Horizon's links carry the cursor as the number it stands for: "now" is the TOID
            # just after the latest ledger.
            cursor=str(toid(chain.latest + 1) - 1) if params.cursor == "now" else params.cursor,
            tokens=[token_of(key) for key in keys],
            records=records,
        )
        return render.with_base(body, base.encode())

    async def _stream(
        self,
        query: CollectionQuery,
        params: PageParams,
        base: str,
        client: str,
        receive: Receive,
        send: Send,
    ) -> None:
        chain = self.sim.chain
        after = parse_cursor(params.cursor, query.collection, chain.latest, descending=False)
        # Horizon checks the limiter before the stream's first query: limited, the client gets a
        # plain 429 problem (the stream handler renders it, so no X-RateLimit headers).
        if self.limiter is not None and self.limiter.take(client).limited:
            raise Problem(429, render.failure(429))
        headers = [
            (b"content-type", render.EVENT_STREAM),
            (b"cache-control", b"no-cache"),
            (b"access-control-allow-origin", b"*"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        stream = _Stream(self.sim, query, params, after, base.encode(), send, self._keys)
        if self.limiter is not None:
            limiter = self.limiter
            stream.rate_limited = lambda: limiter.take(client).limited
        self.sim.active_streams += 1
        try:
            await self._run_stream(stream, receive, send)
        finally:
            self.sim.active_streams -= 1

    async def _run_stream(self, stream: _Stream, receive: Receive, send: Send) -> None:
        async with trio.open_nursery() as nursery:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel("client disconnected")

            nursery.start_soon(watch_disconnect)
            with trio.move_on_after(self.sim.config.stream_timeout):
                await stream.run()
            nursery.cancel_scope.cancel("stream over")
        if stream.ended_cleanly is not None:
            await send({"type": "http.response.body", "body": stream.ended_cleanly})
        else:
            # connection timeout: Horizon says goodbye too
            await send({"type": "http.response.body", "body": render.SSE_BYEBYE})


class _Stream:
    """One SSE stream: existing records after the cursor, then new ones as ledgers close."""

    def __init__(
        self,
        sim: HorizonHost,
        query: CollectionQuery,
        params: PageParams,
        after: int | None,
        base: bytes,
        send: Send,
        keys: Callable[[CollectionQuery, int | None, bool, int], list[int]],
    ):
        self.sim = sim
        self.query = query
        # Horizon hands the request's limit (default 10, as for pages) to the stream and says
        # byebye after that many events.
        self.limit = params.limit
        self.form = render.joined_compact_form if _joins(query, params) else render.compact_form
        self.after = after
        self.base = base
        self.send = send
        self.keys = keys
        self.sent = 0
        self.previous: tuple[int, bytes] | None = None  # last record event: key, frame
        self.ended_cleanly: bytes | None = None  # the last bytes to send, once over
        #: Horizon's limiter check on each wake-up by a new ledger: True means limited.
        self.rate_limited: Callable[[], bool] | None = None

    async def _write(self, data: bytes) -> None:
        stall = self.sim.faults.stall_remaining()
        if stall > 0:
            await trio.sleep(stall)
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def run(self) -> None:
        chain, faults = self.sim.chain, self.sim.faults
        cutoff = faults.claim_stream_cutoff()
        await self._write(render.SSE_HELLO)
        while True:
            if cutoff is not None and self.sent >= cutoff:
                self.ended_cleanly = b""  # dropped: no byebye
                return
            want = min(MAX_LIMIT, self.limit - self.sent)
            seen = chain.latest
            keys = self.keys(self.query, self.after, False, want)
            if keys and cutoff is None and faults.streams_quiet():
                # Nothing to inject between events: the whole backlog chunk in one write (one
                # ASGI send per event costs more than rendering it).
                await self._write(b"".join([self._frame(key) for key in keys]))
                if self.sent >= self.limit:
                    self.ended_cleanly = render.SSE_BYEBYE
                    return
                continue
            for key in keys:
                if cutoff is not None and self.sent >= cutoff:
                    break
                await self._event(key)
                if self.sent >= self.limit:
                    self.ended_cleanly = render.SSE_BYEBYE
                    return
            if not keys:
                frequency = self.sim.config.sse_update_frequency
                if frequency > 0:
                    # Horizon's streams learn of new ledgers by polling (--sse-update-frequency).
                    while chain.latest <= seen:  # noqa: ASYNC110 - polling is the point
                        await trio.sleep(frequency)
                else:
                    await self.sim.wait_for_ledger(seen)
                if self.rate_limited is not None and self.rate_limited():
                    # Out of budget mid-stream: Horizon sends an error event and ends the stream.
                    await self._write(render.sse_error("problem: rate_limit_exceeded"))
                    self.ended_cleanly = b""
                    return

    def _frame(self, key: int) -> bytes:
        """The record event for ``key``, counted as sent."""
        compact = self.form(self.sim.chain.content(key >> (KEY_SHIFT + 32)), key)
        frame = render.sse_record(token_of(key), render.with_base(compact, self.base))
        self.previous = (key, frame)
        self.after = key
        self.sent += 1
        return frame

    async def _event(self, key: int) -> None:
        chain, faults = self.sim.chain, self.sim.faults
        compact = self.form(chain.content(key >> (KEY_SHIFT + 32)), key)
        data = render.with_base(compact, self.base)
        token = token_of(key)
        frame = render.sse_record(token, data)
        kind = faults.take_malformed(have_previous=self.previous is not None)
        if kind is not None:
            await self._write(self._malformed(kind, key, token, data))
        await self._write(frame)
        self.previous = (key, frame)
        self.after = key
        self.sent += 1

    def _malformed(self, kind: MalformedKind, key: int, token: str, data: bytes) -> bytes:
        if kind is MalformedKind.BROKEN_JSON:
            return render.sse_record(token, data[: max(1, len(data) // 2)])
        if kind is MalformedKind.MISSING_PAGING_TOKEN:
            record = json.loads(data)
            del record["paging_token"]
            return render.sse_record(None, render.go_json(record, indent=False))
        assert self.previous is not None
        previous_key, previous_frame = self.previous
        if kind is MalformedKind.DUPLICATE:
            return previous_frame
        # TOKEN_REGRESSION: the record before the previous one, or the previous one again
        earlier = self.keys(self.query, previous_key, True, 1)
        if not earlier:
            return previous_frame
        chain = self.sim.chain
        compact = render.compact_form(chain.content(earlier[0] >> (KEY_SHIFT + 32)), earlier[0])
        return render.sse_record(token_of(earlier[0]), render.with_base(compact, self.base))
