"""Checking a job's events stream against the source's own record: the proof behind "exactly once".

Three questions, answered from evidence the nodes cannot fake:

1. Is every source record in the stream exactly once, in source order? The source's truth is read
   from Horizon itself (paged ``order=asc`` from the job's start cursor), never from our stream.
2. Is every entry the record Horizon serves? (Compared as parsed JSON, links without their host:
   Horizon renders them with the host each request was sent to.)
3. Was every entry written under the fencing token that was current? Fencing tokens must never go
   backwards along the stream, and each token's entries must carry the node that the audit stream
   says was granted that token and lie, by Redis's own clock (stream IDs), between that grant and
   the next one: a leader that lost its lease wrote nothing after its successor was elected.
   A job whose sink is PostgreSQL is judged by its fence history instead (``terms``: when each
   token raised the fence there, ``ingestion.postgres.sql.verify_fences``): PostgreSQL, not
   Redis, decides which commit lands, and a stale commit may land before the newer term's first
   transaction (docs/POSTGRES.md, "Why a stale write cannot land").

:func:`check_stream` is the pure core (plain values in, a :class:`Verification` out);
:func:`verify_job` gathers the evidence from Redis and Horizon and runs it;
:func:`read_postgres_evidence` reads a PostgreSQL job's rows and fence history instead;
:func:`verify_configured_job` checks a configured job against its source. The command line,
``ingestion verify``, is :mod:`ingestion.cli.verify`. The sources are read through their own
packages (:class:`~ingestion.horizon.exchange.Reader`, :class:`~ingestion.rpc.source.RpcReader`,
the lake's store), which alone know each wire: what is asked, and the order it is checked in, is
this module's.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import redis
import trio

from actors.lease_store import connect, job_keys
from ingestion.common.paging import token_key
from ingestion.horizon.exchange import Reader
from ingestion.rpc.source import RpcReader

PAGE_LIMIT = 200  # Horizon's largest page
HTTP_TIMEOUT = 10.0  # seconds, each page request
MAX_PROBLEMS = 12  # a broken stream is described by its first few problems, not all of them


@attrs.frozen
class StreamEntry:
    """One entry of the ``events`` stream."""

    entry_id: str  # Redis stream id "<ms>-<seq>", assigned by Redis's clock
    paging_token: str
    token: int
    node: str
    record: str

    @property
    def written_ms(self) -> int:
        return int(self.entry_id.partition("-")[0])


@attrs.frozen
class Grant:
    """A ``became-leader`` entry of the ``audit`` stream: ``node`` was granted ``token``."""

    entry_id: str
    node: str
    token: int

    @property
    def granted_ms(self) -> int:
        return int(self.entry_id.partition("-")[0])


@attrs.frozen
class SourceRecord:
    paging_token: str
    record: Any  # the parsed JSON


@attrs.frozen
class Verification:
    """The outcome of a check. ``ok`` when ``problems`` is empty."""

    count: int
    first: str | None
    last: str | None
    tokens: tuple[int, ...]  # the distinct fencing tokens along the stream, in stream order
    problems: tuple[str, ...]
    trimmed: int = 0  # records before the first entry, removed by retention
    fence_terms: int | None = None  # a PostgreSQL job: the terms of its fence history

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        kept = f" (after {self.trimmed} trimmed by retention)" if self.trimmed else ""
        head = (
            f"{self.count} records{kept}, paging tokens {self.first} .. {self.last}, "
            f"fencing tokens {_ranges(self.tokens)}"
        )
        if self.fence_terms is not None:
            head += f" (PostgreSQL, judged by the fence history: {self.fence_terms} terms)"
        if self.ok:
            return f"{head}: exactly once, in order: OK"
        return f"{head}: FAILED\n  " + "\n  ".join(self.problems)


def _ranges(tokens: Sequence[int]) -> str:
    if not tokens:
        return "none"
    if list(tokens) == list(range(tokens[0], tokens[0] + len(tokens))):
        return f"{tokens[0]}..{tokens[-1]}" if len(tokens) > 1 else str(tokens[0])
    return ",".join(map(str, tokens))


def check_stream(
    entries: Sequence[StreamEntry],
    source: Sequence[SourceRecord],
    grants: Sequence[Grant] | None = None,
    trimmed: int = 0,
) -> Verification:
    """Check ``entries`` against ``source`` (the source's records from the start cursor, in order,
    at least as far as the last entry) and, when given, against the audit stream's ``grants``.

    ``trimmed``: entries that retention removed from the head of the stream (``events.max_len``);
    the stream must then be exactly the source's records from that position on.
    """
    problems: list[str] = []

    def problem(text: str) -> None:
        if len(problems) < MAX_PROBLEMS:
            problems.append(text)

    # 1 and 2: the same sequence of records as the source, from its start (after what was trimmed).
    source = source[trimmed:]
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.paging_token in seen:
            problem(
                f"entry {i} ({entry.entry_id}): paging token {entry.paging_token} duplicates "
                f"entry {seen[entry.paging_token]}"
            )
        seen.setdefault(entry.paging_token, i)
        if i >= len(source):
            problem(f"entry {i}: paging token {entry.paging_token} is beyond the source's records")
            continue
        expected = source[i]
        if entry.paging_token != expected.paging_token:
            kind = "gap or reordering"
            if entry.paging_token in seen and seen[entry.paging_token] != i:
                kind = "duplicate"
            problem(
                f"entry {i}: paging token {entry.paging_token}, the source has "
                f"{expected.paging_token} there ({kind})"
            )
            continue
        try:
            body = json.loads(entry.record)
        except ValueError:
            problem(f"entry {i}: paging token {entry.paging_token}: the record is not JSON")
            continue
        if _without_origins(_as_sent(body)) != _without_origins(_as_sent(expected.record)):
            problem(f"entry {i}: paging token {entry.paging_token}: the record differs from Horizon's")
        elif not _derived_right(body, expected.record):
            problem(
                f"entry {i}: paging token {entry.paging_token}: its decoded fields "
                f"({', '.join(k for k in DERIVED if k in body) or 'none'}) are not what the source's "
                "record decodes to"
            )

    # 3: tokens never go backwards, and each was written by its holder while it held the lease.
    distinct: list[int] = []
    for i, entry in enumerate(entries):
        if distinct and entry.token < distinct[-1]:
            problem(
                f"entry {i}: fencing token {entry.token} after {distinct[-1]}: the token went "
                "backwards"
            )
        if not distinct or entry.token != distinct[-1]:
            distinct.append(entry.token)
    if grants is not None:
        problems_before = len(problems)
        by_token = {g.token: g for g in grants}
        ordered = sorted(grants, key=lambda g: g.token)
        next_grant = {g.token: n for g, n in itertools.pairwise(ordered)}
        for i, entry in enumerate(entries):
            grant = by_token.get(entry.token)
            if grant is None:
                problem(f"entry {i}: fencing token {entry.token} was never granted (no audit entry)")
                continue
            if entry.node != grant.node:
                problem(
                    f"entry {i}: written by {entry.node} under token {entry.token}, which was "
                    f"granted to {grant.node}"
                )
            if entry.written_ms < grant.granted_ms:
                problem(f"entry {i}: written before token {entry.token} was granted")
            successor = next_grant.get(entry.token)
            if successor is not None and entry.written_ms > successor.granted_ms:
                problem(
                    f"entry {i}: written under token {entry.token} by {entry.node} at "
                    f"{entry.written_ms} ms, after token {successor.token} was granted to "
                    f"{successor.node} at {successor.granted_ms} ms (a stale leader's write)"
                )
            if len(problems) - problems_before >= MAX_PROBLEMS // 2:
                break
    return Verification(
        count=len(entries),
        trimmed=trimmed,
        first=entries[0].paging_token if entries else None,
        last=entries[-1].paging_token if entries else None,
        tokens=tuple(distinct),
        problems=tuple(problems),
    )


_ORIGIN = re.compile(r"^https?://[^/]+")
# What the events stage adds to a record (ingestion.events): checked apart, by decoding the
# source's record again with the same rules
DERIVED = ("topicJson", "valueJson", "decodeError", "transfer")


def _as_sent(record: Any) -> Any:
    """The record without the fields the events stage adds: what the source sent."""
    if isinstance(record, dict) and any(k in record for k in DERIVED):
        return {k: v for k, v in record.items() if k not in DERIVED}
    return record


def _derived_right(body: Any, expected: Any) -> bool:
    """Whether the stream's record carries the decoded fields the source's record decodes to: the
    same as ``expected``'s when it has them (a job known to decode), else none or exactly what the
    rules give (a stream checked without knowing the job's settings: decoding may be off)."""
    if not isinstance(body, dict) or not isinstance(expected, dict):
        return True
    have = {k: body[k] for k in DERIVED if k in body}
    want = {k: expected[k] for k in DERIVED if k in expected}
    if want or not have:
        return have == want
    from ingestion.decode.stage import rule_for  # lazy: start-up (that check only)

    kind = "rpc" if "contractId" in expected and "ledger" in expected else "horizon"
    rule, _ = rule_for(kind)
    assert rule is not None
    derived = json.loads(rule(json.dumps(_as_sent(expected), separators=(",", ":"), ensure_ascii=False))[0])
    return have == {k: derived[k] for k in DERIVED if k in derived}


def _without_origins(value: Any) -> Any:
    """A record with the scheme and host cut from its links' ``href``s: Horizon renders links
    with the host the request was sent to, so the same record read through another URL of the
    same Horizon (a failover, a proxy) differs only there."""
    if isinstance(value, dict):
        return {
            k: _ORIGIN.sub("", v) if k == "href" and isinstance(v, str) else _without_origins(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_without_origins(v) for v in value]
    return value


def read_entries(client: redis.Redis, job: str, batch: int = 2000) -> list[StreamEntry]:
    """Every entry of the job's events stream, oldest first (blocking: run it in a thread)."""
    key = job_keys(job)["events"]
    out: list[StreamEntry] = []
    start = "-"
    while True:
        chunk: Any = client.xrange(key, min=start, count=batch)
        for entry_id, f in chunk:
            out.append(
                StreamEntry(entry_id, f["paging_token"], int(f["token"]), f["node"], f["record"])
            )
        if len(chunk) < batch:
            return out
        start = "(" + chunk[-1][0]


def read_grants(client: redis.Redis, job: str) -> list[Grant]:
    """The ``became-leader`` entries of the job's audit stream (blocking: run it in a thread)."""
    entries: Any = client.xrange(job_keys(job)["audit"])
    return [
        Grant(entry_id, f["node"], int(f["token"]))
        for entry_id, f in entries
        if f.get("event") == "became-leader"
    ]


async def fetch_source(
    horizon: str,
    resource: str = "/operations",
    start_cursor: str = "0",
    *,
    through: str | None,
) -> list[SourceRecord]:
    """The source's records after ``start_cursor``, in order, up to and including ``through``.

    Pages ``resource`` with ``order=asc&limit=200``; stops at the first page that reaches
    ``through`` (``None``: fetch nothing) or comes back empty.

    Raises:
        SourceUnreadable: Horizon could not be read.
        ValueError: ``horizon`` is not a Horizon URL.
    """
    if through is None:
        return []
    goal = token_key(through)
    out: list[SourceRecord] = []
    cursor = start_cursor
    reader = Reader(horizon, connect_timeout=HTTP_TIMEOUT, read_timeout=HTTP_TIMEOUT)
    async with reader.client() as http:
        while True:
            records = await reader.records(http, resource, order="asc", limit=str(PAGE_LIMIT), cursor=cursor)
            if not records:
                return out
            for record in records:
                out.append(SourceRecord(record["paging_token"], record))
            cursor = records[-1]["paging_token"]
            if token_key(cursor) >= goal:
                return out


async def verify_job(
    redis_url: str,
    job: str,
    horizon: str,
    resource: str = "/operations",
    start_cursor: str = "0",
) -> Verification:
    """Read the job's events and audit streams and check them against Horizon.

    Raises:
        redis.RedisError: Redis could not be read.
        SourceUnreadable: Horizon could not be read.
    """
    entries, grants, trimmed = await read_evidence(redis_url, job)
    through = entries[-1].paging_token if entries else None
    source = await fetch_source(horizon, resource, start_cursor, through=through)
    return check_stream(entries, source, grants, trimmed=trimmed)


async def read_evidence(redis_url: str, job: str) -> tuple[list[StreamEntry], list[Grant], int]:
    """The job's stream entries, its audit stream's grants, and how many entries retention
    trimmed, read from Redis.

    Raises:
        redis.RedisError: Redis could not be read.
    """
    client = connect(redis_url, timeout=5.0)
    try:
        entries = await trio.to_thread.run_sync(read_entries, client, job)
        grants = await trio.to_thread.run_sync(read_grants, client, job)
        trimmed = await trio.to_thread.run_sync(trimmed_entries, client, job)
    finally:
        client.close()
    return entries, grants, trimmed


def trimmed_entries(client: redis.Redis, job: str) -> int:
    """Entries retention removed from the head of the job's events stream (blocking).

    Redis counts every entry ever appended (``entries-added``, Redis 7.0); the stream is only ever
    trimmed from its head, so the difference from its length is how many records come before its
    first entry."""
    try:
        info: Any = client.xinfo_stream(job_keys(job)["events"])
    except redis.ResponseError:
        return 0  # no stream yet
    return int(info.get("entries-added", info["length"])) - int(info["length"])


async def fetch_rpc_events(
    rpc: str,
    filters: Sequence[Mapping[str, Any]] = (),
    start_ledger: int | None = None,
    *,
    through: str | None,
) -> list[SourceRecord]:
    """A Stellar RPC's events for ``filters`` (JSON filters as sent to getEvents) from
    ``start_ledger`` (None: the oldest ledger it keeps), in order, up to and including the event id
    ``through``; paged with the RPC's own cursors (a deliberately plain client: not the node's).

    Raises:
        SourceUnreadable: the RPC could not be read, or answered an error.
        ValueError: ``rpc`` is not an RPC URL.
    """
    if through is None:
        return []
    goal = token_key(through)
    out: list[SourceRecord] = []
    reader = RpcReader(rpc, connect_timeout=HTTP_TIMEOUT, request_timeout=HTTP_TIMEOUT)
    async with reader.client() as http:
        if start_ledger is None:
            start_ledger, _latest = await reader.ledger_range(http)
        params: dict[str, Any] = {
            "startLedger": start_ledger, "filters": list(filters), "pagination": {"limit": 10_000},
        }  # fmt: skip
        while True:
            result = await reader.call(http, "getEvents", params)
            for event in result["events"]:
                out.append(SourceRecord(event["id"], event))
            if out and token_key(out[-1].paging_token) >= goal:
                return out
            if not result["events"] and int(result["cursor"].partition("-")[0]) >> 32 >= int(
                result["latestLedger"]
            ):
                return out  # scanned through the latest ledger
            params = {"filters": list(filters), "pagination": {"cursor": result["cursor"], "limit": 10_000}}


async def fetch_lake_events(
    lake: str, filters: Sequence[Mapping[str, Any]], first: int, last: int
) -> list[SourceRecord]:
    """A data lake's events of ledgers ``first..last`` for ``filters``, in order (the lake
    reader's derivation, which equals RPC's).

    Raises:
        RuntimeError: the lake has no manifest or lacks one of those ledgers.
        ingestion.lake.events.LakeFormatError: an object that cannot be read.
    """
    from ingestion.lake.events import object_events  # lazy: start-up (that check only)
    from ingestion.lake.store import LocalLake  # lazy: start-up (that check only)
    from ingestion.rpc.protocol import EventFilter, matches  # lazy: start-up (that check only)

    parsed = [EventFilter.from_json(f) for f in filters]
    store = LocalLake.from_url(lake)
    schema = await store.schema()
    if schema is None:
        raise RuntimeError(f"the lake {lake} has no manifest")
    out: list[SourceRecord] = []
    ledger = first
    while ledger <= last:
        key, data = await store.read_ledger(schema, ledger)
        if data is None:
            raise RuntimeError(f"the lake {lake} has no object {key} for ledger {ledger}")
        for held in await trio.to_thread.run_sync(object_events, data):
            if first <= held.ledger <= last:
                out += [
                    SourceRecord(e.id, json.loads(e.body))
                    for e in held.events
                    if not parsed or matches(parsed, e.type, e.contract_id, e.topics)
                ]
        ledger = schema.file_end(ledger) + 1
    return out


async def rpc_ledger_range(rpc: str) -> tuple[int, int]:
    """The oldest and latest ledgers a Stellar RPC keeps (from a getEvents answer).

    Raises:
        SourceUnreadable: the RPC could not be read, or answered an error.
    """
    reader = RpcReader(rpc, connect_timeout=HTTP_TIMEOUT, request_timeout=HTTP_TIMEOUT)
    async with reader.client() as http:
        return await reader.ledger_range(http)


async def verify_rpc_job(
    redis_url: str,
    job: str,
    rpc: str,
    filters: Sequence[Mapping[str, Any]] = (),
    start_ledger: int | None = None,
    lake: str | None = None,
) -> Verification:
    """:func:`verify_job` for a job following Stellar RPC events (see :func:`fetch_rpc_events`).

    With ``lake`` (a job with ``on_history_gap = "lake"`` started at ``start_ledger``, older than
    RPC keeps), the source is the lake's events from ``start_ledger`` up to the middle of RPC's
    window (so that RPC still keeps the next ledger once the lake is read), then RPC's own paging
    from there."""
    entries, grants, trimmed = await read_evidence(redis_url, job)
    through = entries[-1].paging_token if entries else None
    if lake is None or start_ledger is None:
        source = await fetch_rpc_events(rpc, filters, start_ledger, through=through)
        return check_stream(entries, source, grants, trimmed=trimmed)
    oldest, latest = await rpc_ledger_range(rpc)
    middle = (oldest + latest) // 2
    source = await fetch_lake_events(lake, filters, start_ledger, middle)
    if through is not None and (not source or token_key(source[-1].paging_token) < token_key(through)):
        source += await fetch_rpc_events(rpc, filters, middle + 1, through=through)
    return check_stream(entries, source, grants, trimmed=trimmed)


async def _before(horizon: str, resource: str, paging_token: str) -> str:
    """The paging token of the record just before ``paging_token`` in ``resource`` ("0": none)."""
    reader = Reader(horizon, connect_timeout=HTTP_TIMEOUT, read_timeout=HTTP_TIMEOUT)
    async with reader.client() as http:
        records = await reader.records(http, resource, order="desc", limit="1", cursor=paging_token)
    return str(records[0]["paging_token"]) if records else "0"


async def read_postgres_evidence(
    url: str, schema: str, job: str
) -> tuple[list[StreamEntry], int, list[str], int]:
    """A PostgreSQL job's rows as entries (``entry_id`` ``seq N``), how many rows retention
    deleted before the first (``seq`` is dense from 1), the fence-history problems
    (:func:`ingestion.postgres.sink.check_job`) and the number of terms.

    Raises:
        psycopg.Error: PostgreSQL could not be read.
    """
    # lazy: start-up (that check only)
    from ingestion.postgres.readers import check_job, job_state, read_all_events

    rows = await trio.to_thread.run_sync(read_all_events, url, schema, job)
    fence_problems, _checked = await trio.to_thread.run_sync(check_job, url, schema, job)
    state = await trio.to_thread.run_sync(job_state, url, schema, job)
    entries = [StreamEntry(f"seq {seq}", pt, token, "", record) for seq, pt, token, record in rows]
    trimmed = rows[0][0] - 1 if rows else 0
    return entries, trimmed, fence_problems, len(state["terms"])


async def verify_configured_job(settings: Any, job: Any, source_url: str, watch: Any = None) -> Verification:
    """Check ``job`` (:class:`~ingestion.config.JobSettings`) as configured: its stream (or, for a
    job whose sink is PostgreSQL, its rows) against ``source_url`` (a Horizon or a Stellar RPC,
    after the job's kind), from its start cursor.

    A job that started at ``now`` (or, on RPC, after an event id) is checked from its first
    entry on: the source's records before it are not the job's.

    Raises:
        redis.RedisError, psycopg.Error, RuntimeError (SourceUnreadable among them): Redis,
            PostgreSQL or the source could not be read.
    """
    if job.sink:
        entries, trimmed, fence_problems, terms = await read_postgres_evidence(
            job.sink, settings.sink.schema, job.name
        )
        result = await _check_against_source(job, entries, None, trimmed, source_url, watch)
        problems = result.problems + tuple(fence_problems[: MAX_PROBLEMS])
        return attrs.evolve(result, problems=problems, fence_terms=terms)
    entries, grants, trimmed = await read_evidence(settings.redis.url, job.name)
    return await _check_against_source(job, entries, grants, trimmed, source_url, watch)


async def as_committed(job: Any, source: list[SourceRecord], watch: Any = None) -> list[SourceRecord]:
    """The source's records as ``job`` commits them: decoded (contract events' ScVals, the transfer
    view) by the rules the node applies, and only those naming an address of ``watch`` (the job's
    watch source, :func:`ingestion.node.build.watch_source`; None: every record).

    A list edited while the job ran (``watch_set``, ``watch_file``) is checked as it stands now:
    records committed under an earlier version of it show as differences."""
    from ingestion.decode.stage import rule_for  # lazy: start-up (that check only)

    rule, changes = rule_for(job.kind, getattr(job, "resource", ""))
    decode = changes and getattr(job, "decode", True)
    if rule is None or not (decode or watch is not None):
        return source
    watched = None if watch is None else await watch.current()
    out: list[SourceRecord] = []
    for record in source:
        text, addresses = rule(json.dumps(record.record, separators=(",", ":"), ensure_ascii=False))
        if watched is not None and not watched.matches(addresses):
            continue
        out.append(SourceRecord(record.paging_token, json.loads(text)) if decode else record)
    return out


async def _check_against_source(
    job: Any, entries: list[StreamEntry], grants: list[Grant] | None, trimmed: int, source_url: str,
    watch: Any = None,
) -> Verification:  # fmt: skip
    through = entries[-1].paging_token if entries else None
    start = job.start_cursor
    if job.kind == "rpc":
        from ingestion.rpc.protocol import Cursor, parse_start  # lazy: start-up (that check only)

        filters = [f.to_json() for f in job.rpc_filters()]
        # 0: the oldest ledger the RPC keeps; a ledger: from there; now or an event id: from the
        # stream's first entry (the records before it are not the job's)
        position = None if start == "now" else parse_start(start, "an RPC")
        ledger = None
        if isinstance(position, int):
            ledger = position or None
        elif entries:
            ledger = Cursor.parse(entries[0].paging_token).ledger
        events = await fetch_rpc_events(source_url, filters, ledger, through=through)
        source = await as_committed(job, events, watch)
        if not isinstance(position, int) and entries:
            first = token_key(entries[0].paging_token)
            source = [r for r in source if token_key(r.paging_token) >= first]
            trimmed = 0
        return check_stream(entries, source, grants, trimmed=trimmed)
    if start == "now":
        start = await _before(source_url, job.resource, entries[0].paging_token) if entries else "0"
        trimmed = 0
    records = await fetch_source(source_url, job.resource, start, through=through)
    source = await as_committed(job, records, watch)
    return check_stream(entries, source, grants, trimmed=trimmed)
