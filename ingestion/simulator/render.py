"""Horizon's bytes on the wire: HAL pages, problems, SSE frames. Pure, no I/O.

Horizon serializes with Go ``encoding/json``: pages and problems indented by two spaces
(``MarshalIndent``), stream events compact (``Marshal``), and ``&``, ``<``, ``>``, U+2028 and
U+2029 escaped as ``\\u0026`` and so on. Records are rendered once per built ledger (both forms)
and cached with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring as _encode_string  # the C escaper, non-ASCII kept
from typing import Any
from urllib.parse import quote

from ingestion.simulator.records import PLACEHOLDER_BASE, LedgerContent

PLACEHOLDER = PLACEHOLDER_BASE.encode("ascii")
PROBLEM_BASE = "https://stellar.org/horizon-errors/"
HAL_JSON = b"application/hal+json; charset=utf-8"
PROBLEM_JSON = b"application/problem+json; charset=utf-8"
EVENT_STREAM = b"text/event-stream; charset=utf-8"
_RECORD_INDENT = "\n      "  # a record sits three levels deep in a page
_GO_ESCAPES = (
    (b"&", b"\\u0026"),
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)

SSE_HELLO = b'retry: 1000\nevent: open\ndata: "hello"\n\n'
SSE_BYEBYE = b'retry: 10\nevent: close\ndata: "byebye"\n\n'


def go_escape(data: bytes) -> bytes:
    """Escape as Go's encoding/json does; safe on whole documents (these occur only in strings)."""
    for raw, escaped in _GO_ESCAPES:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def go_json(value: Any, *, indent: bool = True) -> bytes:
    """``json.MarshalIndent(value, "", "  ")`` (or ``json.Marshal`` when not ``indent``)."""
    if indent:
        text = json.dumps(value, ensure_ascii=False, indent=2)
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return go_escape(text.encode("utf-8"))


def compact_form(content: LedgerContent, key: int) -> bytes:
    """A record as a stream event sends it (``json.Marshal``), cached with its ledger.

    Links still carry :data:`PLACEHOLDER`; swap the base in with :func:`with_base`.
    """
    data = content.compact.get(key)
    if data is None:
        data = content.compact[key] = go_json(content.records[key], indent=False)
    return data


def page_form(content: LedgerContent, key: int) -> bytes:
    """A record as a page embeds it: indented, three levels deep, cached with its ledger."""
    data = content.pretty.get(key)
    if data is None:
        out = [_RECORD_INDENT[1:]]
        _pretty(content.records[key], _RECORD_INDENT[1:], out)
        data = content.pretty[key] = go_escape("".join(out).encode("utf-8"))
    return data


def with_transaction(content: LedgerContent, key: int) -> dict[str, Any]:
    """An operation with its transaction embedded, as ``join=transactions`` returns it: Go puts
    ``transaction`` right after ``transaction_hash`` (the operation's base struct)."""
    record = content.records[key]
    tx_key = key & ~(((1 << 12) - 1) << 16)  # the same TOID with operation index 0
    transaction = content.records[tx_key]
    out: dict[str, Any] = {}
    for field, value in record.items():
        out[field] = value
        if field == "transaction_hash":
            out["transaction"] = transaction
    return out


def joined_page_form(content: LedgerContent, key: int) -> bytes:
    """:func:`page_form` of :func:`with_transaction` (not cached: a rare query)."""
    out = [_RECORD_INDENT[1:]]
    _pretty(with_transaction(content, key), _RECORD_INDENT[1:], out)
    return go_escape("".join(out).encode("utf-8"))


def joined_compact_form(content: LedgerContent, key: int) -> bytes:
    """:func:`compact_form` of :func:`with_transaction`."""
    return go_json(with_transaction(content, key), indent=False)


def _pretty(value: dict[str, Any] | list[Any], indent: str, out: list[str]) -> None:
    """``MarshalIndent`` of a dict or list, much faster than ``json.dumps(indent=2)``.

    Scalars are written inline (strings by the C escaper); only containers recurse.
    """
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        out.append("{")
        sep = "\n"
        for k, v in value.items():
            head = f"{sep}{inner}{_encode_string(k)}: "
            sep = ",\n"
            t = type(v)
            if t is str:
                out.append(head + _encode_string(v))
            elif t is bool:
                out.append(head + ("true" if v else "false"))
            elif t is int:
                out.append(f"{head}{v}")
            elif v is None:
                out.append(head + "null")
            else:
                out.append(head)
                _pretty(v, inner, out)
        out.append(f"\n{indent}}}")
        return
    if not value:
        out.append("[]")
        return
    out.append("[")
    sep = "\n"
    for v in value:
        t = type(v)
        if t is str:
            out.append(f"{sep}{inner}{_encode_string(v)}")
        elif t is bool:
            out.append(f"{sep}{inner}{'true' if v else 'false'}")
        elif t is int:
            out.append(f"{sep}{inner}{v}")
        elif v is None:
            out.append(f"{sep}{inner}null")
        else:
            out.append(sep + inner)
            _pretty(v, inner, out)
        sep = ",\n"
    out.append(f"\n{indent}]")


