"""Synthetic contract events as Stellar RPC serves them (``EventInfo`` text), for the events API's
tests and benchmarks: a few contracts, verbs and accounts, so that every filter shape has something to tell
apart, and the reference answer :func:`expected_page` computes by stellar-rpc's rules."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson
from stellar_sdk import scval

from actors.source import Record
from ingestion.rpc.protocol import Cursor, EventFilter, event_head, matches

CONTRACTS = (
    "CDLZFC3SYJYDZT7K67VZ75HPJVIEUVNIXF47ZG2FB2RMQQVU2HHGCYSC",
    "CAS3J7GYLGXMF6TDJBBYYSE3HQ6BBSMLNUQ34T6TZMYMW2EVH34XOWMA",
    "CCW67TSZV3SSS2HXMBQ5JFGCKJNXKZM7UQUWUZPUTHXSTZLEO7SJMI75",
)
ACCOUNTS = (
    "GAAZI4TCR3TY5OJHCTJC2A4QSY6CJWJH5IAJTGKIN2ER7LBNVKOCCWN7",
    "GBRPYHIL2CI3FNQ4BXLFMNDLFJUNPU2HY3ZMFSHONUCEOASW7QC7OX2H",
    "GCEZWKCA5VLDNRLN3RPRJMRZOX3Z6G5CHCGSNFHEYVXM3XOJMDS674JZ",
)
CLOSE_BASE = 1_700_000_000


class Event(NamedTuple):
    id: str
    type: str
    contract_id: str
    topics: tuple[str, ...]
    text: str


def _sc(kind: str, value: Any) -> str:
    encoders: dict[str, Any] = {
        "sym": scval.to_symbol,
        "addr": scval.to_address,
        "str": scval.to_string,
        "i128": scval.to_int128,
        "u32": scval.to_uint32,
    }
    return str(encoders[kind](value).to_xdr())


def segment(kind: str, value: Any) -> str:
    """A topic segment's base64 (``sym``, ``addr``, ``str``, ``i128``, ``u32``)."""
    return _sc(kind, value)


def make_events(first: int, last: int, seed: int = 7) -> list[Event]:
    """Events of ledgers ``first..last``, ascending by id: 0 to 3 per ledger, one system event
    every 10 ledgers."""
    rng = random.Random(seed)
    out: list[Event] = []
    for ledger in range(first, last + 1):
        closed = CLOSE_BASE + 5 * ledger
        closed_at = _rfc3339(closed)
        for tx in range(1, rng.randrange(0, 3) + 1):
            contract = CONTRACTS[min(rng.randrange(4), 2)]
            verb = rng.choice(("transfer", "transfer", "mint", "burn", "approve"))
            a, b = rng.choice(ACCOUNTS), rng.choice(ACCOUNTS)
            topics: tuple[str, ...]
            if verb == "burn":
                topics = (segment("sym", verb), segment("addr", a))
            elif verb == "mint" and rng.random() < 0.5:
                topics = (segment("sym", verb),)
            else:
                topics = (
                    segment("sym", verb),
                    segment("addr", a),
                    segment("addr", b),
                    segment("str", "native"),
                )
            value = segment("i128", rng.randrange(1, 10**9))
            out.append(_event("contract", Cursor(ledger, tx, 0, 0), closed_at, contract, topics, value))
        if ledger % 10 == 0:
            topics = (segment("sym", "ledger_closed"), segment("u32", ledger))
            out.append(
                _event(
                    "system", Cursor(ledger, (1 << 20) - 1, 0, 0), closed_at, "", topics, segment("u32", 1)
                )
            )
    return out


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _event(
    kind: str, cursor: Cursor, closed_at: str, contract: str, topics: tuple[str, ...], value: str
) -> Event:
    body = event_head(kind, cursor, closed_at, contract, "ab" * 32, True)
    body["topic"] = list(topics)
    body["value"] = value
    return Event(str(cursor), kind, contract, topics, orjson.dumps(body).decode())


def records(events: Sequence[Event]) -> list[Record]:
    return [Record(e.id, e.text) for e in events]


def expected_page(
    events: Sequence[Event], filters: Sequence[EventFilter], start: Cursor, end_ledger: int, limit: int
) -> tuple[list[str], str]:
    """The ids of a page by stellar-rpc's rules (no scan cap), and its cursor."""
    low, high = str(start), str(Cursor(end_ledger))
    found = [
        e.id for e in events if low <= e.id < high and matches(filters, e.type, e.contract_id, e.topics)
    ][:limit]
    cursor = found[-1] if len(found) >= limit else str(Cursor.through(end_ledger - 1))
    return found, cursor
