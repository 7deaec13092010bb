"""The events API's projector: a fenced singleton that turns a view's committed rows into the
indexed store the API reads (:mod:`ingestion.api.store`).

It runs as a scheduled job under the election (:class:`actors.scheduled.ScheduledJob`), the job
``api.<view>`` that a node configured with ``[api] job = VIEW`` hosts (see
:func:`ingestion.config.jobs` and :func:`projector_action`). One run lasts up to
:data:`RUN_SECONDS`: it projects what is new, then waits for the sink's ``NOTIFY`` on
``<schema>_events`` (a commit of the view's job or of one of its backfill ranges) or a second,
whichever comes first, and projects again; the run's summary is committed as the job's record.

Each step is one fenced transaction on the projector's own job (:class:`FencedProjector`: the
protocol of :class:`~ingestion.postgres.fence.PostgresFence`, on a connection kept between
steps): for every source of the view (the job and its ``~`` ranges), read
its committed cursor and up to :data:`BATCH` rows after its progress in one statement (one
snapshot), insert their projections ``ON CONFLICT DO NOTHING`` and move its progress, all or
nothing. A stale leader's step changes nothing (:class:`~ingestion.postgres.fence.FenceRejected`);
a step repeated after a failover inserts nothing twice (the key is the view and the event id).
A record that is not an event is skipped (counted in the run's summary), never fatal.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import psycopg
import trio

from actors.scheduled import Action
from actors.sink import SinkUnavailable
from actors.source import TermContext
from ingestion.api import store
from ingestion.postgres import sql
from ingestion.postgres.connection import connect, describe, ensure_schema, redact
from ingestion.postgres.fence import FenceRejected

BATCH = 5000  # rows per source per step at most
RUN_SECONDS = 30.0  # one run (one committed record) at most this long
IDLE_WAKE = 1.0  # seconds: project again at least this often without a notice


Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def projector_job_name(view: str) -> str:
    """The elected job that keeps ``view``'s projection."""
    return f"api.{view}"


def project_step(execute: Execute, schema: str, view: str) -> dict[str, int]:
    """One step inside a fenced transaction (``execute`` runs a statement there and returns its
    rows): every source's new rows projected. Returns ``{"rows": projected, "skipped": not
    events, "behind": sources with more to read}``."""
    progress = {str(s): (int(q), t) for s, q, t in execute(store.read_progress(schema), (view,))}
    sources = [str(r[0]) for r in execute(store.sources_of(schema), (view, view))]
    projected = skipped = behind = 0
    for source in sources:
        after, was_through = progress.get(source, (0, None))
        rows = execute(store.source_batch(schema), (after, BATCH, source))
        events = [r for r in rows if r[1] is not None]
        if not rows:
            continue
        cursor = rows[0][0]
        projections = []
        for _, _, paging_token, record in events:
            try:
                projections.append(store.project_record(str(paging_token), str(record)))
            except store.NotAnEvent:
                skipped += 1
        if projections:
            execute(store.insert_rows(schema), store.insert_params(view, projections))
        through: str | None
        if len(events) >= BATCH:
            behind += 1
            through = str(events[-1][2])
        else:
            through = None if cursor is None else str(cursor)
        last = int(events[-1][1]) if events else after
        if events or through != was_through:
            execute(store.save_progress(schema), (view, source, last, through))
        projected += len(projections)
    return {"rows": projected, "skipped": skipped, "behind": behind}


