"""The node's live feed of a view's events: one follower of the live job's commits for every
subscription.

It ``LISTEN``s on the sink's channel ``<schema>_events`` (``ingestion/postgres/sql.py``) on a
connection of its own, drained continuously by a thread of its own (a listener that stopped
reading would hold PostgreSQL's one notification queue: see
:class:`~ingestion.postgres.readers.EventsFollower`), and on each notice of the view's job (or at
least every :attr:`LiveFeed.reread` seconds, so a notice lost to a reconnect, to the queue's
limit or to a replica, which relays none, costs at most that) reads the rows the job committed
after the last one it read, in ``seq`` order, and hands them to every subscriber, synchronously,
in its own task: one read per commit whatever the number of subscribers, so subscribers cost the
database nothing.

It reads the sink's rows, not the API's store: a commit is in the store only once the projector
has projected it (tens of milliseconds later under load), and a subscriber is to hear of it at
once. The store stays the one source of history: a subscriber registered at the feed's
:attr:`~LiveFeed.position` P reads history only once the store holds P (the live job's rows are
projected in order, so then every earlier one as well), and every event after P reaches it through
the feed: the seam argument in ``ingestion/api/subscription.py``, with "published" read as
"committed, and in the store by the time the subscriber's history is read".
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


class LiveFeed:
    """Follows ``reads``' view's job (see the module docstring). Start with ``await
    nursery.start(feed.run)``: it is ready (subscribers may register) once it knows where the
    job's rows end."""

    DRAIN_POLL = 0.25  # seconds: how soon the listening thread sees that it must stop

    def __init__(self, reads: StreamReads, url: str, reread: float = 1.0) -> None:
        self.reads = reads
        self.url = url
        self.reread = reread
        self.position = ""  # the id of the last event published (the job's last committed at start)
        self.seq = 0  # the live job's seq of the last row read
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
                    self.seq, self.position = await self.reads.last_committed()
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
        while True:
            with trio.move_on_after(self.reread):
                await self._woken.wait()
            self._woken = trio.Event()  # a notice from now on wakes the next round
            try:
                seq, rows = await self.reads.committed_after(self.seq)
            except RpcError as exc:
                if not failing:
                    log.warning("api-feed-unavailable", error=exc.message)
                failing = True
                continue
            if failing:
                log.info("api-feed-back")
                failing = False
            self.reads_done += 1
            if seq == self.seq:
                continue
            self.seq = seq
            if not rows:
                continue
            self.position = rows[-1].id
            for subscriber in list(self.subscribers.values()):
                subscriber(rows)
            if len(rows) >= FEED_BATCH:
                self._woken.set()  # a burst: read on at once

    def _wake(self) -> None:
        self._woken.set()

    def _drain(self, stop: threading.Event, token: trio.lowlevel.TrioToken) -> None:
        """The listening thread: every notice read as it comes, the feed woken for its job's."""
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
    """A commit of the view's live job (its backfill ranges' events are older: history)."""
    try:
        return bool(payload(notice).get("job") == view)
    except (ValueError, AttributeError):
        return False
