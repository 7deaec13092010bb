"""Watch lists kept in Redis: the source that reloads a job's set (:class:`RedisWatch`,
``ingestion:{JOB}:watch``, reloaded when its version counter moves) and the operator's edits
(:func:`add`, :func:`remove`): each validates first, then changes the set in short commands (Redis
goes on serving the leases between them) and, when that changed anything, increments the version,
so a node that reads the version never misses an edit, and an edit that changes nothing reloads no
node.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from importlib.resources import files
from typing import Any

import redis
import structlog
import trio

from ingestion.common.keyspace import watch_keys
from ingestion.watchlist.addresses import Skipped, check_address, shaped_entries
from ingestion.watchlist.lists import EMPTY, WatchList, WatchStatistics, WatchUnavailable

log = structlog.get_logger()

SCAN_COUNT = 10_000  # SSCAN's COUNT: no reply holds more than about this many members
EDIT_CHUNK = 1_000  # members per SADD/SREM of an edit (each a short command: Redis serves others between)
EDIT_ROUND = 50  # such commands per round trip of an edit

# The end of an edit: the version counter moved (the nodes then read the set again), the marker
# cleared (``lua/watch_edit_done.lua``).
_EDIT_DONE = (files(__package__) / "lua" / "watch_edit_done.lua").read_text(encoding="utf-8")


def _text(member: str | bytes) -> str:
    return member.decode("utf-8", "replace") if isinstance(member, bytes) else member


def _sscan_replies(client: redis.Redis, key: str, count: int) -> Iterator[list[str]]:
    """The members of each SSCAN reply for the set at ``key``, in order, the scan whole.

    SSCAN's cursor comes with its reply, so the next call cannot be sent earlier; but it can be
    sent *before* the caller handles this reply's members, and then the server works on the
    next chunk while this one is checked and added (measured: the server spends about 0.57 s on
    the SSCANs of a million members, the client about 0.25 s on the checking and the set,
    which thus costs nothing). Every read is bounded by the client's socket timeout.

    A cluster client has no pool of its own to take one connection from: it is asked call by
    call (no overlap), and follows a moved slot as it does for every other command.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        cursor: Any = 0
        while True:
            cursor, members = client.sscan(key, cursor, count=count)
            yield members  # type: ignore[misc]
            if int(cursor) == 0:
                return
    connection = pool.get_connection()
    try:
        connection.send_command("SSCAN", key, 0, "COUNT", count)
        while True:
            cursor, members = connection.read_response()
            if int(cursor) != 0:
                connection.send_command("SSCAN", key, cursor, "COUNT", count)
            yield members
            if int(cursor) == 0:
                return
    except BaseException:
        connection.disconnect()  # a reply may be half read, or still to come: not reusable
        raise
    finally:
        pool.release(connection)


def _scan_list(client: redis.Redis, key: str, count: int, skipped: Skipped) -> WatchList:
    """The set at ``key`` as a list, read with SSCAN ``count`` at a time (runs in a worker thread).

    SSCAN returns every member that is in the set for the whole scan; one added or removed during
    it may or may not be seen, but its edit moved the version, which the next check sees.

    The members are added to a ``set`` chunk by chunk, while the server prepares the next chunk,
    and frozen at the end (a copy of the hash table, about 0.06 s for a million: the strings are
    shared and their hashes kept).
    """
    building: set[str] = set()
    for members in _sscan_replies(client, key, count):
        building.update(shaped_entries(members, skipped))
    watch = WatchList(frozenset(building))
    building.clear()
    return watch


