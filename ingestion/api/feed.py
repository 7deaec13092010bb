"""The node's live feed of a job's events: one follower of the store for every subscription.

It ``LISTEN``s on the sink's channel ``<schema>_events`` (``ingestion/postgres/sql.py``) on a
connection of its own, drained continuously by a thread of its own (a listener that stopped
reading would hold PostgreSQL's one notification queue: see
:class:`~ingestion.postgres.readers.EventsFollower`), and on each notice of the job (or at least
every :attr:`LiveFeed.reread` seconds, so a notice lost to a reconnect or to the queue's limit
costs at most that) reads the rows committed after the last one it read, in order, and hands them
to every subscriber, synchronously, in the feed's task. One read per commit whatever the number of
subscribers: subscribers cost the server nothing.

A subscriber registered before it reads any history sees every row published from then on; the
rows published before were committed before, so its history reads see them (the seam argument in
``ingestion/api/subscription.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import structlog
import trio

from ingestion.api.stream_reads import Reads, StoredEvent
from ingestion.postgres import sql
from ingestion.postgres.connection import connect, describe
from ingestion.postgres.readers import payload

log = structlog.get_logger("ingestion.api")

Subscriber = Callable[[list[StoredEvent]], None]


class LiveFeed:
    """Follows ``reads``' job (see the module docstring). Start with ``await nursery.start(feed.run)``:
    it is ready (subscribers may register) once it knows where the job's rows end."""

    DRAIN_POLL = 0.25  # seconds: how soon the listening thread sees that it must stop

    def __init__(self, reads: Reads, reread: float = 1.0, timeout: float = 5.0) -> None:
        self.reads = reads
        self.reread = reread
        self.timeout = timeout
        self.position = 0  # the seq of the last row published
        self.subscribers: dict[int, Subscriber] = {}
        self._keys = 0
        self._woken = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self.reads_done = 0  # reads of new rows (tests, metrics)

    def subscribe(self, subscriber: Subscriber) -> int:
        """Register ``subscriber``: it is called with every batch published from now on."""
        self._keys += 1
        self.subscribers[self._keys] = subscriber
        return self._keys

    def unsubscribe(self, key: int) -> None:
        self.subscribers.pop(key, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        stop = threading.Event()
        listener = threading.Thread(
            target=self._drain, args=(stop, trio.lowlevel.current_trio_token()),
            name="ingestion-api-listener", daemon=True,
        )  # fmt: skip
        listener.start()
        try:
            while True:
                try:
                    self.position = await self._call(self.reads.last_seq)
                    break
                except (psycopg.Error, OSError, trio.TooSlowError) as exc:
                    log.warning("api-feed-unavailable", error=describe(exc, self.reads.url))
                    await trio.sleep(self.reread)
            task_status.started()
            await self._follow()
        finally:
            stop.set()  # the thread ends within DRAIN_POLL (a daemon: one stuck connecting ends on its own)

    async def _follow(self) -> None:
        failing = False
        while True:
            with trio.move_on_after(self.reread):
                await self._woken.wait()
            self._woken = trio.Event()  # a notice from now on wakes the next round
            try:
                rows = await self._call(self.reads.after_seq, self.position)
            except (psycopg.Error, OSError, trio.TooSlowError) as exc:
                if not failing:
                    log.warning("api-feed-unavailable", error=describe(exc, self.reads.url))
                failing = True
                continue
            if failing:
                log.info("api-feed-back")
                failing = False
            self.reads_done += 1
            if not rows:
                continue
            self.position = rows[-1].seq
            for subscriber in list(self.subscribers.values()):
                subscriber(rows)
            if len(rows) >= 100:
                self._woken.set()  # a burst: read on at once

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with trio.fail_after(self.timeout):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._limiter)

    def _wake(self) -> None:
        self._woken.set()

    def _drain(self, stop: threading.Event, token: trio.lowlevel.TrioToken) -> None:
        """The listening thread: every notice read as it comes, the feed woken for its job's."""
        job = self.reads.job
        while not stop.is_set():
            try:
                with connect(self.reads.url, self.timeout, "ingestion-api-listener") as conn:
                    conn.execute(f"LISTEN {sql.channel(self.reads.schema)}")  # type: ignore[arg-type]
                    self._signal(token)  # (re)connected: what was committed meanwhile is read
                    while not stop.is_set():
                        for note in conn.notifies(timeout=self.DRAIN_POLL):
                            if _for_job(note.payload, job):
                                self._signal(token)
            except (psycopg.Error, OSError):
                stop.wait(0.5)

    def _signal(self, token: trio.lowlevel.TrioToken) -> None:
        try:
            trio.from_thread.run_sync(self._wake, trio_token=token)
        except trio.RunFinishedError:
            pass  # the feed's run is over; the thread stops at its next look


def _for_job(notice: str, job: str) -> bool:
    try:
        return bool(payload(notice).get("job") == job)
    except (ValueError, AttributeError):
        return False
