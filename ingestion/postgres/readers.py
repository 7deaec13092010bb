"""The read-only tools' view of a PostgreSQL sink (verify, inspect, tail): a job's rows, its
state, the check of its rows, and :class:`EventsFollower`, which follows a job's commits by their
``NOTIFY`` (its listening connection drained by a thread of its own). Blocking calls, each on a
connection of its own (never the sink's).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg

from actors.cursor_order import token_key
from ingestion.postgres import sql
from ingestion.postgres.connection import connect


def read_events(
    url: str, schema: str, job: str, after_seq: int = 0, limit: int = 1000, timeout: float = 5.0
) -> list[tuple[int, str, int, str]]:
    """(seq, paging_token, token, record JSON) after ``after_seq``, in order (read-only tools)."""
    with connect(url, timeout, "ingestion-read") as conn:
        rows = conn.execute(
            f"SELECT seq, paging_token, token, record::text FROM {sql.quoted(schema)}.events "  # type: ignore[arg-type]
            "WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
            (job, after_seq, limit),
        ).fetchall()
    return [(int(s), str(p), int(t), str(r)) for s, p, t, r in rows]


def job_state(url: str, schema: str, job: str, timeout: float = 5.0) -> dict[str, Any]:
    """A job's state in the sink: cursor, completeness watermark, fence, rows kept, first and
    last ``seq``, terms."""
    q = sql.quoted(schema)
    with connect(url, timeout, "ingestion-read") as conn:
        # (the watermark's columns read through to_jsonb: a schema older than version 4 lacks them)
        cur = conn.execute(
            f"SELECT c.cursor, c.token, to_jsonb(c)->>'complete_through', to_jsonb(c)->>'complete_held' "  # type: ignore[arg-type]
            f"FROM {q}.cursors c WHERE c.job = %s", (job,),
        ).fetchone()  # fmt: skip
        fence = conn.execute(f"SELECT token, node FROM {q}.fences WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
        count, first, last = conn.execute(
            f"SELECT count(*), min(seq), max(seq) FROM {q}.events WHERE job = %s", (job,)  # type: ignore[arg-type]
        ).fetchone() or (0, None, None)
        terms = conn.execute(
            f"SELECT token, after_seq FROM {q}.terms WHERE job = %s ORDER BY token", (job,)  # type: ignore[arg-type]
        ).fetchall()
    return {
        "sink": "postgres", "schema": schema, "cursor": cur[0] if cur else None,
        "cursor_token": int(cur[1]) if cur else None, "fence": int(fence[0]) if fence else None,
        "complete_through": int(cur[2]) if cur and cur[2] is not None else None,
        "complete_held": (cur[3] or "") if cur else "",
        "fence_node": str(fence[1]) if fence else None,
        "events": int(count), "first_seq": first, "last_seq": last,
        "terms": [{"token": int(t), "after_seq": int(s)} for t, s in terms],
    }  # fmt: skip


def check_job(url: str, schema: str, job: str, timeout: float = 30.0) -> tuple[list[str], int]:
    """Verify a job's rows: exactly once, in order (paging tokens strictly rising along ``seq``),
    ``seq`` without gaps, tokens never decreasing and never below the fence history. Returns
    (problems, rows checked)."""
    q = sql.quoted(schema)
    with connect(url, timeout, "ingestion-verify") as conn:
        rows = conn.execute(
            f"SELECT seq, token, paging_token FROM {q}.events WHERE job = %s ORDER BY seq", (job,)  # type: ignore[arg-type]
        ).fetchall()
        terms = conn.execute(
            f"SELECT token, after_seq FROM {q}.terms WHERE job = %s ORDER BY token", (job,)  # type: ignore[arg-type]
        ).fetchall()
        cur = conn.execute(f"SELECT cursor FROM {q}.cursors WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
    problems = sql.verify_fences([(int(s), int(t)) for s, t, _ in rows], [(int(t), int(a)) for t, a in terms])
    previous: str | None = None
    for seq, _t, pt in rows:
        if previous is not None and token_key(pt) <= token_key(previous):
            problems.append(f"seq {seq}: paging token {pt} not after {previous} (duplicate or out of order)")
        previous = pt
    if rows and cur is not None and token_key(cur[0]) < token_key(previous or "0"):
        problems.append(f"cursor {cur[0]} is behind the last row's paging token {previous}")
    return problems, len(rows)


def payload(notify: str) -> dict[str, Any]:
    """A ``NOTIFY`` payload as sent by ``commit_batch``: ``{"job", "seq", "cursor"}``."""
    value: dict[str, Any] = json.loads(notify)
    return value


def configured_sink(settings: Any, job: str) -> str:
    """A job's sink as configured: its ``[jobs.NAME] sink``, else ``sink.url`` (empty: the Redis
    events stream)."""
    parent = job.rpartition("~")[0]  # a backfill's range job (JOB~FIRST-LAST): its job's sink
    for j in settings.jobs:
        if j.name in (job, parent):
            return str(j.sink)
    return str(settings.sink.url)


def job_known(state: dict[str, Any]) -> bool:
    """Whether :func:`job_state` found anything of the job (a fence, a cursor or a row)."""
    return state["fence"] is not None or state["cursor"] is not None or state["events"] > 0


def read_all_events(
    url: str, schema: str, job: str, page: int = 5000, timeout: float = 30.0
) -> list[tuple[int, str, int, str]]:
    """Every row of the job, in ``seq`` order, read in pages (verify)."""
    out: list[tuple[int, str, int, str]] = []
    while True:
        rows = read_events(url, schema, job, out[-1][0] if out else 0, page, timeout)
        out += rows
        if len(rows) < page:
            return out


class EventsFollower:
    """A job's rows after a ``seq``, woken by the ``NOTIFY`` each commit sends (``tail``).

    Blocking (a foreground command), on two connections: one reads; the other only ``LISTEN``s,
    and a thread of the follower's own drains it continuously, whatever the caller is doing.
    PostgreSQL keeps one notification queue for the whole server, and a listener's backend
    consumes it only by sending the notices to its client: a client that stops reading (a
    ``tail`` whose output is paused in a pager, or blocked on a full pipe) would let the socket's
    buffers fill, stall its backend, and hold the queue behind it until every ``NOTIFY`` on the
    server fails (``commit_batch`` stops notifying past a limit: ``ingestion/postgres/sql.py``).
    Drained here, a paused consumer holds nothing; a stopped process (SIGSTOP) still can, which
    the limit and the operator's alert cover (docs/POSTGRES.md).

    :meth:`wait` returns after a notice for this job or ``seconds``, whichever comes first: a
    missed notice (a reconnect) costs at most one wait, never a row.
    """

    DRAIN_POLL = 0.25  # seconds: how soon the listening thread sees that it must stop

    def __init__(self, url: str, schema: str, job: str, timeout: float = 5.0) -> None:
        self.url = url
        self.schema = schema
        self.job = job
        self.timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()
        self._woken = threading.Event()

    def _listen(self) -> None:
        """Start the listening thread unless it runs; return once it ``LISTEN``s (or has tried
        for ``timeout``: it goes on trying, and reads go on regardless)."""
        if self._listener is not None and self._listener.is_alive():
            return
        stop, listening = threading.Event(), threading.Event()
        self._stop = stop
        self._listener = threading.Thread(
            target=self._drain, args=(stop, listening), name="ingestion-tail-listener", daemon=True
        )
        self._listener.start()
        listening.wait(self.timeout)

    def _drain(self, stop: threading.Event, listening: threading.Event) -> None:
        """The listening thread: read every notice as it comes, wake :meth:`wait` for this job's,
        reconnect after a failure, until ``stop``."""
        while not stop.is_set():
            try:
                with connect(self.url, self.timeout, "ingestion-tail-listener") as conn:
                    conn.execute(f"LISTEN {sql.channel(self.schema)}")  # type: ignore[arg-type]
                    listening.set()
                    self._woken.set()  # (re)connected: what was committed meanwhile is read again
                    while not stop.is_set():
                        for note in conn.notifies(timeout=self.DRAIN_POLL):
                            if _for_job(note.payload, self.job):
                                self._woken.set()
            except (psycopg.Error, OSError):
                listening.set()  # the reads report an outage; this thread tries again
                stop.wait(0.5)

    def _connection(self) -> psycopg.Connection[Any]:
        self._listen()  # before the first read, so that no commit after it goes unnoticed
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.url, self.timeout, "ingestion-tail")
        return self._conn

    def read(self, after_seq: int, limit: int) -> list[tuple[int, str, int, str]]:
        """(seq, paging_token, token, record JSON) after ``after_seq``, in order."""
        rows = self._connection().execute(
            f"SELECT seq, paging_token, token, record::text FROM {sql.quoted(self.schema)}.events "  # type: ignore[arg-type]
            "WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
            (self.job, after_seq, limit),
        ).fetchall()
        return [(int(s), str(p), int(t), str(r)) for s, p, t, r in rows]

    def last_seq(self) -> int:
        row = self._connection().execute(
            f"SELECT coalesce(max(seq), 0) FROM {sql.quoted(self.schema)}.events WHERE job = %s",  # type: ignore[arg-type]
            (self.job,),
        ).fetchone()
        return int(row[0]) if row else 0

    def wait(self, seconds: float) -> bool:
        """Until a commit of this job is notified, at most ``seconds``: whether one was (since
        the last wait)."""
        self._listen()
        if not self._woken.wait(seconds):
            return False
        self._woken.clear()
        return True

    def close(self) -> None:
        """Stop the listening thread (within :attr:`DRAIN_POLL`) and close both connections;
        the follower may be used again (it reconnects)."""
        self._stop.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.join(2 * self.DRAIN_POLL)  # one stuck connecting ends on its own (a daemon)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _for_job(notice: str, job: str) -> bool:
    try:
        return bool(payload(notice).get("job") == job)
    except (ValueError, AttributeError):
        return False  # not one of commit_batch's