class RedisWatch:
    """A Redis set that operators edit while the node runs (``ingestion:{JOB}:watch``).

    Each :meth:`current` reads the version counter (one GET); the set is read again (SSCAN, in
    chunks) only when the version moved. A GET that fails or times out keeps the current list: a
    read changes nothing, so its ambiguity is harmless, and the next batch asks again. Failures
    are logged when they start and when they end, not once per batch.

    The first load, and a reload that fails after the old list was dropped, leave no list:
    :meth:`current` raises :class:`WatchUnavailable` until a load succeeds.

    ``client`` is a redis-py client whose calls are bounded (``actors.lease_store.connect``); its
    calls run in worker threads, one reload at a time.

    Why a reload checks each member's *shape* only (letter, length, base32: :func:`has_address_shape`),
    not its checksum: the full check costs about 0.5 s per million members, half the time a reload
    may take, and buys nothing here. The only writer the project gives operators, :func:`add` (which
    ``ingestion watchlist`` calls), checks every address in full before it writes; and a member
    whose checksum is wrong can never equal an address a record names (records carry valid
    strkeys), so it cannot make a record match. A member that is not even shaped as a strkey (a
    write around the tool) is skipped, counted and named in the reload's log line and in
    :meth:`statistics`.

    Raises:
        ValueError: ``client`` does not decode replies (``decode_responses=True``): members must
            arrive as ``str``, decoded by the reply parser (hiredis, in C), not one by one here.
    """

    def __init__(self, client: redis.Redis, job: str, *, scan_count: int = SCAN_COUNT) -> None:
        if not client.get_encoder().decode_responses:
            raise ValueError(
                "RedisWatch needs a client built with decode_responses=True "
                "(actors.lease_store.connect builds one)"
            )
        self.client, self.job, self.scan_count = client, job, scan_count
        self.keys = watch_keys(job)
        self._list: WatchList | None = None
        self._version: Any = None  # the counter's value when the current list was read
        self._unreadable = False
        self._loads, self._skipped = 0, Skipped()
        self._problem: str | None = None
        self._limiter: trio.CapacityLimiter | None = None

    async def current(self) -> WatchList:
        try:
            version = await trio.to_thread.run_sync(
                self.client.get, self.keys["version"], abandon_on_cancel=True
            )
        except redis.RedisError as exc:
            self._problem = f"cannot read {self.keys['version']}: {exc}"
            if not self._unreadable:
                log.warning("watch-version-unreadable", key=self.keys["version"], error=str(exc),
                            kept=len(self._list or EMPTY))  # fmt: skip
            self._unreadable = True
            if self._list is None:
                raise WatchUnavailable(f"{self.describe()}: {self._problem}") from exc
            return self._list
        if self._unreadable:
            log.info("watch-version-readable", key=self.keys["version"])
            self._unreadable = False
        if self._list is not None and version == self._version:
            self._problem = None
            return self._list
        return await self._reload(version)

    async def _reload(self, version: Any) -> WatchList:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(1)  # an abandoned reload holds it until it ends
        started = time.monotonic()
        self._list, skipped = None, Skipped()  # drop first: one list in memory, not two
        try:
            watch = await trio.to_thread.run_sync(
                _scan_list, self.client, self.keys["watch"], self.scan_count, skipped,
                limiter=self._limiter, abandon_on_cancel=True,
            )  # fmt: skip
        except redis.RedisError as exc:
            self._problem = f"cannot read {self.keys['watch']}: {exc}"
            log.warning("watch-reload-failed", key=self.keys["watch"], error=str(exc))
            raise WatchUnavailable(f"{self.describe()}: {self._problem}") from exc
        self._list, self._version, self._skipped, self._problem = watch, version, skipped, None
        self._loads += 1
        log.info("watch-reloaded", source=self.describe(), entries=len(watch), version=_text(version or "0"),
                 seconds=round(time.monotonic() - started, 3), skipped=skipped.count,
                 skipped_examples=skipped.examples)  # fmt: skip
        return watch

    def describe(self) -> str:
        return f"redis set {self.keys['watch']}"

    def statistics(self) -> WatchStatistics:
        return WatchStatistics(
            entries=len(self._list or EMPTY), loads=self._loads, skipped=self._skipped.count,
            skipped_examples=tuple(self._skipped.examples), problem=self._problem,
        )  # fmt: skip


# The operator's edits (the CLI calls these). Blocking redis-py calls: not for a trio task.


def _validated(addresses: Iterable[str]) -> list[str]:
    entries = list(dict.fromkeys(addresses))
    for entry in entries:
        check_address(entry)
    return entries


def _edit(client: redis.Redis, job: str, addresses: Iterable[str], command: str) -> int:
    """Short commands, not one transaction: a million members in one MULTI/EXEC kept Redis from
    every other client for about a second (0.4 s when nothing changed), and with it every node's
    lease renewals, which must answer within ``redis.timeout_ms``. In chunks, the longest wait of
    another client is a few milliseconds. The version moves once the set is edited (and only if
    the edit changed it, or one before was cut off), so a node reloads once, after the edit."""
    entries = _validated(addresses)
    if not entries:
        return 0
    keys = watch_keys(job)
    interrupted = client.getset(keys["editing"], "1") is not None
    changed = 0
    step = EDIT_CHUNK * EDIT_ROUND
    for start in range(0, len(entries), step):
        pipe = client.pipeline(transaction=False)
        for at in range(start, min(start + step, len(entries)), EDIT_CHUNK):
            getattr(pipe, command)(keys["watch"], *entries[at : at + EDIT_CHUNK])
        changed += sum(int(n) for n in pipe.execute())
    done = client.register_script(_EDIT_DONE)
    done(keys=[keys["version"], keys["editing"]], args=[changed, "1" if interrupted else "0"])
    return changed


def add(client: redis.Redis, job: str, addresses: Iterable[str]) -> int:
    """Add ``addresses`` to ``job``'s watch set; how many were not there yet.

    All are validated before anything is sent. The members go in short commands, then the version
    moves, so the leader reloads the set once, after the edit (one that loads it meanwhile for
    another reason may see part of it, and reloads after). The version moves only when something
    was new: adding what is already there makes no node read the set again (about 1 s at a million).

    Raises:
        InvalidAddress: an entry is not a valid address (named); nothing was changed.
        redis.RedisError: the edit's outcome is unknown (a timeout, a lost connection): part of it
            may be done, and no node has been told yet. Running it again is safe and completes it
            (a cut-off edit leaves a marker, so the next edit moves the version even if it finds
            nothing left to change).
    """
    return _edit(client, job, addresses, "sadd")


def remove(client: redis.Redis, job: str, addresses: Iterable[str]) -> int:
    """Remove ``addresses`` from ``job``'s watch set; how many were there. As :func:`add`."""
    return _edit(client, job, addresses, "srem")


def members_count(client: redis.Redis, job: str) -> int:
    """How many members ``job``'s watch set has (any added other than by :func:`add` too)."""
    return int(client.scard(watch_keys(job)["watch"]))  # type: ignore[arg-type]
