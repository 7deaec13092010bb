"""The simulator's Stellar RPC server: JSON-RPC 2.0 over HTTP, serving the chain's contract events.

It runs beside the Horizon app, on its own port (``SimulatorConfig.rpc_port``), over the same
:class:`~ingestion.simulator.chain.Chain`: its events (see :mod:`ingestion.simulator.rpc_events`)
come from the very operations Horizon serves. Methods (``POST /`` with a JSON-RPC request; every
answer is HTTP 200 with ``result`` or ``error``, as stellar-rpc's):

- ``getEvents``: stellar-rpc's ``get_events.go`` (validation and messages from
  :mod:`ingestion.rpc.protocol`, the 10,000-ledger scan cap, the cursor rules), base64 or
  ``xdrFormat: json`` (``topicJson``, ``valueJson``);
- ``getHealth``: ``healthy``, or -32603 "latency (Xs) since last known ledger closed is too high
  (>30s)" when the latest ledger closed longer ago than that by the wall clock (history built at
  start closed in the past: close a ledger first); the close times are JSON numbers here, as in
  the Go struct;
- ``getLatestLedger``: the ledger hash as ``id``, ``closeTime`` a JSON string, placeholder
  ``headerXdr`` / ``metadataXdr``;
- ``getNetwork``: the passphrase (``--network-passphrase``) and protocol version (no friendbot);
- ``getLedgers``: each ledger's ``hash``, ``sequence`` and ``ledgerCloseTime`` from
  ``startLedger`` (no header or metadata XDR), -32602 for a start outside the range.

Errors: bad JSON -32700; not a JSON-RPC request object (a batch included) -32600; an unknown
method -32601 "method not found"; bad params -32602 with the server's message; a start ledger
outside the range -32600 "startLedger must be within the ledger range: O - L".

Control endpoint on the RPC port (JSON in and out; not part of Stellar RPC):

- ``GET /_simulator/faults``: the armed RPC faults (:meth:`RpcFaults.snapshot`).
- ``POST /_simulator/faults`` with any of ``{"fail": {"kind": "processing_limit" | "http_429" |
  "http_503" | "http_500", "count": N | "seconds": T, "retry_after": S}, "delay_ms": MS,
  "lag_ledgers": N, "reset_to": L | null}``: arm them; answers 200 with the snapshot, or 400
  ``{"error": ...}``.
- ``DELETE /_simulator/faults``: disarm everything.
- ``GET /_simulator/requests``: ``{"methods": {name: count}, "statuses": {status: count}}``, the
  JSON-RPC requests received since start (for benchmarks).
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import time
from typing import Any, Protocol

import attrs
import trio

from ingestion.common.asgi import (
    Disconnected,
    Message,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    serve_lifespan,
)
from ingestion.rpc.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROCESSING_LIMIT,
    EventFilter,
    GetEventsRequest,
    RpcError,
)
from ingestion.simulator.chain import Chain
from ingestion.simulator.faults import RpcFailureKind, RpcFaults, check_known, duration_of
from ingestion.simulator.records import PROTOCOL_VERSION, ledger_hash_of
from ingestion.simulator.rpc_events import EventLog, RpcEvent, all_events, json_format, scan

JSON = b"application/json"
DEFAULT_RETENTION_WINDOW = 120_960  # stellar-rpc's default HISTORY_RETENTION_WINDOW: 7 days of ledgers
MAX_HEALTHY_LATENCY = 30  # seconds: stellar-rpc's default max-healthy-ledger-latency
_HTTP_FAILURES = {
    RpcFailureKind.TOO_MANY_REQUESTS: (429, b"Too Many Requests\n"),
    RpcFailureKind.UNAVAILABLE: (503, b"Service Unavailable\n"),
    RpcFailureKind.SERVER_ERROR: (500, b"Internal Server Error\n"),
}


@attrs.frozen
class SeenRpcRequest:
    """A JSON-RPC request as the simulator received it (``Simulator.rpc_requests``), for tests.
    ``method`` is None for a body that was not a JSON-RPC request."""

    method: str | None
    params: Any
    at: float  # trio.current_time() on arrival


class RpcSettings(Protocol):
    """The settings the RPC app reads (the server's ``SimulatorConfig``)."""

    @property
    def response_delay_ms(self) -> int: ...
    @property
    def rpc_max_healthy_latency(self) -> float: ...
    @property
    def rpc_retention_ledgers(self) -> int: ...
    @property
    def network_passphrase(self) -> str: ...


class RpcHost(Protocol):
    """What the RPC app needs of the simulator serving it (the server's ``Simulator``)."""

    @property
    def config(self) -> RpcSettings: ...
    @property
    def chain(self) -> Chain: ...
    @property
    def rpc_faults(self) -> RpcFaults: ...
    @property
    def rpc_log(self) -> EventLog: ...
    @property
    def rpc_requests(self) -> collections.deque[SeenRpcRequest]: ...
    @property
    def rpc_statuses(self) -> collections.Counter[int]: ...
    @property
    def rpc_methods(self) -> collections.Counter[str]: ...
    @property
    def rpc_errors(self) -> collections.Counter[int]: ...


def go_duration(seconds: int) -> str:
    """Go's ``time.Duration.String`` of a whole number of seconds: ``45s``, ``2m5s``, ``1h0m0s``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


class RpcApp:
    """The ASGI callable of the RPC port. One instance per :class:`Simulator`."""

    def __init__(self, sim: RpcHost):
        self.sim = sim

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            body = await read_body(receive)
        except Disconnected:
            return  # the client left mid-request: nobody to answer
        if scope["path"].startswith("/_simulator/"):
            await self._control(scope, body, send)
            return
        send = self._counting(send)
        delay = self.sim.config.response_delay_ms + self.sim.rpc_faults.delay_ms
        if delay:
            await trio.sleep(delay / 1000)  # a real node's query time and network: no CPU used
        if scope["method"] != "POST":
            await respond(send, 405, b"text/plain; charset=utf-8", b"405 method not allowed\n")
            return
        try:
            answer = self.answer(body, apply_faults=True)
        except _HttpFailure as failure:
            status, text = _HTTP_FAILURES[failure.kind]
            headers = []
            if status == 429 and failure.retry_after is not None:
                headers.append((b"retry-after", str(failure.retry_after).encode()))
            await respond(send, status, b"text/plain; charset=utf-8", text, headers)
            return
        await respond(send, 200, JSON, answer)

    # -- JSON-RPC -------------------------------------------------------------------------------

    def answer(self, body: bytes, *, apply_faults: bool = False) -> bytes:
        """The JSON-RPC response to one request body.

        Raises:
            _HttpFailure: with ``apply_faults``, an armed HTTP-level failure: answer with it.
        """
        try:
            request = json.loads(body)
        except ValueError as exc:
            self._seen(None, None)
            return self._error(None, PARSE_ERROR, f"parse error: {exc}")
        if not (
            isinstance(request, dict)
            and request.get("jsonrpc") == "2.0"
            and isinstance(request.get("method"), str)
        ):
            self._seen(None, request)
            return self._error(
                request.get("id") if isinstance(request, dict) else None, INVALID_REQUEST, "invalid request"
            )
        request_id, method, params = request.get("id"), request["method"], request.get("params")
        self._seen(method, params)
        if apply_faults:
            failure = self.sim.rpc_faults.take_request_failure()
            if failure is not None:
                if failure.kind is RpcFailureKind.PROCESSING_LIMIT:
                    return self._error(
                        request_id, PROCESSING_LIMIT, "request exceeded processing limit threshold"
                    )
                raise _HttpFailure(failure.kind, failure.retry_after)
        try:
            if method == "getEvents":
                return self._get_events(request_id, params)
            if method == "getHealth":
                result: Any = self._get_health()
            elif method == "getLatestLedger":
                result = self._get_latest_ledger()
            elif method == "getNetwork":
                passphrase = self.sim.config.network_passphrase
                result = {"passphrase": passphrase, "protocolVersion": PROTOCOL_VERSION}
            elif method == "getLedgers":
                result = self._get_ledgers(params)
            else:
                raise RpcError(METHOD_NOT_FOUND, "method not found")
        except RpcError as error:
            return self._error(request_id, error.code, error.message)
        return _envelope(request_id, b'"result":' + _compact(result))

    def ledger_range(self) -> tuple[int, int]:
        """``(oldest, latest)`` as this node reports them (the faults' lag and reset applied)."""
        chain = self.sim.chain
        first, window = chain.first, self.sim.config.rpc_retention_ledgers
        if window:
            first = max(first, chain.latest - window + 1)
        return self.sim.rpc_faults.ledger_range(first, chain.latest)

    def _get_events(self, request_id: Any, params: Any) -> bytes:
        try:
            request = GetEventsRequest.from_params(params)
            oldest, latest = self.ledger_range()
            page = scan(self.sim.rpc_log, request, oldest, latest)
        except RpcError as error:
            return self._error(request_id, error.code, error.message)
        render = json_format if request.xdr_format == "json" else _base64_format
        closed_at = self.sim.chain.closed_at
        tail = {
            "cursor": page.cursor,
            "latestLedger": latest,
            "oldestLedger": oldest,
            "latestLedgerCloseTime": str(closed_at(latest)),
            "oldestLedgerCloseTime": str(closed_at(oldest)),
        }
        result = b"".join(
            (
                b'"result":{"events":[',
                b",".join([render(e) for e in page.events]),
                b"],",
                _compact(tail)[1:],
            )
        )
        return _envelope(request_id, result)

    def _get_health(self) -> dict[str, Any]:
        oldest, latest = self.ledger_range()
        chain = self.sim.chain
        latest_closed = chain.closed_at(latest)
        latency = time.time() - latest_closed
        limit = self.sim.config.rpc_max_healthy_latency
        if limit and latency > limit:
            raise RpcError(
                INTERNAL_ERROR,
                f"latency ({go_duration(round(latency))}) since last known ledger closed is too high "
                f"(>{go_duration(round(limit))})",
            )
        return {
            "status": "healthy",
            "latestLedger": latest,
            "latestLedgerCloseTime": latest_closed,
            "oldestLedger": oldest,
            "oldestLedgerCloseTime": chain.closed_at(oldest),
            "ledgerRetentionWindow": self.sim.config.rpc_retention_ledgers or chain.retention_ledgers
            or DEFAULT_RETENTION_WINDOW,
        }

    def _get_latest_ledger(self) -> dict[str, Any]:
        _, latest = self.ledger_range()
        chain = self.sim.chain
        ledger_hash = ledger_hash_of(chain.spec.seed, latest)
        digest = hashlib.sha256(bytes.fromhex(ledger_hash)).digest()
        return {
            "id": ledger_hash,
            "protocolVersion": PROTOCOL_VERSION,
            "sequence": latest,
            "closeTime": str(chain.closed_at(latest)),
            # Placeholders of a plausible size: nothing in the simulator decodes them.
            "headerXdr": base64.b64encode(digest * 4).decode("ascii"),
            "metadataXdr": base64.b64encode(digest * 8).decode("ascii"),
        }

    def _get_ledgers(self, params: Any) -> dict[str, Any]:
        """``getLedgers`` from ``startLedger``, ``pagination.limit`` of them (at most 200): each
        ledger's hash, sequence and close time (no header or metadata XDR: nothing here reads
        them)."""
        oldest, latest = self.ledger_range()
        start = params.get("startLedger") if isinstance(params, dict) else None
        limit = (params.get("pagination") or {}).get("limit", 5) if isinstance(params, dict) else 5
        if not isinstance(start, int) or not oldest <= start <= latest:
            raise RpcError(
                INVALID_PARAMS,
                f"start ledger must be between the oldest ledger: {oldest} and the latest ledger: {latest} "
                "for this rpc instance",
            )
        if not isinstance(limit, int) or not 1 <= limit <= 200:
            raise RpcError(INVALID_PARAMS, "limit must be between 1 and 200")
        chain = self.sim.chain
        last = min(latest, start + limit - 1)
        ledgers = [
            {"hash": ledger_hash_of(chain.spec.seed, seq), "sequence": seq,
             "ledgerCloseTime": str(chain.closed_at(seq))}
            for seq in range(start, last + 1)
        ]  # fmt: skip
        return {
            "ledgers": ledgers, "latestLedger": latest, "latestLedgerCloseTime": chain.closed_at(latest),
            "oldestLedger": oldest, "oldestLedgerCloseTime": chain.closed_at(oldest), "cursor": str(last),
        }  # fmt: skip

    def _error(self, request_id: Any, code: int, message: str) -> bytes:
        self.sim.rpc_errors[code] += 1
        return _envelope(request_id, b'"error":' + _compact({"code": code, "message": message}))

    def _seen(self, method: str | None, params: Any) -> None:
        self.sim.rpc_requests.append(SeenRpcRequest(method, params, trio.current_time()))
        self.sim.rpc_methods[method or ""] += 1

    def _counting(self, send: Send) -> Send:
        statuses = self.sim.rpc_statuses

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] += 1
            await send(message)

        return counted

    # -- control --------------------------------------------------------------------------------

    async def _control(self, scope: Scope, body: bytes, send: Send) -> None:
        method, path, faults = scope["method"], scope["path"], self.sim.rpc_faults
        if path == "/_simulator/requests" and method == "GET":
            counts = {"methods": dict(self.sim.rpc_methods), "statuses": dict(self.sim.rpc_statuses)}
            await respond(send, 200, JSON, _compact(counts))
            return
        if path != "/_simulator/faults" or method not in ("GET", "POST", "DELETE"):
            await respond(send, 404, JSON, _compact({"error": "not found"}))
            return
        try:
            data = json.loads(body) if body.strip() else {}
            if not isinstance(data, dict):
                raise ValueError("the body must be a JSON object")
            if method == "DELETE":
                faults.clear()
            elif method == "POST":
                self._arm(data)
        except (ValueError, TypeError, KeyError) as exc:
            await respond(send, 400, JSON, _compact({"error": str(exc)}))
            return
        await respond(send, 200, JSON, _compact(faults.snapshot()))

    def _arm(self, data: dict[str, Any]) -> None:
        check_known(data, {"fail", "delay_ms", "lag_ledgers", "reset_to"})
        faults = self.sim.rpc_faults
        if "fail" in data:
            spec = data["fail"]
            faults.fail_requests(
                RpcFailureKind(spec.get("kind", "processing_limit")),
                **duration_of(spec),
                retry_after=None if spec.get("retry_after") is None else int(spec["retry_after"]),
            )
        if "delay_ms" in data:
            faults.set_delay(int(data["delay_ms"]))
        if "lag_ledgers" in data:
            faults.lag(int(data["lag_ledgers"]))
        if "reset_to" in data:
            faults.reset(None if data["reset_to"] is None else int(data["reset_to"]))

    def events(self, filters: tuple[EventFilter, ...] = ()) -> list[dict[str, Any]]:
        """Every event of the node's ledger range matching ``filters``, ascending, as served."""
        oldest, latest = self.ledger_range()
        return [json.loads(e.body) for e in all_events(self.sim.rpc_log, oldest, latest, filters)]


class _HttpFailure(Exception):
    """Answer with an HTTP error in place of the JSON-RPC response (an armed fault)."""

    def __init__(self, kind: RpcFailureKind, retry_after: int | None):
        super().__init__(kind)
        self.kind = kind
        self.retry_after = retry_after


def _base64_format(event: RpcEvent) -> bytes:
    return event.body


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _envelope(request_id: Any, member: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + _compact(request_id) + b"," + member + b"}"
