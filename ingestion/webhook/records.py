"""Reading another job's committed records, for delivery: from its Redis events stream or from its
PostgreSQL sink.

A webhook job never reads a record that its source job has not committed: it reads where the
source job commits, after the fact. Positions are store-specific (a stream entry id, a row's
``seq``); the webhook job's own committed position is the last delivered record's paging token, so
a term starts by locating that token in the store (:meth:`locate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import attrs
import redis
import trio

from actors.cursor_order import token_key
from actors.lease_store import LeaseStore, RedisUnavailable, stream_waits
from actors.sink import SinkUnavailable
from actors.source import Record

T = TypeVar("T")
SCAN_PAGE = 1000  # entries read per step when scanning for a position


@attrs.frozen
class Stored:
    """One committed record of the source job: where it is, when it was committed (Unix ms, the
    store's clock), and the record (paging token and JSON as committed)."""

    position: str
    committed_ms: int
    record: Record


class RecordStore(Protocol):
    """Where the source job's records are (see the module docstring)."""

    async def locate(self, cursor: str, *, inclusive: bool = False) -> str:
        """The position after which the records strictly after ``cursor`` start (``"0"`` or
        ``"0-0"``: from the first record held); ``inclusive``: the records from ``cursor`` on."""
        ...

    async def read(self, after: str, count: int) -> list[Stored]:
        """Up to ``count`` records after ``after``, in order."""
        ...

    async def wait(self, after: str, seconds: float) -> bool:
        """Return once a record after ``after`` may exist (True), or after about ``seconds``
        without one (False)."""
        ...

    async def newest(self) -> str | None:
        """The paging token of the newest record held (None: none)."""
        ...

    retains: bool
    """Whether :meth:`hold` keeps records from retention at all (a PostgreSQL sink's does not)."""

    async def hold(self, position: str) -> bool:
        """Keep every record after ``position`` from retention, but never release a record from
        the one :meth:`keep_from` names on; False when that is not in place (yet): Redis did not
        answer, or this term has not said what to keep. Never raises: call it again."""
        ...

    def keep_from(self, position: str | None) -> None:
        """From now on (this term), :meth:`hold` keeps the record at ``position`` and every one
        after it, wherever it is asked to hold (None: no such bound)."""
        ...

    def forget(self) -> None:
        """A new term: nothing is held until :meth:`keep_from` is said again."""
        ...


def _stream_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _entry_before(entry_id: str) -> str:
    """A stream id just below ``entry_id``, above any entry before it (``0-0`` for the least).
    Below ``ms-0`` it is ``(ms-1)-(2^53-2)``, not the greatest id: the commit script's trim adds
    one to a group's last id as a Lua number (a double), exact only below 2^53; no millisecond
    holds that many entries."""
    ms, seq = _entry_key(entry_id)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**53 - 2}" if ms else "0-0"


def holder_group(job: str) -> str:
    """The consumer group a webhook job keeps on its source job's stream (retention floor)."""
    return f"webhook:{job}"


class StreamRecords:
    """The source job's Redis events stream (``ingestion:{JOB}:events``): entries
    ``paging_token``, ``token``, ``node``, ``record`` in commit order.

    ``holder`` names a consumer group on the stream that :meth:`hold` moves along the delivered
    records: the commit script's trim never drops an entry a group still needs, so undelivered
    records outlive ``events.max_len``. The group never passes the entry before
    :meth:`keep_from`'s (the oldest record a held dead letter names), so those outlive it too."""

    retains = True

    def __init__(self, store: LeaseStore, holder: str) -> None:
        self.store = store
        self.key = store.keys["events"]
        self.holder = holder
        self._held: str | None = None  # where this term last set the group
        self._keep: str | None = None
        self._keep_known = False  # keep_from said this term: until then nothing is moved

    async def _range(self, start: str, end: str, count: int, reverse: bool = False) -> list[Stored]:
        client = self.store.client
        if reverse:
            rows: Any = await self.store.run(lambda: client.xrevrange(self.key, start, end, count=count))
        else:
            rows = await self.store.run(lambda: client.xrange(self.key, start, end, count=count))
        out = []
        for entry_id, fields in rows:
            eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            f = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                 for k, v in fields.items()}  # fmt: skip
            out.append(Stored(eid, _stream_ms(eid), Record(f["paging_token"], f["record"])))
        return out

    async def read(self, after: str, count: int) -> list[Stored]:
        start = "-" if after in ("0", "0-0") else f"({after}"
        return await self._range(start, "+", count)

    async def newest(self) -> str | None:
        last = await self._range("+", "-", 1, reverse=True)
        return last[0].record.paging_token if last else None

    async def locate(self, cursor: str, *, inclusive: bool = False) -> str:
        if cursor == "0":
            return "0-0"
        key = token_key(cursor)

        def behind(token: str) -> bool:  # at or before the position sought
            return token_key(token) < key if inclusive else token_key(token) <= key

        newest = await self._range("+", "-", 1, reverse=True)
        if not newest or behind(newest[0].record.paging_token):
            return newest[0].position if newest else "0-0"
        lo, hi_ms = "0-0", newest[0].committed_ms  # entries up to lo are <= cursor; from hi_ms on, after
        while True:
            # Jump closer by the commit times (entries are in paging-token order), then scan.
            while hi_ms - (_stream_ms(lo) if lo != "0-0" else 0) > 1 and lo != "0-0":
                mid = (_stream_ms(lo) + hi_ms) // 2
                probe = await self._range(f"{mid}-0", "+", 1)
                if probe and behind(probe[0].record.paging_token):
                    lo = probe[0].position
                else:
                    hi_ms = mid
            page = await self.read(lo, SCAN_PAGE)
            for i, entry in enumerate(page):
                if not behind(entry.record.paging_token):
                    return page[i - 1].position if i else lo
            if len(page) < SCAN_PAGE:
                return page[-1].position if page else lo
            lo = page[-1].position

    async def position_at(self, ms: int) -> str:
        """The position before the first record committed at or after ``ms`` (Unix ms)."""
        if ms <= 0:
            return "0-0"
        last = await self._range(f"{ms - 1}", "-", 1, reverse=True)
        return last[0].position if last else "0-0"

    async def wait(self, after: str, seconds: float) -> bool:
        # One XREAD BLOCK for every waiter of the node, on threads and connections of its own
        # (actors/lease_store/waits.py): idle webhook jobs leave the node's calls theirs.
        return await stream_waits(self.store.client, self.store.call_timeout).wait(self.key, after, seconds)

    def keep_from(self, position: str | None) -> None:
        self._keep, self._keep_known = position, True

    def forget(self) -> None:
        self._held, self._keep_known = None, False

    async def hold(self, position: str) -> bool:
        if not self._keep_known:
            return False
        position = "0-0" if position == "0" else position
        if self._keep is not None:
            position = min(position, _entry_before(self._keep), key=_entry_key)
        if position == self._held:
            return True
        client = self.store.client

        def move() -> None:
            try:
                client.xgroup_setid(self.key, self.holder, position)
            except redis.ResponseError as exc:
                # no group yet, or no stream yet (a source job that has committed nothing)
                if "NOGROUP" not in str(exc) and "requires the key to exist" not in str(exc):
                    raise
                client.xgroup_create(self.key, self.holder, position, mkstream=True)

        try:
            await self.store.run(move)
        except RedisUnavailable:
            return False  # the group stays where it was (behind): asked again, it moves then
        self._held = position
        return True


