"""The I/O-free core of the Horizon source: paging/streaming decisions, validation and backoff.

:class:`HorizonFollower` is the whole state of following one Horizon collection from a cursor. The
wrapper (``ingestion/horizon/source.py``) asks it for the next :class:`Attempt` (which URL, page or
stream, from which cursor, after what delay), carries the request out, and feeds back what happened:
a page body, a stream event, the end of a stream, or a :class:`Failure`. The follower validates
every record against the last good paging token, so what it hands back is strictly increasing
across the whole run, and it decides retries, failover and when to give up. It never sleeps,
reads a clock or logs: delays are returned as numbers and jitter comes from the ``rng`` given.

Phases: catch up with ``order=asc`` pages while they come back full, then follow the SSE stream from
the last paging token. A stream that ends cleanly (``event: close``, EOF, idle) is reopened from the
last token; a stream that fails falls back to paging, which is cheaper for whatever backlog piled up
meanwhile and switches straight back to streaming when the first page is not full.
"""

from __future__ import annotations

import enum
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import msgspec
import orjson

from actors.source import Record, SourceFatalError
from ingestion.common.paging import InvalidPagingToken, ascending_after, token_key
from ingestion.common.retry import RetryPolicy

#: Horizon's largest page.
MAX_PAGE_LIMIT = 200
#: ``limit`` sent on every stream request. Horizon closes a stream (``byebye``) after ``limit``
#: events and defaults it to the page default, 10: without it a busy collection would be
#: reconnected every 10 records, each reconnect costing a request of the rate limit.
STREAM_LIMIT = 200

# One encoder, built once: json.dumps(..., separators=...) builds a new encoder on every call.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_GO_ESCAPES = (
    ("&", "\\u0026"),
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)
# The C scanner behind json.loads: scan_once(text, i) -> (value, end) for the value at offset i.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_WHITESPACE = re.compile(r"[ \t\n\r]*").match

_COLLECTIONS = ("ledgers", "transactions", "operations", "payments", "effects", "trades")
_RESOURCE = re.compile(r"/(?:[A-Za-z_]+/[A-Za-z0-9_-]+/)?(?:" + "|".join(_COLLECTIONS) + r")")


def compact_json(record: Any) -> str:
    """A record's JSON as Horizon streams it: Go's ``json.Marshal`` of the record.

    That is compact JSON, non-ASCII left as is, and ``&``, ``<``, ``>``, U+2028 and U+2029
    escaped as ``\\u0026`` and so on (Go's HTML-safe escaping; these characters can only occur
    inside strings, so replacing them in the whole text is exact). Horizon indents its pages but
    streams compact records, so a paged record is re-serialized with this to make its body
    byte-identical to the same record's SSE ``data`` (checked against the simulator, which renders
    both forms as Horizon does). Differences that remain possible against real Horizon: number
    formatting Python and Go disagree on (records carry amounts as strings) and escapes of rare
    control characters.
    """
    text = _COMPACT.encode(record)
    for raw, escaped in _GO_ESCAPES:
        if raw in text:
            text = text.replace(raw, escaped)
    return text


# Query parameters that change what a collection returns, and the collections that take them.
_QUERY_PARAMS = {
    "include_failed": (("true", "false"), ("transactions", "operations", "payments")),
    "join": (("transactions",), ("operations", "payments")),
}


def split_resource(resource: str) -> tuple[str, dict[str, str]]:
    """``/operations?join=transactions`` as (``/operations``, ``{"join": "transactions"}``)."""
    path, _, query = resource.partition("?")
    params = dict(part.partition("=")[::2] for part in query.split("&") if part)
    return path, params


