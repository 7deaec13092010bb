"""``python -m ingestion inspect``: the job's state as read from Redis, as a table or JSON.

``--json`` prints one object (``job``, ``leader``, ``token``, ``lease_ttl_ms_left``,
``cursor``, ``events``, ``audit``: its tokens as integers, see :func:`audit_doc`) plus extra keys
(every one documented in docs/OPERATIONS.md, "inspect"): ``stream`` (retention and consumer groups,
see :func:`stream_doc`), ``leader_source_ok`` (when the leader's source last answered, see
:func:`leader_source`), ``backfill``, ``sink`` (PostgreSQL jobs) and ``lag``, null unless
``--horizon URL`` is
given, in which case inspect asks that Horizon for the newest record of the job's resource and
reports how far the committed cursor is behind it::

    "lag": {"horizon": "http://...", "head": "<newest paging token>",
            "ledgers": 3,           # head ledger - cursor ledger (from the TOID paging tokens)
            "seconds": 15.0,        # head created_at - created_at of the first uncommitted record
            "error": null}          # or what went wrong asking Horizon (the rest is then null)

With ``--rpc URL`` an RPC job's lag is read from that Stellar RPC instead: ``{"rpc": URL, "head":
<the latest ledger's scanned-through cursor>, "ledgers", "seconds", "error"}``.

A job whose sink is PostgreSQL (``--sink``, ``sink.url`` or its ``[jobs.NAME] sink``) keeps its
records and cursor there: ``cursor`` and ``events`` are then read from PostgreSQL, ``stream`` is
null, and ``sink`` holds the job's state there (``cursor_token``, ``fence``, ``first_seq``,
``last_seq`` and the fence history ``terms``); the election (leader, token, lease, audit) is still
Redis's.

``backfill`` is the job's backfill (docs/BACKFILL.md; null when it has none): the plan
(``first_ledger``, ``last_ledger``, ``ranges``, ``state``, ``created_at``, ``created_by``) and its
progress (``ledgers``, ``ledgers_done``, ``records``, ``complete_through``, ``finished``,
``ranges_running``, ``ranges_done``, ``leading``: ranges led per node, ``range_states``: each
range's ``range``, ``first_ledger``, ``last_ledger``, ``ledgers``, ``ledgers_done``, ``records``,
``state`` and ``leader``), as ``ingestion backfill --status`` shows it. Without ``--job``, a range at
rest (done, or of a plan no longer running) is not listed as a job: it is shown under its backfill.

No password ever appears in the output: errors name ``redis.url`` (or ``sink.url``) with the
password blanked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import redis
import trio

from actors.lease_store import JobState, LeaseStore, RedisUnavailable, StreamInfo, job_keys
from actors.lease_store.connect import describe_redis_error
from actors.observe import record_time
from ingestion.cli import completeness
from ingestion.cli.usage import quiet_logs, settings_of_flags
from ingestion.common.http import SourceUnreadable
from ingestion.common.paging import InvalidPagingToken, toid_parts, token_key
from ingestion.common.redact import redact
from ingestion.config import Settings, load, redact_url
from ingestion.horizon.exchange import Reader
from ingestion.rpc.protocol import Cursor, InvalidCursor, is_event_id
from ingestion.rpc.source import RpcReader

HORIZON_TIMEOUT = 5.0  # seconds, the whole lag query
POSTGRES_TIMEOUT = 5.0  # seconds, reading one job's state in a PostgreSQL sink


class SinkUnreadable(Exception):
    """A PostgreSQL sink could not be read (one line, the password blanked)."""


async def postgres_state(url: str, schema: str, job: str) -> dict[str, Any]:
    """A job's state in a PostgreSQL sink (:func:`ingestion.postgres.readers.job_state`), bounded.

    Raises:
        SinkUnreadable: PostgreSQL did not answer in time or refused.
    """
    import psycopg  # lazy: CLI start-up

    from ingestion.postgres.connection import describe, redact  # lazy: CLI start-up
    from ingestion.postgres.readers import job_state  # lazy: CLI start-up

    try:
        with trio.fail_after(POSTGRES_TIMEOUT + 1):
            state = await trio.to_thread.run_sync(
                job_state, url, schema, job, POSTGRES_TIMEOUT, abandon_on_cancel=True
            )
    except trio.TooSlowError as exc:
        raise SinkUnreadable(f"sink.url {redact(url)}: no answer within {POSTGRES_TIMEOUT:g} s") from exc
    except psycopg.Error as exc:
        raise SinkUnreadable(describe(exc, url)) from exc
    return {**state, "url": redact(url)}


def _with_sink(state: JobState, sink: dict[str, Any]) -> JobState:
    """The job's Redis state with its cursor and record count from its PostgreSQL sink."""
    return attrs.evolve(state, cursor=sink["cursor"], cursor_token=sink["cursor_token"],
                        events=sink["events"], complete_through=sink.get("complete_through"),
                        complete_held=sink.get("complete_held") or "")  # fmt: skip