class PostgresRecords:
    """The source job's rows in a PostgreSQL sink (``<schema>.events``: ``seq`` 1, 2, ... in commit
    order). One connection, in a worker thread, every call bounded by ``timeout``."""

    def __init__(self, url: str, schema: str, job: str, timeout: float = 2.0, poll: float = 0.02) -> None:
        from ingestion.postgres import sql  # lazy: node start-up (~2 ms): PostgreSQL-backed jobs only

        self.url, self.job, self.timeout, self.poll = url, job, timeout, poll
        self.table = f"{sql.quoted(schema)}.events"
        self._conn: Any = None
        self._limiter = trio.CapacityLimiter(1)

    async def _run(self, fn: Callable[[Any], T]) -> T:
        from ingestion.postgres.connection import connect  # lazy: CLI start-up (psycopg, ~140 ms)

        def call() -> T:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.url, self.timeout, "ingestion-webhook")
                self._conn.autocommit = True
            return fn(self._conn)

        try:
            with trio.fail_after(self.timeout):
                return await trio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=self._limiter)
        except trio.TooSlowError as exc:
            raise SinkUnavailable(f"postgres: no answer within {self.timeout * 1000:.0f} ms") from exc
        except Exception as exc:  # psycopg's errors: an outage of the source job's sink
            import psycopg  # lazy: CLI start-up (~140 ms)

            if isinstance(exc, psycopg.Error):
                self._conn = None
                raise SinkUnavailable(f"postgres: {exc}") from exc
            raise

    async def read(self, after: str, count: int) -> list[Stored]:
        rows = await self._run(
            lambda c: c.execute(
                f"SELECT seq, (extract(epoch FROM committed_at) * 1000)::bigint, paging_token, "
                f"record::text FROM {self.table} WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
                (self.job, int(after), count),
            ).fetchall()
        )
        return [Stored(str(s), int(ms), Record(str(p), str(r))) for s, ms, p, r in rows]

    async def newest(self) -> str | None:
        row = await self._run(
            lambda c: c.execute(
                f"SELECT paging_token FROM {self.table} WHERE job = %s ORDER BY seq DESC LIMIT 1",
                (self.job,),
            ).fetchone()
        )
        return str(row[0]) if row else None

    async def locate(self, cursor: str, *, inclusive: bool = False) -> str:
        if cursor == "0":
            return "0"
        key = token_key(cursor)
        row = await self._run(
            lambda c: c.execute(
                f"SELECT coalesce(min(seq), 1) - 1, coalesce(max(seq), 0) FROM {self.table} WHERE job = %s",
                (self.job,),
            ).fetchone()
        )
        lo, hi = int(row[0]), int(row[1]) + 1  # rows <= lo are <= cursor (none); rows >= hi after
        while hi - lo > 1:  # the rows' paging tokens rise with seq: bisect
            mid = (lo + hi) // 2
            got: Any = await self._run(
                lambda c, mid=mid: c.execute(  # type: ignore[misc]
                    f"SELECT seq, paging_token FROM {self.table} WHERE job = %s AND seq >= %s "
                    "ORDER BY seq LIMIT 1",
                    (self.job, mid),
                ).fetchone()
            )
            if got is None or (token_key(str(got[1])) >= key if inclusive else token_key(str(got[1])) > key):
                hi = mid
            else:
                lo = int(got[0])
        return str(lo)

    async def wait(self, after: str, seconds: float) -> bool:
        await trio.sleep(min(seconds, self.poll))
        return True  # (a poll: whether one came is for the next read to say)

    retains = False  # the sink's max_len trims by count (docs/WEBHOOKS.md)

    async def hold(self, position: str) -> bool:
        return True

    def keep_from(self, position: str | None) -> None:
        return None

    def forget(self) -> None:
        return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