def with_base(data: bytes, base: bytes) -> bytes:
    return data.replace(PLACEHOLDER, base)


def page_link(base: str, path: str, params: Mapping[str, str]) -> str:
    """A page link as Horizon writes it: query parameters sorted by name (Go's url.Values)."""
    query = "&".join(f"{name}={quote(params[name], safe='')}" for name in sorted(params))
    return f"{base}{path}?{query}"


def page(
    base: str,
    path: str,
    params: Mapping[str, str],
    *,
    order: str,
    limit: int,
    cursor: str,
    tokens: Sequence[str],
    records: Sequence[bytes],
) -> bytes:
    """A HAL page: self/next/prev links and the embedded, already indented, records.

    ``params`` are the extra (non-paging) query parameters to repeat in the links.
    """

    def link(link_order: str, link_cursor: str) -> str:
        return page_link(
            base, path, {**params, "order": link_order, "limit": str(limit), "cursor": link_cursor}
        )

    inverted = "asc" if order == "desc" else "desc"
    first, last = (tokens[0], tokens[-1]) if tokens else (cursor, cursor)
    links = {
        "self": {"href": link(order, cursor)},
        "next": {"href": link(order, last)},
        "prev": {"href": link(inverted, first)},
    }
    head = json.dumps({"_links": links}, ensure_ascii=False, indent=2)[:-2]
    if records:
        body = (
            b',\n  "_embedded": {\n    "records": [\n' + b",\n".join(records) + b"\n    ]\n  }\n}"
        )
    else:
        body = b',\n  "_embedded": {\n    "records": []\n  }\n}'
    return go_escape(head.encode("utf-8")) + body


class Problem(Exception):
    """Answer the request with this problem (and status)."""

    def __init__(self, status: int, body: bytes):
        super().__init__(status)
        self.status = status
        self.body = body


def problem(
    kind: str, title: str, status: int, detail: str, extras: Mapping[str, Any] | None = None
) -> bytes:
    """An RFC 7807 problem as Horizon renders it (type prefixed with the horizon-errors URL)."""
    value: dict[str, Any] = {
        "type": PROBLEM_BASE + kind,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if extras:
        value["extras"] = dict(sorted(extras.items()))
    return go_json(value)


NOT_FOUND_DETAIL = (
    "The resource at the url requested was not found.  This usually occurs for one of two "
    "reasons:  The url requested is not valid, or no data in our database could be found with "
    "the parameters provided."
)


def not_found() -> bytes:
    return problem("not_found", "Resource Missing", 404, NOT_FOUND_DETAIL)


def bad_request(field: str, reason: str) -> bytes:
    return problem(
        "bad_request",
        "Bad Request",
        400,
        "The request you sent was invalid in some way.",
        {"invalid_field": field, "reason": reason},
    )


FAILURE_PROBLEMS: dict[int, tuple[str, str, str]] = {
    429: (
        "rate_limit_exceeded",
        "Rate Limit Exceeded",
        "The rate limit for the requesting IP address is over its alloted limit.  The allowed "
        "limit and requests left per time period are communicated to clients via the http "
        "response headers 'X-RateLimit-*' headers.",
    ),
    500: (
        "server_error",
        "Internal Server Error",
        "An error occurred while processing this request.  This is usually due to a bug within "
        "the server software.  Trying this request again may succeed if the bug is transient. "
        "Otherwise, please contact the system administrator.",
    ),
    502: (
        "bad_gateway",
        "Bad Gateway",
        "The server, while acting as a gateway or proxy, received an invalid response from the "
        "upstream server.",
    ),
    # What Horizon's history routes answer with 503: the history database lags stellar-core.
    503: (
        "stale_history",
        "Historical DB Is Too Stale",
        "This horizon instance is configured to reject client requests when it can determine "
        "that the history database is lagging too far behind the connected instance of "
        "Stellar-Core or read replica. It's also possible that Stellar-Core is out of sync. "
        "Please try again later.",
    ),
    504: (
        "timeout",
        "Timeout",
        "Your request timed out before completing.  Please try your request again. If you are "
        "submitting a transaction make sure you are sending exactly the same transaction (with "
        "the same sequence number).",
    ),
}


def failure(status: int) -> bytes:
    kind, title, detail = FAILURE_PROBLEMS[status]
    return problem(kind, title, status, detail)


# Horizon never answers 502 itself: the proxy in front of it does, with its own page.
BAD_GATEWAY_HTML = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


def sse_record(token: str | None, data: bytes) -> bytes:
    """One record event: ``id: <paging token>`` (omitted when None) and the compact record."""
    if token is None:
        return b"data: " + data + b"\n\n"
    return b"id: " + token.encode("ascii") + b"\ndata: " + data + b"\n\n"


def sse_error(message: str) -> bytes:
    """An error after the hello frame; Horizon then ends the stream without byebye."""
    return b"event: error\ndata: " + message.encode("utf-8") + b"\n\n"