def check_resource(resource: str) -> str:
    """Return ``resource`` if it is a Horizon collection path we can follow, with optional
    query parameters that change what it returns (``include_failed``, ``join=transactions``).

    Raises:
        ValueError: not ``/ledgers``, ``/transactions``, ``/operations``, ``/payments``,
            ``/effects`` or a scoped one such as ``/accounts/G.../payments``, or a query
            parameter this collection does not take.
    """
    path, params = split_resource(resource)
    if not _RESOURCE.fullmatch(path):
        raise ValueError(
            f"resource {resource!r} is not a Horizon collection path: use one of "
            + ", ".join("/" + c for c in _COLLECTIONS)
            + " or a scoped one such as /accounts/G.../payments, /liquidity_pools/{id}/trades, "
            "/claimable_balances/{id}/operations or /offers/{id}/trades"
        )
    collection = path.rsplit("/", 1)[1]
    for name, value in params.items():
        values, collections = _QUERY_PARAMS.get(name, ((), ()))
        if collection not in collections or value not in values:
            raise ValueError(
                f"resource {resource!r}: {name}={value} is not a parameter {path} takes; allowed: "
                "include_failed=true|false (transactions, operations, payments) and "
                "join=transactions (operations, payments)"
            )
    return resource


def check_cursor(cursor: str) -> str:
    """Return ``cursor`` if it is ``"now"`` or a paging token, else raise SourceFatalError."""
    if cursor != "now":
        try:
            token_key(cursor)
        except InvalidPagingToken:
            raise SourceFatalError(
                f"cursor {cursor!r} is neither 'now' nor a Horizon paging token; "
                "fix the start cursor (or the committed cursor)"
            ) from None
    return cursor


# --- failures ------------------------------------------------------------------------------------


def is_entity_scoped(resource: str) -> bool:
    """True for ``/accounts/G.../...``, ``/liquidity_pools/{id}/...`` and
    ``/claimable_balances/{id}/...``: Horizon answers 404 for an account, pool or balance it has
    not ingested yet (a new one, a lagging mirror), which another URL or a later try can fix."""
    return resource.startswith(("/accounts/", "/liquidity_pools/", "/claimable_balances/"))


class NotFoundTracker:
    """When to give up on 404s for an account-scoped collection: only once every URL has been
    answering 404 (and nothing else since) for ``give_up`` seconds. Time is passed in."""

    def __init__(self, urls: Sequence[str], give_up: float) -> None:
        self.urls = frozenset(u.rstrip("/") for u in urls)
        self.give_up = give_up
        self._since: dict[str, float] = {}

    def not_found(self, url: str, now: float) -> bool:
        """``url`` answered 404 at ``now``; True when it is time to give up."""
        self._since.setdefault(url.rstrip("/"), now)
        if set(self._since) < self.urls:
            return False
        return now - min(self._since.values()) >= self.give_up

    def found(self) -> None:
        """Some URL answered with the collection: the account exists."""
        self._since.clear()



@attrs.frozen
class Failure:
    """A request that did not produce records: the HTTP status (None for a transport error),
    a short description, and for 429 the parsed Retry-After."""

    status: int | None
    error: str
    retry_after: float | None = None


def problem_detail(content: bytes) -> str:
    """The useful part of a Horizon problem+json body: ``detail`` and the ``extras`` reason."""
    try:
        doc = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return content[:200].decode("utf-8", "replace").strip()
    if not isinstance(doc, dict):
        return str(doc)[:200]
    parts = [str(doc.get("title") or ""), str(doc.get("detail") or "")]
    extras = doc.get("extras")
    if isinstance(extras, dict):
        for key in ("invalid_field", "reason"):
            if extras.get(key):
                parts.append(f"{key}={extras[key]}")
    return " ".join(p for p in parts if p) or str(doc)[:200]


def is_retryable_status(status: int) -> bool:
    """True for statuses that another try can fix: 5xx, 408, 425, 429 (and anything odd < 400)."""
    return status >= 500 or status in (408, 425, 429) or status < 400


def fatal_message(status: int, url: str, detail: str) -> str:
    """What to tell the operator when Horizon rejects a request for good."""
    if status == 400:
        fix = "check the start cursor / committed cursor and the resource path"
    elif status == 404:
        fix = (
            "check --resource (unknown path, or the account/ledger does not exist on this "
            "network) and the Horizon URL"
        )
    elif status in (401, 403):
        fix = "check access to this Horizon (API key, IP allow-list)"
    elif status == 410:
        fix = "the cursor is older than this Horizon's retained history; choose a newer cursor"
    else:
        fix = "check the resource path and Horizon URL"
    return f"Horizon rejected {url} with HTTP {status}: {detail or '(no detail)'}; {fix}"


# --- validation ----------------------------------------------------------------------------------