def state_doc(state: JobState) -> dict[str, Any]:
    """The job's state as ``--json`` prints it (without the cursor's token, the lease's token and
    the cursor hash whole, which the state also holds)."""
    doc = attrs.asdict(state)
    for field in ("cursor_token", "lease_token", "cursor_fields"):
        doc.pop(field)
    return doc


def ledger_of(paging_token: str) -> int | None:
    try:
        return toid_parts(token_key(paging_token)[0])[0]
    except (InvalidPagingToken, ValueError):
        return None


async def source_lag(horizon: str, resource: str, cursor: str | None) -> dict[str, Any]:
    """How far ``cursor`` is behind the newest record of ``resource`` on ``horizon``."""
    lag: dict[str, Any] = {"horizon": horizon, "head": None, "ledgers": None, "seconds": None,
                           "error": None}  # fmt: skip
    try:
        with trio.fail_after(HORIZON_TIMEOUT):
            reader = Reader(horizon, connect_timeout=HORIZON_TIMEOUT, read_timeout=HORIZON_TIMEOUT)
            async with reader.client() as client:
                newest = await reader.records(client, resource, order="desc", limit="1")
                if not newest:
                    lag.update(ledgers=0, seconds=0.0)
                    return lag
                head = newest[0]
                lag["head"] = head.get("paging_token")
                if cursor is None:
                    return lag
                following = await reader.records(client, resource, order="asc", limit="1", cursor=cursor)
    except trio.TooSlowError:
        lag["error"] = f"no answer from Horizon within {HORIZON_TIMEOUT:g} s"
        return lag
    except (SourceUnreadable, ValueError, AttributeError) as exc:
        lag["error"] = _said(exc)
        return lag
    head_ledger, cursor_ledger = ledger_of(str(lag["head"])), ledger_of(cursor)
    if head_ledger is not None and cursor_ledger is not None:
        lag["ledgers"] = max(0, head_ledger - cursor_ledger)
    if not following:
        lag["seconds"] = 0.0
    else:
        latest, oldest = record_time(json.dumps(head)), record_time(json.dumps(following[0]))
        if latest is not None and oldest is not None:
            lag["seconds"] = max(0.0, latest - oldest)
    return lag


