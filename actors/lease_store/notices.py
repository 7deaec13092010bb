"""Release notices: the pub/sub subscription that wakes standbys the moment a leader releases."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import redis
import trio
from redis.sentinel import SentinelConnectionPool


class _Failed:
    """What a wait's thread answers when Redis failed (the caller waits out the rest in trio)."""


_FAILED = _Failed()
HANDED_OVER = "handed-over"  # a release's reason when an operator asked for it
NODE_EXITING = "node-exiting"  # when the releasing node is going away (its worker died)
TERM_FAILED = "term-failed"  # when the releasing node's term raised: it backs off that job
# The reasons a notice may end with. Each says the releasing node stands aside, so a standby held
# off at its share takes the lease over at once rather than wait for it to come back.
STANDS_ASIDE = (HANDED_OVER, NODE_EXITING, TERM_FAILED)


def _holder(data: str) -> tuple[str, str]:
    """A notice (``token|node``, or ``token|node|reason``) as (node, reason or "")."""
    rest = data.partition("|")[2]
    for reason in STANDS_ASIDE:
        if rest.endswith("|" + reason):
            return rest[: -len(reason) - 1], reason
    return rest, ""


class NoticeSource(Protocol):
    """What the notices read of their store (a ``LeaseStore``): its Redis client and the job's
    keys (``keys["released"]``, the release channel)."""

    @property
    def client(self) -> redis.Redis: ...

    @property
    def keys(self) -> dict[str, str]: ...


class ReleaseNotices:
    """A subscription to the job's release channel, for standbys that must react at once.

    ``wait(seconds)`` returns the releasing holder's node id when a release notice arrived within
    that many seconds, else None. Connection trouble is reported as None after the wait (the
    caller campaigns anyway, so a lost notice costs at most one standby interval). The subscription
    is renewed every ``RESUBSCRIBE_EVERY`` waits, so a half-open connection (a partition that sent
    no reset) cannot silence notices for longer than that. One waiter at a time; the pub/sub
    connection is only ever touched by the worker thread of the current wait (``close`` from the
    trio side defers to that thread when one is still running, e.g. after a cancelled wait).
    """

    RESUBSCRIBE_EVERY = 30

    def __init__(self, store: NoticeSource) -> None:
        self._store = store
        self._pubsub: Any = None
        self._waits = 0
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False
        # The reason the notice the last wait returned carried ("": none; else one of
        # STANDS_ASIDE), and whether it says the releasing node stands aside (a hand-over, or a
        # node exiting): a standby at its share takes the lease over at once.
        self.reason = ""
        self.handed_over = False
        # Its own threads, not trio's default limiter's 40: a wait holds its thread for up to its
        # whole length, and a node hosting 40 jobs would otherwise leave its short Redis calls
        # no thread at all (each then times out as Redis unavailable). Two: a cancelled wait's
        # thread may still be finishing when the next wait starts.
        self._limiter = trio.CapacityLimiter(2)

    def _wait(self, seconds: float) -> str | _Failed | None:
        with self._lock:
            if self._closed:
                return None
            self._busy = True
        end = time.monotonic() + seconds
        try:
            if (
                self._pubsub is None
                or self._waits >= self.RESUBSCRIBE_EVERY
                or self._on_former_primary()
            ):
                # Subscribe the new connection first, then read what the old one still holds,
                # then close it: a notice published in between reaches one or the other.
                fresh = self._store.client.pubsub(ignore_subscribe_messages=True)
                fresh.subscribe(self._store.keys["released"])
                old, self._pubsub = self._pubsub, fresh
                self._waits = 0
                held = self._drain(old)
                if held is not None:
                    return held
            self._waits += 1
            while (left := end - time.monotonic()) > 0:
                msg = self._pubsub.get_message(timeout=left)
                if msg is not None and msg.get("type") == "message":
                    return str(msg.get("data", ""))
        except (redis.RedisError, OSError):
            self._reset()
            return _FAILED  # the caller waits out the rest in trio (no sleep in this thread)
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._reset()
        return None

    def _on_former_primary(self) -> bool:
        """With Sentinel: the subscription is on a server that is no longer the primary (whose
        address ``LeaseStore.follow_primary`` re-reads), where no notice comes."""
        pool = getattr(self._store.client, "connection_pool", None)
        conn = getattr(self._pubsub, "connection", None)
        if not isinstance(pool, SentinelConnectionPool) or conn is None or not pool.master_address:
            return False
        return (conn.host, conn.port) != tuple(pool.master_address)

    @staticmethod
    def _drain(old: Any) -> str | None:
        """The first notice an old subscription still holds (then close it), else None."""
        if old is None:
            return None
        found = None
        try:
            while found is None:
                msg = old.get_message(timeout=0)
                if msg is None:
                    break
                if msg.get("type") == "message":
                    found = str(msg.get("data", ""))
        except (redis.RedisError, OSError):
            pass
        try:
            old.close()
        except (redis.RedisError, OSError):
            pass
        return found

    async def wait(self, seconds: float) -> str | None:
        """The releasing holder's node id (``reason``: why, when the release said so;
        ``handed_over``: whether that reason has the holder stand aside), or None when no notice
        came within ``seconds``."""
        deadline = trio.current_time() + seconds
        self.reason, self.handed_over = "", False
        got = await trio.to_thread.run_sync(
            self._wait, seconds, abandon_on_cancel=True, limiter=self._limiter
        )
        if isinstance(got, _Failed):
            # Redis failed: wait out the rest rather than spin. In trio, not in the worker
            # thread: a thread's time.sleep is a clock_nanosleep on an absolute deadline, which
            # fails (EINVAL) in a process whose clocks are faked (libfaketime), and crashed it.
            await trio.sleep_until(deadline)
            return None
        if got is None:
            return None
        holder, self.reason = _holder(got)
        self.handed_over = self.reason in STANDS_ASIDE
        return holder

    def _reset(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except (redis.RedisError, OSError):
                pass
            self._pubsub = None
        self._waits = 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._busy:
                return  # the running worker closes it when it returns
        self._reset()
