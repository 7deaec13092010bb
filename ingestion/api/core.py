"""The events API's JSON-RPC 2.0 core: a request body becomes a call, a call's outcome becomes the
response body, as stellar-rpc answers (protocol 23). Pure (no I/O).

Every answer is HTTP 200 with ``result`` or ``error`` (the shell answers 413 to a body over the
limit and 405 to anything but ``POST``). Errors, stellar-rpc's where it has one:

- not JSON: -32700 ``parse error: ...``; not one JSON-RPC 2.0 request object: -32600
  ``invalid request``; an unknown method: -32601 ``method not found``;
- bad ``getEvents`` params: -32602 with stellar-rpc's message (:mod:`ingestion.rpc.protocol`);
  a start outside the window: -32600 ``startLedger must be within the ledger range: O - L``;
- a query the store did not finish within the statement timeout: -32001 ``request exceeded
  processing limit threshold``; the store out of reach: -32603 ``events store unavailable:
  ...``; nothing projected yet: ``getEvents`` answers the range error with ``0 - 0``,
  ``getHealth`` -32603 ``data stores are not initialized``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import attrs
import orjson

from ingestion.api.query import Window
from ingestion.rpc.protocol import (
    DEFAULT_CAPS,
    DEFAULT_LIMIT,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    MAX_LIMIT,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROCESSING_LIMIT,
    Caps,
    RpcError,
)

METHODS = ("getEvents", "getLatestLedger", "getHealth", "getNetwork")
PUBLIC_PASSPHRASE = "Public Global Stellar Network ; September 2015"
PROTOCOL_VERSION = 23
NOT_INITIALIZED = "data stores are not initialized"
TOO_SLOW = "request exceeded processing limit threshold"


@attrs.frozen
class ApiRules:
    """What a request may ask (caps at stellar-rpc's defaults or higher) and what the network is."""

    caps: Caps = DEFAULT_CAPS
    max_limit: int = MAX_LIMIT
    default_limit: int = DEFAULT_LIMIT
    passphrase: str = PUBLIC_PASSPHRASE
    protocol_version: int = PROTOCOL_VERSION


class Call(NamedTuple):
    """One JSON-RPC request: its id (echoed), method and params."""

    id: Any
    method: str
    params: Any


class CallRefused(Exception):
    """A body that is no call: answer :attr:`body` (an error response) as it is."""

    def __init__(self, body: bytes, code: int) -> None:
        super().__init__(body)
        self.body = body
        self.code = code


def parse_call(body: bytes) -> Call:
    """The call a request body makes.

    Raises:
        CallRefused: not JSON, not a request object, or an unknown method.
    """
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise CallRefused(error_body(None, PARSE_ERROR, f"parse error: {exc}"), PARSE_ERROR) from None
    if not (
        isinstance(request, dict)
        and request.get("jsonrpc") == "2.0"
        and isinstance(request.get("method"), str)
    ):
        request_id = request.get("id") if isinstance(request, dict) else None
        raise CallRefused(error_body(_id(request_id), INVALID_REQUEST, "invalid request"), INVALID_REQUEST)
    call = Call(_id(request.get("id")), request["method"], request.get("params"))
    if call.method not in METHODS:
        raise CallRefused(error_body(call.id, METHOD_NOT_FOUND, "method not found"), METHOD_NOT_FOUND)
    return call


def _id(value: Any) -> Any:
    """A request id as echoed: a string, a number or null (anything else is not an id)."""
    return value if isinstance(value, str | int | float) and not isinstance(value, bool) else None


def result_body(request_id: Any, result: bytes) -> bytes:
    """A success response around ``result`` (its JSON text)."""
    return b'{"jsonrpc":"2.0","id":' + orjson.dumps(request_id) + b',"result":' + result + b"}"


def error_body(request_id: Any, code: int, message: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":'
        + orjson.dumps(request_id)
        + b',"error":'
        + orjson.dumps({"code": code, "message": message})
        + b"}"
    )


def unavailable(detail: str) -> RpcError:
    """The store could not be read: a clear -32603 (the client may retry)."""
    return RpcError(INTERNAL_ERROR, f"events store unavailable: {detail}")


def too_slow() -> RpcError:
    return RpcError(PROCESSING_LIMIT, TOO_SLOW)


def health_result(window: Window | None) -> bytes:
    """``getHealth``: ``healthy`` with the window; ``ledgerRetentionWindow`` what it spans."""
    if window is None:
        raise RpcError(INTERNAL_ERROR, NOT_INITIALIZED)
    return orjson.dumps(
        {
            "status": "healthy",
            "latestLedger": window.latest,
            "oldestLedger": window.oldest,
            "ledgerRetentionWindow": window.latest - window.oldest + 1,
        }
    )


def latest_ledger_result(window: Window | None, rules: ApiRules) -> bytes:
    """``getLatestLedger``: the latest ledger served and its close time. The store holds events,
    not ledgers: ``id`` (the ledger's hash), ``headerXdr`` and ``metadataXdr`` are empty."""
    if window is None:
        raise RpcError(INTERNAL_ERROR, NOT_INITIALIZED)
    return orjson.dumps(
        {
            "id": "",
            "protocolVersion": rules.protocol_version,
            "sequence": window.latest,
            "closeTime": str(window.latest_close),
            "headerXdr": "",
            "metadataXdr": "",
        }
    )


def network_result(rules: ApiRules) -> bytes:
    return orjson.dumps({"passphrase": rules.passphrase, "protocolVersion": rules.protocol_version})