async def rpc_lag(rpc: str, cursor: str | None) -> dict[str, Any]:
    """How far an RPC job's ``cursor`` is behind the latest ledger of the Stellar RPC at ``rpc``:
    ``head`` is that ledger's scanned-through cursor, ``ledgers`` the difference in ledgers,
    ``seconds`` the latest ledger's close time minus the first uncommitted event's."""
    lag: dict[str, Any] = {"rpc": rpc, "head": None, "ledgers": None, "seconds": None, "error": None}
    try:
        with trio.fail_after(HORIZON_TIMEOUT):
            reader = RpcReader(rpc, connect_timeout=HORIZON_TIMEOUT, request_timeout=HORIZON_TIMEOUT)
            async with reader.client() as client:
                latest = await reader.call(client, "getLatestLedger")
                lag["head"] = str(Cursor.through(int(latest["sequence"])))
                if cursor is None:
                    return lag
                position = Cursor.parse(cursor)
                lag["ledgers"] = max(0, int(latest["sequence"]) - position.ledger)
                page = await reader.call(client, "getEvents", {
                    "filters": [], "pagination": {"cursor": cursor, "limit": 1},
                })  # fmt: skip
    except trio.TooSlowError:
        lag["error"] = f"no answer from the RPC within {HORIZON_TIMEOUT:g} s"
        return lag
    except (SourceUnreadable, ValueError, LookupError, TypeError, InvalidCursor) as exc:
        lag["error"] = _said(exc)
        return lag
    following = page["events"][0] if page["events"] else None
    newest = float(page["latestLedgerCloseTime"])
    oldest = record_time(json.dumps(following)) if following is not None else None
    lag["seconds"] = 0.0 if oldest is None else max(0.0, newest - oldest)
    return lag


def _said(exc: Exception) -> str:
    """What went wrong asking the source, in one line (a source's package says its own)."""
    return str(exc) if isinstance(exc, SourceUnreadable) else f"{type(exc).__name__}: {exc}"


def _is_rpc_cursor(cursor: str | None) -> bool:
    return cursor is not None and len(cursor) == 30 and is_event_id(cursor)


async def job_lag(
    cursor: str | None, resource: str, horizon: str | None, rpc: str | None
) -> dict[str, Any] | None:
    """The lag of a job at ``cursor``: against ``rpc`` when its cursor is an RPC event id (or
    there is no Horizon to ask), else against ``horizon``; None when neither is given."""
    if rpc and (_is_rpc_cursor(cursor) or not horizon):
        return await rpc_lag(rpc, cursor)
    if horizon:
        return await source_lag(horizon, resource, cursor)
    return None


def _connect(settings: Settings, doing: str) -> redis.Redis | None:
    """A client of ``redis.url``; None (said in one line) when a cluster's nodes do not answer
    (its client reads the slot map when built)."""
    try:
        return settings.redis.connect(timeout=max(settings.redis.timeout_ms / 1000, 2.0))
    except redis.ConnectionError as exc:
        print(f"ingestion: {doing}: {describe_redis_error(exc, where=redact_url(settings.redis.url))}",
              file=sys.stderr)  # fmt: skip
        return None


