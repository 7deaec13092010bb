"""What Horizon sends, parsed and validated: pages, stream records, and record texts as streamed (pure).

A page's records are scanned with their exact text (:func:`split_page`, or the fast path for Go's
indented pages), compacted to what Horizon's stream sends for the same record
(:func:`compact_record_text`, :func:`compact_json`), and checked against the last good paging
token: :func:`validate_page` and :func:`validate_stream_record` keep the records strictly after it,
in order, and name the first bad one (:class:`Malformed`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import attrs
import msgspec
import orjson

from actors.source import Record
from ingestion.common.paging import InvalidPagingToken, ascending_after, token_key
from ingestion.horizon.resources import MAX_PAGE_LIMIT

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
