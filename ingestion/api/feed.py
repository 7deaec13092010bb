"""The node's live feed of a view's events: one follower of the store for every subscription.

The store is the projection a fenced projector keeps (:mod:`ingestion.api.projector`): a commit
of the view's job lands in the sink, whose ``NOTIFY`` on ``<schema>_events`` wakes the projector,
which projects it a few milliseconds later. The feed listens on the same channel (on a connection
of its own, drained continuously by a thread of its own: a listener that stopped reading would
hold PostgreSQL's one notification queue, see :class:`~ingestion.postgres.readers.EventsFollower`)
and, on a notice of the view's jobs, reads the projected events after the last one it read; while
the projection has not caught up it reads again after :data:`CHASE` seconds, then less and less
often, and at least every :attr:`LiveFeed.reread` seconds whatever happens (a
notice lost to a reconnect or to the queue's limit costs at most that). It hands what it read to
every subscriber, synchronously, in its own task: one read per commit whatever the number of
subscribers, so subscribers cost the database nothing.

A subscriber registered before it reads any history sees every event published from then on; the
events published before were in the store before, so its history reads see them (the seam
argument in ``ingestion/api/subscription.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import structlog
import trio

from ingestion.api.stream_reads import FEED_BATCH, StoredEvent, StreamReads
from ingestion.postgres import sql
from ingestion.postgres.connection import connect
from ingestion.postgres.readers import payload
from ingestion.rpc.protocol import RpcError

log = structlog.get_logger("ingestion.api")

Subscriber = Callable[[list[StoredEvent]], None]
# After a notice, the first read waits CHASE seconds, and each read that finds nothing new (the
# projector has not projected the commit yet) waits CHASE_GROWTH times longer, up to ``reread``:
# a dozen cheap index reads per commit at most, a few milliseconds behind the projector.
CHASE = 0.002
CHASE_GROWTH = 1.5


class LiveFeed:
    """Follows ``reads``' view (see the module docstring). Start with ``await nursery.start(feed.run)``:
    it is ready (subscribers may register) once it knows the view's newest event."""

    DRAIN_POLL = 0.25  # seconds: how soon the listening thread sees that it must stop

    def __init__(self, reads: StreamReads, url: str, reread: float = 1.0) -> None:
        self.reads = reads
        self.url = url
        self.reread = reread
        self.position = ""  # the id of the last event published
        self.subscribers: dict[int, Subscriber] = {}
        self._keys = 0
        self._woken = trio.Event()
        self.reads_done = 0

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
                    self.position = await self.reads.newest()
                    break
                except RpcError as exc:
                    log.warning("api-feed-unavailable", error=exc.message)
                    await trio.sleep(self.reread)
            task_status.started()
            await self._follow()
        finally:
            stop.set()  # the thread ends within DRAIN_POLL (a daemon: one stuck connecting ends on its own)

    async def _follow(self) -> None:
        failing = False
        delay = self.reread  # until the next read without a notice
        while True:
            with trio.move_on_after(delay):
                await self._woken.wait()
            if self._woken.is_set():
                self._woken = trio.Event()  # a notice from now on wakes the next round
                delay = CHASE
            else:
                delay = min(delay * CHASE_GROWTH, self.reread)  # chasing the projector, slower
            try:
                rows = await self.reads.after(self.position)
            except RpcError as exc:
                if not failing:
                    log.warning("api-feed-unavailable", error=exc.message)
                failing = True
                delay = self.reread
                continue
            if failing:
                log.info("api-feed-back")
                failing = False
            self.reads_done += 1
            if not rows:
                continue
            delay = self.reread
            self.position = rows[-1].id
            for subscriber in list(self.subscribers.values()):
                subscriber(rows)
            if len(rows) >= FEED_BATCH:
                self._woken.set()  # a burst: read on at once

    def _wake(self) -> None:
        self._woken.set()

    def _drain(self, stop: threading.Event, token: trio.lowlevel.TrioToken) -> None:
        """The listening thread: every notice read as it comes, the feed woken for its view's."""
        view = self.reads.reader.view
        while not stop.is_set():
            try:
                with connect(self.url, 5.0, "ingestion-api-listener") as conn:
                    conn.execute(f"LISTEN {sql.channel(self.reads.reader.schema)}")  # type: ignore[arg-type]
                    self._signal(token)  # (re)connected: what was committed meanwhile is read
                    while not stop.is_set():
                        for note in conn.notifies(timeout=self.DRAIN_POLL):
                            if _for_view(note.payload, view):
                                self._signal(token)
            except (psycopg.Error, OSError):
                stop.wait(0.5)

    def _signal(self, token: trio.lowlevel.TrioToken) -> None:
        try:
            trio.from_thread.run_sync(self._wake, trio_token=token)
        except trio.RunFinishedError:
            pass  # the feed's run is over; the thread stops at its next look


def _for_view(notice: str, view: str) -> bool:
    """A commit of the view's job or of one of its backfill ranges (``VIEW~FIRST-LAST``)."""
    try:
        job = str(payload(notice).get("job", ""))
    except (ValueError, AttributeError):
        return False
    return job == view or job.startswith(view + "~")