async def inspect_all(
    settings: Settings, as_json: bool, horizon: str | None = None, rpc: str | None = None
) -> int:
    """Every job in Redis: a table (job, leader, token, lease left, cursor, events, lag), or a JSON
    list of the objects ``inspect --job`` prints (without their audit)."""
    from ingestion.backfill.status import listed_jobs  # lazy: CLI start-up
    from ingestion.postgres.readers import configured_sink  # lazy: CLI start-up

    client = _connect(settings, "cannot read the jobs")
    if client is None:
        return 1
    resources = {j.name: j.resource for j in settings.jobs if j.kind == "horizon"}
    states: list[tuple[JobState, StreamInfo]] = []
    sinks: dict[str, dict[str, Any]] = {}
    try:
        names = await LeaseStore(client, "-").run(listed_jobs, client)
        for name in names:
            store = LeaseStore(client, name)
            state = await store.state(1)
            if url := configured_sink(settings, name):
                sinks[name] = await postgres_state(url, settings.sink.schema, name)
                state = _with_sink(state, sinks[name])
            states.append((state, await store.events_info()))
    except (RedisUnavailable, SinkUnreadable) as exc:
        print(f"ingestion: cannot read the jobs: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    lags: dict[str, dict[str, Any] | None] = {}
    for state, _stream in states:
        resource = resources.get(state.job, settings.horizon.resource)
        lags[state.job] = await job_lag(state.cursor, resource, horizon, rpc)
    if as_json:
        docs = []
        for state, stream in states:
            doc = state_doc(state)
            doc.pop("audit")
            doc["lag"] = lags[state.job]
            doc["stream"] = None if state.job in sinks else stream_doc(stream)
            if state.job in sinks:
                doc["sink"] = sinks[state.job]
            docs.append(doc)
        print(json.dumps(docs))
    else:
        print(render_jobs(states, lags, set(sinks)))
    return 0


def render_jobs(
    states: Sequence[tuple[JobState, StreamInfo]],
    lags: dict[str, dict[str, Any] | None],
    in_postgres: set[str] = frozenset(),  # type: ignore[assignment]
) -> str:
    if not states:
        return "no jobs in this Redis"
    header = ("job", "leader", "token", "lease left", "cursor", "events", "complete through", "lag")
    rows = [header]
    for state, stream in states:
        lag = lags.get(state.job)
        lag_text = "-"
        if lag is not None:
            lag_text = f"error: {lag['error']}" if lag["error"] else (
                f"{lag['ledgers']} ledgers" if lag["ledgers"] is not None else "?"
            )
        trimmed = f" (+{stream.trimmed} trimmed)" if stream.trimmed else ""
        if state.job in in_postgres:
            trimmed = " (postgres)"
        rows.append((
            state.job,
            state.leader or "(none)",
            str(state.token),
            f"{state.lease_ttl_ms_left} ms" if state.lease_ttl_ms_left is not None else "-",
            state.cursor or "-",
            f"{state.events}{trimmed}",
            str(state.complete_through) + (" (held)" if state.complete_held else "")
            if state.complete_through is not None else "-",
            lag_text,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    leaders: dict[str, int] = {}
    for state, _ in states:
        if state.leader:
            leaders[state.leader] = leaders.get(state.leader, 0) + 1
    spread = ", ".join(f"{node}: {count}" for node, count in sorted(leaders.items()))
    lines += ["", f"{len(states)} jobs; leases held by {spread or 'nobody'}"]
    return "\n".join(lines)


async def inspect_job(
    settings: Settings,
    as_json: bool,
    audit_count: int = 10,
    horizon: str | None = None,
    rpc: str | None = None,
) -> int:
    from ingestion.postgres.readers import configured_sink, job_known  # lazy: CLI start-up

    job = settings.node.job
    sink_url = configured_sink(settings, job)
    sink: dict[str, Any] | None = None
    client = _connect(settings, f"cannot read job {job!r}")
    if client is None:
        return 1
    try:
        store = LeaseStore(client, job)
        in_redis = await store.run(client.exists, *job_keys(job).values())
        if sink_url:
            sink = await postgres_state(sink_url, settings.sink.schema, job)
        if not in_redis and not (sink is not None and job_known(sink)):
            from ingestion.cli.known import known_jobs  # lazy: CLI start-up

            where = redact_url(settings.redis.url) + (f" or in {sink['url']}" if sink else "")
            names = await store.run(known_jobs, [], client)
            print(
                f"ingestion: inspect: no job {job!r} at {where}: nothing was ever elected or "
                f"committed for it (jobs there: {', '.join(names[:20]) or 'none'}; check --job, "
                "--redis and --sink)",
                file=sys.stderr,
            )
            return 2
        state = await store.state(audit_count)
        stream = await store.events_info()
        source = await leader_source(store, state.leader)
        backfill = await _backfill(client, job, sink_url, settings.sink.schema)
        undecoded = await _decode_errors(store, sink_url, settings.sink.schema)
    except (RedisUnavailable, SinkUnreadable) as exc:
        print(f"ingestion: cannot read job {job!r}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if sink is not None:
        state = _with_sink(state, sink)
    lag = await job_lag(state.cursor, settings.horizon.resource, horizon, rpc)
    if as_json:
        doc = state_doc(state)
        doc["audit"] = [audit_doc(entry) for entry in state.audit]
        doc["lag"] = lag
        doc["stream"] = None if sink is not None else stream_doc(stream)
        if sink is not None:
            doc["sink"] = sink
        doc["leader_source_ok"] = source
        doc["backfill"] = backfill
        doc["decode_errors"] = undecoded
        print(json.dumps(doc))
    else:
        kind = next((j.kind for j in settings.jobs if j.name == job), "")
        print(render_table(state, lag, None if sink is not None else stream, source, sink, kind))
        print("\n".join(completeness.decode_errors_text(undecoded)), end="\n" if undecoded else "")
        if backfill is not None:
            print(_backfill_text(backfill))
    return 0


async def _decode_errors(store: LeaseStore, sink_url: str | None, schema: str) -> list[dict[str, Any]]:
    """The job's newest records committed with a decodeError (:mod:`ingestion.cli.completeness`)."""
    if not sink_url:
        return await completeness.redis_decode_errors(store)
    import psycopg  # lazy: CLI start-up

    from ingestion.postgres.connection import describe  # lazy: CLI start-up
    from ingestion.postgres.connection import redact as blanked  # lazy: CLI start-up

    try:
        with trio.fail_after(POSTGRES_TIMEOUT + 1):
            return await trio.to_thread.run_sync(
                completeness.postgres_decode_errors, sink_url, schema, store.job, POSTGRES_TIMEOUT,
                abandon_on_cancel=True,
            )  # fmt: skip
    except trio.TooSlowError as exc:
        bound = f"no answer within {POSTGRES_TIMEOUT:g} s"
        raise SinkUnreadable(f"sink.url {blanked(sink_url)}: {bound}") from exc
    except psycopg.Error as exc:
        raise SinkUnreadable(describe(exc, sink_url)) from exc


async def _backfill(client: Any, job: str, sink_url: str, schema: str) -> dict[str, Any] | None:
    """The job's backfill (docs/BACKFILL.md), None when it has none."""
    import psycopg  # lazy: CLI start-up

    from ingestion.backfill.status import backfill_doc  # lazy: CLI start-up

    try:
        return await trio.to_thread.run_sync(backfill_doc, client, job, sink_url, schema)
    except (redis.RedisError, OSError) as exc:
        raise RedisUnavailable(str(exc)) from exc
    except psycopg.Error as exc:
        raise SinkUnreadable(str(exc)) from exc


def _backfill_text(b: dict[str, Any]) -> str:
    """The backfill under the job's table: its plan and progress, then one line per range (a
    finished range is shown here, not as a job of its own)."""
    leading = ", ".join(f"{n}: {k}" for n, k in sorted(b["leading"].items())) or "nobody"
    complete = (
        f"complete through ledger {b['complete_through']}"
        if b["complete_through"] >= b["first_ledger"] else "no ledger complete yet"
    )  # fmt: skip
    lines = [
        f"backfill: ledgers {b['first_ledger']}..{b['last_ledger']} in {b['ranges']} ranges, {b['state']}: "
        f"{b['ledgers_done']}/{b['ledgers']} ledgers, {b['records']:,} records, {complete}; ranges "
        f"{b['ranges_running']} running, {b['ranges_done']} done; leading: {leading}"
    ]
    for r in b["range_states"]:
        led = f" by {r['leader']}" if r["state"] == "running" else ""
        lines.append(f"  {r['range']}: {r['ledgers_done']}/{r['ledgers']} ledgers, {r['records']:,} records, "
                     f"{r['state']}{led}")  # fmt: skip
    return "\n".join(lines)


LAG_HINTS = {  # what to give for a job's lag, by its kind ("": not in this configuration)
    "horizon": "give --horizon URL to compare with the source",
    "rpc": "give --rpc URL to compare with the source",
    "lake": "give --rpc URL, a Stellar RPC of the lake's network, to compare with its latest ledger",
    "": "give --horizon URL, or --rpc URL for an RPC or lake job, to compare with the source",
}


def _lag_text(lag: dict[str, Any] | None, kind: str = "") -> str:
    if lag is None:
        return "- (" + LAG_HINTS.get(kind, LAG_HINTS[""]) + ")"
    if lag["error"]:
        return f"unknown: {lag['error']}"
    parts = []
    if lag["ledgers"] is not None:
        parts.append(f"{lag['ledgers']} ledgers")
    if lag["seconds"] is not None:
        parts.append(f"{lag['seconds']:.1f} s")
    return (", ".join(parts) or "unknown") + f" behind head {lag['head'] or '(empty)'}"


async def leader_source(store: LeaseStore, leader: str | None) -> dict[str, Any] | None:
    """When the leader's source last answered: ``{"at": ISO time, "seconds_ago": s}`` (Redis's
    clock, as the leader reported it; reported once per lease TTL), or None when unknown."""
    if leader is None:
        return None
    health = await store.source_health()
    if leader not in health:
        return None
    seconds, micros = await store.run(store.client.time)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    at = datetime.datetime.fromtimestamp(health[leader] / 1000, tz=datetime.UTC)
    return {
        "at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "seconds_ago": round(max(0, now_ms - health[leader]) / 1000, 3),
    }


# Audit fields that hold whole numbers (a Redis stream keeps text): JSON integers, "" (unknown) null.
AUDIT_NUMBERS = (
    "token", "previous_token", "rolled_back_from", "takeover_ms", "cursor_ledger", "elder_ledger",
)


def audit_doc(entry: dict[str, str]) -> dict[str, Any]:
    """One audit entry for ``--json``: its fields as written, the tokens (and other whole numbers
    of :data:`AUDIT_NUMBERS`) as integers, an unknown one (``""``) as null; a URL's credentials
    masked (an entry written by an older version may hold them)."""
    doc: dict[str, Any] = {k: redact(v) if isinstance(v, str) else v for k, v in entry.items()}
    for key in AUDIT_NUMBERS:
        value = entry.get(key)
        if value is None:
            continue
        try:
            doc[key] = int(value) if value != "" else None
        except ValueError:
            pass  # (not a number: left as written)
    return doc


def stream_doc(stream: StreamInfo) -> dict[str, Any]:
    """The events stream's retention and readers: ``trimmed`` (entries removed by events.max_len)
    and each consumer group's ``pending``, ``lag`` (undelivered; null when Redis cannot tell) and
    ``last_delivered_id``."""
    return {
        "trimmed": stream.trimmed,
        "groups": [
            {
                "name": g.name,
                "consumers": g.consumers,
                "pending": g.pending,
                "lag": g.lag,
                "last_delivered_id": g.last_delivered_id,
            }
            for g in stream.groups
        ],
    }


def _source_text(source: dict[str, Any] | None) -> str:
    if source is None:
        return "-"
    return f"last answered at {source['at']} ({source['seconds_ago']} s ago)"


def _groups_text(stream: StreamInfo | None) -> str:
    if stream is None or not stream.groups:
        return "(none)"
    parts = []
    for g in stream.groups:
        lag = "?" if g.lag is None else str(g.lag)
        parts.append(f"{g.name}: {g.pending} pending, {lag} undelivered")
    return "; ".join(parts)


def render_table(
    state: JobState,
    lag: dict[str, Any] | None,
    stream: StreamInfo | None = None,
    source: dict[str, Any] | None = None,
    sink: dict[str, Any] | None = None,
    kind: str = "",
) -> str:
    ttl = state.lease_ttl_ms_left
    trimmed = f" ({stream.trimmed} trimmed by retention)" if stream and stream.trimmed else ""
    rows = [
        ("job", state.job),
        ("leader", state.leader or "(none)"),
        ("token", str(state.token)),
        ("lease ttl left", f"{ttl} ms" if ttl is not None else "-"),
        ("cursor", state.cursor or "(nothing committed)"),
        ("written by token", str(state.cursor_token) if state.cursor_token is not None else "-"),
        ("complete through", completeness.watermark_text(state)),
    ]
    if sink is None:
        rows += [("events", f"{state.events}{trimmed}"), ("consumer groups", _groups_text(stream))]
    else:
        seqs = f", seq {sink['first_seq']}..{sink['last_seq']}" if sink["events"] else ""
        terms = sink["terms"]
        shown = ", ".join(f"{t['token']} after seq {t['after_seq']}" for t in terms[-5:])
        rows += [
            ("sink", f"postgres {sink['url']} schema {sink['schema']}"),
            ("rows", f"{sink['events']}{seqs}"),
            ("fence", f"{sink['fence']} (node {sink.get('fence_node') or '?'})"
             if sink["fence"] is not None else "(never raised)"),
            ("terms", f"{len(terms)}" + (f" (latest: {shown})" if terms else "")),
        ]
    rows += [("leader's source", _source_text(source)), ("lag", _lag_text(lag, kind))]
    width = max(len(k) for k, _ in rows)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    lines.append("")
    lines.append("audit (oldest first):")
    for entry in state.audit:
        event = entry.get("event", "?")
        text = f"  {entry['id']}  {event:<14} {entry.get('node', '')} token {entry.get('token', '')}"
        if event == "became-leader" and entry.get("previous_node"):
            text += (
                f" after {entry['previous_node']} (token {entry['previous_token']}),"
                f" leaderless {entry['takeover_ms']} ms"
            )
        lines.append(text)
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    from ingestion.cli.usage import OneLineParser, setting_help  # lazy: CLI start-up

    p = OneLineParser(
        prog="ingestion inspect",
        description="Show every job's state in Redis, or one job's. Exit 0; 2 for a bad flag or "
        "an unknown job; 1 when Redis cannot be read.",
    )
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    p.add_argument("--sink", metavar="URL", help=setting_help(
        "a PostgreSQL sink: the jobs' cursors and records are read there", ("sink", "url")
    ))
    p.add_argument("--job", help="the job to show (default: every job in Redis, as a table)")
    p.add_argument(
        "--json", action="store_true",
        help="print JSON: one object with --job, else a list of them",
    )
    p.add_argument("--audit", type=int, default=10, metavar="N", help="audit entries to show")
    p.add_argument("--horizon", metavar="URL", help="also report the lag behind this Horizon")
    p.add_argument("--resource", help="the job's Horizon collection (default: from the config)")
    p.add_argument(
        "--rpc", metavar="URL", help="also report an RPC job's lag behind this Stellar RPC"
    )
    return p


def main(argv: Sequence[str]) -> int:
    """Run ``inspect`` with these flags; returns the exit status.

    Raises:
        ConfigError: a bad setting (the CLI prints it and exits 2).
    """
    ns = parser().parse_args(list(argv))
    if ns.audit < 1:
        from ingestion.cli.usage import UsageError  # lazy: CLI start-up

        raise UsageError(f"inspect: --audit: must be at least 1, got {ns.audit}")
    quiet_logs()  # the lag is read through the source packages, which log: never into --json's stdout
    # --horizon and --rpc: where to ask for the lag, not the jobs' URLs
    flags = settings_of_flags(ns, besides={("horizon", "urls"), ("rpc", "urls")})
    settings = load(ns.config, os.environ, flags)
    if ns.job is None:
        return trio.run(inspect_all, settings, ns.json, ns.horizon, ns.rpc)
    return trio.run(inspect_job, settings, ns.json, ns.audit, ns.horizon, ns.rpc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
