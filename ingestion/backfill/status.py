"""A backfill's state in Redis: reading it (plan, each range's cursor, end, leader and records,
from Redis and, for a job with a PostgreSQL sink, from PostgreSQL: what ``ingestion backfill
--status``, its progress bar and ``inspect`` show), writing a plan and settling it (``lua/``), and
the jobs to list (a range at rest is shown under its backfill, not as a job). Blocking calls:
the CLI's, and the node's in worker threads."""

from __future__ import annotations

from typing import Any

import attrs
import redis

from actors.lease_store import discover_jobs, job_keys, read_states
from ingestion.backfill import scripts
from ingestion.backfill.plan import (
    RANGE_MARK,
    Plan,
    Progress,
    ledger_of_cursor,
    range_states,
)
from ingestion.common.keyspace import backfill_key


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_plan(client: redis.Redis, job: str) -> Plan | None:
    fields = client.hgetall(backfill_key(job))
    return Plan.from_hash(job, {_text(k): _text(v) for k, v in fields.items()}) if fields else None  # type: ignore[union-attr]


@attrs.frozen
class Written:
    """What :func:`write_plan` did: ``outcome`` is ``planned``, ``resumed``, ``busy`` (another
    span's plan runs: ``plan`` is that one) or ``split`` (the same span was planned in other
    ranges: ``plan`` is that one); nothing was written for the last two."""

    outcome: str
    plan: Plan


def write_plan(client: redis.Redis, wanted: Plan, asked_ranges: int) -> Written:
    """Write ``wanted`` (its ``ranges`` the default count), or resume the plan of the same span
    with the ranges it had, in one step (``lua/plan.lua``). ``asked_ranges``: ``--ranges`` (0:
    not given)."""
    script = client.register_script(scripts.PLAN)
    reply = [_text(v) for v in script(keys=[backfill_key(wanted.job)], args=[
        wanted.first, wanted.last, asked_ranges, wanted.ranges, wanted.created_at, wanted.created_by,
    ])]  # fmt: skip
    outcome = reply[0]
    if outcome == "busy":
        first, last, ranges = map(int, reply[1:4])
        return Written(outcome, Plan(wanted.job, first, last, ranges))
    if outcome == "split":
        return Written(outcome, attrs.evolve(wanted, ranges=int(reply[1]), state=reply[2]))
    return Written(outcome, attrs.evolve(wanted, ranges=int(reply[1]), state="running"))


def settle(client: redis.Redis, plan: Plan, state: str, at: str) -> tuple[bool, str]:
    """Move ``plan`` from ``running`` to ``state`` (``done`` or ``cancelled``) if Redis still holds
    it running (``lua/settle.lua``): whether this call moved it, and the state it is in afterwards
    (``""``: Redis holds another plan or none)."""
    script = client.register_script(scripts.SETTLE)
    moved, now = script(keys=[backfill_key(plan.job)], args=[plan.first, plan.last, plan.ranges, state, at])
    return bool(int(moved)), _text(now)


def resting_ranges(client: redis.Redis, names: list[str]) -> set[str]:
    """The range jobs among ``names`` that no node runs or will run: each one done (its end
    recorded), or not a range of its job's running plan (that plan done, cancelled, removed, or
    another span's)."""
    ranges = [n for n in names if RANGE_MARK in n]
    if not ranges:
        return set()
    parents = sorted({n.rsplit(RANGE_MARK, 1)[0] for n in ranges})
    pipe = client.pipeline(transaction=False)
    for name in ranges:
        pipe.hexists(backfill_key(name), "done")
    for parent in parents:
        pipe.hgetall(backfill_key(parent))
    answers = pipe.execute()
    done = dict(zip(ranges, answers[: len(ranges)], strict=True))
    running: set[str] = set()
    for parent, fields in zip(parents, answers[len(ranges) :], strict=True):
        plan = Plan.from_hash(parent, {_text(k): _text(v) for k, v in fields.items()}) if fields else None
        if plan is not None and plan.state == "running":
            running.update(plan.names)
    return {n for n in ranges if done[n] or n not in running}


def listed_jobs(client: redis.Redis) -> list[str]:
    """Every job with state in this Redis (:func:`actors.lease_store.discover_jobs`) but the
    backfill ranges at rest (:func:`resting_ranges`), which ``inspect --job JOB`` and ``backfill
    --status`` show under their backfill: finished or stopped work, not a job without a leader."""
    names = discover_jobs(client)
    resting = resting_ranges(client, names)
    return [n for n in names if n not in resting]


@attrs.frozen
class Snapshot:
    """A plan's progress and the records its ranges committed so far."""

    progress: Progress
    records: int
    range_records: tuple[int, ...] = ()  # each range's, in order