@attrs.frozen
class Malformed:
    """Input that breaks the rules: ``reason`` is a kebab-case tag, ``value`` the offending text."""

    reason: str
    value: str


@attrs.frozen
class PageOutcome:
    """The good records of a page, in order, and what stopped validation if something did."""

    records: tuple[Record, ...]
    malformed: Malformed | None
    full: bool


def _excerpt(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class NotAPage(ValueError):
    """Valid JSON so far, but not a HAL page with an ``_embedded.records`` array."""


def split_page(text: str) -> list[tuple[Any, str]]:
    """Parse a HAL page and return each record of ``_embedded.records`` with its exact text.

    Uses the json module's C scanner value by value, so it costs about one ``json.loads`` of the
    page and spares re-serializing every record. The whole document is parsed, so truncated or
    broken JSON anywhere is caught.

    Raises:
        NotAPage: the JSON is not an object with an ``_embedded.records`` array.
        ValueError: broken JSON.
    """
    records: list[tuple[Any, str]] | None = None
    i = _ws(text, 0)
    if not text.startswith("{", i):
        raise NotAPage(f"expected an object at offset {i}")
    key, i = _next_member(text, i + 1, first=True)
    while key is not None:
        if key == "_embedded" and text.startswith("{", i):
            inner, i = _next_member(text, i + 1, first=True)
            while inner is not None:
                if inner == "records" and text.startswith("[", i):
                    records, i = _array_with_text(text, i)
                else:
                    i = _skip_value(text, i)
                inner, i = _next_member(text, i, first=False)
        else:
            i = _skip_value(text, i)
        key, i = _next_member(text, i, first=False)
    if _ws(text, i) != len(text):
        raise ValueError(f"extra data after the page at offset {i}")
    if records is None:
        raise NotAPage("no _embedded.records array")
    return records


def _ws(text: str, i: int) -> int:
    m = _WHITESPACE(text, i)
    return m.end() if m else i


def _next_member(text: str, i: int, *, first: bool) -> tuple[str | None, int]:
    """After ``{`` or a member's value: (next key, offset of its value), or (None, offset just
    past the closing ``}``)."""
    i = _ws(text, i)
    if text.startswith("}", i):
        return None, i + 1
    if not first:
        if not text.startswith(",", i):
            raise ValueError(f"expected ',' or '}}' at offset {i}")
        i = _ws(text, i + 1)
    if not text.startswith('"', i):
        raise ValueError(f"expected a key at offset {i}")
    key, i = _scan(text, i)
    i = _ws(text, i)
    if not text.startswith(":", i):
        raise ValueError(f"expected ':' at offset {i}")
    return key, _ws(text, i + 1)


def _skip_value(text: str, i: int) -> int:
    try:
        return _scan(text, i)[1]
    except StopIteration as exc:
        raise ValueError(f"expected a value at offset {exc.value}") from None


def _array_with_text(text: str, i: int) -> tuple[list[tuple[Any, str]], int]:
    out: list[tuple[Any, str]] = []
    i = _ws(text, i + 1)
    if text.startswith("]", i):
        return out, i + 1
    while True:
        try:
            value, end = _scan(text, i)
        except StopIteration as exc:
            raise ValueError(f"expected a value at offset {exc.value}") from None
        out.append((value, text[i:end]))
        i = _ws(text, end)
        if text.startswith(",", i):
            i = _ws(text, i + 1)
        elif text.startswith("]", i):
            return out, i + 1
        else:
            raise ValueError(f"expected ',' or ']' at offset {i}")


def validate_page(
    content: bytes | str, after: str | None, limit: int = MAX_PAGE_LIMIT
) -> PageOutcome:
    """Parse a Horizon page and return its records strictly after ``after``.

    Validation stops at the first bad record (broken JSON, no paging token, a token that is not
    after the previous one): it and everything after it are dropped, the records before it kept.
    ``full`` says the page held ``limit`` records, i.e. there may be more to page through.

    A record's body is the record's text as the page carries it, compacted (see
    :func:`compact_record_text`): what Horizon streams for the same record.
    """
    try:
        if isinstance(content, str):
            data = content.encode()
        else:
            data = content
            if not content.isascii():  # the fast path works on the bytes: its parser does not check
                content.decode("utf-8")  # the UTF-8, this does (an ASCII page needs no copy for it)
        fast = _split_indented_page(data, after, limit)
        if fast is not None:
            return fast
        raw = split_page(content if isinstance(content, str) else content.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return PageOutcome((), Malformed("broken-json", f"{exc}: {_excerpt(content)}"), False)
    except NotAPage as exc:
        return PageOutcome((), Malformed("not-a-page", f"{exc}: {_excerpt(content)}"), False)
    except ValueError as exc:
        return PageOutcome((), Malformed("broken-json", f"{exc}: {_excerpt(content)}"), False)
    records: list[Record] = []
    last_key = None if after is None else token_key(after)
    for rec, rec_text in raw:
        bad = _check_record(rec, last_key)
        if isinstance(bad, Malformed):
            return PageOutcome(tuple(records), bad, False)
        token, last_key = bad
        records.append(Record(token, compact_record_text(rec, rec_text)))
    return PageOutcome(tuple(records), None, len(raw) >= limit)


class _Tokens(msgspec.Struct):
    paging_token: str


class _EmbeddedTokens(msgspec.Struct):
    records: list[_Tokens]


class _PageTokens(msgspec.Struct):
    _embedded: _EmbeddedTokens


class _EmbeddedTexts(msgspec.Struct):
    records: list[msgspec.Raw]


class _PageTexts(msgspec.Struct):
    _embedded: _EmbeddedTexts


_PAGE_TOKENS = msgspec.json.Decoder(_PageTokens)
_PAGE_TEXTS = msgspec.json.Decoder(_PageTexts)


def _split_indented_page(content: bytes, after: str | None, limit: int) -> PageOutcome | None:
    """The fast path of :func:`validate_page` for an indented page whose records are all good.

    Nothing is decoded into Python values but the paging tokens. The whole page is compacted by a
    JSON parser (msgspec's ``format`` with no indentation: it checks the whole document, strictly,
    and removes exactly the whitespace between tokens, keeping strings, escapes and numbers as the
    server wrote them: Go's ``json.Compact``, what Horizon's stream sends). Two typed decodes of
    the compact page then give each record's exact text (``msgspec.Raw``: a parser's cut, not a
    text search) and its ``paging_token``; the tokens are checked all at once (well formed, after
    ``after``, strictly ascending). Returns None for anything else (a page on one line is kept as
    sent; broken JSON, a record that is not an object or lacks a token, tokens out of order): the
    general path then finds exactly which record is bad and keeps those before it. ``content``
    must be valid UTF-8 (the caller checks: the parser does not).
    """
    if b"\n" not in content:
        return None
    try:
        compact = msgspec.json.format(content, indent=-1)
        tokens = [r.paging_token for r in _PAGE_TOKENS.decode(compact)._embedded.records]
        texts = _PAGE_TEXTS.decode(compact)._embedded.records
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not tokens or not ascending_after(tokens, after):
        return None
    # each text decoded straight from the parser's slice; the records built in C
    records = Record.many(tokens, [str(t, "utf-8") for t in texts])
    return PageOutcome(records, None, len(records) >= limit)


def compact_record_text(record: Any, text: str) -> str:
    """The compact form of a record's text from a page, as Horizon would stream it.

    Horizon writes pages with Go's ``json.MarshalIndent`` and stream events with ``json.Marshal``;
    the two differ only in whitespace: a newline plus indentation before each member or element,
    and a space after each key's colon. ``text`` parsed as valid JSON, so it has no raw newline
    inside a string: every newline and the spaces after it are indentation, and ``": "`` can be
    inside a string only as ``\\": ``. Undoing those gives Go's ``json.Compact``, byte for byte
    what the stream sends (Go's escapes and number formats kept as the server wrote them). When
    ``\\": `` occurs, :func:`compact_json` re-serializes the record instead. A record already on
    one line is kept as is.
    """
    if "\n" not in text:
        return text
    if '\\": ' in text:
        return compact_json(record)
    # str.lstrip() may strip more than spaces, but a line never starts with a string's inside.
    return "".join(map(str.lstrip, text.split("\n"))).replace('": ', '":')


def _check_record(
    rec: Any, last_key: tuple[int, int] | None
) -> tuple[str, tuple[int, int]] | Malformed:
    if not isinstance(rec, dict):
        return Malformed("not-an-object", _excerpt(rec))
    token = rec.get("paging_token")
    if not isinstance(token, str):
        return Malformed("missing-paging-token", _excerpt(rec))
    try:
        key = token_key(token)
    except InvalidPagingToken:
        return Malformed("invalid-paging-token", token)
    if last_key is not None and key <= last_key:
        return Malformed(
            "duplicate-paging-token" if key == last_key else "paging-token-out-of-order", token
        )
    return token, key


def validate_stream_record(event_id: str, data: str, after: str | None) -> Record | Malformed:
    """Check one SSE record frame; the body is ``data`` exactly as sent.

    The frame's ``id`` (if any) must equal the record's ``paging_token``, which must sort strictly
    after ``after``.
    """
    try:
        rec = orjson.loads(data)
    except ValueError:
        try:
            rec = json.loads(data)  # what orjson refuses but is JSON (integers beyond 64 bits)
        except ValueError as exc:
            return Malformed("broken-json", f"{exc}: {_excerpt(data)}")
    checked = _check_record(rec, None if after is None else token_key(after))
    if isinstance(checked, Malformed):
        return checked
    token = checked[0]
    if event_id and event_id != token:
        return Malformed("id-mismatch", f"id {event_id!r} != paging_token {token!r}")
    return Record(token, data)


# --- the follower --------------------------------------------------------------------------------


class Mode(enum.Enum):
    CATCH_UP = "catch-up"
    STREAMING = "streaming"


@attrs.frozen
class PageRequest:
    """GET ``url`` with ``params`` (``order=asc&limit=...&cursor=...``) for a JSON page."""

    base_url: str
    url: str
    cursor: str
    limit: int
    extra: tuple[tuple[str, str], ...] = ()  # the resource's own query parameters

    @property
    def params(self) -> dict[str, str]:
        return {**dict(self.extra), "order": "asc", "limit": str(self.limit), "cursor": self.cursor}


@attrs.frozen
class StreamRequest:
    """GET ``url`` as ``text/event-stream`` from ``cursor`` (also sent as Last-Event-ID)."""

    base_url: str
    url: str
    cursor: str
    extra: tuple[tuple[str, str], ...] = ()  # the resource's own query parameters

    @property
    def params(self) -> dict[str, str]:
        return {
            **dict(self.extra),
            "order": "asc",
            "limit": str(STREAM_LIMIT),
            "cursor": self.cursor,
        }

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.cursor == "now" else {"Last-Event-ID": self.cursor}


@attrs.frozen
class Attempt:
    """The next request and how long to wait before sending it."""

    request: PageRequest | StreamRequest
    delay: float


@attrs.frozen
class Retry:
    """The follower's answer to a failure: ``attempt`` is the consecutive-failure count, ``delay``
    the wait before the next request, ``failover_to`` the next URL when it switched."""

    attempt: int
    delay: float
    failover_from: str | None = None
    failover_to: str | None = None


class StreamSignal(enum.Enum):
    """What a non-record SSE frame means to the follower."""

    IGNORE = "ignore"  # open, comments, unknown events
    CLOSED = "closed"  # Horizon said byebye: reconnect from the last token
    ERROR = "error"  # Horizon sent `event: error`


class HorizonFollower:
    """The state of following one Horizon collection from a cursor; see the module docstring.

    Args:
        urls: Horizon base URLs, tried in order; the follower sticks to the one that works.
        resource: the collection path, e.g. ``/operations``.
        cursor: ``"now"``, ``"0"`` or a paging token; records strictly after it are returned.
        policy: retry and failover settings.
        page_limit: records per page (Horizon allows at most 200).
        rng: returns uniform floats in [0, 1) for jitter.

    Raises:
        SourceFatalError: the cursor is not ``"now"`` or a paging token.
        ValueError: no URL, or a page limit outside 1..200.
    """

    def __init__(
        self,
        urls: Sequence[str],
        resource: str,
        cursor: str,
        policy: RetryPolicy,
        *,
        page_limit: int = MAX_PAGE_LIMIT,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not urls:
            raise ValueError("at least one Horizon URL is needed")
        if not 1 <= page_limit <= MAX_PAGE_LIMIT:
            raise ValueError(f"page limit {page_limit} must be within 1..{MAX_PAGE_LIMIT}")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.resource = check_resource(resource)
        self.path, params = split_resource(resource)
        self._extra = tuple(params.items())
        self.cursor = check_cursor(cursor)
        self.policy = policy
        self.page_limit = page_limit
        #: The ``limit`` of the next page: ``page_limit``, halved after each 504 (a query too
        #: heavy for Horizon's timeout) and doubled back after each page that came back.
        self.limit = page_limit
        self._rng = rng
        # "now" has nothing to page through: the first page would be empty by definition.
        self.mode = Mode.STREAMING if cursor == "now" else Mode.CATCH_UP
        self.url_index = 0
        self.failures_on_url = 0
        self.consecutive_failures = 0
        self.quiet_closes = 0
        self.malformed_strikes = 0
        self._delay = 0.0
        self._not_found = NotFoundTracker(self.urls, policy.not_found_give_up)
        #: The decision taken on the latest failure or malformed input, for the wrapper to log.
        self.last_retry: Retry | None = None

    # -- what to do next

    @property
    def base_url(self) -> str:
        return self.urls[self.url_index]

    @property
    def last_token(self) -> str | None:
        """The last paging token handed out (or the start cursor); None while at ``now``."""
        return None if self.cursor == "now" else self.cursor

    def next_attempt(self) -> Attempt:
        """The request to send next, and the delay to wait before it."""
        base = self.base_url
        url = base + self.path
        request: PageRequest | StreamRequest
        if self.mode is Mode.CATCH_UP:
            request = PageRequest(base, url, self.cursor, self.limit, self._extra)
        else:
            request = StreamRequest(base, url, self.cursor, self._extra)
        return Attempt(request, self.take_delay())

    def take_delay(self) -> float:
        """The wait decided by the latest outcome (consumed: the next call returns 0)."""
        delay, self._delay = self._delay, 0.0
        return delay

    def switch_url(self, url: str) -> None:
        """Move to ``url`` (one of ``urls``) at once, e.g. away from a stale Horizon: page from the
        last token there, since the stale one may have held records back.

        Raises:
            ValueError: not one of the follower's URLs.
        """
        self.url_index = self.urls.index(url.rstrip("/"))
        self.failures_on_url = 0
        if self.cursor != "now":
            self.mode = Mode.CATCH_UP
        self._delay = 0.0

    def skip_to(self, cursor: str) -> None:
        """Go on after ``cursor``, a paging token after the current one (skipping a history gap
        the operator chose to skip): the next request pages from there.

        Raises:
            ValueError: ``cursor`` is not a paging token after the current cursor.
        """
        if self.cursor != "now" and token_key(cursor) <= token_key(self.cursor):
            raise ValueError(f"cannot skip back from {self.cursor!r} to {cursor!r}")
        self.cursor = cursor
        self.mode = Mode.CATCH_UP

    # -- outcomes

    def on_page(self, content: bytes | str) -> PageOutcome:
        """A 200 page arrived: validate it, advance the cursor, decide paging vs streaming."""
        outcome = validate_page(content, self.last_token, self.limit)
        if outcome.records:
            self._progress(outcome.records[-1].paging_token)
        if outcome.malformed is not None:
            self._malformed(outcome.malformed)
        else:
            self._succeeded()
            self.limit = self.grown_limit(self.limit)
            if not outcome.full:
                self.mode = Mode.STREAMING
        return outcome

    def on_stream_open(self) -> None:
        """The stream answered 200 with an event stream: the URL works."""
        self._succeeded()

    def on_stream_event(
        self, event: str, event_id: str, data: str
    ) -> Record | Malformed | StreamSignal:
        """One SSE frame. A Malformed answer means: drop the connection (the follower has already
        scheduled a reconnect from the last good token, or raised SourceFatalError)."""
        if event == "message":
            result = validate_stream_record(event_id, data, self.last_token)
            if isinstance(result, Record):
                self._progress(result.paging_token)
                self.quiet_closes = 0
            else:
                self._malformed(result)
            return result
        if event == "close":
            return StreamSignal.CLOSED
        if event == "error":
            return StreamSignal.ERROR
        return StreamSignal.IGNORE

    def on_stream_end(self, got_records: bool, open_for: float = 0.0) -> float:
        """The stream ended cleanly (``event: close``, EOF or idle): reopen it from the last token.

        Reconnects at once after a stream that delivered records or stayed open at least
        ``policy.stream_quick_close`` seconds (``open_for``: a sparse collection whose stream
        Horizon closed at its timeout; Horizon itself asks for ``retry: 10`` ms). A run of
        streams that close soon after opening with nothing backs off, so that a server that closes
        at once is not hammered. Returns the delay.
        """
        self.mode = Mode.STREAMING
        if got_records or open_for >= self.policy.stream_quick_close:
            self.quiet_closes = 0
            self._delay = 0.0
        else:
            self.quiet_closes += 1
            self._delay = self.policy.delay(self.quiet_closes, self._rng())
        return self._delay

    def on_failure(self, failure: Failure, *, url: str, now: float = 0.0) -> Retry:
        """A request failed (transport error, timeout, bad status, ``event: error``).

        Retryable failures back off and, after ``attempts_per_url`` in a row on one URL, move to
        the next URL; a failed stream falls back to paging from the last token. A 404 for an
        account-scoped collection is retried likewise until every URL has answered 404 for
        ``policy.not_found_give_up`` seconds (``now`` is the current time).

        Raises:
            SourceFatalError: Horizon rejected the request in a way retrying cannot fix.
        """
        if failure.status == 404 and is_entity_scoped(self.resource):
            if self._not_found.not_found(self.base_url, now):
                raise SourceFatalError(
                    fatal_message(404, url, failure.error)
                    + f" (every URL answered 404 for {self.policy.not_found_give_up:g} s: "
                    "horizon.not_found_give_up_ms)"
                )
            return self._retry(failure.retry_after)
        if failure.status is not None and not is_retryable_status(failure.status):
            raise SourceFatalError(fatal_message(failure.status, url, failure.error))
        if failure.status == 504 and self.mode is Mode.CATCH_UP:
            # Horizon's query timeout: ask for less, so that the query fits; grow back later.
            self.limit = max(1, self.limit // 2)
        return self._retry(failure.retry_after)

    def grown_limit(self, limit: int) -> int:
        """The page limit after a page of ``limit`` came back: doubled, up to ``page_limit``."""
        return min(self.page_limit, limit * 2)

    # -- internals

    def _progress(self, token: str) -> None:
        self.cursor = token
        self.malformed_strikes = 0

    def _succeeded(self) -> None:
        self.failures_on_url = 0
        self.consecutive_failures = 0
        self._not_found.found()

    def _malformed(self, malformed: Malformed) -> None:
        self.malformed_strikes += 1
        if self.malformed_strikes > self.policy.malformed_retries:
            raise SourceFatalError(
                f"Horizon keeps sending malformed data after paging token {self.cursor!r} "
                f"({malformed.reason}: {malformed.value}); {self.malformed_strikes} tries on "
                f"{', '.join(self.urls)}; check the Horizon servers"
            )
        self._retry(None)

    def _retry(self, retry_after: float | None) -> Retry:
        if self.mode is Mode.STREAMING and self.cursor != "now":
            self.mode = Mode.CATCH_UP
        self.consecutive_failures += 1
        self.failures_on_url += 1
        attempt = self.consecutive_failures
        if self.failures_on_url >= self.policy.attempts_per_url and len(self.urls) > 1:
            old = self.base_url
            self.url_index = (self.url_index + 1) % len(self.urls)
            self.failures_on_url = 0
            # The first lap over the other URLs is immediate: a dead URL should cost no sleep.
            first_lap = attempt < self.policy.attempts_per_url * len(self.urls)
            delay = 0.0 if first_lap else self.policy.delay(attempt, self._rng())
            if retry_after is not None and not first_lap:
                delay = max(delay, min(retry_after, self.policy.retry_after_cap))
            self._delay = delay
            self.last_retry = Retry(attempt, delay, old, self.base_url)
            return self.last_retry
        delay = self.policy.delay(attempt, self._rng())
        if retry_after is not None:
            # Honour the server's wait, but a `Retry-After: 0` storm still backs off.
            delay = max(delay, min(retry_after, self.policy.retry_after_cap))
        self._delay = delay
        self.last_retry = Retry(attempt, delay)
        return self.last_retry