class FencedProjector:
    """The projector's steps, each one fenced transaction on a connection kept between steps
    (the fence's protocol, :class:`~ingestion.postgres.fence.PostgresFence`'s: ``open_term``
    with the term's token, then the fence row locked until ``COMMIT``), run whole in one worker
    thread: a step costs one thread hop and no new connection, which is what keeps a commit
    visible within tens of milliseconds. A step that fails or times out drops its connection
    (the next step connects afresh); its transaction, never committed, changes nothing."""

    def __init__(self, url: str, schema: str, view: str, *, call_timeout: float = 5.0) -> None:
        self.url = url
        self.schema = schema
        self.view = view
        self.job = projector_job_name(view)
        self.call_timeout = call_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._ready = False
        self._limiter = trio.CapacityLimiter(1)

    async def step(self, node: str, token: int) -> dict[str, int]:
        """Project what is new under term ``(node, token)``.

        Raises:
            FenceRejected: a newer term holds the fence: nothing was written.
            SinkUnavailable: PostgreSQL failed or did not answer in time (nothing committed, or
                the commit's outcome unknown: a step is idempotent).
        """
        try:
            with trio.fail_after(4 * self.call_timeout):
                return await trio.to_thread.run_sync(
                    functools.partial(self._step, node, token), abandon_on_cancel=True, limiter=self._limiter
                )
        except trio.TooSlowError as exc:
            self._conn = None  # (its thread may still hold it: the server's timeouts end it)
            raise SinkUnavailable(f"sink.url {redact(self.url)}: timed out") from exc
        except (psycopg.Error, OSError) as exc:
            raise SinkUnavailable(describe(exc, self.url)) from exc

    def _step(self, node: str, token: int) -> dict[str, int]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = connect(self.url, self.call_timeout, f"ingestion-job:{self.job}")
            ensure_schema(conn, self.schema)
            self._conn = conn
        q = sql.quoted(self.schema)
        try:
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            row = conn.execute(
                f"SELECT ok, fence FROM {q}.{sql.OPEN_TERM}(%s, %s, %s, NULL)",  # type: ignore[arg-type]
                (self.job, token, node),
            ).fetchone()
            assert row is not None
            if not row[0]:
                conn.execute("ROLLBACK")
                raise FenceRejected(self.job, token, int(row[1]))
            conn.execute(f"SELECT 1 FROM {q}.fences WHERE job = %s FOR UPDATE", (self.job,))  # type: ignore[arg-type]
            if not self._ready:
                for statement in store.create_statements(self.schema):
                    conn.execute(statement)  # type: ignore[arg-type]

            def execute(query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                cur = conn.execute(query, params)  # type: ignore[arg-type]
                return cur.fetchall() if cur.description is not None else []

            result = project_step(execute, self.schema, self.view)
            conn.execute("COMMIT")
        except FenceRejected:
            raise
        except BaseException:
            self._conn = None
            conn.close()
            raise
        self._ready = True
        return result

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class NoticeWaiter:
    """Waits for the sink's ``NOTIFY`` of a commit of the view's jobs, on a ``LISTEN`` connection
    of its own, drained in a worker thread while waiting (a missed notice costs one
    :data:`IDLE_WAKE`, never a row). The connection lives only while a run does: PostgreSQL holds
    its one notification queue for the slowest listener, so a listener nobody drains (a former
    leader's) must not stay (:meth:`close`)."""

    def __init__(self, url: str, schema: str, view: str) -> None:
        self.url = url
        self.schema = schema
        self.view = view
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()  # held by the waiting thread while it uses the connection
        self._closing = False
        self._limiter = trio.CapacityLimiter(1)

    def _wait(self, seconds: float) -> bool:
        with self._lock:
            try:
                if self._closing:
                    return False
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = connect(self.url, 2.0, "ingestion-api-projector")
                    self._conn.execute(f"LISTEN {sql.channel(self.schema)}")  # type: ignore[arg-type]
                    return True  # (re)connected: whatever was committed meanwhile is read again
                for note in self._conn.notifies(timeout=seconds):
                    if self._ours(note.payload):
                        return True
                return False
            finally:
                if self._closing:
                    self._drop()

    def _ours(self, payload: str) -> bool:
        try:
            job = str(orjson.loads(payload).get("job", ""))
        except (orjson.JSONDecodeError, AttributeError):
            return False
        return job == self.view or job.startswith(self.view + "~")

    async def wait(self, seconds: float) -> bool:
        """Until a notice for the view or ``seconds``: whether one came."""
        self._closing = False
        try:
            with trio.fail_after(seconds + 3):
                return await trio.to_thread.run_sync(
                    functools.partial(self._wait, seconds), abandon_on_cancel=True, limiter=self._limiter
                )
        except (psycopg.Error, OSError, trio.TooSlowError):
            self.close()
            await trio.sleep(min(seconds, IDLE_WAKE))
            return False

    def close(self) -> None:
        """Stop listening: now when no thread waits, else as that thread's wait ends (within
        its ``seconds``, at most :data:`IDLE_WAKE`)."""
        self._closing = True
        if self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def projector_action(url: str, schema: str, view: str, *, run_seconds: float = RUN_SECONDS) -> Action:
    """The scheduled action that keeps ``view``'s projection at ``url``."""
    projector = FencedProjector(url, schema, view)
    waiter = NoticeWaiter(url, schema, view)

    async def action(run: int, term: TermContext) -> dict[str, Any]:
        totals = {"rows": 0, "skipped": 0, "steps": 0}
        deadline = trio.current_time() + run_seconds
        try:
            while True:
                step = await projector.step(term.node, term.token)
                totals["rows"] += step["rows"]
                totals["skipped"] += step["skipped"]
                totals["steps"] += 1
                if trio.current_time() >= deadline:
                    return totals
                if not step["behind"]:
                    await waiter.wait(min(IDLE_WAKE, max(0.0, deadline - trio.current_time())))
        finally:
            waiter.close()  # (the next run listens again: a run ends, or its term does)

    return action


async def project(run: int, term: TermContext) -> dict[str, Any]:
    """Placeholder the node replaces with :func:`projector_action` built from its settings."""
    raise RuntimeError("the API projector is built from the node's settings ([api] job)")