def read_progress(client: redis.Redis, plan: Plan, sink_url: str, schema: str = "ingestion") -> Snapshot:
    """Each range's committed cursor (from the sink: the Redis cursor hash, or PostgreSQL's
    ``cursors``), end and leader, and the records committed (stream lengths, or the last
    ``seq`` of each range in PostgreSQL).

    Raises:
        redis.RedisError, OSError: Redis cannot be read; psycopg.Error: PostgreSQL cannot.
    """
    names = plan.names
    states = read_states(client, names)  # (each range in its own slot on a cluster: one pipeline still)
    leaders = [state.leader or "" for state in states]
    done = [bool(client.hexists(backfill_key(name), "done")) for name in names]
    cursors: list[str | None] = [state.cursor for state in states]
    lengths = [state.events for state in states]
    if sink_url:
        cursors, lengths = _postgres(sink_url, schema, names)
    return Snapshot(range_states(plan, cursors, done, leaders), sum(lengths), tuple(lengths))


def _postgres(url: str, schema: str, names: list[str]) -> tuple[list[str | None], list[int]]:
    from ingestion.postgres import sql  # lazy: node start-up (~2 ms)
    from ingestion.postgres.connection import connect  # lazy: CLI start-up (psycopg, ~140 ms)

    q = sql.quoted(schema)
    with connect(url, 5.0, "ingestion-backfill") as conn:
        found = dict(
            conn.execute(f"SELECT job, cursor FROM {q}.cursors WHERE job = ANY(%s)", (names,)).fetchall()
        )  # type: ignore[arg-type]
        seqs = dict(conn.execute(
            f"SELECT job, max(seq) FROM {q}.events WHERE job = ANY(%s) GROUP BY job", (names,)  # type: ignore[arg-type]
        ).fetchall())  # fmt: skip
    return [found.get(n) for n in names], [int(seqs.get(n) or 0) for n in names]


def committed_span(
    client: redis.Redis, job: str, sink_url: str, schema: str = "ingestion"
) -> tuple[int, int] | None:
    """The first and last ledger of ``job``'s own committed records or cursor (None: nothing
    committed): a backfill must end below it."""
    from ingestion.rpc.protocol import Cursor, InvalidCursor  # lazy: node start-up (rpc.protocol, ~5 ms)

    first_token: str | None = None
    if sink_url:
        from ingestion.postgres import sql  # lazy: node start-up (~2 ms)
        from ingestion.postgres.connection import connect  # lazy: CLI start-up (psycopg, ~140 ms)

        q = sql.quoted(schema)
        with connect(sink_url, 5.0, "ingestion-backfill") as conn:
            row = conn.execute(f"SELECT cursor FROM {q}.cursors WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
            cursor = row[0] if row else None
            first = conn.execute(
                f"SELECT paging_token FROM {q}.events WHERE job = %s ORDER BY seq LIMIT 1",
                (job,),  # type: ignore[arg-type]
            ).fetchone()
            first_token = first[0] if first else None
    else:
        keys = job_keys(job)
        raw = client.hget(keys["cursor"], "cursor")
        cursor = _text(raw) if raw is not None else None
        entries = client.xrange(keys["events"], count=1)
        if entries:
            fields = entries[0][1]  # type: ignore[index]
            token = fields.get("paging_token") or fields.get(b"paging_token")  # type: ignore[union-attr]
            first_token = _text(token) if token is not None else None
    high = ledger_of_cursor(cursor)
    if high is None:
        return None
    low = high
    if first_token is not None:
        try:
            low = Cursor.parse(first_token).ledger
        except InvalidCursor:
            pass
    elif cursor is not None and "-" in cursor:
        low = Cursor.parse(cursor).ledger
    return low, max(low, high)


def backfill_doc(
    client: redis.Redis, job: str, sink_url: str, schema: str = "ingestion"
) -> dict[str, Any] | None:
    """A job's backfill for ``inspect`` (None: it has none): the plan and its progress."""
    plan = read_plan(client, job)
    if plan is None:
        return None
    snapshot = read_progress(client, plan, sink_url, schema)
    p = snapshot.progress
    return {
        "first_ledger": plan.first, "last_ledger": plan.last, "ranges": plan.ranges,
        "state": shown_state(plan, p), "created_at": plan.created_at, "created_by": plan.created_by,
        "ledgers": p.total, "ledgers_done": p.ledgers_done, "records": snapshot.records,
        "complete_through": p.complete_through, "finished": p.finished,
        "ranges_running": p.running, "ranges_done": sum(1 for r in p.ranges if r.done),
        "leading": p.by_node(),
        "range_states": [
            {"range": r.name, "first_ledger": r.first, "last_ledger": r.last, "ledgers": r.ledgers,
             "ledgers_done": r.ledgers_done, "records": records, "state": range_state(r),
             "leader": r.leader or None}
            for r, records in zip(p.ranges, snapshot.range_records, strict=True)
        ],
    }  # fmt: skip


def shown_state(plan: Plan, progress: Progress) -> str:
    """The plan's state as shown: ``done`` once every range is done, even before a node (or the
    CLI) has settled it in Redis (within a quarter of a lease TTL)."""
    return "done" if plan.state == "running" and progress.finished else plan.state


def range_state(r: Any) -> str:
    return "done" if r.done else ("running" if r.leader else "waiting")
